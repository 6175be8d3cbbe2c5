"""Token ids written once: ArrayRecord shards of (source, target) ids and an index of their lengths.

A training start reads the index (a few bytes a pair) and plans its batches from
it; batches then gather the ids of their rows straight from the shards. Nothing
is tokenized again, on any host, at any restart.

One prepared split is a folder
``{data_dir}/ids/{corpus}/{source}-{target}/{split}/{key}``:

================================ ==================================================
file                             what it holds
================================ ==================================================
``ids-00000.array_record`` ...   one record per pair: the source ids, then the target
                                 ids (EOS included), little-endian ``uint16`` for
                                 vocabularies up to 65,536 ids, ``int32`` above;
                                 ``group_size:1`` (the layout grain reads at random)
``index.npy``                    int32 ``[N, 3]``: source length, target length, and
                                 the pair's 0-based line in its split
``meta.json``                    format, corpus, split, languages, tokenizer key,
                                 dtype, records per shard, counts; written last, so
                                 a folder without it was never finished
================================ ==================================================

``key`` is 16 hex digits of the sha256 of everything that changes the ids besides
the corpus, split and languages of the path: the tokenizer (its sentencepiece
model, or a pretrained tokenizer's ``to_dict()``), the language codes it is given,
``FORMAT_VERSION`` (together ``tokenizer_key``) and the settings of ``ids_settings``
(``DataConfig.empty_lines``): another vocabulary, or pairs with an empty side
dropped instead of refused, get another folder and are never read by mistake.
``corpus`` names the tfds dataset and its version (``multi30k`` and
``parallel_text`` carry the content key of their files), or, for
``DataConfig.train_files``, the files' names, sizes and modification times: the
``name`` of the split's ``sources.SplitSource``, which ``ids_location`` resolves
once (``source_location`` takes one resolved already) and the writers read.

Writers: ``prepare_ids`` writes in this process the text the split's source hands
over (iterating the ``SplitSource``: chunks of ``sources.TextChunk``, which count
the pairs dropped), in shards of ``records_per_shard`` pairs (``prepare_source`` for
a resolved source); ``seq2seq_jax.data.beam`` writes the same shards from an Apache
Beam pipeline. Both go through ``encode_pairs``, ``write_shard`` and ``finalize``,
so they write the same ids. A folder is written under a temporary
name, ``{key}.partial-{host}-{pid}-{random}`` (``.partial-beam-...``
for Beam), and renamed when complete (``publish``); the writer holds a lock file inside it
(``writer.lock``) for as long as it writes, and touches it every ``HEARTBEAT_S``
seconds. Local writers take the folder's lock (``{key}.lock``, ``ids_lock``) for
the whole write, Beam only to start and to publish, and under it a writer removes,
and logs, every partial folder whose writer is provably gone (killed, preempted):

- its ``writer.lock`` is free, and
- the folder's name says this host and a process id that no longer runs (a local
  writer), or else (another host, a Beam pipeline, whose workers are not the
  launching process, or a name this cannot read) no file in the folder changed for
  ``ABANDONED_AFTER_S`` seconds (one hour: sixty missed heartbeats).

A free lock alone proves nothing: ``flock`` locks hold across hosts only on file
systems that honour them (local disks, NFSv4), not on FUSE mounts such as Cloud
Storage FUSE, where another host's live writer looks unlocked. A folder removed
under a writer that was only stalled makes that writer fail (its files are gone),
never publish. The hosts of a multi-host run that are not the writer wait for
``meta.json`` (and raise ``PreparedDataError`` naming the folder after
``wait_s``).

Readers check what they read: a shard that is missing, truncated or holds
another number of records than the index, and a record whose size disagrees with
the index, raise ``PreparedDataError`` naming the shard and the fix (delete the
folder, prepare again); a wrong batch is never built from them.

Example:
  >>> from seq2seq_jax.data.builders import load_split
  >>> from seq2seq_jax.data.tokenizer import train_tokenizer
  >>> config = DataConfig(manual_dir="../shared/data/multi30k_tiny", vocab_size=500)
  >>> tokenizer = train_tokenizer(config)  # prepares the corpus once
  Downloading and preparing dataset ...
  >>> ids = prepare_ids(config, tokenizer)  # the training split as ids, once
  >>> len(ids), ids.meta["shard_sizes"]
  (300, [300])
  >>> sources, targets = ids.read([0])
  >>> tokenizer.decode(sources[0]) == load_split(config, "train")[0][0]
  True
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import json
import logging
import os
import pathlib
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data.sources import SplitSource, resolve
from seq2seq_jax.data.text_files import DataError

FORMAT_VERSION = 1
RECORDS_PER_SHARD = 1_000_000
# Random access: no read-ahead, no thread pool per reader (array_record's own advice).
_READER_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"
_WRITER_OPTIONS = "group_size:1"
_WRITER_LOCK = "writer.lock"  # inside a partial folder: held by its writer while it writes
HEARTBEAT_S = 60.0  # a writer touches its writer.lock this often while it writes
# A partial folder that a host other than its writer's finds with no file changed for this
# long (and its lock free) is taken as abandoned: sixty missed heartbeats.
ABANDONED_AFTER_S = 3600.0

_log = logging.getLogger(__name__)


class PreparedDataError(DataError):
  """Prepared ids that are missing, unfinished or damaged; the message names the folder or shard."""


def languages(data_config: DataConfig, tokenizer: Any) -> tuple[str | None, str | None]:
  """The language codes a multilingual tokenizer (M2M100, NLLB) is given; None for others."""
  if getattr(tokenizer, "languages", ()):
    return data_config.source_lang, data_config.target_lang
  return None, None


def encode_sources(tokenizer: Any, texts: Sequence[str],
                   langs: tuple[str | None, str | None]) -> list[list[int]]:
  """Source ids (EOS included); the target language goes along when there is one
  (checkpoints that mark it in the source: multilingual OPUS-MT, MADLAD-400)."""
  if langs[1] is None:
    return tokenizer.encode_source(list(texts), langs[0])
  return tokenizer.encode_source(list(texts), langs[0], target_lang=langs[1])


def encode_pairs(tokenizer: Any, langs: tuple[str | None, str | None], sources: Sequence[str],
                 targets: Sequence[str]) -> tuple[list[list[int]], list[list[int]]]:
  """The model's source and target ids of each pair, as training feeds them."""
  return encode_sources(tokenizer, sources, langs), tokenizer.encode_target(list(targets), langs[1])


