"""A decoder written outside the library in plain JAX, searched by the library's greedy and
beam search through the step-function contract, against an exhaustive search in NumPy."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import seq2seq_jax as s2s

PAD, BOS, EOS = 0, 1, 2
V, D, B, T = 5, 7, 3, 4  # ids 3 and 4 are the words


def _weights(seed: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {"embed_VD": rng.normal(size=(V, D)) * 1.5, "w_DD": rng.normal(size=(D, D)) * 0.6,
          "u_DD": rng.normal(size=(D, D)) * 0.6, "out_DV": rng.normal(size=(D, V)) * 1.5}


def _memory(seed: int) -> np.ndarray:
  return np.random.default_rng(seed + 100).normal(size=(B, D))


# --- the other project's decoder: a tanh RNN over a source vector, a few lines of JAX --------
def make_step_fn(weights, memory_ND):
  def step_fn(tokens_N, cache):
    h_ND = jnp.tanh(weights["embed_VD"][tokens_N] + cache["h_ND"] @ weights["w_DD"]
                    + memory_ND @ weights["u_DD"])
    return h_ND @ weights["out_DV"], {"h_ND": h_ND, "steps": cache["steps"] + 1}
  return step_fn


def initial_cache(rows: int) -> dict:
  return {"h_ND": jnp.zeros((rows, D), jnp.float32), "steps": jnp.zeros((), jnp.int32)}


# --- an independent reference: float64 NumPy, every output enumerated --------------------
def _logprobs(weights, memory_D, prefix) -> np.ndarray:
  """Next-token log-probabilities after BOS + prefix, PAD and BOS excluded (never emitted)."""
  h = np.zeros(D)
  for token in [BOS, *prefix]:
    h = np.tanh(weights["embed_VD"][token] + h @ weights["w_DD"] + memory_D @ weights["u_DD"])
  logits = h @ weights["out_DV"]
  logprobs = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
  logprobs[[PAD, BOS]] = -np.inf
  return logprobs


def _all_outputs():
  """Every output of at most T tokens: words then EOS, or T words (cut at the limit)."""
  words = [3, 4]
  for length in range(T):
    for body in itertools.product(words, repeat=length):
      yield (*body, EOS)
  yield from itertools.product(words, repeat=T)


def _exhaustive_nbest(weights, memory_D, alpha: float, n: int):
  scored = []
  for output in _all_outputs():
    logprob = sum(_logprobs(weights, memory_D, output[:i])[token]
                  for i, token in enumerate(output))
    scored.append((logprob / ((5 + len(output)) / 6) ** alpha, output))
  scored.sort(key=lambda pair: -pair[0])
  return scored[:n]


def _greedy_reference(weights, memory_D):
  output, total = [], 0.0
  while len(output) < T and (not output or output[-1] != EOS):
    logprobs = _logprobs(weights, memory_D, output)
    output.append(int(np.argmax(logprobs)))
    total += logprobs[output[-1]]
  return tuple(output), total


def _padded(output) -> list[int]:
  return list(output) + [PAD] * (T - len(output))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_search_matches_a_python_loop(seed):
  weights, memory = _weights(seed), _memory(seed)
  step_fn = make_step_fn(jax.tree.map(jnp.float32, weights), jnp.float32(memory))
  tokens_BT, scores_B = jax.jit(lambda cache: s2s.greedy_search(
      step_fn, cache, batch_size=B, max_decode_len=T, bos_id=BOS, eos_id=EOS))(initial_cache(B))
  for row in range(B):
    output, total = _greedy_reference(weights, memory[row])
    assert tokens_BT[row].tolist() == _padded(output)
    np.testing.assert_allclose(scores_B[row], total, rtol=1e-5)


@pytest.mark.parametrize("seed,alpha", [(0, 0.0), (1, 0.6), (2, 1.0)])
def test_beam_as_wide_as_the_search_space_is_exhaustive_search(seed, alpha):
  weights, memory = _weights(seed), _memory(seed)
  width = 2 ** T  # more than the live prefixes of any step: nothing is pruned
  # Memory is closed over by the step function: the caller tiles it to B * W rows.
  step_fn = make_step_fn(jax.tree.map(jnp.float32, weights),
                         s2s.expand_to_beams(jnp.float32(memory), width))
  tokens_BWT, scores_BW = jax.jit(lambda cache: s2s.beam_search(
      step_fn, cache, batch_size=B, beam_size=width, max_decode_len=T, alpha=alpha,
      bos_id=BOS, eos_id=EOS))(initial_cache(B))
  for row in range(B):
    expected = _exhaustive_nbest(weights, memory[row], alpha, n=width)
    assert [tokens_BWT[row, w].tolist() for w in range(width)] == [
        _padded(output) for _, output in expected]
    np.testing.assert_allclose(scores_BW[row], [score for score, _ in expected], rtol=1e-5)


def test_narrow_beam_finds_the_best_output_here_and_rows_are_independent():
  weights, memory = _weights(3), _memory(3)
  step_fn = make_step_fn(jax.tree.map(jnp.float32, weights),
                         s2s.expand_to_beams(jnp.float32(memory), 2))
  tokens_BWT, _ = s2s.beam_search(step_fn, initial_cache(B), batch_size=B, beam_size=2,
                                  max_decode_len=T, alpha=0.0, bos_id=BOS, eos_id=EOS)
  bests = [_exhaustive_nbest(weights, memory[row], 0.0, n=1)[0][1] for row in range(B)]
  assert [tokens_BWT[row, 0].tolist() for row in range(B)] == [_padded(b) for b in bests]
  assert len(set(bests)) > 1  # the rows' memories lead to different outputs
