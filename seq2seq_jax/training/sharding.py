"""Where arrays live on a ``("data", "model")`` device mesh: FSDP, tensor parallelism, multi-host.

One ``jit``-compiled step serves one CPU, a multi-GPU host and a TPU pod slice;
only the shardings differ. Batches split their rows over ``data``. Parameters
(and the optimizer state, which mirrors them) get *logical* axis names from one
table, ``PARAMETER_AXES``, keyed by the parameter's path and rank; the rules of
``logical_axis_rules`` map those names onto mesh axes:

============ ============================ ============== =======================
logical name  meaning                      "replicated"   "fsdp"
============ ============================ ============== =======================
``embed``     model width D                -              ``data``
``heads``     attention heads H            ``model``      ``model``
``mlp``       feed-forward width F         ``model``      ``model``
``fsdp``      largest axis of any other    -              ``data``
              matrix (RNN cells, ...)
``vocab``,    vocabulary, per-head width,  -              -
``kv``, ...   positions, 1-D vectors
============ ============================ ============== =======================

Tensor parallelism (``TrainConfig.model_parallelism > 1``) is Megatron's split
of the Transformer: query/key/value and the feed-forward input layer are split
by columns (heads, F) over ``model``, the attention output and feed-forward
output layers by rows, so each block needs one all-reduce, which XLA's SPMD
partitioner inserts. FSDP (``TrainConfig.parameter_sharding="fsdp"``) also
splits each matrix's ``embed`` axis over ``data``: parameters and Adam moments
take 1/N of the memory per device and are all-gathered where used. An axis that
the mesh axis does not divide stays whole (e.g. a vocabulary of 500 on 8 devices).

The table works on paths, not on annotations inside the models, so the models
stay plain Linen modules and a checkpoint restores onto any mesh.

Multi-host: ``maybe_initialize_distributed`` joins the processes of a cluster
(before anything touches devices); each host then feeds its own rows of every
global batch (``jax.make_array_from_process_local_data``), ``process_local_rows``
returns a host its rows of a result, and ``sync_processes`` is a barrier that
does not use device collectives.

Example:
  >>> import jax
  >>> from seq2seq_jax import TrainConfig, Transformer, TransformerConfig
  >>> from seq2seq_jax.training import make_optimizer, rsqrt_schedule
  >>> from seq2seq_jax.training.step import create_train_state
  >>> maybe_initialize_distributed()  # a no-op on one host
  False
  >>> mesh = make_mesh(model_parallelism=2)  # 8 devices: 4-way data x 2-way tensor parallel
  >>> dict(mesh.shape)
  {'data': 4, 'model': 2}
  >>> model = Transformer(TransformerConfig(vocab_size=64, model_dim=16, num_heads=2, mlp_dim=32))
  >>> optimizer = make_optimizer(TrainConfig(), rsqrt_schedule(1e-3, 100))
  >>> state = create_train_state(model, optimizer, rng=jax.random.key(0), mesh=mesh,
  ...                            state_sharding_fn=state_sharding_fn("fsdp"))
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)
PARAMETER_SHARDINGS = ("replicated", "fsdp")

# Logical axis names of parameter dimensions.
EMBED = "embed"  # model width D
HEADS = "heads"  # attention heads H
KV = "kv"  # per-head width K
MLP = "mlp"  # feed-forward hidden width F
VOCAB = "vocab"  # vocabulary V
POSITION = "position"  # learned position table rows
FSDP = "fsdp"  # the largest axis of a matrix the table does not name (RNN cells, ...)

# (path suffix, rank) -> logical axes. The first entry whose suffix ends the
# parameter's path and whose rank matches wins; the optimizer state's moments
# have the parameter's path as their suffix, so they follow their parameter.
# 1-D vectors of width D (biases after a row split, LayerNorm) stay replicated:
# they are tiny, and a row-split layer adds its bias after the all-reduce.
PARAMETER_AXES: tuple[tuple[tuple[str, ...], int, tuple[str | None, ...]], ...] = (
    (("embedding",), 2, (VOCAB, EMBED)),
    (("position_embedding",), 2, (POSITION, EMBED)),
    (("query", "kernel"), 3, (EMBED, HEADS, KV)),
    (("key", "kernel"), 3, (EMBED, HEADS, KV)),
    (("value", "kernel"), 3, (EMBED, HEADS, KV)),
    (("query", "bias"), 2, (HEADS, KV)),
    (("key", "bias"), 2, (HEADS, KV)),
    (("value", "bias"), 2, (HEADS, KV)),
    (("out", "kernel"), 3, (HEADS, KV, EMBED)),
    (("wi", "kernel"), 2, (EMBED, MLP)),
    (("wi", "bias"), 1, (MLP,)),
    (("wi_0", "kernel"), 2, (EMBED, MLP)),  # gated feed-forward layers (T5 v1.1, mT5)
    (("wi_1", "kernel"), 2, (EMBED, MLP)),
    (("relative_attention_bias",), 2, (None, HEADS)),  # T5's [buckets, H]
    (("wo", "kernel"), 2, (MLP, EMBED)),
    (("output_projection", "kernel"), 2, (EMBED, VOCAB)),
    (("output_projection", "bias"), 1, (VOCAB,)),
)


def make_mesh(model_parallelism: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ``("data", "model")`` mesh over ``devices`` (default: every device of every host).

  Both axes are ``AxisType.Auto``: jax 0.10's ``jax.make_mesh`` defaults to
  explicit axes, under which a batch sharded ``P("data")`` fails in ``nn.Embed``.
  Without ``devices``, ``jax.make_mesh`` orders the devices by the hardware's
  topology (TPU torus, NVLink islands); each host's devices form a contiguous
  block of the ``data`` axis, which is what per-host data loading expects.

  Args:
    model_parallelism: size of the ``model`` axis; must divide the device count.
    devices: e.g. ``jax.devices()[:1]`` for a one-device mesh.
  """
  count = len(jax.devices()) if devices is None else len(devices)
  if model_parallelism < 1 or count % model_parallelism:
    raise ValueError(f"TrainConfig.model_parallelism={model_parallelism} must be >= 1 and divide "
                     f"the device count {count}; choose a divisor of {count}")
  shape = (count // model_parallelism, model_parallelism)
  axis_types = (jax.sharding.AxisType.Auto,) * 2
  if devices is None:
    return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types)
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=axis_types)