def token_lengths(pairs: Iterable[tuple[str, str]], tokenizer: Any, *, chunk: int = 4096,
                  langs: tuple[str | None, str | None] = (None, None)
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Token counts (EOS included) of every pair, tokenized ``chunk`` pairs at a time.

  Args:
    pairs: ``(source, target)`` sentences in order, e.g. a ``builders.TextPairs``.
    tokenizer: the run's tokenizer.
    chunk: pairs a call of the tokenizer encodes.
    langs: the language codes it is given (see ``languages``).

  Returns:
    ``(source_len_N, target_len_N)``, int32 ``[N]`` each, in the order of ``pairs``.
  """
  source_len: list[int] = []
  target_len: list[int] = []
  read = iter(pairs)
  while batch := list(itertools.islice(read, chunk)):
    texts, targets = [s for s, _ in batch], [t for _, t in batch]
    source_len.extend(len(ids) for ids in encode_sources(tokenizer, texts, langs))
    target_len.extend(len(ids) for ids in tokenizer.encode_target(targets, langs[1]))
  return np.asarray(source_len, np.int32), np.asarray(target_len, np.int32)


def tokenizer_key(tokenizer: Any, langs: tuple[str | None, str | None] = (None, None)) -> str:
  """16 hex digits that change whenever the ids of any text could change."""
  digest = hashlib.sha256(f"seq2seq_jax ids v{FORMAT_VERSION} {langs}\n".encode())
  if hasattr(tokenizer, "to_dict"):
    digest.update(json.dumps(tokenizer.to_dict(), sort_keys=True, default=str).encode())
  else:
    digest.update(tokenizer.to_bytes())
  return digest.hexdigest()[:16]


def ids_settings(data_config: DataConfig) -> dict[str, Any]:
  """The settings besides the tokenizer, corpus, split and languages that change the ids."""
  return {"empty_lines": data_config.empty_lines}


def ids_key(tokenizer_digest: str, settings: dict[str, Any]) -> str:
  """The folder's ``key``: 16 hex digits of ``tokenizer_key(...)`` and ``ids_settings``."""
  text = f"{tokenizer_digest} {json.dumps(settings, sort_keys=True)}"
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def id_dtype(vocab_size: int) -> np.dtype:
  """``uint16`` where every id fits, else ``int32``."""
  return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<i4")


def _vocab_size(tokenizer: Any) -> int:
  return max(int(tokenizer.vocab_size), int(getattr(tokenizer, "source_vocab_size", 0)))


# ------------------------------------------------------------------------------------------------
# Writing.


class ShardWriter:
  """Writes one ArrayRecord shard a chunk of pairs at a time (a record per pair)."""

  def __init__(self, path: str | os.PathLike, dtype: np.dtype):
    from array_record.python.array_record_module import ArrayRecordWriter
    self._writer = ArrayRecordWriter(os.fspath(path), _WRITER_OPTIONS)
    self._dtype = dtype
    self._lengths: list[np.ndarray] = []
    self.count = 0

  def write(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> None:
    lengths = np.empty((len(sources), 2), np.int32)
    for r, (source, target) in enumerate(zip(sources, targets, strict=True)):
      lengths[r] = len(source), len(target)
      self._writer.write(np.asarray(list(source) + list(target), self._dtype).tobytes())
    self._lengths.append(lengths)
    self.count += len(lengths)

  def close(self) -> np.ndarray:
    """Closes the file; returns int32 ``[R, 2]`` (source, target) lengths of its records."""
    self._writer.close()
    return np.concatenate(self._lengths) if self._lengths else np.zeros((0, 2), np.int32)


def write_shard(path: str | os.PathLike, sources: Sequence[Sequence[int]],
                targets: Sequence[Sequence[int]], dtype: np.dtype) -> np.ndarray:
  """Writes one ArrayRecord shard, a record per pair; returns int32 ``[R, 2]`` lengths."""
  writer = ShardWriter(path, dtype)
  try:
    writer.write(sources, targets)
  finally:
    lengths = writer.close()
  return lengths


def shard_name(index: int) -> str:
  return f"ids-{index:05d}.array_record"


def finalize(directory: str | os.PathLike, *, shard_lengths: Sequence[np.ndarray],
             shard_lines: Sequence[np.ndarray], meta: dict[str, Any]) -> None:
  """Writes ``index.npy`` and then ``meta.json`` beside shards ``ids-00000...`` already written.

  Args:
    directory: the (temporary) folder holding the shards, in order.
    shard_lengths: int ``[R_k, 2]`` (source, target lengths) of shard k's records.
    shard_lines: int ``[R_k]`` 0-based split lines of shard k's pairs.
    meta: corpus, split, languages, tokenizer key, dtype, ... (counts are added here).
  """
  directory = pathlib.Path(directory)
  sizes = [len(lengths) for lengths in shard_lengths]
  index_N3 = np.zeros((sum(sizes), 3), np.int32)
  if sizes and sum(sizes):
    index_N3[:, :2] = np.concatenate(shard_lengths)
    lines = np.concatenate(shard_lines)
    if lines.max(initial=0) >= 2**31:
      raise DataError("more than 2**31 lines in one split: split the corpus into several")
    index_N3[:, 2] = lines
  np.save(directory / "index.npy", index_N3)
  meta = dict(meta, format=FORMAT_VERSION, num_pairs=int(sum(sizes)), shard_sizes=sizes,
              num_tokens=[int(index_N3[:, 0].sum()), int(index_N3[:, 1].sum())])
  partial = directory / "meta.json.partial"
  partial.write_text(json.dumps(meta, indent=1, sort_keys=True))
  partial.replace(directory / "meta.json")


@dataclasses.dataclass(frozen=True)
class IdsLocation:
  """Where one split's ids live, and what they were made from."""

  directory: pathlib.Path
  corpus: str
  split: str
  key: str  # the folder's name: ids_key(tokenizer_key, settings)
  langs: tuple[str | None, str | None]
  tokenizer_key: str
  settings: dict[str, Any]  # ids_settings
  source: SplitSource  # where the split's text comes from

  def meta(self, tokenizer: Any, data_config: DataConfig) -> dict[str, Any]:
    return {"corpus": self.corpus, "split": self.split, "source_lang": data_config.source_lang,
            "target_lang": data_config.target_lang, "tokenizer_key": self.tokenizer_key,
            "settings": self.settings, "tokenizer": repr(tokenizer),
            "language_codes": list(self.langs), "vocab_size": _vocab_size(tokenizer),
            "dtype": id_dtype(_vocab_size(tokenizer)).str}


def ids_location(data_config: DataConfig, tokenizer: Any, split: str | None = None) -> IdsLocation:
  """The folder of ``split``'s ids for this corpus, tokenizer and settings (it may not exist yet)."""
  return source_location(resolve(data_config, split), tokenizer)


def source_location(source: SplitSource, tokenizer: Any) -> IdsLocation:
  """``ids_location`` of a split whose source is resolved (``sources.resolve``)."""
  data_config = source.data_config
  langs = languages(data_config, tokenizer)
  tokenizer_digest = tokenizer_key(tokenizer, langs)
  settings = ids_settings(data_config)
  key = ids_key(tokenizer_digest, settings)
  corpus = source.name
  directory = (pathlib.Path(source.data_dir) / "ids" / corpus
               / f"{data_config.source_lang}-{data_config.target_lang}" / source.split / key)
  return IdsLocation(directory=directory, corpus=corpus, split=source.split, key=key, langs=langs,
                     tokenizer_key=tokenizer_digest, settings=settings, source=source)


# ------------------------------------------------------------------------------------------------
# Folders under construction: one lock per folder, one per writer, and the rename at the end.


@contextlib.contextmanager
def _file_lock(path: pathlib.Path):
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a+") as handle:
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)


def ids_lock(directory: str | os.PathLike):
  """The lock of a prepared folder (``{key}.lock`` beside it), a context manager: held while
  a writer starts, cleans up after others, and publishes."""
  directory = pathlib.Path(directory)
  return _file_lock(directory.with_name(directory.name + ".lock"))


def writer_tag() -> str:
  """``host-pid-random``: a temporary name no other host, process or call uses."""
  return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class WriterLock:
  """A partial folder's ``writer.lock``, held (``flock``) and touched every ``HEARTBEAT_S``
  seconds by a daemon thread until ``close()``: what tells other prepares, on this host
  and on others, that the folder's writer is alive."""

  def __init__(self, folder: pathlib.Path):
    self._path = folder / _WRITER_LOCK
    self._handle = open(self._path, "a+")
    fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._beat, name=f"heartbeat {folder.name}",
                                    daemon=True)
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      try:
        os.utime(self._path)
      except OSError:  # published (the lock file is gone) or removed: nothing left to mark
        return

  def close(self) -> None:
    """Stops the heartbeat and releases the lock: the folder counts as abandoned from then."""
    self._stop.set()
    self._handle.close()


