"""Repetition control: n-gram blocking and the repetition penalty, against python references
and exhaustive search on a toy vocabulary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from decoding_toys import PrefixToy, assert_n_best, log_softmax, padded, run_jit
from seq2seq_jax.decoding import beam_search, greedy_search, sample
from seq2seq_jax.decoding.repetition import banned_ngram_tokens, penalize_repeats
from seq2seq_jax.decoding.step import TokenRules
from seq2seq_jax.types import BOS_ID, EOS_ID, NEG_INF, PAD_ID

NEVER = (PAD_ID, BOS_ID)


def banned_reference(fed, ngram_size):
  """transformers' rule on the fed tokens (decoder start first): the tokens that followed
  the last n - 1 tokens before."""
  n = ngram_size
  if len(fed) + 1 < n:
    return set()
  follows = {}
  for i in range(len(fed) - n + 1):
    follows.setdefault(tuple(fed[i:i + n - 1]), set()).add(fed[i + n - 1])
  return follows.get(tuple(fed[len(fed) - n + 1:]) if n > 1 else (), set())


def repeats(tokens, ngram_size):
  grams = [tuple(tokens[i:i + ngram_size]) for i in range(len(tokens) - ngram_size + 1)]
  return len(grams) != len(set(grams))


@pytest.mark.parametrize("ngram_size", [1, 2, 3])
def test_banned_tokens_equal_the_python_rule(ngram_size):
  rng = np.random.default_rng(ngram_size)
  rows, columns, vocab = 5, 9, 7
  history_NT = rng.integers(3, 6, size=(rows, columns)).astype(np.int32)
  history_NT[:, 0] = BOS_ID
  for step in range(columns):
    # Columns after ``step`` hold whatever the loop left there: they must not count.
    banned_NV = np.asarray(banned_ngram_tokens(jnp.asarray(history_NT), jnp.int32(step),
                                               ngram_size, vocab))
    for row in range(rows):
      expected = banned_reference(history_NT[row, :step + 1].tolist(), ngram_size)
      assert set(np.flatnonzero(banned_NV[row]).tolist()) == expected, (row, step)


def test_penalty_divides_positive_and_multiplies_negative_seen_scores():
  scores_NV = np.array([[2.0, -1.0, 3.0, -4.0, 0.5], [1.0, 1.0, -1.0, -1.0, 2.0]], np.float32)
  history_NT = np.array([[1, 3, 0, 0], [4, 4, 2, 3]], np.int32)
  out = np.asarray(penalize_repeats(jnp.asarray(scores_NV), jnp.asarray(history_NT),
                                    jnp.int32(1), 2.0))
  expected = scores_NV.copy()
  expected[0, [1, 3]] = [-2.0, -8.0]  # columns 0..1 are seen: 1 and 3
  expected[1, 4] = 1.0  # 4 (twice) only: columns 2 and 3 are not filled yet
  np.testing.assert_array_equal(out, expected)


def _search(search, toy, *, rules, **kwargs):
  settings = dict(batch_size=toy.rows, max_decode_len=T, bos_id=BOS_ID, eos_id=EOS_ID,
                  rules=rules, **kwargs)
  out = run_jit(search, toy.step_fn, toy.init_cache(), **settings)
  return np.asarray(out[0]), np.asarray(out[1])


T = 7


@pytest.mark.parametrize("ngram_size", [1, 2, 3])
@pytest.mark.parametrize("method", ["greedy", "beam", "sample"])
def test_no_output_repeats_an_ngram(method, ngram_size):
  # Three words, long outputs: without the rule, repeats are everywhere.
  toy = PrefixToy(seed=ngram_size, rows=6, max_len=T + 1, eos_from=T - 2, eos_boost=-2.0)
  size = min(ngram_size, 2) if method != "beam" else ngram_size  # 3 words: n = 1 ends early
  kwargs = {"greedy": {}, "beam": dict(beam_size=3, alpha=0.6),
            "sample": dict(rng=jax.random.key(ngram_size))}[method]
  search = {"greedy": greedy_search, "beam": beam_search, "sample": sample}[method]
  plain, _ = _search(search, toy, rules=TokenRules(), **kwargs)
  blocked, _ = _search(search, toy, rules=TokenRules(no_repeat_ngram_size=size), **kwargs)
  outputs = lambda tokens: [[BOS_ID] + [t for t in row if t != PAD_ID]
                            for row in tokens.reshape(-1, T)]
  assert any(repeats(row, size) for row in outputs(plain)), "the toy must repeat without it"
  for row in outputs(blocked):
    assert not repeats(row, size), row


def _rescored(toy, row, tokens, process):
  """Sum over positions of process(fed tokens, log-probabilities)[token]; -inf if masked."""
  total = 0.0
  for i, token in enumerate(tokens):
    scores = process((BOS_ID,) + tuple(tokens[:i]), toy.logprobs(row, tuple(tokens[:i])))
    if scores[token] < 0.5 * NEG_INF:
      return -np.inf
    total += scores[token]
  return total


def _exhaustive(toy, row, max_decode_len, process, alpha):
  scored = []
  for tokens in toy.outputs(max_decode_len):
    total = _rescored(toy, row, tokens, process)
    if np.isfinite(total):
      scored.append((total / ((5.0 + len(tokens)) / 6.0) ** alpha,
                     padded(tokens, max_decode_len)))
  return sorted(scored, key=lambda item: -item[0])


def _blocked(ngram_size):
  def process(fed, logprobs):
    out = logprobs.copy()
    out[list(NEVER)] = NEG_INF
    out[sorted(banned_reference(list(fed), ngram_size))] = NEG_INF
    return out
  return process


def _penalized(penalty):
  def process(fed, logprobs):
    out = logprobs.copy()
    seen = sorted(set(fed))
    out[seen] = np.where(out[seen] < 0, out[seen] * penalty, out[seen] / penalty)
    out[list(NEVER)] = NEG_INF
    return out
  return process


@pytest.mark.parametrize("rules, process", [
    (TokenRules(no_repeat_ngram_size=2), _blocked(2)),
    (TokenRules(no_repeat_ngram_size=1), _blocked(1)),
    (TokenRules(repetition_penalty=1.7), _penalized(1.7)),
    (TokenRules(repetition_penalty=0.6), _penalized(0.6)),
], ids=["ngram2", "ngram1", "penalty1.7", "penalty0.6"])
def test_a_wide_beam_is_exhaustive_search_under_the_rules(rules, process):
  # Beam search scales log-probabilities (transformers' beam search); 40 outputs at most.
  toy = PrefixToy(seed=4, rows=2, max_len=4, eos_from=0, eos_boost=0.5)
  tokens_BWT, scores_BW = run_beam(toy, rules, beam_size=12, max_decode_len=3, alpha=0.6)
  for row in range(2):
    assert_n_best(tokens_BWT[row], scores_BW[row], _exhaustive(toy, row, 3, process, 0.6))


def run_beam(toy, rules, *, beam_size, max_decode_len, alpha):
  out = run_jit(beam_search, toy.step_fn, toy.init_cache(), batch_size=toy.rows,
                beam_size=beam_size, max_decode_len=max_decode_len, alpha=alpha, bos_id=BOS_ID,
                eos_id=EOS_ID, rules=rules)
  return np.asarray(out[0]), np.asarray(out[1])


@pytest.mark.parametrize("penalty", [1.5, 0.7])
def test_greedy_penalizes_logits_as_a_python_reference(penalty):
  # Greedy search scales the logits (transformers' greedy search), then renormalizes.
  toy = PrefixToy(seed=9, rows=4, max_len=T + 1, eos_from=3, eos_boost=0.3)
  tokens, scores = _search(greedy_search, toy, rules=TokenRules(repetition_penalty=penalty))
  for row in range(4):
    fed, total = [BOS_ID], 0.0
    for _ in range(T):
      logits = toy.next_logits(row, tuple(fed[1:]))
      seen = sorted(set(fed))
      logits[seen] = np.where(logits[seen] < 0, logits[seen] * penalty, logits[seen] / penalty)
      logprobs = log_softmax(logits)
      logprobs[list(NEVER)] = NEG_INF
      token = int(np.argmax(logprobs))
      fed.append(token)
      total += logprobs[token]
      if token == EOS_ID:
        break
    assert tuple(tokens[row]) == padded(fed[1:], T)
    np.testing.assert_allclose(scores[row], total, rtol=1e-5)
