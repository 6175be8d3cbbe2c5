"""The position-wise feed-forward layer: Dense(F) -> activation -> dropout -> Dense(D)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from seq2seq_jax.layers.dropout import Dropout
from seq2seq_jax.layers.partitioning import BATCH, LENGTH, MLP, constrain
from seq2seq_jax.types import Array

ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": lambda x: nn.gelu(x, approximate=False),  # the erf form (PyTorch's default)
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
    "swish": nn.swish,  # x * sigmoid(x), also called SiLU
}


class FeedForward(nn.Module):
  """``act(x W1 + b1) W2 + b2`` (ReLU in the 2017 paper), applied to every position alike."""

  hidden_dim: int  # F
  out_dim: int  # D
  dropout_rate: float = 0.0
  activation: str = "relu"  # a key of ACTIVATIONS: relu, gelu (erf), gelu_tanh, swish
  dtype: Any = jnp.float32
  kernel_init: Any = nn.initializers.xavier_uniform()

  @nn.compact
  def __call__(self, x_BTD: Array, *, deterministic: bool = True) -> Array:
    h_BTF = nn.Dense(self.hidden_dim, dtype=self.dtype, kernel_init=self.kernel_init,
                     name="wi")(x_BTD)
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"FeedForward.activation={self.activation!r}: must be one of "
                       f"{', '.join(ACTIVATIONS)}")
    h_BTF = ACTIVATIONS[self.activation](h_BTF)
    if h_BTF.ndim == 3:  # rows on the mesh's data axis, F on its model axis
      h_BTF = constrain(h_BTF, BATCH, LENGTH, MLP)
    h_BTF = Dropout(self.dropout_rate)(h_BTF, deterministic=deterministic)
    return nn.Dense(self.out_dim, dtype=self.dtype, kernel_init=self.kernel_init,
                    name="wo")(h_BTF)
