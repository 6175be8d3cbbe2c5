"""Batches: the bucket plan, and the rows of a batch built from prepared ids (or from text).

Bucketed rows: each pair goes to the smallest bucket length ``L >= max(source length,
target length)``; a batch of bucket ``L`` has ``rows(L) = batch_tokens // L`` rounded
down to a multiple of ``batch_multiple`` rows (``plans.bucket_rows``), so ``rows * L <=
batch_tokens`` and XLA sees one shape per bucket. Per epoch (seeded by ``(seed,
epoch)``, ``TrainBatchPlan``), every bucket's pairs are shuffled and cut into batches,
the last one filled with padding rows, and the batches are shuffled: every kept pair
appears exactly once per epoch. Packed rows are planned in ``packing``.

A plan item becomes this host's rows of the batch in ``MakeIdsBatch``: vectorised
numpy gathers the ids of bucketed rows and scatters those of packed rows (with segment
ids and positions) straight from the prepared ids; ``MakeBatch`` tokenizes the rows'
text instead (``DataConfig.tokenize_once=False``, and the evaluation batches). A pair
over the length limits keeps its first ``limit - 1`` ids and its last (EOS). The keys
of a batch are listed in ``iterators``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import prepared
from seq2seq_jax.data.builders import TextPairs
from seq2seq_jax.data.plans import EpochPlan
from seq2seq_jax.data.packing import PackedItem
from seq2seq_jax.data.tokenizer import Tokenizer

Batch = dict[str, np.ndarray]


class BucketItem(NamedTuple):
  """A bucketed batch of the plan: its length and the pairs of its rows."""

  length: int  # L
  ids_B: np.ndarray  # the pair in each row, -1 = a padding row


class TrainBatchPlan(EpochPlan):
  """Batch number -> ``BucketItem(length L, example ids [B] with -1 for padding rows)``.

  Epoch ``e`` is planned from ``(seed, e)`` alone: shuffle each bucket's pairs, cut
  them into batches of that bucket's rows, fill the last with -1, shuffle the batches.
  """

  def __init__(self, *, example_ids_N: np.ndarray, bucket_index_N: np.ndarray,
               bucket_lengths: Sequence[int], rows: Sequence[int], seed: int,
               num_epochs: int | None):
    super().__init__(seed=seed, num_epochs=num_epochs)
    self._members = [example_ids_N[bucket_index_N == b] for b in range(len(bucket_lengths))]
    self._lengths = tuple(bucket_lengths)
    self._rows = tuple(rows)
    self.batches_per_epoch = sum(-(-len(m) // r) for m, r in zip(self._members, self._rows))
    self._check_not_empty()

  def plan_epoch(self, epoch: int) -> list[BucketItem]:
    """Every batch of ``epoch`` in order: ``(length, example ids [B], -1 = padding)``."""
    rng = np.random.default_rng([self._seed, epoch])
    batches = []
    for members, length, rows in zip(self._members, self._lengths, self._rows):
      if not len(members):
        continue
      shuffled = rng.permutation(members)
      padded = np.full(-(-len(shuffled) // rows) * rows, -1, np.int32)
      padded[:len(shuffled)] = shuffled
      batches.extend(BucketItem(length, ids) for ids in padded.reshape(-1, rows))
    return [batches[i] for i in rng.permutation(len(batches))]


class MakeBatch:
  """``(length L, example ids [B])`` -> this host's rows of the batch dict, tokenized; ``langs``
  are the language codes the tokenizer is given (``prepared.languages``)."""

  def __init__(self, pairs: TextPairs, tokenizer: Tokenizer, data_config: DataConfig, *,
               langs: tuple[str | None, str | None], shard_index: int, shard_count: int):
    self._pairs = pairs
    self._tokenizer = tokenizer
    self._max_source_len = data_config.max_source_len
    self._max_target_len = data_config.max_target_len
    self._langs = langs
    self._shard_index = shard_index
    self._shard_count = shard_count

  def __call__(self, item: BucketItem) -> Batch:
    length, ids_B = item
    rows = len(ids_B) // self._shard_count
    ids_B = np.asarray(ids_B[self._shard_index * rows:(self._shard_index + 1) * rows], np.int32)
    real = np.flatnonzero(ids_B >= 0)
    texts = self._pairs.__getitems__(ids_B[real].tolist())
    pad_id = self._tokenizer.pad_id
    batch = {}
    for key, encode, side, limit in (
        ("inputs", lambda t, _: prepared.encode_sources(self._tokenizer, t, self._langs), 0,
         self._max_source_len),
        ("targets", self._tokenizer.encode_target, 1, self._max_target_len)):
      encoded = encode([pair[side] for pair in texts], self._langs[side])
      len_R = np.fromiter(map(len, encoded), np.int64, len(encoded))
      flat = np.fromiter((i for ids in encoded for i in ids), np.int32, int(len_R.sum()))
      out_BL = np.full((rows, length), pad_id, np.int32)
      out_BL[real] = _gather_side(flat, np.cumsum(len_R) - len_R, len_R, limit, length, pad_id)
      batch[key] = out_BL
    return {**batch, "index": ids_B, "weights": (ids_B >= 0).astype(np.float32)}


def _truncation(len_P: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Which ids of each pair a batch keeps: all of a pair within ``limit``; of a longer one its
  first ``limit - 1`` ids and its last (EOS; a language code in front stays).

  Returns:
    ``(keep_P, within, offset)``: ids kept per pair; for every kept id, pair after pair,
    its place among the pair's kept ids and its offset among the pair's ids.
  """
  keep_P = np.minimum(len_P, limit)
  first_P = np.cumsum(keep_P) - keep_P
  within = np.arange(int(keep_P.sum())) - np.repeat(first_P, keep_P)
  last = (within == np.repeat(keep_P - 1, keep_P)) & np.repeat(len_P > keep_P, keep_P)
  return keep_P, within, np.where(last, np.repeat(len_P - 1, keep_P), within)


