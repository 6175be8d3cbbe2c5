"""Token ids written by an Apache Beam pipeline: the shards, index and folder of ``prepared``.

``prepared.prepare_ids`` tokenizes a split in one process. This module runs the same
step as a Beam pipeline, for corpora that one machine tokenizes too slowly, and writes
what ``prepare_ids`` writes into the folder ``prepare_ids`` would use
(``prepared.ids_location(...).directory``), so a training run finds it with no flag:
``PreparedIds.read(i)`` gives the same ids, lengths and line for every pair ``i``;
only the shard boundaries may differ (``meta.json`` says ``"writer": "beam"``).

The pipeline::

  units ──Read──> text chunks ──Reshuffle──Tokenize──> ids ──GroupByKey──WriteShard──> shards
                                                                                         │
  Once ──────────────────────────────────── Finalize (every shard's lengths, lines) <────┘

- A unit is one matched pair of ``DataConfig.train_files`` shards (read with
  ``text_files.stream_aligned``: plain or gzip, errors naming the file and line), or a
  range of ``records_per_shard`` pairs of a prepared tfds split (``multi30k``,
  ``parallel_text``, ``tfds:NAME``; the launcher prepares the text first).
- ``Tokenize`` loads the tokenizer once per worker (``DoFn.setup``) from its JSON
  (``tokenizer.tokenizer_to_json``), not one pickled object per element.
- ``WriteShard`` writes each output shard with array_record's Python writer
  (``prepared.write_shard``, ``group_size:1``) under a temporary name; a unit gives
  one shard per ``records_per_shard`` pairs kept. array_record's own Beam sink is not
  used: its extra pulls TensorFlow.
- ``Finalize`` runs once: it orders the shards (unit, then part), offsets each unit's
  lines by the lines of the units before it, renames the shards ``ids-00000...``,
  calls ``prepared.finalize`` in the temporary folder and renames that folder to the
  final one under the folder's lock (``prepared.publish``: the same step as the local
  writer's).

The temporary folder, ``{key}.partial-beam-{host}-{pid}-{random}``, is made by the
launching process, which holds its writer lock, and touches it every
``prepared.HEARTBEAT_S`` seconds, while the pipeline runs (``prepared.start_partial``).
The workers never make it: ``WriteShard`` and ``Finalize`` refuse a folder that is
gone, and ``Finalize`` refuses a missing shard by name and then publishes nothing.
A prepare removes (and logs) such a folder only when its lock is free and no file
in it changed for ``prepared.ABANDONED_AFTER_S`` seconds (an hour), whatever the
host: the launcher having ended proves nothing about the workers.

Which runs this protects, plainly: those whose launcher waits for the pipeline to
finish. ``run_prepare`` (and ``seq2seq-jax prepare --beam``) always does, holding the
lock until the pipeline's ``wait_until_finish()`` returns: DirectRunner, and
Dataflow, Flink or Spark as long as the launching process stays up. With
``build_prepare_pipeline`` the caller runs the pipeline, and the lock is held until
this process exits: run it with ``pipeline.run().wait_until_finish()`` in the same
process. A job left running without its launcher (a detached Dataflow job) has no
heartbeat: after an hour in which no shard was written (the tokenizing before the
``GroupByKey``), a prepare may remove its folder, and the job then fails naming the
folder instead of publishing it.

Running elsewhere. ``run_prepare`` takes Beam's own pipeline options (a list of flags
or a ``PipelineOptions``), and so does ``seq2seq-jax prepare --beam --beam-options
"..."``. DirectRunner (the default) runs here; for the others, install
``seq2seq-jax[beam]`` on the launching machine, ship the package to the workers and
name the runner, for example::

  seq2seq-jax prepare --train-files "/mnt/corpus/train-*.{lang}.gz" \\
      --data-dir /mnt/shared/seq2seq_jax --tokenizer runs/wmt/tokenizer.model --beam \\
      --beam-options "--runner=DataflowRunner --project=PROJECT --region=us-central1 \\
                      --temp_location=gs://BUCKET/tmp --setup_file=$PWD/pyproject.toml"
  # Flink:  --runner=FlinkRunner --flink_master=HOST:8081 --environment_type=PROCESS ...
  # Spark:  --runner=SparkRunner --spark_master_url=spark://HOST:7077 ...

On Dataflow, ``--setup_file`` (Beam accepts a ``pyproject.toml``) builds this package
for the workers, or ``--extra_package=dist/seq2seq_jax-VERSION-py3-none-any.whl`` ships a
built wheel, with ``--requirements_file`` for pinned dependencies; Flink and Spark need
the package in the workers' Python environment (``--environment_type`` and the runner's
own documentation say how).

Installing: the extra brings Beam's pins, protobuf below 7 among them. There,
sentencepiece 0.2.3's ``sentencepiece_model_pb2`` (generated for protobuf 7.36.1) fails
to import; this module and ``Tokenizer`` do not use it, but transformers' sentencepiece
conversion and ``seq2seq_jax.pretrained.fixtures`` do: keep Beam in its own environment
(or sentencepiece 0.2.2, which trains other vocabularies than 0.2.3).

What this does not do yet, plainly: every path is opened with local file calls. The
text (``train_files``, or the tfds ``data_dir``) and the output ``data_dir`` must be one
file system mounted at the same path on the launcher and on every worker (NFS,
Filestore, a Cloud Storage FUSE mount), and the training hosts read the ids from there
too. ``gs://`` paths are not accepted: array_record's writer opens ``gs://...`` as a
local path and fails (``open() failed: No such file or directory``), and
``prepared.finalize`` and ``PreparedIds`` use ``pathlib``. Dataflow workers mount no
such file system by themselves (a custom worker container would have to; not tried),
so Flink or Spark on machines that share a mount fit more directly. Only DirectRunner
has run this module; no run on Dataflow, Flink or Spark has been made.

Example:
  >>> from seq2seq_jax.data.tokenizer import train_tokenizer
  >>> config = DataConfig(manual_dir="../shared/data/multi30k_tiny", data_dir="data",
  ...                     vocab_size=500)
  >>> tokenizer = train_tokenizer(config)  # prepares the corpus once
  Downloading and preparing dataset ...
  >>> ids = run_prepare(config, tokenizer, records_per_shard=128)  # DirectRunner
  >>> len(ids), ids.meta["writer"], ids.meta["shard_sizes"]
  (300, 'beam', [128, 128, 44])
  >>> ids.directory == prepared.ids_location(config, tokenizer).directory
  True
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import pickle
import shutil
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import prepared, text_files
from seq2seq_jax.data import tokenizer as tokenizer_lib
from seq2seq_jax.data.sources import pair_range_chunks

_INSTALL = 'pip install "seq2seq-jax[beam]"'


@contextlib.contextmanager
def _quiet_beam_import():
  """Beam logs 'apitools not found' through the root logger at import; with no handler
  there yet, that call would also configure the caller's logging (``basicConfig``)."""
  root = logging.getLogger()
  placeholder = logging.NullHandler() if not root.handlers else None

  def drop(record: logging.LogRecord) -> bool:
    return "apitools not found" not in record.getMessage()

  root.addFilter(drop)
  if placeholder:
    root.addHandler(placeholder)
  try:
    yield
  finally:
    root.removeFilter(drop)
    if placeholder:
      root.removeHandler(placeholder)


