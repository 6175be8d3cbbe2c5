"""Lexical constraints: every output contains its row's phrases; a wide beam equals exhaustive
search over the outputs that do; rows without constraints decode as plain beam search."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from decoding_toys import PrefixToy, assert_n_best, padded, run_jit
from seq2seq_jax.decoding import beam_search
from seq2seq_jax.decoding import constraints as constraints_lib
from seq2seq_jax.decoding.prefix import pad_target_prefix
from seq2seq_jax.decoding.step import TokenRules
from seq2seq_jax.types import BOS_ID, EOS_ID, NEG_INF, PAD_ID

V = 7  # words 3..6


def contains(tokens, phrase):
  tokens, phrase = list(tokens), list(phrase)
  return any(tokens[i:i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


def _beam(toy, constraints_BCL, *, beam_size, max_decode_len, alpha=0.6, **kwargs):
  out = run_jit(beam_search, toy.step_fn, toy.init_cache(), batch_size=toy.rows,
                beam_size=beam_size, max_decode_len=max_decode_len, alpha=alpha, bos_id=BOS_ID,
                eos_id=EOS_ID, constraints_BCL=constraints_BCL, **kwargs)
  return np.asarray(out[0]), np.asarray(out[1])


# Helpers ------------------------------------------------------------------------

def test_advance_tracks_phrases_as_a_python_matcher():
  # Self-overlapping [3, 3, 4], [4, 5] and a one-token phrase, over random outputs.
  phrases = [[3, 3, 4], [4, 5], [6]]
  constraints_BCL = jnp.asarray(constraints_lib.pad_constraints([phrases]))
  rng = np.random.default_rng(0)
  for _ in range(20):
    output = rng.integers(3, 7, size=9).tolist()
    met_1KC = jnp.zeros((1, 1, 3), bool)
    for t in range(len(output)):
      tail = ([-1] * 3 + output[:t + 1])[-3:]
      met_1KC, progress_1KC, bank_1K = constraints_lib.advance(
          jnp.asarray([[tail]], jnp.int32), met_1KC, constraints_BCL, pad_id=PAD_ID)
      so_far = output[:t + 1]
      expected_met = [contains(so_far, p) for p in phrases]
      expected_progress = [0 if m else max(
          [k for k in range(1, len(p)) if so_far[len(so_far) - k:] == p[:k]], default=0)
          for p, m in zip(phrases, expected_met)]
      assert np.asarray(met_1KC)[0, 0].tolist() == expected_met, (output, t)
      assert np.asarray(progress_1KC)[0, 0].tolist() == expected_progress, (output, t)
      assert int(bank_1K[0, 0]) == sum(len(p) if m else k for p, m, k in
                                       zip(phrases, expected_met, expected_progress))


def test_allocate_fills_slots_round_robin_over_banks():
  scores = jnp.array([[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]])
  bank = jnp.array([[0, 0, 2, 1, 2, 0]])
  eligible = jnp.array([[True, True, True, True, True, False]])
  picks = constraints_lib.allocate(scores, bank, eligible, width=5, max_bank=2)
  # Best of bank 2, of bank 1, of bank 0; then the second of bank 2, of bank 0.
  np.testing.assert_array_equal(picks, [[2, 3, 0, 4, 1]])


def test_constraints_are_padded_and_checked_naming_row_and_phrase():
  padded_BCL = constraints_lib.pad_constraints([[[4, 5], [6]], []], num_phrases=3, phrase_len=4)
  assert padded_BCL.shape == (2, 3, 4) and padded_BCL[0, 0].tolist() == [4, 5, 0, 0]
  check = lambda c, **kw: constraints_lib.check_constraints(
      c, batch_size=2, pad_id=PAD_ID, **{"max_decode_len": 5, "eos_id": EOS_ID, **kw})
  check(padded_BCL)
  with pytest.raises(ValueError, match="row 0: its phrases have 3 tokens but only 2"):
    check(padded_BCL, max_decode_len=3, forced_before=np.array([1, 0]))
  with pytest.raises(ValueError, match=r"row 1, phrase 0 holds ids \[1\]"):
    check(constraints_lib.pad_constraints([[[4]], [[BOS_ID, 5]]]), never=(PAD_ID, BOS_ID))
  with pytest.raises(ValueError, match=r"row 0, phrase 1 = .*\(left-align"):
    check(np.array([[[4, 5], [0, 6]], [[0, 0], [0, 0]]]))
  with pytest.raises(ValueError, match="phrase 0 is empty"):
    constraints_lib.pad_constraints([[[]]])


# Searches -------------------------------------------------------------------------

CONSTRAINTS = [[[5, 6], [3]], [[4, 4]], [], [[6, 3, 6]]]


@pytest.mark.parametrize("seed, early_stopping", [(0, "never"), (1, "never"), (2, True),
                                                   (3, False)])
@pytest.mark.parametrize("beam_size", [1, 2, 4])
def test_every_output_contains_every_phrase(seed, beam_size, early_stopping):
  # EOS is likely early: without constraints most outputs are too short to hold them.
  # transformers' stopping rules must not starve the constrained hypotheses either.
  toy = PrefixToy(seed=seed, rows=4, max_len=9, eos_from=1, eos_boost=2.0, vocab=V)
  tokens, scores = _beam(toy, constraints_lib.pad_constraints(CONSTRAINTS), beam_size=beam_size,
                         max_decode_len=8, early_stopping=early_stopping)
  plain, _ = _beam(toy, None, beam_size=beam_size, max_decode_len=8,
                   early_stopping=early_stopping)
  assert not all(contains(row, p) for row, c in zip(plain[:, 0], CONSTRAINTS) for p in c)
  for row, phrases in enumerate(CONSTRAINTS):
    real = scores[row] > 0.5 * NEG_INF
    assert real[0], f"row {row} found no output"
    for output in tokens[row][real]:
      assert all(contains(output, p) for p in phrases), (row, output)
      assert EOS_ID not in output or list(output).index(EOS_ID) == len(
          [t for t in output if t != PAD_ID]) - 1
  # The row without constraints decodes exactly as plain beam search.
  np.testing.assert_array_equal(tokens[2], plain[2])


def _logprob(toy, row, tokens):
  return sum(toy.logprobs(row, tuple(tokens[:i]))[t] for i, t in enumerate(tokens))


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_wide_beam_is_exhaustive_search_over_satisfying_outputs(alpha):
  # 4 words and EOS, 4 tokens: the last step expands 4^3 live prefixes into 320 candidates,
  # all of them among the 2W best with W = 160.
  constraints = [[[5, 6], [3]], [[4, 4]], [[6]], [[3, 5, 3]]]
  toy = PrefixToy(seed=3, rows=4, max_len=5, eos_from=0, eos_boost=1.5, vocab=V)
  tokens, scores = _beam(toy, constraints_lib.pad_constraints(constraints), beam_size=160,
                         max_decode_len=4, alpha=alpha)
  for row, phrases in enumerate(constraints):
    every = sorted(((_logprob(toy, row, t) / ((5.0 + len(t)) / 6.0) ** alpha, padded(t, 4))
                    for t in toy.outputs(4) if all(contains(t, p) for p in phrases)),
                   key=lambda item: -item[0])
    assert_n_best(tokens[row], scores[row], every)


def test_phrases_can_be_met_inside_the_prefix_and_across_it():
  toy = PrefixToy(seed=6, rows=2, max_len=8, eos_from=1, eos_boost=2.0, vocab=V)
  prefix = pad_target_prefix([[5, 6], [4]])
  constraints = [[[5, 6]], [[4, 3, 3]]]
  tokens, _ = _beam(toy, constraints_lib.pad_constraints(constraints), beam_size=2,
                    max_decode_len=7, target_prefix_BP=prefix)
  assert tokens[0, 0, :2].tolist() == [5, 6]
  assert tokens[1, 0, 0] == 4 and contains(tokens[1, 0], [4, 3, 3])
  # Row 0's only phrase is the prefix: it may end right after it.
  plain, _ = _beam(toy, None, beam_size=2, max_decode_len=7, target_prefix_BP=prefix)
  np.testing.assert_array_equal(tokens[0], plain[0])


def test_rows_whose_phrases_cannot_fit_return_empty_slots():
  toy = PrefixToy(seed=1, rows=1, max_len=4, eos_from=0, vocab=V)
  tokens, scores = _beam(toy, constraints_lib.pad_constraints([[[3, 4], [5, 6]]]),
                         beam_size=2, max_decode_len=3,
                         rules=TokenRules(force_eos_at_limit=True))
  assert np.all(scores == NEG_INF) and np.all(tokens == PAD_ID)
