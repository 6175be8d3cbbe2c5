"""The position-wise feed-forward layer: Dense(F) -> ReLU -> dropout -> Dense(D)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from seq2seq_jax.layers.dropout import Dropout
from seq2seq_jax.types import Array


class FeedForward(nn.Module):
  """``max(0, x W1 + b1) W2 + b2``, applied to every position alike."""

  hidden_dim: int  # F
  out_dim: int  # D
  dropout_rate: float = 0.0
  activation: str = "relu"  # "relu" (2017 paper) or "gelu"
  dtype: Any = jnp.float32
  kernel_init: Any = nn.initializers.xavier_uniform()

  @nn.compact
  def __call__(self, x_BTD: Array, *, deterministic: bool = True) -> Array:
    h_BTF = nn.Dense(self.hidden_dim, dtype=self.dtype, kernel_init=self.kernel_init,
                     name="wi")(x_BTD)
    h_BTF = nn.relu(h_BTF) if self.activation == "relu" else nn.gelu(h_BTF)
    h_BTF = Dropout(self.dropout_rate)(h_BTF, deterministic=deterministic)
    return nn.Dense(self.out_dim, dtype=self.dtype, kernel_init=self.kernel_init,
                    name="wo")(h_BTF)