def logical_axis_rules(parameter_sharding: str = "replicated"
                       ) -> tuple[tuple[str, str | None], ...]:
  """Flax-style rules ``(logical name, mesh axis or None)`` for ``nn.logical_to_mesh_axes``."""
  if parameter_sharding not in PARAMETER_SHARDINGS:
    raise ValueError(f"TrainConfig.parameter_sharding={parameter_sharding!r}: must be one of "
                     f"{', '.join(PARAMETER_SHARDINGS)}")
  fsdp = DATA_AXIS if parameter_sharding == "fsdp" else None
  return ((EMBED, fsdp), (FSDP, fsdp), (HEADS, MODEL_AXIS), (MLP, MODEL_AXIS), (KV, None),
          (VOCAB, None), (POSITION, None))


def _key_name(key: Any) -> str:
  return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))


def logical_axes(path: Sequence[Any], shape: Sequence[int]) -> tuple[str | None, ...]:
  """The logical axis names of an array at ``path`` (pytree keys or strings) with ``shape``.

  Looks the path up in ``PARAMETER_AXES``; any other array of rank >= 2 names its
  largest axis ``fsdp`` (so FSDP reaches every model, RNNs included); scalars
  and other vectors get no names (replicated).
  """
  names = tuple(_key_name(key) for key in path)
  for suffix, rank, axes in PARAMETER_AXES:
    if len(shape) == rank and names[-len(suffix):] == suffix:
      return axes
  axes: list[str | None] = [None] * len(shape)
  if len(shape) >= 2:
    axes[int(np.argmax(shape))] = FSDP
  return tuple(axes)


def partition_spec(path: Sequence[Any], shape: Sequence[int], mesh: Mesh,
                   rules: Sequence[tuple[str, str | None]]) -> P:
  """The ``PartitionSpec`` of one array: its logical axes through ``rules``.

  A dimension that its mesh axes do not divide evenly stays whole.
  """
  spec = nn.logical_to_mesh_axes(logical_axes(path, shape), rules)
  entries = []
  for size, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    axes = (axis,) if isinstance(axis, str) else tuple(axis or ())
    ways = math.prod(mesh.shape[a] for a in axes)
    entries.append(axis if axes and size % ways == 0 and ways > 1 else None)
  return P(*entries)


