"""Beam search: a finished-hypothesis set, length penalties, stopping rules, diverse groups
and lexical constraints, in one ``lax.while_loop``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from seq2seq_jax.decoding import constraints as constraints_lib
from seq2seq_jax.decoding import prefix, selection
from seq2seq_jax.decoding.step import (StepFn, TokenRules, apply_token_rules, check_cache,
                                       check_decode_args, check_rules, log_softmax,
                                       model_logits, next_token_logprobs)
from seq2seq_jax.types import NEG_INF, PAD_ID, Array, PyTree

# A score at or below this belongs to no real hypothesis: it went through a NEG_INF
# (a beam that was never alive, or a forbidden token). Real log-probabilities are
# orders of magnitude above it, and dividing by a length penalty >= 1 keeps them so.
_DEAD = 0.5 * NEG_INF


LENGTH_PENALTY_FORMS = ("gnmt", "power")
EARLY_STOPPING = ("never", True, False)


def length_penalty(length: Array | int, alpha: float, form: str = "gnmt") -> Array:
  """The length penalty a finished hypothesis' log-probability is divided by, float32.

  ``form="gnmt"``: ``((5 + length) / 6) ** alpha`` (Wu et al. 2016), this library's
  default; ``form="power"``: ``length ** alpha``, as transformers' and fairseq's
  ``length_penalty``. ``length`` counts the generated tokens, EOS included; alpha
  = 0 turns either off.

  Example:
    >>> float(length_penalty(7, 1.0)), float(length_penalty(7, 1.0, form="power"))
    (2.0, 7.0)
  """
  if form == "gnmt":
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha
  if form == "power":
    # At least 1: an output of the prefix alone has no generated token.
    return jnp.maximum(jnp.asarray(length, jnp.float32), 1.0) ** alpha
  raise ValueError(f"length penalty form={form!r} must be one of {LENGTH_PENALTY_FORMS}")


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
  """The beam-search loop carry. Sequences hold BOS in column 0 and T tokens after it.

  With diverse groups (``num_beam_groups`` G > 1) beams ``g * W/G .. (g + 1) * W/G - 1``
  form group g, and the live and finished sets are ordered best first within each
  group. The last three fields are None unless an option needs them.
  """

  step: Array  # int32 scalar; step t generates token t + 1 of the sequences
  live_seqs_BWT: Array  # int32 [B, W, T + 1], beams still growing (never contain EOS)
  live_logprobs_BW: Array  # float32 total log-probabilities, best first; _DEAD if unused
  finished_seqs_BWT: Array  # int32 [B, W, T + 1], best hypotheses that ended
  finished_scores_BW: Array  # float32 log-prob / length penalty, best first; NEG_INF if empty
  cache: PyTree  # non-scalar leaves [B * W, ...], row b * W + w is beam w of batch row b
  done_BG: Array | None = None  # bool [B, G]: rows (groups) that stopped taking hypotheses
  met_BWC: Array | None = None  # bool [B, W, C]: constraint phrases each live beam produced
  progress_BWC: Array | None = None  # int32 [B, W, C]: matched tokens of unmet phrases


def _merge_finished(finished_seqs_BWT: Array, finished_scores_BW: Array, new_seqs_BKT: Array,
                    new_scores_BK: Array) -> tuple[Array, Array]:
  """The W best of the finished set and the new finished candidates (``2 * NEG_INF``: none)."""
  width = finished_scores_BW.shape[1]
  pool_scores_BP = jnp.concatenate([finished_scores_BW, new_scores_BK], axis=1)
  pool_seqs_BPT = jnp.concatenate([finished_seqs_BWT, new_seqs_BKT], axis=1)
  finished_scores_BW, keep_BW = jax.lax.top_k(pool_scores_BP, width)
  return gather_beams(pool_seqs_BPT, keep_BW, flat=False), finished_scores_BW


def _beam_step(live_logprobs_BW: Array, logprobs_NV: Array, live_seqs_BWT: Array,
               finished_seqs_BWT: Array, finished_scores_BW: Array, *, step: Array,
               max_decode_len: int, generated: Callable[[Array], Array], alpha: float,
               form: str, eos_id: int, top_w_only: bool = False,
               frozen_B: Array | None = None):
  """One step of one beam (or one diverse group): expand, finish, keep the W best live.

  Each live beam is expanded by the whole vocabulary and the 2W best candidates are
  kept: those ending in EOS (or reaching the limit) enter the finished set, scored
  log-prob / length penalty of ``generated(step)`` tokens, the W best others stay live.
  ``top_w_only`` lets only the W best candidates finish (transformers' rule);
  ``frozen_B`` rows take no finished hypotheses.

  Returns ``(live_logprobs_BW, live_seqs_BWT, finished_seqs_BWT, finished_scores_BW,
  parents_BW)``, ``parents_BW`` the old beam each new live beam grew from.
  ``logprobs_NV`` are the step's scores of the live beams' rows, N = B * W.
  """
  batch, width = live_logprobs_BW.shape
  vocab = logprobs_NV.shape[-1]
  # Clamped so a dead beam's candidates stay at NEG_INF instead of drifting lower.
  candidates_BWV = jnp.maximum(
      live_logprobs_BW[:, :, None] + logprobs_NV.reshape(batch, width, vocab), NEG_INF)
  top_logprobs_BC, top_ids_BC = selection.top_k_of_rows(candidates_BWV, 2 * width)
  top_beams_BC = top_ids_BC // vocab
  top_tokens_BC = (top_ids_BC % vocab).astype(jnp.int32)
  top_seqs_BCT = gather_beams(live_seqs_BWT, top_beams_BC, flat=False)
  top_seqs_BCT = top_seqs_BCT.at[:, :, step + 1].set(top_tokens_BC)
  ends_BC = top_tokens_BC == eos_id

  # Finished set: merge the candidates that end here (by EOS, or by reaching the
  # length limit) into the W best so far. 2 * NEG_INF ranks below an empty slot.
  at_limit = step + 1 == max_decode_len
  finishing_BC = jnp.logical_and(jnp.logical_or(ends_BC, at_limit), top_logprobs_BC > _DEAD)
  if top_w_only:
    finishing_BC = finishing_BC & (jnp.arange(2 * width) < width)[None, :]
  if frozen_B is not None:
    finishing_BC = finishing_BC & ~frozen_B[:, None]
  new_scores_BC = jnp.where(finishing_BC,
                            top_logprobs_BC / length_penalty(generated(step), alpha, form),
                            2 * NEG_INF)
  finished_seqs_BWT, finished_scores_BW = _merge_finished(finished_seqs_BWT, finished_scores_BW,
                                                          top_seqs_BCT, new_scores_BC)

  # Live set: the W best candidates that did not end in EOS (at least W of the 2W
  # did not, since each beam has one EOS continuation).
  live_logprobs_BW, live_pick_BW = jax.lax.top_k(
      jnp.where(ends_BC, 2 * NEG_INF, top_logprobs_BC), width)
  live_seqs_BWT = gather_beams(top_seqs_BCT, live_pick_BW, flat=False)
  parents_BW = jnp.take_along_axis(top_beams_BC, live_pick_BW, axis=1)
  return live_logprobs_BW, live_seqs_BWT, finished_seqs_BWT, finished_scores_BW, parents_BW


def _constrained_step(live_logprobs_BW: Array, logprobs_BWV: Array, live_seqs_BWT: Array,
                      finished_seqs_BWT: Array, finished_scores_BW: Array, met_BWC: Array,
                      progress_BWC: Array, constraints_BCL: Array, *, step: Array,
                      max_decode_len: int, generated: Callable[[Array], Array], alpha: float,
                      form: str, eos_id: int, pad_id: int, top_w_only: bool = False,
                      frozen_B: Array | None = None):
  """``_beam_step`` with lexical constraints (``decoding.constraints``): a wider candidate
  pool, EOS only once every phrase appeared, live slots allocated over banks.

  ``top_w_only`` applies to rows without constraints only (which then decode as
  ``_beam_step``): in a constrained row it would starve the hypotheses that met
  their phrases, which score below the others.

  Returns ``_beam_step``'s tuple and the live beams' ``(met_BWC, progress_BWC)``.
  """
  batch, width, vocab = logprobs_BWV.shape
  max_len = live_seqs_BWT.shape[2] - 1
  phrase_len = constraints_BCL.shape[2]
  # EOS only for beams whose phrases all appeared (EOS is in no phrase: that stays so).
  unfinished_BW1 = ~jnp.all(met_BWC, axis=-1)[:, :, None]
  logprobs_BWV = jnp.where((jnp.arange(vocab) == eos_id)[None, None, :] & unfinished_BW1,
                           NEG_INF, logprobs_BWV)
  candidates_BWV = jnp.maximum(live_logprobs_BW[:, :, None] + logprobs_BWV, NEG_INF)
  top = selection.top_k_of_rows(candidates_BWV, 2 * width)
  best_BW = selection.argmax(candidates_BWV)
  ids_BK, scores_BK = constraints_lib.candidate_pool(
      candidates_BWV, met_BWC=met_BWC, progress_BWC=progress_BWC,
      constraints_BCL=constraints_BCL, pad_id=pad_id, top_BK=top, best_BW=best_BW)
  real_ids_BK = jnp.maximum(ids_BK, 0)
  parents_BK = real_ids_BK // vocab
  tokens_BK = (real_ids_BK % vocab).astype(jnp.int32)
  seqs_BKT = gather_beams(live_seqs_BWT, parents_BK, flat=False)
  seqs_BKT = seqs_BKT.at[:, :, step + 1].set(tokens_BK)
  # The last L tokens of each candidate; -1 before the first generated one.
  columns_L = step + 2 - phrase_len + jnp.arange(phrase_len)
  tails_BKL = jnp.take_along_axis(seqs_BKT, jnp.clip(columns_L, 0, max_len)[None, None, :],
                                  axis=2)
  tails_BKL = jnp.where(columns_L[None, None, :] >= 1, tails_BKL, -1)
  met_BKC, progress_BKC, bank_BK = constraints_lib.advance(
      tails_BKL, jnp.take_along_axis(met_BWC, parents_BK[..., None], axis=1), constraints_BCL,
      pad_id=pad_id)
  real_BK = scores_BK > _DEAD
  ends_BK = tokens_BK == eos_id

  at_limit = step + 1 == max_decode_len
  finishing_BK = real_BK & (ends_BK | (at_limit & jnp.all(met_BKC, axis=-1)))
  if top_w_only:
    constrained_B1 = jnp.any(constraints_lib.phrase_lengths(constraints_BCL, pad_id) > 0,
                             axis=1)[:, None]
    order_BK = constraints_lib.rank_within(scores_BK, jnp.zeros_like(tokens_BK), real_BK)
    finishing_BK = finishing_BK & ((order_BK < width) | constrained_B1)
  if frozen_B is not None:
    finishing_BK = finishing_BK & ~frozen_B[:, None]
  new_scores_BK = jnp.where(finishing_BK, scores_BK / length_penalty(generated(step), alpha, form),
                            2 * NEG_INF)
  finished_seqs_BWT, finished_scores_BW = _merge_finished(finished_seqs_BWT, finished_scores_BW,
                                                          seqs_BKT, new_scores_BK)

  eligible_BK = real_BK & ~ends_BK
  picks_BW = constraints_lib.allocate(scores_BK, bank_BK, eligible_BK, width=width,
                                      max_bank=constraints_BCL.shape[1] * phrase_len)
  picked_BW = jnp.take_along_axis(eligible_BK, picks_BW, axis=1)
  live_logprobs_BW = jnp.where(picked_BW, jnp.take_along_axis(scores_BK, picks_BW, axis=1),
                               NEG_INF)
  live_logprobs_BW, order_BW = jax.lax.top_k(live_logprobs_BW, width)  # best first
  picks_BW = jnp.take_along_axis(picks_BW, order_BW, axis=1)
  live_seqs_BWT = gather_beams(seqs_BKT, picks_BW, flat=False)
  parents_BW = jnp.take_along_axis(parents_BK, picks_BW, axis=1)
  met_BWC = jnp.take_along_axis(met_BKC, picks_BW[..., None], axis=1)
  progress_BWC = jnp.take_along_axis(progress_BKC, picks_BW[..., None], axis=1)
  return (live_logprobs_BW, live_seqs_BWT, finished_seqs_BWT, finished_scores_BW, parents_BW,
          met_BWC, progress_BWC)


def _check_beam_options(*, beam_size: int, alpha: float, length_penalty_form: str,
                        early_stopping: bool | str, num_beam_groups: int,
                        diversity_penalty: float, constrained: bool) -> None:
  if not isinstance(beam_size, int) or beam_size <= 0:
    raise ValueError(f"beam_size={beam_size!r} must be a positive integer")
  if alpha < 0:
    raise ValueError(f"alpha={alpha} must be >= 0")
  if length_penalty_form not in LENGTH_PENALTY_FORMS:
    raise ValueError(f"length_penalty_form={length_penalty_form!r} must be one of "
                     f"{', '.join(map(repr, LENGTH_PENALTY_FORMS))}")
  if not any(early_stopping is choice or early_stopping == choice and isinstance(choice, str)
             for choice in EARLY_STOPPING):
    raise ValueError(f"early_stopping={early_stopping!r} must be 'never' (stop when no live "
                     "beam can win), True or False (transformers' rules)")
  if (not isinstance(num_beam_groups, int) or num_beam_groups <= 0
      or beam_size % num_beam_groups):
    raise ValueError(f"num_beam_groups={num_beam_groups!r} must be a positive divisor of "
                     f"beam_size={beam_size}")
  if diversity_penalty < 0:
    raise ValueError(f"diversity_penalty={diversity_penalty} must be >= 0")
  if diversity_penalty and num_beam_groups == 1:
    raise ValueError(f"diversity_penalty={diversity_penalty} needs num_beam_groups > 1: the "
                     "penalty acts between groups")
  if constrained and num_beam_groups > 1:
    raise ValueError("constraints cannot be combined with num_beam_groups > 1; use one group")


def beam_search(step_fn: StepFn, cache: PyTree, *, batch_size: int, beam_size: int,
                max_decode_len: int, alpha: float, bos_id: int, eos_id: int,
                pad_id: int = PAD_ID, rules: TokenRules = TokenRules(),
                length_penalty_form: str = "gnmt", early_stopping: bool | str = "never",
                num_beam_groups: int = 1, diversity_penalty: float = 0.0,
                target_prefix_BP: Array | None = None,
                constraints_BCL: Array | None = None) -> tuple[Array, Array]:
  """Finds the W best-scoring outputs per row, best first.

  Each step expands every live beam by the whole vocabulary and keeps the 2W best
  candidates: those ending in EOS enter the finished set (scored log-prob divided by
  ``length_penalty``), the W best others stay live, so beams ending in EOS never
  starve the live ones. A candidate still live after ``max_decode_len`` tokens
  finishes as it stands. With ``early_stopping="never"`` (the default) a batch row
  stops once its finished set is full and no live beam can beat its worst member
  even at the largest length penalty (log-probabilities only fall): the search
  never stops too early. One ``lax.while_loop``; traceable, call it under
  ``jax.jit``.

  The cache comes in at batch B: every non-scalar leaf is expanded on axis 0 to
  ``B * W`` and gathered as beams are reordered, by structure, never by leaf name;
  scalar leaves (a position counter) are shared; a node with a ``gather_rows``
  method reorders itself (see ``gather_beams``). Memory that ``step_fn`` closes over
  must be tiled by the caller with ``expand_to_beams(memory, beam_size)``.

  Every option below is off by default and then adds nothing to the compiled loop.

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
    rules: forced first token, EOS at the limit, suppressed ids, repetition control
      (``TokenRules``; the repetition penalty scales log-probabilities here).
    length_penalty_form: ``"gnmt"`` ``((5 + len) / 6) ** alpha`` or ``"power"``
      ``len ** alpha`` (transformers, fairseq); see ``length_penalty``.
    early_stopping: ``"never"``: the exact rule above. ``True`` / ``False``:
      transformers' rules: a row stops as soon as W hypotheses finished (True), or
      once its best live beam, scored at its current length, cannot beat the worst
      finished one (False); a stopped row takes no more hypotheses, and only the W
      best of a step's 2W candidates may finish.
    num_beam_groups: G, diverse beam search (Vijayakumar et al. 2018): the W beams
      form G groups of W / G that search one after the other within a step, each
      its own beam search with W / G finished slots; the output merges all groups'
      finished hypotheses, best first. As transformers' ``num_beam_groups``.
    diversity_penalty: subtracted from a token's log-probability in group g once for
      every live beam of groups before g that chose it at this step (Hamming
      diversity; not at forced tokens). Scores include these penalties.
    target_prefix_BP: int ``[B, P]``, each row's forced first tokens then ``pad_id``
      (``decoding.prefix``): not scored, not counted by the length penalty.
    constraints_BCL: int ``[B, C, L]``, phrases every output of a row must contain
      (``decoding.constraints``, dynamic beam allocation). A row whose phrases no
      output within ``max_decode_len`` can hold returns empty slots.

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
  _check_beam_options(beam_size=beam_size, alpha=alpha, length_penalty_form=length_penalty_form,
                      early_stopping=early_stopping, num_beam_groups=num_beam_groups,
                      diversity_penalty=diversity_penalty,
                      constrained=constraints_BCL is not None)
  check_rules(rules)
  check_cache(cache, batch_size)
  width = beam_size
  batch = batch_size
  groups = num_beam_groups
  group_width = width // groups
  form = length_penalty_form
  offset = int(rules.forced_bos_id is not None)
  heuristic = early_stopping is True or early_stopping is False
  prefix_len_B = None
  if target_prefix_BP is not None:
    target_prefix_BP = jnp.asarray(target_prefix_BP, jnp.int32)
    check_cache(target_prefix_BP, batch, "target_prefix_BP")
    prefix_len_B = prefix.prefix_lengths(target_prefix_BP, pad_id)
  if constraints_BCL is not None:
    constraints_BCL = jnp.asarray(constraints_BCL, jnp.int32)
    check_cache(constraints_BCL, batch, "constraints_BCL")
  if prefix_len_B is None:
    max_penalty = length_penalty(max_decode_len, alpha, form)
  else:
    max_penalty = length_penalty(max_decode_len - prefix_len_B, alpha, form)
  # The state keeps stop flags where a stopped row must take no more hypotheses.
  track_done = heuristic or groups > 1

  def generated_tokens(step: Array) -> Array:
    """Tokens the length penalty counts after this step: ``[B, 1]`` with a prefix."""
    if prefix_len_B is None:
      return step + 1
    return (step + 1 - prefix_len_B)[:, None]

  def stopped(done_BG: Array, live_logprobs_BGW: Array, finished_scores_BGW: Array,
              step: Array) -> Array:
    """The stop flags after ``step`` (sticky), per row and group."""
    worst_finished_BG = finished_scores_BGW[..., -1]
    full_BG = worst_finished_BG > _DEAD
    best_live_BG = live_logprobs_BGW[..., 0]
    if heuristic:  # transformers: the best live beam scored at its current length
      bound = length_penalty(generated_tokens(step), alpha, form)
    else:
      bound = max_penalty if prefix_len_B is None else max_penalty[:, None]
    hopeless_BG = jnp.logical_and(full_BG, best_live_BG / bound <= worst_finished_BG)
    done_BG = done_BG | hopeless_BG | (best_live_BG <= _DEAD)
    if early_stopping is True:
      done_BG = done_BG | full_BG
    return done_BG

  def done_flags(state: BeamState) -> Array:
    assert state.done_BG is not None  # kept whenever track_done
    return state.done_BG

  def frozen_rows(state: BeamState) -> Array | None:
    """Rows that stopped taking hypotheses (transformers' rules), else None."""
    return done_flags(state)[:, 0] if heuristic else None

  def cond(state: BeamState) -> Array:
    if track_done:
      return jnp.logical_and(state.step < max_decode_len, ~jnp.all(done_flags(state)))
    worst_finished_B = state.finished_scores_BW[:, -1]
    full_B = worst_finished_B > _DEAD
    best_live_B = state.live_logprobs_BW[:, 0]
    # The best a live beam could still reach: its log-prob now, at the largest penalty.
    hopeless_B = jnp.logical_and(full_B, best_live_B / max_penalty <= worst_finished_B)
    done_B = jnp.logical_or(hopeless_B, best_live_B <= _DEAD)
    return jnp.logical_and(state.step < max_decode_len, ~jnp.all(done_B))

  def diverse_step(state: BeamState, logprobs_BWV: Array, *, history_NT: Array | None,
                    forced_N: Array | None, rule_args: dict[str, Any],
                    common: dict[str, Any]):
    """The groups one after the other, each penalized by the tokens the earlier chose."""
    vocab = logprobs_BWV.shape[-1]
    chosen_BV = jnp.zeros((batch, vocab), jnp.float32)  # live beams of earlier groups per token
    outputs = []
    for g in range(groups):
      beams = slice(g * group_width, (g + 1) * group_width)
      logprobs_BGV = logprobs_BWV[:, beams]
      if diversity_penalty:  # before the rules, so forced tokens override it (transformers)
        logprobs_BGV = logprobs_BGV - diversity_penalty * chosen_BV[:, None, :]
      rows = lambda x_N: None if x_N is None else x_N.reshape(
          batch, width, *x_N.shape[1:])[:, beams].reshape(batch * group_width, *x_N.shape[1:])
      logprobs_GV = apply_token_rules(
          logprobs_BGV.reshape(batch * group_width, vocab), history_NT=rows(history_NT),
          forced_N=rows(forced_N), penalize=True, **rule_args)
      frozen_B = done_flags(state)[:, g]
      step_outputs = _beam_step(
          state.live_logprobs_BW[:, beams], logprobs_GV, state.live_seqs_BWT[:, beams],
          state.finished_seqs_BWT[:, beams], state.finished_scores_BW[:, beams],
          frozen_B=frozen_B, top_w_only=heuristic, **common)
      live_logprobs_BG, live_seqs_BGT = step_outputs[:2]
      # Stopped groups and dead beams choose nothing (transformers feeds them pad).
      counted_BG = (live_logprobs_BG > _DEAD) & ~frozen_B[:, None]
      chosen_BV = chosen_BV.at[jnp.arange(batch)[:, None], live_seqs_BGT[:, :, state.step + 1]
                               ].add(counted_BG.astype(jnp.float32))
      outputs.append(step_outputs[:4] + (step_outputs[4] + g * group_width,))
    return tuple(jnp.concatenate(parts, axis=1) for parts in zip(*outputs))

  def body(state: BeamState) -> BeamState:
    step = state.step
    tokens_N = state.live_seqs_BWT[:, :, step].reshape(batch * width)
    history_NT = None
    if rules.needs_history:
      history_NT = state.live_seqs_BWT.reshape(batch * width, max_decode_len + 1)
    forced_N = None
    if target_prefix_BP is not None:
      forced_B = prefix.forced_prefix_tokens(target_prefix_BP, step, pad_id=pad_id,
                                             offset=offset)
      forced_N = jnp.repeat(forced_B, width)
    rule_args: dict[str, Any] = dict(step=step, max_decode_len=max_decode_len, bos_id=bos_id,
                                     eos_id=eos_id, pad_id=pad_id, rules=rules)
    if groups > 1:
      logits_NV, cache = model_logits(step_fn, tokens_N, state.cache)
      logprobs_NV = log_softmax(logits_NV)
    else:
      logprobs_NV, cache = next_token_logprobs(step_fn, tokens_N, state.cache,
                                               history_NT=history_NT, forced_N=forced_N,
                                               penalize_logprobs=True, **rule_args)
    vocab = logprobs_NV.shape[-1]
    if 2 * width > width * vocab:
      raise ValueError(f"beam search needs a vocabulary of at least 2 tokens; got {vocab}")
    common: dict[str, Any] = dict(step=step, max_decode_len=max_decode_len,
                                  generated=generated_tokens, alpha=alpha, form=form,
                                  eos_id=eos_id)
    changes: dict[str, Any] = {}
    if groups > 1:
      outputs = diverse_step(state, logprobs_NV.reshape(batch, width, vocab),
                             history_NT=history_NT, forced_N=forced_N, rule_args=rule_args,
                             common=common)
      live_logprobs_BW, live_seqs_BWT, finished_seqs_BWT, finished_scores_BW, parents_BW = outputs
    elif constraints_BCL is not None:
      assert state.met_BWC is not None and state.progress_BWC is not None
      outputs = _constrained_step(
          state.live_logprobs_BW, logprobs_NV.reshape(batch, width, vocab), state.live_seqs_BWT,
          state.finished_seqs_BWT, state.finished_scores_BW, state.met_BWC, state.progress_BWC,
          constraints_BCL, pad_id=pad_id, frozen_B=frozen_rows(state), top_w_only=heuristic,
          **common)
      (live_logprobs_BW, live_seqs_BWT, finished_seqs_BWT, finished_scores_BW, parents_BW,
       changes["met_BWC"], changes["progress_BWC"]) = outputs
    else:
      outputs = _beam_step(
          state.live_logprobs_BW, logprobs_NV, state.live_seqs_BWT, state.finished_seqs_BWT,
          state.finished_scores_BW, frozen_B=frozen_rows(state), top_w_only=heuristic, **common)
      live_logprobs_BW, live_seqs_BWT, finished_seqs_BWT, finished_scores_BW, parents_BW = outputs
    if track_done:
      changes["done_BG"] = stopped(
          done_flags(state), live_logprobs_BW.reshape(batch, groups, group_width),
          finished_scores_BW.reshape(batch, groups, group_width), step)
    return state._replace(
        step=step + 1,
        live_seqs_BWT=live_seqs_BWT,
        live_logprobs_BW=live_logprobs_BW,
        finished_seqs_BWT=finished_seqs_BWT,
        finished_scores_BW=finished_scores_BW,
        cache=gather_beams(cache, parents_BW, flat=True),
        **changes)

  seqs_BWT = jnp.full((batch, width, max_decode_len + 1), pad_id, jnp.int32)
  seqs_BWT = seqs_BWT.at[:, :, 0].set(bos_id)
  # All beams start identical; only beam 0 (of each group) is alive so the first step
  # does not return W copies of the same candidates.
  live_logprobs_BW = jnp.full((batch, width), NEG_INF, jnp.float32).at[:, ::group_width].set(0.0)
  state = BeamState(
      step=jnp.zeros((), jnp.int32),
      live_seqs_BWT=seqs_BWT,
      live_logprobs_BW=live_logprobs_BW,
      finished_seqs_BWT=seqs_BWT,
      finished_scores_BW=jnp.full((batch, width), NEG_INF, jnp.float32),
      cache=expand_to_beams(cache, width))
  if track_done:
    state = state._replace(done_BG=jnp.zeros((batch, groups), bool))
  if constraints_BCL is not None:
    met_BWC, progress_BWC = constraints_lib.initial_state(constraints_BCL, pad_id=pad_id,
                                                          width=width)
    state = state._replace(met_BWC=met_BWC, progress_BWC=progress_BWC)
  state = jax.lax.while_loop(cond, body, state)

  finished_scores_BW, finished_seqs_BWT = state.finished_scores_BW, state.finished_seqs_BWT
  if groups > 1:  # every group's finished hypotheses, best first
    finished_scores_BW, order_BW = jax.lax.top_k(finished_scores_BW, width)
    finished_seqs_BWT = gather_beams(finished_seqs_BWT, order_BW, flat=False)
  real_BW = finished_scores_BW > _DEAD
  tokens_BWT = jnp.where(real_BW[:, :, None], finished_seqs_BWT[:, :, 1:], pad_id)
  scores_BW = jnp.where(real_BW, finished_scores_BW, NEG_INF)
  return tokens_BWT, scores_BW