def _lock_free(partial: pathlib.Path) -> bool:
  """Whether nobody here holds ``partial``'s writer lock (on a file system whose locks do not
  reach other hosts, a lock another host holds looks free)."""
  with open(partial / _WRITER_LOCK, "a+") as handle:
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      return False
    fcntl.flock(handle, fcntl.LOCK_UN)
    return True


def _named_writer(partial: pathlib.Path) -> tuple[str, int] | None:
  """``(host, pid)`` of a local writer's folder ``{key}.partial-{host}-{pid}-{random}``; None
  for a Beam folder (its workers are other processes than the one named) or a name that
  does not parse (a host name may hold dashes: the pid and random part are split off the
  end, and a misread name only ever falls to the slower, quiet-folder rule)."""
  tag = partial.name.partition(".partial-")[2]
  if tag.startswith("beam-"):
    return None
  host, _, rest = tag.rpartition("-")[0].rpartition("-")
  try:
    return host, int(rest)
  except ValueError:
    return None


def _process_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def _last_change(folder: pathlib.Path) -> float:
  """The newest modification time of ``folder`` and of everything in it (seconds since the epoch)."""
  times = [folder.stat().st_mtime]
  for path in folder.rglob("*"):
    try:
      times.append(path.stat().st_mtime)
    except FileNotFoundError:  # removed meanwhile
      pass
  return max(times)