def tree_shardings(tree: Any, mesh: Mesh, parameter_sharding: str = "replicated") -> Any:
  """``NamedSharding``s for every array leaf of ``tree`` (parameters, optimizer state, ...)."""
  rules = logical_axis_rules(parameter_sharding)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: NamedSharding(mesh, partition_spec(path, leaf.shape, mesh, rules)), tree)


def state_sharding_fn(parameter_sharding: str = "replicated") -> Callable[[Any, Mesh], Any]:
  """A ``StateShardingFn`` (``(abstract_state, mesh) -> shardings``) for ``create_train_state``.

  ``"replicated"``: parameters whole on every ``data`` row (split over ``model``
  by tensor parallelism, a no-op when its size is 1); ``"fsdp"``: also split
  along ``data``, optimizer state alike.
  """
  logical_axis_rules(parameter_sharding)  # validates the name

  def shardings(abstract_state: Any, mesh: Mesh) -> Any:
    return tree_shardings(abstract_state, mesh, parameter_sharding)
  return shardings


def gather_for_compute(params: Any, mesh: Mesh | None) -> Any:
  """``params`` constrained to the layout the model computes with: whole along ``data``.

  A no-op for replicated parameters. Under FSDP it is the all-gather that FSDP
  means, written out: each parameter is gathered over ``data`` (tensor
  parallelism's ``model`` split stays), and under ``jax.grad`` its transpose
  reduce-scatters the gradient back to the parameter's shard. Left to itself the
  TPU compiler chose differently: for the weights of a matmul whose batch is split
  over the same mesh axis as the weights' contracting dimension it built windowed
  einsums, which tripled the temporaries of a forward pass (2+2 layers, d 512,
  v5e:2x4: 2.9 GB against 1.0 GB replicated) and hid half the FLOPs in loops; with
  the gather written out the TPU compiler schedules one all-gather a weight where
  it is used, and a train step needs the temporaries of a replicated one.
  """
  if mesh is None or math.prod(mesh.shape.values()) == 1:
    return params
  return jax.tree.map(jax.lax.with_sharding_constraint, params,
                      tree_shardings(params, mesh, "replicated"))


def check_model_parallelism(model_config: Any, model_parallelism: int) -> None:
  """Raises ``ValueError`` unless ``model_config`` can be split ``model_parallelism`` ways."""
  if model_parallelism == 1:
    return
  from seq2seq_jax.configs import T5Config, TransformerConfig
  if not isinstance(model_config, (TransformerConfig, T5Config)):
    raise ValueError(f"TrainConfig.model_parallelism={model_parallelism}: tensor parallelism "
                     f"splits the Transformer's heads and MLP; a {type(model_config).__name__} "
                     "has neither. Set train.model_parallelism=1 (use "
                     "train.parameter_sharding=fsdp to spread its memory)")
  name = type(model_config).__name__
  for side in ("encoder", "decoder"):
    stack = getattr(model_config, f"{side}_stack")
    for field, value in (("num_heads", stack.num_heads), ("mlp_dim", stack.mlp_dim)):
      if value % model_parallelism:
        # The decoder can only fail where it has its own value (decoder_num_heads ...).
        shown = field if side == "encoder" else f"decoder_{field}"
        raise ValueError(f"{name}.{shown}={value} is not divisible by "
                         f"TrainConfig.model_parallelism={model_parallelism}; choose a "
                         "model_parallelism that divides the heads and MLP widths of both "
                         "the encoder and the decoder")


def per_device_bytes(array: jax.Array) -> int:
  """Bytes one device holds of ``array`` (its largest addressable shard)."""
  return max(shard.data.nbytes for shard in array.addressable_shards)


def process_local_rows(array: jax.Array) -> np.ndarray:
  """This host's rows of a batch-sharded array, in global row order (all rows on one host).

  The inverse of ``jax.make_array_from_process_local_data`` along axis 0: what a
  host fed in, it gets back (for per-host decoding results).
  """
  if array.is_fully_addressable:
    return np.asarray(jax.device_get(array))
  pieces: dict[int, np.ndarray] = {}
  for shard in array.addressable_shards:
    start = (shard.index[0].start or 0) if shard.index else 0
    pieces.setdefault(start, np.asarray(shard.data))
  return np.concatenate([pieces[start] for start in sorted(pieces)], axis=0)


_barrier_count = 0


