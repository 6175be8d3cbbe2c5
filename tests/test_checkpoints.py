"""Checkpoints: latest-N beside best-by-BLEU, params-only restore, architecture checks, averaging."""

import grain
import jax
import numpy as np
import pytest

from seq2seq_jax.checkpoints import CheckpointError, Checkpointer
from seq2seq_jax.training.restore import average_checkpoints, load_params
from seq2seq_jax.configs import DataConfig, ExperimentConfig, RNNConfig
from seq2seq_jax.training.optimizer import make_optimizer
from seq2seq_jax.training.schedules import make_schedule
from seq2seq_jax.training.step import (abstract_train_state, build_model, create_train_state,
                                       make_mesh)
from training.conftest import VOCAB, tiny_transformer


def _config(model=None):
  data = DataConfig(vocab_size=VOCAB, max_source_len=32, max_target_len=32)
  return ExperimentConfig(model=model or tiny_transformer(), data=data)


def _state(config, step, seed=0):
  mesh = make_mesh()
  model = build_model(config.model)
  optimizer = make_optimizer(config.train, make_schedule(config.train))
  state = create_train_state(model, optimizer, rng=jax.random.key(seed), mesh=mesh)
  return state.replace(step=state.step + step), (model, optimizer, mesh)


def test_latest_n_and_best_bleu_are_both_kept(tmp_path):
  config = _config()
  state, _ = _state(config, 0)
  bleus = {1: 10.0, 2: None, 3: 30.0, 4: 20.0, 5: None, 6: 25.0, 7: 12.0}
  kept = {}
  with Checkpointer(tmp_path, keep=2) as checkpointer:
    for step, bleu in bleus.items():
      checkpointer.save(state.replace(step=state.step * 0 + step), config=config,
                        metrics=None if bleu is None else {"bleu": bleu})
      checkpointer.wait_until_finished()
      kept[step] = (checkpointer.all_steps(), checkpointer.best_step())
  assert kept[2] == ([1, 2], 1)
  assert kept[3] == ([2, 3], 3)
  assert kept[4] == ([3, 4], 3)  # BLEU went down: the best stays, the latest two too
  assert kept[5] == ([3, 4, 5], 3)
  assert kept[6] == ([3, 5, 6], 3)
  assert kept[7] == ([3, 6, 7], 3)


def test_restore_state_iterator_and_params_alone(tmp_path):
  config = _config()
  state, (model, optimizer, mesh) = _state(config, 5, seed=3)
  iterator = iter(grain.MapDataset.range(100).to_iter_dataset())
  for _ in range(7):
    next(iterator)
  with Checkpointer(tmp_path) as checkpointer:
    checkpointer.save(state, config=config, data_iterator=iterator, metrics={"bleu": 1.5})
  fresh_iterator = iter(grain.MapDataset.range(100).to_iter_dataset())
  with Checkpointer(tmp_path) as checkpointer:
    restored = checkpointer.restore(abstract_train_state(model, optimizer, mesh=mesh),
                                    data_iterator=fresh_iterator)
    assert checkpointer.load_config() == config
  assert int(restored.step) == 5
  assert next(fresh_iterator) == 7
  jax.tree.map(np.testing.assert_array_equal, restored.params, state.params)
  jax.tree.map(np.testing.assert_array_equal, restored.opt_state, state.opt_state)
  params, saved_config = load_params(tmp_path, step="best")
  assert saved_config == config
  jax.tree.map(np.testing.assert_array_equal, params, state.params)


def test_checkpoint_of_another_architecture_is_refused(tmp_path):
  config = _config()
  state, _ = _state(config, 1)
  with Checkpointer(tmp_path) as checkpointer:
    checkpointer.save(state, config=config)
  with pytest.raises(CheckpointError, match="another model architecture.*encoder_layers_1"):
    load_params(tmp_path, model_config=tiny_transformer(num_encoder_layers=2))
  with pytest.raises(CheckpointError, match="other shapes.*model_dim|other shapes"):
    load_params(tmp_path, model_config=tiny_transformer(model_dim=16, num_heads=2))
  with pytest.raises(CheckpointError, match="holds a TransformerConfig model.*not a RNNConfig"):
    load_params(tmp_path, model_config=RNNConfig(vocab_size=VOCAB, max_len=32))
  rnn_config = _config(RNNConfig(vocab_size=VOCAB, cell="gru", embed_dim=8, hidden_dim=8,
                                 max_len=32))
  _, (model, optimizer, mesh) = _state(rnn_config, 0)
  with Checkpointer(tmp_path) as checkpointer:
    with pytest.raises(CheckpointError, match="another model architecture"):
      checkpointer.restore(abstract_train_state(model, optimizer, mesh=mesh))


def test_missing_checkpoint_is_named(tmp_path):
  with pytest.raises(CheckpointError, match="no checkpoint found"):
    load_params(tmp_path / "nothing")


def test_average_of_the_last_checkpoints(tmp_path):
  config = _config()
  states = []
  with Checkpointer(tmp_path / "run", keep=3) as checkpointer:
    for step, seed in ((1, 0), (2, 1), (3, 2), (4, 3)):
      state, _ = _state(config, step, seed=seed)
      checkpointer.save(state, config=config)
      states.append(state)
  step = average_checkpoints(tmp_path / "run", tmp_path / "average", num_last=2)
  assert step == 4
  params, saved_config = load_params(tmp_path / "average")
  assert saved_config == config
  expected = jax.tree.map(lambda a, b: (np.asarray(a, np.float64) + np.asarray(b)) / 2,
                          states[2].params, states[3].params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), params, expected)
  with pytest.raises(ValueError, match="num_last=5"):
    average_checkpoints(tmp_path / "run", tmp_path / "other", num_last=5)
