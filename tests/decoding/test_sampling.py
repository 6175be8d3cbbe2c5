"""Sampling: limits that equal greedy, and frequencies that match the truncated softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from decoding_toys import PrefixToy, run_jit
from seq2seq_jax.decoding import greedy_search, sample, sample_logprobs
from seq2seq_jax.types import BOS_ID, EOS_ID, PAD_ID

# PAD and BOS get real logits: sampling must still never draw them.
LOGITS_V = np.array([1.0, 2.0, 0.3, 1.6, -0.4, 0.9, -1.5], np.float32)
DRAWS = 20_000


def expected_frequencies(temperature, top_k, top_p):
  """Independent numpy version: allowed tokens, temperature, top-k, then nucleus."""
  allowed = np.arange(EOS_ID, len(LOGITS_V))
  scaled = LOGITS_V[allowed].astype(np.float64) / temperature
  probs = np.exp(scaled - scaled.max())
  probs /= probs.sum()
  order = np.argsort(-probs)
  keep = np.zeros(len(allowed), bool)
  keep[order[:top_k or len(allowed)]] = True
  probs = np.where(keep, probs, 0.0) / probs[keep].sum()
  mass = 0.0
  for i in order:
    if mass >= top_p:
      probs[i] = 0.0
    mass += probs[i]
  expected = np.zeros(len(LOGITS_V))
  expected[allowed] = probs / probs.sum()
  return expected


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.5, 0, 1.0), (1.0, 0, 0.7), (1.5, 4, 0.8),
])
def test_sampling_frequencies_match_the_softmax(temperature, top_k, top_p):
  def step_fn(tokens_N, cache):
    return jnp.tile(jnp.asarray(LOGITS_V), (tokens_N.shape[0], 1)), cache

  tokens_BT, scores_B = run_jit(sample, step_fn, {}, rng=jax.random.key(42), batch_size=DRAWS,
                                max_decode_len=1, bos_id=BOS_ID, eos_id=EOS_ID,
                                temperature=temperature, top_k=top_k, top_p=top_p)
  counts = np.bincount(np.asarray(tokens_BT[:, 0]), minlength=len(LOGITS_V))
  expected = expected_frequencies(temperature, top_k, top_p)
  assert counts[PAD_ID] == counts[BOS_ID] == 0
  assert np.all(counts[expected == 0] == 0)  # truncated tokens are never drawn
  # Binomial standard error per token; 4.5 sigma keeps the fixed-seed test robust while
  # a wrong temperature or cut-off (differences of 0.03 and more here) still fails.
  sigma = np.sqrt(expected * (1 - expected) / DRAWS)
  np.testing.assert_array_less(np.abs(counts / DRAWS - expected), 4.5 * sigma + 1e-9)
  # Scores are the model's own log-probabilities, whatever the truncation.
  model_logprobs = np.asarray(jax.nn.log_softmax(jnp.asarray(LOGITS_V)))
  np.testing.assert_allclose(scores_B, model_logprobs[np.asarray(tokens_BT[:, 0])], rtol=1e-6)


def test_top_p_keeps_the_smallest_set_that_reaches_p():
  logprobs_NV = jnp.log(jnp.array([[0.05, 0.5, 0.3, 0.15]]))
  drawn = {int(sample_logprobs(logprobs_NV, rng=jax.random.key(i), top_p=0.75)[0])
           for i in range(200)}
  assert drawn == {1, 2}  # 0.5 alone < 0.75 <= 0.5 + 0.3


def test_limits_that_equal_greedy():
  toy = PrefixToy(seed=11, rows=4, max_len=8, eos_from=3, eos_boost=0.5)
  common = dict(batch_size=4, max_decode_len=8, bos_id=BOS_ID, eos_id=EOS_ID)
  greedy_BT, greedy_B = run_jit(greedy_search, toy.step_fn, toy.init_cache(), **common)
  assert len(set(map(tuple, np.asarray(greedy_BT)))) == 4
  for kwargs in (dict(temperature=0.0), dict(temperature=1e-4), dict(top_k=1),
                 dict(top_k=1, top_p=0.3, temperature=3.0)):
    sampled_BT, sampled_B = run_jit(sample, toy.step_fn, toy.init_cache(),
                                    rng=jax.random.key(0), **common, **kwargs)
    np.testing.assert_array_equal(sampled_BT, greedy_BT, err_msg=str(kwargs))
    np.testing.assert_allclose(sampled_B, greedy_B, rtol=1e-6, err_msg=str(kwargs))


def test_sampling_ends_rows_at_eos_and_depends_on_the_seed():
  toy = PrefixToy(seed=2, rows=6, max_len=10, eos_from=1, eos_boost=1.0)
  common = dict(batch_size=6, max_decode_len=10, bos_id=BOS_ID, eos_id=EOS_ID)
  first_BT, first_B = run_jit(sample, toy.step_fn, toy.init_cache(), rng=jax.random.key(1),
                              **common)
  again_BT, _ = run_jit(sample, toy.step_fn, toy.init_cache(), rng=jax.random.key(1), **common)
  other_BT, _ = run_jit(sample, toy.step_fn, toy.init_cache(), rng=jax.random.key(2), **common)
  np.testing.assert_array_equal(first_BT, again_BT)
  assert not np.array_equal(first_BT, other_BT)
  for row, tokens in enumerate(np.asarray(first_BT)):
    ends = np.flatnonzero(tokens == EOS_ID)
    stop = ends[0] + 1 if len(ends) else len(tokens)
    assert np.all(tokens[stop:] == PAD_ID) and np.all(tokens[:stop] > BOS_ID)
    prefix = tuple(int(t) for t in tokens[:stop])
    total = sum(toy.logprobs(row, prefix[:i])[t] for i, t in enumerate(prefix))
    np.testing.assert_allclose(first_B[row], total, rtol=1e-5)


def test_a_row_does_not_depend_on_the_other_rows():
  toy = PrefixToy(seed=4, rows=8, max_len=6, eos_from=1)
  common = dict(batch_size=3, max_decode_len=6, bos_id=BOS_ID, eos_id=EOS_ID,
                rng=jax.random.key(9))
  tokens_BT, scores_B = run_jit(sample, toy.step_fn, toy.init_cache([0, 1, 2]), **common)
  swapped_BT, swapped_B = run_jit(sample, toy.step_fn, toy.init_cache([0, 6, 7]), **common)
  np.testing.assert_array_equal(tokens_BT[0], swapped_BT[0])
  np.testing.assert_allclose(scores_B[0], swapped_B[0], rtol=1e-6)
  assert not np.array_equal(tokens_BT[1:], swapped_BT[1:])


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), "temperature"), (dict(top_k=-2), "top_k"), (dict(top_p=0.0), "top_p"),
])
def test_bad_sampling_arguments_raise(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sample(lambda t, c: (t, c), {}, rng=jax.random.key(0), batch_size=1, max_decode_len=1,
           bos_id=BOS_ID, eos_id=EOS_ID, **kwargs)
