"""Beam search options: length-penalty forms, transformers' stopping rules and diverse beam
groups, against a float64 python beam search written from transformers' description."""

import collections
import math

import numpy as np
import pytest

from decoding_toys import MarkovToy, PrefixToy, assert_n_best, padded, run_jit
from seq2seq_jax.decoding import beam_search, length_penalty
from seq2seq_jax.decoding.prefix import pad_target_prefix
from seq2seq_jax.decoding.step import TokenRules
from seq2seq_jax.types import BOS_ID, EOS_ID, NEG_INF, PAD_ID

DEAD = 0.5 * NEG_INF


def penalty(length, alpha, form):
  return ((5.0 + length) / 6.0) ** alpha if form == "gnmt" else max(length, 1) ** alpha


def reference_beam(toy, row, *, width, max_len, alpha, form="gnmt", early_stopping="never",
                   groups=1, diversity=0.0, prefix=()):
  """One row's n-best by the rules of transformers' beam search, in float64.

  Each group (one unless ``groups`` > 1) keeps ``width / groups`` live and finished
  hypotheses; group g's log-probabilities lose ``diversity`` per live beam of an earlier
  group that took the token this step. The 2w best candidates of a group: those ending
  (EOS, or the limit) finish, scored by the length penalty of the tokens after the
  prefix (with True / False only the w best may, and a stopped group takes none), the w
  best others stay live. A group stops when full and no live beam can win: at the
  largest length ("never") or at its current length (True, False); True also when full.
  """
  w = width // groups
  live = [[((), 0.0 if i == 0 else NEG_INF) for i in range(w)] for _ in range(groups)]
  finished = [[] for _ in range(groups)]
  done = [False] * groups
  heuristic = isinstance(early_stopping, bool)
  for step in range(max_len):
    forced = step < len(prefix)
    chosen = collections.Counter()
    for g in range(groups):
      candidates = []
      for b, (tokens, score) in enumerate(live[g]):
        logprobs = toy.logprobs(row, tokens)
        if g and not forced:
          for token, count in chosen.items():
            logprobs[token] -= diversity * count
        logprobs[[PAD_ID, BOS_ID]] = NEG_INF
        if forced:
          logprobs = np.where(np.arange(len(logprobs)) == prefix[step], 0.0, NEG_INF)
        for v, lp in enumerate(logprobs):
          candidates.append((max(score + lp, NEG_INF), b * len(logprobs) + v, tokens + (v,)))
      top = sorted(candidates, key=lambda c: (-c[0], c[1]))[:2 * w]
      generated = step + 1 - len(prefix)
      for rank, (score, _, tokens) in enumerate(top):
        ends = tokens[-1] == EOS_ID or step + 1 == max_len
        if ends and score > DEAD and not done[g] and (rank < w or not heuristic):
          finished[g].append((score / penalty(generated, alpha, form), tokens))
      finished[g] = sorted(finished[g], key=lambda f: -f[0])[:w]  # stable: older first
      live[g] = [(tokens, score) for score, _, tokens in top if tokens[-1] != EOS_ID][:w]
      if not done[g]:
        chosen.update(tokens[-1] for tokens, score in live[g] if score > DEAD)
      best_live = live[g][0][1]
      full = len(finished[g]) == w
      bound = penalty(generated if heuristic else max_len - len(prefix), alpha, form)
      if full and best_live / bound <= finished[g][-1][0] or best_live <= DEAD:
        done[g] = True
      if early_stopping is True and full:
        done[g] = True
    if all(done):
      break
  every = sorted((f for group in finished for f in group), key=lambda f: -f[0])
  return [(score, padded(tokens, max_len)) for score, tokens in every]


def _beam(toy, *, prefix=None, **kwargs):
  if prefix is not None:
    kwargs["target_prefix_BP"] = pad_target_prefix(prefix)
  rows = len(toy.init_cache()["row"])
  out = run_jit(beam_search, toy.step_fn, toy.init_cache(), batch_size=rows, bos_id=BOS_ID,
                eos_id=EOS_ID, **kwargs)
  return np.asarray(out[0]), np.asarray(out[1])


def _assert_equals_reference(toy, tokens, scores, *, prefixes=None, **kwargs):
  for row in range(toy.rows):
    prefix = tuple(prefixes[row]) if prefixes else ()
    expected = reference_beam(toy, row, prefix=prefix, **kwargs)
    width = kwargs["width"]
    real = scores[row] > DEAD
    assert real.sum() == min(width, len(expected)), row
    np.testing.assert_allclose(scores[row][real], [s for s, _ in expected[:width]], rtol=2e-5)
    assert [tuple(t) for t in tokens[row][real]] == [t for _, t in expected[:width]], row


def test_length_penalty_forms():
  np.testing.assert_allclose(length_penalty(np.array([1, 4, 9]), 0.5, "power"), [1, 2, 3])
  np.testing.assert_allclose(length_penalty(7, 1.0, "gnmt"), 2.0)
  with pytest.raises(ValueError, match="form='linear'"):
    length_penalty(3, 1.0, "linear")


