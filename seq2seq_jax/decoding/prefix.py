"""Target prefixes: the first tokens of each output, given per sentence and forced.

A prefix travels with the batch as ``target_prefix_BP``, int ``[B, P]``: row b's
prefix tokens left-aligned, then the model's pad id. Each search forces them one
step at a time after the forced first token of ``TokenRules.forced_bos_id`` (a
multilingual checkpoint's language code) when there is one, then goes on freely.

As transformers does with ``decoder_input_ids``, the prefix is given, not chosen:
its tokens add nothing to an output's score, and beam search's length penalty
counts the tokens generated after it (the forced language code, which
transformers generates, is counted).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.types import PAD_ID, Array, ArrayLike


def pad_target_prefix(prefixes: Sequence[Sequence[int]], *, pad_id: int = PAD_ID,
                      width: int | None = None) -> np.ndarray:
  """int32 ``[B, P]``: each row's prefix, left-aligned, padded with ``pad_id``.

  Args:
    prefixes: per sentence, the token ids to force (an empty list forces nothing).
    pad_id: the model's pad id.
    width: P; default the longest prefix (at least 1). Round it up to a few widths
      so that batches of different prefixes compile once.

  Example:
    >>> pad_target_prefix([[5, 6], [], [7]])
    array([[5, 6],
           [0, 0],
           [7, 0]], dtype=int32)
  """
  longest = max((len(p) for p in prefixes), default=0)
  width = max(longest, 1) if width is None else width
  if longest > width:
    raise ValueError(f"a prefix has {longest} tokens, more than width={width}")
  out = np.full((len(prefixes), width), pad_id, np.int32)
  for row, prefix in enumerate(prefixes):
    out[row, :len(prefix)] = np.asarray(prefix, np.int32)
  return out


def prefix_lengths(target_prefix_BP: Array, pad_id: int) -> Array:
  """int32 ``[B]``: the number of prefix tokens of each row (non-pad ids, left-aligned)."""
  return jnp.sum(target_prefix_BP != pad_id, axis=1, dtype=jnp.int32)


def forced_prefix_tokens(target_prefix_BP: Array, step: Array, *, pad_id: int,
                         offset: int) -> Array:
  """int32 ``[B]``: the token each row must emit at ``step``, or -1 where it is free.

  ``offset`` is the number of tokens forced before the prefix (1 with a forced
  first token, else 0).
  """
  position = step - offset
  width = target_prefix_BP.shape[1]
  token_B = jax.lax.dynamic_index_in_dim(target_prefix_BP, jnp.clip(position, 0, width - 1),
                                         axis=1, keepdims=False)
  inside_B = (position >= 0) & (position < prefix_lengths(target_prefix_BP, pad_id))
  return jnp.where(inside_B, token_B, -1).astype(jnp.int32)


def check_target_prefix(target_prefix_BP: ArrayLike, *, batch_size: int, pad_id: int,
                        max_decode_len: int, offset: int,
                        never: Sequence[int] = (), eos_id: int | None = None) -> np.ndarray:
  """Checks a concrete prefix array on the host; returns it as int32 numpy.

  Raises ``ValueError`` naming the row for a wrong shape, a pad id inside a prefix
  (prefixes are left-aligned), an id that is never generated (``never``) or EOS,
  and a prefix that leaves no room for a generated token.
  """
  prefix = np.asarray(target_prefix_BP)
  if prefix.ndim != 2 or prefix.shape[0] != batch_size or not np.issubdtype(prefix.dtype,
                                                                              np.integer):
    raise ValueError(f"target_prefix must be integer ids [B={batch_size}, P]; got "
                     f"{prefix.dtype} {prefix.shape}")
  prefix = prefix.astype(np.int32)
  for row, ids in enumerate(prefix):
    length = int(np.sum(ids != pad_id))
    if np.any(ids[:length] == pad_id):
      raise ValueError(f"target_prefix row {row} = {ids.tolist()}: the pad id {pad_id} may "
                       "only follow the prefix (left-align each row's tokens)")
    bad = sorted(set(ids[:length].tolist()) & (set(never) | ({eos_id} - {None})))
    if bad:
      raise ValueError(f"target_prefix row {row} holds ids {bad} that are never generated "
                       "(pad, decoder start, suppressed ids, EOS); drop them from the prefix")
    if offset + length >= max_decode_len:
      raise ValueError(f"target_prefix row {row} has {length} tokens; with "
                       f"{offset} forced before it, max_decode_len={max_decode_len} leaves no "
                       f"room to generate: raise max_decode_len above {offset + length}")
  return prefix
