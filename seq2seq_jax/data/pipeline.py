"""grain input pipelines: bucketed training batches by token budget, evaluation batches in file order.

Every batch is a dict of numpy arrays (``L`` is one of ``DataConfig.bucket_lengths``):

========= ============== =======================================================
key       shape, dtype   meaning
========= ============== =======================================================
inputs    [B, L] int32   ``tokenizer.encode_source`` (pieces, EOS), then its PAD
targets   [B, L] int32   ``tokenizer.encode_target``, then PAD; no decoder start
index     [B] int32      the pair's line in its split (0-based); -1 = padding row
weights   [B] float32    1.0 for a real pair, 0.0 for a padding row (all PAD)
========= ============== =======================================================

Packed training batches (``DataConfig.packing``) have no ``index``; their rows
are of the largest bucket length and hold several pairs, with four more keys:

===================== ============== ==================================================
key                   shape, dtype   meaning
===================== ============== ==================================================
inputs_segment_ids    [B, L] int32   1, 2, ... for the row's 1st, 2nd, ... pair; 0 = PAD
targets_segment_ids   [B, L] int32   the same numbers on the target side
inputs_positions      [B, L] int32   0, 1, ... restarting in every segment; 0 on PAD
targets_positions     [B, L] int32   the same on the target side
===================== ============== ==================================================

Training (``make_train_iterator``): the split is tokenized once into ids
(``prepared.prepare_ids``: ArrayRecord shards and a lengths index, keyed by the
tokenizer's hash; process 0 writes, other hosts wait) and every start reads the
index, never the text; ``DataConfig.tokenize_once=False`` tokenizes each batch's
text instead (the old path, same batches). Pairs longer than ``max_source_len``
/ ``max_target_len`` tokens (EOS included) are dropped or truncated
(``DataConfig.too_long``; counted in ``TrainStats`` and logged). Each pair goes
to the smallest bucket length ``L >= max(source length, target length)``; a
batch of bucket ``L`` has ``rows(L) = batch_tokens // L`` rounded down to a
multiple of ``batch_multiple`` rows, so ``rows * L <= batch_tokens`` and XLA
sees one shape per bucket. Per epoch (seeded by ``(seed, epoch)``), every
bucket's pairs are shuffled and cut into batches, the last one filled with
padding rows, and the batches are shuffled: every kept pair appears exactly once
per epoch. With packing, the pairs are packed once into rows of the largest
bucket (``pack_rows``) and each epoch shuffles the rows into batches. The batch
plan is a function of the seed and the token lengths, so the iterator's state is
grain's own (the next batch number) and restores exactly: save it with
``grain.checkpoint.CheckpointSave(iterator)`` inside ``ocp.args.Composite``.
Multi-host: every host computes the same global plan and takes rows ``[h * B /
n, (h + 1) * B / n)`` of each global batch (``shard_index`` ``h``,
``shard_count`` ``n``: pass ``jax.process_index()``, ``jax.process_count()``),
reading only its own rows' ids, so all hosts step through the same shapes.

Batches are gathered from ids with vectorised numpy on grain's prefetch threads
(``DEFAULT_READ_OPTIONS``), or in ``DataConfig.num_workers`` grain worker
processes (``mp_prefetch``). Batch ``i`` is the same whatever the number of
workers or hosts, packed or not: the plan fixes each batch's pairs before any
worker sees it (grain's own packers, which pack each worker's stream as it comes,
do not promise that). Grain's workers need absl flags parsed; the iterator marks
them parsed outside an absl app.

Evaluation (``make_eval_batches``): the split in file order, ``eval_batch_size``
rows per batch (the last filled with padding rows, ``weights`` 0), each batch
padded to the smallest bucket that holds it; over-long pairs are truncated (a
warning), never dropped. ``load_eval_text`` gives the raw sentences for BLEU.

Example:
  >>> from seq2seq_jax.data.tokenizer import train_tokenizer
  >>> config = DataConfig(manual_dir="../shared/data/multi30k_tiny", vocab_size=500)
  >>> tokenizer = train_tokenizer(config)  # prepares the corpus once
  Downloading and preparing dataset ...
  >>> iterator = make_train_iterator(config, tokenizer, seed=0)
  >>> batch = next(iterator)
  >>> sorted(batch), batch["inputs"].shape[0] % config.batch_multiple
  (['index', 'inputs', 'targets', 'weights'], 0)
  >>> state = iterator.get_state()  # or grain.checkpoint.CheckpointSave(iterator) with orbax
  >>> rows = sum(int(batch["weights"].sum()) for batch in make_eval_batches(config, tokenizer))
  >>> text = load_eval_text(config)  # the same split as raw sentences, for BLEU
  >>> rows == len(text.sources) == len(text.references)
  True
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import hashlib
import logging
import os
import pathlib
import sys
import threading
import zipfile
from collections.abc import Sequence
from typing import Any, NamedTuple

import grain
import numpy as np

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import prepared
from seq2seq_jax.data.builders import TextPairs, load_split
from seq2seq_jax.data.text_files import DataError
from seq2seq_jax.data.tokenizer import Tokenizer

Batch = dict[str, np.ndarray]

# A few batches ahead on two threads: tokenizing is cheap, and cores are shared with XLA.
DEFAULT_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainStats:
  """What the training pipeline kept, dropped and batched (global, all hosts)."""

  num_pairs: int  # pairs in the training split
  num_too_long: int  # pairs over max_source_len or max_target_len (EOS included)
  num_filtered: int  # of those, dropped (too_long="filter")
  num_truncated: int  # of those, truncated (too_long="truncate")
  filtered_tokens: int  # source + target tokens (EOS included) of the dropped pairs
  num_tokens: int  # source + target tokens of the kept pairs, after truncation
  pairs_per_bucket: dict[int, int]  # bucket length -> kept pairs
  rows_per_bucket: dict[int, int]  # bucket length -> global rows of its batches
  batches_per_epoch: int
  padding_fraction: float  # share of the batches' [B, L] cells (both sides) that are PAD


@dataclasses.dataclass(frozen=True)
class EvalText:
  """Raw sentences of an evaluation split in file order (what BLEU compares against)."""

  sources: list[str]
  references: list[str]


class _BucketItem(NamedTuple):
  """A bucketed batch of the plan: its length and the pairs of its rows."""

  length: int  # L
  ids_B: np.ndarray  # the pair in each row, -1 = a padding row


class _PackedItem(NamedTuple):
  """A packed batch of the plan: which pairs go to which of its rows."""

  length: int  # L
  pairs_P: np.ndarray  # the pairs, row after row
  row_P: np.ndarray  # the row of each pair
  rows: int  # B, the rows of the global batch (some may stay empty)


def bucket_rows(data_config: DataConfig, length: int) -> int:
  """Global rows of a training batch of bucket ``length``: a multiple of batch_multiple."""
  rows = data_config.batch_tokens // length // data_config.batch_multiple * data_config.batch_multiple
  if rows <= 0:
    raise ValueError(f"DataConfig.batch_tokens={data_config.batch_tokens} cannot hold "
                     f"batch_multiple={data_config.batch_multiple} rows of length {length}: raise "
                     f"batch_tokens to at least {data_config.batch_multiple * length}")
  return rows


languages = prepared.languages
_encode_sources = prepared.encode_sources


def token_lengths(pairs: TextPairs, tokenizer: Tokenizer, *, chunk: int = 4096,
                  langs: tuple[str | None, str | None] = (None, None)
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Token counts (EOS included) of every pair; ``langs`` see ``languages``.

  Returns:
    ``(source_len_N, target_len_N)``, int32 ``[N]`` each, in file order.
  """
  source_len_N = np.zeros(len(pairs), np.int32)
  target_len_N = np.zeros(len(pairs), np.int32)
  for start in range(0, len(pairs), chunk):
    batch = pairs.__getitems__(list(range(start, min(start + chunk, len(pairs)))))
    stop = start + len(batch)
    sources, targets = [s for s, _ in batch], [t for _, t in batch]
    source_len_N[start:stop] = [len(ids) for ids in _encode_sources(tokenizer, sources, langs)]
    target_len_N[start:stop] = [len(ids) for ids in tokenizer.encode_target(targets, langs[1])]
  return source_len_N, target_len_N