def _writer_gone(partial: pathlib.Path) -> str | None:
  """Why ``partial``'s writer is provably gone, or None while it may still write."""
  if not _lock_free(partial):
    return None
  named = _named_writer(partial)
  if named is not None and named[0] == socket.gethostname() and not _process_alive(named[1]):
    return f"its writer, process {named[1]} of this host, has ended"
  quiet_s = time.time() - _last_change(partial)
  if quiet_s > ABANDONED_AFTER_S:
    return (f"no file in it changed for {quiet_s:.0f} s (more than ABANDONED_AFTER_S="
            f"{ABANDONED_AFTER_S:.0f}) and its writer lock is free")
  return None


def _size_mb(folder: pathlib.Path) -> float:
  return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def remove_abandoned(directory: str | os.PathLike) -> list[pathlib.Path]:
  """Removes the partial folders of ``directory`` whose writer is provably gone, and logs each.

  Gone: the ``writer.lock`` is free and the folder names a process of this host
  that has ended, or else no file in it changed for ``ABANDONED_AFTER_S`` seconds
  (module docstring). Every other folder stays. Takes ``ids_lock(directory)`` when
  there is a partial folder to look at.

  Returns:
    The folders removed.
  """
  directory = pathlib.Path(directory)
  if not directory.parent.is_dir() or not any(
      directory.parent.glob(f"{directory.name}.partial-*")):
    return []
  with ids_lock(directory):
    return _remove_abandoned(directory)


