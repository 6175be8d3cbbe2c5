"""mBART checkpoints (``MBartForConditionalGeneration``: the mBART-50 translation models).

A pre-LN Transformer (LayerNorm before each sublayer, a final LayerNorm on the
encoder and on the decoder) with GELU feed-forward layers, token vectors scaled by
sqrt(D) when ``scale_embedding`` is set (mBART-50: yes), learned positions whose
table starts with two rows no position reads (position p is row p + 2), and a
LayerNorm over embeddings plus positions (``layernorm_embedding``) before the
first layer. One token table serves encoder, decoder and output (each its own
with ``tie_word_embeddings: false``), plus a ``final_logits_bias``. Sources are
``[src_lang_code] pieces </s>``; decoding starts from EOS and the first generated
token is forced to the target code (``en_XX``), as for M2M100.
"""

from __future__ import annotations

import pathlib
from collections.abc import Container
from typing import Any

from seq2seq_jax.configs import TransformerConfig
from seq2seq_jax.pretrained._convert import (BART_DEFAULTS, BART_TOKEN_TABLES, Rule,
                                             bart_config, bart_rules, field)
from seq2seq_jax.pretrained._io import Weights

MODEL_TYPE = "mbart"
ARCHITECTURES = ("MBartForConditionalGeneration",)
POSITION_OFFSET = 2  # MBartLearnedPositionalEmbedding's offset

# MBartConfig's defaults, for config.json files that leave fields out (mBART-50's
# released configs set scale_embedding and decoder_start_token_id).
DEFAULTS = {**BART_DEFAULTS, "vocab_size": 50265, "activation_function": "gelu",
            "scale_embedding": False, "pad_token_id": 1, "eos_token_id": 2,
            "decoder_start_token_id": 2}


def model_config(hf: dict[str, Any], source: pathlib.Path, dtype: str) -> TransformerConfig:
  """The ``TransformerConfig`` of an mBART ``config.json``."""
  d = DEFAULTS
  tied = bool(field(hf, "tie_word_embeddings", d))
  return bart_config(
      hf, d, source, dtype,
      vocab_size=field(hf, "vocab_size", d),
      positions="learned",
      position_offset=POSITION_OFFSET,
      norm="pre",
      embedding_norm=True,
      share_embeddings=tied,
      output_bias=tied)


def rules(config: TransformerConfig, weights: Container[str] | None) -> list[Rule]:
  """Every checkpoint tensor this library keeps; see ``ignored`` for the rest."""
  return bart_rules(config, weights, final_norms=True, output_bias="final_logits_bias")


def ignored(name: str) -> bool:
  """Copies of the tied table."""
  return name in BART_TOKEN_TABLES


def check_fixed_tensors(config: TransformerConfig, weights: Weights) -> None:
  """mBART stores no fixed tables (its positions are learned parameters)."""
  del config, weights