def _bucket_index(data_config: DataConfig, length_N: np.ndarray) -> np.ndarray:
  """Index into bucket_lengths of the smallest bucket >= each length."""
  index_N = np.searchsorted(np.asarray(data_config.bucket_lengths), length_N, side="left")
  assert (index_N < len(data_config.bucket_lengths)).all(), "lengths are clipped before bucketing"
  return index_N


def _check_shard(data_config: DataConfig, shard_index: int, shard_count: int) -> None:
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index={shard_index} must be in [0, shard_count={shard_count})")
  if data_config.batch_multiple % shard_count:
    raise ValueError(f"DataConfig.batch_multiple={data_config.batch_multiple} must be a multiple "
                     f"of shard_count={shard_count} (the number of hosts) so that every host gets "
                     "an equal share of each batch; set it to the global device count")


class _EpochPlan(grain.MapDataset):
  """Batch number -> plan item, epoch by epoch: each epoch planned from ``(seed, epoch)`` alone
  (``plan_epoch``), the latest epoch's plan kept. Subclasses set ``batches_per_epoch``."""

  batches_per_epoch: int

  def __init__(self, *, seed: int, num_epochs: int | None):
    super().__init__()
    self._seed = seed
    self._num_epochs = num_epochs
    self._cache: tuple[int, Any] | None = None
    self._lock = threading.Lock()

  def _check_not_empty(self) -> None:
    if not self.batches_per_epoch:
      raise DataError("no training pair is left after filtering: raise DataConfig.max_source_len "
                      "/ max_target_len or set too_long='truncate'")

  def __len__(self) -> int:
    if self._num_epochs is None:
      return sys.maxsize
    return self._num_epochs * self.batches_per_epoch

  def __str__(self) -> str:
    return (f"{type(self).__name__}(batches_per_epoch={self.batches_per_epoch}, "
            f"seed={self._seed})")

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_lock"] = None
    state["_cache"] = None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def plan_epoch(self, epoch: int) -> Any:
    raise NotImplementedError

  def item(self, plan: Any, position: int):
    """Batch ``position`` of an epoch's ``plan``."""
    return plan[position]

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    if index < 0 or index >= len(self):
      raise IndexError(f"batch {index} is outside [0, {len(self)})")
    epoch, position = divmod(index, self.batches_per_epoch)
    with self._lock:
      if self._cache is None or self._cache[0] != epoch:
        self._cache = (epoch, self.plan_epoch(epoch))
      plan = self._cache[1]
    return self.item(plan, position)


