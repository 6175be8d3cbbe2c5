"""Pure training and evaluation steps, jitted once per batch shape over a device mesh.

``train_step(state, batch, rng) -> (state, metrics)`` is a pure function of
arrays; ``make_train_step`` jits it with the state donated and every array
placed by a ``NamedSharding`` on a ``("data", "model")`` mesh: batches split
along ``data``, parameters as a ``state_sharding_fn`` says (replicated by
default; ``sharding.state_sharding_fn("fsdp")`` for FSDP and tensor
parallelism). The same program runs on one CPU, many devices or many hosts.

Example:
  >>> from seq2seq_jax import TrainConfig, Transformer, TransformerConfig, make_mesh
  >>> from seq2seq_jax.training import make_optimizer, rsqrt_schedule
  >>> mesh = make_mesh()
  >>> model = Transformer(TransformerConfig(vocab_size=64, model_dim=16, num_heads=2, mlp_dim=32))
  >>> schedule = rsqrt_schedule(1e-3, 100)
  >>> optimizer = make_optimizer(TrainConfig(), schedule)
  >>> state = create_train_state(model, optimizer, rng=jax.random.key(0), mesh=mesh)
  >>> step = make_train_step(model, optimizer, schedule, mesh=mesh, state=state)
  >>> batch = {"inputs": np.full((8, 5), 7, np.int32), "targets": np.full((8, 4), 9, np.int32)}
  >>> state, metrics = step(state, batch, jax.random.key(1))
  >>> int(state.step), sorted(metrics)[:3]
  (1, ['accuracy', 'grad_norm', 'learning_rate'])
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from seq2seq_jax.layers.partitioning import activation_sharding
from seq2seq_jax.models import registry
from seq2seq_jax.training import sharding as sharding_lib
from seq2seq_jax.models.base import PACKING_KEYS, special_ids
from seq2seq_jax.training.losses import cross_entropy_sums
from seq2seq_jax.training.optimizer import make_optimizer
from seq2seq_jax.training.schedules import make_schedule
from seq2seq_jax.types import Array, PRNGKey, PyTree

Batch = Mapping[str, Array]
# (abstract state, mesh) -> a pytree of NamedSharding with the state's structure.
StateShardingFn = Callable[[Any, Mesh], Any]


@flax.struct.dataclass
class TrainState:
  """Everything a training run updates: a pytree of arrays, checkpointed whole.

  Attributes:
    step: int32 scalar, optimizer updates done so far.
    params: the model's ``"params"`` collection (float32).
    opt_state: the optimizer's state.
  """

  step: Array
  params: PyTree
  opt_state: PyTree


def make_mesh(model_parallelism: int = 1, devices=None) -> Mesh:
  """A ``("data", "model")`` mesh with Auto axis types: ``sharding.make_mesh``."""
  return sharding_lib.make_mesh(model_parallelism, devices)


def replicated_state_sharding(abstract_state: Any, mesh: Mesh) -> Any:
  """The default ``StateShardingFn``: every array replicated on every device."""
  return jax.tree.map(lambda _: NamedSharding(mesh, P()), abstract_state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows split over the ``data`` axis, everything else whole."""
  return NamedSharding(mesh, P("data"))


def shard_batch(batch: Batch, mesh: Mesh) -> dict[str, Array]:
  """Places a host batch (numpy arrays with the global rows) on the mesh, rows over ``data``.

  Single-process: each device receives its slice. Multi-process callers pass their
  process-local rows; ``make_array_from_process_local_data`` assembles the global array.
  """
  sharding = batch_sharding(mesh)
  data_size = mesh.shape["data"]
  out = {}
  for key, value in batch.items():
    value = np.asarray(value)
    if value.ndim == 0:
      continue  # scalars (e.g. a bucket id) are host-side information
    # Every host holds the same number of rows, so the global batch has this many.
    rows = value.shape[0] * jax.process_count()
    if rows % data_size:
      raise ValueError(f"batch[{key!r}] has {rows} rows in all, not a multiple of the mesh's "
                       f"data axis ({data_size} devices); set DataConfig.batch_multiple to a "
                       "multiple of the device count")
    out[key] = jax.make_array_from_process_local_data(sharding, value)
  return out


