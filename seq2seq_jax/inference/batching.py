"""Batches for decoding: sentences sorted by length, padded to a few bucket shapes.

A corpus decoded one jitted program per shape must see few shapes, and little
padding. ``plan_batches`` puts each sentence in the shortest bucket length that
holds it, sorts each bucket's sentences longest first, and cuts them into
batches of at most ``rows_for_length`` rows (a token budget divided by the
length, capped, a multiple of ``row_multiple``); a bucket's last, partial batch is
padded up to a power-of-two multiple of ``row_multiple`` instead, so a small
input does not pay for a full batch. Each bucket length thus compiles a handful
of programs, whatever the corpus.

Example:
  >>> plan = plan_batches([3, 9, 4, 17], bucket_lengths=(8, 16, 32), max_rows=4)
  >>> [(b.length, b.rows, b.indices) for b in plan]
  [(32, 1, (3,)), (16, 1, (1,)), (8, 2, (2, 0))]
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger("seq2seq_jax")

# on_truncate(number, tokens, limit): told of each sentence cut to its limit.
TruncationHandler = Callable[[int, int, int], None]

MODEL_LIMIT = "the model's max_len"  # where a limit comes from, as warnings name it


@dataclasses.dataclass(frozen=True)
class PlannedBatch:
  """One batch of a plan: which sentences, padded to which shape ``[rows, length]``."""

  indices: tuple[int, ...]  # positions in the planned list, longest first; len <= rows
  length: int  # padded source length (a bucket length)
  rows: int  # padded row count: a multiple of row_multiple, >= len(indices)


def bucket_length(buckets: Sequence[int], length: int) -> int:
  """The shortest of ``buckets`` (sorted) that holds ``length`` tokens."""
  for bucket in buckets:
    if bucket >= length:
      return bucket
  raise ValueError(f"a sentence of {length} tokens is longer than the longest bucket "
                   f"{buckets[-1]}; truncate it first (Translator.encode does)")


def reaching(buckets: Sequence[int], limit: int) -> tuple[int, ...]:
  """Bucket lengths up to ``limit``: those of ``buckets`` below it, then the largest
  doubled while it stays below ``limit``, then ``limit`` itself.

  Buckets made for a shorter training length still reach the translator's limit in
  a few shapes (a handful of compiled programs, never one per length), and a
  sentence just over the largest bucket is not padded all the way to ``limit``.

  Example:
    >>> reaching((12, 24, 48), 128)
    (12, 24, 48, 96, 128)
  """
  kept = sorted({b for b in buckets if b < limit})
  top = kept[-1] if kept else limit
  while 2 * top < limit:
    top *= 2
    kept.append(top)
  return tuple(kept) + (limit,)


def rows_for_length(length: int, *, max_rows: int, batch_tokens: int | None,
                    row_multiple: int = 1) -> int:
  """Rows of a full batch of ``length``-token sources: the budget's share, at most ``max_rows``.

  A multiple of ``row_multiple`` and at least ``row_multiple``, so every bucket can
  be decoded, even when one row of it exceeds ``batch_tokens``.
  """
  rows = max_rows if batch_tokens is None else min(max_rows, batch_tokens // length)
  return max(row_multiple, rows // row_multiple * row_multiple)


def padded_rows(count: int, full: int, row_multiple: int = 1) -> int:
  """Rows a batch of ``count`` sentences is padded to: ``row_multiple * 2**k`` or ``full``."""
  rows = row_multiple
  while rows < count:
    rows *= 2
  return min(rows, full)


def plan_batches(lengths: Sequence[int], *, bucket_lengths: Sequence[int], max_rows: int,
                 batch_tokens: int | None = None, row_multiple: int = 1,
                 full_tails: bool = False) -> list[PlannedBatch]:
  """Cuts sentences of token ``lengths`` into batches of a few shapes.

  Args:
    lengths: each sentence's length in tokens (EOS included), at most the longest bucket.
    bucket_lengths: the padded lengths a batch may take (sorted, increasing).
    max_rows: most sentences in one batch.
    batch_tokens: most padded source tokens (rows x length) in a full batch; None:
      ``max_rows`` rows at every length.
    row_multiple: every batch's row count is a multiple of this (the data axis of
      the device mesh, so the rows split evenly over devices).
    full_tails: pad a bucket's last batch to the full row count too: one shape per
      bucket length, whatever the input (for a stream of large windows, where a tail
      is a small part of the work and every extra shape is a compiled program).

  Returns:
    Batches, longest bucket first; within a bucket, sentences longest first (ties
    in input order). The plan depends only on the arguments: rerun on the same
    input it is the same, which makes a resumed run decode every sentence in the
    same batch as an uninterrupted one.
  """
  if max_rows < 1 or row_multiple < 1:
    raise ValueError(f"max_rows={max_rows} and row_multiple={row_multiple} must be >= 1")
  buckets = tuple(sorted(bucket_lengths))
  by_bucket: dict[int, list[int]] = {}
  for index, length in enumerate(lengths):
    by_bucket.setdefault(bucket_length(buckets, length), []).append(index)
  plan = []
  for length in sorted(by_bucket, reverse=True):
    indices = sorted(by_bucket[length], key=lambda i: -lengths[i])  # stable: ties keep order
    full = rows_for_length(length, max_rows=max_rows, batch_tokens=batch_tokens,
                           row_multiple=row_multiple)
    for start in range(0, len(indices), full):
      chunk = tuple(indices[start:start + full])
      rows = full if full_tails else padded_rows(len(chunk), full, row_multiple)
      plan.append(PlannedBatch(chunk, length, rows))
  return plan


def pad_batch(rows: Sequence[Sequence[int]], *, length: int, count: int, pad_id: int,
              eos_id: int) -> np.ndarray:
  """int32 ``[count, length]``: ``rows`` padded with ``pad_id``; rows past them are an
  empty sentence (EOS alone), which every model can read."""
  batch = np.full((count, length), pad_id, np.int32)
  batch[:, 0] = eos_id
  for r, ids in enumerate(rows):
    batch[r, :len(ids)] = ids
  return batch


def warn_truncated(what: str, number: int, tokens: int, limit: int,
                   origin: str = MODEL_LIMIT) -> None:
  """Logs "WHAT NUMBER has N tokens; truncated to LIMIT (EOS included), ORIGIN"; ``origin``
  says where the limit comes from (``MODEL_LIMIT``, or a limit the user set)."""
  logger.warning("%s %d has %d tokens; truncated to %d (EOS included), %s",
                 what, number, tokens, limit, origin)


def truncate_rows(rows: Sequence[Sequence[int]], limit: int, *, what: str = "sentence",
                  numbers: Sequence[int] | None = None,
                  on_truncate: TruncationHandler | None = None,
                  origin: str = MODEL_LIMIT) -> list[list[int]]:
  """Rows longer than ``limit`` keep their first ``limit - 1`` ids and their last (EOS).

  Each cut row is reported: ``on_truncate(number, tokens, limit)``, or by default a
  warning on the ``seq2seq_jax`` logger (``warn_truncated``, naming ``origin``),
  where NUMBER is ``numbers[i]`` (e.g. a line number) or the row's index.
  """
  out = []
  for i, ids in enumerate(rows):
    if len(ids) > limit:
      number = i if numbers is None else numbers[i]
      if on_truncate is None:
        warn_truncated(what, number, len(ids), limit, origin)
      else:
        on_truncate(number, len(ids), limit)
      ids = list(ids[:limit - 1]) + list(ids[-1:])
    out.append(ids if isinstance(ids, list) else list(ids))
  return out


def encode_sources(tokenizer: Any, texts: Sequence[str], source_lang: str | None,
                   target_lang: str | None) -> list[list[int]]:
  """``tokenizer.encode_source`` with the target language passed only when given (a
  tokenizer written for the older ``encode_source(texts, lang)`` keeps working)."""
  if target_lang is None:
    return tokenizer.encode_source(list(texts), source_lang)
  return tokenizer.encode_source(list(texts), source_lang, target_lang=target_lang)
