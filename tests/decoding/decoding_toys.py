"""Toy step functions with hand-set or seeded logits, and numpy mirrors to check against.

Two toys follow the ``StepFn`` contract, both with a per-row cache leaf (so beam
reordering has something to get wrong) and a shared scalar position:

- ``MarkovToy``: logits looked up by (memory row, position, previous token);
  probabilities are set by hand, so expected sequences and scores are exact.
- ``PrefixToy``: logits looked up by a hash of (memory row, whole prefix), with
  the prefix kept in a ``[N, L, T + 1]`` cache leaf, like a layer-stacked cache.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.types import BOS_ID, EOS_ID, NEG_INF, PAD_ID

V = 6  # PAD 0, BOS 1, EOS 2, and three word tokens 3, 4, 5
WORDS = (3, 4, 5)


class MarkovToy:
  """``probs[row][(position, previous token)] = {token: probability}``; unset = uniform.

  Unset (position, previous) pairs get a uniform distribution over EOS and the
  words. Unlisted tokens of a set distribution have probability 0 (logit NEG_INF),
  as have PAD and BOS everywhere, so log-softmax returns exactly log(probability).
  """

  def __init__(self, probs: list[dict], max_len: int):
    table = np.full((len(probs), max_len, V, V), NEG_INF, np.float32)
    table[..., EOS_ID:] = -math.log(V - 2)
    for row, spec in enumerate(probs):
      for (position, previous), dist in spec.items():
        assert abs(sum(dist.values()) - 1.0) < 1e-6, dist
        table[row, position, previous, :] = NEG_INF
        for token, p in dist.items():
          if p > 0:
            table[row, position, previous, token] = math.log(p)
    self.table = jnp.asarray(table)

  def init_cache(self, rows=None):
    rows = np.arange(self.table.shape[0]) if rows is None else np.asarray(rows)
    return {"index": jnp.zeros((), jnp.int32), "row": jnp.asarray(rows, jnp.int32)}

  def step_fn(self, tokens_N, cache):
    logits_NV = self.table[cache["row"], cache["index"], tokens_N]
    return logits_NV, {"index": cache["index"] + 1, "row": cache["row"]}


class PrefixToy:
  """Seeded logits that depend on the memory row and the whole prefix.

  ``eos_from``: EOS gets logit NEG_INF before this position (None: never possible),
  and ``eos_boost`` is added to it from there on.
  """

  modulus = 251

  def __init__(self, *, seed: int, rows: int, max_len: int, eos_from: int | None = 0,
               eos_boost: float = 0.0, vocab: int = V):
    rng = np.random.default_rng(seed)
    self.vocab = vocab
    self.max_len = max_len
    self.rows = rows
    self.logits = (2.0 * rng.standard_normal((self.modulus, vocab))).astype(np.float32)
    self.weights = rng.integers(1, self.modulus, size=max_len + 1).astype(np.int32)
    self.eos_from = eos_from
    self.eos_boost = eos_boost

  def init_cache(self, rows=None):
    rows = np.arange(self.rows) if rows is None else np.asarray(rows)
    history = np.full((len(rows), 2, self.max_len + 1), PAD_ID, np.int32)
    return {"index": jnp.zeros((), jnp.int32), "history": jnp.asarray(history),
            "row": jnp.asarray(rows, jnp.int32)}

  def _eos_logit(self, index):
    if self.eos_from is None:
      return jnp.asarray(NEG_INF, jnp.float32)
    return jnp.where(index < self.eos_from, NEG_INF, self.eos_boost).astype(jnp.float32)

  def step_fn(self, tokens_N, cache):
    index = cache["index"]
    # Layer 0 keeps the fed tokens, layer 1 the same + 7: both must follow the beams.
    history = cache["history"].at[:, 0, index].set(tokens_N).at[:, 1, index].set(tokens_N + 7)
    layer1_NT = jnp.where(history[:, 1, :] > 0, history[:, 1, :] - 7, 0)
    hashed_N = (cache["row"] * 97
                + jnp.sum(history[:, 0, :] * jnp.asarray(self.weights)[None], axis=-1)
                + 3 * jnp.sum(layer1_NT, axis=-1))
    logits_NV = jnp.asarray(self.logits)[hashed_N % self.modulus]
    eos = self._eos_logit(index)
    logits_NV = logits_NV.at[:, EOS_ID].add(eos)
    return logits_NV, {"index": index + 1, "history": history, "row": cache["row"]}

  # numpy mirror ------------------------------------------------------------
  def next_logits(self, row: int, prefix: tuple[int, ...]) -> np.ndarray:
    """float64 logits of the next token after ``prefix`` (BOS excluded), as ``step_fn``."""
    fed = (BOS_ID,) + tuple(prefix)
    hashed = (row * 97 + sum(int(t) * int(w) for t, w in zip(fed, self.weights))
              + 3 * sum(fed))
    logits = self.logits[hashed % self.modulus].astype(np.float64)
    position = len(prefix)
    if self.eos_from is None or position < self.eos_from:
      logits[EOS_ID] += NEG_INF
    else:
      logits[EOS_ID] += self.eos_boost
    return logits

  def logprobs(self, row: int, prefix: tuple[int, ...]) -> np.ndarray:
    """float64 log-probabilities of the next token after ``prefix`` (BOS excluded)."""
    return log_softmax(self.next_logits(row, prefix))

  def outputs(self, max_decode_len: int):
    """Every token sequence a decoder may produce: words then EOS within ``max_decode_len``
    tokens, or ``max_decode_len`` words. PAD and BOS are never generated."""
    for length in range(max_decode_len + 1):
      for words in itertools.product(range(EOS_ID + 1, self.vocab), repeat=length):
        tokens = words + ((EOS_ID,) if length < max_decode_len else ())
        if tokens:
          yield tokens

  def enumerate(self, row: int, max_decode_len: int, alpha: float):
    """Every output a decoder may produce, scored: [(score, tokens padded to T)], best first.

    Outputs are word sequences ended by EOS within ``max_decode_len`` tokens, or
    ``max_decode_len`` words without EOS. PAD and BOS are never generated.
    """
    outputs = []
    for length in range(max_decode_len + 1):
      for words in itertools.product(range(EOS_ID + 1, self.vocab), repeat=length):
        ends = (EOS_ID,) if length < max_decode_len else ()
        tokens = words + ends
        if not tokens:
          continue
        total = sum(self.logprobs(row, tokens[:i])[t] for i, t in enumerate(tokens))
        if total < 0.5 * NEG_INF:
          continue
        score = total / ((5.0 + len(tokens)) / 6.0) ** alpha
        outputs.append((score, tokens + (PAD_ID,) * (max_decode_len - len(tokens))))
    outputs.sort(key=lambda item: -item[0])
    return outputs


def log_softmax(x: np.ndarray) -> np.ndarray:
  shifted = x - x.max()
  return shifted - np.log(np.exp(shifted).sum())


def padded(tokens, length: int, pad_id: int = PAD_ID) -> tuple[int, ...]:
  return tuple(tokens) + (pad_id,) * (length - len(tokens))


def assert_n_best(tokens_WT, scores_W, every):
  """The W outputs are the W best of ``every`` [(score, tokens)] (best first), ties in any
  order: their scores are the best W scores and each is its output's true score."""
  width = len(scores_W)
  real = scores_W > 0.5 * NEG_INF
  assert real.sum() == min(width, len(every))
  np.testing.assert_allclose(scores_W[real], [s for s, _ in every[:width]], rtol=1e-5)
  truth = {tokens: score for score, tokens in every}
  returned = [tuple(int(t) for t in row) for row in tokens_WT[real]]
  assert len(set(returned)) == len(returned)
  for tokens, score in zip(returned, scores_W[real]):
    np.testing.assert_allclose(truth[tokens], score, rtol=1e-5)


def run_jit(search, step_fn, cache, **kwargs):
  """Runs a search under jit, as generate does: cache, rng and array arguments (a target
  prefix, constraints) traced, the rest static.

  The jitted function is reused for the same search, step function and settings, so
  a test that decodes the same toy several times compiles once per shape.
  """
  rng = kwargs.pop("rng", None)
  arrays = {k: v for k, v in kwargs.items() if isinstance(v, (np.ndarray, jax.Array))}
  static = {k: v for k, v in kwargs.items() if k not in arrays}
  jitted = _jitted_search(search, step_fn, tuple(sorted(static.items())))
  return jitted(cache, rng, arrays)


@functools.lru_cache(maxsize=None)
def _jitted_search(search, step_fn, settings):
  def run(cache, rng, arrays):
    extra = {} if rng is None else {"rng": rng}
    return search(step_fn, cache, **extra, **arrays, **dict(settings))
  return jax.jit(run)
