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
from seq2seq_jax.pretrained._convert import (BART_DEFAULTS, BART_TOKEN_TABLES, Rule,
                                             bart_config, bart_rules, field)
from seq2seq_jax.pretrained._io import Weights

MODEL_TYPE = "m2m_100"
ARCHITECTURES = ("M2M100ForConditionalGeneration",)

# M2M100Config's defaults, for config.json files that leave fields out.
DEFAULTS = {**BART_DEFAULTS, "vocab_size": 128112, "activation_function": "relu",
            "attention_dropout": 0.1, "scale_embedding": True, "pad_token_id": 1,
            "eos_token_id": 2, "decoder_start_token_id": 2}


def model_config(hf: dict[str, Any], source: pathlib.Path, dtype: str) -> TransformerConfig:
  """The ``TransformerConfig`` of an M2M100 / NLLB ``config.json``."""
  d = DEFAULTS
  return bart_config(
      hf, d, source, dtype,
      vocab_size=field(hf, "vocab_size", d),
      positions="sinusoidal_fairseq",
      position_offset=field(hf, "pad_token_id", d) + 1,
      norm="pre",
      # transformers 5 ties encoder, decoder and output tables all together, or none.
      share_embeddings=bool(field(hf, "tie_word_embeddings", d)))


def rules(config: TransformerConfig, weights: Container[str] | None) -> list[Rule]:
  """Every checkpoint tensor this library keeps; see ``ignored`` for the rest."""
  return bart_rules(config, weights, final_norms=True)


def ignored(name: str) -> bool:
  """Copies of the tied table, and the fixed position buffers older files carry."""
  return (name.endswith(("embed_positions.weights", "embed_positions._float_tensor"))
          or name in BART_TOKEN_TABLES)


def check_fixed_tensors(config: TransformerConfig, weights: Weights) -> None:
  """M2M100 stores no fixed tables to check (its positions are computed)."""
  del config, weights
