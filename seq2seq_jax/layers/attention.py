"""Attention: pure functions (scaled dot product, masks) and the Linen modules that wrap them.

Masks are an ``AttentionMask`` (key padding, packed rows' segments, causality:
the form a fused kernel takes), or dense boolean arrays, ``True`` = may attend,
shaped ``[B, 1 or H, T or 1, S]``, which only the einsums and "xla" take;
``NEG_INF`` is applied here and nowhere else. Softmax runs in float32 whatever
the compute dtype, then the weights are cast back.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from collections.abc import Iterator
from typing import Any, Literal

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from seq2seq_jax.layers import fused_attention
from seq2seq_jax.layers import quantized
from seq2seq_jax.layers.dropout import dropout
from seq2seq_jax.layers.partitioning import BATCH, HEADS, KV, LENGTH, constrain
from seq2seq_jax.platforms import on_cpu
from seq2seq_jax.types import NEG_INF, Array

_ONE_BLOCK: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "seq2seq_jax_cache_reads_in_one_block", default=False)


@contextlib.contextmanager
def cache_reads_in_one_block() -> Iterator[None]:
  """Within the block, ``KVCache.attend`` reads the whole cache as one block, without a loop.

  For cost analysis (``seq2seq_jax.aot``): XLA's cost analysis counts the body of a
  loop once, so a decoding step's blocked read of the cache would count one block.
  Read as one block, a step costs what the last step of a search reads: every
  position. The results are the same either way.
  """
  token = _ONE_BLOCK.set(True)
  try:
    yield
  finally:
    _ONE_BLOCK.reset(token)


def make_segment_mask(query_segment_ids_BT: Array, key_segment_ids_BS: Array) -> Array:
  """Mask of packed rows: a query attends only to keys of its own segment.

  Packed rows hold several sequences one after the other, numbered 1, 2, ... by
  their segment ids, with 0 on the padding after the last one. Self attention
  passes the same ids twice; cross attention passes the targets' and the sources'
  ids (target segment k reads source segment k). A key of segment 0 (padding) is
  attended by no query, so a padded query's row has no allowed key and comes out
  uniform (finite), as any row with no allowed key does.

  Args:
    query_segment_ids_BT: int segment ids of the attending sequence.
    key_segment_ids_BS: int segment ids of the attended sequence.

  Returns:
    bool ``[B, 1, T, S]``.

  Example:
    >>> ids = jnp.array([[1, 1, 2, 0]])
    >>> make_segment_mask(ids, ids)[0, 0].astype(int)
    Array([[1, 1, 0, 0],
           [1, 1, 0, 0],
           [0, 0, 1, 0],
           [0, 0, 0, 0]], dtype=int32)
  """
  if query_segment_ids_BT.ndim != 2 or key_segment_ids_BS.ndim != 2 or (
      query_segment_ids_BT.shape[0] != key_segment_ids_BS.shape[0]):
    raise ValueError(f"segment ids are [B, T] and [B, S] with the same B; got "
                     f"{query_segment_ids_BT.shape} and {key_segment_ids_BS.shape}")
  same_BTS = query_segment_ids_BT[:, :, None] == key_segment_ids_BS[:, None, :]
  return jnp.logical_and(same_BTS, (key_segment_ids_BS != 0)[:, None, :])[:, None]


@flax.struct.dataclass
class AttentionMask:
  """Which keys each query may attend, in the form fused kernels take.

  Query ``t`` of row ``b`` may attend key ``s`` when all of these hold:

  * ``key_valid[b, s]`` (None: every key is valid);
  * packed rows: ``query_segment_ids[b, t] == key_segment_ids[b, s]`` and the key's
    segment is not 0 (padding);
  * ``causal``: ``s <= t``.

  A query with no allowed key gets uniform weights from the einsums (finite); its
  output is never used (it is padding), and kernels may give it another finite value.

  Attributes:
    key_valid: bool ``[B, S]`` or None.
    query_segment_ids: int ``[B, T]`` or None (then ``key_segment_ids`` is None too).
    key_segment_ids: int ``[B, S]`` or None.
    causal: static; a query attends no later key.

  Example:
    >>> mask = AttentionMask(key_valid=jnp.array([[True, True, False]]), causal=True)
    >>> mask.dense(batch=1, queries=3)[0, 0].astype(int)
    Array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 0]], dtype=int32)
  """

  key_valid: Array | None = None
  query_segment_ids: Array | None = None
  key_segment_ids: Array | None = None
  causal: bool = flax.struct.field(pytree_node=False, default=False)

  def __post_init__(self):
    if (self.query_segment_ids is None) != (self.key_segment_ids is None):
      raise ValueError("AttentionMask: query_segment_ids and key_segment_ids go together "
                       "(packed rows); give both or neither")

  @property
  def packed(self) -> bool:
    return self.query_segment_ids is not None

  def dense(self, *, batch: int, queries: int, causal: bool | None = None) -> Array | None:
    """The mask as the einsums take it: bool ``[B or 1, 1, T or 1, S]``, or None if nothing is masked.

    The parts are combined as the models always built them: key padding
    ``[B, 1, 1, S]``, then the causal ``[B, 1, T, T]``, then the segments ``[B, 1, T, S]``.
    ``causal=False`` leaves causality out (for a kernel that applies it itself).
    """
    parts = []
    if self.key_valid is not None:
      parts.append(self.key_valid[:, None, None, :])
    if self.causal if causal is None else causal:
      causal_TT = jnp.tril(jnp.ones((queries, queries), dtype=bool))
      parts.append(jnp.broadcast_to(causal_TT[None, None], (batch, 1, queries, queries)))
    if self.query_segment_ids is not None and self.key_segment_ids is not None:
      parts.append(make_segment_mask(self.query_segment_ids, self.key_segment_ids))
    return functools.reduce(jnp.logical_and, parts) if parts else None


def _check_mask(mask: Array, batch: int, heads: int, queries: int, keys: int) -> None:
  if mask.ndim != 4 or mask.dtype != jnp.bool_:
    raise ValueError(f"attention mask must be bool [B, 1 or H, T, S]; got {mask.dtype} {mask.shape}")
  for size, want, letter in zip(mask.shape, (batch, heads, queries, keys), "BHTS"):
    if size not in (1, want):
      raise ValueError(f"attention mask axis {letter} has size {size}; expected 1 or {want} "
                       f"(mask {mask.shape} against B={batch} H={heads} T={queries} S={keys})")


def dot_product_attention(q_BTHK: Array, k_BSHK: Array, v_BSHK: Array,
                          mask: Array | AttentionMask | None = None, *,
                          dropout_rng: jax.Array | None = None, dropout_rate: float = 0.0,
                          deterministic: bool = True, return_weights: bool = False,
                          implementation: str | None = None, bias: Array | None = None,
                          scale: float | None = None) -> Array | tuple[Array, Array]:
  """softmax(Q K^T / sqrt(K) + bias + mask) V, as einsums or through a fused kernel.

  Args:
    q_BTHK: queries.
    k_BSHK: keys.
    v_BSHK: values.
    mask: bool ``[B, 1 or H, T or 1, S]``, True = may attend, or an ``AttentionMask``
      (padding, packed rows' segments, causality: the form fused kernels take). A
      query row with no allowed key gets uniform weights (finite), never NaN.
    bias: optional float ``[B or 1, H or 1, T, S]`` added to the scores before the
      mask (T5's relative position bias), in float32.
    scale: what the scores are multiplied by; None is ``1 / sqrt(K)`` (T5: 1.0).
    dropout_rng: key for dropout on the weights; needed when not deterministic.
    dropout_rate: probability of dropping a weight.
    deterministic: no dropout when True.
    return_weights: also return the attention weights.
    implementation: one of ``layers.fused_attention.IMPLEMENTATIONS``; None is
      "einsum", the einsums here. "xla", "cudnn", "splash" and "auto" reach a
      fused kernel when the call allows one (no weights asked, no dropout; "cudnn"
      and "splash" also no bias, and an ``AttentionMask`` rather than a dense
      mask), and otherwise fall back to the einsums, saying why once in the log.

  Returns:
    ``out_BTHK``, or ``(out_BTHK, weights_BHTS)`` with ``return_weights=True``.

  Example:
    >>> q = k = v = jnp.ones((2, 3, 4, 8))
    >>> dot_product_attention(q, k, v).shape
    (2, 3, 4, 8)
  """
  if implementation is not None and implementation not in fused_attention.IMPLEMENTATIONS:
    raise ValueError(f"implementation={implementation!r}: must be one of "
                     f"{fused_attention.IMPLEMENTATIONS} (or None, the einsums)")
  batch, queries, heads, width = q_BTHK.shape
  if k_BSHK.shape != v_BSHK.shape or k_BSHK.shape[0] != batch or k_BSHK.shape[2:] != (heads, width):
    raise ValueError(f"shapes do not line up: q {q_BTHK.shape} [B, T, H, K], "
                     f"k {k_BSHK.shape} and v {v_BSHK.shape} [B, S, H, K]")
  use_dropout = not deterministic and dropout_rate > 0.0
  chosen = fused_attention.resolve(implementation or "einsum")
  if chosen != "einsum":
    why = fused_attention.refusal(chosen, q_BTHK, k_BSHK, bias=bias, use_dropout=use_dropout,
                                  return_weights=return_weights)
    if why is None and chosen != "xla" and mask is not None and not isinstance(
        mask, AttentionMask):
      why = "the mask is a dense array (the kernel takes an AttentionMask)"
    if why is None:
      scale = 1.0 / math.sqrt(width) if scale is None else scale
      if mask is None or isinstance(mask, AttentionMask):
        return fused_attention.fused_attention(q_BTHK, k_BSHK, v_BSHK, mask,
                                               implementation=chosen, bias=bias, scale=scale)
      dense_BHTS = jnp.broadcast_to(mask, (batch, mask.shape[1], queries, k_BSHK.shape[1]))
      return jax.nn.dot_product_attention(  # "xla" with a dense mask, as it is
          q_BTHK, k_BSHK, v_BSHK, mask=dense_BHTS, implementation="xla", scale=scale,
          bias=None if bias is None else bias.astype(q_BTHK.dtype))
    fused_attention.say_once(f"attention_impl {implementation!r} ({chosen}): this call runs the "
                             f"einsums, because {why}")
  if isinstance(mask, AttentionMask):
    mask = mask.dense(batch=batch, queries=queries)
  if mask is not None:
    _check_mask(mask, batch, heads, queries, k_BSHK.shape[1])

  dtype = q_BTHK.dtype
  if scale is None:
    q_BTHK = q_BTHK / jnp.sqrt(width).astype(dtype)
  elif scale != 1.0:
    q_BTHK = q_BTHK * jnp.asarray(scale, dtype)
  logits_BHTS = jnp.einsum("BTHK,BSHK->BHTS", q_BTHK, k_BSHK,
                           preferred_element_type=jnp.float32)
  if bias is not None:
    logits_BHTS = logits_BHTS + bias.astype(jnp.float32)
  if mask is not None:
    # Replace rather than add: a fully masked row then becomes uniform, not NaN.
    logits_BHTS = jnp.where(mask, logits_BHTS, NEG_INF)
  weights_BHTS = jax.nn.softmax(logits_BHTS, axis=-1).astype(dtype)
  if use_dropout:
    if dropout_rng is None:
      raise ValueError("dropout on attention weights needs dropout_rng when deterministic=False")
    dropped_BHTS = dropout(weights_BHTS, dropout_rate, dropout_rng)
    out_BTHK = jnp.einsum("BHTS,BSHK->BTHK", dropped_BHTS, v_BSHK)
  else:
    out_BTHK = jnp.einsum("BHTS,BSHK->BTHK", weights_BHTS, v_BSHK)
  if return_weights:
    return out_BTHK, weights_BHTS
  return out_BTHK


def _constrain_heads(x_BTHK: Array) -> Array:
  """Rows on the mesh's ``data`` axis, heads on ``model`` (inside ``activation_sharding``)."""
  if x_BTHK.ndim == 3:  # [B, H, K]: one position of a decoding step
    return constrain(x_BTHK, BATCH, HEADS, KV)
  return constrain(x_BTHK, BATCH, LENGTH, HEADS, KV)


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
  implementation: str | None = None  # see dot_product_attention; None: the einsums
  kernel_init: Any = nn.initializers.xavier_uniform()
  use_bias: bool = True  # biases on the four projections (T5 has none)
  scale_queries: bool = True  # scores / sqrt(K); False: unscaled, as T5 (its init absorbs it)

  def setup(self):
    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, self.head_dim),
                              dtype=self.dtype, kernel_init=self.kernel_init,
                              use_bias=self.use_bias)
    self.query = dense(name="query")
    self.key = dense(name="key")
    self.value = dense(name="value")
    self.out = nn.DenseGeneral(features=self.out_dim, axis=(-2, -1), dtype=self.dtype,
                               kernel_init=self.kernel_init, use_bias=self.use_bias, name="out")

  def _note_decoding(self) -> None:
    """A decoding step reads the cache with the einsums here, whatever the choice: says so once."""
    if self.implementation not in (None, "einsum"):
      fused_attention.say_once(
          f"attention_impl {self.implementation!r}: decoding steps (one query against the KV "
          "cache) run the library's blocked cache read (einsums), not a fused kernel")

  def _scaled(self, q: Array) -> Array:
    """Queries as the scores need them: / sqrt(K), or as they are without scaling."""
    return q / jnp.sqrt(self.head_dim).astype(q.dtype) if self.scale_queries else q

  def _project(self, x_BSD: Array, names: tuple[str, ...]) -> tuple[Array, ...]:
    """``x`` through the named head projections (``"query"``, ``"key"``, ``"value"``) at once.

    One matmul against the projections' kernels stacked to ``[D, C, H, K]`` rather
    than C matmuls: the same parameters and the same sums, but a C times wider matmul,
    which the CPU runs at about twice the rate when the rows are few (a decoding
    step: 128 rows, 570 -> 305 us for q, k and v). ``init`` goes through the
    projections themselves, which creates their parameters.
    """
    modules = [getattr(self, name) for name in names]
    if self.is_initializing():
      return tuple(module(x_BSD) for module in modules)
    params = [module.variables["params"] for module in modules]
    if quantized.is_quantized(params[0]["kernel"]):  # int8 weights (seq2seq_jax.quantization)
      y_BSCHK = quantized.project(x_BSD, [p["kernel"] for p in params], self.dtype)
    else:
      kernel_DCHK = jnp.stack([p["kernel"] for p in params], axis=1)
      x_BSD, kernel_DCHK = nn.dtypes.promote_dtype(x_BSD, kernel_DCHK, dtype=self.dtype)
      y_BSCHK = jnp.einsum("...D,DCHK->...CHK", x_BSD, kernel_DCHK)
    if self.use_bias:
      bias_CHK = jnp.stack([p["bias"] for p in params], axis=0).astype(y_BSCHK.dtype)
      y_BSCHK = y_BSCHK + bias_CHK.reshape((1,) * (y_BSCHK.ndim - 3) + bias_CHK.shape)
    return tuple(_constrain_heads(y_BSCHK[..., c, :, :]) for c in range(len(names)))

  def project_kv(self, inputs_kv_BSD: Array) -> tuple[Array, Array]:
    """Keys and values ``[B, S, H, K]`` of a sequence, for caching cross attention."""
    k_BSHK, v_BSHK = self._project(inputs_kv_BSD, ("key", "value"))
    return k_BSHK, v_BSHK

  def attend(self, inputs_q_BTD: Array, k_BSHK: Array, v_BSHK: Array,
             mask: Array | AttentionMask | None, *,
             deterministic: bool = True, return_weights: bool = False,
             q_BTHK: Array | None = None, bias: Array | None = None):
    """Attends from ``inputs_q`` to already projected keys and values.

    ``q_BTHK``: the queries when already projected (``__call__`` projects q, k and
    v of self attention together); default ``self.query(inputs_q_BTD)``. ``bias``:
    float ``[B or 1, H, T, S]`` added to the scores (a relative position bias).
    """
    if q_BTHK is None:
      q_BTHK = _constrain_heads(self.query(inputs_q_BTD))
    use_dropout = not deterministic and self.dropout_rate > 0.0
    result = dot_product_attention(
        q_BTHK, k_BSHK.astype(q_BTHK.dtype), v_BSHK.astype(q_BTHK.dtype), mask,
        dropout_rng=self.make_rng("dropout") if use_dropout else None,
        dropout_rate=self.dropout_rate, deterministic=deterministic,
        return_weights=return_weights, bias=bias,
        # init only creates parameters: the einsums, whatever platform it is traced for
        implementation=None if self.is_initializing() else self.implementation,
        scale=None if self.scale_queries else 1.0)
    if isinstance(result, tuple):  # return_weights
      out_BTHK, weights_BHTS = result
    else:
      out_BTHK, weights_BHTS = result, None
    out_BTD = self.out(_constrain_heads(out_BTHK))
    return (out_BTD, weights_BHTS) if return_weights else out_BTD

  def attend_one(self, inputs_q_B1D: Array, k_BHKS: Array, v_BHKS: Array,
                 valid_BS: Array) -> Array:
    """One query per row against keys and values stored ``[B, H, K, S]``: ``out_B1D``.

    Cross attention while decoding: with the memory in this layout both
    contractions read it as it lies, so a step copies none of it. ``valid_BS`` is
    True where a key may be attended. No dropout (decoding is deterministic).
    """
    self._note_decoding()
    q_BHK = self._scaled(self.query(inputs_q_B1D)[:, 0])
    dtype = q_BHK.dtype
    logits_BHS = jnp.einsum("BHK,BHKS->BHS", q_BHK, k_BHKS.astype(dtype),
                            preferred_element_type=jnp.float32)
    logits_BHS = jnp.where(valid_BS[:, None, :], logits_BHS, NEG_INF)
    weights_BHS = jax.nn.softmax(logits_BHS, axis=-1).astype(dtype)
    out_BHK = jnp.einsum("BHKS,BHS->BHK", v_BHKS.astype(dtype), weights_BHS)
    return self.out(out_BHK[:, None])

  def __call__(self, inputs_q_BTD: Array, inputs_kv_BSD: Array,
               mask: Array | AttentionMask | None = None, *,
               deterministic: bool = True, return_weights: bool = False,
               bias: Array | None = None):
    """Returns ``out_BTD``, or ``(out_BTD, weights_BHTS)`` with ``return_weights``.

    ``bias``: float ``[B or 1, H, T, S]`` added to the scores (a relative position bias).
    """
    if inputs_q_BTD is inputs_kv_BSD:  # self attention: q, k and v in one matmul
      q_BTHK, k_BSHK, v_BSHK = self._project(inputs_q_BTD, ("query", "key", "value"))
    else:
      q_BTHK = None
      k_BSHK, v_BSHK = self.project_kv(inputs_kv_BSD)
    return self.attend(inputs_q_BTD, k_BSHK, v_BSHK, mask, deterministic=deterministic,
                       return_weights=return_weights, q_BTHK=q_BTHK, bias=bias)

  def step(self, inputs_q_B1D: Array, cache: KVCache, index: Array, *, layer: int = 0,
           block_size: int = 8, bias_HT: Array | None = None) -> tuple[Array, KVCache]:
    """Causal self attention for one new position, written into the cache at ``index``.

    Args:
      inputs_q_B1D: the new position's input.
      cache: the keys and values of positions < ``index`` (see ``KVCache``).
      index: int32 scalar, the position being decoded.
      layer: which layer's slice of the stacked cache is this one's.
      block_size: positions read per block; only blocks up to ``index`` are read.
      bias_HT: optional float ``[H, T]`` added to the scores against each cached
        position (this position's row of a relative position bias).

    Returns:
      ``(out_B1D, cache)`` with position ``index`` filled in.
    """
    self._note_decoding()
    q_B1HK, k_B1HK, v_B1HK = self._project(inputs_q_B1D, ("query", "key", "value"))
    cache = cache.write(k_B1HK[:, 0], v_B1HK[:, 0], index, layer)
    out_BHK = cache.attend(self._scaled(q_B1HK[:, 0]), index, layer, block_size=block_size,
                           bias_HT=bias_HT)
    return self.out(out_BHK[:, None]), cache