try:
  with _quiet_beam_import():
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
except ImportError as error:
  raise ImportError(f"seq2seq_jax.data.beam needs Apache Beam, an optional extra: {_INSTALL} "
                    f"({error})") from error

_log = logging.getLogger(__name__)
_COUNTS = "counts"  # the tag of Read's second output: (unit, lines read, pairs dropped)
_CHUNK = 4096  # pairs per element from Read to Tokenize

# One unit of input: (index, {lang: path}) for a shard of train_files, or (index, (start, stop))
# for a range of a tfds split.
_Unit = tuple[int, Any]


def _part_name(unit: int, part: int) -> str:
  """A shard's name until Finalize knows its place among all shards."""
  return f"part-{unit:06d}-{part:05d}.array_record"


class _Read(beam.DoFn):
  """A unit -> its text in chunks keyed ``(unit, part)``: part k holds the unit's pairs
  k * records_per_shard ... (k + 1) * records_per_shard - 1 that are kept."""

  def __init__(self, langs: tuple[str, str], *, drop_empty: bool, records_per_shard: int,
               pairs: Any = None, chunk: int = _CHUNK):
    self._langs = langs
    self._drop_empty = drop_empty
    self._records_per_shard = records_per_shard
    # builders.TextPairs of a tfds split, pickled here (its file paths and the builder's
    # config) and loaded once per worker.
    self._pairs_pickle = None if pairs is None else pickle.dumps(pairs)
    self._pairs: Any = None
    self._chunk = chunk

  def setup(self) -> None:
    if self._pairs_pickle is not None:
      from seq2seq_jax.data import builders  # pylint: disable=import-outside-toplevel
      # Unpickling rebuilds the tfds builder, which logs 'Using custom data configuration'.
      with builders._quiet_custom_config_warning():  # pylint: disable=protected-access
        self._pairs = pickle.loads(self._pairs_pickle)

  def process(self, unit: _Unit) -> Iterator[Any]:
    index, where = unit
    counts: dict[str, int] = {}
    start = 0
    if isinstance(where, dict):
      files = {lang: pathlib.Path(path) for lang, path in where.items()}
      chunks = text_files.stream_aligned(files, self._langs, chunk=self._chunk,
                                         drop_empty=self._drop_empty, counts=counts)
    else:
      start, stop = where
      chunks = pair_range_chunks(self._pairs, start, stop, chunk=self._chunk,
                                 drop_empty=self._drop_empty, counts=counts)
    kept = 0
    pieces: dict[int, int] = {}  # part -> chunks emitted so far (their order within the part)
    for lines_C, sources, targets in chunks:
      taken = 0
      while taken < len(sources):
        part, offset = divmod(kept, self._records_per_shard)
        size = min(len(sources) - taken, self._records_per_shard - offset)
        piece = pieces.get(part, 0)
        pieces[part] = piece + 1
        # Lines within the unit: Finalize adds the lines of the units before it.
        yield (index, part), (piece, lines_C[taken:taken + size] - start,
                              sources[taken:taken + size], targets[taken:taken + size])
        taken += size
        kept += size
    yield beam.pvalue.TaggedOutput(_COUNTS, (index, counts["lines"], counts["empty_dropped"]))


