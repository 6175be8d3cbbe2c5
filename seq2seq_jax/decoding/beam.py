"""Beam search with the GNMT length penalty, a finished-hypothesis set and early stopping."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from seq2seq_jax.decoding import selection
from seq2seq_jax.decoding.step import (StepFn, TokenRules, check_cache, check_decode_args,
                                       next_token_logprobs)
from seq2seq_jax.types import NEG_INF, PAD_ID, Array, PyTree

# A score at or below this belongs to no real hypothesis: it went through a NEG_INF
# (a beam that was never alive, or a forbidden token). Real log-probabilities are
# orders of magnitude above it, and dividing by a length penalty >= 1 keeps them so.
_DEAD = 0.5 * NEG_INF


def length_penalty(length: Array | int, alpha: float) -> Array:
  """GNMT length penalty ``((5 + length) / 6) ** alpha`` (Wu et al. 2016), float32.

  ``length`` counts the generated tokens, EOS included. A hypothesis' score is its
  total log-probability divided by this; alpha = 0 turns it off.
  """
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _gathers_itself(node) -> bool:
  return callable(getattr(type(node), "gather_rows", None))


def _num_rows(node) -> int:
  return next(jnp.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(node) if jnp.ndim(leaf))


def expand_to_beams(tree: PyTree, beam_size: int) -> PyTree:
  """Repeats the rows of every non-scalar leaf ``beam_size`` times: ``[B, ...] -> [B*W, ...]``.

  Row ``b * W + w`` is a copy of row ``b``. Leaves are told apart by their structure
  (rank), never by name: scalars are shared by all beams and returned as they are.
  A node with a ``gather_rows(rows)`` method (``layers.attention.KVCache``) gets
  ``gather_rows(repeat(arange(B), W))`` instead. Use it to tile encoder memory
  before closing ``step_fn`` over it.

  Example:
    >>> expand_to_beams({"x": jnp.array([[1], [2]]), "index": jnp.array(0)}, 2)["x"][:, 0]
    Array([1, 1, 2, 2], dtype=int32)
  """
  if not isinstance(beam_size, int) or beam_size <= 0:
    raise ValueError(f"beam_size={beam_size!r} must be a positive integer")

  def expand(leaf):
    if _gathers_itself(leaf):
      return leaf.gather_rows(jnp.repeat(jnp.arange(_num_rows(leaf)), beam_size))
    leaf = jnp.asarray(leaf)
    return leaf if leaf.ndim == 0 else jnp.repeat(leaf, beam_size, axis=0)

  return jax.tree_util.tree_map(expand, tree, is_leaf=_gathers_itself)


def gather_beams(tree: PyTree, beam_indices_BW: Array, *, flat: bool) -> PyTree:
  """Picks beams out of every non-scalar leaf; scalars pass through.

  Args:
    tree: leaves ``[B, W_old, ...]`` (``flat=False``) or ``[B * W_old, ...]``
      (``flat=True``, the layout ``step_fn`` sees), or scalars.
    beam_indices_BW: int, for each batch row the old beams to keep, in order.
    flat: whether the leaves hold batch and beam in one axis.

  Returns:
    The same structure with leaves ``[B, W, ...]`` (or ``[B * W, ...]`` when flat):
    ``out[b, w] = leaf[b, beam_indices_BW[b, w]]``. In flat mode a node with a
    ``gather_rows(rows_N)`` method (``layers.attention.KVCache``, which moves only
    its slot table) is handed the flat row indices instead of being gathered leaf
    by leaf.
  """
  batch, new_width = beam_indices_BW.shape

  def flat_rows(num_rows):
    rows_B1 = jnp.arange(batch, dtype=beam_indices_BW.dtype)[:, None] * (num_rows // batch)
    return (rows_B1 + beam_indices_BW).reshape(batch * new_width)

  def gather(leaf):
    if _gathers_itself(leaf):
      if not flat:
        raise ValueError(f"{type(leaf).__name__} reorders flat rows; gather it with flat=True")
      return leaf.gather_rows(flat_rows(_num_rows(leaf)))
    leaf = jnp.asarray(leaf)
    if leaf.ndim == 0:
      return leaf
    if not flat:
      return jax.vmap(lambda rows, ids: rows[ids])(leaf, beam_indices_BW)
    return leaf[flat_rows(leaf.shape[0])]

  return jax.tree_util.tree_map(gather, tree, is_leaf=_gathers_itself)


class BeamState(NamedTuple):
  """The beam-search loop carry. Sequences hold BOS in column 0 and T tokens after it."""

  step: Array  # int32 scalar; step t generates token t + 1 of the sequences
  live_seqs_BWT: Array  # int32 [B, W, T + 1], beams still growing (never contain EOS)
  live_logprobs_BW: Array  # float32 total log-probabilities, best first; _DEAD if unused
  finished_seqs_BWT: Array  # int32 [B, W, T + 1], best hypotheses that ended
  finished_scores_BW: Array  # float32 log-prob / length penalty, best first; NEG_INF if empty
  cache: PyTree  # non-scalar leaves [B * W, ...], row b * W + w is beam w of batch row b


def beam_search(step_fn: StepFn, cache: PyTree, *, batch_size: int, beam_size: int,
                max_decode_len: int, alpha: float, bos_id: int, eos_id: int,
                pad_id: int = PAD_ID, rules: TokenRules = TokenRules()) -> tuple[Array, Array]:
  """Finds the W best-scoring outputs per row, best first.

  Each step expands every live beam by the whole vocabulary and keeps the 2W best
  candidates: those ending in EOS enter the finished set (scored log-prob divided by
  ``length_penalty``), the W best others stay live, so beams ending in EOS never
  starve the live ones. A candidate still live after ``max_decode_len`` tokens
  finishes as it stands. A batch row stops early once its finished set is full and
  no live beam can beat its worst member even at the largest length penalty (log-
  probabilities only fall). One ``lax.while_loop``; traceable, call it under
  ``jax.jit``.

  The cache comes in at batch B: every non-scalar leaf is expanded on axis 0 to
  ``B * W`` and gathered as beams are reordered, by structure, never by leaf name;
  scalar leaves (a position counter) are shared; a node with a ``gather_rows``
  method reorders itself (see ``gather_beams``). Memory that ``step_fn`` closes over
  must be tiled by the caller with ``expand_to_beams(memory, beam_size)``.

  Args:
    step_fn: ``(tokens_N, cache) -> (logits_NV, cache)`` with N = B * W.
    cache: the model's initial cache at batch B.
    batch_size: B.
    beam_size: W.
    max_decode_len: T, the most tokens per hypothesis (EOS included).
    alpha: length-penalty exponent; 0 ranks by total log-probability.
    bos_id: the token fed on the first step (the decoder start).
    eos_id: the token that ends a hypothesis.
    pad_id: fills each hypothesis after its EOS; never generated.
    rules: forced first token, EOS at the limit, suppressed ids (``TokenRules``).

  Returns:
    ``(tokens_BWT, scores_BW)``: the W best hypotheses per row, best first; tokens
    exclude BOS, include EOS, PAD after it; scores are total log-probabilities divided
    by the length penalty. When fewer than W distinct hypotheses exist, the missing
    slots are all PAD with score ``NEG_INF``.

  Example:
    >>> step_fn = lambda tokens_N, cache: (jnp.tile(jnp.array([0., 0., 1., 2.]), (6, 1)), cache)
    >>> tokens, scores = beam_search(step_fn, {}, batch_size=2, beam_size=3, max_decode_len=4,
    ...                              alpha=0.6, bos_id=1, eos_id=2)
    >>> tokens.shape, scores.shape
    ((2, 3, 4), (2, 3))
  """
  check_decode_args(batch_size=batch_size, max_decode_len=max_decode_len, bos_id=bos_id,
                    eos_id=eos_id, pad_id=pad_id)
  if not isinstance(beam_size, int) or beam_size <= 0:
    raise ValueError(f"beam_size={beam_size!r} must be a positive integer")
  if alpha < 0:
    raise ValueError(f"alpha={alpha} must be >= 0")
  check_cache(cache, batch_size)
  width = beam_size
  batch = batch_size
  max_penalty = length_penalty(max_decode_len, alpha)

  def cond(state: BeamState) -> Array:
    worst_finished_B = state.finished_scores_BW[:, -1]
    full_B = worst_finished_B > _DEAD
    best_live_B = state.live_logprobs_BW[:, 0]
    # The best a live beam could still reach: its log-prob now, at the largest penalty.
    hopeless_B = jnp.logical_and(full_B, best_live_B / max_penalty <= worst_finished_B)
    done_B = jnp.logical_or(hopeless_B, best_live_B <= _DEAD)
    return jnp.logical_and(state.step < max_decode_len, ~jnp.all(done_B))

  def body(state: BeamState) -> BeamState:
    step = state.step
    tokens_N = state.live_seqs_BWT[:, :, step].reshape(batch * width)
    logprobs_NV, cache = next_token_logprobs(
        step_fn, tokens_N, state.cache, step=step, max_decode_len=max_decode_len, bos_id=bos_id,
        eos_id=eos_id, pad_id=pad_id, rules=rules)
    vocab = logprobs_NV.shape[-1]
    if 2 * width > width * vocab:
      raise ValueError(f"beam search needs a vocabulary of at least 2 tokens; got {vocab}")
    # Clamped so a dead beam's candidates stay at NEG_INF instead of drifting lower.
    candidates_BWV = jnp.maximum(
        state.live_logprobs_BW[:, :, None] + logprobs_NV.reshape(batch, width, vocab), NEG_INF)
    top_logprobs_BC, top_ids_BC = selection.top_k(candidates_BWV.reshape(batch, width * vocab),
                                                   2 * width)
    top_beams_BC = top_ids_BC // vocab
    top_tokens_BC = (top_ids_BC % vocab).astype(jnp.int32)
    top_seqs_BCT = gather_beams(state.live_seqs_BWT, top_beams_BC, flat=False)
    top_seqs_BCT = top_seqs_BCT.at[:, :, step + 1].set(top_tokens_BC)
    ends_BC = top_tokens_BC == eos_id

    # Finished set: merge the candidates that end here (by EOS, or by reaching the
    # length limit) into the W best so far. 2 * NEG_INF ranks below an empty slot.
    at_limit = step + 1 == max_decode_len
    finishing_BC = jnp.logical_and(jnp.logical_or(ends_BC, at_limit), top_logprobs_BC > _DEAD)
    new_scores_BC = jnp.where(finishing_BC, top_logprobs_BC / length_penalty(step + 1, alpha),
                              2 * NEG_INF)
    pool_scores_BP = jnp.concatenate([state.finished_scores_BW, new_scores_BC], axis=1)
    pool_seqs_BPT = jnp.concatenate([state.finished_seqs_BWT, top_seqs_BCT], axis=1)
    finished_scores_BW, keep_BW = jax.lax.top_k(pool_scores_BP, width)
    finished_seqs_BWT = gather_beams(pool_seqs_BPT, keep_BW, flat=False)

    # Live set: the W best candidates that did not end in EOS (at least W of the 2W
    # did not, since each beam has one EOS continuation).
    live_logprobs_BW, live_pick_BW = jax.lax.top_k(
        jnp.where(ends_BC, 2 * NEG_INF, top_logprobs_BC), width)
    live_seqs_BWT = gather_beams(top_seqs_BCT, live_pick_BW, flat=False)
    parents_BW = jnp.take_along_axis(top_beams_BC, live_pick_BW, axis=1)
    return BeamState(
        step=step + 1,
        live_seqs_BWT=live_seqs_BWT,
        live_logprobs_BW=live_logprobs_BW,
        finished_seqs_BWT=finished_seqs_BWT,
        finished_scores_BW=finished_scores_BW,
        cache=gather_beams(cache, parents_BW, flat=True))

  seqs_BWT = jnp.full((batch, width, max_decode_len + 1), pad_id, jnp.int32)
  seqs_BWT = seqs_BWT.at[:, :, 0].set(bos_id)
  # All beams start identical; only beam 0 is alive so the first step does not
  # return W copies of the same candidates.
  live_logprobs_BW = jnp.full((batch, width), NEG_INF, jnp.float32).at[:, 0].set(0.0)
  state = BeamState(
      step=jnp.zeros((), jnp.int32),
      live_seqs_BWT=seqs_BWT,
      live_logprobs_BW=live_logprobs_BW,
      finished_seqs_BWT=seqs_BWT,
      finished_scores_BW=jnp.full((batch, width), NEG_INF, jnp.float32),
      cache=expand_to_beams(cache, width))
  state = jax.lax.while_loop(cond, body, state)

  real_BW = state.finished_scores_BW > _DEAD
  tokens_BWT = jnp.where(real_BW[:, :, None], state.finished_seqs_BWT[:, :, 1:], pad_id)
  scores_BW = jnp.where(real_BW, state.finished_scores_BW, NEG_INF)
  return tokens_BWT, scores_BW
