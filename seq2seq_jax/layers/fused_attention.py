"""Fused attention behind ``attention_impl``: splash attention on TPUs, cuDNN's on NVIDIA GPUs.

A fused kernel never writes the ``[B, H, T, S]`` scores: it streams blocks of keys
through a running softmax (flash attention) and recomputes them in the backward
pass. Nor does it take a dense mask: the models describe theirs as an
``AttentionMask`` (key padding, segment ids of packed rows, causality), and each
kernel gets it in a form that stores nothing ``T x S`` (cuDNN's packed rows
excepted, below), so a layer keeps ``O(T)`` per row for the gradient instead of
``O(T * S)``.

The choices of ``attention_impl`` (``IMPLEMENTATIONS``):

* ``"einsum"``: the library's einsums (``layers.attention.dot_product_attention``).
* ``"xla"``: ``jax.nn.dot_product_attention`` with XLA's implementation, called
  as for cuDNN wherever its public arguments can say the same thing (key lengths,
  causality), so the tests check cuDNN's arguments through it on the CPU; packed
  rows reach it as a dense boolean mask (XLA's attention writes the scores anyway).
* ``"cudnn"``: cuDNN's flash attention (bf16 or fp16, head width a multiple of 8
  up to 128, even lengths, a GPU of compute capability 8.0 or later). Padding
  reaches it as each row's key length (``key_value_seq_lengths``: padding is at the
  end of a row, as in every batch of the library) and causality as its own causal
  mask, so neither stores ``T x S``. Packed rows reach it as an additive
  ``[B, 1, T, S]`` bias, which costs ``T x S`` per row and its gradient
  (``PACKED_CUDNN`` says why; the log says so once). Refused by name in a program
  traced for another platform.
* ``"splash"``: splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``),
  one row at a time, with segment ids for padding and packed rows and a static
  causal or full block mask; both lengths must be multiples of 128. Under a mesh
  it runs per shard (``jax.shard_map``: rows and heads where the active sharding
  rules put them). Traced for any platform but a TPU it runs in Pallas interpret
  mode: slow and exact, the tests' way to check it on the CPU.
* ``"auto"``: splash in a program traced for a TPU, cuDNN for an NVIDIA GPU of
  compute capability 8.0 or later, the einsums elsewhere; a kernel's refusal
  (below) is then a fallback.

The platform is the one the program is traced for: the devices of the active
mesh (``layers.partitioning.activation_sharding``; ``seq2seq_jax.aot`` traces
under its target's mesh), else ``jax.default_backend()``.

A query with no key it may attend (a row of padding only) gets the einsums'
answer from every kernel, forward and backward: the mean of the values, and no
gradient to the queries or keys. What no kernel takes, and what happens then:
attention dropout, a score bias (T5's relative position bias; "xla" takes it, in
float32 as the einsums add it), asked-for weights, lengths a kernel does not
tile, a dtype it does not take. Each such call falls back to the einsums and the
log says so once per reason (logger ``seq2seq_jax``); the result is always the
einsums' function, never another one. A decoding step (one query against the
``KVCache``) always runs the library's blocked cache read, whatever the choice.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import TYPE_CHECKING, Any, Literal, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from seq2seq_jax.configs import ATTENTION_IMPLS as IMPLEMENTATIONS
from seq2seq_jax.layers import partitioning
from seq2seq_jax.types import Array

if TYPE_CHECKING:
  from seq2seq_jax.layers.attention import AttentionMask


# Splash tiles both lengths into blocks of at least this many positions (its lanes).
SPLASH_MIN_BLOCK = 128
# The block sizes tried, largest first: a length takes the largest that divides it.
_SPLASH_BLOCKS = (512, 256, 128)
# cuDNN's flash attention: head widths it takes on every GPU it runs on (Hopper: 256).
CUDNN_MAX_HEAD_DIM = 128
# cuDNN's flash attention runs from Ampere (sm80) on.
CUDNN_MIN_CAPABILITY = (8, 0)
# Why packed rows reach cuDNN as a bias. Measured by the compiler for a compile-only H100
# (one bf16 causal attention and its gradient, 104 rows of 256, 8 heads of 64): key lengths
# 53 MiB of temporaries, the [B, 1, T, S] bias 79 MiB, and jax's packed layout (private,
# ``jax._src.cudnn``: segment lengths and offsets) 260 MiB, since it keeps softmax
# statistics of B x M x H x T floats for M segment slots a row, and M must bound every row
# a packer can fill (min(T, S)). With 32 slots it would match the bias; no bound is known.
PACKED_CUDNN = ("attention_impl 'cudnn': packed rows reach cuDNN as a [B, 1, T, S] bias "
                "(jax's public call takes no segment ids, and its packed layout stores more "
                "for rows that may hold any number of pairs): T x S per row and its "
                "gradient are stored")

logger = logging.getLogger("seq2seq_jax")
_LOGGED: set[str] = set()


def say_once(reason: str) -> None:
  """Logs ``reason`` (a fallback or a mode) the first time it is given in this process."""
  if reason not in _LOGGED:
    _LOGGED.add(reason)
    logger.warning("%s", reason)


def _traced_device() -> Any:
  mesh = partitioning.active_mesh()
  return mesh.devices.flat[0] if mesh is not None else jax.devices()[0]


def traced_platform() -> str:
  """The platform a model is being traced for: the active mesh's devices', else the default.

  ``"tpu"``, ``"gpu"`` (NVIDIA's and AMD's alike) or ``"cpu"``.
  """
  return _traced_device().platform


def compute_capability(device: Any) -> tuple[int, int] | None:
  """An NVIDIA GPU's compute capability as ``(major, minor)``; None for any other device.

  Example:
    >>> import types
    >>> compute_capability(types.SimpleNamespace(platform="gpu", compute_capability="9.0"))
    (9, 0)
    >>> compute_capability(jax.devices("cpu")[0]) is None
    True
  """
  if getattr(device, "platform", None) != "gpu":
    return None
  text = str(getattr(device, "compute_capability", ""))
  try:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)
  except ValueError:  # AMD's GPUs name an architecture ("gfx90a"), not a capability
    return None


def resolve(implementation: str) -> str:
  """``"auto"`` made concrete for the traced platform; any other choice as it is.

  On a GPU, cuDNN only where its flash attention runs: an NVIDIA GPU of compute
  capability ``CUDNN_MIN_CAPABILITY`` (Ampere, 8.0) or later; the einsums on others.
  """
  if implementation != "auto":
    return implementation
  device = _traced_device()
  if device.platform == "tpu":
    return "splash"
  capability = compute_capability(device)
  if capability is not None and capability >= CUDNN_MIN_CAPABILITY:
    return "cudnn"
  return "einsum"


def refusal(implementation: str, q_BTHK: Array, k_BSHK: Array, *, bias: Array | None,
            use_dropout: bool, return_weights: bool) -> str | None:
  """Why the fused ``implementation`` cannot take this call (None: it can).

  ``implementation`` is ``"xla"``, ``"cudnn"`` or ``"splash"`` (already resolved).
  """
  if return_weights:
    return "the attention weights are asked for (return_attention)"
  if use_dropout:
    return "attention dropout is on (attention_dropout_rate > 0, not deterministic)"
  if implementation == "xla":
    return None
  if bias is not None:
    return ("a score bias (T5's relative position bias) is added; "
            f"{implementation} would need it as a dense [B, H, T, S] array")
  queries, keys, width = q_BTHK.shape[1], k_BSHK.shape[1], q_BTHK.shape[3]
  if implementation == "splash":
    if queries % SPLASH_MIN_BLOCK or keys % SPLASH_MIN_BLOCK:
      return (f"lengths T={queries}, S={keys} are not multiples of splash's block of "
              f"{SPLASH_MIN_BLOCK}")
    return None
  capability = compute_capability(_traced_device())
  if capability is not None and capability < CUDNN_MIN_CAPABILITY:
    return (f"cuDNN's flash attention needs compute capability "
            f"{'.'.join(map(str, CUDNN_MIN_CAPABILITY))} or later, not "
            f"{'.'.join(map(str, capability))}")
  if q_BTHK.dtype not in (jnp.bfloat16, jnp.float16):
    return f"cuDNN's flash attention takes bfloat16 or float16, not {q_BTHK.dtype}"
  if width % 8 or width > CUDNN_MAX_HEAD_DIM:
    return f"cuDNN takes head widths that are multiples of 8 up to {CUDNN_MAX_HEAD_DIM}, not {width}"
  if queries % 2 or keys % 2:
    return f"cuDNN's flash attention with a mask needs even lengths, not T={queries}, S={keys}"
  return None


def jax_attention(q_BTHK: Array, k_BSHK: Array, v_BSHK: Array, mask: AttentionMask | None, *,
                  scale: float, implementation: Literal["xla", "cudnn"],
                  bias: Array | None = None) -> Array:
  """``jax.nn.dot_product_attention`` with ``mask``: the call "xla" and "cudnn" share.

  Causality goes in as ``is_causal`` (cuDNN then skips the blocks above the
  diagonal) and key padding as each row's key length, so neither stores a
  ``[T, S]`` mask. Packed rows go in as a boolean ``[B, 1, T, S]`` mask, which cuDNN
  adds as a bias (``PACKED_CUDNN`` says why, and the log says so once). ``bias`` (a
  relative position bias, "xla" only) is added in float32, as the einsums add it.
  """
  causal = mask is not None and mask.causal
  lengths_B = dense = None
  if mask is not None and mask.packed:
    if implementation == "cudnn":
      say_once(PACKED_CUDNN)
    segments = mask.dense(batch=q_BTHK.shape[0], queries=q_BTHK.shape[1], causal=False)
    assert segments is not None  # packed rows always give a mask
    dense = jnp.broadcast_to(segments, (segments.shape[0], 1, q_BTHK.shape[1],
                                        k_BSHK.shape[1]))
  elif mask is not None and mask.key_valid is not None:
    # A row with no valid key still reads key 0, so that no kernel divides by an empty
    # sum; its output is replaced by the einsums' (``fused_attention``).
    lengths_B = jnp.maximum(jnp.sum(mask.key_valid, axis=1, dtype=jnp.int32), 1)
  return jax.nn.dot_product_attention(
      q_BTHK, k_BSHK, v_BSHK, mask=dense, is_causal=causal, scale=scale,
      key_value_seq_lengths=lengths_B, implementation=implementation,
      bias=None if bias is None else bias.astype(jnp.float32))


def rows_without_keys(mask: AttentionMask | None, *, batch: int, queries: int) -> Array | None:
  """bool ``[B, T]``: the queries ``mask`` lets attend no key; None where there can be none.

  A compare-and-reduce that XLA fuses: nothing ``T x S`` is stored, and no gradient.
  """
  if mask is None or (mask.key_valid is None and not mask.packed):
    return None  # no mask, or causality alone: query t always has key 0
  allowed = mask.dense(batch=batch, queries=queries)
  assert allowed is not None
  empty_B1T = jnp.logical_not(jnp.any(allowed, axis=-1))
  return jnp.broadcast_to(empty_B1T[:, 0], (batch, queries))


def _einsums_on_empty_rows(out_BTHK: Array, v_BSHK: Array, empty_BT: Array | None) -> Array:
  """``out_BTHK`` with the einsums' answer on rows that attend no key: uniform weights over
  every key (the mean of the values), no gradient to the queries and keys. The kernels'
  own answer there differs in the backward pass (splash: S x the values' gradient and
  ~1e11 for the queries'), and their cotangent is zero there after this."""
  if empty_BT is None:
    return out_BTHK
  mean_B1HK = jnp.mean(v_BSHK.astype(jnp.float32), axis=1, keepdims=True).astype(out_BTHK.dtype)
  return jnp.where(empty_BT[:, :, None, None], mean_B1HK, out_BTHK)


def _block(length: int) -> int:
  return next(block for block in _SPLASH_BLOCKS if length % block == 0)


@functools.lru_cache(maxsize=64)
def _splash_kernel_parts(heads: int, queries: int, keys: int, causal: bool, interpret: bool):
  """A splash kernel for one row's ``[H, T, K]`` queries against ``[H, S, K]`` keys, taken
  apart: its pytree structure (static) and its mask-info leaves as NumPy arrays.

  Only these static parts are cached. ``make_splash_mha`` turns its mask info into
  jax arrays; built inside a trace, those are that trace's tracers, and a kernel
  cached with them would hand dead tracers to the next trace of the same shapes (a
  validation step after a training step: ``UnexpectedTracerError``), or, when only
  lowered, make them inputs of the program. So the kernel is built once outside any
  trace (``jax.ensure_compile_time_eval``) and each call puts it together again from
  the NumPy leaves, which become constants of the program being traced.
  """
  # Imported here: Pallas' TPU ops are needed only by this choice.
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=import-outside-toplevel
  shape = (queries, keys)
  head_mask = splash.CausalMask(shape) if causal else splash.FullMask(shape)
  block_q, block_kv = _block(queries), _block(keys)
  sizes = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                            block_q_dkv=block_q, block_kv_dkv=block_kv,
                            block_kv_dkv_compute=block_kv, block_q_dq=block_q,
                            block_kv_dq=block_kv)
  with jax.ensure_compile_time_eval():
    kernel = splash.make_splash_mha(splash.MultiHeadMask([head_mask] * heads),
                                    block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                    interpret=interpret)
  leaves, treedef = jax.tree.flatten(kernel)
  return treedef, tuple(np.asarray(leaf) for leaf in leaves)