@flax.struct.dataclass
class KVCache:
  """Self-attention keys and values for incremental decoding; beam search moves pointers.

  Row ``n`` writes its key and value for position ``t`` of a layer at
  ``key[layer][n, t]``, and ``slots[n, t]`` names the row that holds position ``t``
  of row ``n``'s history. Beam search reorders rows through ``gather_rows``, which
  moves only the ``[N, T]`` slot table: no step copies the ``[N, T, H, K]`` buffers, and
  ``attend`` reads only the blocks up to the current position. A position is
  written once, at the step that decodes it, so the entries a slot points to are
  never overwritten.

  How ``attend`` follows the slots depends on the platform. The CPU gathers each
  row's entries. Elsewhere a gather of one small slice per row and position is
  dear (compiled for a TPU v5e: 153 MB costed for 3.8 MB of cache, 32 rows, 58
  positions, d 512), so the rows of one sentence's ``beams`` hypotheses are read as
  one dense block: every hypothesis scores the keys of all ``beams`` rows at each
  position and keeps, by a one-hot of its slot, the one its history names
  (``beams`` x the attention FLOPs, each cached byte read once, no reorder copies).
  ``beams`` is set by ``gather_rows`` when it tiles rows (``decoding.expand_to_beams``);
  a cache reordered without it (``beams == 1``) copies its rows off the CPU instead.
  Greedy search and sampling never reorder: while ``rows_in_order`` holds, every
  platform reads the buffers as they lie. One buffer a layer, not one stacked
  ``[N, L, T, H, K]``: the TPU compiler copies a layer's slice out of a stacked
  buffer before reading it (a beam-4 step of 256 sentences, 6 layers: 2.7 GB more).

  Attributes:
    key: one ``[N, T, H, K]`` array per decoder layer.
    value: shaped like ``key``.
    slots: int32 ``[N, T]``.
    rows_in_order: static; True until ``gather_rows`` has been called (row n's
      history is then the buffers' row n).
    beams: static; rows ``g * beams .. (g + 1) * beams - 1`` are one sentence's
      hypotheses, and every slot of a row points into its own group.

  Example:
    >>> cache = KVCache.zeros(rows=2, layers=1, length=4, heads=1, head_dim=3)
    >>> cache = cache.write(jnp.ones((2, 1, 3)), jnp.ones((2, 1, 3)), jnp.int32(0), layer=0)
    >>> cache.attend(jnp.ones((2, 1, 3)), jnp.int32(0), 0).shape
    (2, 1, 3)
  """

  key: tuple[Array, ...]
  value: tuple[Array, ...]
  slots: Array
  rows_in_order: bool = flax.struct.field(pytree_node=False, default=True)
  beams: int = flax.struct.field(pytree_node=False, default=1)

  @classmethod
  def zeros(cls, *, rows: int, layers: int, length: int, heads: int, head_dim: int,
            dtype: Any = jnp.float32) -> KVCache:
    """An empty cache for ``length`` positions."""
    shape = (rows, length, heads, head_dim)
    slots_NT = jnp.broadcast_to(jnp.arange(rows, dtype=jnp.int32)[:, None], (rows, length))
    buffers = lambda: tuple(constrain(jnp.zeros(shape, dtype), BATCH, LENGTH, HEADS, KV)
                            for _ in range(layers))
    return cls(key=buffers(), value=buffers(), slots=constrain(slots_NT, BATCH, LENGTH))

  @property
  def length(self) -> int:
    """T, the positions the cache holds."""
    return self.key[0].shape[1]

  def write(self, k_NHK: Array, v_NHK: Array, index: Array, layer: int) -> KVCache:
    """Stores each row's key and value for position ``index`` of ``layer``, in place.

    ``dynamic_update_slice`` clamps an out-of-range index instead of failing; the
    models guard against that by poisoning the logits of such a step with NaN.
    """
    rows = self.slots.shape[0]
    zero = jnp.zeros((), index.dtype)

    def put(buffers, new_NHK):
      buffer = buffers[layer]
      at = jax.lax.dynamic_update_slice(buffer, new_NHK[:, None].astype(buffer.dtype),
                                        (zero, index, zero, zero))
      return buffers[:layer] + (at,) + buffers[layer + 1:]

    own_N1 = jnp.arange(rows, dtype=self.slots.dtype)[:, None]
    slots = jax.lax.dynamic_update_slice(self.slots, own_N1, (zero, index))
    return dataclasses.replace(self, key=put(self.key, k_NHK), value=put(self.value, v_NHK),
                               slots=slots)

  def gather_rows(self, rows_M: Array) -> KVCache:
    """The cache whose row ``m`` continues row ``rows_M[m]``'s history.

    With as many rows as before (a beam search step) only the slot table moves (off
    the CPU without ``beams``, the buffers' rows); with another count
    (``expand_to_beams``) the histories are copied out, and a whole multiple of the
    rows (each row tiled ``beams`` times) sets ``beams``. Either way
    ``rows_in_order`` becomes False: the beam search that follows reorders. With
    ``beams`` set, ``rows_M`` must keep each row within its group (beam search does).
    """
    old = self.slots.shape[0]
    if rows_M.shape[0] == old:
      if self.beams > 1:
        return dataclasses.replace(self, slots=self.slots[rows_M], rows_in_order=False)

      def by_pointer(key, value, slots):
        return key, value, slots[rows_M]

      def by_copy(key, value, slots):
        take = lambda buffers: tuple(buffer[rows_M] for buffer in buffers)
        return take(key), take(value), slots

      key, value, slots = on_cpu(by_pointer, by_copy, self.key, self.value, self.slots)
      return dataclasses.replace(self, key=key, value=value, slots=slots, rows_in_order=False)
    key, value = self._histories()
    rows = rows_M.shape[0]
    own_MT = jnp.broadcast_to(jnp.arange(rows, dtype=jnp.int32)[:, None], (rows, self.length))
    take = lambda buffers: tuple(buffer[rows_M] for buffer in buffers)
    return KVCache(key=take(key), value=take(value), slots=own_MT, rows_in_order=False,
                   beams=rows // old if rows % old == 0 else 1)

  def _histories(self) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    """Each layer's keys and values ``[N, T, H, K]`` in each row's own history order."""
    if self.rows_in_order:
      return self.key, self.value

    def by_pointer(key, value, slots):
      positions_1T = jnp.arange(self.length)[None, :]
      take = lambda buffers: tuple(buffer[slots, positions_1T] for buffer in buffers)
      return take(key), take(value)

    if self.beams > 1:  # the buffers never moved: follow the slots everywhere
      return by_pointer(self.key, self.value, self.slots)
    return on_cpu(by_pointer, lambda key, value, slots: (key, value), self.key, self.value,
                  self.slots)

  def resolved(self) -> tuple[Array, Array]:
    """Keys and values ``[N, L, T, H, K]`` (the layers stacked) in each row's own history order."""
    key, value = self._histories()
    return jnp.stack(key, axis=1), jnp.stack(value, axis=1)

  def attend(self, q_NHK: Array, index: Array, layer: int, *, block_size: int = 8,
             bias_HT: Array | None = None) -> Array:
    """One query per row over positions ``<= index`` of ``layer``: ``out_NHK``.

    ``q_NHK`` comes already scaled (by ``1 / sqrt(K)``, or not at all for T5);
    ``bias_HT`` (optional, float ``[H, T]``) is added to the scores against each of
    the cache's T positions. Reads the cache in blocks of
    ``block_size`` positions, only those up to ``index`` (a ``lax.fori_loop`` with
    a traced trip count), combining them with a running maximum and sum in float32
    (the streaming softmax of flash attention), so a step's cost grows with the
    position decoded rather than the cache's length. Blocks of 8 beat 16 and 32 for
    T-small beam 4 at 24, 64 and 256 tokens (by 7 %, 1 % and 6 %; greedy: 1 %).
    """
    length = self.length
    block = length if _ONE_BLOCK.get() else min(block_size, length)
    num_blocks = jnp.minimum(index // block + 1, -(-length // block))
    dtype = q_NHK.dtype
    rows, heads, width = q_NHK.shape
    beams = self.beams

    def body(b, carry):
      # The last block is clamped to end at the cache's end; positions an earlier
      # block already read are masked out, so none is counted twice.
      start = jnp.minimum(b * block, length - block)
      positions_S = start + jnp.arange(block)
      valid_S = jnp.logical_and(positions_S >= b * block, positions_S <= index)

      def update(scores_NHS, mix):
        """The streaming softmax's step, given the block's scores and how to weigh its values."""
        max_NH, sum_NH, acc_NHK = carry
        if bias_HT is not None:
          bias_HS = jax.lax.dynamic_slice_in_dim(bias_HT, start, block, axis=1)
          scores_NHS = scores_NHS + bias_HS[None].astype(jnp.float32)
        scores_NHS = jnp.where(valid_S, scores_NHS, NEG_INF)
        new_max_NH = jnp.maximum(max_NH, scores_NHS.max(axis=-1))
        weights_NHS = jnp.exp(scores_NHS - new_max_NH[..., None])
        rescale_NH = jnp.exp(max_NH - new_max_NH)
        sum_NH = sum_NH * rescale_NH + weights_NHS.sum(axis=-1)
        acc_NHK = acc_NHK * rescale_NH[..., None] + mix(weights_NHS.astype(dtype))
        return new_max_NH, sum_NH, acc_NHK

      def block_of(buffers):  # [N, S, H, K]: this layer's block, rows as they lie
        return jax.lax.dynamic_slice_in_dim(buffers[layer], start, block, axis=1).astype(dtype)

      def by_rows(k_NSHK, v_NSHK):
        scores_NHS = jnp.einsum("NHK,NSHK->NHS", q_NHK, k_NSHK, preferred_element_type=jnp.float32)
        return update(scores_NHS, lambda w_NHS: jnp.einsum(
            "NHS,NSHK->NHK", w_NHS, v_NSHK, preferred_element_type=jnp.float32))

      def as_they_lie(key, value, slots):
        return by_rows(block_of(key), block_of(value))

      def by_pointer(key, value, slots):
        slots_NS = jax.lax.dynamic_slice_in_dim(slots, start, block, axis=1)
        take = lambda buffers: buffers[layer][slots_NS, positions_S[None, :]].astype(dtype)
        return by_rows(take(key), take(value))

      def by_group(key, value, slots):
        # Hypothesis w of sentence g reads, at position s, row g * beams + v of the
        # group, v = its slot's place in the group: all beams rows scored, one kept.
        groups = rows // beams
        k_GVSHK = block_of(key).reshape(groups, beams, block, heads, width)
        v_GVSHK = block_of(value).reshape(groups, beams, block, heads, width)
        slots_NS = jax.lax.dynamic_slice_in_dim(slots, start, block, axis=1)
        first_N1 = (jnp.arange(rows, dtype=slots.dtype) // beams * beams)[:, None]
        pick_GWSV = jax.nn.one_hot(slots_NS - first_N1, beams, dtype=dtype).reshape(
            groups, beams, block, beams)
        q_GWHK = q_NHK.reshape(groups, beams, heads, width)
        every_GWHVS = jnp.einsum("GWHK,GVSHK->GWHVS", q_GWHK, k_GVSHK,
                                 preferred_element_type=jnp.float32)
        scores_NHS = jnp.einsum("GWHVS,GWSV->GWHS", every_GWHVS, pick_GWSV.astype(jnp.float32))
        mix = lambda w_NHS: jnp.einsum(
            "GWHS,GWSV,GVSHK->GWHK", w_NHS.reshape(groups, beams, heads, block), pick_GWSV,
            v_GVSHK, preferred_element_type=jnp.float32).reshape(rows, heads, width)
        return update(scores_NHS.reshape(rows, heads, block), mix)

      if self.rows_in_order:
        return as_they_lie(self.key, self.value, self.slots)
      return on_cpu(by_pointer, by_group if beams > 1 else as_they_lie, self.key, self.value,
                    self.slots)

    init = (jnp.full((rows, heads), NEG_INF, jnp.float32), jnp.zeros((rows, heads), jnp.float32),
            jnp.zeros((rows, heads, width), jnp.float32))
    if length <= block:  # one block: no inner loop
      _, sum_NH, acc_NHK = body(0, init)
    else:
      _, sum_NH, acc_NHK = jax.lax.fori_loop(0, num_blocks, body, init)
    return (acc_NHK / sum_NH[..., None]).astype(dtype)


# Attention for recurrent decoders (Bahdanau et al. 2015, Luong et al. 2015). One
# head, no scaling; the alignment matrix is returned because it is the point.


def _alignment_mask(mask: Array, batch: int, queries: int, keys: int) -> Array:
  """bool ``[B, 1, T or 1, S]`` (the library's mask shape) -> ``[B, T or 1, S]``."""
  _check_mask(mask, batch, 1, queries, keys)
  return mask[:, 0]


def masked_alignment(scores_BTS: Array, mask: Array | None = None) -> Array:
  """float32 softmax over the source of ``scores_BTS`` where ``mask`` allows.

  Args:
    scores_BTS: alignment scores, any float dtype.
    mask: optional bool ``[B, 1, T or 1, S]``, True = may attend.

  Returns:
    float32 ``alignment_BTS``: each row sums to 1 over the allowed positions and
    is exactly 0 elsewhere (a row with nothing allowed is uniform, never NaN).
  """
  scores_BTS = scores_BTS.astype(jnp.float32)
  if mask is not None:
    batch, queries, keys = scores_BTS.shape
    scores_BTS = jnp.where(_alignment_mask(mask, batch, queries, keys), scores_BTS, NEG_INF)
  return jax.nn.softmax(scores_BTS, axis=-1)


def additive_scores(query_BTA: Array, keys_BSA: Array, v_A: Array) -> Array:
  """Bahdanau scores ``v^T tanh(W q_t + U h_s)`` from projected queries and keys.

  Args:
    query_BTA: ``W q_t``, the projected decoder states.
    keys_BSA: ``U h_s (+ b)``, the projected encoder states.
    v_A: the scoring vector.

  Returns:
    float32 ``scores_BTS``.
  """
  hidden_BTSA = jnp.tanh(query_BTA[:, :, None, :] + keys_BSA[:, None, :, :])
  return jnp.einsum("BTSA,A->BTS", hidden_BTSA, v_A.astype(hidden_BTSA.dtype),
                    preferred_element_type=jnp.float32)


def luong_scores(query_BTD: Array, keys_BSD: Array) -> Array:
  """Luong scores ``q_t . k_s`` ("dot"; "general" passes ``k_s = W_a h_s``), float32 ``[B, T, S]``."""
  return jnp.einsum("BTD,BSD->BTS", query_BTD, keys_BSD, preferred_element_type=jnp.float32)


def attention_context(alignment_BTS: Array, values_BSD: Array) -> Array:
  """``c_t = sum_s alignment[t, s] * values[s]``: ``[B, T, D]`` in the values' dtype."""
  return jnp.einsum("BTS,BSD->BTD", alignment_BTS.astype(values_BSD.dtype), values_BSD)


class AdditiveAttention(nn.Module):
  """Bahdanau (additive, "concat") attention: ``score(q, h) = v^T tanh(W q + U h + b)``.

  ``project_keys`` computes ``U h + b`` once per source, so a decoder step pays
  only for its query.

  Example:
    >>> att = AdditiveAttention(attention_dim=6)
    >>> q, h = jnp.ones((2, 3, 4)), jnp.ones((2, 5, 8))
    >>> mask = jnp.ones((2, 1, 1, 5), bool)
    >>> (ctx, align), _ = att.init_with_output(jax.random.key(0), q, h, mask)
    >>> ctx.shape, align.shape
    ((2, 3, 8), (2, 3, 5))
  """

  attention_dim: int
  dtype: Any = jnp.float32

  def setup(self):
    self.query = nn.Dense(self.attention_dim, use_bias=False, dtype=self.dtype, name="query")
    self.key = nn.Dense(self.attention_dim, use_bias=True, dtype=self.dtype, name="key")
    self.v = self.param("v", nn.initializers.normal(stddev=self.attention_dim ** -0.5),
                        (self.attention_dim,), jnp.float32)

  def project_keys(self, memory_BSD: Array) -> Array:
    """``keys_BSA = U h + b`` of the encoder states."""
    return self.key(memory_BSD)

  def attend(self, query_BTQ: Array, keys_BSA: Array, values_BSD: Array,
             mask: Array | None = None) -> tuple[Array, Array]:
    """Attends with already projected keys; returns ``(context_BTD, alignment_BTS)``."""
    scores_BTS = additive_scores(self.query(query_BTQ), keys_BSA.astype(self.dtype), self.v)
    alignment_BTS = masked_alignment(scores_BTS, mask)
    return attention_context(alignment_BTS, values_BSD.astype(self.dtype)), alignment_BTS

  def __call__(self, query_BTQ: Array, memory_BSD: Array,
               mask: Array | None = None) -> tuple[Array, Array]:
    """Returns ``(context_BTD, alignment_BTS)``; alignment is float32."""
    return self.attend(query_BTQ, self.project_keys(memory_BSD), memory_BSD, mask)


class LuongAttention(nn.Module):
  """Luong multiplicative attention: "dot" ``q . h`` or "general" ``q^T W_a h``.

  "general" projects the encoder states once (``project_keys``: ``W_a h``, width
  ``query_dim``); "dot" needs queries and encoder states of the same width.

  Example:
    >>> att = LuongAttention(kind="general", query_dim=4)
    >>> q, h = jnp.ones((2, 3, 4)), jnp.ones((2, 5, 8))
    >>> (ctx, align), _ = att.init_with_output(jax.random.key(0), q, h)
    >>> ctx.shape, align.shape
    ((2, 3, 8), (2, 3, 5))
  """

  kind: str = "general"  # "dot" or "general"
  query_dim: int = 0  # width of the queries; needed by "general"
  dtype: Any = jnp.float32

  def setup(self):
    if self.kind not in ("dot", "general"):
      raise ValueError(f"LuongAttention.kind={self.kind!r}: must be 'dot' or 'general'")
    if self.kind == "general":
      if self.query_dim <= 0:
        raise ValueError(f"LuongAttention.query_dim={self.query_dim}: 'general' needs the "
                         "query width (a positive integer)")
      self.key = nn.Dense(self.query_dim, use_bias=False, dtype=self.dtype, name="key")

  def project_keys(self, memory_BSD: Array) -> Array:
    """``W_a h`` for "general"; the encoder states themselves for "dot"."""
    if self.kind == "general":
      return self.key(memory_BSD)
    return memory_BSD.astype(self.dtype)

  def attend(self, query_BTQ: Array, keys_BSQ: Array, values_BSD: Array,
             mask: Array | None = None) -> tuple[Array, Array]:
    """Attends with already projected keys; returns ``(context_BTD, alignment_BTS)``."""
    if query_BTQ.shape[-1] != keys_BSQ.shape[-1]:
      raise ValueError(f"Luong '{self.kind}' attention: query width {query_BTQ.shape[-1]} "
                       f"differs from key width {keys_BSQ.shape[-1]}; use 'general' or "
                       "project the encoder states to the query width")
    scores_BTS = luong_scores(query_BTQ.astype(self.dtype), keys_BSQ.astype(self.dtype))
    alignment_BTS = masked_alignment(scores_BTS, mask)
    return attention_context(alignment_BTS, values_BSD.astype(self.dtype)), alignment_BTS

  def __call__(self, query_BTQ: Array, memory_BSD: Array,
               mask: Array | None = None) -> tuple[Array, Array]:
    """Returns ``(context_BTD, alignment_BTS)``; alignment is float32."""
    return self.attend(query_BTQ, self.project_keys(memory_BSD), memory_BSD, mask)
