"""The step-function contract every decoder drives, and helpers the decoders share."""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp

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


def check_decode_args(*, batch_size: int, max_decode_len: int, bos_id: int, eos_id: int) -> None:
  """Raises ``ValueError`` on a decode request that cannot work, naming the argument."""
  for name, value in (("batch_size", batch_size), ("max_decode_len", max_decode_len)):
    if not isinstance(value, int) or value <= 0:
      raise ValueError(f"{name}={value!r} must be a positive integer")
  if len({PAD_ID, bos_id, eos_id}) != 3:
    raise ValueError(f"PAD_ID={PAD_ID}, bos_id={bos_id} and eos_id={eos_id} must be distinct")


def check_cache(cache: PyTree, rows: int, what: str = "cache") -> None:
  """Raises unless every non-scalar leaf has ``rows`` on axis 0 (scalars are shared)."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
    shape = jnp.shape(leaf)
    if shape and shape[0] != rows:
      raise ValueError(f"{what} leaf {jax.tree_util.keystr(path)} has shape {shape}; every "
                       f"non-scalar {what} leaf needs the batch ({rows} rows) on axis 0")


def next_token_logprobs(step_fn: StepFn, tokens_N: Array, cache: PyTree, *,
                        bos_id: int) -> tuple[Array, PyTree]:
  """Runs one step; returns float32 log-probabilities ``[N, V]`` and the new cache.

  PAD and BOS can never be generated: PAD would read as the end of the output and
  BOS only ever starts it. They get ``NEG_INF`` after the log-softmax, so the
  scores of the other tokens stay the model's own log-probabilities.
  """
  logits_NV, cache = step_fn(tokens_N, cache)
  rows = tokens_N.shape[0]
  if logits_NV.ndim != 2 or logits_NV.shape[0] != rows:
    raise ValueError(f"step_fn must return logits [N={rows}, V]; got shape {logits_NV.shape}")
  logprobs_NV = jax.nn.log_softmax(logits_NV.astype(jnp.float32), axis=-1)
  return logprobs_NV.at[:, (PAD_ID, bos_id)].set(NEG_INF), cache
