"""Packing: several pairs to a row of the largest bucket length, the rows kept for a restart.

``pack_rows`` is the packer: best fit, longest pairs first, so a row of ``L`` tokens a
side holds pairs whose sides add up to at most ``L``. Its rows are kept beside the
prepared ids (``packing-{digest}.npz``, ``_cached_pack_rows``), so a restart reads them
instead of packing millions of pairs again; a kept file that is damaged or packs other
pairs is packed again and replaced. ``PackedBatchPlan`` shuffles the rows into the
batches of each epoch (``plans.EpochPlan``). ``batches`` then builds a batch's rows
from the ids, with segment ids and positions; ``iterators`` lists the packed batch's
keys.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import logging
import os
import pathlib
import zipfile
from typing import NamedTuple

import numpy as np

from seq2seq_jax.data import prepared
from seq2seq_jax.data.plans import EpochPlan

_log = logging.getLogger(__name__)


class PackedItem(NamedTuple):
  """A packed batch of the plan: which pairs go to which of its rows."""

  length: int  # L
  pairs_P: np.ndarray  # the pairs, row after row
  row_P: np.ndarray  # the row of each pair
  rows: int  # B, the rows of the global batch (some may stay empty)


class PackedBatchPlan(EpochPlan):
  """Batch number -> ``PackedItem(length L, pair ids [P], row of each pair [P], rows B)``.

  The kept pairs are packed once into rows of ``length`` tokens a side
  (``pack_rows``; the rows are kept beside the prepared ids for the next start).
  Which pairs share a row never matters to the model (segments do not see
  each other), only which rows share a batch: every epoch ``e`` shuffles the rows
  with ``(seed, e)`` and cuts them into batches of ``rows`` rows, the last filled
  with empty rows. Every kept pair appears exactly once per epoch, the number of
  batches per epoch is fixed, and the batches depend on the seed and the lengths
  alone: not on the number of worker processes or hosts.
  """

  def __init__(self, *, example_ids_N: np.ndarray, source_len_N: np.ndarray,
               target_len_N: np.ndarray, length: int, rows: int, seed: int,
               num_epochs: int | None, cache_dir: str | os.PathLike | None = None):
    super().__init__(seed=seed, num_epochs=num_epochs)
    self.length, self.rows = length, rows
    pairs, self._row_starts = _cached_pack_rows(
        example_ids_N, source_len_N[example_ids_N], target_len_N[example_ids_N], length, cache_dir)
    self._pairs = example_ids_N[pairs]
    self.batches_per_epoch = -(-(len(self._row_starts) - 1) // rows)
    self._check_not_empty()

  def plan_epoch(self, epoch: int) -> np.ndarray:
    """The epoch's order of the rows."""
    return np.random.default_rng([self._seed, epoch]).permutation(len(self._row_starts) - 1)

  def item(self, plan: np.ndarray, position: int):
    chosen = plan[position * self.rows:(position + 1) * self.rows]
    starts, stops = self._row_starts[chosen], self._row_starts[chosen + 1]
    sizes = stops - starts
    pair_rows = np.repeat(np.arange(len(chosen), dtype=np.int32), sizes)
    offsets = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    pairs = self._pairs[np.repeat(starts, sizes) + offsets]
    return PackedItem(self.length, pairs, pair_rows, self.rows)


def pack_rows(source_len_P: np.ndarray, target_len_P: np.ndarray, length: int
              ) -> tuple[np.ndarray, np.ndarray]:
  """Packs pairs into rows of ``length`` tokens a side: best fit, longest pairs first.

  Pairs are taken by ``source + target`` length, longest first; each goes to the
  open row with the least room left (both sides together) that holds both its
  sides, else to a new row. Rows keep their pairs in the order they came.
  About 5-10 microseconds a pair in Python; 3-4 % padding on WMT-like lengths.

  Args:
    source_len_P, target_len_P: token counts of each pair, each at most ``length``.
    length: the row length.

  Returns:
    ``(pairs, row_starts)``: the pair indices row after row, and int64 ``[rows + 1]``
    offsets into them (row r holds ``pairs[row_starts[r]:row_starts[r + 1]]``).
  """
  source_P = np.asarray(source_len_P, np.int64)
  target_P = np.asarray(target_len_P, np.int64)
  if not len(source_P):
    return np.zeros(0, np.int64), np.zeros(1, np.int64)
  if max(source_P.max(), target_P.max()) > length:
    raise ValueError(f"a pair is longer than the row length {length}")
  order = np.lexsort((np.arange(len(source_P)), -(source_P + target_P)))
  smallest = int((source_P + target_P).min())
  by_room: dict[int, list[int]] = {}  # room left (both sides) -> open rows with that room
  rooms: list[int] = []  # the keys of by_room, sorted
  room_source: list[int] = []
  room_target: list[int] = []
  rows: list[list[int]] = []
  for item, (s, t) in enumerate(zip(source_P[order].tolist(), target_P[order].tolist())):
    chosen = -1
    i = bisect.bisect_left(rooms, s + t)
    while i < len(rooms):
      candidates = by_room[rooms[i]]
      for j in range(len(candidates) - 1, max(-1, len(candidates) - 5), -1):
        if room_source[candidates[j]] >= s and room_target[candidates[j]] >= t:
          chosen = candidates.pop(j)
          break
      if chosen >= 0:
        if not candidates:
          del by_room[rooms[i]]
          del rooms[i]
        break
      i += 1
    if chosen < 0:
      chosen = len(rows)
      rows.append([])
      room_source.append(length)
      room_target.append(length)
    rows[chosen].append(item)
    room_source[chosen] -= s
    room_target[chosen] -= t
    room = room_source[chosen] + room_target[chosen]
    if room >= smallest and min(room_source[chosen], room_target[chosen]) > 0:
      if room not in by_room:
        by_room[room] = []
        bisect.insort(rooms, room)
      by_room[room].append(chosen)
  row_starts = np.zeros(len(rows) + 1, np.int64)
  row_starts[1:] = np.cumsum([len(row) for row in rows])
  flat = np.fromiter((i for row in rows for i in row), np.int64, int(row_starts[-1]))
  return order[flat], row_starts


