"""Exact argmax and top-k over long last axes, in two stages: block maxima, then one block each.

``jnp.argmax`` and ``lax.top_k`` over a 58,101-id vocabulary are among the dearest
operations of a decoding step on XLA's CPU backend: argmax lowers to a two-operand
(value, index) reduce that does not vectorize (33 ms of CPU time for 128 rows, 20x a
plain ``max``), and TopK to a custom call that sorts its way through every row. Both
results are decided by a few blocks: a block that holds one of the k largest values
has one of the k largest block maxima. So one vectorized ``max`` per block finds the
candidate blocks, and the exact answer is taken among their elements only (128 rows of
58,101: argmax 33 -> 4 ms, top-8 of 4 x 58,101 per row 11-16 -> about 4 ms). The
results equal ``jnp.argmax`` / ``lax.top_k`` exactly, ties (lowest index first) included.

The two stages are for the CPU: on a TPU they cost more than the one-stage primitives
(the compiler's bytes accessed, greedy and beam steps: +5 to 7 %), so other platforms
lower ``jnp.argmax`` and ``lax.top_k`` (``seq2seq_jax.platforms.on_cpu``); except
beam search's choice over W x V continuations (``top_k_of_rows``), which off the CPU
takes each row's best first through window maxima: one ``lax.top_k`` over W x V
compiles there to a sort of every candidate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from seq2seq_jax import platforms
from seq2seq_jax.types import Array


def _block_size(length: int, k: int) -> int:
  """The block width: a divisor of ``length`` near sqrt(length / k) when there is one.

  Both stages then touch few elements (``length / block`` maxima, ``k * block``
  candidates); a divisor lets the maxima be one reshape and reduce, which XLA's CPU
  backend runs about twice as fast as the same reduce over a sliced prefix.
  """
  ideal = math.sqrt(length / max(k, 1))
  cost = lambda block: length / block + k * block
  divisors = [b for b in range(16, min(length, 8192) + 1) if length % b == 0]
  best = min(divisors, key=cost, default=None)
  if best is not None and cost(best) <= 2 * cost(ideal):
    return best
  return max(64, 1 << math.ceil(math.log2(ideal)))


def _block_maxima(x_NM: Array, block: int) -> Array:
  """``[..., ceil(M / block)]``: the maximum of each block of ``block`` positions."""
  length = x_NM.shape[-1]
  full = length // block
  lead = x_NM.shape[:-1]
  maxima = x_NM[..., :full * block].reshape(*lead, full, block).max(axis=-1)
  if length % block:
    maxima = jnp.concatenate([maxima, x_NM[..., full * block:].max(axis=-1, keepdims=True)],
                             axis=-1)
  return maxima


def _block_positions(blocks_NJ: Array, block: int, length: int) -> tuple[Array, Array]:
  """Positions ``[..., J * block]`` of the chosen blocks, clipped, and whether each is real."""
  offsets = jnp.arange(block, dtype=blocks_NJ.dtype).reshape((1,) * blocks_NJ.ndim + (block,))
  positions = blocks_NJ[..., :, None] * block + offsets
  positions = positions.reshape(*blocks_NJ.shape[:-1], -1)
  return jnp.minimum(positions, length - 1), positions < length


def argmax(x_NM: Array) -> Array:
  """``jnp.argmax(x_NM, axis=-1)``, int32; on the CPU computed through block maxima.

  The first index of the maximum, for rows without NaN (XLA's CPU reductions do
  not all propagate NaN, so a row holding one gets an index of no meaning).

  Example:
    >>> argmax(jnp.array([[0.0, 3.0, 1.0, 3.0]]))
    Array([1], dtype=int32)
  """
  if x_NM.shape[-1] < platforms.TWO_STAGE_MIN_LENGTH:
    return _one_stage_argmax(x_NM)
  return platforms.on_cpu(_two_stage_argmax, _one_stage_argmax, x_NM)


def _one_stage_argmax(x_NM: Array) -> Array:
  return jnp.argmax(x_NM, axis=-1).astype(jnp.int32)


def _two_stage_argmax(x_NM: Array) -> Array:
  length = x_NM.shape[-1]
  block = _block_size(length, 1)
  if x_NM.ndim == 2 and platforms.reads_vocab_major(x_NM.shape[0]):
    return _argmax_along_0(x_NM.T, block)
  best_N = jnp.argmax(_block_maxima(x_NM, block), axis=-1).astype(jnp.int32)
  positions, _ = _block_positions(best_N[..., None], block, length)
  # Clipped positions repeat the last element after its real position: never first.
  within_N = jnp.argmax(jnp.take_along_axis(x_NM, positions, axis=-1), axis=-1)
  return jnp.take_along_axis(positions, within_N[..., None], axis=-1)[..., 0]


def _argmax_along_0(x_MN: Array, block: int) -> Array:
  """``argmax`` over axis 0 of ``x_MN``, by the same two stages along that axis.

  For ``platforms.reads_vocab_major`` row counts: the decoding step's logits are laid
  out this way, so the maxima read them as they lie.
  """
  length = x_MN.shape[0]
  full = length // block
  maxima_JN = x_MN[:full * block].reshape(full, block, -1).max(axis=1)
  if length % block:
    maxima_JN = jnp.concatenate([maxima_JN, x_MN[full * block:].max(axis=0, keepdims=True)])
  best_N = jnp.argmax(maxima_JN, axis=0).astype(jnp.int32)
  positions_BN = best_N[None, :] * block + jnp.arange(block, dtype=jnp.int32)[:, None]
  # Clipped positions repeat the last element after its real position: never first.
  positions_BN = jnp.minimum(positions_BN, length - 1)
  within_N = jnp.argmax(jnp.take_along_axis(x_MN, positions_BN, axis=0), axis=0)
  return jnp.take_along_axis(positions_BN, within_N[None, :], axis=0)[0]


def top_k(x_NM: Array, k: int) -> tuple[Array, Array]:
  """``lax.top_k(x_NM, k)``: the k largest values of each row, descending, and their int32 indices.

  Equal values come lowest index first, as in ``lax.top_k``. The k blocks with the
  largest maxima (ties to the lower block) hold the k largest elements, so the
  answer is ``lax.top_k`` over those blocks' elements, read in index order. For
  inputs without NaN.

  Example:
    >>> top_k(jnp.array([[1.0, 5.0, 5.0, 2.0]]), 2)
    (Array([[5., 5.]], dtype=float32), Array([[1, 2]], dtype=int32))
  """
  length = x_NM.shape[-1]
  if not isinstance(k, int) or not 0 < k <= length:
    raise ValueError(f"top_k needs 0 < k <= {length} (the row length); got k={k!r}")
  block = _block_size(length, k)
  one_stage = lambda x_NM: _one_stage_top_k(x_NM, k)
  if length < platforms.TWO_STAGE_MIN_LENGTH or k * block >= length // 2:
    return one_stage(x_NM)
  return platforms.on_cpu(lambda x_NM: _two_stage_top_k(x_NM, k, block), one_stage, x_NM)


def top_k_of_rows(x_BWV: Array, k: int) -> tuple[Array, Array]:
  """``top_k(x_BWV.reshape(B, W * V), k)``: the k largest of each ``[W, V]`` slice, and
  their flat indices ``w * V + v``; beam search's choice among W x V continuations.

  On the CPU that flat ``top_k``. Elsewhere the k largest of each of the W rows first
  (block maxima, no sort), then the k largest of those W x k: the flat reshape would
  relay the ``[B * W, V]`` scores out (compiled for a TPU v5e, 1,024 rows of 58,101:
  three copies of 476 MB and a sort), and the k best of a slice are among its rows'
  k best. Equal values keep the flat order (row first, then index): identical results.

  Example:
    >>> top_k_of_rows(jnp.array([[[1.0, 5.0], [5.0, 2.0]]]), 2)
    (Array([[5., 5.]], dtype=float32), Array([[1, 2]], dtype=int32))
  """
  batch, rows, length = x_BWV.shape
  if not isinstance(k, int) or not 0 < k <= rows * length:
    raise ValueError(f"top_k_of_rows needs 0 < k <= {rows * length} (W x V); got k={k!r}")

  def flat(x_BWV):
    return top_k(x_BWV.reshape(batch, rows * length), k)

  def by_rows(x_BWV):
    kept = min(k, length)
    block = _WINDOW
    x_NV = x_BWV.reshape(batch * rows, length)
    if length < platforms.TWO_STAGE_MIN_LENGTH or kept * block >= length // 2:
      values_NK, ids_NK = _one_stage_top_k(x_NV, kept)
    else:
      values_NK, ids_NK = _two_stage_top_k(x_NV, kept, block, maxima=_window_maxima)
    offsets_1W1 = (jnp.arange(rows, dtype=jnp.int32) * length)[None, :, None]
    ids_BM = (ids_NK.reshape(batch, rows, kept) + offsets_1W1).reshape(batch, rows * kept)
    values_BK, picked_BK = jax.lax.top_k(values_NK.reshape(batch, rows * kept), k)
    return values_BK, jnp.take_along_axis(ids_BM, picked_BK, axis=-1)

  return platforms.on_cpu(flat, by_rows, x_BWV)


def _one_stage_top_k(x_NM: Array, k: int) -> tuple[Array, Array]:
  values, indices = jax.lax.top_k(x_NM, k)
  return values, indices.astype(jnp.int32)


# Off the CPU, ``top_k_of_rows`` takes maxima over windows of 128 positions: a row of
# a TPU vector register's lanes.
_WINDOW = 128


def _window_maxima(x_NM: Array, block: int) -> Array:
  """``_block_maxima`` as one windowed reduction: no reshape of the row into blocks,
  which the TPU compiler relays out (padding a block to its tiles) unless ``block``
  divides the row and its tiles both."""
  pad = -x_NM.shape[-1] % block
  window = (1,) * (x_NM.ndim - 1) + (block,)
  padding = ((0, 0),) * (x_NM.ndim - 1) + ((0, pad),)
  return jax.lax.reduce_window(x_NM, jnp.array(-jnp.inf, x_NM.dtype), jax.lax.max, window, window,
                               padding)


def _two_stage_top_k(x_NM: Array, k: int, block: int,
                     maxima: Callable[[Array, int], Array] = _block_maxima
                     ) -> tuple[Array, Array]:
  length = x_NM.shape[-1]
  _, blocks_NK = jax.lax.top_k(maxima(x_NM, block), k)
  # In index order, so that equal values keep lax.top_k's lowest-index-first order.
  blocks_NK = jnp.sort(blocks_NK.astype(jnp.int32), axis=-1)
  positions, real = _block_positions(blocks_NK, block, length)
  candidates = jnp.take_along_axis(x_NM, positions, axis=-1)
  # Padding of the last block sorts after every real element, -inf ones included.
  candidates = jnp.where(real, candidates, -jnp.inf)
  values, picked = jax.lax.top_k(candidates, k)
  return values, jnp.take_along_axis(positions, picked, axis=-1)