class _TrainBatchPlan(_EpochPlan):
  """Batch number -> ``_BucketItem(length L, example ids [B] with -1 for padding rows)``.

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

  def plan_epoch(self, epoch: int) -> list[_BucketItem]:
    """Every batch of ``epoch`` in order: ``(length, example ids [B], -1 = padding)``."""
    rng = np.random.default_rng([self._seed, epoch])
    batches = []
    for members, length, rows in zip(self._members, self._lengths, self._rows):
      if not len(members):
        continue
      shuffled = rng.permutation(members)
      padded = np.full(-(-len(shuffled) // rows) * rows, -1, np.int32)
      padded[:len(shuffled)] = shuffled
      batches.extend(_BucketItem(length, ids) for ids in padded.reshape(-1, rows))
    return [batches[i] for i in rng.permutation(len(batches))]


class _MakeBatch:
  """``(length L, example ids [B])`` -> this host's rows of the batch dict, tokenized."""

  def __init__(self, pairs: TextPairs, tokenizer: Tokenizer, data_config: DataConfig, *,
               shard_index: int, shard_count: int):
    self._pairs = pairs
    self._tokenizer = tokenizer
    self._max_source_len = data_config.max_source_len
    self._max_target_len = data_config.max_target_len
    self._langs = languages(data_config, tokenizer)
    self._shard_index = shard_index
    self._shard_count = shard_count

  def __call__(self, item: _BucketItem) -> Batch:
    length, ids_B = item
    rows = len(ids_B) // self._shard_count
    ids_B = np.asarray(ids_B[self._shard_index * rows:(self._shard_index + 1) * rows], np.int32)
    real = np.flatnonzero(ids_B >= 0)
    texts = self._pairs.__getitems__(ids_B[real].tolist())
    pad_id = self._tokenizer.pad_id
    batch = {}
    for key, encode, side, limit in (
        ("inputs", lambda t, _: _encode_sources(self._tokenizer, t, self._langs), 0,
         self._max_source_len),
        ("targets", self._tokenizer.encode_target, 1, self._max_target_len)):
      encoded = encode([pair[side] for pair in texts], self._langs[side])
      len_R = np.fromiter(map(len, encoded), np.int64, len(encoded))
      flat = np.fromiter((i for ids in encoded for i in ids), np.int32, int(len_R.sum()))
      out_BL = np.full((rows, length), pad_id, np.int32)
      out_BL[real] = _gather_side(flat, np.cumsum(len_R) - len_R, len_R, limit, length, pad_id)
      batch[key] = out_BL
    return {**batch, "index": ids_B, "weights": (ids_B >= 0).astype(np.float32)}


