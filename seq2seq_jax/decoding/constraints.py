"""Lexical constraints: phrases every output must contain, by dynamic beam allocation.

Constraints travel with the batch as ``constraints_BCL``, int ``[B, C, L]``: up to C
phrases per row, each up to L token ids left-aligned then the model's pad id (an
all-pad phrase is no constraint). Beam search then returns only outputs that
contain every phrase of their row as a contiguous run of tokens.

The search is grid beam search (Hokamp & Liu 2017) with dynamic beam allocation
(Post & Vilar 2018) in the vectorized form of Hu et al. (2019): each step, the
candidates are the 2W best expansions, every live beam's next token for each
phrase it has not yet finished, and each live beam's best token; each candidate's
*bank* is the number of constraint tokens it has met (a phrase in progress counts
its matched tokens); the W live slots are filled round-robin over the banks, best
first within each, so hypotheses that met more constraints keep a place although
their score is lower. EOS (and finishing at the length limit) is allowed only once
every phrase of the row has appeared. With a beam as wide as the search space the
result is exhaustive search over the outputs that satisfy the constraints.

Per hypothesis the search keeps which phrases have appeared (``met``) and, per
phrase, the longest suffix of the output that begins it (``progress``, the state
of a Knuth-Morris-Pratt matcher, recomputed from the last L tokens), so phrases
may overlap each other or themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.types import NEG_INF, PAD_ID, Array, ArrayLike


def pad_constraints(constraints: Sequence[Sequence[Sequence[int]]], *, pad_id: int = PAD_ID,
                    num_phrases: int | None = None,
                    phrase_len: int | None = None) -> np.ndarray:
  """int32 ``[B, C, L]``: each row's phrases, token ids left-aligned, padded with ``pad_id``.

  Args:
    constraints: per sentence, a list of phrases, each a list of token ids (an
      empty list of phrases constrains nothing).
    pad_id: the model's pad id.
    num_phrases: C; default the most phrases of a row (at least 1).
    phrase_len: L; default the longest phrase (at least 1). Round C and L up to a
      few sizes so that batches of different constraints compile once.

  Example:
    >>> pad_constraints([[[5, 6], [7]], []])[0]
    array([[5, 6],
           [7, 0]], dtype=int32)
  """
  most = max((len(row) for row in constraints), default=0)
  longest = max((len(phrase) for row in constraints for phrase in row), default=0)
  num_phrases = max(most, 1) if num_phrases is None else num_phrases
  phrase_len = max(longest, 1) if phrase_len is None else phrase_len
  if most > num_phrases or longest > phrase_len:
    raise ValueError(f"constraints need num_phrases >= {most} and phrase_len >= {longest}; "
                     f"got {num_phrases} and {phrase_len}")
  out = np.full((len(constraints), num_phrases, phrase_len), pad_id, np.int32)
  for row, phrases in enumerate(constraints):
    for c, phrase in enumerate(phrases):
      if not len(phrase):
        raise ValueError(f"constraints row {row}, phrase {c} is empty; leave it out")
      out[row, c, :len(phrase)] = np.asarray(phrase, np.int32)
  return out


def check_constraints(constraints_BCL: ArrayLike, *, batch_size: int, pad_id: int,
                      max_decode_len: int, forced_before: np.ndarray | int = 0,
                      never: Sequence[int] = (), eos_id: int | None = None,
                      eos_at_limit: bool = False) -> np.ndarray:
  """Checks a concrete constraints array on the host; returns it as int32 numpy.

  Raises ``ValueError`` naming the row and phrase for a wrong shape, a pad id inside
  a phrase, an id that is never generated (``never``) or EOS, and phrases too long
  to fit: every row's phrases together, after the ``forced_before`` tokens (a
  forced first token and the prefix, per row), must fit in ``max_decode_len``
  (less one when EOS is forced at the limit).
  """
  constraints = np.asarray(constraints_BCL)
  if (constraints.ndim != 3 or constraints.shape[0] != batch_size
      or not np.issubdtype(constraints.dtype, np.integer)):
    raise ValueError(f"constraints must be integer ids [B={batch_size}, C, L]; got "
                     f"{constraints.dtype} {constraints.shape}")
  constraints = constraints.astype(np.int32)
  forced = np.broadcast_to(np.asarray(forced_before), (batch_size,))
  forbidden = set(never) | ({eos_id} - {None})
  for row in range(batch_size):
    total = 0
    for c, phrase in enumerate(constraints[row]):
      length = int(np.sum(phrase != pad_id))
      if np.any(phrase[:length] == pad_id):
        raise ValueError(f"constraints row {row}, phrase {c} = {phrase.tolist()}: the pad id "
                         f"{pad_id} may only follow the phrase (left-align its tokens)")
      bad = sorted(set(phrase[:length].tolist()) & forbidden)
      if bad:
        raise ValueError(f"constraints row {row}, phrase {c} holds ids {bad} that are never "
                         "generated (pad, decoder start, suppressed ids, EOS); no output can "
                         "contain it")
      total += length
    room = max_decode_len - int(forced[row]) - int(eos_at_limit)
    if total > room:
      raise ValueError(f"constraints row {row}: its phrases have {total} tokens but only "
                       f"{room} can be generated (max_decode_len={max_decode_len}); raise "
                       "max_decode_len or drop phrases")
  return constraints


def phrase_lengths(constraints_BCL: Array, pad_id: int) -> Array:
  """int32 ``[B, C]``: tokens per phrase (0 for an empty slot)."""
  return jnp.sum(constraints_BCL != pad_id, axis=-1, dtype=jnp.int32)


def initial_state(constraints_BCL: Array, *, pad_id: int, width: int) -> tuple[Array, Array]:
  """``(met_BWC, progress_BWC)`` of W fresh beams: only empty slots are met."""
  lengths_BC = phrase_lengths(constraints_BCL, pad_id)
  met_BWC = jnp.broadcast_to((lengths_BC == 0)[:, None, :], (lengths_BC.shape[0], width,
                                                             lengths_BC.shape[1]))
  return met_BWC, jnp.zeros(met_BWC.shape, jnp.int32)


def advance(tails_BKL: Array, met_BKC: Array, constraints_BCL: Array, *,
            pad_id: int) -> tuple[Array, Array, Array]:
  """The constraint state after a token, from the last L tokens of each candidate.

  Args:
    tails_BKL: the last L tokens of each of K candidate outputs, the new token
      last; -1 where the output is shorter.
    met_BKC: which phrases each candidate's parent had already produced.
    constraints_BCL: the row's phrases.
    pad_id: the pad id that ends a phrase.

  Returns:
    ``(met_BKC, progress_BKC, bank_BK)``: phrases produced, per unmet phrase the
    length of the longest suffix that begins it (0 for met ones), and the bank:
    the tokens of met phrases plus the progress of unmet ones.
  """
  length = constraints_BCL.shape[-1]
  lengths_BC = phrase_lengths(constraints_BCL, pad_id)
  # match_k: the last k tokens equal the phrase's first k, for k = 1..L.
  matches = []
  for k in range(1, length + 1):
    equal_BKCk = tails_BKL[:, :, None, length - k:] == constraints_BCL[:, None, :, :k]
    matches.append(jnp.all(equal_BKCk, axis=-1))
  match_BKCL = jnp.stack(matches, axis=-1)
  sizes_111L = jnp.arange(1, length + 1)[None, None, None, :]
  lengths_B1C1 = lengths_BC[:, None, :, None]
  full_BKC = jnp.any(match_BKCL & (sizes_111L == lengths_B1C1), axis=-1)
  met_BKC = met_BKC | full_BKC
  progress_BKC = jnp.max(jnp.where(match_BKCL & (sizes_111L < lengths_B1C1), sizes_111L, 0),
                         axis=-1)
  progress_BKC = jnp.where(met_BKC, 0, progress_BKC).astype(jnp.int32)
  bank_BK = jnp.sum(jnp.where(met_BKC, lengths_BC[:, None, :], progress_BKC), axis=-1)
  return met_BKC, progress_BKC, bank_BK


def candidate_pool(candidates_BWV: Array, *, met_BWC: Array, progress_BWC: Array,
                   constraints_BCL: Array, pad_id: int, top_BK: tuple[Array, Array],
                   best_BW: Array) -> tuple[Array, Array]:
  """Flat candidate ids ``w * V + token`` and their scores, ``[B, K]``, K = 2W + W*C + W.

  The given top expansions (``top_BK``: scores and flat ids, best first), then each
  beam's next token of every unmet phrase, then each beam's best token
  (``best_BW``), the last only in rows that have constraints. Repeats of an
  earlier candidate and unusable entries get score ``2 * NEG_INF`` and a distinct
  negative id.
  """
  batch, width, vocab = candidates_BWV.shape
  flat_BM = candidates_BWV.reshape(batch, width * vocab)
  top_scores_BA, top_ids_BA = top_BK
  lengths_BC = phrase_lengths(constraints_BCL, pad_id)
  # Each beam's next token of each phrase (its progress < its length when unmet).
  position_BWC = jnp.minimum(progress_BWC, constraints_BCL.shape[-1] - 1)
  next_BWC = jnp.take_along_axis(constraints_BCL[:, None, :, :],
                                 position_BWC[..., None], axis=-1)[..., 0]
  beam_offsets_1W1 = (jnp.arange(width, dtype=jnp.int32) * vocab)[None, :, None]
  phrase_ids_BWC = jnp.where(~met_BWC, beam_offsets_1W1 + next_BWC, -1)
  has_constraints_B1 = jnp.any(lengths_BC > 0, axis=1)[:, None]
  best_ids_BW = jnp.where(has_constraints_B1,
                          jnp.arange(width, dtype=jnp.int32)[None, :] * vocab + best_BW, -1)
  ids_BK = jnp.concatenate([top_ids_BA.astype(jnp.int32), phrase_ids_BWC.reshape(batch, -1),
                            best_ids_BW], axis=1)
  usable_BK = ids_BK >= 0
  scores_BK = jnp.take_along_axis(flat_BM, jnp.maximum(ids_BK, 0), axis=1)
  k = ids_BK.shape[1]
  earlier_KK = jnp.arange(k)[None, :] < jnp.arange(k)[:, None]  # [k, j]: j before k
  repeat_BK = jnp.any((ids_BK[:, :, None] == ids_BK[:, None, :]) & earlier_KK[None]
                      & usable_BK[:, None, :], axis=-1)
  keep_BK = usable_BK & ~repeat_BK
  scores_BK = jnp.where(keep_BK, scores_BK, 2 * NEG_INF)
  ids_BK = jnp.where(keep_BK, ids_BK, -1 - jnp.arange(k, dtype=jnp.int32)[None, :])
  return ids_BK, scores_BK


def rank_within(scores_BK: Array, groups_BK: Array, eligible_BK: Array) -> Array:
  """int32 ``[B, K]``: each candidate's place among the eligible ones of its group, best first.

  Equal scores keep the pool's order (lower index first).
  """
  k = scores_BK.shape[1]
  index_K = jnp.arange(k)
  # better[b, i, j]: candidate j ranks before candidate i.
  better_BKK = ((scores_BK[:, None, :] > scores_BK[:, :, None])
                | ((scores_BK[:, None, :] == scores_BK[:, :, None])
                   & (index_K[None, None, :] < index_K[None, :, None])))
  same_BKK = groups_BK[:, None, :] == groups_BK[:, :, None]
  return jnp.sum(better_BKK & same_BKK & eligible_BK[:, None, :], axis=-1, dtype=jnp.int32)


def allocate(scores_BK: Array, bank_BK: Array, eligible_BK: Array, *, width: int,
             max_bank: int) -> Array:
  """int32 ``[B, W]``: the candidates kept live, round-robin over banks (Hu et al. 2019).

  The best candidate of every bank comes first, the highest bank first, then the
  second best of every bank, and so on; ineligible candidates come last.

  Example:
    >>> scores = jnp.array([[-1.0, -2.0, -3.0, -4.0]])
    >>> allocate(scores, jnp.array([[0, 0, 1, 1]]), jnp.ones((1, 4), bool), width=2,
    ...          max_bank=1)  # the best of bank 1, then the best of bank 0
    Array([[2, 0]], dtype=int32)
  """
  rank_BK = rank_within(scores_BK, bank_BK, eligible_BK)
  key_BK = rank_BK * (max_bank + 1) + (max_bank - bank_BK)
  key_BK = jnp.where(eligible_BK, key_BK, jnp.iinfo(jnp.int32).max)
  _, picks_BW = jax.lax.top_k(-key_BK, width)
  return picks_BW.astype(jnp.int32)
