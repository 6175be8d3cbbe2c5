"""Greedy search against toy step functions with hand-set probabilities."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from decoding_toys import MarkovToy, PrefixToy, run_jit
from seq2seq_jax.decoding import greedy_search
from seq2seq_jax.types import BOS_ID, EOS_ID, PAD_ID

# Row 0 ends after two tokens, row 1 after four; their memories differ.
TWO_ROWS = [
    {(0, BOS_ID): {3: 0.5, 4: 0.3, EOS_ID: 0.2},
     (1, 3): {EOS_ID: 0.7, 5: 0.3}},
    {(0, BOS_ID): {5: 0.6, 3: 0.4},
     (1, 5): {4: 0.8, EOS_ID: 0.2},
     (2, 4): {3: 0.9, EOS_ID: 0.1},
     (3, 3): {EOS_ID: 0.55, 4: 0.45}},
]


def greedy(toy, cache, *, batch_size, max_decode_len):
  return run_jit(greedy_search, toy.step_fn, cache, batch_size=batch_size,
                 max_decode_len=max_decode_len, bos_id=BOS_ID, eos_id=EOS_ID)


def test_greedy_picks_the_argmax_and_pads_after_eos():
  toy = MarkovToy(TWO_ROWS, max_len=6)
  tokens_BT, scores_B = greedy(toy, toy.init_cache(), batch_size=2, max_decode_len=6)
  np.testing.assert_array_equal(tokens_BT, [[3, EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
                                            [5, 4, 3, EOS_ID, PAD_ID, PAD_ID]])
  np.testing.assert_allclose(scores_B, [math.log(0.5 * 0.7), math.log(0.6 * 0.8 * 0.9 * 0.55)],
                             rtol=1e-6)
  assert tokens_BT.dtype == jnp.int32 and scores_B.dtype == jnp.float32


def test_a_row_without_eos_is_returned_as_it_stands():
  toy = MarkovToy(TWO_ROWS, max_len=6)
  tokens_BT, scores_B = greedy(toy, toy.init_cache(), batch_size=2, max_decode_len=3)
  np.testing.assert_array_equal(tokens_BT, [[3, EOS_ID, PAD_ID], [5, 4, 3]])
  np.testing.assert_allclose(scores_B, [math.log(0.35), math.log(0.6 * 0.8 * 0.9)], rtol=1e-6)


def test_the_loop_stops_once_every_row_has_ended():
  toy = MarkovToy(TWO_ROWS, max_len=8)
  calls = []

  def counted_step_fn(tokens_N, cache):
    jax.debug.callback(lambda: calls.append(1))
    return toy.step_fn(tokens_N, cache)

  run_jit(greedy_search, counted_step_fn, toy.init_cache(), batch_size=2, max_decode_len=8,
          bos_id=BOS_ID, eos_id=EOS_ID)
  jax.effects_barrier()
  assert len(calls) == 4  # row 1 emits EOS at its fourth token; 8 would be allowed


def test_pad_and_bos_are_never_generated():
  # The model prefers PAD, then BOS; greedy must take the best real token.
  def step_fn(tokens_N, cache):
    return jnp.tile(jnp.array([5.0, 4.0, 0.0, 1.0, 3.0, 2.0]), (tokens_N.shape[0], 1)), cache

  tokens_BT, scores_B = run_jit(greedy_search, step_fn, {}, batch_size=2, max_decode_len=3,
                                bos_id=BOS_ID, eos_id=EOS_ID)
  np.testing.assert_array_equal(tokens_BT, [[4, 4, 4]] * 2)
  # Scores stay the model's log-probabilities: PAD and BOS keep their share of the mass.
  logprob = 3.0 - math.log(sum(math.exp(x) for x in (5, 4, 0, 1, 3, 2)))
  np.testing.assert_allclose(scores_B, [3 * logprob] * 2, rtol=1e-6)


def test_rows_decode_independently():
  toy = PrefixToy(seed=3, rows=3, max_len=7, eos_from=1, eos_boost=0.5)
  tokens_BT, scores_B = greedy(toy, toy.init_cache(), batch_size=3, max_decode_len=7)
  assert len({tuple(row) for row in np.asarray(tokens_BT)}) == 3  # the rows really differ
  for row in range(3):
    alone_1T, alone_1 = greedy(toy, toy.init_cache([row]), batch_size=1, max_decode_len=7)
    np.testing.assert_array_equal(alone_1T[0], tokens_BT[row])
    np.testing.assert_allclose(alone_1[0], scores_B[row], rtol=1e-6)


def test_matches_a_python_argmax_loop():
  toy = PrefixToy(seed=5, rows=2, max_len=6, eos_from=2, eos_boost=1.0)
  tokens_BT, scores_B = greedy(toy, toy.init_cache(), batch_size=2, max_decode_len=6)
  for row in range(2):
    prefix, total = (), 0.0
    while len(prefix) < 6 and EOS_ID not in prefix:
      logprobs = toy.logprobs(row, prefix)
      logprobs[[PAD_ID, BOS_ID]] = -np.inf
      prefix += (int(np.argmax(logprobs)),)
      total += logprobs[prefix[-1]]
    np.testing.assert_array_equal(tokens_BT[row], prefix + (PAD_ID,) * (6 - len(prefix)))
    np.testing.assert_allclose(scores_B[row], total, rtol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0, max_decode_len=3), "batch_size"),
    (dict(batch_size=2, max_decode_len=0), "max_decode_len"),
    (dict(batch_size=3, max_decode_len=3), "cache leaf"),
])
def test_bad_arguments_raise(kwargs, message):
  toy = MarkovToy(TWO_ROWS, max_len=4)
  with pytest.raises(ValueError, match=message):
    greedy_search(toy.step_fn, toy.init_cache(), bos_id=BOS_ID, eos_id=EOS_ID, **kwargs)
