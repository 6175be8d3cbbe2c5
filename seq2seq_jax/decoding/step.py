"""The step-function contract every decoder drives, and helpers the decoders share."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax import platforms
from seq2seq_jax.decoding import repetition
from seq2seq_jax.types import NEG_INF, PAD_ID, Array, PyTree


class StepFn(Protocol):
  """One decoding step of a model: the next-token logits for the rows' last tokens.

  A closure over parameters and encoder memory (``decoding/`` never sees a model):

    logits_NV, cache = step_fn(tokens_N, cache)

  ``tokens_N`` int32 holds each row's previous token (``bos_id`` on the first
  call); ``N`` is the batch ``B``, or ``B * W`` inside beam search. ``cache`` is
  the model's explicit pytree, returned updated with the same structure: every
  non-scalar leaf has the rows on axis 0, scalars (a position counter) are shared.
  """

  def __call__(self, tokens_N: Array, cache: PyTree) -> tuple[Array, PyTree]:
    ...


class TokenRules(NamedTuple):
  """Rules on the emitted tokens beyond the model's own ids (hashable, static).

  The rules of published checkpoints' ``generation_config.json``: ``forced_bos_id``
  is emitted as the first token whatever the model says (M2M100 / NLLB's target
  language code; it adds 0 to the score, the model did not choose it);
  ``force_eos_at_limit`` makes an output reaching the length limit end with EOS (its
  log-probability counts); ``suppress_ids`` are never emitted (single-token
  ``bad_words_ids``), beside the pad and decoder start ids which never are.

  Repetition control, as transformers' options of the same names (see
  ``decoding.repetition``): ``no_repeat_ngram_size`` n > 0 never lets an output
  repeat an n-gram of the tokens it was fed (the decoder start included);
  ``repetition_penalty`` p != 1 divides positive and multiplies negative scores of
  tokens already fed by p (the logits of greedy search and sampling, the
  log-probabilities of beam search). Both are off by default and then cost nothing.
  ``renormalize_logits`` (transformers' option of that name) renormalizes the scores
  after all the rules, so that masked and penalized tokens leave their probability
  to the others.

  Example:
    >>> TokenRules(no_repeat_ngram_size=3, repetition_penalty=1.2).needs_history
    True
  """

  suppress_ids: tuple[int, ...] = ()
  forced_bos_id: int | None = None
  force_eos_at_limit: bool = False
  no_repeat_ngram_size: int = 0
  repetition_penalty: float = 1.0
  renormalize_logits: bool = False

  @property
  def needs_history(self) -> bool:
    """Whether the rules read each row's past tokens (repetition control is on)."""
    return self.no_repeat_ngram_size > 0 or self.repetition_penalty != 1.0


def check_rules(rules: TokenRules) -> None:
  """Raises ``ValueError`` naming the field of ``rules`` that cannot work."""
  if not isinstance(rules, TokenRules):
    raise TypeError(f"rules must be a TokenRules; got {type(rules).__name__}")
  n = rules.no_repeat_ngram_size
  if not isinstance(n, int) or isinstance(n, bool) or n < 0:
    raise ValueError(f"TokenRules.no_repeat_ngram_size={n!r} must be an integer >= 0 (0 = off)")
  if not rules.repetition_penalty > 0:
    raise ValueError(f"TokenRules.repetition_penalty={rules.repetition_penalty!r} must be > 0 "
                     "(1 = off, above 1 discourages repeats)")


def check_decode_args(*, batch_size: int, max_decode_len: int, bos_id: int, eos_id: int,
                      pad_id: int = PAD_ID) -> None:
  """Raises ``ValueError`` on a decode request that cannot work, naming the argument.

  ``bos_id`` (the decoder start) may equal ``pad_id`` (Marian) or ``eos_id``
  (M2M100): it is only ever fed, never compared. EOS must differ from PAD, which
  fills the rows after it.
  """
  for name, value in (("batch_size", batch_size), ("max_decode_len", max_decode_len)):
    if not isinstance(value, int) or value <= 0:
      raise ValueError(f"{name}={value!r} must be a positive integer")
  if eos_id == pad_id:
    raise ValueError(f"eos_id={eos_id} and pad_id={pad_id} must differ: PAD fills the rows "
                     "after their EOS")


def check_cache(cache: PyTree, rows: int, what: str = "cache") -> None:
  """Raises unless every non-scalar leaf has ``rows`` on axis 0 (scalars are shared)."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
    shape = jnp.shape(leaf)
    if shape and shape[0] != rows:
      raise ValueError(f"{what} leaf {jax.tree_util.keystr(path)} has shape {shape}; every "
                       f"non-scalar {what} leaf needs the batch ({rows} rows) on axis 0")


def never_emitted(*, bos_id: int, eos_id: int, pad_id: int = PAD_ID,
                  rules: TokenRules = TokenRules()) -> tuple[int, ...]:
  """The ids a search never emits: PAD, the decoder start (unless it is EOS), suppressed ids.

  A suppressed EOS stays suppressed where the decoder start is EOS too (M2M100, mBART).
  """
  never = {pad_id} | set(rules.suppress_ids)
  if bos_id != eos_id:
    never.add(bos_id)
  return tuple(sorted(never))


def next_token_logprobs(step_fn: StepFn, tokens_N: Array, cache: PyTree, *, step: Array,
                        max_decode_len: int, bos_id: int, eos_id: int, pad_id: int = PAD_ID,
                        rules: TokenRules = TokenRules(), history_NT: Array | None = None,
                        forced_N: Array | None = None,
                        penalize_logprobs: bool = False) -> tuple[Array, PyTree]:
  """Runs one step; returns float32 log-probabilities ``[N, V]`` and the new cache.

  PAD and the decoder start ``bos_id`` can never be generated: PAD would read as the
  end of the output and the start token only ever begins it (unless it is EOS, as in
  M2M100). They, and ``rules.suppress_ids``, get ``NEG_INF`` after the log-softmax,
  so the scores of the other tokens stay the model's own log-probabilities. At
  ``step`` 0 a ``rules.forced_bos_id`` gets 0 and every other token ``NEG_INF``; at
  the last step (``max_decode_len - 1``) ``rules.force_eos_at_limit`` leaves only EOS.

  With repetition control on (``rules.needs_history``) ``history_NT`` must hold
  each row's fed tokens (see ``decoding.repetition``); the repetition penalty
  scales the logits, or the log-probabilities with ``penalize_logprobs`` (beam
  search, as transformers). ``forced_N`` int ``[N]`` (a target prefix) forces
  token ``forced_N[n]`` on row n with score 0 where it is >= 0.
  """
  logits_NV, cache = model_logits(step_fn, tokens_N, cache)
  if rules.repetition_penalty != 1.0 and not penalize_logprobs:
    logits_NV = repetition.penalize_repeats(logits_NV, _history(history_NT), step,
                                            rules.repetition_penalty)
  # x - logsumexp(x), and the never-emitted ids masked by a where over a constant [V] mask
  # rather than scattered: XLA's CPU backend then fuses all of it with the search's own
  # elementwise work; jax.nn.log_softmax and a scatter cost 1.5x as much at a 58k vocabulary.
  logprobs_NV = log_softmax(logits_NV)
  logprobs_NV = apply_token_rules(
      logprobs_NV, step=step, max_decode_len=max_decode_len, bos_id=bos_id, eos_id=eos_id,
      pad_id=pad_id, rules=rules, history_NT=history_NT, forced_N=forced_N,
      penalize=penalize_logprobs)
  return logprobs_NV, cache


def log_softmax(logits_NV: Array) -> Array:
  """``x - logsumexp(x)`` over the vocabulary of float32 ``[N, V]`` logits.

  On the CPU, for ``platforms.reads_vocab_major(N)`` rows, the reductions run along
  axis 0 of ``x.T``, the layout the models compute such logits in there (see
  ``platforms.VOCAB_MAJOR_MAX_ROWS``): the same sums, without a transposed copy of
  the step's largest array.

  Example:
    >>> log_softmax(jnp.log(jnp.array([[1.0, 3.0]])))
    Array([[-1.3862944 , -0.28768206]], dtype=float32)
  """
  def row_wise(logits_NV):
    return logits_NV - jax.nn.logsumexp(logits_NV, axis=-1, keepdims=True)

  def vocab_major(logits_NV):
    logits_VN = logits_NV.T
    return (logits_VN - jax.nn.logsumexp(logits_VN, axis=0, keepdims=True)).T

  if platforms.reads_vocab_major(logits_NV.shape[0]):
    return platforms.on_cpu(vocab_major, row_wise, logits_NV)
  return row_wise(logits_NV)


def model_logits(step_fn: StepFn, tokens_N: Array, cache: PyTree) -> tuple[Array, PyTree]:
  """Runs ``step_fn``; returns its logits ``[N, V]`` as float32 (checked) and the new cache."""
  logits_NV, cache = step_fn(tokens_N, cache)
  rows = tokens_N.shape[0]
  if logits_NV.ndim != 2 or logits_NV.shape[0] != rows:
    raise ValueError(f"step_fn must return logits [N={rows}, V]; got shape {logits_NV.shape}")
  return logits_NV.astype(jnp.float32), cache


def _history(history_NT: Array | None) -> Array:
  if history_NT is None:
    raise ValueError("repetition control (no_repeat_ngram_size, repetition_penalty) needs "
                     "history_NT, each row's fed tokens")
  return history_NT


def apply_token_rules(logprobs_NV: Array, *, step: Array, max_decode_len: int, bos_id: int,
                      eos_id: int, pad_id: int = PAD_ID, rules: TokenRules = TokenRules(),
                      history_NT: Array | None = None, forced_N: Array | None = None,
                      penalize: bool = False) -> Array:
  """The rules of ``next_token_logprobs`` on log-probabilities already computed.

  In transformers' order: the repetition penalty (when ``penalize``), then n-gram
  blocking and the ids never emitted (``NEG_INF``), then the forced tokens (first
  token, EOS at the limit, ``forced_N``), which override everything before them;
  last, with ``rules.renormalize_logits``, a log-softmax.
  """
  vocab = logprobs_NV.shape[-1]
  if penalize and rules.repetition_penalty != 1.0:
    logprobs_NV = repetition.penalize_repeats(logprobs_NV, _history(history_NT), step,
                                              rules.repetition_penalty)
  never_V = np.zeros((vocab,), bool)
  never_V[[i for i in never_emitted(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, rules=rules)
           if i < vocab]] = True
  logprobs_NV = jnp.where(never_V[None, :], NEG_INF, logprobs_NV)
  if rules.no_repeat_ngram_size:
    banned_NV = repetition.banned_ngram_tokens(_history(history_NT), step,
                                               rules.no_repeat_ngram_size, vocab)
    logprobs_NV = jnp.where(banned_NV, NEG_INF, logprobs_NV)
  ids_1V = jnp.arange(vocab)[None, :]
  if rules.forced_bos_id is not None:
    forced_1V = jnp.where(ids_1V == rules.forced_bos_id, 0.0, NEG_INF)
    logprobs_NV = jnp.where(step == 0, forced_1V, logprobs_NV)
  if rules.force_eos_at_limit:
    eos_only_NV = jnp.where(ids_1V == eos_id, logprobs_NV, NEG_INF)
    logprobs_NV = jnp.where(step == max_decode_len - 1, eos_only_NV, logprobs_NV)
  if forced_N is not None:
    forced_NV = jnp.where(ids_1V == forced_N[:, None], 0.0, NEG_INF)
    logprobs_NV = jnp.where(forced_N[:, None] >= 0, forced_NV, logprobs_NV)
  if rules.renormalize_logits:
    logprobs_NV = log_softmax(logprobs_NV)
  return logprobs_NV

