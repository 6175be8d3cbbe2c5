"""Root-mean-square layer normalization (Zhang and Sennrich 2019), the norm of T5."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seq2seq_jax.types import Array


class RMSNorm(nn.Module):
  """``scale * x / sqrt(mean(x ** 2) + epsilon)`` over the last axis: no mean, no bias.

  The mean of squares is taken in float32 whatever the input dtype; the normalized
  vector is cast to the compute ``dtype`` before the (float32) scale multiplies it,
  as T5's layer norm does for half-precision weights.

  Example:
    >>> norm = RMSNorm()
    >>> x = jnp.array([[3.0, 4.0]])
    >>> y, params = norm.init_with_output(jax.random.key(0), x)
    >>> y.round(5)  # sqrt(mean([9, 16])) = 3.5355 (rsqrt's last bit differs by CPU)
    Array([[0.84853, 1.13137]], dtype=float32)
  """

  epsilon: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale_D = self.param("scale", nn.initializers.ones_init(), (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    mean_square = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    normalized = (x32 * jax.lax.rsqrt(mean_square + self.epsilon)).astype(self.dtype)
    scale = scale_D.astype(self.dtype).reshape((1,) * (x.ndim - 1) + scale_D.shape)
    return scale * normalized