def _remove_abandoned(directory: pathlib.Path) -> list[pathlib.Path]:
  """``remove_abandoned`` for a caller that holds ``ids_lock(directory)``."""
  removed = []
  for partial in sorted(directory.parent.glob(f"{directory.name}.partial-*")):
    reason = _writer_gone(partial) if partial.is_dir() else None
    if reason is None:
      continue
    size = _size_mb(partial)
    shutil.rmtree(partial, ignore_errors=True)
    _log.warning("removed %s (%.1f MB): an unfinished folder of token ids whose writer stopped "
                 "before it finished (killed or preempted): %s", partial, size, reason)
    removed.append(partial)
  return removed


def start_partial(directory: str | os.PathLike, prefix: str = "") -> tuple[pathlib.Path,
                                                                            WriterLock]:
  """A new temporary folder for ``directory``'s ids, and its writer lock, held and beating.

  The caller holds ``ids_lock(directory)``; the abandoned partial folders of
  ``directory`` are removed first (as ``remove_abandoned`` does). Close the returned
  lock when the writing ends (``publish`` does not): from then on, or from the
  moment this process dies, the folder counts as abandoned by the rules of
  ``remove_abandoned``.

  Args:
    directory: the finished folder the ids will have.
    prefix: goes before ``writer_tag()`` in the name (``"beam-"`` for Beam).

  Returns:
    ``(temporary, lock)``: ``{directory}.partial-{prefix}{host}-{pid}-{random}`` and
    its ``WriterLock``.
  """
  directory = pathlib.Path(directory)
  _remove_abandoned(directory)
  temporary = directory.with_name(f"{directory.name}.partial-{prefix}{writer_tag()}")
  temporary.mkdir(parents=True)
  return temporary, WriterLock(temporary)


def publish(temporary: str | os.PathLike, directory: str | os.PathLike) -> bool:
  """Renames a finished ``temporary`` folder to ``directory``; the caller holds ``ids_lock``.

  An unfinished ``directory`` (no ``meta.json``) is replaced; a finished one is kept
  and ``temporary`` removed (another writer finished the same ids first).

  Returns:
    Whether ``temporary`` became ``directory``.
  """
  temporary, directory = pathlib.Path(temporary), pathlib.Path(directory)
  (temporary / _WRITER_LOCK).unlink(missing_ok=True)
  if (directory / "meta.json").exists():
    _log.warning("%s was finished by another writer meanwhile; keeping it", directory)
    shutil.rmtree(temporary)
    return False
  if directory.exists():  # no meta.json: never finished (a copy cut short, say)
    shutil.rmtree(directory)
  temporary.rename(directory)
  return True


def _write_local(location: IdsLocation, data_config: DataConfig, tokenizer: Any, *,
                 records_per_shard: int) -> None:
  """Tokenizes the split in this process into a temporary folder, then renames it; the caller
  holds ``ids_lock``. A failed write removes its folder; a killed one is removed by the next."""
  temporary, writer_lock = start_partial(location.directory)
  try:
    _write_ids(temporary, location, data_config, tokenizer, records_per_shard=records_per_shard)
    publish(temporary, location.directory)
  finally:
    writer_lock.close()
    shutil.rmtree(temporary, ignore_errors=True)  # gone already unless the write failed


