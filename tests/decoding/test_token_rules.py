"""Token rules of published checkpoints (forced first token, EOS at the limit, suppressed
ids) and special ids other than 0/1/2, against exhaustive search on a toy vocabulary."""

import jax
import numpy as np
import pytest

from seq2seq_jax.decoding import beam_search, greedy_search
from seq2seq_jax.decoding.step import TokenRules, check_decode_args, log_softmax
from seq2seq_jax.platforms import VOCAB_MAJOR_MAX_ROWS, VOCAB_MAJOR_MIN_ROWS
from seq2seq_jax.types import BOS_ID, EOS_ID, PAD_ID
from tests.decoding.decoding_toys import PrefixToy, run_jit

T = 4


def _best(toy, row, keep, score):
  """The best (score, tokens) of toy.enumerate(row) that ``keep`` accepts, rescored."""
  outputs = [(score(tokens), tokens) for _, tokens in toy.enumerate(row, T, 0.0) if keep(tokens)]
  return max(outputs, key=lambda item: item[0])


def _logprob(toy, row, tokens):
  real = [t for t in tokens if t != PAD_ID]
  return sum(toy.logprobs(row, tuple(real[:i]))[t] for i, t in enumerate(real))


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_forced_first_token_is_emitted_and_scores_zero(search):
  toy = PrefixToy(seed=3, rows=3, max_len=T + 1, eos_from=1, vocab=7)
  rules = TokenRules(forced_bos_id=4)
  kwargs = dict(batch_size=3, max_decode_len=T, bos_id=BOS_ID, eos_id=EOS_ID, rules=rules)
  if search == "beam":
    tokens, scores = run_jit(beam_search, toy.step_fn, toy.init_cache(), beam_size=6, alpha=0.0,
                             **kwargs)
    tokens, scores = np.asarray(tokens)[:, 0], np.asarray(scores)[:, 0]
  else:
    tokens, scores = map(np.asarray, run_jit(greedy_search, toy.step_fn, toy.init_cache(),
                                             **kwargs))
  assert (tokens[:, 0] == 4).all()
  for row in range(3):
    rescore = lambda t: _logprob(toy, row, t) - toy.logprobs(row, ())[4]
    expected = rescore(tuple(tokens[row]))
    np.testing.assert_allclose(scores[row], expected, atol=1e-4)
    if search == "beam":  # the best of every output that starts with the forced token
      best_score, best_tokens = _best(toy, row, lambda t: t[0] == 4, rescore)
      np.testing.assert_allclose(scores[row], best_score, atol=1e-4)
      assert tuple(tokens[row]) == best_tokens


def test_suppressed_ids_never_appear_and_beam_finds_the_best_without_them():
  toy = PrefixToy(seed=5, rows=2, max_len=T + 1, eos_from=1, vocab=7)
  tokens, scores = run_jit(beam_search, toy.step_fn, toy.init_cache(), batch_size=2,
                           beam_size=8, max_decode_len=T, alpha=0.0, bos_id=BOS_ID,
                           eos_id=EOS_ID, rules=TokenRules(suppress_ids=(5, 6)))
  tokens, scores = np.asarray(tokens), np.asarray(scores)
  assert not np.isin(tokens, (5, 6)).any()
  for row in range(2):
    best_score, best_tokens = _best(toy, row, lambda t: not set(t) & {5, 6},
                                    lambda t: _logprob(toy, row, t))
    assert tuple(tokens[row, 0]) == best_tokens
    np.testing.assert_allclose(scores[row, 0], best_score, atol=1e-4)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_eos_is_forced_at_the_limit_with_its_real_logprob(search):
  # EOS is possible from position 1 but unlikely: without the rule rows run to the limit.
  toy = PrefixToy(seed=7, rows=3, max_len=T + 1, eos_from=1, eos_boost=-6.0, vocab=7)
  kwargs = dict(batch_size=3, max_decode_len=T, bos_id=BOS_ID, eos_id=EOS_ID,
                rules=TokenRules(force_eos_at_limit=True))
  if search == "beam":
    tokens, scores = run_jit(beam_search, toy.step_fn, toy.init_cache(), beam_size=3, alpha=0.0,
                             **kwargs)
    tokens, scores = np.asarray(tokens)[:, 0], np.asarray(scores)[:, 0]
  else:
    tokens, scores = map(np.asarray, run_jit(greedy_search, toy.step_fn, toy.init_cache(),
                                             **kwargs))
  assert ((tokens == EOS_ID).sum(axis=1) == 1).all(), tokens
  assert (tokens[:, -1] == EOS_ID).any(), "the toy should reach the limit"
  for row in range(3):
    np.testing.assert_allclose(scores[row], _logprob(toy, row, tuple(tokens[row])), atol=1e-4)


