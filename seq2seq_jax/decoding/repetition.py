"""Repetition control on a row's own history: n-gram blocking and the repetition penalty.

Both follow transformers' ``no_repeat_ngram_size`` and ``repetition_penalty`` (and
fairseq's n-gram blocking): the history a row is checked against is every token it
was fed, the decoder start included, so the two can be compared with
``generate`` there token for token.

``history_NT`` holds each row's fed tokens: column 0 the decoder start, column
``t + 1`` the token generated at step ``t``. At step ``step`` columns ``0 .. step``
are filled; later columns are ignored, whatever they hold.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from seq2seq_jax.types import Array


def _seen_columns(history_NT: Array, step: Array) -> Array:
  """``[1, T]`` bool: the columns filled at ``step``."""
  return jnp.arange(history_NT.shape[1])[None, :] <= step


def banned_ngram_tokens(history_NT: Array, step: Array, ngram_size: int, vocab: int) -> Array:
  """``[N, V]`` bool: the tokens that would repeat an n-gram already in each row's history.

  A token is banned when the last ``ngram_size - 1`` tokens followed by it occur
  earlier in the row. Nothing is banned before the history holds ``ngram_size - 1``
  tokens; with ``ngram_size`` 1 every token seen so far is banned.

  Example:
    >>> history = jnp.array([[1, 5, 6, 5, 0]])  # start, 5 6 5, then an unfilled column
    >>> banned_NV = banned_ngram_tokens(history, jnp.int32(3), 2, 8)  # 5 was once followed by 6
    >>> jnp.flatnonzero(banned_NV[0])
    Array([6], dtype=int32)
  """
  rows, columns = history_NT.shape
  n = ngram_size
  starts = columns - n + 1  # windows history[:, j : j + n]
  if starts <= 0:
    return jnp.zeros((rows, vocab), bool)
  j_J = jnp.arange(starts)
  # Window j's last token (column j + n - 1) must already be filled: j <= step - n + 1.
  match_NJ = jnp.broadcast_to(j_J[None, :] <= step - n + 1, (rows, starts))
  for k in range(n - 1):
    # Window column j + k against the current suffix's column step - n + 2 + k.
    suffix_N1 = jax.lax.dynamic_index_in_dim(history_NT, jnp.maximum(step - n + 2 + k, 0), axis=1)
    match_NJ = match_NJ & (history_NT[:, k:k + starts] == suffix_N1)
  following_NJ = history_NT[:, n - 1:n - 1 + starts]
  rows_NJ = jnp.broadcast_to(jnp.arange(rows)[:, None], following_NJ.shape)
  return jnp.zeros((rows, vocab), bool).at[rows_NJ, following_NJ].max(match_NJ, mode="drop")


def penalize_repeats(scores_NV: Array, history_NT: Array, step: Array, penalty: float) -> Array:
  """Scales down the scores of the tokens each row has already been fed.

  transformers' ``repetition_penalty`` (Keskar et al. 2019): a seen token's score
  is divided by ``penalty`` when positive and multiplied by it when negative, so a
  penalty above 1 makes it less likely either way. Applied to logits by greedy
  search and sampling, to log-probabilities by beam search, as there.

  Example:
    >>> penalize_repeats(jnp.array([[2.0, -1.0, 3.0]]), jnp.array([[0, 1]]), jnp.int32(1), 2.0)
    Array([[ 1., -2.,  3.]], dtype=float32)
  """
  rows, vocab = scores_NV.shape
  seen_NT = jnp.where(_seen_columns(history_NT, step), history_NT, vocab)  # vocab: dropped
  rows_NT = jnp.broadcast_to(jnp.arange(rows)[:, None], seen_NT.shape)
  seen_NV = jnp.zeros((rows, vocab), bool).at[rows_NT, seen_NT].set(True, mode="drop")
  penalized_NV = jnp.where(scores_NV < 0, scores_NV * penalty, scores_NV / penalty)
  return jnp.where(seen_NV, penalized_NV, scores_NV)

