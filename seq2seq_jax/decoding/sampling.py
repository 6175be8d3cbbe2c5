"""Ancestral sampling with temperature, top-k and nucleus (top-p) truncation."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from seq2seq_jax.decoding import selection
from seq2seq_jax.decoding.greedy import decode_one_token_at_a_time
from seq2seq_jax.decoding.step import StepFn, TokenRules
from seq2seq_jax.types import NEG_INF, PAD_ID, Array, PRNGKey, PyTree


def sample_logprobs(logprobs_NV: Array, *, rng: PRNGKey, temperature: float = 1.0,
                    top_k: int = 0, top_p: float = 1.0) -> Array:
  """Draws one token per row from truncated, tempered log-probabilities.

  Args:
    logprobs_NV: float32 log-probabilities (or logits).
    rng: PRNG key.
    temperature: divides the log-probabilities; 0 picks the argmax.
    top_k: keep only the k most probable tokens; 0 keeps all.
    top_p: then keep the smallest most-probable set whose (tempered, renormalised)
      probability reaches ``top_p``; 1.0 keeps all.

  Returns:
    int32 token ids ``[N]``.
  """
  if temperature == 0.0:
    return selection.argmax(logprobs_NV)
  scaled_NV = logprobs_NV / temperature
  vocab = scaled_NV.shape[-1]
  k = min(top_k, vocab) if top_k > 0 else (vocab if top_p < 1.0 else 0)
  if k == 0:
    return jax.random.categorical(rng, scaled_NV, axis=-1).astype(jnp.int32)
  # Sample among the k best, sorted descending; index back into the vocabulary.
  kept_NK, ids_NK = selection.top_k(scaled_NV, k)
  if top_p < 1.0:
    probs_NK = jax.nn.softmax(kept_NK, axis=-1)
    before_NK = jnp.cumsum(probs_NK, axis=-1) - probs_NK  # mass of the better tokens
    # The best token always stays (before = 0), so a row is never empty.
    kept_NK = jnp.where(before_NK < top_p, kept_NK, NEG_INF)
  choice_N = jax.random.categorical(rng, kept_NK, axis=-1)
  return jnp.take_along_axis(ids_NK, choice_N[:, None], axis=-1)[:, 0].astype(jnp.int32)


def sample(step_fn: StepFn, cache: PyTree, *, rng: PRNGKey, batch_size: int,
           max_decode_len: int, bos_id: int, eos_id: int, temperature: float = 1.0,
           top_k: int = 0, top_p: float = 1.0, pad_id: int = PAD_ID,
           rules: TokenRules = TokenRules(),
           target_prefix_BP: Array | None = None) -> tuple[Array, Array]:
  """Samples each next token from the model's (tempered, truncated) distribution.

  Traceable; call it under ``jax.jit``. ``temperature``, ``top_k`` and ``top_p``
  are Python numbers fixed at trace time.

  Args:
    step_fn: ``(tokens_B, cache) -> (logits_BV, cache)``, see ``StepFn``.
    cache: the model's initial cache; non-scalar leaves ``[B, ...]``.
    rng: PRNG key; step t draws with ``fold_in(rng, t)``.
    batch_size: B.
    max_decode_len: T, the most tokens generated per row (EOS included).
    bos_id: the token fed on the first step.
    eos_id: the token that ends a row.
    temperature: > 0 flattens (> 1) or sharpens (< 1) the distribution; 0 is greedy.
    top_k: sample among the k most probable tokens; 0 = all.
    top_p: nucleus sampling over the top-k set; 1.0 = off.
    pad_id, rules, target_prefix_BP: as ``greedy_search``.

  Returns:
    ``(tokens_BT, scores_B)`` as ``greedy_search``; scores are the log-probabilities
    of the drawn tokens before temperature and truncation (the model's own unless a
    repetition penalty changed them).

  Example:
    >>> step_fn = lambda tokens_N, cache: (jnp.zeros((4, 6)), cache)
    >>> tokens, _ = sample(step_fn, {}, rng=jax.random.key(0), batch_size=4,
    ...                    max_decode_len=5, bos_id=1, eos_id=2, top_k=3)
  """
  if temperature < 0:
    raise ValueError(f"temperature={temperature} must be >= 0 (0 means greedy)")
  if not isinstance(top_k, int) or top_k < 0:
    raise ValueError(f"top_k={top_k!r} must be an integer >= 0 (0 means off)")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p={top_p} must be in (0, 1]")

  def choose(logprobs_BV: Array, step_rng: PRNGKey | None) -> Array:
    assert step_rng is not None  # decode_one_token_at_a_time folds rng, never None here
    return sample_logprobs(logprobs_BV, rng=step_rng, temperature=temperature, top_k=top_k,
                           top_p=top_p)

  return decode_one_token_at_a_time(step_fn, cache, choose, rng=rng, batch_size=batch_size,
                                    max_decode_len=max_decode_len, bos_id=bos_id, eos_id=eos_id,
                                    pad_id=pad_id, rules=rules, target_prefix_BP=target_prefix_BP)
