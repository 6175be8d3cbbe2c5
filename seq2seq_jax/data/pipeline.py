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

Training (``make_train_iterator``): pairs longer than ``max_source_len`` /
``max_target_len`` tokens (EOS included) are dropped or truncated
(``DataConfig.too_long``; counted in ``TrainStats`` and logged). Each pair goes
to the smallest bucket length ``L >= max(source length, target length)``; a
batch of bucket ``L`` has ``rows(L) = batch_tokens // L`` rounded down to a
multiple of ``batch_multiple`` rows, so ``rows * L <= batch_tokens`` and XLA
sees one shape per bucket. Per epoch (seeded by ``(seed, epoch)``), every
bucket's pairs are shuffled and cut into batches, the last one filled with
padding rows, and the batches are shuffled: every kept pair appears exactly once
per epoch. The batch plan is a function of the seed and the token lengths, so
the iterator's state is grain's own (the next batch number) and restores
exactly: save it with ``grain.checkpoint.CheckpointSave(iterator)`` inside
``ocp.args.Composite``. Multi-host: every host computes the same global plan and
takes rows ``[h * B / n, (h + 1) * B / n)`` of each global batch (``shard_index``
``h``, ``shard_count`` ``n``: pass ``jax.process_index()``,
``jax.process_count()``), so all hosts step through the same shapes.

Batches are built on grain's prefetch threads (``DEFAULT_READ_OPTIONS``). Worker
processes work too: ``make_train_dataset(...)[0].to_iter_dataset().mp_prefetch(
grain.MultiprocessingOptions(num_workers=N))``; grain then needs absl flags
parsed (``absl.flags.FLAGS.mark_as_parsed()`` outside an absl app). Before a
multi-host run, prepare the corpus once (``seq2seq-jax prepare``) so hosts do
not race to write it.

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

import dataclasses
import logging
import sys
import threading
from collections.abc import Sequence

import grain
import numpy as np

from seq2seq_jax.configs import DataConfig
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


def bucket_rows(data_config: DataConfig, length: int) -> int:
  """Global rows of a training batch of bucket ``length``: a multiple of batch_multiple."""
  rows = data_config.batch_tokens // length // data_config.batch_multiple * data_config.batch_multiple
  if rows <= 0:
    raise ValueError(f"DataConfig.batch_tokens={data_config.batch_tokens} cannot hold "
                     f"batch_multiple={data_config.batch_multiple} rows of length {length}: raise "
                     f"batch_tokens to at least {data_config.batch_multiple * length}")
  return rows


def languages(data_config: DataConfig, tokenizer: Tokenizer) -> tuple[str | None, str | None]:
  """The language codes a multilingual tokenizer (M2M100, NLLB) is given; None for others."""
  if getattr(tokenizer, "languages", ()):
    return data_config.source_lang, data_config.target_lang
  return None, None


def _encode_sources(tokenizer: Tokenizer, texts: list[str],
                    langs: tuple[str | None, str | None]) -> list[list[int]]:
  """Source ids; the target language goes along when there is one (checkpoints that mark
  it in the source: multilingual OPUS-MT, MADLAD-400)."""
  if langs[1] is None:
    return tokenizer.encode_source(texts, langs[0])
  return tokenizer.encode_source(texts, langs[0], target_lang=langs[1])


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


