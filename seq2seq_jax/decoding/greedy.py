"""Greedy search, and the one-token-at-a-time loop that greedy and sampling share."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from seq2seq_jax.decoding import prefix, selection
from seq2seq_jax.decoding.step import (StepFn, TokenRules, check_cache, check_decode_args,
                                       check_rules, next_token_logprobs)
from seq2seq_jax.types import PAD_ID, Array, PRNGKey, PyTree

# (logprobs_BV float32, rng or None) -> next tokens_B int32.
ChooseFn = Callable[[Array, PRNGKey | None], Array]


class _LoopState(NamedTuple):
  step: Array  # int32 scalar: index of the token being generated
  last_B: Array  # int32, the token each row feeds to the next step
  tokens_BT: Array  # int32 output, PAD where nothing was generated
  scores_B: Array  # float32 total log-probability of each row's tokens
  finished_B: Array  # bool, True once the row emitted EOS
  cache: PyTree
  rng: PRNGKey | None


def decode_one_token_at_a_time(step_fn: StepFn, cache: PyTree, choose: ChooseFn, *,
                               rng: PRNGKey | None, batch_size: int, max_decode_len: int,
                               bos_id: int, eos_id: int, pad_id: int = PAD_ID,
                               rules: TokenRules = TokenRules(),
                               target_prefix_BP: Array | None = None) -> tuple[Array, Array]:
  """Runs ``choose`` on the next-token log-probabilities until every row ends.

  One ``lax.while_loop``; step t calls ``choose`` with ``fold_in(rng, t)`` (None
  when ``rng`` is None). It stops as soon as every row has emitted EOS or after
  ``max_decode_len`` tokens. Rows that have finished feed ``pad_id`` and get it;
  ``rules`` (see ``TokenRules``) constrain the tokens ``choose`` can pick, and a
  ``target_prefix_BP`` (see ``decoding.prefix``) forces each row's first tokens.

  Returns:
    ``(tokens_BT, scores_B)`` with ``T = max_decode_len``: tokens exclude BOS,
    include EOS and are PAD after it; scores are the model's total log-probabilities
    of the tokens up to and including EOS.
  """
  check_decode_args(batch_size=batch_size, max_decode_len=max_decode_len, bos_id=bos_id,
                    eos_id=eos_id, pad_id=pad_id)
  check_cache(cache, batch_size)
  check_rules(rules)
  offset = int(rules.forced_bos_id is not None)
  if target_prefix_BP is not None:
    target_prefix_BP = jnp.asarray(target_prefix_BP, jnp.int32)
    check_cache(target_prefix_BP, batch_size, "target_prefix_BP")

  def history(state: _LoopState) -> Array | None:
    """The fed tokens: the decoder start, then the tokens generated so far."""
    if not rules.needs_history:
      return None
    start_B1 = jnp.full((batch_size, 1), bos_id, jnp.int32)
    return jnp.concatenate([start_B1, state.tokens_BT], axis=1)

  def cond(state: _LoopState) -> Array:
    return jnp.logical_and(state.step < max_decode_len, ~jnp.all(state.finished_B))

  def body(state: _LoopState) -> _LoopState:
    forced_B = None
    if target_prefix_BP is not None:
      forced_B = prefix.forced_prefix_tokens(target_prefix_BP, state.step, pad_id=pad_id,
                                             offset=offset)
    logprobs_BV, cache = next_token_logprobs(
        step_fn, state.last_B, state.cache, step=state.step, max_decode_len=max_decode_len,
        bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, rules=rules, history_NT=history(state),
        forced_N=forced_B)
    step_rng = None if state.rng is None else jax.random.fold_in(state.rng, state.step)
    chosen_B = choose(logprobs_BV, step_rng).astype(jnp.int32)
    next_B = jnp.where(state.finished_B, pad_id, chosen_B)
    logprob_B = jnp.take_along_axis(logprobs_BV, chosen_B[:, None], axis=-1)[:, 0]
    return _LoopState(
        step=state.step + 1,
        last_B=next_B,
        tokens_BT=state.tokens_BT.at[:, state.step].set(next_B),
        scores_B=state.scores_B + jnp.where(state.finished_B, 0.0, logprob_B),
        finished_B=jnp.logical_or(state.finished_B, next_B == eos_id),
        cache=cache,
        rng=state.rng)

  state = _LoopState(
      step=jnp.zeros((), jnp.int32),
      last_B=jnp.full((batch_size,), bos_id, jnp.int32),
      tokens_BT=jnp.full((batch_size, max_decode_len), pad_id, jnp.int32),
      scores_B=jnp.zeros((batch_size,), jnp.float32),
      finished_B=jnp.zeros((batch_size,), bool),
      cache=cache,
      rng=rng)
  state = jax.lax.while_loop(cond, body, state)
  return state.tokens_BT, state.scores_B


def greedy_search(step_fn: StepFn, cache: PyTree, *, batch_size: int, max_decode_len: int,
                  bos_id: int, eos_id: int, pad_id: int = PAD_ID,
                  rules: TokenRules = TokenRules(),
                  target_prefix_BP: Array | None = None) -> tuple[Array, Array]:
  """Picks the most probable next token at every step.

  Traceable; call it under ``jax.jit`` (``generate`` does).

  Args:
    step_fn: ``(tokens_B, cache) -> (logits_BV, cache)``, see ``StepFn``.
    cache: the model's initial cache; non-scalar leaves ``[B, ...]``.
    batch_size: B.
    max_decode_len: T, the most tokens generated per row (EOS included).
    bos_id: the token fed on the first step (the decoder start).
    eos_id: the token that ends a row.
    pad_id: fills each row after its EOS; never generated.
    rules: forced first token, EOS at the limit, suppressed ids, repetition control
      (``TokenRules``).
    target_prefix_BP: int ``[B, P]``, each row's forced first tokens then ``pad_id``
      (see ``decoding.prefix``); None forces nothing.

  Returns:
    ``(tokens_BT, scores_B)``: tokens exclude BOS, include EOS, PAD after it (a row
    without EOS is returned as it stands); scores are total log-probabilities (of
    the scores the rules leave; a forced prefix adds nothing).

  Example:
    >>> step_fn = lambda tokens_N, cache: (jnp.tile(jnp.array([0., 0., 3., 1.]), (2, 1)), cache)
    >>> greedy_search(step_fn, {}, batch_size=2, max_decode_len=3, bos_id=1, eos_id=2)[0]
    Array([[2, 0, 0],
           [2, 0, 0]], dtype=int32)
  """
  def choose_best(logprobs_BV: Array, rng: PRNGKey | None) -> Array:
    del rng
    return selection.argmax(logprobs_BV)

  return decode_one_token_at_a_time(step_fn, cache, choose_best, rng=None,
                                    batch_size=batch_size, max_decode_len=max_decode_len,
                                    bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, rules=rules,
                                    target_prefix_BP=target_prefix_BP)
