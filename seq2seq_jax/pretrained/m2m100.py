"""M2M100 checkpoints (M2M100 and NLLB-200): config, weights and layout.

A pre-LN Transformer (LayerNorm before each sublayer, a final LayerNorm on the
encoder and on the decoder) with ReLU feed-forward layers, token vectors scaled by
sqrt(D), and fairseq's sinusoidal positions: tensor2tensor frequencies, a sine half
and a cosine half, counted from ``pad_id + 1``. One token table serves encoder,
decoder and output. Sources start with the source language code; decoding starts
from EOS and the first generated token is forced to the target language code.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from seq2seq_jax.configs import TransformerConfig
from seq2seq_jax.pretrained._convert import Rule, bart_rules, embedding_rules
from seq2seq_jax.pretrained.marian import activation, field, same_in_both

MODEL_TYPE = "m2m_100"
ARCHITECTURES = ("M2M100ForConditionalGeneration",)

# M2M100Config's defaults, for config.json files that leave fields out.
DEFAULTS = {"vocab_size": 128112, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
            "encoder_attention_heads": 16, "decoder_attention_heads": 16,
            "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "activation_function": "relu",
            "dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.0,
            "max_position_embeddings": 1024, "scale_embedding": True, "pad_token_id": 1,
            "eos_token_id": 2, "decoder_start_token_id": 2, "tie_word_embeddings": True}


def transformer_config(hf: dict[str, Any], source: pathlib.Path, dtype: str) -> TransformerConfig:
  """The ``TransformerConfig`` of an M2M100 / NLLB ``config.json``."""
  d = DEFAULTS
  pad = field(hf, "pad_token_id", d)
  return TransformerConfig(
      vocab_size=field(hf, "vocab_size", d),
      model_dim=field(hf, "d_model", d),
      num_heads=same_in_both(hf, "encoder_attention_heads", "decoder_attention_heads", d, source),
      num_encoder_layers=field(hf, "encoder_layers", d),
      num_decoder_layers=field(hf, "decoder_layers", d),
      mlp_dim=same_in_both(hf, "encoder_ffn_dim", "decoder_ffn_dim", d, source),
      dropout_rate=float(field(hf, "dropout", d)),
      attention_dropout_rate=float(field(hf, "attention_dropout", d)),
      activation_dropout_rate=float(field(hf, "activation_dropout", d)),
      max_len=field(hf, "max_position_embeddings", d),
      positions="sinusoidal_fairseq",
      position_offset=pad + 1,
      norm="pre",
      share_embeddings=True,
      tie_output=bool(field(hf, "tie_word_embeddings", d)),
      activation=activation(hf, d, source),
      scale_embeddings=bool(field(hf, "scale_embedding", d)),
      layer_norm_epsilon=1e-5,
      pad_id=pad,
      decoder_start_id=field(hf, "decoder_start_token_id", d),
      eos_id=field(hf, "eos_token_id", d),
      dtype=dtype)


def rules(config: TransformerConfig, tensors: dict[str, np.ndarray] | None) -> list[Rule]:
  """Every checkpoint tensor this library keeps; see ``ignored`` for the rest."""
  return bart_rules(config, final_norms=True) + embedding_rules(config, tensors)


def ignored(name: str) -> bool:
  """Copies of the tied table, and the fixed position buffers older files carry."""
  return name.endswith(("embed_positions.weights", "embed_positions._float_tensor")) or name in (
      "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
      "lm_head.weight", "model.shared.weight")


def check_fixed_tensors(config: TransformerConfig, tensors: dict[str, np.ndarray],
                        source: pathlib.Path) -> None:
  """M2M100 stores no fixed tables to check (its positions are computed)."""
  del config, tensors, source