class _TrainBatchPlan(grain.MapDataset):
  """Batch number -> ``(length L, example ids [B] with -1 for padding rows)``.

  Epoch ``e`` is planned from ``(seed, e)`` alone: shuffle each bucket's pairs, cut
  them into batches of that bucket's rows, fill the last with -1, shuffle the batches.
  """

  def __init__(self, *, example_ids_N: np.ndarray, bucket_index_N: np.ndarray,
               bucket_lengths: Sequence[int], rows: Sequence[int], seed: int,
               num_epochs: int | None):
    super().__init__()
    self._members = [example_ids_N[bucket_index_N == b] for b in range(len(bucket_lengths))]
    self._lengths = tuple(bucket_lengths)
    self._rows = tuple(rows)
    self._seed = seed
    self._num_epochs = num_epochs
    self.batches_per_epoch = sum(-(-len(m) // r) for m, r in zip(self._members, self._rows))
    if not self.batches_per_epoch:
      raise DataError("no training pair is left after filtering: raise DataConfig.max_source_len "
                      "/ max_target_len or set too_long='truncate'")
    self._cache: tuple[int, list] | None = None
    self._lock = threading.Lock()

  def __len__(self) -> int:
    if self._num_epochs is None:
      return sys.maxsize
    return self._num_epochs * self.batches_per_epoch

  def __str__(self) -> str:
    return f"_TrainBatchPlan(batches_per_epoch={self.batches_per_epoch}, seed={self._seed})"

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_lock"] = None
    state["_cache"] = None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def plan_epoch(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    """Every batch of ``epoch`` in order: ``(length, example ids [B], -1 = padding)``."""
    rng = np.random.default_rng([self._seed, epoch])
    batches = []
    for members, length, rows in zip(self._members, self._lengths, self._rows):
      if not len(members):
        continue
      shuffled = rng.permutation(members)
      padded = np.full(-(-len(shuffled) // rows) * rows, -1, np.int32)
      padded[:len(shuffled)] = shuffled
      batches.extend((length, ids) for ids in padded.reshape(-1, rows))
    return [batches[i] for i in rng.permutation(len(batches))]

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
    return plan[position]


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

  def __call__(self, item: tuple[int, np.ndarray]) -> Batch:
    length, ids_B = item
    rows = len(ids_B) // self._shard_count
    ids_B = np.asarray(ids_B[self._shard_index * rows:(self._shard_index + 1) * rows], np.int32)
    real = np.flatnonzero(ids_B >= 0)
    texts = self._pairs.__getitems__(ids_B[real].tolist())
    pad_id = self._tokenizer.pad_id
    inputs_BL = np.full((rows, length), pad_id, np.int32)
    targets_BL = np.full((rows, length), pad_id, np.int32)
    for out_BL, encode, side, limit in (
        (inputs_BL, lambda t, _: _encode_sources(self._tokenizer, t, self._langs), 0,
         self._max_source_len),
        (targets_BL, self._tokenizer.encode_target, 1, self._max_target_len)):
      encoded = encode([pair[side] for pair in texts], self._langs[side])
      for row, pieces in zip(real, encoded):
        if len(pieces) > limit:  # keep EOS (the last id) and a language code in front
          pieces = pieces[:limit - 1] + pieces[-1:]
        if len(pieces) > length:  # the plan measured these lengths with the same tokenizer
          raise RuntimeError(f"pair {ids_B[row]} has {len(pieces)} tokens, more than its bucket "
                             f"{length}: the tokenizer changed after the lengths were measured")
        out_BL[row, :len(pieces)] = pieces
    return {"inputs": inputs_BL, "targets": targets_BL, "index": ids_B,
            "weights": (ids_B >= 0).astype(np.float32)}


def make_train_dataset(data_config: DataConfig, tokenizer: Tokenizer, *, seed: int | None = None,
                       shard_index: int = 0, shard_count: int = 1, num_epochs: int | None = None,
                       split: str | None = None) -> tuple[grain.MapDataset, TrainStats]:
  """The training batches as a grain ``MapDataset`` (batch number -> batch) and its stats.

  Args:
    data_config: corpus, limits, buckets and budget.
    tokenizer: the run's vocabulary.
    seed: shuffling seed; ``None`` means ``data_config.shuffle_seed``.
    shard_index: this host's index (``jax.process_index()``).
    shard_count: number of hosts (``jax.process_count()``); must divide
      ``batch_multiple``.
    num_epochs: ``None`` repeats forever (``len`` is ``sys.maxsize``).
    split: defaults to ``data_config.train_split``.

  Returns:
    ``(dataset, stats)``; ``dataset[i]`` is batch ``i`` (this host's
    ``B / shard_count`` rows), the same for the same seed and config.
  """
  _check_shard(data_config, shard_index, shard_count)
  seed = data_config.shuffle_seed if seed is None else seed
  pairs = load_split(data_config, split or data_config.train_split)
  source_len_N, target_len_N = token_lengths(pairs, tokenizer,
                                             langs=languages(data_config, tokenizer))
  too_long_N = (source_len_N > data_config.max_source_len) | (target_len_N > data_config.max_target_len)
  if data_config.too_long == "filter":
    keep_N = ~too_long_N
  else:
    keep_N = np.ones(len(pairs), bool)
    source_len_N = np.minimum(source_len_N, data_config.max_source_len)
    target_len_N = np.minimum(target_len_N, data_config.max_target_len)
  length_N = np.maximum(source_len_N, target_len_N)[keep_N]
  bucket_index_N = _bucket_index(data_config, length_N)
  rows = [bucket_rows(data_config, length) if (bucket_index_N == b).any() else 1
          for b, length in enumerate(data_config.bucket_lengths)]
  plan = _TrainBatchPlan(example_ids_N=np.flatnonzero(keep_N).astype(np.int32),
                         bucket_index_N=bucket_index_N, bucket_lengths=data_config.bucket_lengths,
                         rows=rows, seed=seed, num_epochs=num_epochs)
  num_too_long = int(too_long_N.sum())
  counts = np.bincount(bucket_index_N, minlength=len(rows))
  padded_cells = sum(-(-int(c) // r) * r * length * 2
                     for c, r, length in zip(counts, rows, data_config.bucket_lengths))
  num_tokens = int(source_len_N[keep_N].sum() + target_len_N[keep_N].sum())
  stats = TrainStats(
      num_pairs=len(pairs), num_too_long=num_too_long,
      num_filtered=num_too_long if data_config.too_long == "filter" else 0,
      num_truncated=num_too_long if data_config.too_long == "truncate" else 0,
      filtered_tokens=int(source_len_N[too_long_N].sum() + target_len_N[too_long_N].sum())
      if data_config.too_long == "filter" else 0,
      num_tokens=num_tokens,
      pairs_per_bucket={length: int(c) for length, c in zip(data_config.bucket_lengths, counts) if c},
      rows_per_bucket={length: r for length, r, c in zip(data_config.bucket_lengths, rows, counts) if c},
      batches_per_epoch=plan.batches_per_epoch,
      padding_fraction=1.0 - num_tokens / padded_cells)
  if num_too_long:
    action = "dropped" if data_config.too_long == "filter" else "truncated"
    _log.warning("%s %d of %d training pairs of %s longer than max_source_len=%d / "
                 "max_target_len=%d tokens (%.2f%%)", action, num_too_long, len(pairs), pairs,
                 data_config.max_source_len, data_config.max_target_len,
                 100.0 * num_too_long / len(pairs))
  _log.info("training data: %s", stats)
  batches = plan.map(_MakeBatch(pairs, tokenizer, data_config, shard_index=shard_index,
                                shard_count=shard_count))
  return batches, stats


def make_train_iterator(data_config: DataConfig, tokenizer: Tokenizer, *, seed: int | None = None,
                        shard_index: int = 0, shard_count: int = 1,
                        num_epochs: int | None = None,
                        read_options: grain.ReadOptions | None = None) -> grain.DatasetIterator:
  """A checkpointable iterator over training batches (see ``make_train_dataset``).

  ``iterator.get_state()`` / ``set_state(state)`` (or orbax's
  ``grain.checkpoint.CheckpointSave(iterator)`` / ``CheckpointRestore(iterator)``)
  resume exactly where it stopped.
  """
  batches, _ = make_train_dataset(data_config, tokenizer, seed=seed, shard_index=shard_index,
                                  shard_count=shard_count, num_epochs=num_epochs)
  return iter(batches.to_iter_dataset(read_options or DEFAULT_READ_OPTIONS))


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
    plan.append((bucket, ids_B))
  return grain.MapDataset.source(plan).map(
      _MakeBatch(pairs, tokenizer, data_config, shard_index=shard_index, shard_count=shard_count))


def load_eval_text(data_config: DataConfig, split: str | None = None) -> EvalText:
  """Source sentences and references of a split, in file order, untokenized."""
  pairs = load_split(data_config, split or data_config.eval_split)
  texts = pairs.__getitems__(list(range(len(pairs))))
  return EvalText(sources=[s for s, _ in texts], references=[t for _, t in texts])