class _PackedBatchPlan(_EpochPlan):
  """Batch number -> ``_PackedItem(length L, pair ids [P], row of each pair [P], rows B)``.

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
    return _PackedItem(self.length, pairs, pair_rows, self.rows)


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


class _MakeIdsBatch:
  """A plan item -> this host's rows of the batch, gathered from prepared ids (no tokenizer)."""

  def __init__(self, ids: prepared.PreparedIds, data_config: DataConfig, pad_id: int, *,
               shard_index: int, shard_count: int):
    self._ids = ids
    self._limits = (data_config.max_source_len, data_config.max_target_len)
    self._pad_id = pad_id
    self._shard_index = shard_index
    self._shard_count = shard_count

  def __call__(self, item: _BucketItem | _PackedItem) -> Batch:
    if isinstance(item, _PackedItem):
      return self._packed(*item)
    length, ids_B = item
    rows = len(ids_B) // self._shard_count
    ids_B = np.asarray(ids_B[self._shard_index * rows:(self._shard_index + 1) * rows], np.int64)
    real = np.flatnonzero(ids_B >= 0)
    pairs_R = ids_B[real]
    flat = self._ids.flat(pairs_R)
    source_R = self._ids.source_len_N[pairs_R].astype(np.int64)
    target_R = self._ids.target_len_N[pairs_R].astype(np.int64)
    start_R = np.cumsum(source_R + target_R) - (source_R + target_R)
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

  def _packed(self, length: int, pairs_P: np.ndarray, row_P: np.ndarray, total_rows: int
              ) -> Batch:
    rows = total_rows // self._shard_count
    low = self._shard_index * rows
    mine = (row_P >= low) & (row_P < low + rows)
    pairs_P, row_P = np.asarray(pairs_P, np.int64)[mine], np.asarray(row_P, np.int64)[mine] - low
    flat = self._ids.flat(pairs_P)
    source_P = self._ids.source_len_N[pairs_P].astype(np.int64)
    target_P = self._ids.target_len_N[pairs_P].astype(np.int64)
    start_P = np.cumsum(source_P + target_P) - (source_P + target_P)
    batch = {}
    for key, start, len_P, limit in (("inputs", start_P, source_P, self._limits[0]),
                                     ("targets", start_P + source_P, target_P, self._limits[1])):
      for suffix, value in _scatter_side(flat, start, len_P, limit, row_P, (rows, length),
                                         self._pad_id).items():
        batch[key + suffix] = value
    batch["weights"] = (np.bincount(row_P, minlength=rows) > 0).astype(np.float32)
    return batch