def _write_ids(temporary: pathlib.Path, location: IdsLocation, data_config: DataConfig,
               tokenizer: Any, *, records_per_shard: int) -> None:
  """The shards, index and ``meta.json`` of the split, written into ``temporary``."""
  dtype = id_dtype(_vocab_size(tokenizer))
  start = time.perf_counter()
  shard_lengths: list[np.ndarray] = []
  shard_lines: list[list[np.ndarray]] = []
  dropped = 0  # pairs with an empty side left out (DataConfig.empty_lines="drop")
  writer: ShardWriter | None = None
  for chunk in location.source:  # the split's text in order (sources.TextChunk), read once
    dropped += chunk.dropped
    source_ids, target_ids = encode_pairs(tokenizer, location.langs, chunk.sources,
                                          chunk.targets)
    taken = 0
    while taken < len(source_ids):  # a chunk may straddle two shards
      if writer is None:
        writer = ShardWriter(temporary / shard_name(len(shard_lengths)), dtype)
        shard_lines.append([])
      room = records_per_shard - writer.count
      writer.write(source_ids[taken:taken + room], target_ids[taken:taken + room])
      shard_lines[-1].append(chunk.lines_C[taken:taken + room])
      taken += room
      if writer.count == records_per_shard:
        shard_lengths.append(writer.close())
        writer = None
  if writer is not None or not shard_lengths:
    if writer is None:
      writer = ShardWriter(temporary / shard_name(0), dtype)
      shard_lines.append([])
    shard_lengths.append(writer.close())
  lines = [np.concatenate(parts) if parts else np.zeros(0, np.int64) for parts in shard_lines]
  total = sum(len(x) for x in shard_lengths)
  meta = location.meta(tokenizer, data_config)
  meta["records_per_shard"] = records_per_shard
  meta.update(writer="local", lines_read=total + dropped, empty_dropped=dropped)
  if dropped:
    _log.warning("left out %d of %d pairs of %s:%s with an empty side (DataConfig.empty_lines="
                 "'drop')", dropped, total + dropped, location.corpus, location.split)
  finalize(temporary, shard_lengths=shard_lengths, shard_lines=lines, meta=meta)
  _log.info("prepared %d pairs of %s:%s as ids in %s (%.1f s)", total, location.corpus,
            location.split, location.directory, time.perf_counter() - start)


def prepare_ids(data_config: DataConfig, tokenizer: Any, *, split: str | None = None,
                writer: bool = True, wait_s: float = 3600.0,
                records_per_shard: int = RECORDS_PER_SHARD) -> PreparedIds:
  """The split's ids, tokenized and written first if no finished folder exists.

  Args:
    data_config: the corpus (``dataset`` / ``manual_dir`` / ``train_files``), languages,
      ``data_dir`` and ``empty_lines``.
    tokenizer: the run's tokenizer (its hash picks the folder).
    split: defaults to ``data_config.train_split``.
    writer: whether this process may write (in a multi-host run, process 0 only;
      the others pass False and wait).
    wait_s: how long a non-writer waits for the writer's ``meta.json``.
    records_per_shard: pairs per ArrayRecord shard.

  Raises:
    PreparedDataError: a non-writer waited ``wait_s`` in vain (names the folder and
      the command that prepares it), or the folder is damaged.
    DataError: bad input text (file and line named).
  """
  return prepare_source(resolve(data_config, split), tokenizer, writer=writer,
                        wait_s=wait_s, records_per_shard=records_per_shard)


