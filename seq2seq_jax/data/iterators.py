"""The iterators: training batches by token budget (bucketed or packed), evaluation batches
in file order; the last stage of the data path (``sources`` -> ``prepared`` -> ``packing``
-> ``batches`` -> here).

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
to a bucket and each epoch shuffles the buckets' pairs into batches (``batches``);
with packing, the pairs are packed once into rows of the largest bucket and each
epoch shuffles the rows into batches (``packing``). The batch plan is a function
of the seed and the token lengths, so the iterator's state is grain's own (the
next batch number) and restores exactly: save it with
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
warning), never dropped. ``sources.load_eval_text`` gives the raw sentences for BLEU.

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
  >>> text = sources.load_eval_text(config)  # the same split as raw sentences, for BLEU
  >>> rows == len(text.sources) == len(text.references)
  True
"""

from __future__ import annotations

import dataclasses
import logging

import grain
import numpy as np

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import prepared, sources
from seq2seq_jax.data.batches import Batch, BucketItem, MakeBatch, MakeIdsBatch, TrainBatchPlan
from seq2seq_jax.data.builders import TextPairs
from seq2seq_jax.data.packing import PackedBatchPlan
from seq2seq_jax.data.plans import bucket_index, bucket_rows
from seq2seq_jax.data.tokenizer import Tokenizer

# A few batches ahead on two threads: tokenizing is cheap, and cores are shared with XLA.
DEFAULT_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)


_log = logging.getLogger(__name__)


def _check_shard(data_config: DataConfig, shard_index: int, shard_count: int) -> None:
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index={shard_index} must be in [0, shard_count={shard_count})")
  if data_config.batch_multiple % shard_count:
    raise ValueError(f"DataConfig.batch_multiple={data_config.batch_multiple} must be a multiple "
                     f"of shard_count={shard_count} (the number of hosts) so that every host gets "
                     "an equal share of each batch; set it to the global device count")


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


def make_train_dataset(data_config: DataConfig, tokenizer: Tokenizer, *, seed: int | None = None,
                       shard_index: int = 0, shard_count: int = 1, num_epochs: int | None = None,
                       split: str | None = None, wait_s: float = 3600.0
                       ) -> tuple[grain.MapDataset, TrainStats]:
  """The training batches as a grain ``MapDataset`` (batch number -> batch) and its stats.

  With ``data_config.tokenize_once`` (the default) the split's token ids are
  prepared once (``prepared.prepare_ids``: process 0 writes, other hosts wait up
  to ``wait_s``) and batches gather ids from them; otherwise every batch
  tokenizes its text. Both give the same batches for the same seed and config.
  With ``data_config.packing`` rows hold several pairs (see ``PackedBatchPlan``).

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
  split_source = sources.resolve(data_config, split)
  langs = prepared.languages(data_config, tokenizer)
  # The token counts of the split: from the prepared ids (source: the PreparedIds), or from
  # tokenizing the text (the old path; source: the TextPairs).
  source: prepared.PreparedIds | TextPairs
  if data_config.tokenize_once:
    source = prepared.prepare_source(split_source, tokenizer, writer=shard_index == 0,
                                     wait_s=wait_s)
    source_len_N, target_len_N = source.source_len_N, source.target_len_N
  else:
    source = split_source.pairs()
    source_len_N, target_len_N = prepared.token_lengths(source, tokenizer, langs=langs)
  name = repr(source)
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
    plan = PackedBatchPlan(example_ids_N=example_ids_N,
                           source_len_N=kept_source_N, target_len_N=kept_target_N,
                           length=length, rows=bucket_rows(data_config, length), seed=seed,
                           num_epochs=num_epochs, cache_dir=getattr(source, "directory", None))
    pairs_per_bucket = {length: len(example_ids_N)}
    rows_per_bucket = {length: plan.rows}
    padded_cells = plan.batches_per_epoch * plan.rows * length * 2
  else:
    length_N = np.maximum(kept_source_N, kept_target_N)[keep_N]
    bucket_index_N = bucket_index(data_config, length_N)
    rows = [bucket_rows(data_config, length) if (bucket_index_N == b).any() else 1
            for b, length in enumerate(data_config.bucket_lengths)]
    plan = TrainBatchPlan(example_ids_N=example_ids_N, bucket_index_N=bucket_index_N,
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
    make = MakeIdsBatch(source, data_config, tokenizer.pad_id, shard_index=shard_index,
                         shard_count=shard_count)
  else:
    make = MakeBatch(source, tokenizer, data_config, langs=langs, shard_index=shard_index,
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
  return TrainIterator(
      make_train_dataset(data_config, tokenizer, seed=seed, shard_index=shard_index,
                         shard_count=shard_count, num_epochs=num_epochs)[0],
      read_options=read_options or DEFAULT_READ_OPTIONS, num_workers=data_config.num_workers)


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
  pairs = sources.resolve(data_config, split or data_config.eval_split).pairs()
  langs = prepared.languages(data_config, tokenizer)
  source_len_N, target_len_N = prepared.token_lengths(pairs, tokenizer, langs=langs)
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
    bucket = data_config.bucket_lengths[bucket_index(data_config, length_N[real].max())]
    plan.append(BucketItem(bucket, ids_B))
  return grain.MapDataset.source(plan).map(
      MakeBatch(pairs, tokenizer, data_config, langs=langs, shard_index=shard_index,
                shard_count=shard_count))
