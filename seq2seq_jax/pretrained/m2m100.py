"""M2M100 checkpoints (M2M100 and NLLB-200): config, weights and layout.

A pre-LN Transformer (LayerNorm before each sublayer, a final LayerNorm on the
encoder and on the decoder) with ReLU feed-forward layers, token vectors scaled by
sqrt(D), and fairseq's sinusoidal positions: tensor2tensor frequencies, a sine half
and a cosine half, counted from ``pad_id + 1``. One token table serves encoder,
decoder and output (with ``tie_word_embeddings: false`` each has its own, as in
transformers 5). Sources start with the source language code; decoding starts
from EOS and the first generated token is forced to the target language code.
"""

from __future__ import annotations

import pathlib
from collections.abc import Container
from typing import Any

from seq2seq_jax.configs import TransformerConfig
from seq2seq_jax.pretrained._convert import (Rule, bart_fields, bart_rules, embedding_rules,
                                             field)
from seq2seq_jax.pretrained._io import Weights

MODEL_TYPE = "m2m_100"
ARCHITECTURES = ("M2M100ForConditionalGeneration",)

# M2M100Config's defaults, for config.json files that leave fields out.
DEFAULTS = {"vocab_size": 128112, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
            "encoder_attention_heads": 16, "decoder_attention_heads": 16,
            "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "activation_function": "relu",
            "dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.0,
            "max_position_embeddings": 1024, "scale_embedding": True, "pad_token_id": 1,
            "eos_token_id": 2, "decoder_start_token_id": 2, "tie_word_embeddings": True}


def model_config(hf: dict[str, Any], source: pathlib.Path, dtype: str) -> TransformerConfig:
  """The ``TransformerConfig`` of an M2M100 / NLLB ``config.json``."""
  d = DEFAULTS
  return TransformerConfig(
      vocab_size=field(hf, "vocab_size", d),
      positions="sinusoidal_fairseq",
      position_offset=field(hf, "pad_token_id", d) + 1,
      norm="pre",
      # transformers 5 ties encoder, decoder and output tables all together, or none.
      share_embeddings=bool(field(hf, "tie_word_embeddings", d)),
      dtype=dtype,
      **bart_fields(hf, d, source))


def rules(config: TransformerConfig, weights: Container[str] | None) -> list[Rule]:
  """Every checkpoint tensor this library keeps; see ``ignored`` for the rest."""
  return bart_rules(config, final_norms=True) + embedding_rules(config, weights)


def ignored(name: str) -> bool:
  """Copies of the tied table, and the fixed position buffers older files carry."""
  return name.endswith(("embed_positions.weights", "embed_positions._float_tensor")) or name in (
      "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
      "lm_head.weight", "model.shared.weight")


def check_fixed_tensors(config: TransformerConfig, weights: Weights) -> None:
  """M2M100 stores no fixed tables to check (its positions are computed)."""
  del config, weights
