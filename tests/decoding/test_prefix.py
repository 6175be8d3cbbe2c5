"""Target prefixes: kept in every output, not scored, and the rest searched as without them."""

import jax
import numpy as np
import pytest

from decoding_toys import PrefixToy, padded, run_jit
from seq2seq_jax.decoding import beam_search, greedy_search, sample
from seq2seq_jax.decoding.prefix import check_target_prefix, pad_target_prefix
from seq2seq_jax.decoding.step import TokenRules
from seq2seq_jax.types import BOS_ID, EOS_ID, NEG_INF, PAD_ID

T = 5
V = 7
PREFIXES = [[4, 4], [], [6], [5, 3, 6]]  # one row without a prefix


def _run(search, toy, prefix_BP, rules=TokenRules(), **kwargs):
  out = run_jit(search, toy.step_fn, toy.init_cache(), batch_size=toy.rows, max_decode_len=T,
                bos_id=BOS_ID, eos_id=EOS_ID, rules=rules, target_prefix_BP=prefix_BP,
                **kwargs)
  return np.asarray(out[0]), np.asarray(out[1])


SEARCHES = {
    "greedy": (greedy_search, {}),
    "beam": (beam_search, dict(beam_size=3, alpha=0.6)),
    "sample": (sample, dict(rng=jax.random.key(3))),
}


@pytest.mark.parametrize("method", list(SEARCHES))
@pytest.mark.parametrize("forced_bos", [None, 5])
def test_every_output_begins_with_its_prefix_and_other_rows_are_unchanged(method, forced_bos):
  toy = PrefixToy(seed=2, rows=4, max_len=T + 1, eos_from=1, eos_boost=1.0, vocab=V)
  search, kwargs = SEARCHES[method]
  rules = TokenRules(forced_bos_id=forced_bos)
  tokens, scores = _run(search, toy, pad_target_prefix(PREFIXES), rules, **kwargs)
  plain, plain_scores = _run(search, toy, None, rules, **kwargs)
  offset = int(forced_bos is not None)
  for row, prefix in enumerate(PREFIXES):
    outputs = tokens[row] if method == "beam" else tokens[row][None]
    for output in outputs:
      assert list(output[offset:offset + len(prefix)]) == prefix, (row, output)
      if forced_bos is not None:
        assert output[0] == forced_bos
  # The row without a prefix decodes exactly as without the option.
  np.testing.assert_array_equal(tokens[1], plain[1])
  np.testing.assert_allclose(scores[1], plain_scores[1], rtol=1e-6)
  assert not np.array_equal(tokens[0], plain[0])


def _logprob(toy, row, tokens, start):
  """Log-probability of ``tokens[start:]`` given the tokens before them."""
  return sum(toy.logprobs(row, tuple(tokens[:i]))[t] for i, t in enumerate(tokens) if i >= start)


def test_greedy_forces_the_prefix_then_takes_the_argmax():
  toy = PrefixToy(seed=5, rows=4, max_len=T + 1, eos_from=2, eos_boost=0.5, vocab=V)
  tokens, scores = _run(greedy_search, toy, pad_target_prefix(PREFIXES))
  for row, prefix in enumerate(PREFIXES):
    out = list(prefix)
    while len(out) < T:
      logprobs = toy.logprobs(row, tuple(out))
      logprobs[[PAD_ID, BOS_ID]] = NEG_INF
      out.append(int(np.argmax(logprobs)))
      if out[-1] == EOS_ID:
        break
    assert tuple(tokens[row]) == padded(out, T)
    np.testing.assert_allclose(scores[row], _logprob(toy, row, out, len(prefix)), rtol=1e-5)


@pytest.mark.parametrize("alpha, forced_bos", [(0.0, None), (1.0, None), (0.6, 3)])
def test_a_wide_beam_is_exhaustive_search_after_the_prefix(alpha, forced_bos):
  # Scores count the tokens after the prefix, and so does the length penalty; a forced
  # first token adds 0 but counts in the length (transformers' forced_bos_token_id).
  toy = PrefixToy(seed=8, rows=4, max_len=T + 1, eos_from=0, eos_boost=0.5, vocab=V)
  rules = TokenRules(forced_bos_id=forced_bos)
  tokens, scores = _run(beam_search, toy, pad_target_prefix(PREFIXES), rules, beam_size=30,
                        alpha=alpha)
  offset = int(forced_bos is not None)
  for row, prefix in enumerate(PREFIXES):
    head = ([forced_bos] if offset else []) + prefix
    every = []
    for tokens_out in toy.outputs(T):
      if list(tokens_out[:len(head)]) != head or (EOS_ID in tokens_out[:len(head)]):
        continue
      if len(tokens_out) == len(head):  # the prefix alone: nothing generated
        continue
      total = _logprob(toy, row, tokens_out, len(head))
      generated = len(tokens_out) - len(prefix)
      every.append((total / ((5.0 + generated) / 6.0) ** alpha, padded(tokens_out, T)))
    every.sort(key=lambda item: -item[0])
    width = min(30, len(every))
    np.testing.assert_allclose(scores[row, :width], [s for s, _ in every[:width]], rtol=1e-5,
                               atol=1e-5)
    assert tuple(tokens[row, 0]) == every[0][1]


def test_prefixes_are_checked_naming_the_row():
  prefix = pad_target_prefix([[4, 5], [6]])
  check_target_prefix(prefix, batch_size=2, pad_id=PAD_ID, max_decode_len=3, offset=0)
  with pytest.raises(ValueError, match="row 0 has 2 tokens.*raise max_decode_len above 2"):
    check_target_prefix(prefix, batch_size=2, pad_id=PAD_ID, max_decode_len=2, offset=0)
  with pytest.raises(ValueError, match="row 1 .* may only follow the prefix"):
    check_target_prefix(np.array([[4, 5], [0, 6]]), batch_size=2, pad_id=PAD_ID,
                        max_decode_len=5, offset=0)
  with pytest.raises(ValueError, match=r"row 0 holds ids \[2\]"):
    check_target_prefix(np.array([[4, EOS_ID]]), batch_size=1, pad_id=PAD_ID, max_decode_len=5,
                        offset=0, eos_id=EOS_ID)
  with pytest.raises(ValueError, match=r"\[B=3, P\]"):
    check_target_prefix(prefix, batch_size=3, pad_id=PAD_ID, max_decode_len=5, offset=0)
