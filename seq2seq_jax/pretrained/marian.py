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
from typing import Any

import numpy as np

from seq2seq_jax.configs import TransformerConfig
from seq2seq_jax.layers.embeddings import position_table
from seq2seq_jax.pretrained._convert import Rule, bart_rules, embedding_rules

MODEL_TYPE = "marian"
ARCHITECTURES = ("MarianMTModel",)

# MarianConfig's defaults, for config.json files that leave fields out.
DEFAULTS = {"vocab_size": 58101, "decoder_vocab_size": None, "d_model": 1024,
            "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 16,
            "decoder_attention_heads": 16, "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096,
            "activation_function": "gelu", "dropout": 0.1, "attention_dropout": 0.0,
            "activation_dropout": 0.0, "max_position_embeddings": 1024,
            "scale_embedding": False, "pad_token_id": 58100, "eos_token_id": 0,
            "decoder_start_token_id": 58100, "share_encoder_decoder_embeddings": True,
            "tie_word_embeddings": True}

# transformers' activation names -> TransformerConfig.activation.
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "swish": "swish", "silu": "swish"}


def field(hf: dict[str, Any], name: str, defaults: dict[str, Any]) -> Any:
  value = hf.get(name)
  return defaults[name] if value is None else value


def same_in_both(hf: dict[str, Any], encoder: str, decoder: str, defaults: dict[str, Any],
                 source: pathlib.Path) -> Any:
  value, other = field(hf, encoder, defaults), field(hf, decoder, defaults)
  if value != other:
    raise ValueError(f"{source}: {encoder}={value} but {decoder}={other}; this library's "
                     "Transformer gives encoder and decoder the same width and heads")
  return value


def activation(hf: dict[str, Any], defaults: dict[str, Any], source: pathlib.Path) -> str:
  name = field(hf, "activation_function", defaults)
  if name not in ACTIVATIONS:
    raise ValueError(f"{source}: activation_function={name!r} is not supported; supported: "
                     f"{', '.join(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def transformer_config(hf: dict[str, Any], source: pathlib.Path, dtype: str) -> TransformerConfig:
  """The ``TransformerConfig`` of a Marian ``config.json`` (``source`` names it in errors)."""
  d = DEFAULTS
  shared = bool(field(hf, "share_encoder_decoder_embeddings", d))
  vocab = field(hf, "vocab_size", d)
  target_vocab = hf.get("decoder_vocab_size") or vocab
  if shared and target_vocab != vocab:
    raise ValueError(f"{source}: decoder_vocab_size={target_vocab} differs from vocab_size="
                     f"{vocab} but share_encoder_decoder_embeddings is true")
  return TransformerConfig(
      vocab_size=vocab,
      target_vocab_size=0 if shared else target_vocab,
      model_dim=field(hf, "d_model", d),
      num_heads=same_in_both(hf, "encoder_attention_heads", "decoder_attention_heads", d, source),
      num_encoder_layers=field(hf, "encoder_layers", d),
      num_decoder_layers=field(hf, "decoder_layers", d),
      mlp_dim=same_in_both(hf, "encoder_ffn_dim", "decoder_ffn_dim", d, source),
      dropout_rate=float(field(hf, "dropout", d)),
      attention_dropout_rate=float(field(hf, "attention_dropout", d)),
      activation_dropout_rate=float(field(hf, "activation_dropout", d)),
      max_len=field(hf, "max_position_embeddings", d),
      positions="sinusoidal_marian",
      norm="post",
      share_embeddings=shared,
      tie_output=bool(field(hf, "tie_word_embeddings", d)),
      output_bias=bool(field(hf, "tie_word_embeddings", d)),
      activation=activation(hf, d, source),
      scale_embeddings=bool(field(hf, "scale_embedding", d)),
      layer_norm_epsilon=1e-5,
      pad_id=field(hf, "pad_token_id", d),
      decoder_start_id=field(hf, "decoder_start_token_id", d),
      eos_id=field(hf, "eos_token_id", d),
      dtype=dtype)


def rules(config: TransformerConfig, tensors: dict[str, np.ndarray] | None) -> list[Rule]:
  """Every checkpoint tensor this library keeps; see ``ignored`` for the rest."""
  out = bart_rules(config, final_norms=False) + embedding_rules(config, tensors)
  if config.tie_output:
    out.append(Rule("final_logits_bias", ("output_bias",), lambda b: b.reshape(-1),
                    lambda b: b.reshape(1, -1)))
  return out


def ignored(name: str) -> bool:
  """Tensors that are copies of others (tied tables) or fixed tables checked separately."""
  return name.endswith("embed_positions.weight") or name in (
      "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
      "lm_head.weight", "model.shared.weight")


def check_fixed_tensors(config: TransformerConfig, tensors: dict[str, np.ndarray],
                        source: pathlib.Path) -> None:
  """A stored position table must be the one this library computes (older checkpoints
  store it; ``save_pretrained`` of transformers 5 does not)."""
  table = position_table("sinusoidal_marian", config.max_len, config.model_dim)
  for name in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
    if name in tensors:
      stored = np.asarray(tensors[name], np.float32)
      if stored.shape != table.shape or np.max(np.abs(stored - table)) > 1e-5:
        raise ValueError(f"{source}: {name} is not Marian's sinusoidal table "
                         f"{table.shape}; learned positions are not supported for Marian")
