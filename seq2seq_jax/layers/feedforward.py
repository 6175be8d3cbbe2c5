"""The position-wise feed-forward layer: Dense(F) -> activation -> dropout -> Dense(D).

Gated (``gated=True``, T5 v1.1 / mT5 / MADLAD-400's "gated-gelu"): two input layers,
``act(x W0) * (x W1)``, then dropout and the output layer (Shazeer 2020).
"""

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
  """``act(x W1 + b1) W2 + b2`` (ReLU in the 2017 paper), applied to every position alike.

  With ``gated``: ``(act(x W0) * (x W1)) W2``, the input layers named ``wi_0`` (the
  activated one) and ``wi_1``; ``use_bias=False`` drops every bias (T5).
  """

  hidden_dim: int  # F
  out_dim: int  # D
  dropout_rate: float = 0.0
  activation: str = "relu"  # a key of ACTIVATIONS: relu, gelu (erf), gelu_tanh, swish
  dtype: Any = jnp.float32
  kernel_init: Any = nn.initializers.xavier_uniform()
  gated: bool = False
  use_bias: bool = True

  @nn.compact
  def __call__(self, x_BTD: Array, *, deterministic: bool = True) -> Array:
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"FeedForward.activation={self.activation!r}: must be one of "
                       f"{', '.join(ACTIVATIONS)}")
    dense = lambda features, name: nn.Dense(features, dtype=self.dtype, use_bias=self.use_bias,
                                            kernel_init=self.kernel_init, name=name)
    if self.gated:
      h_BTF = (ACTIVATIONS[self.activation](dense(self.hidden_dim, "wi_0")(x_BTD))
               * dense(self.hidden_dim, "wi_1")(x_BTD))
    else:
      h_BTF = ACTIVATIONS[self.activation](dense(self.hidden_dim, "wi")(x_BTD))
    if h_BTF.ndim == 3:  # rows on the mesh's data axis, F on its model axis
      h_BTF = constrain(h_BTF, BATCH, LENGTH, MLP)
    h_BTF = Dropout(self.dropout_rate)(h_BTF, deterministic=deterministic)
    return dense(self.out_dim, "wo")(h_BTF)