def _plan_disagrees(what: str) -> RuntimeError:
  return RuntimeError(f"{what}: the lengths the batch plan was made from disagree with the ids "
                      "(the tokenizer or the prepared ids changed since)")


def _gather_side(flat: np.ndarray, start_R: np.ndarray, len_R: np.ndarray, limit: int,
                 width: int, pad_id: int) -> np.ndarray:
  """``[R, width]`` rows of ids cut out of ``flat`` (``len_R`` ids from ``start_R``), each
  truncated to ``limit`` (``_truncation``) and padded."""
  keep_R, within, offset = _truncation(len_R, limit)
  if len(keep_R) and keep_R.max() > width:
    raise _plan_disagrees(f"a pair of {keep_R.max()} tokens does not fit its row of {width}")
  out = np.full((len(len_R), width), pad_id, np.int32)
  out[np.repeat(np.arange(len(len_R)), keep_R), within] = flat[np.repeat(start_R, keep_R) + offset]
  return out


def _scatter_side(flat: np.ndarray, start_P: np.ndarray, len_P: np.ndarray, limit: int,
                  row_P: np.ndarray, shape: tuple[int, int], pad_id: int) -> dict[str, np.ndarray]:
  """Packed rows of one side: ids, segment ids (1, 2, ... per row) and positions; each pair
  truncated to ``limit`` (``_truncation``)."""
  keep_P, within, offset = _truncation(len_P, limit)
  first_P = np.r_[True, row_P[1:] != row_P[:-1]] if len(row_P) else np.zeros(0, bool)
  group_start = np.maximum.accumulate(np.where(first_P, np.arange(len(row_P)), 0))
  segment_P = np.arange(len(row_P)) - group_start + 1
  end_P = np.cumsum(keep_P)
  column_P = end_P - keep_P - (end_P - keep_P)[group_start]
  rows, cols = np.repeat(row_P, keep_P), np.repeat(column_P, keep_P) + within
  if len(cols) and cols.max() >= shape[1]:
    raise _plan_disagrees(f"packed pairs need {cols.max() + 1} slots of a row of {shape[1]}")
  ids = np.full(shape, pad_id, np.int32)
  segments = np.zeros(shape, np.int32)
  positions = np.zeros(shape, np.int32)
  ids[rows, cols] = flat[np.repeat(start_P, keep_P) + offset]
  segments[rows, cols] = np.repeat(segment_P, keep_P)
  positions[rows, cols] = within
  return {"": ids, "_segment_ids": segments, "_positions": positions}


class MakeIdsBatch:
  """A plan item -> this host's rows of the batch, gathered from prepared ids (no tokenizer)."""

  def __init__(self, ids: prepared.PreparedIds, data_config: DataConfig, pad_id: int, *,
               shard_index: int, shard_count: int):
    self._ids = ids
    self._limits = (data_config.max_source_len, data_config.max_target_len)
    self._pad_id = pad_id
    self._shard_index = shard_index
    self._shard_count = shard_count

  def __call__(self, item: BucketItem | PackedItem) -> Batch:
    if isinstance(item, PackedItem):
      return self._packed(*item)
    length, ids_B = item
    rows = len(ids_B) // self._shard_count
    ids_B = np.asarray(ids_B[self._shard_index * rows:(self._shard_index + 1) * rows], np.int64)
    real = np.flatnonzero(ids_B >= 0)
    pairs_R = ids_B[real]
    flat, source_R, target_R, start_R = self._read(pairs_R)
    batch = {}
    for key, start, len_R, limit in (("inputs", start_R, source_R, self._limits[0]),
                                     ("targets", start_R + source_R, target_R, self._limits[1])):
      out_BL = np.full((rows, length), self._pad_id, np.int32)
      out_BL[real] = _gather_side(flat, start, len_R, limit, length, self._pad_id)
      batch[key] = out_BL
    index_B = np.full(rows, -1, np.int32)
    index_B[real] = self._ids.line_N[pairs_R]
    batch["index"] = index_B
    batch["weights"] = (ids_B >= 0).astype(np.float32)
    return batch

  def _read(self, pairs_P: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ids of ``pairs_P`` end to end, their source and target lengths, and where each
    pair starts in them."""
    flat = self._ids.flat(pairs_P)
    source_P = self._ids.source_len_N[pairs_P].astype(np.int64)
    target_P = self._ids.target_len_N[pairs_P].astype(np.int64)
    return flat, source_P, target_P, np.cumsum(source_P + target_P) - (source_P + target_P)

  def _packed(self, length: int, pairs_P: np.ndarray, row_P: np.ndarray, total_rows: int
              ) -> Batch:
    rows = total_rows // self._shard_count
    low = self._shard_index * rows
    mine = (row_P >= low) & (row_P < low + rows)
    pairs_P, row_P = np.asarray(pairs_P, np.int64)[mine], np.asarray(row_P, np.int64)[mine] - low
    flat, source_P, target_P, start_P = self._read(pairs_P)
    batch = {}
    for key, start, len_P, limit in (("inputs", start_P, source_P, self._limits[0]),
                                     ("targets", start_P + source_P, target_P, self._limits[1])):
      for suffix, value in _scatter_side(flat, start, len_P, limit, row_P, (rows, length),
                                         self._pad_id).items():
        batch[key + suffix] = value
    batch["weights"] = (np.bincount(row_P, minlength=rows) > 0).astype(np.float32)
    return batch