def _flatten(ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  lengths = np.fromiter(map(len, ids), np.int64, len(ids))
  flat = np.fromiter((i for row in ids for i in row), np.int32, int(lengths.sum()))
  return flat, lengths


def _unflatten(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
  return [row.tolist() for row in np.split(flat, np.cumsum(lengths)[:-1])] if len(lengths) else []


class _Tokenize(beam.DoFn):
  """Text chunks -> id chunks (flat int32 ids and lengths: compact between workers)."""

  def __init__(self, tokenizer_json: dict[str, Any], langs: tuple[str | None, str | None]):
    self._tokenizer_json = tokenizer_json
    self._langs = langs
    self._tokenizer: Any = None

  def setup(self) -> None:
    self._tokenizer = tokenizer_lib.tokenizer_from_json(self._tokenizer_json)

  def process(self, element: Any) -> Iterator[Any]:
    key, (piece, lines, sources, targets) = element
    source_ids, target_ids = prepared.encode_pairs(self._tokenizer, self._langs, sources, targets)
    yield key, (piece, lines, _flatten(source_ids), _flatten(target_ids))


def _check_folder(temporary: pathlib.Path) -> None:
  """The launcher made the temporary folder; a worker that finds it gone must not make
  another one that nobody owns."""
  if not temporary.is_dir():
    raise prepared.PreparedDataError(
        f"{temporary}, the pipeline's temporary folder, is gone: another prepare removed it "
        "as abandoned (its launcher stopped and nothing in it changed for "
        f"{prepared.ABANDONED_AFTER_S:.0f} s), or the workers do not see the launcher's file "
        "system; nothing was published: run the prepare again and keep its launcher running")


class _WriteShard(beam.DoFn):
  """All chunks of one ``(unit, part)`` -> one ArrayRecord shard under a temporary name;
  emits ``(unit, part, lengths [R, 2], lines within the unit [R])``."""

  def __init__(self, temporary: str, dtype: str):
    self._temporary = temporary
    self._dtype = np.dtype(dtype)

  def process(self, element: Any) -> Iterator[Any]:
    (unit, part), chunks = element
    chunks = sorted(chunks, key=lambda chunk: chunk[0])  # GroupByKey keeps no order
    sources = [ids for chunk in chunks for ids in _unflatten(*chunk[2])]
    targets = [ids for chunk in chunks for ids in _unflatten(*chunk[3])]
    lines = np.concatenate([chunk[1] for chunk in chunks]).astype(np.int64)
    _check_folder(pathlib.Path(self._temporary))
    lengths = prepared.write_shard(os.path.join(self._temporary, _part_name(unit, part)),
                                   sources, targets, self._dtype)
    yield unit, part, lengths, lines


class _Finalize(beam.DoFn):
  """Once, when every shard is written: names them in order, writes the index and
  ``meta.json``, renames the folder. Emits the final folder."""

  def __init__(self, temporary: str, directory: str, meta: dict[str, Any], num_units: int):
    self._temporary = temporary
    self._directory = directory
    self._meta = meta
    self._num_units = num_units

  def process(self, _, shards: list[Any], unit_counts: list[Any]) -> Iterator[str]:
    temporary, directory = pathlib.Path(self._temporary), pathlib.Path(self._directory)
    _check_folder(temporary)
    lines_read = np.zeros(self._num_units, np.int64)
    dropped = np.zeros(self._num_units, np.int64)
    for unit, lines, empty in unit_counts:
      lines_read[unit], dropped[unit] = lines, empty
    if len({unit for unit, _, _ in unit_counts}) != self._num_units:
      raise prepared.PreparedDataError(
          f"{temporary}: {len(unit_counts)} of {self._num_units} inputs reported their lines; "
          "the pipeline lost some: run it again")
    first_line = np.concatenate([[0], np.cumsum(lines_read)[:-1]])
    shard_lengths, shard_lines = [], []
    dtype = np.dtype(self._meta["dtype"])
    shards = sorted(shards, key=lambda s: s[:2])
    # A part is where WriteShard put it, or already renamed by an earlier try of this step.
    missing = [_part_name(unit, part) for n, (unit, part, _, _) in enumerate(shards)
               if not (temporary / _part_name(unit, part)).exists()
               and not (temporary / prepared.shard_name(n)).exists()]
    if missing:
      raise prepared.PreparedDataError(
          f"{temporary}: {len(missing)} of {len(shards)} shards that WriteShard reported are "
          f"missing ({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}); nothing "
          "was published. Something removed them while the pipeline ran (another prepare, "
          "or workers that see another file system than the launcher): run it again")
    for n, (unit, part, lengths, lines) in enumerate(shards):
      source = temporary / _part_name(unit, part)
      if source.exists():
        source.replace(temporary / prepared.shard_name(n))
      shard_lengths.append(lengths)
      shard_lines.append(lines + first_line[unit])
    if not shards:  # as the local writer: one empty shard
      shard_lengths.append(prepared.write_shard(temporary / prepared.shard_name(0), [], [], dtype))
      shard_lines.append(np.zeros(0, np.int64))
    meta = dict(self._meta, writer="beam", lines_read=int(lines_read.sum()),
                empty_dropped=int(dropped.sum()))
    if meta["empty_dropped"]:
      _log.warning("left out %d of %d pairs of %s:%s with an empty side (DataConfig.empty_lines="
                   "'drop')", meta["empty_dropped"], meta["lines_read"], meta["corpus"],
                   meta["split"])
    prepared.finalize(temporary, shard_lengths=shard_lengths, shard_lines=shard_lines, meta=meta)
    with prepared.ids_lock(directory):
      prepared.publish(temporary, directory)
    yield str(directory)


def build_prepare_pipeline(pipeline: beam.Pipeline, data_config: DataConfig, tokenizer: Any, *,
                           split: str | None = None, output_dir: str | os.PathLike | None = None,
                           records_per_shard: int = prepared.RECORDS_PER_SHARD
                           ) -> beam.PCollection:
  """Adds the tokenize-and-write steps of one split to ``pipeline`` (see the module docstring).

  The text is found here, in the launching process: ``train_files`` is matched (and
  its shards paired), or the tfds corpus is prepared first. The temporary folder is
  made here too (``prepared.start_partial``: abandoned ones are removed first), and
  this process holds its writer lock, and its heartbeat, until it exits: run the
  pipeline in this process and wait for it (``pipeline.run().wait_until_finish()``);
  a later prepare removes an unpublished folder only once the lock is free and
  nothing in it changed for ``prepared.ABANDONED_AFTER_S`` seconds.

  Args:
    pipeline: a ``beam.Pipeline``; the caller runs it.
    data_config: the corpus (``dataset`` / ``manual_dir`` / ``train_files``), the
      languages, ``data_dir`` and ``empty_lines``.
    tokenizer: the run's tokenizer (its hash picks the folder; it reaches the workers
      as JSON).
    split: defaults to ``data_config.train_split``.
    output_dir: the finished folder; default ``prepared.ids_location(...).directory``,
      where ``prepared.prepare_ids`` and training look.
    records_per_shard: at most this many pairs per shard; a range of a tfds split
      this long (or one ``train_files`` shard) is read as one element.

  Returns:
    A ``PCollection`` that holds the finished folder's path once the pipeline ran.

  Raises:
    DataError: ``train_files`` matches nothing or a shard has no partner; bad text
      raises ``DataError`` naming the file and line when the pipeline runs (Beam adds
      ``[while running 'Read']`` to the message).
  """
  _check_records_per_shard(records_per_shard)
  location = prepared.ids_location(data_config, tokenizer, split)
  directory = pathlib.Path(output_dir) if output_dir is not None else location.directory
  with prepared.ids_lock(directory):
    temporary, writer_lock = prepared.start_partial(directory, "beam-")
  try:
    steps = _add_steps(pipeline, data_config, tokenizer, location, temporary=temporary,
                       directory=directory, records_per_shard=records_per_shard)
  except BaseException:
    writer_lock.close()
    shutil.rmtree(temporary, ignore_errors=True)
    raise
  _WRITER_LOCKS.append(writer_lock)  # held, and beating, until this process ends
  return steps


# The writer locks of the partial folders build_prepare_pipeline made: this process's to hold.
_WRITER_LOCKS: list[Any] = []


def _check_records_per_shard(records_per_shard: int) -> None:
  if records_per_shard < 1:
    raise ValueError(f"records_per_shard={records_per_shard}: give at least 1")


def _add_steps(pipeline: beam.Pipeline, data_config: DataConfig, tokenizer: Any,
               location: prepared.IdsLocation, *, temporary: pathlib.Path,
               directory: pathlib.Path, records_per_shard: int) -> beam.PCollection:
  """The steps of ``build_prepare_pipeline``, writing into ``temporary`` (already made)."""
  langs = (data_config.source_lang, data_config.target_lang)
  pairs = None
  if location.source.shards is not None:  # the user's own files
    units: list[_Unit] = [(k, {lang: str(path) for lang, path in shard.items()})
                         for k, shard in enumerate(location.source.shards)]
  else:
    pairs = location.source.pairs()
    units = [(k, (start, min(start + records_per_shard, len(pairs))))
             for k, start in enumerate(range(0, len(pairs), records_per_shard))]
  meta = location.meta(tokenizer, data_config)
  meta["records_per_shard"] = records_per_shard
  label = location.split  # step names stay unique with several splits in one pipeline

  read = (pipeline
          | f"Units {label}" >> beam.Create(units)
          | f"Spread units {label}" >> beam.Reshuffle()
          | f"Read {label}" >> beam.ParDo(_Read(
              langs, drop_empty=data_config.empty_lines == "drop",
              records_per_shard=records_per_shard, pairs=pairs, chunk=_CHUNK)).with_outputs(
                  _COUNTS, main="chunks"))
  shards = (read.chunks
            | f"Spread chunks {label}" >> beam.Reshuffle()
            | f"Tokenize {label}" >> beam.ParDo(_Tokenize(
                tokenizer_lib.tokenizer_to_json(tokenizer), location.langs))
            | f"Group shards {label}" >> beam.GroupByKey()
            | f"WriteShard {label}" >> beam.ParDo(_WriteShard(
                os.fspath(temporary), meta["dtype"])))
  all_shards = shards | f"All shards {label}" >> beam.combiners.ToList()
  all_counts = read[_COUNTS] | f"All counts {label}" >> beam.combiners.ToList()
  return (pipeline
          | f"Once {label}" >> beam.Create([None])
          | f"Finalize {label}" >> beam.ParDo(
              _Finalize(os.fspath(temporary), os.fspath(directory), meta, len(units)),
              beam.pvalue.AsSingleton(all_shards), beam.pvalue.AsSingleton(all_counts)))


def make_pipeline_options(options: PipelineOptions | Sequence[str] | None = None) -> PipelineOptions:
  """Beam's options from flags (``["--runner=DataflowRunner", ...]``) or as given; none means
  DirectRunner with one worker, in memory."""
  if isinstance(options, PipelineOptions):
    return options
  if not options:
    return PipelineOptions(runner="DirectRunner", direct_num_workers=1,
                           direct_running_mode="in_memory")
  return PipelineOptions(list(options))


def run_prepare(data_config: DataConfig, tokenizer: Any, *, split: str | None = None,
                pipeline_options: PipelineOptions | Sequence[str] | None = None,
                records_per_shard: int = prepared.RECORDS_PER_SHARD) -> prepared.PreparedIds:
  """The split's ids, written by a Beam pipeline unless a finished folder exists already.

  Args:
    data_config: as ``prepared.prepare_ids``.
    tokenizer: the run's tokenizer.
    split: defaults to ``data_config.train_split``.
    pipeline_options: Beam's flags (e.g. ``["--runner=DirectRunner",
      "--direct_num_workers=2"]``) or a ``PipelineOptions``; default DirectRunner.
    records_per_shard: at most this many pairs per shard.

  Returns:
    ``prepared.PreparedIds`` of ``prepared.ids_location(data_config, tokenizer,
    split).directory``, the folder ``prepare_ids`` and training read.

  Raises:
    DataError: bad text (the file and line named), as ``prepared.prepare_ids``.
    PreparedDataError: the pipeline finished without a finished folder.
  """
  _check_records_per_shard(records_per_shard)
  location = prepared.ids_location(data_config, tokenizer, split)
  writer_lock = None
  if not (location.directory / "meta.json").exists():
    with prepared.ids_lock(location.directory):
      if not (location.directory / "meta.json").exists():  # finished meanwhile?
        temporary, writer_lock = prepared.start_partial(location.directory, "beam-")
  if writer_lock is not None:
    start = time.perf_counter()
    try:
      with beam.Pipeline(options=make_pipeline_options(pipeline_options)) as pipeline:
        _add_steps(pipeline, data_config, tokenizer, location, temporary=temporary,
                   directory=location.directory, records_per_shard=records_per_shard)
      # Done already, unless the options said --no_wait_until_finish: the writer lock, its
      # heartbeat and the cleanup below must outlast every worker's write.
      pipeline.result.wait_until_finish()
    finally:
      writer_lock.close()
      shutil.rmtree(temporary, ignore_errors=True)  # published already unless the run failed
    _log.info("prepared %s:%s as ids in %s with Beam (%.1f s)", location.corpus, location.split,
              location.directory, time.perf_counter() - start)
  prepared.remove_abandoned(location.directory)  # a killed writer's, when another finished the ids
  return prepared.open_location(location)