def sync_processes(name: str, timeout_s: float = 1800.0) -> None:
  """Waits until every process has reached this point (a no-op in a one-process run).

  A barrier of the distributed runtime's key-value service, not a device
  collective: CPU collectives (gloo) give up after 30 s, too little for a host
  that is still compiling a step or training the tokenizer while the others wait.
  Every process must make the same calls in the same order.
  """
  global _barrier_count
  if jax.process_count() == 1:
    return
  from jax._src import distributed  # the client behind jax.distributed.initialize
  _barrier_count += 1
  distributed.global_state.client.wait_at_barrier(f"seq2seq_jax:{_barrier_count}:{name}",
                                                  timeout_in_ms=int(timeout_s * 1000))


_broadcast_count = 0


def broadcast_json(name: str, value: Any = None, timeout_s: float = 1800.0) -> Any:
  """Process 0's ``value`` (JSON-serialisable), returned on every process.

  Through the distributed runtime's key-value service, like ``sync_processes``:
  for host-side decisions (where a resumed run starts, an error to raise on
  every host) without a device collective. Every process must make the same calls
  in the same order; the others' ``value`` is ignored. One process: ``value``.
  """
  global _broadcast_count
  if jax.process_count() == 1:
    return value
  from jax._src import distributed  # the client behind jax.distributed.initialize
  _broadcast_count += 1
  key = f"seq2seq_jax:broadcast:{_broadcast_count}:{name}"
  client = distributed.global_state.client
  if jax.process_index() == 0:
    client.key_value_set(key, json.dumps(value))
    return value
  return json.loads(client.blocking_key_value_get(key, int(timeout_s * 1000)))


# Environment variables that describe a multi-process run. JAX_COORDINATOR_ADDRESS
# (with JAX_NUM_PROCESSES and JAX_PROCESS_ID, or a cluster manager that supplies
# them) is jax's own; SEQ2SEQ_JAX_DISTRIBUTED=1 asks for jax's auto-detection
# (Cloud TPU pod slices, Slurm, Open MPI) where nothing else says so.
_FORCE_VARIABLE = "SEQ2SEQ_JAX_DISTRIBUTED"


def _describes_cluster(environ: dict[str, str]) -> bool:
  if environ.get(_FORCE_VARIABLE, "").lower() in ("1", "true", "yes"):
    return True
  if environ.get("JAX_COORDINATOR_ADDRESS"):
    return True
  # Multi-host TPU slices (GKE, queued resources) list their workers.
  for name in ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES"):
    if len([h for h in environ.get(name, "").split(",") if h.strip()]) > 1:
      return True
  if "SLURM_JOB_ID" in environ and int(environ.get("SLURM_NTASKS", "1") or 1) > 1:
    return True
  return "OMPI_MCA_orte_hnp_uri" in environ


def maybe_initialize_distributed(environ: dict[str, str] | None = None) -> bool:
  """Calls ``jax.distributed.initialize()`` when the environment describes a cluster.

  Call it before anything touches devices (``jax.devices()``, creating arrays).
  Recognised: ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0) with
  ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``; a multi-host TPU slice
  (``TPU_WORKER_HOSTNAMES``); Slurm with more than one task; Open MPI; or
  ``SEQ2SEQ_JAX_DISTRIBUTED=1``, which leaves everything to jax's auto-detection
  (e.g. a Cloud TPU VM pod slice). Processes on CPUs also need
  ``JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo`` for cross-process collectives.

  Args:
    environ: the environment to read (default ``os.environ``).

  Returns:
    Whether this call initialised the distributed runtime (False on one host, or
    when it already was).
  """
  environ = dict(os.environ if environ is None else environ)
  if jax.distributed.is_initialized() or not _describes_cluster(environ):
    return False
  kwargs: dict[str, Any] = {}
  for field, variable in (("num_processes", "JAX_NUM_PROCESSES"),
                          ("process_id", "JAX_PROCESS_ID")):
    if environ.get(variable):
      try:
        kwargs[field] = int(environ[variable])
      except ValueError:
        raise ValueError(f"{variable}={environ[variable]!r} must be an integer") from None
  if kwargs.get("num_processes") == 1:
    return False
  if environ.get("JAX_COORDINATOR_ADDRESS"):
    kwargs["coordinator_address"] = environ["JAX_COORDINATOR_ADDRESS"]
  jax.distributed.initialize(**kwargs)
  return True
