"""The jitted train and eval steps: compile once, accumulate exactly, fold dropout, donate."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seq2seq_jax.configs import TrainConfig
from seq2seq_jax.training.optimizer import make_optimizer
from seq2seq_jax.training.schedules import rsqrt_schedule
from seq2seq_jax.training.step import (build_model, create_train_state, make_eval_step, make_mesh,
                                       make_train_step, shard_batch)
from training.conftest import VOCAB, tiny_transformer


def _batch(seed, rows=16, source=7, target=5):
  rng = np.random.default_rng(seed)
  targets = rng.integers(4, VOCAB, (rows, target)).astype(np.int32)
  targets[::3, 3:] = 0  # some padding
  return {"inputs": rng.integers(4, VOCAB, (rows, source)).astype(np.int32), "targets": targets}


def _setup(optimizer=None, **model_overrides):
  mesh = make_mesh()
  model = build_model(tiny_transformer(**model_overrides))
  schedule = rsqrt_schedule(1e-3, 10)
  optimizer = optimizer or make_optimizer(TrainConfig(), schedule)
  state = create_train_state(model, optimizer, rng=jax.random.key(0), mesh=mesh)
  return mesh, model, schedule, optimizer, state


def _copy(tree):
  return jax.tree.map(lambda x: x.copy(), tree)


def test_second_step_with_same_shapes_does_not_recompile():
  mesh, model, schedule, optimizer, state = _setup()
  step = make_train_step(model, optimizer, schedule, mesh=mesh, state=state)
  rng = jax.random.key(1)
  state, first = step(state, shard_batch(_batch(0), mesh), rng)
  state, second = step(state, shard_batch(_batch(1), mesh), rng)
  assert step._cache_size() == 1
  state, _ = step(state, shard_batch(_batch(2, source=9), mesh), rng)
  assert step._cache_size() == 2  # a new batch shape is a new program, as expected
  assert int(state.step) == 3
  assert float(first["learning_rate"]) < float(second["learning_rate"])  # warmup


def test_state_is_donated():
  mesh, model, schedule, optimizer, state = _setup()
  step = make_train_step(model, optimizer, schedule, mesh=mesh, state=state)
  old_leaf = jax.tree.leaves(state.params)[0]
  step(state, shard_batch(_batch(0), mesh), jax.random.key(1))
  assert old_leaf.is_deleted()


def test_gradient_accumulation_equals_whole_batch():
  sgd = optax.sgd(1.0)
  mesh, model, schedule, _, state = _setup(optimizer=sgd, dropout_rate=0.0)
  batch = _batch(3)
  results = []
  for accum in (1, 2):
    step = make_train_step(model, sgd, schedule, mesh=mesh, state=state, grad_accum_steps=accum,
                           label_smoothing=0.1)
    new_state, metrics = step(_copy(state), shard_batch(batch, mesh), jax.random.key(1))
    results.append((new_state.params, metrics))
  (params_1, metrics_1), (params_2, metrics_2) = results
  np.testing.assert_allclose(float(metrics_1["loss"]), float(metrics_2["loss"]), rtol=1e-6)
  assert float(metrics_1["tokens"]) == float(metrics_2["tokens"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               params_1, params_2)


def test_dropout_rng_is_folded_from_the_step():
  mesh, model, schedule, optimizer, state = _setup(dropout_rate=0.3)
  step = make_train_step(model, optimizer, schedule, mesh=mesh, state=state)
  batch = shard_batch(_batch(4), mesh)
  rng = jax.random.key(7)
  _, a = step(_copy(state), batch, rng)
  _, b = step(_copy(state), batch, rng)
  assert float(a["loss"]) == float(b["loss"])  # same step, same key: same masks
  later = _copy(state).replace(step=state.step + 5)
  _, c = step(later, batch, rng)
  assert float(a["loss"]) != float(c["loss"])  # another step: other masks


def test_bfloat16_compute_keeps_float32_parameters():
  mesh, model, schedule, optimizer, state = _setup(dtype="bfloat16")
  step = make_train_step(model, optimizer, schedule, mesh=mesh, state=state)
  state, metrics = step(state, shard_batch(_batch(5), mesh), jax.random.key(1))
  assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
  assert np.isfinite(float(metrics["loss"]))


def test_eval_step_sums_tokens_and_uses_no_dropout():
  mesh, model, schedule, optimizer, state = _setup(dropout_rate=0.5)
  eval_step = make_eval_step(model, mesh=mesh, params=state.params)
  batch = _batch(6)
  first = eval_step(state.params, shard_batch(batch, mesh))
  second = eval_step(state.params, shard_batch(batch, mesh))
  assert float(first["loss"]) == float(second["loss"])
  assert float(first["tokens"]) == float((batch["targets"] != 0).sum())


def test_rows_not_divisible_by_devices_are_refused():
  mesh = make_mesh()
  with pytest.raises(ValueError, match="batch_multiple"):
    shard_batch(_batch(0, rows=6), mesh)
