"""Fused attention behind ``attention_impl``: splash attention on TPUs, cuDNN's on NVIDIA GPUs.

A fused kernel never writes the ``[B, H, T, S]`` scores: it streams blocks of keys
through a running softmax (flash attention) and recomputes them in the backward
pass, so a layer keeps ``O(T)`` per row for the gradient instead of ``O(T * S)``.
It cannot take an arbitrary dense mask, so the models describe theirs as an
``AttentionMask``: key padding, segment ids of packed rows, and causality.

The choices of ``attention_impl`` (``IMPLEMENTATIONS``):

* ``"einsum"``: the library's einsums (``layers.attention.dot_product_attention``).
* ``"xla"``: ``jax.nn.dot_product_attention`` with XLA's implementation, called
  exactly as for cuDNN (the tests check cuDNN's arguments through it on the CPU).
* ``"cudnn"``: the same call with cuDNN's flash attention (bf16 or fp16, head width
  a multiple of 8 up to 128, even lengths). The mask reaches it as an additive
  ``[B, 1, T, S]`` bias (causality as cuDNN's own causal mask), which holds for any
  padding or packing; refused by name in a program traced for another platform.
* ``"splash"``: splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``),
  one row at a time, with segment ids for padding and packed rows and a static
  causal or full block mask; both lengths must be multiples of 128. Under a mesh
  it runs per shard (``jax.shard_map``: rows over ``data``, heads over ``model``).
  Traced for any platform but a TPU it runs in Pallas interpret mode: slow and
  exact, the tests' way to check it on the CPU.
* ``"auto"``: splash in a program traced for a TPU, cuDNN for an NVIDIA GPU, the
  einsums elsewhere; a kernel's refusal (below) is then a fallback.

The platform is the one the program is traced for: the devices of the active
mesh (``layers.partitioning.activation_sharding``; ``seq2seq_jax.aot`` traces
under its target's mesh), else ``jax.default_backend()``.

What no kernel takes, and what happens then: attention dropout, a score bias (T5's
relative position bias), asked-for weights, lengths a kernel does not tile, a
dtype it does not take. Each such call falls back to the einsums and the log
says so once per reason (logger ``seq2seq_jax``); the result is always the
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


def resolve(implementation: str) -> str:
  """``"auto"`` made concrete for the traced platform; any other choice as it is.

  On a GPU, cuDNN only for NVIDIA's (``device_kind`` "NVIDIA ..."); the einsums on others.
  """
  if implementation != "auto":
    return implementation
  device = _traced_device()
  if device.platform == "gpu" and not device.device_kind.upper().startswith("NVIDIA"):
    return "einsum"
  return {"tpu": "splash", "gpu": "cudnn"}.get(device.platform, "einsum")


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
  diagonal); padding and segments as a boolean mask, which cuDNN adds as a bias of
  0 or a large negative number.
  """
  causal = mask is not None and mask.causal
  dense = None if mask is None else mask.dense(batch=q_BTHK.shape[0], queries=q_BTHK.shape[1],
                                                causal=False)
  if dense is not None:
    dense = jnp.broadcast_to(dense, (dense.shape[0], 1, q_BTHK.shape[1], k_BSHK.shape[1]))
  return jax.nn.dot_product_attention(
      q_BTHK, k_BSHK, v_BSHK, mask=dense, is_causal=causal, scale=scale,
      bias=None if bias is None else bias.astype(q_BTHK.dtype), implementation=implementation)


def _block(length: int) -> int:
  return next(block for block in _SPLASH_BLOCKS if length % block == 0)


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads: int, queries: int, keys: int, causal: bool, interpret: bool):
  """A splash kernel for one row's ``[H, T, K]`` queries against ``[H, S, K]`` keys."""
  # Imported here: Pallas' TPU ops are needed only by this choice.
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=import-outside-toplevel
  shape = (queries, keys)
  head_mask = splash.CausalMask(shape) if causal else splash.FullMask(shape)
  block_q, block_kv = _block(queries), _block(keys)
  sizes = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                            block_q_dkv=block_q, block_kv_dkv=block_kv,
                            block_kv_dkv_compute=block_kv, block_q_dq=block_q,
                            block_kv_dq=block_kv)
  return splash.make_splash_mha(splash.MultiHeadMask([head_mask] * heads), block_sizes=sizes,
                                head_shards=1, q_seq_shards=1, interpret=interpret)


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
  rules = dict(partitioning.ACTIVATION_RULES)
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
  """Attention through the resolved fused ``implementation`` ("xla", "cudnn" or "splash")."""
  if implementation == "splash":
    return splash_attention(q_BTHK, k_BSHK, v_BSHK, mask, scale=scale)
  if implementation == "cudnn" and traced_platform() != "gpu":
    raise ValueError(f"attention_impl='cudnn' needs an NVIDIA GPU, but the program is traced "
                     f"for {traced_platform()}: use 'auto' (cuDNN on GPUs, the einsums "
                     "elsewhere), 'einsum' or 'xla'")
  jax_choice = cast(Literal["xla", "cudnn"], implementation)
  return jax_attention(q_BTHK, k_BSHK, v_BSHK, mask, scale=scale, implementation=jax_choice,
                       bias=bias)
