"""The step-function contract every decoder drives, and helpers the decoders share."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

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
  """Constraints on the emitted tokens beyond the model's own ids (hashable, static).

  The rules of published checkpoints' ``generation_config.json``: ``forced_bos_id``
  is emitted as the first token whatever the model says (M2M100 / NLLB's target
  language code; it adds 0 to the score, the model did not choose it);
  ``force_eos_at_limit`` makes an output reaching the length limit end with EOS (its
  log-probability counts); ``suppress_ids`` are never emitted (single-token
  ``bad_words_ids``), beside the pad and decoder start ids which never are.
  """

  suppress_ids: tuple[int, ...] = ()
  forced_bos_id: int | None = None
  force_eos_at_limit: bool = False


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
  """The ids a search never emits: PAD, the decoder start (unless it is EOS), suppressed ids."""
  never = {pad_id, bos_id} | set(rules.suppress_ids)
  if bos_id == eos_id:
    never.discard(eos_id)
  return tuple(sorted(never))


def next_token_logprobs(step_fn: StepFn, tokens_N: Array, cache: PyTree, *, step: Array,
                        max_decode_len: int, bos_id: int, eos_id: int, pad_id: int = PAD_ID,
                        rules: TokenRules = TokenRules()) -> tuple[Array, PyTree]:
  """Runs one step; returns float32 log-probabilities ``[N, V]`` and the new cache.

  PAD and the decoder start ``bos_id`` can never be generated: PAD would read as the
  end of the output and the start token only ever begins it (unless it is EOS, as in
  M2M100). They, and ``rules.suppress_ids``, get ``NEG_INF`` after the log-softmax,
  so the scores of the other tokens stay the model's own log-probabilities. At
  ``step`` 0 a ``rules.forced_bos_id`` gets 0 and every other token ``NEG_INF``; at
  the last step (``max_decode_len - 1``) ``rules.force_eos_at_limit`` leaves only EOS.
  """
  logits_NV, cache = step_fn(tokens_N, cache)
  rows = tokens_N.shape[0]
  if logits_NV.ndim != 2 or logits_NV.shape[0] != rows:
    raise ValueError(f"step_fn must return logits [N={rows}, V]; got shape {logits_NV.shape}")
  logits_NV = logits_NV.astype(jnp.float32)
  vocab = logits_NV.shape[-1]
  # x - logsumexp(x), and the never-emitted ids masked by a where over a constant [V] mask
  # rather than scattered: XLA's CPU backend then fuses all of it with the search's own
  # elementwise work; log_softmax and a scatter cost 1.5x as much at a 58k vocabulary.
  logprobs_NV = logits_NV - jax.nn.logsumexp(logits_NV, axis=-1, keepdims=True)
  never_V = np.zeros((vocab,), bool)
  never_V[[i for i in never_emitted(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, rules=rules)
           if i < vocab]] = True
  logprobs_NV = jnp.where(never_V[None, :], NEG_INF, logprobs_NV)
  ids_1V = jnp.arange(vocab)[None, :]
  if rules.forced_bos_id is not None:
    forced_1V = jnp.where(ids_1V == rules.forced_bos_id, 0.0, NEG_INF)
    logprobs_NV = jnp.where(step == 0, forced_1V, logprobs_NV)
  if rules.force_eos_at_limit:
    eos_only_NV = jnp.where(ids_1V == eos_id, logprobs_NV, NEG_INF)
    logprobs_NV = jnp.where(step == max_decode_len - 1, eos_only_NV, logprobs_NV)
  return logprobs_NV, cache
