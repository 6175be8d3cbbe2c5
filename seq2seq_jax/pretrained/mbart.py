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
from seq2seq_jax.pretrained._convert import (Rule, bart_fields, bart_rules, embedding_rules,
                                             field)
from seq2seq_jax.pretrained._io import Weights

MODEL_TYPE = "mbart"
ARCHITECTURES = ("MBartForConditionalGeneration",)
POSITION_OFFSET = 2  # MBartLearnedPositionalEmbedding's offset

# MBartConfig's defaults, for config.json files that leave fields out (mBART-50's
# released configs set scale_embedding and decoder_start_token_id).
DEFAULTS = {"vocab_size": 50265, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
            "encoder_attention_heads": 16, "decoder_attention_heads": 16,
            "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "activation_function": "gelu",
            "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0,
            "max_position_embeddings": 1024, "scale_embedding": False, "pad_token_id": 1,
            "eos_token_id": 2, "decoder_start_token_id": 2, "tie_word_embeddings": True}


def model_config(hf: dict[str, Any], source: pathlib.Path, dtype: str) -> TransformerConfig:
  """The ``TransformerConfig`` of an mBART ``config.json``."""
  d = DEFAULTS
  tied = bool(field(hf, "tie_word_embeddings", d))
  return TransformerConfig(
      vocab_size=field(hf, "vocab_size", d),
      positions="learned",
      position_offset=POSITION_OFFSET,
      norm="pre",
      embedding_norm=True,
      share_embeddings=tied,
      output_bias=tied,
      dtype=dtype,
      **bart_fields(hf, d, source))


def rules(config: TransformerConfig, weights: Container[str] | None) -> list[Rule]:
  """Every checkpoint tensor this library keeps; see ``ignored`` for the rest."""
  out = bart_rules(config, final_norms=True) + embedding_rules(config, weights,
                                                               output_bias="final_logits_bias")
  if config.tie_output:
    out.append(Rule("final_logits_bias", ("output_bias",), lambda b: b.reshape(-1),
                    lambda b: b.reshape(1, -1)))
  return out


def ignored(name: str) -> bool:
  """Copies of the tied table."""
  return name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                  "lm_head.weight", "model.shared.weight")


def check_fixed_tensors(config: TransformerConfig, weights: Weights) -> None:
  """mBART stores no fixed tables (its positions are learned parameters)."""
  del config, weights
