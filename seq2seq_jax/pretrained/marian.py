"""MarianMT checkpoints (the ~1,500 OPUS-MT models): config, weights and layout.

A post-LN Transformer (LayerNorm after each residual, no final norms) with the
sinusoidal table split into a sine half and a cosine half, token vectors scaled by
sqrt(D) (``scale_embedding``, true for OPUS-MT), Swish feed-forward layers and a
``final_logits_bias`` added to the tied output logits. Decoding starts from the pad
id; source and target share one table unless ``share_encoder_decoder_embeddings``
is false (then the decoder has its own ``decoder_vocab_size`` table).
"""

from __future__ import annotations

import pathlib
from collections.abc import Container
from typing import Any

import numpy as np

from seq2seq_jax.configs import TransformerConfig
from seq2seq_jax.layers.embeddings import position_table
from seq2seq_jax.pretrained._convert import (BART_DEFAULTS, BART_TOKEN_TABLES, Rule,
                                             bart_config, bart_rules, field)
from seq2seq_jax.pretrained._io import Weights

MODEL_TYPE = "marian"
ARCHITECTURES = ("MarianMTModel",)

# MarianConfig's defaults, for config.json files that leave fields out.
DEFAULTS = {**BART_DEFAULTS, "vocab_size": 58101, "decoder_vocab_size": None,
            "activation_function": "gelu", "scale_embedding": False, "pad_token_id": 58100,
            "eos_token_id": 0, "decoder_start_token_id": 58100,
            "share_encoder_decoder_embeddings": True}

def model_config(hf: dict[str, Any], source: pathlib.Path, dtype: str) -> TransformerConfig:
  """The ``TransformerConfig`` of a Marian ``config.json`` (``source`` names it in errors)."""
  d = DEFAULTS
  # transformers 5 ties encoder, decoder and output tables only with tie_word_embeddings.
  tied = bool(field(hf, "tie_word_embeddings", d))
  shared = bool(field(hf, "share_encoder_decoder_embeddings", d)) and tied
  vocab = field(hf, "vocab_size", d)
  target_vocab = hf.get("decoder_vocab_size") or vocab
  if shared and target_vocab != vocab:
    raise ValueError(f"{source}: decoder_vocab_size={target_vocab} differs from vocab_size="
                     f"{vocab} but share_encoder_decoder_embeddings is true")
  return bart_config(
      hf, d, source, dtype,
      vocab_size=vocab,
      target_vocab_size=0 if shared or target_vocab == vocab else target_vocab,
      positions="sinusoidal_marian",
      norm="post",
      share_embeddings=shared,
      output_bias=tied)


def rules(config: TransformerConfig, weights: Container[str] | None) -> list[Rule]:
  """Every checkpoint tensor this library keeps; see ``ignored`` for the rest."""
  return bart_rules(config, weights, final_norms=False, output_bias="final_logits_bias")


def ignored(name: str) -> bool:
  """Tensors that are copies of others (tied tables) or fixed tables checked separately."""
  return name.endswith("embed_positions.weight") or name in BART_TOKEN_TABLES


def check_fixed_tensors(config: TransformerConfig, weights: Weights) -> None:
  """A stored position table must be the one this library computes (older checkpoints
  store it; ``save_pretrained`` of transformers 5 does not)."""
  table = position_table("sinusoidal_marian", config.max_len, config.model_dim)
  for name in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
    if name in weights:
      stored = np.asarray(weights.read(name), np.float32)
      if stored.shape != table.shape or np.max(np.abs(stored - table)) > 1e-5:
        raise ValueError(f"{weights.file_of(name)}: {name} is not Marian's sinusoidal table "
                         f"{table.shape}; learned positions are not supported for Marian")
