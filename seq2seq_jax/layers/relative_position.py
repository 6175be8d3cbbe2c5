"""T5's relative position bias: a learned scalar per head for each bucket of key - query offsets.

Offsets below ``num_buckets / 2`` (per direction) get a bucket each; larger ones
share logarithmically wider buckets up to ``max_distance``, beyond which all share
the last. Bidirectional (an encoder) gives half the buckets to keys after the
query; causal (a decoder) folds every later key into bucket 0, which the causal
mask hides anyway. The bias is added to the attention scores of every layer of a
stack; one table per stack.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.types import Array


def relative_position_buckets(relative_positions: np.ndarray, *, bidirectional: bool,
                              num_buckets: int, max_distance: int) -> np.ndarray:
  """The bucket (int32, in ``[0, num_buckets)``) of each offset ``key - query``.

  The logarithmic part is computed in float32 and in the order of T5's reference
  implementations: distances 16, 32 and 64 (32 buckets, distance 128) fall exactly on
  bucket boundaries in real arithmetic, so the order of the roundings matters there.

  Example:
    >>> relative_position_buckets(np.array([-3, 0, 3, 20, 200]), bidirectional=True,
    ...                           num_buckets=32, max_distance=128)
    array([ 3,  0, 19, 26, 31], dtype=int32)
  """
  relative = np.asarray(relative_positions, np.int64)
  buckets = np.zeros(relative.shape, np.int64)
  if bidirectional:
    num_buckets //= 2
    buckets += (relative > 0) * num_buckets
    distance = np.abs(relative)
  else:
    distance = -np.minimum(relative, 0)
  exact = num_buckets // 2
  # Small distances are never taken from the log branch; clamp them so log stays finite.
  ratio = np.maximum(distance, exact).astype(np.float32) / np.float32(exact)
  scaled = (np.log(ratio) / np.float32(math.log(max_distance / exact))
            * np.float32(num_buckets - exact))
  large = np.minimum(exact + scaled.astype(np.int64), num_buckets - 1)
  buckets += np.where(distance < exact, distance, large)
  return buckets.astype(np.int32)


class RelativePositionBias(nn.Module):
  """The bias of one stack's self attention: ``[num_buckets, H]`` learned scalars.

  ``__call__(T, S)`` gives ``bias_1HTS`` for queries 0..T-1 against keys 0..S-1;
  ``row(index, S)`` gives ``bias_HS`` for the one query at a traced ``index`` (a
  decoding step), read from the same table.
  """

  num_heads: int
  num_buckets: int = 32
  max_distance: int = 128
  bidirectional: bool = True

  def setup(self):
    self.table = self.param("relative_attention_bias", nn.initializers.normal(stddev=0.5),
                            (self.num_buckets, self.num_heads), jnp.float32)

  def _buckets(self, relative: np.ndarray) -> np.ndarray:
    return relative_position_buckets(relative, bidirectional=self.bidirectional,
                                     num_buckets=self.num_buckets,
                                     max_distance=self.max_distance)

  def __call__(self, query_len: int, key_len: int) -> Array:
    """float32 ``[1, H, T, S]`` for every query and key position."""
    relative_TS = np.arange(key_len)[None, :] - np.arange(query_len)[:, None]
    bias_TSH = jnp.take(self.table, jnp.asarray(self._buckets(relative_TS)), axis=0)
    return jnp.transpose(bias_TSH, (2, 0, 1))[None]

  def row(self, index: Array, key_len: int) -> Array:
    """float32 ``[H, S]``: the bias of the query at position ``index`` against keys 0..S-1."""
    # Buckets of every offset -(S-1) .. S-1, then the S of them this query sees.
    buckets_R = jnp.asarray(self._buckets(np.arange(-(key_len - 1), key_len)))
    buckets_S = jax.lax.dynamic_slice_in_dim(buckets_R, key_len - 1 - index, key_len)
    return jnp.take(self.table, buckets_S, axis=0).T