def build_model(model_config: Any, *, compute_dtype: str | None = None) -> nn.Module:
  """The model of ``model_config`` (``models.registry.build_model``), RNN models included.

  Args:
    model_config: a ``TransformerConfig`` or ``RNNConfig``.
    compute_dtype: overrides the config's ``dtype`` (e.g. ``"bfloat16"``); the
      parameters stay float32 either way.
  """
  if compute_dtype is not None and compute_dtype != model_config.dtype:
    model_config = dataclasses.replace(model_config, dtype=compute_dtype)
  return registry.build_model(model_config)


def _dummy_inputs() -> tuple[Array, Array]:
  # Parameter shapes do not depend on batch or length; a tiny batch initialises them.
  return jnp.ones((1, 4), jnp.int32), jnp.ones((1, 3), jnp.int32)


def init_params(model: nn.Module, rng: PRNGKey) -> PyTree:
  """The model's freshly initialised ``"params"`` (float32)."""
  inputs_BS, targets_BT = _dummy_inputs()
  return model.init({"params": rng}, inputs_BS, targets_BT)["params"]


def create_train_state(model: nn.Module, optimizer: optax.GradientTransformation, *,
                       rng: PRNGKey, mesh: Mesh,
                       state_sharding_fn: StateShardingFn = replicated_state_sharding,
                       params: PyTree | None = None) -> TrainState:
  """Initialises parameters and optimizer state directly in their shardings on ``mesh``.

  Args:
    model: a Linen module following the model contract.
    optimizer: e.g. ``make_optimizer(train_config, schedule)``.
    rng: parameter-initialisation key.
    mesh: from ``make_mesh``.
    state_sharding_fn: maps the abstract state to its shardings (default: replicated).
    params: start from these parameters (a converted checkpoint's, to fine-tune)
      instead of random ones; they must have the model's names and shapes.

  Returns:
    A ``TrainState`` at step 0.
  """
  if params is not None:
    expected = jax.eval_shape(lambda: init_params(model, rng))
    if jax.tree.structure(expected) != jax.tree.structure(params) or any(
        jnp.shape(a) != b.shape for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected))):
      raise ValueError("create_train_state(params=...): the parameters do not have the model's "
                       "names and shapes")

  def init(rng, given):
    params = init_params(model, rng) if given is None else jax.tree.map(
        lambda x: jnp.asarray(x, jnp.float32), given)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))

  shardings = state_sharding_fn(jax.eval_shape(init, rng, params), mesh)
  return jax.jit(init, out_shardings=shardings)(rng, params)


def abstract_train_state(model: nn.Module, optimizer: optax.GradientTransformation, *,
                         mesh: Mesh,
                         state_sharding_fn: StateShardingFn = replicated_state_sharding) -> Any:
  """The state's ``jax.ShapeDtypeStruct`` tree with shardings: the target of a restore."""
  def init(rng):
    params = init_params(model, rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))

  abstract = jax.eval_shape(init, jax.random.key(0))
  shardings = state_sharding_fn(abstract, mesh)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, shardings)


def _model_batch(batch: Batch) -> dict[str, Array]:
  """The arrays the model reads: inputs, targets and, for packed rows, the four packing keys."""
  return {key: batch[key] for key in ("inputs", "targets", *PACKING_KEYS) if key in batch}


def _apply(model: nn.Module, params: PyTree, batch: Batch, **kwargs: Any) -> Array:
  """The model's logits on a batch; packed rows pass their segment ids and positions."""
  packing = {key: batch[key] for key in PACKING_KEYS if key in batch}
  return model.apply({"params": params}, batch["inputs"], batch["targets"], **packing, **kwargs)