def _splash_kernel(heads: int, queries: int, keys: int, causal: bool, interpret: bool):
  """The splash kernel for these shapes, its mask info as constants of the current trace."""
  treedef, leaves = _splash_kernel_parts(heads, queries, keys, causal, interpret)
  return jax.tree.unflatten(treedef, [jnp.asarray(leaf) for leaf in leaves])


def splash_attention(q_BTHK: Array, k_BSHK: Array, v_BSHK: Array, mask: AttentionMask | None, *,
                     scale: float, interpret: bool | None = None) -> Array:
  """Splash attention of ``[B, T, H, K]`` queries over ``[B, S, H, K]`` keys and values.

  Padding and packing become splash's segment ids: a key of segment 0 is padding,
  and without packing every query is segment 1, every valid key segment 1, so a
  query attends exactly the keys ``mask`` allows. ``interpret``: run the kernel in
  Pallas interpret mode; None: unless the program is traced for a TPU.
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=import-outside-toplevel
  if interpret is None:
    interpret = traced_platform() != "tpu"
    if interpret:
      say_once(f"attention_impl 'splash' traced for {traced_platform()}: the Pallas kernel runs "
               "in interpret mode (exact and slow; for tests)")
  causal = mask is not None and mask.causal
  batch, queries, _, _ = q_BTHK.shape
  keys = k_BSHK.shape[1]
  q_segments_BT = k_segments_BS = None
  if mask is not None and mask.query_segment_ids is not None and (
      mask.key_segment_ids is not None):  # packed
    q_segments_BT = mask.query_segment_ids.astype(jnp.int32)
    k_segments_BS = mask.key_segment_ids.astype(jnp.int32)
    if mask.key_valid is not None:
      k_segments_BS = jnp.where(mask.key_valid, k_segments_BS, 0)
  elif mask is not None and mask.key_valid is not None:
    q_segments_BT = jnp.ones((batch, queries), jnp.int32)
    k_segments_BS = mask.key_valid.astype(jnp.int32)
  q_BTHK = q_BTHK * jnp.asarray(scale, q_BTHK.dtype)
  with_segments = q_segments_BT is not None

  def rows(q_BTHK, k_BSHK, v_BSHK, *segments):
    kernel = _splash_kernel(q_BTHK.shape[2], queries, keys, causal, interpret)
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, H, T, K]: the kernel's layout

    def row(q_HTK, k_HSK, v_HSK, *row_segments):
      ids = splash.SegmentIds(*row_segments) if row_segments else None
      return kernel(q_HTK, k_HSK, v_HSK, segment_ids=ids)

    out_BHTK = jax.vmap(row)(heads_first(q_BTHK), heads_first(k_BSHK), heads_first(v_BSHK),
                             *segments)
    return heads_first(out_BHTK)

  segments = (q_segments_BT, k_segments_BS) if with_segments else ()
  mesh = partitioning.active_mesh()
  if mesh is None or math.prod(mesh.shape.values()) == 1:
    return rows(q_BTHK, k_BSHK, v_BSHK, *segments)
  # A Pallas kernel is one custom call the SPMD partitioner cannot split: run it
  # per shard, rows on "data" and heads on "model" where they divide evenly.
  rules = partitioning.active_rules()
  names = (partitioning.BATCH, partitioning.LENGTH, partitioning.HEADS, partitioning.KV)
  spec = lambda x: partitioning.spec_for(x.shape, names, mesh, rules)
  q_spec, kv_spec = spec(q_BTHK), spec(k_BSHK)
  row_spec = P(*(q_spec[:1] if len(q_spec) else ()))
  segment_specs = (row_spec, row_spec) if with_segments else ()
  return jax.shard_map(rows, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, *segment_specs),
                       out_specs=q_spec, check_vma=False)(q_BTHK, k_BSHK, v_BSHK, *segments)


def fused_attention(q_BTHK: Array, k_BSHK: Array, v_BSHK: Array, mask: AttentionMask | None, *,
                    implementation: str, scale: float,
                    bias: Array | None = None) -> Array:
  """Attention through the resolved fused ``implementation`` ("xla", "cudnn" or "splash").

  Rows that attend no key get the einsums' answer (``rows_without_keys``).
  """
  empty_BT = rows_without_keys(mask, batch=q_BTHK.shape[0], queries=q_BTHK.shape[1])
  if implementation == "splash":
    out_BTHK = splash_attention(q_BTHK, k_BSHK, v_BSHK, mask, scale=scale)
    return _einsums_on_empty_rows(out_BTHK, v_BSHK, empty_BT)
  if implementation == "cudnn" and traced_platform() != "gpu":
    raise ValueError(f"attention_impl='cudnn' needs an NVIDIA GPU, but the program is traced "
                     f"for {traced_platform()}: use 'auto' (cuDNN on GPUs, the einsums "
                     "elsewhere), 'einsum' or 'xla'")
  jax_choice = cast(Literal["xla", "cudnn"], implementation)
  out_BTHK = jax_attention(q_BTHK, k_BSHK, v_BSHK, mask, scale=scale, implementation=jax_choice,
                           bias=bias)
  return _einsums_on_empty_rows(out_BTHK, v_BSHK, empty_BT)
