"""One entry point from a model config to its Linen module."""

from __future__ import annotations

import flax.linen as nn

from seq2seq_jax import configs


def build_model(config) -> nn.Module:
  """Returns the model that ``config`` describes.

  Example:
    >>> model = build_model(configs.TransformerConfig(vocab_size=100, model_dim=32,
    ...                                               num_heads=2, mlp_dim=64))
  """
  if isinstance(config, configs.TransformerConfig):
    from seq2seq_jax.models.transformer import Transformer
    return Transformer(config)
  if isinstance(config, configs.T5Config):
    from seq2seq_jax.models.t5 import T5
    return T5(config)
  if isinstance(config, configs.RNNConfig):
    from seq2seq_jax.models.rnn_seq2seq import RNNSeq2Seq
    return RNNSeq2Seq(config)
  if isinstance(config, configs.DecomposableAttentionConfig):
    from seq2seq_jax.models.decomposable import DecomposableAttention
    return DecomposableAttention(config)
  raise TypeError(f"no model is registered for {type(config).__name__}; expected one of "
                  "TransformerConfig, T5Config, RNNConfig, DecomposableAttentionConfig")
