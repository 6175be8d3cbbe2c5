"""Attention: pure functions (scaled dot product, masks) and the Linen modules that wrap them.

Masks are boolean, ``True`` = may attend, shaped ``[B, 1 or H, T or 1, S]``;
``NEG_INF`` is applied here and nowhere else. Softmax runs in float32 whatever
the compute dtype, then the weights are cast back.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seq2seq_jax.types import NEG_INF, PAD_ID, Array

_IMPLEMENTATIONS = (None, "einsum", "xla", "cudnn")


def make_padding_mask(key_tokens_BS: Array, query_tokens_BT: Array | None = None, *,
                      pad_id: int = PAD_ID) -> Array:
  """Mask of the keys (and optionally queries) that are not padding.

  Args:
    key_tokens_BS: int token ids of the attended sequence.
    query_tokens_BT: optional ids of the attending sequence; padded queries then
      attend nowhere (their rows come out uniform, never NaN).
    pad_id: the padding id.

  Returns:
    bool ``[B, 1, 1, S]`` from keys alone, or ``[B, 1, T, S]`` with queries.
  """
  mask_B11S = (key_tokens_BS != pad_id)[:, None, None, :]
  if query_tokens_BT is None:
    return mask_B11S
  return jnp.logical_and(mask_B11S, (query_tokens_BT != pad_id)[:, None, :, None])


def make_causal_mask(tokens_BT: Array) -> Array:
  """bool ``[B, 1, T, T]``: query position t may attend to key positions <= t."""
  batch, length = tokens_BT.shape
  causal_TT = jnp.tril(jnp.ones((length, length), dtype=bool))
  return jnp.broadcast_to(causal_TT[None, None], (batch, 1, length, length))


def combine_masks(*masks: Array | None) -> Array | None:
  """Logical AND of the masks that are not None (they must broadcast); None if all are."""
  present = [m for m in masks if m is not None]
  if not present:
    return None
  for m in present:
    if m.ndim != 4:
      raise ValueError(f"attention masks are [B, H, T, S]; got a mask of shape {m.shape}")
  return functools.reduce(jnp.logical_and, present)


def _check_mask(mask: Array, batch: int, heads: int, queries: int, keys: int) -> None:
  if mask.ndim != 4 or mask.dtype != jnp.bool_:
    raise ValueError(f"attention mask must be bool [B, 1 or H, T, S]; got {mask.dtype} {mask.shape}")
  for size, want, letter in zip(mask.shape, (batch, heads, queries, keys), "BHTS"):
    if size not in (1, want):
      raise ValueError(f"attention mask axis {letter} has size {size}; expected 1 or {want} "
                       f"(mask {mask.shape} against B={batch} H={heads} T={queries} S={keys})")


def dot_product_attention(q_BTHK: Array, k_BSHK: Array, v_BSHK: Array, mask: Array | None = None,
                          *, dropout_rng: jax.Array | None = None, dropout_rate: float = 0.0,
                          deterministic: bool = True, return_weights: bool = False,
                          implementation: str | None = None) -> Array | tuple[Array, Array]:
  """softmax(Q K^T / sqrt(K) + mask) V, as einsums.

  Args:
    q_BTHK: queries.
    k_BSHK: keys.
    v_BSHK: values.
    mask: bool ``[B, 1 or H, T or 1, S]``, True = may attend. A query row with no
      allowed key gets uniform weights (finite), never NaN.
    dropout_rng: key for dropout on the weights; needed when not deterministic.
    dropout_rate: probability of dropping a weight.
    deterministic: no dropout when True.
    return_weights: also return the attention weights.
    implementation: None or "einsum" for the einsums here; "xla" or "cudnn" route
      to ``jax.nn.dot_product_attention`` (fused kernels) when no dropout and no
      weights are needed, and fall back to the einsums otherwise.

  Returns:
    ``out_BTHK``, or ``(out_BTHK, weights_BHTS)`` with ``return_weights=True``.

  Example:
    >>> q = k = v = jnp.ones((2, 3, 4, 8))
    >>> dot_product_attention(q, k, v).shape
    (2, 3, 4, 8)
  """
  if implementation not in _IMPLEMENTATIONS:
    raise ValueError(f"implementation={implementation!r}: must be one of {_IMPLEMENTATIONS}")
  batch, queries, heads, width = q_BTHK.shape
  if k_BSHK.shape != v_BSHK.shape or k_BSHK.shape[0] != batch or k_BSHK.shape[2:] != (heads, width):
    raise ValueError(f"shapes do not line up: q {q_BTHK.shape} [B, T, H, K], "
                     f"k {k_BSHK.shape} and v {v_BSHK.shape} [B, S, H, K]")
  if mask is not None:
    _check_mask(mask, batch, heads, queries, k_BSHK.shape[1])
  use_dropout = not deterministic and dropout_rate > 0.0
  if implementation in ("xla", "cudnn") and not use_dropout and not return_weights:
    if mask is not None:
      mask = jnp.broadcast_to(mask, (batch, mask.shape[1], queries, k_BSHK.shape[1]))
    return jax.nn.dot_product_attention(q_BTHK, k_BSHK, v_BSHK, mask=mask,
                                        implementation=implementation)

  dtype = q_BTHK.dtype
  q_BTHK = q_BTHK / jnp.sqrt(width).astype(dtype)
  logits_BHTS = jnp.einsum("BTHK,BSHK->BHTS", q_BTHK, k_BSHK,
                           preferred_element_type=jnp.float32)
  if mask is not None:
    # Replace rather than add: a fully masked row then becomes uniform, not NaN.
    logits_BHTS = jnp.where(mask, logits_BHTS, NEG_INF)
  weights_BHTS = jax.nn.softmax(logits_BHTS, axis=-1).astype(dtype)
  if use_dropout:
    if dropout_rng is None:
      raise ValueError("dropout on attention weights needs dropout_rng when deterministic=False")
    keep_BHTS = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights_BHTS.shape)
    dropped_BHTS = jnp.where(keep_BHTS, weights_BHTS / (1.0 - dropout_rate), 0.0)
    out_BTHK = jnp.einsum("BHTS,BSHK->BTHK", dropped_BHTS.astype(dtype), v_BSHK)
  else:
    out_BTHK = jnp.einsum("BHTS,BSHK->BTHK", weights_BHTS, v_BSHK)
  if return_weights:
    return out_BTHK, weights_BHTS
  return out_BTHK


class MultiHeadAttention(nn.Module):
  """Multi-head attention with an explicit key/value cache.

  ``__call__`` attends from ``inputs_q`` to ``inputs_kv`` (self attention when
  they are the same array). For incremental decoding the keys and values are
  computed once with ``project_kv`` (cross attention) or written one position at a
  time with ``step`` (self attention); the cache is passed in and returned.
  """

  num_heads: int
  head_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  implementation: str | None = None
  kernel_init: Any = nn.initializers.xavier_uniform()

  def setup(self):
    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, self.head_dim),
                              dtype=self.dtype, kernel_init=self.kernel_init)
    self.query = dense(name="query")
    self.key = dense(name="key")
    self.value = dense(name="value")
    self.out = nn.DenseGeneral(features=self.out_dim, axis=(-2, -1), dtype=self.dtype,
                               kernel_init=self.kernel_init, name="out")

  def project_kv(self, inputs_kv_BSD: Array) -> tuple[Array, Array]:
    """Keys and values ``[B, S, H, K]`` of a sequence, for caching cross attention."""
    return self.key(inputs_kv_BSD), self.value(inputs_kv_BSD)

  def attend(self, inputs_q_BTD: Array, k_BSHK: Array, v_BSHK: Array, mask: Array | None, *,
             deterministic: bool = True, return_weights: bool = False):
    """Attends from ``inputs_q`` to already projected keys and values."""
    q_BTHK = self.query(inputs_q_BTD)
    use_dropout = not deterministic and self.dropout_rate > 0.0
    result = dot_product_attention(
        q_BTHK, k_BSHK.astype(q_BTHK.dtype), v_BSHK.astype(q_BTHK.dtype), mask,
        dropout_rng=self.make_rng("dropout") if use_dropout else None,
        dropout_rate=self.dropout_rate, deterministic=deterministic,
        return_weights=return_weights, implementation=self.implementation)
    out_BTHK, weights_BHTS = result if return_weights else (result, None)
    out_BTD = self.out(out_BTHK)
    return (out_BTD, weights_BHTS) if return_weights else out_BTD

  def __call__(self, inputs_q_BTD: Array, inputs_kv_BSD: Array, mask: Array | None = None, *,
               deterministic: bool = True, return_weights: bool = False):
    """Returns ``out_BTD``, or ``(out_BTD, weights_BHTS)`` with ``return_weights``."""
    k_BSHK, v_BSHK = self.project_kv(inputs_kv_BSD)
    return self.attend(inputs_q_BTD, k_BSHK, v_BSHK, mask, deterministic=deterministic,
                       return_weights=return_weights)

  def step(self, inputs_q_B1D: Array, cache_k: Array, cache_v: Array, index: Array, *,
           layer: int | None = None, extra_mask: Array | None = None
           ) -> tuple[Array, Array, Array]:
    """Causal self attention for one new position, written into the cache at ``index``.

    Args:
      inputs_q_B1D: the new position's input.
      cache_k: keys ``[B, T, H, K]``, or ``[B, L, T, H, K]`` stacked over layers
        when ``layer`` is given; rows at positions >= index are ignored.
      cache_v: values, shaped like ``cache_k``.
      index: int32 scalar, the position being decoded.
      layer: which slice of a stacked cache is this layer's. Writing into the
        stacked buffer in place avoids copying a whole layer's cache per step.
      extra_mask: optional bool mask ``[B, 1, 1, T]`` ANDed with the causal one.

    Returns:
      ``(out_B1D, cache_k, cache_v)`` with position ``index`` filled in.
    """
    k_B1HK, v_B1HK = self.project_kv(inputs_q_B1D)
    zero = jnp.zeros((), index.dtype)
    if layer is None:
      start = (zero, index, zero, zero)
      new_k, new_v = k_B1HK, v_B1HK
    else:
      start = (zero, jnp.asarray(layer, index.dtype), index, zero, zero)
      new_k, new_v = k_B1HK[:, None], v_B1HK[:, None]
    # dynamic_update_slice clamps an out-of-range index instead of failing; the
    # models guard against that by poisoning the logits of such a step with NaN.
    cache_k = jax.lax.dynamic_update_slice(cache_k, new_k.astype(cache_k.dtype), start)
    cache_v = jax.lax.dynamic_update_slice(cache_v, new_v.astype(cache_v.dtype), start)
    k_BTHK = cache_k if layer is None else cache_k[:, layer]
    v_BTHK = cache_v if layer is None else cache_v[:, layer]
    length = k_BTHK.shape[1]
    mask_111T = (jnp.arange(length) <= index)[None, None, None, :]
    mask = combine_masks(mask_111T, extra_mask)
    out_B1D = self.attend(inputs_q_B1D, k_BTHK, v_BTHK, mask)
    return out_B1D, cache_k, cache_v