def _train_lengths(data_config: DataConfig, tokenizer: Tokenizer, split: str, *, shard_index: int,
                   wait_s: float):
  """``(source_len_N, target_len_N, source, name)`` of the training split: the token counts
  from the prepared ids (``tokenize_once``; ``source`` is the ``PreparedIds``) or from
  tokenizing the text (the old path; ``source`` is the ``TextPairs``), and a name for logs."""
  if data_config.tokenize_once:
    ids = prepared.prepare_ids(data_config, tokenizer, split=split, writer=shard_index == 0,
                               wait_s=wait_s)
    return ids.source_len_N, ids.target_len_N, ids, repr(ids)
  pairs = load_split(data_config, split)
  source_len_N, target_len_N = token_lengths(pairs, tokenizer,
                                             langs=languages(data_config, tokenizer))
  return source_len_N, target_len_N, pairs, repr(pairs)


def make_train_dataset(data_config: DataConfig, tokenizer: Tokenizer, *, seed: int | None = None,
                       shard_index: int = 0, shard_count: int = 1, num_epochs: int | None = None,
                       split: str | None = None, wait_s: float = 3600.0
                       ) -> tuple[grain.MapDataset, TrainStats]:
  """The training batches as a grain ``MapDataset`` (batch number -> batch) and its stats.

  With ``data_config.tokenize_once`` (the default) the split's token ids are
  prepared once (``prepared.prepare_ids``: process 0 writes, other hosts wait up
  to ``wait_s``) and batches gather ids from them; otherwise every batch
  tokenizes its text. Both give the same batches for the same seed and config.
  With ``data_config.packing`` rows hold several pairs (see ``_PackedBatchPlan``).

  Args:
    data_config: corpus, limits, buckets and budget.
    tokenizer: the run's vocabulary.
    seed: shuffling seed; ``None`` means ``data_config.shuffle_seed``.
    shard_index: this host's index (``jax.process_index()``).
    shard_count: number of hosts (``jax.process_count()``); must divide
      ``batch_multiple``.
    num_epochs: ``None`` repeats forever (``len`` is ``sys.maxsize``).
    split: defaults to ``data_config.train_split``.
    wait_s: how long a host that is not the writer waits for the prepared ids.

  Returns:
    ``(dataset, stats)``; ``dataset[i]`` is batch ``i`` (this host's
    ``B / shard_count`` rows), the same for the same seed and config.
  """
  _check_shard(data_config, shard_index, shard_count)
  seed = data_config.shuffle_seed if seed is None else seed
  source_len_N, target_len_N, source, name = _train_lengths(
      data_config, tokenizer, split or data_config.train_split, shard_index=shard_index,
      wait_s=wait_s)
  num_pairs = len(source_len_N)
  too_long_N = (source_len_N > data_config.max_source_len) | (target_len_N > data_config.max_target_len)
  if data_config.too_long == "filter":
    keep_N = ~too_long_N
    kept_source_N, kept_target_N = source_len_N, target_len_N
  else:
    keep_N = np.ones(num_pairs, bool)
    kept_source_N = np.minimum(source_len_N, data_config.max_source_len)
    kept_target_N = np.minimum(target_len_N, data_config.max_target_len)
  example_ids_N = np.flatnonzero(keep_N).astype(np.int32)
  num_tokens = int(kept_source_N[keep_N].sum() + kept_target_N[keep_N].sum())
  if data_config.packing:
    length = data_config.bucket_lengths[-1]
    plan = _PackedBatchPlan(example_ids_N=example_ids_N,
                            source_len_N=kept_source_N, target_len_N=kept_target_N,
                            length=length, rows=bucket_rows(data_config, length), seed=seed,
                            num_epochs=num_epochs,
                            cache_dir=getattr(source, "directory", None))
    pairs_per_bucket = {length: len(example_ids_N)}
    rows_per_bucket = {length: plan.rows}
    padded_cells = plan.batches_per_epoch * plan.rows * length * 2
  else:
    length_N = np.maximum(kept_source_N, kept_target_N)[keep_N]
    bucket_index_N = _bucket_index(data_config, length_N)
    rows = [bucket_rows(data_config, length) if (bucket_index_N == b).any() else 1
            for b, length in enumerate(data_config.bucket_lengths)]
    plan = _TrainBatchPlan(example_ids_N=example_ids_N, bucket_index_N=bucket_index_N,
                           bucket_lengths=data_config.bucket_lengths, rows=rows, seed=seed,
                           num_epochs=num_epochs)
    counts = np.bincount(bucket_index_N, minlength=len(rows))
    pairs_per_bucket = {length: int(c) for length, c in zip(data_config.bucket_lengths, counts) if c}
    rows_per_bucket = {length: r for length, r, c in zip(data_config.bucket_lengths, rows, counts)
                       if c}
    padded_cells = sum(-(-int(c) // r) * r * length * 2
                       for c, r, length in zip(counts, rows, data_config.bucket_lengths))
  num_too_long = int(too_long_N.sum())
  stats = TrainStats(
      num_pairs=num_pairs, num_too_long=num_too_long,
      num_filtered=num_too_long if data_config.too_long == "filter" else 0,
      num_truncated=num_too_long if data_config.too_long == "truncate" else 0,
      filtered_tokens=int(source_len_N[too_long_N].sum() + target_len_N[too_long_N].sum())
      if data_config.too_long == "filter" else 0,
      num_tokens=num_tokens, pairs_per_bucket=pairs_per_bucket, rows_per_bucket=rows_per_bucket,
      batches_per_epoch=plan.batches_per_epoch,
      padding_fraction=1.0 - num_tokens / padded_cells)
  if num_too_long:
    action = "dropped" if data_config.too_long == "filter" else "truncated"
    _log.warning("%s %d of %d training pairs of %s longer than max_source_len=%d / "
                 "max_target_len=%d tokens (%.2f%%)", action, num_too_long, num_pairs, name,
                 data_config.max_source_len, data_config.max_target_len,
                 100.0 * num_too_long / max(1, num_pairs))
  _log.info("training data: %s", stats)
  if isinstance(source, prepared.PreparedIds):
    make = _MakeIdsBatch(source, data_config, tokenizer.pad_id, shard_index=shard_index,
                         shard_count=shard_count)
  else:
    make = _MakeBatch(source, tokenizer, data_config, shard_index=shard_index,
                      shard_count=shard_count)
  return plan.map(make), stats


def make_train_iterator(data_config: DataConfig, tokenizer: Tokenizer, *, seed: int | None = None,
                        shard_index: int = 0, shard_count: int = 1,
                        num_epochs: int | None = None,
                        read_options: grain.ReadOptions | None = None) -> TrainIterator:
  """A checkpointable iterator over training batches (see ``make_train_dataset``).

  ``iterator.get_state()`` / ``set_state(state)`` (or orbax's
  ``grain.checkpoint.CheckpointSave(iterator)`` / ``CheckpointRestore(iterator)``)
  resume exactly where it stopped. With ``data_config.num_workers > 0`` batches are
  built in that many grain worker processes (``mp_prefetch``); batch ``i`` is the
  same whatever the number of workers, packed or not, since the plan fixes every
  batch's pairs, and the state restores exactly with any number of workers.
  """
  batches, _ = make_train_dataset(data_config, tokenizer, seed=seed, shard_index=shard_index,
                                  shard_count=shard_count, num_epochs=num_epochs)
  return TrainIterator(batches, read_options=read_options or DEFAULT_READ_OPTIONS,
                       num_workers=data_config.num_workers)


class TrainIterator(grain.DatasetIterator):
  """The training batches from batch ``next_batch`` on, on threads or in worker processes.

  Its state is ``{"next_batch": i}`` whatever the number of workers, so a run
  saved with one number of workers resumes with another. (An iterator saved by
  grain's own ``to_iter_dataset`` iterator, ``{"next_index": i}``, restores too.)
  """

  def __init__(self, batches: grain.MapDataset, *, read_options: grain.ReadOptions,
               num_workers: int = 0):
    super().__init__()
    self._batches = batches
    self._read_options = read_options
    self._num_workers = num_workers
    self._next_batch = 0
    self._iterator = None

  def _start(self):
    dataset = self._batches[self._next_batch:].to_iter_dataset(self._read_options)
    if self._num_workers:
      _absl_flags_parsed()
      dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(
          num_workers=self._num_workers, per_worker_buffer_size=2))
    return iter(dataset)

  def __next__(self) -> Batch:
    if self._iterator is None:
      self._iterator = self._start()
    batch = next(self._iterator)
    if self._num_workers:
      # A worker's batch lives in shared memory that is unlinked when its array is collected:
      # a copy lets a batch outlive the iterator (a traceback holds it) without leaking at exit.
      batch = {key: np.array(value) for key, value in batch.items()}
    self._next_batch += 1
    return batch

  def get_state(self) -> dict[str, int]:
    return {"next_batch": self._next_batch}

  def set_state(self, state: dict[str, int]) -> None:
    self._stop()
    self._next_batch = int(state["next_batch"] if "next_batch" in state else state["next_index"])

  def _stop(self) -> None:
    if self._iterator is not None:
      self._iterator.close()
      self._iterator = None

  def close(self) -> None:
    self._stop()

  def __str__(self) -> str:
    return f"TrainIterator(next_batch={self._next_batch}, num_workers={self._num_workers})"