def test_decoder_start_may_equal_pad_or_eos():
  check_decode_args(batch_size=1, max_decode_len=3, bos_id=0, eos_id=2, pad_id=0)  # Marian
  check_decode_args(batch_size=1, max_decode_len=3, bos_id=2, eos_id=2, pad_id=1)  # M2M100
  with pytest.raises(ValueError, match="eos_id=1 and pad_id=1 must differ"):
    check_decode_args(batch_size=1, max_decode_len=3, bos_id=2, eos_id=1, pad_id=1)


def test_start_equal_to_eos_can_still_end_and_pads_with_the_models_pad():
  # M2M100's ids: pad 1, decoder start = eos = 2. EOS must stay emittable; 1 fills.
  toy = PrefixToy(seed=11, rows=4, max_len=T + 1, eos_from=1, eos_boost=8.0, vocab=7)
  tokens, _ = run_jit(greedy_search, toy.step_fn, toy.init_cache(), batch_size=4,
                      max_decode_len=T, bos_id=EOS_ID, eos_id=EOS_ID, pad_id=1)
  tokens = np.asarray(tokens)
  assert (tokens == EOS_ID).any(axis=1).all()
  for row in tokens:
    end = list(row).index(EOS_ID)
    assert (row[end + 1:] == 1).all() and not (row[:end] == 1).any()


@pytest.mark.parametrize("rows", [1, VOCAB_MAJOR_MIN_ROWS, VOCAB_MAJOR_MAX_ROWS,
                                  VOCAB_MAJOR_MAX_ROWS + 1])
def test_log_softmax_against_float64(rows):
  # From VOCAB_MAJOR_MIN_ROWS to VOCAB_MAJOR_MAX_ROWS rows the sums run along axis 0 of
  # the transpose.
  logits = np.random.default_rng(rows).normal(scale=4.0, size=(rows, 5003)).astype(np.float32)
  logits[0, :7] = 80.0  # large values: the maximum is subtracted first
  want = logits.astype(np.float64)
  want = want - want.max(-1, keepdims=True)
  want = want - np.log(np.exp(want).sum(-1, keepdims=True))
  np.testing.assert_allclose(jax.jit(log_softmax)(logits), want, rtol=1e-5, atol=2e-5)


def test_a_suppressed_eos_stays_suppressed_when_decoding_starts_from_eos():
  """M2M100 and mBART start decoding from EOS; suppressing EOS (every output runs to the
  limit, as the benchmarks need) must still hold, and the start id stays allowed."""
  from seq2seq_jax.decoding.step import never_emitted
  assert never_emitted(bos_id=EOS_ID, eos_id=EOS_ID, pad_id=PAD_ID,
                       rules=TokenRules(suppress_ids=(EOS_ID,))) == (PAD_ID, EOS_ID)
  assert never_emitted(bos_id=EOS_ID, eos_id=EOS_ID, pad_id=PAD_ID) == (PAD_ID,)
  assert never_emitted(bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID) == (PAD_ID, BOS_ID)
  toy = PrefixToy(seed=5, rows=3, max_len=T + 1, eos_from=0, vocab=7)
  tokens, _ = run_jit(greedy_search, toy.step_fn, toy.init_cache(), batch_size=3,
                      max_decode_len=T, bos_id=EOS_ID, eos_id=EOS_ID,
                      rules=TokenRules(suppress_ids=(EOS_ID,)))
  tokens = np.asarray(tokens)
  assert not (tokens == EOS_ID).any() and not (tokens == PAD_ID).any()
