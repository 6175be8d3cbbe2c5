"""Token embeddings (shareable, tied to the output projection) and position encodings."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.types import Array


def sinusoidal_table(max_len: int, dim: int) -> np.ndarray:
  """The fixed position table of Vaswani et al. 2017, float32 ``[max_len, dim]``.

  Row p is ``sin(p / 10000^(2i/dim))`` in column 2i and the cosine in column 2i+1,
  computed in float64 so long tables stay exact to float32 precision.
  """
  if dim % 2:
    raise ValueError(f"sinusoidal positions need an even width; got dim={dim}")
  positions_P1 = np.arange(max_len, dtype=np.float64)[:, None]
  inv_freq_1I = np.power(10000.0, -np.arange(0, dim, 2, dtype=np.float64) / dim)[None, :]
  angles_PI = positions_P1 * inv_freq_1I
  table = np.empty((max_len, dim), dtype=np.float64)
  table[:, 0::2] = np.sin(angles_PI)
  table[:, 1::2] = np.cos(angles_PI)
  return table.astype(np.float32)


class TokenEmbedding(nn.Module):
  """A token table used for lookup (scaled by sqrt(D)) and, when tied, as the output layer.

  The table is initialised with standard deviation D^-1/2, so looked-up vectors
  times sqrt(D) have unit scale and tied logits ``x @ E^T`` start small.
  """

  vocab_size: int
  dim: int
  dtype: Any = jnp.float32
  scale: bool = True  # multiply looked-up vectors by sqrt(dim), as in the 2017 paper

  def setup(self):
    self.table = self.param("embedding", nn.initializers.normal(stddev=self.dim ** -0.5),
                            (self.vocab_size, self.dim), jnp.float32)

  def __call__(self, tokens: Array) -> Array:
    """``[...]`` int ids -> ``[..., D]`` vectors in the compute dtype."""
    vectors = jnp.take(self.table, tokens, axis=0).astype(self.dtype)
    return vectors * jnp.sqrt(self.dim).astype(self.dtype) if self.scale else vectors

  def attend(self, x_BTD: Array) -> Array:
    """Tied output projection: float32 logits ``x @ E^T``."""
    return output_logits(x_BTD, self.table.astype(self.dtype))


@jax.custom_vjp
def output_logits(x_BTD: Array, table_VD: Array) -> Array:
  """Float32 logits ``x @ E^T`` ``[B, T, V]`` against a ``[V, D]`` token table.

  Same values and gradients as the einsum; the custom VJP only fixes how the
  table's gradient is contracted. Autodiff asks for ``g^T x`` with the [B*T, V]
  logit gradient transposed, and XLA's CPU backend then copies that largest
  array of the step into [V, B*T] order (about a tenth of a T-small training
  step). Here the table gradient is ``(x^T g)^T``: only the small ``x`` and the
  [D, V] product are transposed.
  """
  return jnp.einsum("BTD,VD->BTV", x_BTD, table_VD, preferred_element_type=jnp.float32)


def _output_logits_fwd(x_BTD: Array, table_VD: Array) -> tuple[Array, tuple[Array, Array]]:
  return output_logits.fun(x_BTD, table_VD), (x_BTD, table_VD)


def _output_logits_bwd(residuals: tuple[Array, Array], g_BTV: Array) -> tuple[Array, Array]:
  # As JAX's own dot transpose: the cotangent in the operands' dtype, each result in
  # its primal's dtype (XLA's CPU dots have no bf16 x bf16 -> f32 for these shapes).
  x_BTD, table_VD = residuals
  g_BTV = g_BTV.astype(x_BTD.dtype)
  dx_BTD = jnp.einsum("BTV,VD->BTD", g_BTV, table_VD, preferred_element_type=x_BTD.dtype)
  dtable_DV = jnp.einsum("BTD,BTV->DV", x_BTD, g_BTV, preferred_element_type=table_VD.dtype)
  return dx_BTD, dtable_DV.T


output_logits.defvjp(_output_logits_fwd, _output_logits_bwd)


class PositionEmbedding(nn.Module):
  """Adds sinusoidal or learned position vectors, starting at an offset (for decode steps)."""

  max_len: int
  dim: int
  kind: str = "sinusoidal"  # "sinusoidal" or "learned"
  dtype: Any = jnp.float32

  def setup(self):
    if self.kind == "sinusoidal":
      self.table = jnp.asarray(sinusoidal_table(self.max_len, self.dim))
    elif self.kind == "learned":
      self.table = self.param("position_embedding", nn.initializers.normal(stddev=0.02),
                              (self.max_len, self.dim), jnp.float32)
    else:
      raise ValueError(f"positions={self.kind!r}: must be 'sinusoidal' or 'learned'")

  def __call__(self, x_BTD: Array, offset: Array | int = 0) -> Array:
    """``x + P[offset : offset + T]``.

    Raises ValueError when a static length exceeds ``max_len``; a traced offset
    past the table is caught by the caller (decode_step poisons the logits).
    """
    length = x_BTD.shape[1]
    if length > self.max_len:
      raise ValueError(f"sequence of length {length} exceeds the position table "
                       f"(max_len={self.max_len}); raise max_len or truncate the input")
    if isinstance(offset, int) and offset == 0:
      positions_TD = self.table[:length]
    else:
      positions_TD = jax.lax.dynamic_slice_in_dim(self.table, offset, length, axis=0)
    return x_BTD + positions_TD[None].astype(x_BTD.dtype)