def _absl_flags_parsed() -> None:
  """grain's worker processes read absl flags; outside an absl app nothing parsed them."""
  from absl import flags
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def make_eval_batches(data_config: DataConfig, tokenizer: Tokenizer, *, split: str | None = None,
                      shard_index: int = 0, shard_count: int = 1) -> grain.MapDataset:
  """Evaluation batches of a split in file order; iterate it as often as needed.

  Args:
    data_config: ``eval_batch_size`` rows per batch, lengths from ``bucket_lengths``.
    tokenizer: the run's vocabulary.
    split: defaults to ``data_config.eval_split``.
    shard_index / shard_count: as in ``make_train_dataset``.

  Returns:
    A finite ``grain.MapDataset`` of batch dicts; over all batches, the rows
    with ``weights == 1`` hold every pair once, ``index`` giving its line.
  """
  _check_shard(data_config, shard_index, shard_count)
  split = split or data_config.eval_split
  pairs = load_split(data_config, split)
  source_len_N, target_len_N = token_lengths(pairs, tokenizer,
                                             langs=languages(data_config, tokenizer))
  too_long = int(((source_len_N > data_config.max_source_len)
                  | (target_len_N > data_config.max_target_len)).sum())
  if too_long:
    _log.warning("truncated %d of %d pairs of %s longer than max_source_len=%d / "
                 "max_target_len=%d tokens; their loss and translations are of the truncated text",
                 too_long, len(pairs), pairs, data_config.max_source_len, data_config.max_target_len)
  length_N = np.maximum(np.minimum(source_len_N, data_config.max_source_len),
                        np.minimum(target_len_N, data_config.max_target_len))
  rows = data_config.eval_batch_size
  plan = []
  for start in range(0, len(pairs), rows):
    ids_B = np.full(rows, -1, np.int32)
    real = np.arange(start, min(start + rows, len(pairs)), dtype=np.int32)
    ids_B[:len(real)] = real
    bucket = data_config.bucket_lengths[_bucket_index(data_config, length_N[real].max())]
    plan.append(_BucketItem(bucket, ids_B))
  return grain.MapDataset.source(plan).map(
      _MakeBatch(pairs, tokenizer, data_config, shard_index=shard_index, shard_count=shard_count))


def load_eval_text(data_config: DataConfig, split: str | None = None) -> EvalText:
  """Source sentences and references of a split, in file order, untokenized."""
  pairs = load_split(data_config, split or data_config.eval_split)
  texts = pairs.__getitems__(list(range(len(pairs))))
  return EvalText(sources=[s for s, _ in texts], references=[t for _, t in texts])