def prepare_source(source: SplitSource, tokenizer: Any, *, writer: bool = True,
                   wait_s: float = 3600.0,
                   records_per_shard: int = RECORDS_PER_SHARD) -> PreparedIds:
  """``prepare_ids`` of a split whose source is resolved (``sources.resolve``)."""
  location = source_location(source, tokenizer)
  data_config = source.data_config
  meta_path = location.directory / "meta.json"
  if writer:
    if not meta_path.exists():
      with ids_lock(location.directory):
        if not meta_path.exists():  # another local process may have finished it meanwhile
          _write_local(location, data_config, tokenizer, records_per_shard=records_per_shard)
    remove_abandoned(location.directory)  # a killed writer's, when another finished the ids
  else:
    deadline = time.monotonic() + wait_s
    while not meta_path.exists():
      if time.monotonic() > deadline:
        raise PreparedDataError(
            f"waited {wait_s:.0f} s for the token ids of {location.corpus}:{location.split} in "
            f"{location.directory}, which the writing process (process 0) prepares: check its "
            "log, or prepare them before the run with `seq2seq-jax prepare --tokenizer PATH` "
            "(or the Beam pipeline, seq2seq_jax.data.beam)")
      time.sleep(min(2.0, max(0.05, wait_s / 100)))
  return open_location(location)


def open_location(location: IdsLocation) -> PreparedIds:
  """The finished folder of ``location``, checked to hold its tokenizer's and settings' ids."""
  return PreparedIds.open(location.directory, expected_key=location.tokenizer_key,
                          expected_settings=location.settings)


# ------------------------------------------------------------------------------------------------
# Reading.


