"""Token embeddings (shareable, tied to the output projection) and position encodings."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax import platforms
from seq2seq_jax.layers import quantized
from seq2seq_jax.types import Array


def sinusoidal_table(max_len: int, dim: int) -> np.ndarray:
  """The fixed position table of Vaswani et al. 2017, float32 ``[max_len, dim]``.

  Row p is ``sin(p / 10000^(2i/dim))`` in column 2i and the cosine in column 2i+1,
  computed in float64 so long tables stay exact to float32 precision.
  """
  return position_table("sinusoidal", max_len, dim)


def position_table(kind: str, max_len: int, dim: int, offset: int = 0) -> np.ndarray:
  """A fixed float32 position table ``[max_len, dim]``; row p encodes position p + offset.

  Kinds:

  - ``"sinusoidal"``: ``sinusoidal_table``, sines and cosines interleaved.
  - ``"sinusoidal_marian"``: the same frequencies, all sines in the first half of the
    columns and the cosines in the second (MarianMT / OPUS-MT).
  - ``"sinusoidal_fairseq"``: tensor2tensor's frequencies ``10000^(-i / (dim/2 - 1))``,
    sines then cosines, computed in float32 as fairseq and M2M100 / NLLB do; those
    models start counting at ``pad_id + 1``, which ``offset`` gives.
  """
  if dim % 2:
    raise ValueError(f"sinusoidal positions need an even width; got dim={dim}")
  half = dim // 2
  if kind == "sinusoidal_fairseq":
    if half < 2:
      raise ValueError(f"sinusoidal_fairseq positions need dim >= 4; got dim={dim}")
    # float32 products as the reference builds them (the table is stored nowhere);
    # exp and sin/cos are correctly rounded here, within an ulp of PyTorch's.
    step = np.float32(-np.log(10000.0) / (half - 1))
    exponents = (np.arange(half, dtype=np.float32) * step).astype(np.float64)
    inv_freq_1I = np.exp(exponents).astype(np.float32)[None, :]
    angles_PI = np.arange(offset, offset + max_len, dtype=np.float32)[:, None] * inv_freq_1I
    angles_PI = angles_PI.astype(np.float64)
  else:
    positions_P1 = np.arange(offset, offset + max_len, dtype=np.float64)[:, None]
    inv_freq_1I = np.power(10000.0, -np.arange(0, dim, 2, dtype=np.float64) / dim)[None, :]
    angles_PI = positions_P1 * inv_freq_1I
  table = np.empty((max_len, dim), dtype=np.float64)
  if kind == "sinusoidal":
    table[:, 0::2], table[:, 1::2] = np.sin(angles_PI), np.cos(angles_PI)
  elif kind in ("sinusoidal_marian", "sinusoidal_fairseq"):
    table[:, :half], table[:, half:] = np.sin(angles_PI), np.cos(angles_PI)
  else:
    raise ValueError(f"position table kind={kind!r}: must be 'sinusoidal', 'sinusoidal_marian' "
                     "or 'sinusoidal_fairseq'")
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
    if quantized.is_quantized(self.table):  # int8 rows, a scale per id (seq2seq_jax.quantization)
      vectors = quantized.lookup(self.table, tokens, self.dtype)
    else:
      vectors = jnp.take(self.table, tokens, axis=0).astype(self.dtype)
    return vectors * jnp.sqrt(self.dim).astype(self.dtype) if self.scale else vectors

  def attend(self, x_BTD: Array, bias_V: Array | None = None) -> Array:
    """Tied output projection: float32 logits ``x @ E^T`` (``+ bias_V`` when given)."""
    if quantized.is_quantized(self.table):
      return quantized.logits(x_BTD, self.table, "VD", bias_V)
    table_VD = self.table.astype(self.dtype)
    if bias_V is None:
      return output_logits(x_BTD, table_VD)
    if math.prod(x_BTD.shape[:-1]) <= TRANSPOSED_LOGITS_MAX_ROWS:  # a decoding step
      return vocab_logits(x_BTD, table_VD, bias=bias_V)
    logits = output_logits(x_BTD, table_VD)
    return logits + bias_V.reshape((1,) * (logits.ndim - 1) + (-1,))


# Up to this many rows (a decoding step's batch, times beams) logits are computed, on
# the CPU, as (E x^T)^T: with the large table as the left operand XLA's CPU dot streams
# it instead of repacking all of it for a few rows (other platforms: x E^T, see
# seq2seq_jax.platforms). At 58,101 x 512, with a log-softmax over the
# transposed result, per 1 / 4 / 32 / 64 / 128 rows: 7.8x / 1.65x / 1.28x / 0.94x /
# 0.67x the speed of x E^T (CPU time, this project's 2-core Zen 4). From 8 rows on the
# decoding step reads such logits vocabulary-major (``platforms.reads_vocab_major``): with
# the log-softmax and argmax along the vocabulary axis as it lies, a greedy step at
# batch 32 of an OPUS-MT-sized model spends 1.2 ms after the dot instead of 4.7.
TRANSPOSED_LOGITS_MAX_ROWS = platforms.VOCAB_MAJOR_MAX_ROWS


def vocab_logits(x_BTD: Array, weight: Array, *, weight_axes: str = "VD",
                 bias: Array | None = None) -> Array:
  """Float32 logits ``[..., V]`` of ``x_BTD [..., D]`` against a ``[V, D]`` (or ``[D, V]``) matrix.

  Plain contraction; on the CPU the operand order is chosen for XLA's dot by the
  number of rows (``TRANSPOSED_LOGITS_MAX_ROWS``, see ``seq2seq_jax.platforms``);
  any order gives the same products. A ``bias [V]`` is added in the same layout,
  before the result is handed over (on the CPU, at most
  ``TRANSPOSED_LOGITS_MAX_ROWS`` rows: the transposed view of a [V, N] array).
  """
  if weight_axes not in ("VD", "DV"):
    raise ValueError(f"weight_axes={weight_axes!r}: must be 'VD' or 'DV'")

  def row_major(x_BTD, weight, *bias):
    logits = jnp.einsum(f"...D,{weight_axes}->...V", x_BTD, weight,
                        preferred_element_type=jnp.float32)
    return logits + bias[0].reshape((1,) * (logits.ndim - 1) + (-1,)) if bias else logits

  def vocab_major(x_BTD, weight, *bias):
    x_ND = x_BTD.reshape(rows, x_BTD.shape[-1])
    logits_VN = jnp.einsum(f"{weight_axes},ND->VN", weight, x_ND,
                           preferred_element_type=jnp.float32)
    if bias:
      logits_VN = logits_VN + bias[0][:, None]
    # Without the barrier XLA folds the transpose back into the dot, operands swapped.
    logits_VN = jax.lax.optimization_barrier(logits_VN)
    return logits_VN.T.reshape(*x_BTD.shape[:-1], logits_VN.shape[0])

  rows = math.prod(x_BTD.shape[:-1])
  operands = (x_BTD, weight) + (() if bias is None else (bias,))
  if rows > TRANSPOSED_LOGITS_MAX_ROWS:
    return row_major(*operands)
  if rows == 1 and weight.dtype != jnp.float32:  # bfloat16: XLA's CPU dot's slow single row
    one_row = lambda x_BTD, *rest: platforms.as_two_rows(
        lambda x_2D, *rest: row_major(x_2D, *rest))(x_BTD.reshape(1, -1), *rest).reshape(
            x_BTD.shape[:-1] + (-1,))
    return platforms.on_cpu(one_row, row_major, *operands)
  return platforms.on_cpu(vocab_major, row_major, *operands)


@jax.custom_vjp
def output_logits(x_BTD: Array, table_VD: Array) -> Array:
  """Float32 logits ``x @ E^T`` ``[B, T, V]`` against a ``[V, D]`` token table.

  Same values and gradients as the einsum; the custom VJP only fixes how the
  table's gradient is contracted. Autodiff asks for ``g^T x`` with the [B*T, V]
  logit gradient transposed, and XLA's CPU backend then copies that largest
  array of the step into [V, B*T] order (about a tenth of a T-small training
  step). Here the table gradient is ``(x^T g)^T``: only the small ``x`` and the
  [D, V] product are transposed. The forward product is ``vocab_logits``.
  """
  return vocab_logits(x_BTD, table_VD)


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


class VocabProjection(nn.Module):
  """A dense output layer ``x W + b`` onto the vocabulary, float32 logits.

  ``nn.Dense``'s parameters (``kernel`` [D, V], ``bias`` [V]) and initializers, so
  checkpoints of either load into the other; the product is ``vocab_logits``,
  which streams the kernel when only a few rows are projected (a decoding step).
  ``use_bias=False``: no bias (T5's ``lm_head``).
  """

  features: int
  dtype: Any = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self, x_BTD: Array) -> Array:
    kernel_DV = self.param("kernel", nn.initializers.lecun_normal(),
                           (x_BTD.shape[-1], self.features), jnp.float32)
    bias_V = (self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
              if self.use_bias else None)
    if quantized.is_quantized(kernel_DV):  # int8, a scale per column (seq2seq_jax.quantization)
      return quantized.logits(x_BTD, kernel_DV, "DV", bias_V)
    x_BTD, kernel_DV = nn.dtypes.promote_dtype(x_BTD, kernel_DV, dtype=self.dtype)
    return vocab_logits(x_BTD, kernel_DV, weight_axes="DV", bias=bias_V)


class PositionEmbedding(nn.Module):
  """Adds fixed or learned position vectors, starting at an offset (for decode steps).

  ``table_offset``: a fixed table's row p encodes position p + table_offset (fairseq
  counts from pad + 1); a learned table gets table_offset more rows, and position p
  reads row p + table_offset (mBART's table starts with 2 rows no position reads).
  """

  max_len: int
  dim: int
  kind: str = "sinusoidal"  # "learned", or a fixed table kind of ``position_table``
  dtype: Any = jnp.float32
  table_offset: int = 0

  def setup(self):
    if self.kind == "learned":
      table = self.param("position_embedding", nn.initializers.normal(stddev=0.02),
                         (self.max_len + self.table_offset, self.dim), jnp.float32)
      self.table = table[self.table_offset:] if self.table_offset else table
    else:
      self.table = jnp.asarray(position_table(self.kind, self.max_len, self.dim,
                                              self.table_offset))

  def __call__(self, x_BTD: Array, offset: Array | int = 0, *,
               positions_BT: Array | None = None) -> Array:
    """``x + P[offset : offset + T]``, or ``x + P[positions_BT]`` when positions are given.

    ``positions_BT``: int ``[B, T]``, the position of every token (packed rows
    restart at 0 in each segment); ``offset`` must then be 0. A position outside
    the table gives NaN vectors (``jnp.take``'s fill), never another row.

    Raises ValueError when a static length exceeds ``max_len``; a traced offset
    past the table is caught by the caller (decode_step poisons the logits).
    """
    if positions_BT is not None:
      if positions_BT.shape != x_BTD.shape[:2] or not (isinstance(offset, int) and offset == 0):
        raise ValueError(f"positions_BT {positions_BT.shape} must be [B, T] of x_BTD "
                         f"{x_BTD.shape}, with no offset")
      positions_BTD = jnp.take(self.table, positions_BT, axis=0, mode="fill")
      return x_BTD + positions_BTD.astype(x_BTD.dtype)
    length = x_BTD.shape[1]
    if length > self.max_len:
      raise ValueError(f"sequence of length {length} exceeds the position table "
                       f"(max_len={self.max_len}); raise max_len or truncate the input")
    if isinstance(offset, int) and offset == 0:
      positions_TD = self.table[:length]
    else:
      positions_TD = jax.lax.dynamic_slice_in_dim(self.table, offset, length, axis=0)
    return x_BTD + positions_TD[None].astype(x_BTD.dtype)