_PACKING_FORMAT = "pack_rows v2"  # a new packer or file layout: a new version, other names


def _cached_pack_rows(example_ids_P: np.ndarray, source_len_P: np.ndarray,
                      target_len_P: np.ndarray, length: int, cache_dir
                      ) -> tuple[np.ndarray, np.ndarray]:
  """``pack_rows`` of pairs ``example_ids_P``, kept in ``cache_dir`` (the prepared ids' folder),
  so a restart reads the rows instead of packing millions of pairs again.

  The file, ``packing-{digest[:16]}.npz``, holds the rows and the whole sha256 of what
  they pack: the pair ids, their lengths, the row length and ``_PACKING_FORMAT``. A
  file that is unreadable, damaged, or packs something else (built from other ids,
  lengths or settings) is packed again and replaced, with a warning naming it. It is
  written under a name no other host or process uses, then renamed.
  """
  if cache_dir is None:
    return pack_rows(source_len_P, target_len_P, length)
  digest = hashlib.sha256(f"{_PACKING_FORMAT} {length}".encode())
  for values in (example_ids_P, source_len_P, target_len_P):
    digest.update(np.ascontiguousarray(values, np.int32).tobytes())
  key = digest.hexdigest()
  path = pathlib.Path(cache_dir) / f"packing-{key[:16]}.npz"
  if path.exists():
    try:
      # Opened here: np.load leaves its own file open when the zip is unreadable.
      with open(path, "rb") as handle, np.load(handle) as cached:
        pairs, row_starts, written = cached["pairs"], cached["row_starts"], str(cached["digest"])
      problem = _packing_problem(pairs, row_starts, written, key, source_len_P, target_len_P,
                                 length)
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as e:
      problem = f"unreadable ({type(e).__name__}: {e})"
    if problem is None:
      return pairs, row_starts
    _log.warning("packing cache %s is %s: packing the rows again and replacing it", path, problem)
  pairs, row_starts = pack_rows(source_len_P, target_len_P, length)
  partial = path.with_name(f"{path.stem}.{prepared.writer_tag()}.partial.npz")
  try:
    np.savez(partial, pairs=pairs, row_starts=row_starts, digest=np.asarray(key))
    partial.replace(path)
  except OSError as e:  # a read-only folder: pack again next time
    _log.info("could not keep the packed rows in %s (%s)", path, e)
    with contextlib.suppress(OSError):
      partial.unlink()
  return pairs, row_starts


def _packing_problem(pairs: np.ndarray, row_starts: np.ndarray, written: str, key: str,
                     source_len_P: np.ndarray, target_len_P: np.ndarray, length: int) -> str | None:
  """What is wrong with cached rows, or None: a check worth its milliseconds, since a wrong
  row would pass unseen into every batch."""
  if written != key:
    return "of other pairs (built from other ids, lengths or settings)"
  count = len(source_len_P)
  if (pairs.ndim != 1 or row_starts.ndim != 1 or len(pairs) != count or not len(row_starts)
      or row_starts[0] != 0 or row_starts[-1] != count or (np.diff(row_starts) <= 0).any()):
    return "damaged (its rows do not cover the pairs once)"
  if count and (pairs.min() < 0 or pairs.max() >= count
                or (np.bincount(pairs, minlength=count) != 1).any()):
    return "damaged (its rows do not hold every pair once)"
  starts = row_starts[:-1]
  if count and max(np.add.reduceat(source_len_P[pairs], starts).max(),
                   np.add.reduceat(target_len_P[pairs], starts).max()) > length:
    return f"damaged (a row holds more than {length} tokens a side)"
  return None