class PreparedIds:
  """Random access to one prepared split: lengths in memory, ids read from the shards on demand.

  Picklable (grain worker processes reopen the shards); safe to read from many threads.

  Attributes:
    directory: the folder.
    meta: ``meta.json``.
    source_len_N, target_len_N: int32 ``[N]`` token counts (EOS included).
    line_N: int32 ``[N]`` each pair's 0-based line in its split.
  """

  def __init__(self, directory: pathlib.Path, meta: dict[str, Any], index_N3: np.ndarray):
    self.directory = directory
    self.meta = meta
    self.dtype = np.dtype(meta["dtype"])
    self.source_len_N = np.ascontiguousarray(index_N3[:, 0])
    self.target_len_N = np.ascontiguousarray(index_N3[:, 1])
    self.line_N = np.ascontiguousarray(index_N3[:, 2])
    sizes = np.asarray(meta["shard_sizes"], np.int64)
    self._shard_starts = np.concatenate([[0], np.cumsum(sizes)])
    self._local = threading.local()

  @classmethod
  def open(cls, directory: str | os.PathLike, *, expected_key: str | None = None,
           expected_settings: dict[str, Any] | None = None) -> PreparedIds:
    """Opens a finished folder (reads ``meta.json`` and ``index.npy``, not the shards).

    Args:
      directory: the folder.
      expected_key: the ``tokenizer_key`` it must have been written with.
      expected_settings: the ``ids_settings`` it must have been written with.

    Raises:
      PreparedDataError: the folder is unfinished, of another format, tokenizer or
        settings, or its index is unreadable (the message names the file and the fix).
    """
    directory = pathlib.Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.exists():
      raise PreparedDataError(f"{directory} holds no finished token ids (no meta.json): prepare "
                              "them with `seq2seq-jax prepare --tokenizer PATH`")
    meta = json.loads(meta_path.read_text())
    fix = f"delete {directory} and prepare it again (`seq2seq-jax prepare --tokenizer PATH`)"
    if meta.get("format") != FORMAT_VERSION:
      raise PreparedDataError(f"{meta_path}: format {meta.get('format')}, this version reads "
                              f"{FORMAT_VERSION}: {fix}")
    if expected_key is not None and meta.get("tokenizer_key") != expected_key:
      raise PreparedDataError(f"{meta_path} was written with tokenizer {meta.get('tokenizer_key')},"
                              f" not {expected_key}: {fix}")
    if expected_settings is not None:
      written = meta.get("settings", {})
      for name, value in expected_settings.items():
        if written.get(name) != value:
          raise PreparedDataError(f"{meta_path} was written with DataConfig.{name}="
                                  f"{written.get(name)!r}, this run has {value!r}: {fix}")
    try:
      index_N3 = np.load(directory / "index.npy")
    except (OSError, ValueError) as e:
      raise PreparedDataError(f"{directory / 'index.npy'}: unreadable ({e}): {fix}") from e
    if index_N3.shape != (meta["num_pairs"], 3):
      raise PreparedDataError(f"{directory / 'index.npy'} has shape {index_N3.shape}, meta.json "
                              f"says {meta['num_pairs']} pairs: {fix}")
    return cls(directory, meta, index_N3)

  def __len__(self) -> int:
    return len(self.source_len_N)

  def __repr__(self) -> str:
    return (f"PreparedIds({self.meta['corpus']}:{self.meta['split']}, {len(self)} pairs, "
            f"{len(self.meta['shard_sizes'])} shards)")

  def __getstate__(self):
    state = dict(self.__dict__)
    del state["_local"]
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._local = threading.local()

  def _fix(self) -> str:
    return f"delete {self.directory} and prepare it again (`seq2seq-jax prepare --tokenizer PATH`)"

  def _reader(self, shard: int):
    readers = self._local.__dict__.setdefault("readers", {})
    if shard not in readers:
      from array_record.python.array_record_module import ArrayRecordReader
      path = self.directory / shard_name(shard)
      if not path.exists():
        raise PreparedDataError(f"{path} is missing: {self._fix()}")
      try:
        reader = ArrayRecordReader(os.fspath(path), _READER_OPTIONS)
        count = reader.num_records()
      except (RuntimeError, OSError, ValueError) as e:
        raise PreparedDataError(f"{path} is damaged or truncated ({e}): {self._fix()}") from e
      expected = self.meta["shard_sizes"][shard]
      if count != expected:
        raise PreparedDataError(f"{path} holds {count} records, the index says {expected}: "
                                f"{self._fix()}")
      readers[shard] = reader
    return readers[shard]

  def records(self, ids_R: Sequence[int] | np.ndarray) -> list[bytes]:
    """The raw records of pairs ``ids_R`` in that order (source ids, then target ids)."""
    ids_R = np.asarray(ids_R, np.int64)
    if not len(ids_R):
      return []
    if ids_R.min() < 0 or ids_R.max() >= len(self):
      raise IndexError(f"pair ids must be in [0, {len(self)})")
    shard_R = np.searchsorted(self._shard_starts, ids_R, side="right") - 1
    out: list[bytes] = [b""] * len(ids_R)
    for shard in np.unique(shard_R).tolist():
      rows = np.flatnonzero(shard_R == shard)
      local = (ids_R[rows] - self._shard_starts[shard]).tolist()
      reader = self._reader(shard)
      try:
        # One range read a record: read(indices) costs ~1.5 ms a call on a 1 M-record shard
        # whatever len(indices) (array_record 0.8.6), paid for every shard a batch touches.
        got = [reader.read(i, i + 1)[0] for i in local]
      except (RuntimeError, OSError) as e:
        path = self.directory / shard_name(shard)
        raise PreparedDataError(f"{path}: reading records failed ({e}): {self._fix()}") from e
      for row, record in zip(rows.tolist(), got):
        out[row] = record
    return out

  def flat(self, ids_R: Sequence[int] | np.ndarray) -> np.ndarray:
    """The ids of pairs ``ids_R`` laid end to end as int32: pair r's source, then its target.

    Raises:
      PreparedDataError: a record's size disagrees with the index (shard named).
    """
    ids_R = np.asarray(ids_R, np.int64)
    records = self.records(ids_R)
    want_R = (self.source_len_N[ids_R].astype(np.int64) + self.target_len_N[ids_R]) * self.dtype.itemsize
    got_R = np.fromiter(map(len, records), np.int64, len(records))
    if not np.array_equal(want_R, got_R):
      bad = int(np.flatnonzero(want_R != got_R)[0])
      shard = int(np.searchsorted(self._shard_starts, ids_R[bad], side="right") - 1)
      raise PreparedDataError(
          f"{self.directory / shard_name(shard)}: record {ids_R[bad] - self._shard_starts[shard]} "
          f"holds {got_R[bad]} bytes, the index says {want_R[bad]}: {self._fix()}")
    return np.frombuffer(b"".join(records), self.dtype).astype(np.int32)

  def read(self, ids_R: Sequence[int] | np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Source and target ids (int32, EOS included) of each pair in ``ids_R``."""
    ids_R = np.asarray(ids_R, np.int64)
    flat = self.flat(ids_R)
    sources, targets, offset = [], [], 0
    for s, t in zip(self.source_len_N[ids_R].tolist(), self.target_len_N[ids_R].tolist()):
      sources.append(flat[offset:offset + s])
      targets.append(flat[offset + s:offset + s + t])
      offset += s + t
    return sources, targets