@pytest.mark.parametrize("form", ["gnmt", "power"])
@pytest.mark.parametrize("early_stopping", ["never", True, False])
def test_stopping_rules_and_forms_equal_the_reference(form, early_stopping):
  # EOS is possible from the first token and mildly favoured: hypotheses finish at every
  # length, so when to stop decides the outputs.
  toy = PrefixToy(seed=11, rows=6, max_len=7, eos_from=0, eos_boost=0.7, vocab=8)
  settings = dict(beam_size=3, max_decode_len=6, alpha=1.0, length_penalty_form=form,
                  early_stopping=early_stopping)
  tokens, scores = _beam(toy, **settings)
  _assert_equals_reference(toy, tokens, scores, width=3, max_len=6, alpha=1.0, form=form,
                           early_stopping=early_stopping)


def test_a_wide_power_form_beam_is_exhaustive():
  toy = PrefixToy(seed=7, rows=2, max_len=3, eos_from=0, eos_boost=1.0)
  tokens, scores = _beam(toy, beam_size=40, max_decode_len=3, alpha=1.5,
                         length_penalty_form="power")
  for row in range(2):
    every = sorted(((sum(toy.logprobs(row, t[:i])[x] for i, x in enumerate(t))
                     / len(t) ** 1.5, padded(t, 3)) for t in toy.outputs(3)),
                   key=lambda item: -item[0])
    assert_n_best(tokens[row], scores[row], every)


def test_stopping_rules_stop_as_documented():
  # [3 EOS] and [4 EOS] finish at the second token, a third hypothesis at the third: the
  # finished set is full. [5 5 5 EOS] (0.2), the best under alpha = 2, needs one more.
  probs = [{(0, BOS_ID): {3: 0.5, 4: 0.3, 5: 0.2},
            (1, 3): {EOS_ID: 0.6, 4: 0.4}, (1, 4): {EOS_ID: 0.7, 3: 0.3},
            (1, 5): {5: 1.0}, (2, 5): {5: 1.0}, (3, 5): {EOS_ID: 1.0}}]
  toy = MarkovToy(probs, max_len=6)
  run = lambda stop: _beam(toy, beam_size=3, max_decode_len=6, alpha=2.0, early_stopping=stop)
  never_tokens, never_scores = run("never")
  true_tokens, _ = run(True)
  assert never_tokens[0, 0].tolist()[:4] == [5, 5, 5, EOS_ID]  # 0.2 / lp(4)^2 is the best
  np.testing.assert_allclose(never_scores[0, 0], math.log(0.2) / ((5 + 4) / 6) ** 2, rtol=1e-6)
  assert true_tokens[0, 0].tolist()[:2] == [3, EOS_ID]  # stops once three have finished


@pytest.mark.parametrize("groups, width, diversity, early_stopping", [
    (2, 4, 0.8, "never"), (3, 6, 2.0, True), (2, 4, 0.0, False), (4, 4, 1.5, "never"),
])
def test_diverse_groups_equal_the_reference(groups, width, diversity, early_stopping):
  toy = PrefixToy(seed=5, rows=4, max_len=7, eos_from=1, eos_boost=0.3, vocab=8)
  tokens, scores = _beam(toy, beam_size=width, max_decode_len=6, alpha=0.6,
                         num_beam_groups=groups, diversity_penalty=diversity,
                         early_stopping=early_stopping)
  _assert_equals_reference(toy, tokens, scores, width=width, max_len=6, alpha=0.6,
                           groups=groups, diversity=diversity, early_stopping=early_stopping)


def test_diverse_groups_with_a_prefix_equal_the_reference():
  toy = PrefixToy(seed=9, rows=3, max_len=7, eos_from=1, eos_boost=0.3, vocab=8)
  prefixes = [[4, 5], [], [6]]
  tokens, scores = _beam(toy, beam_size=4, max_decode_len=6, alpha=0.6, num_beam_groups=2,
                         diversity_penalty=1.0, prefix=prefixes)
  _assert_equals_reference(toy, tokens, scores, width=4, max_len=6, alpha=0.6, groups=2,
                           diversity=1.0, prefixes=prefixes)


def test_diversity_spreads_the_first_tokens():
  toy = PrefixToy(seed=2, rows=8, max_len=7, eos_from=2, eos_boost=0.0, vocab=12)
  plain, _ = _beam(toy, beam_size=4, max_decode_len=6, alpha=0.6)
  diverse, _ = _beam(toy, beam_size=4, max_decode_len=6, alpha=0.6, num_beam_groups=4,
                     diversity_penalty=50.0)
  # A penalty this large gives every group its own first token.
  assert all(len(set(row[:, 0].tolist())) == 4 for row in diverse)
  assert any(len(set(row[:, 0].tolist())) < 4 for row in plain)


def test_beam_options_are_checked():
  toy = PrefixToy(seed=0, rows=1, max_len=3)
  common = dict(batch_size=1, max_decode_len=3, alpha=0.6, bos_id=BOS_ID, eos_id=EOS_ID)
  for kwargs, message in [
      (dict(beam_size=4, num_beam_groups=3), "num_beam_groups=3 must be a positive divisor"),
      (dict(beam_size=4, diversity_penalty=1.0), "needs num_beam_groups > 1"),
      (dict(beam_size=4, early_stopping="always"), "early_stopping='always'"),
      (dict(beam_size=4, length_penalty_form="linear"), "length_penalty_form='linear'"),
      (dict(beam_size=2, rules=TokenRules(no_repeat_ngram_size=-1)), "no_repeat_ngram_size=-1"),
      (dict(beam_size=2, rules=TokenRules(repetition_penalty=0.0)), "repetition_penalty=0.0"),
  ]:
    with pytest.raises(ValueError, match=message):
      beam_search(toy.step_fn, toy.init_cache(), **common, **kwargs)
