"""Learning-rate schedules at chosen steps."""

import numpy as np
import pytest

from seq2seq_jax.configs import TrainConfig
from seq2seq_jax.training.schedules import make_schedule, rsqrt_schedule


def test_rsqrt_warmup_then_inverse_square_root():
  schedule = rsqrt_schedule(2e-3, warmup_steps=100)
  # optax count c is update number c + 1.
  expected = {0: 2e-3 * 1 / 100, 49: 2e-3 * 0.5, 99: 2e-3, 399: 2e-3 * 0.5, 9999: 2e-3 * 0.1}
  for count, lr in expected.items():
    np.testing.assert_allclose(float(schedule(count)), lr, rtol=1e-5)


def test_rsqrt_is_the_paper_schedule():
  d, warmup = 512, 4000
  schedule = rsqrt_schedule(d ** -0.5 * warmup ** -0.5, warmup)
  for step in (1, 1000, 4000, 10_000, 100_000):
    paper = d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    np.testing.assert_allclose(float(schedule(step - 1)), paper, rtol=1e-5)


def test_rsqrt_without_warmup():
  schedule = rsqrt_schedule(1.0, 0)
  np.testing.assert_allclose([float(schedule(c)) for c in (0, 3, 15)], [1.0, 0.5, 0.25], rtol=1e-6)


@pytest.mark.parametrize("name,expected", [
    ("constant", {0: 0.0, 5: 0.5e-3, 10: 1e-3, 50: 1e-3}),
    ("cosine", {0: 0.0, 10: 1e-3, 55: 0.5e-3, 100: 0.0}),
    ("linear", {0: 0.0, 5: 0.5e-3, 10: 1e-3, 28: 0.8e-3, 55: 0.5e-3, 99: 1e-3 / 90, 100: 0.0}),
])
def test_optax_schedules_from_config(name, expected):
  schedule = make_schedule(TrainConfig(schedule=name, learning_rate=1e-3, warmup_steps=10,
                                       num_steps=100))
  for count, lr in expected.items():
    np.testing.assert_allclose(float(schedule(count)), lr, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("name", ["cosine", "linear"])
def test_decaying_schedules_need_warmup_below_num_steps(name):
  with pytest.raises(ValueError, match=f"TrainConfig.warmup_steps=100.*the {name} schedule"):
    TrainConfig(schedule=name, warmup_steps=100, num_steps=100)
  TrainConfig(schedule="constant", warmup_steps=100, num_steps=100)  # no decay: nothing to check