def _split_microbatches(batch: Batch, num: int, mesh: Mesh | None) -> dict[str, Array]:
  def split(value):
    rows = value.shape[0]
    if rows % num:
      raise ValueError(f"a batch of {rows} rows cannot be split into TrainConfig.grad_accum_steps"
                       f"={num} equal microbatches; make the rows a multiple of it")
    # Microbatch i takes rows i, i + num, ...: with rows split over devices in
    # contiguous blocks, every device then holds its share of every microbatch.
    value = jnp.swapaxes(value.reshape(rows // num, num, *value.shape[1:]), 0, 1)
    if mesh is None:
      return value
    # Each microbatch stays split over the data axis, not one microbatch per device.
    return jax.lax.with_sharding_constraint(value, NamedSharding(mesh, P(None, "data")))
  return {key: split(value) for key, value in batch.items()}


def train_step(state: TrainState, batch: Batch, rng: PRNGKey, *, model: nn.Module,
               optimizer: optax.GradientTransformation, schedule: optax.Schedule,
               label_smoothing: float = 0.0, grad_accum_steps: int = 1,
               mesh: Mesh | None = None) -> tuple[TrainState, dict[str, Array]]:
  """One optimizer update from a batch: pure, to be jitted (see ``make_train_step``).

  The gradient is that of the token-mean loss over the whole batch. With
  ``grad_accum_steps > 1`` the batch's rows are split into that many microbatches,
  scanned one after the other (memory of one microbatch), their token-weighted
  gradient sums added, and divided once by the batch's token count, so the update
  equals the whole batch's. Dropout draws from ``fold_in(rng, state.step)`` (and
  the microbatch index), so a resumed run repeats the same masks.

  Args:
    state: the current ``TrainState``.
    batch: ``{"inputs": int [B, S], "targets": int [B, T]}`` (padded with the model's
      ``pad_id``, 0 for the library's models), and for packed rows (``DataConfig.packing``)
      ``inputs_segment_ids`` / ``inputs_positions`` [B, S] and ``targets_segment_ids`` /
      ``targets_positions`` [B, T], passed on to the model and split into microbatches
      with the rest; other keys ignored. Every non-PAD target token counts once, packed
      or not.
    rng: the run's base dropout key (the same every step).
    model, optimizer, schedule: static; the schedule only reports the learning rate.
    label_smoothing: see ``cross_entropy_sums``.
    grad_accum_steps: microbatches per update; must divide B.
    mesh: keeps the batch's rows, and every microbatch's, split over its ``data``
      axis, activations included (``layers.partitioning``); None: no constraint.

  Returns:
    ``(new_state, metrics)``: float32 scalars ``loss`` (label-smoothed, per token),
    ``nll`` (per token), ``accuracy``, ``tokens``, ``grad_norm`` (before clipping),
    ``learning_rate`` (of this update).
  """
  with activation_sharding(mesh):
    return _train_step(state, batch, rng, model=model, optimizer=optimizer, schedule=schedule,
                       label_smoothing=label_smoothing, grad_accum_steps=grad_accum_steps,
                       mesh=mesh)


def _train_step(state: TrainState, batch: Batch, rng: PRNGKey, *, model: nn.Module,
                optimizer: optax.GradientTransformation, schedule: optax.Schedule,
                label_smoothing: float, grad_accum_steps: int,
                mesh: Mesh | None) -> tuple[TrainState, dict[str, Array]]:
  step_rng = jax.random.fold_in(rng, state.step)
  batch = _model_batch(batch)
  pad_id = special_ids(model).pad_id

  def loss_fn(params, micro, micro_rng):
    # FSDP's all-gather, written out (the gradient's reduce-scatter is its transpose).
    params = sharding_lib.gather_for_compute(params, mesh)
    logits_BTV = _apply(model, params, micro, deterministic=False, rngs={"dropout": micro_rng})
    sums = cross_entropy_sums(logits_BTV, micro["targets"], label_smoothing=label_smoothing,
                              pad_id=pad_id)
    return sums.loss, sums

  grad_fn = jax.grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    grads, sums = grad_fn(state.params, batch, step_rng)
  else:
    micros = _split_microbatches(batch, grad_accum_steps, mesh)

    def accumulate(carry, inputs):
      index, micro = inputs
      grads, sums = grad_fn(state.params, micro, jax.random.fold_in(step_rng, index))
      return jax.tree.map(jnp.add, carry, (grads, sums)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    zero_sums = jax.tree.map(lambda _: jnp.zeros((), jnp.float32), cross_entropy_sums(
        jnp.zeros((1, 1, 2)), jnp.zeros((1, 1), jnp.int32)))
    (grads, sums), _ = jax.lax.scan(accumulate, (zeros, zero_sums),
                                    (jnp.arange(grad_accum_steps), micros))
  tokens = jnp.maximum(sums.tokens, 1.0)
  grads = jax.tree.map(lambda g: g / tokens, grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"loss": sums.loss / tokens, "nll": sums.nll / tokens,
             "accuracy": sums.correct / tokens, "tokens": sums.tokens,
             "grad_norm": optax.tree.norm(grads), "learning_rate": schedule(state.step)}
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: PyTree, batch: Batch, *, model: nn.Module,
              label_smoothing: float = 0.0, mesh: Mesh | None = None) -> dict[str, Array]:
  """Loss sums of one evaluation batch (no dropout): add them over batches, divide at the end.

  ``mesh``: keeps the activations' rows split over its ``data`` axis, as ``train_step``.
  A packed batch's segment ids and positions go to the model as in ``train_step``.

  Returns:
    float32 scalars ``loss``, ``nll``, ``correct``, ``tokens`` (sums, see ``LossSums``).
  """
  with activation_sharding(mesh):
    logits_BTV = _apply(model, sharding_lib.gather_for_compute(params, mesh), batch,
                        deterministic=True)
  sums = cross_entropy_sums(logits_BTV, batch["targets"], label_smoothing=label_smoothing,
                            pad_id=special_ids(model).pad_id)
  return sums._asdict()


def _shardings_of(state: Any) -> Any:
  return jax.tree.map(lambda x: x.sharding, state)


def make_train_step(model: nn.Module, optimizer: optax.GradientTransformation,
                    schedule: optax.Schedule, *, mesh: Mesh, state: Any,
                    label_smoothing: float = 0.0, grad_accum_steps: int = 1
                    ) -> Callable[[TrainState, Batch, PRNGKey], tuple[TrainState, dict]]:
  """``train_step`` jitted with the state donated and fixed in/out shardings.

  Compiles once per batch shape; later calls with the same shapes reuse the
  program. ``state`` (a real or abstract state with shardings) fixes the state's
  shardings; batches must be placed with ``shard_batch`` (or be host arrays).
  """
  state_shardings = _shardings_of(state)
  replicated = NamedSharding(mesh, P())
  step = functools.partial(train_step, model=model, optimizer=optimizer, schedule=schedule,
                           label_smoothing=label_smoothing, grad_accum_steps=grad_accum_steps,
                           mesh=mesh)
  return jax.jit(step, in_shardings=(state_shardings, batch_sharding(mesh), replicated),
                 out_shardings=(state_shardings, replicated), donate_argnums=0)


def abstract_train_program(model: nn.Module, train_config: Any, *, mesh: Mesh
                           ) -> tuple[TrainState, Callable[..., Any]]:
  """The train state as shapes and shardings (no values) and the jitted train step of
  ``model`` under ``train_config`` (schedule, optimizer, parameter sharding, label
  smoothing, gradient accumulation) on ``mesh``: what ahead-of-time compiles
  (``seq2seq_jax.aot``) and exports (``training.export``) lower."""
  schedule = make_schedule(train_config)
  optimizer = make_optimizer(train_config, schedule)
  state = abstract_train_state(
      model, optimizer, mesh=mesh,
      state_sharding_fn=sharding_lib.state_sharding_fn(train_config.parameter_sharding))
  step = make_train_step(model, optimizer, schedule, mesh=mesh, state=state,
                         label_smoothing=train_config.label_smoothing,
                         grad_accum_steps=train_config.grad_accum_steps)
  return state, step


def make_eval_step(model: nn.Module, *, mesh: Mesh, params: Any,
                   label_smoothing: float = 0.0) -> Callable[[PyTree, Batch], dict]:
  """``eval_step`` jitted with fixed shardings (``params`` gives theirs)."""
  step = functools.partial(eval_step, model=model, label_smoothing=label_smoothing, mesh=mesh)
  return jax.jit(step, in_shardings=(_shardings_of(params), batch_sharding(mesh)),
                 out_shardings=NamedSharding(mesh, P()))
