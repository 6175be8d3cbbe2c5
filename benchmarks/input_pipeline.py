"""Input pipeline at WMT scale: token ids prepared once against tokenizing every batch.

A WMT'14-sized stand-in corpus is built once from the shared Tatoeba and Multi30k
text (never copied into the repository: it goes to ``--work-dir``, default
``~/.cache/seq2seq_jax/bench/input_pipeline``) and fed to the library's training
pipeline with the ``wmt14_transformer_base`` preset's data settings (buckets up to
256, ``batch_tokens`` 26,624: 104 packed rows of 256 slots a side), on two paths:

- old: ``DataConfig(tokenize_once=False)``: every start tokenizes the whole split
  to measure lengths, every batch tokenizes its text. It reads through tfds, so
  the stand-in goes in as ``dataset="parallel_text"`` (plain files, prepared by
  tfds once); Multi30k through ``dataset="multi30k"``. Measured at Multi30k and
  the 1 M prefix; at 4.5 M its start is extrapolated from 1 M (linear in pairs),
  since tfds cannot prepare a split over 1 GB without TensorFlow (its shuffler
  spills to disk through ``tf.io.gfile``); ``--old-full`` tries it anyway.
- new: ``tokenize_once=True``: ids prepared once (``prepare_ids``), every start
  reads the lengths index; the stand-in is read from gzip shards by
  ``DataConfig.train_files``; bucketed and packed (``packing=True``) batches.

Measured, each start in a fresh process: time to the first batch, peak resident
memory (the child's own ``VmHWM``), steady-state token slots a second a side
(slots = rows x length of a batch, per side) on grain threads, in 1, 2 and 4
grain worker processes, and from one core (``dataset[i]`` in a loop on a thread
pinned to core 0); padding over the batches against ``TrainStats.padding_fraction``;
grain's own packers (``FirstFitPackIterDataset``, ``BestFitPackIterDataset``) on
the same pairs as the library's planned packing (every pair of the 1 M prefix within
the length limits); and, against the compiled WMT
base step of ``benchmarks/results/tpu_compile.json`` (estimates for v5e:2x4 and
v4:2x2x1), how many such cores a TPU host needs to keep up.

The stand-in: ``--pairs`` pairs (4,508,785, tfds/HF ``wmt14`` de-en train) whose
English word counts follow a lognormal with WMT'14 en-de's mean (116 M English
words over 4.5 M pairs, Luong et al. 2015: 25.8 words) and ``--sigma`` 0.7 (an
assumption: no published percentiles found; it puts the median at 20 words, 10 %
of pairs above 50 and 1 % above 100). Each pair joins random Tatoeba and Multi30k
pairs, English and German alike, until its English side has exactly its drawn
number of words. Shards of ``--shard-pairs`` pairs, ``train-0000N.{en,de}.gz``; the
1 M size is the first two shards. Tokenizer: 32,000 sentencepiece pieces trained
on the source sentences (every distinct sentence the stand-in can hold).

  python benchmarks/input_pipeline.py [--out FILE.json] [--plot FILE.png] [--work-dir DIR]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/input_pipeline.py   # tiny sizes, for CI
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "data"
DEFAULT_WORK_DIR = pathlib.Path("~/.cache/seq2seq_jax/bench/input_pipeline")
PRESET = "wmt14_transformer_base"

# WMT'14 en-de training data, the figures the stand-in matches.
WMT14_PAIRS = 4_508_785  # tfds wmt14_translate/de-en and HF wmt/wmt14 de-en: train examples
WMT14_EN_WORDS_PER_PAIR = 116e6 / 4.5e6  # Luong et al. 2015, sec. 4.1: 116 M English words
LENGTH_SIGMA = 0.7  # lognormal shape: an assumption (see the module docstring)
MAX_WORDS = 400  # the longest drawn pair; longer than the 256-token limit, as in WMT
# Padding targets, rates and limits of the issue ([data-scale] item 6).
TARGETS = {"first batch s": 10.0, "one core slots/s/side": 2e6, "peak MB": 2000.0,
           "packing padding": 0.05}
# Used only when benchmarks/results/tpu_compile.json lacks the rows (RESULTS.md, "TPU estimates").
FALLBACK_STEPS = [("v5e:2x4", "replicated", 128 * 256, 0.0330),
                  ("v5e:2x4", "fsdp", 128 * 256, 0.0304),
                  ("v4:2x2x1", "replicated", 128 * 256, 0.0456),
                  ("v4:2x2x1", "fsdp", 128 * 256, 0.0419)]


def settings(quick: bool) -> dict[str, Any]:
  if quick:
    return dict(pairs=4_000, shard_pairs=1_000, prefix_shards=2, vocab_size=1_000,
                tokenizer_sentences=6_000, small="multi30k_tiny", seconds=0.2, min_batches=2,
                warmup=1, workers=(1,), worker_runs=[("full", "new", True)],
                separate=False)
  return dict(pairs=WMT14_PAIRS, shard_pairs=500_000, prefix_shards=2, vocab_size=32_000,
              tokenizer_sentences=0, small="multi30k/raw", seconds=10.0, min_batches=20,
              warmup=5, workers=(1, 2, 4),
              worker_runs=[("full", "new", False), ("full", "new", True), ("prefix", "old", False)],
              separate=True)


# --------------------------------------------------------------------------- the corpus


def load_pool() -> tuple[list[str], list[str]]:
  """Tatoeba's and Multi30k's training pairs: (English, German) sentences, aligned."""
  english, german = [], []
  with open(SHARED / "tatoeba_deu_eng" / "deu.txt", encoding="utf-8") as lines:
    for line in lines:
      en, de = line.rstrip("\n").split("\t")[:2]
      english.append(en)
      german.append(de)
  raw = SHARED / "multi30k" / "raw"
  english += (raw / "train.en").read_text(encoding="utf-8").splitlines()
  german += (raw / "train.de").read_text(encoding="utf-8").splitlines()
  return english, german


def draw_pairs(words_P, rng, count: int, *, mean: float, sigma: float, max_words: int):
  """Which pool pairs make each of ``count`` stand-in pairs, and their drawn word counts.

  Each pair draws an English length ``L`` from a lognormal of mean ``mean``, then
  takes random pool pairs, each no longer than what is left, until exactly ``L``
  English words are taken (the pool holds one-word sentences, so it always ends).

  Returns:
    ``(pieces, starts, target_N)``: pool indices pair after pair, int64 ``[count + 1]``
    offsets into them, and the drawn lengths.
  """
  import numpy as np  # noqa: PLC0415

  mu = math.log(mean) - sigma ** 2 / 2  # a lognormal's mean is exp(mu + sigma^2 / 2)
  target_N = np.clip(np.rint(rng.lognormal(mu, sigma, count)), 1, max_words).astype(np.int64)
  order = np.argsort(words_P, kind="stable")
  at_most = np.searchsorted(words_P[order], np.arange(max_words + 1), side="right")
  remaining = target_N.copy()
  owners, picks = [], []
  active = np.arange(count)
  while len(active):
    pick = order[(rng.random(len(active)) * at_most[remaining[active]]).astype(np.int64)]
    remaining[active] -= words_P[pick]
    owners.append(active)
    picks.append(pick)
    active = active[remaining[active] > 0]
  owner = np.concatenate(owners)
  by_pair = np.argsort(owner, kind="stable")  # rounds stay in order within a pair
  starts = np.zeros(count + 1, np.int64)
  starts[1:] = np.cumsum(np.bincount(owner, minlength=count))
  return np.concatenate(picks)[by_pair], starts, target_N


def build_corpus(directory: pathlib.Path, s: dict[str, Any], *, seed: int = 0) -> dict[str, Any]:
  """Writes the stand-in's gzip shards into ``directory`` once; returns its recipe and stats."""
  import numpy as np  # noqa: PLC0415

  recipe = dict(pairs=s["pairs"], shard_pairs=s["shard_pairs"],
                mean_en_words=WMT14_EN_WORDS_PER_PAIR, sigma=LENGTH_SIGMA, max_words=MAX_WORDS,
                seed=seed, version=1)
  key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
  directory = directory / f"standin-{s['pairs']}-{key}"
  done = directory / "recipe.json"
  if done.exists():
    return json.loads(done.read_text())
  partial = directory.with_name(directory.name + ".partial")
  shutil.rmtree(partial, ignore_errors=True)
  partial.mkdir(parents=True)
  english, german = load_pool()
  words_P = np.array([len(s.split()) for s in english], np.int64)
  started = time.perf_counter()
  en_words, de_words, chars = [], [], []
  for shard, first in enumerate(range(0, s["pairs"], s["shard_pairs"])):
    count = min(s["shard_pairs"], s["pairs"] - first)
    pieces, starts, target_N = draw_pairs(
        words_P, np.random.default_rng([seed, shard]), count, mean=WMT14_EN_WORDS_PER_PAIR,
        sigma=LENGTH_SIGMA, max_words=MAX_WORDS)
    bounds = starts.tolist()
    picks = pieces.tolist()
    for lang, sentences in (("en", english), ("de", german)):
      lines = [" ".join([sentences[j] for j in picks[a:b]]) for a, b in zip(bounds, bounds[1:])]
      with gzip.open(partial / f"train-{shard:05d}.{lang}.gz", "wt", encoding="utf-8",
                     compresslevel=3) as stream:
        stream.write("\n".join(lines) + "\n")
      if lang == "de":
        de_words.append(np.fromiter((line.count(" ") + 1 for line in lines), np.int64, count))
      chars.append(np.fromiter(map(len, lines), np.int64, count))
    en_words.append(target_N)
    print(f"  stand-in shard {shard}: {first + count:,} pairs "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
  en = np.concatenate(en_words)
  de = np.concatenate(de_words)
  stats = dict(recipe, directory=str(directory), seconds=time.perf_counter() - started,
               shards=len(en_words), en_words_mean=float(en.mean()),
               en_words_median=float(np.median(en)),
               en_words_p90=float(np.percentile(en, 90)), en_words_p99=float(np.percentile(en, 99)),
               en_words_max=int(en.max()), en_share_over_50=float((en > 50).mean()),
               de_words_mean=float(de.mean()),
               chars_per_pair_mean=float(sum(c.sum() for c in chars) / len(en)),
               pool_pairs=len(english))
  (partial / "recipe.json").write_text(json.dumps(stats, indent=1))
  shutil.rmtree(directory, ignore_errors=True)
  partial.rename(directory)
  return stats


def prefix_glob(corpus: pathlib.Path, shards: int) -> str:
  """A glob over the first ``shards`` shards: a folder of links to them."""
  folder = corpus.parent / f"{corpus.name}-first{shards}"
  folder.mkdir(exist_ok=True)
  for k in range(shards):
    for lang in ("en", "de"):
      link = folder / f"train-{k:05d}.{lang}.gz"
      if not link.exists():
        link.symlink_to(corpus / link.name)
  return str(folder / "train-*.{lang}.gz")


def plain_copy(corpus: pathlib.Path, shards: int) -> pathlib.Path:
  """``train.en`` / ``train.de`` of the first ``shards`` shards: the old path's parallel_text."""
  folder = corpus.parent / f"{corpus.name}-first{shards}-plain"
  if (folder / "done").exists():
    return folder
  folder.mkdir(exist_ok=True)
  for lang in ("en", "de"):
    with open(folder / f"train.{lang}", "wb") as out:
      for k in range(shards):
        with gzip.open(corpus / f"train-{k:05d}.{lang}.gz", "rb") as stream:
          shutil.copyfileobj(stream, out, 1 << 22)
  (folder / "done").write_text("")
  return folder


def train_tokenizer(path: pathlib.Path, s: dict[str, Any]) -> dict[str, Any]:
  """The stand-in's sentencepiece model, trained once on the pool's sentences (both sides)."""
  info = path.with_suffix(".json")
  if path.exists() and info.exists():
    return json.loads(info.read_text())
  from seq2seq_jax.data import train_tokenizer_from_text  # noqa: PLC0415

  english, german = load_pool()
  sentences = english + german
  if s["tokenizer_sentences"]:
    sentences = sentences[::max(1, len(sentences) // s["tokenizer_sentences"])]
  started = time.perf_counter()
  tokenizer = train_tokenizer_from_text(iter(sentences), s["vocab_size"])
  tokenizer.save(path)
  result = dict(path=str(path), vocab_size=tokenizer.vocab_size, sentences=len(sentences),
                seconds=time.perf_counter() - started)
  info.write_text(json.dumps(result))
  return result


def size_label(pairs: int) -> str:
  return f"{pairs / 1e6:.1f} M" if pairs >= 1e6 else f"{pairs / 1e3:.0f} k"


# --------------------------------------------------------------------------- children


def child_config(spec: dict[str, Any]):
  """The preset's DataConfig with the spec's corpus and path fields."""
  from seq2seq_jax import get_preset  # noqa: PLC0415

  data = get_preset(PRESET).data
  return dataclasses.replace(data, **spec["data"])


def vm_kib(field: str = "VmHWM") -> int:
  for line in open("/proc/self/status"):
    if line.startswith(field + ":"):
      return int(line.split()[1])
  return 0


def reset_peak() -> None:
  # Writing 5 to clear_refs sets VmHWM back to the current resident size (Linux >= 4.0).
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    pass


def drain(batches, *, seconds: float, min_batches: int, warmup: int) -> dict[str, Any]:
  """Steady-state slots a second a side of an iterator (or a ``dataset[i]`` generator),
  and the share of its slots (both sides) that are padding (id 0)."""
  import numpy as np  # noqa: PLC0415

  for _ in range(warmup):
    next(batches)
  slots = real = count = 0
  start = time.perf_counter()
  while True:
    batch = next(batches)
    slots += batch["inputs"].size
    real += np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"])
    count += 1
    elapsed = time.perf_counter() - start
    if elapsed >= seconds and count >= min_batches:
      break
  return {"batches": count, "seconds": elapsed, "slots/s/side": slots / elapsed,
          "padding measured": 1.0 - real / (2 * slots), "rows": int(batch["inputs"].shape[0]),
          "timing": {"times_s": [elapsed]}}


def by_index(dataset, start: int = 0):
  i = start
  while True:
    yield dataset[i]
    i += 1


def stats_dict(stats) -> dict[str, Any]:
  return {"padding_fraction": stats.padding_fraction, "batches_per_epoch": stats.batches_per_epoch,
          "num_pairs": stats.num_pairs, "num_filtered": stats.num_filtered,
          "num_tokens": stats.num_tokens}


def measure_prepare(spec: dict[str, Any]) -> dict[str, Any]:
  """The one-off work: the old path's tfds preparation, or the new path's ids and packing."""
  import numpy as np  # noqa: PLC0415

  from seq2seq_jax.data import (  # noqa: PLC0415
      Tokenizer, builders, load_split, make_train_dataset, prepare_ids, prepared)

  config = child_config(spec)
  tokenizer = Tokenizer.load(spec["tokenizer"])
  row = {"size": spec["size"], "path": spec["path"]}
  reset_peak()
  if spec["path"] == "old" or config.dataset in ("multi30k", "parallel_text"):
    shutil.rmtree(builders.get_builder(config).data_dir, ignore_errors=True)  # time it afresh
    start = time.perf_counter()
    pairs = load_split(config, config.train_split)  # tfds prepares the text once
    row["tfds s"] = time.perf_counter() - start
    if spec["path"] == "old":
      row.update(pairs=len(pairs), **{"peak MB": vm_kib() / 1024})
      return row
  location = prepared.ids_location(config, tokenizer)
  shutil.rmtree(location.directory, ignore_errors=True)  # time a real preparation
  start = time.perf_counter()
  ids = prepare_ids(config, tokenizer)
  row["prepare s"] = time.perf_counter() - start
  row["peak MB"] = vm_kib() / 1024
  start = time.perf_counter()
  _, stats = make_train_dataset(dataclasses.replace(config, packing=True), tokenizer, seed=0)
  row["pack s"] = time.perf_counter() - start  # reads the index, packs, keeps the rows
  tokens = np.stack([ids.source_len_N, ids.target_len_N])
  row.update(pairs=len(ids), shards=len(ids.meta["shard_sizes"]), directory=str(ids.directory),
             source_tokens_mean=float(tokens[0].mean()), target_tokens_mean=float(tokens[1].mean()),
             tokens_median=[float(x) for x in np.median(tokens, axis=1)],
             tokens_p99=[float(x) for x in np.percentile(tokens, 99, axis=1)],
             share_over_limit=float((tokens.max(axis=0) > config.max_source_len).mean()),
             packed_padding_fraction=stats.padding_fraction)
  return row


def measure_start(spec: dict[str, Any]) -> dict[str, Any]:
  """Time to the first batch of ``make_train_iterator``, then its steady state on threads."""
  from seq2seq_jax.data import Tokenizer, make_train_dataset, make_train_iterator  # noqa: PLC0415

  config = child_config(spec)
  tokenizer = Tokenizer.load(spec["tokenizer"])
  reset_peak()
  before = vm_kib("VmRSS")
  start = time.perf_counter()
  iterator = make_train_iterator(config, tokenizer, seed=0)
  batch = next(iterator)
  first = time.perf_counter() - start
  rate = drain(iterator, **spec["drain"])
  iterator.close()
  row = {"size": spec["size"], "path": spec["path"], "packing": config.packing,
         "first batch s": first, "peak MB": vm_kib() / 1024, "rss before MB": before / 1024,
         "first shape": list(batch["inputs"].shape), **rate}
  if config.tokenize_once:  # cheap once prepared; the old path would tokenize all again
    _, stats = make_train_dataset(config, tokenizer, seed=0)
    row["stats"] = stats_dict(stats)
  return row


def measure_workers(spec: dict[str, Any]) -> list[dict[str, Any]]:
  """Steady-state rates of the iterator in ``num_workers`` grain worker processes."""
  from seq2seq_jax.data import Tokenizer, make_train_iterator  # noqa: PLC0415

  tokenizer = Tokenizer.load(spec["tokenizer"])
  rows = []
  for workers in spec["workers"]:
    config = dataclasses.replace(child_config(spec), num_workers=workers)
    start = time.perf_counter()
    iterator = make_train_iterator(config, tokenizer, seed=0)
    next(iterator)
    first = time.perf_counter() - start
    rate = drain(iterator, **spec["drain"])
    iterator.close()
    rows.append({"size": spec["size"], "path": spec["path"], "packing": config.packing,
                 "workers": workers, "first batch s": first, **rate})
  return rows


def pin(cores: set[int] | None):
  """Pins this thread (and the threads it starts) to ``cores``; returns the old set."""
  old = os.sched_getaffinity(0)
  os.sched_setaffinity(0, cores if cores is not None else old)
  return old


def measure_one_core(spec: dict[str, Any]) -> dict[str, Any]:
  """``dataset[i]`` in a loop on a thread pinned to one core: one process's rate."""
  from seq2seq_jax.data import Tokenizer, make_train_dataset  # noqa: PLC0415

  config = child_config(spec)
  tokenizer = Tokenizer.load(spec["tokenizer"])
  dataset, stats = make_train_dataset(config, tokenizer, seed=0)
  old = pin({min(os.sched_getaffinity(0))})
  try:
    rate = drain(by_index(dataset), **spec["drain"])
  finally:
    pin(old)
  return {"size": spec["size"], "path": spec["path"], "packing": config.packing,
          "stats": stats_dict(stats), **rate}


def drain_all(batches) -> dict[str, Any]:
  """Slots a second a side over a whole pass of ``batches``, and its padding (both sides)."""
  import numpy as np  # noqa: PLC0415

  slots = real = count = 0
  start = time.perf_counter()
  for batch in batches:
    slots += batch["inputs"].size
    real += np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"])
    count += 1
  elapsed = time.perf_counter() - start
  return {"batches": count, "seconds": elapsed, "slots/s/side": slots / elapsed,
          "padding measured": 1.0 - real / (2 * slots), "whole pass": True,
          "timing": {"times_s": [elapsed]}}


def measure_packers(spec: dict[str, Any]) -> list[dict[str, Any]]:
  """grain's packers against the library's planned packing, on one core and the same pairs.

  Every packer gets the same pairs: all pairs of the spec's corpus within the
  length limits, which are the pairs the library keeps (``too_long="filter"``).
  grain's packers take a stream of examples (dicts of 1-D arrays), here in a random
  order (a shuffled pipeline's), held in memory and packed in one whole pass, or
  read pair by pair from the shards as a grain pipeline would (too slow for a
  whole pass: a drain of ``spec["drain"]`` seconds). The library packs them once
  (``pack_rows``; the rows kept beside the ids, read here) and its dataset gives
  one whole epoch. ``batch`` stacks ``rows`` packed rows, as the library's batches
  hold. Rates and padding are over the whole pass except where ``whole pass`` is
  False.
  """
  import grain  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from grain.experimental import BestFitPackIterDataset, FirstFitPackIterDataset  # noqa: PLC0415

  from seq2seq_jax.data import (  # noqa: PLC0415
      Tokenizer, bucket_rows, make_train_dataset, prepare_ids)

  config = dataclasses.replace(child_config(spec), packing=True, too_long="filter")
  tokenizer = Tokenizer.load(spec["tokenizer"])
  ids = prepare_ids(config, tokenizer)
  length = config.bucket_lengths[-1]
  rows = bucket_rows(config, length)
  fits = np.flatnonzero((ids.source_len_N <= config.max_source_len)
                        & (ids.target_len_N <= config.max_target_len))
  chosen = np.random.default_rng(0).permutation(fits)
  sources, targets = [], []
  for first in range(0, len(chosen), 8192):
    s, t = ids.read(chosen[first:first + 8192])
    sources += s
    targets += t
  examples = [{"inputs": s, "targets": t} for s, t in zip(sources, targets)]

  def read_pair(i):
    (s,), (t,) = ids.read([i])
    return {"inputs": s, "targets": t}

  packers = {"grain FirstFitPackIterDataset": FirstFitPackIterDataset,
             "grain BestFitPackIterDataset": BestFitPackIterDataset}
  results = []
  old = pin({min(os.sched_getaffinity(0))})
  try:
    for name, packer in packers.items():
      stream = grain.MapDataset.source(examples).to_iter_dataset(grain.ReadOptions(num_threads=0))
      packed = packer(stream, length_struct={"inputs": length, "targets": length},
                      num_packing_bins=rows, shuffle_bins=False).batch(rows)
      results.append({"system": f"{name} (in memory)", **drain_all(iter(packed))})
    stream = (grain.MapDataset.source(chosen).map(read_pair).repeat()
              .to_iter_dataset(grain.ReadOptions(num_threads=0)))
    packed = FirstFitPackIterDataset(stream, length_struct={"inputs": length, "targets": length},
                                     num_packing_bins=rows, shuffle_bins=False).batch(rows)
    results.append({"system": "grain FirstFitPackIterDataset (read per pair)", "whole pass": False,
                    **drain(iter(packed), **spec["drain"])})
    dataset, stats = make_train_dataset(config, tokenizer, seed=0, num_epochs=1)
    assert stats.num_pairs - stats.num_filtered == len(chosen)  # the same pairs
    rate = drain_all(dataset[i] for i in range(len(dataset)))
    results.append({"system": "seq2seq_jax planned packing (reads the shards)",
                    "stats padding": stats.padding_fraction, **rate})
  finally:
    pin(old)
  for row in results:
    row.setdefault("whole pass", False)
    row.update(size=spec["size"], pairs=len(chosen), bins=rows, length=length)
  return results


MEASURES = {"prepare": measure_prepare, "start": measure_start, "workers": measure_workers,
            "one_core": measure_one_core, "packers": measure_packers}


def child_main(specs: list[dict[str, Any]]) -> None:
  out = []
  for spec in specs:
    started = time.perf_counter()
    result = MEASURES[spec["kind"]](spec)
    print(f"  {spec['kind']} {spec.get('size')} {spec.get('path', '')}: "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    out.append(result)
  print("RESULT " + json.dumps(out))


def run_children(phases: dict[str, list[dict[str, Any]]], *, separate: bool,
                 extra: list[str]) -> dict[str, list[Any]]:
  """Runs every phase's specs in child processes; returns their results phase by phase.

  With ``separate`` each spec gets a fresh process (its memory peak and start are
  its own), except the one-core measurements, which share one; otherwise (quick
  mode) one process runs them all, to keep CI short.
  """
  specs = [dict(spec, phase=phase) for phase, group in phases.items() for spec in group]
  if separate:
    groups, shared = [], []
    for spec in specs:
      if spec["phase"] in ("one_core", "packers"):
        shared.append(spec)
      else:
        groups.append([spec])
    groups.append(shared)
  else:
    groups = [specs]
  results: dict[str, list[Any]] = {phase: [] for phase in phases}
  for group in groups:
    if not group:
      continue
    command = [sys.executable, __file__, "--child", json.dumps(group), *extra]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode:
      raise RuntimeError(f"child {group} failed with status {done.returncode}:\n"
                         f"{done.stdout[-3000:]}")
    line = next(line for line in reversed(done.stdout.splitlines()) if line.startswith("RESULT "))
    for spec, result in zip(group, json.loads(line[len("RESULT "):]), strict=True):
      results[spec["phase"]].append(result)
  return results


# --------------------------------------------------------------------------- reporting


def cpu_description() -> dict[str, Any]:
  """Model name, family/model and the widest vector extension, from /proc/cpuinfo."""
  fields = {}
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      key, _, value = line.partition(":")
      key = key.strip()
      if key in ("model name", "cpu family", "model", "flags") and key not in fields:
        fields[key] = value.strip()
  except OSError:
    return {}
  flags = set(fields.get("flags", "").split())
  vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
  return {"model name": fields.get("model name", ""), "family": fields.get("cpu family", ""),
          "model": fields.get("model", ""), "vector": vector, "cores": os.cpu_count()}


def tpu_appetite() -> list[dict[str, Any]]:
  """Token slots a second a side that the WMT base train step eats: compiled estimates."""
  path = HERE / "results" / "tpu_compile.json"
  steps = []
  try:
    for row in json.loads(path.read_text())["rows"]:
      if row.get("name") == PRESET and row.get("program") == "train":
        steps.append((row["target"], row["variant"], row["rows"] * row["source_len"],
                      row["estimated_step_seconds"]))
  except (OSError, KeyError, ValueError):
    pass
  source = "tpu_compile.json" if steps else "RESULTS.md figures"
  return [{"target": target, "sharding": variant, "slots per step": slots,
           "step ms": 1e3 * seconds, "slots/s/side": slots / seconds, "from": source}
          for target, variant, slots, seconds in steps or FALLBACK_STEPS]


def plot(rows: list[dict[str, Any]], path: pathlib.Path, appetite: list[dict[str, Any]]) -> None:
  from seq2seq_jax import benchmarking  # noqa: PLC0415

  with benchmarking.saved_figure(path, size=(8, 0.35 * len(rows) + 1.5)) as (ax,):
    ax.barh([r["system"] for r in rows], [r["slots/s/side"] for r in rows], color="tab:blue")
    for row, color in zip(appetite[:2], ("tab:red", "tab:orange")):
      ax.axvline(row["slots/s/side"], color=color, linestyle="--",
                 label=f"{row['target']} {row['sharding']} step (estimate)")
    ax.set_xscale("log")
    ax.set_xlabel("token slots / s / side")
    ax.set_title("training input pipeline")
    ax.invert_yaxis()
    ax.legend(fontsize=7)


def main() -> None:
  from seq2seq_jax import benchmarking  # noqa: PLC0415

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--work-dir", type=pathlib.Path, default=DEFAULT_WORK_DIR,
                      help="where the stand-in corpus, tokenizer and prepared data go "
                           "(default %(default)s); never inside the repository")
  parser.add_argument("--old-full", action="store_true",
                      help="run the old path at the full size too (else extrapolated from the "
                           "prefix: tfds without TensorFlow cannot prepare a split over 1 GB)")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # a measuring child
  args = benchmarking.parse_args(parser)
  if args.child:
    child_main(json.loads(args.child))
    return
  quick = benchmarking.quick_mode()
  s = settings(quick)
  work = args.work_dir.expanduser() / ("quick" if quick else "full")
  work.mkdir(parents=True, exist_ok=True)
  extra = ["--default-malloc"] if args.default_malloc else []
  started = time.perf_counter()

  print(f"stand-in corpus of {s['pairs']:,} pairs in {work}", flush=True)
  corpus_stats = build_corpus(work, s)
  corpus = pathlib.Path(corpus_stats["directory"])
  tokenizer = train_tokenizer(work / f"spm-{s['vocab_size']}.model", s)
  print(f"tokenizer: {tokenizer}", flush=True)
  prefix = s["prefix_shards"]
  prefix_pairs = min(s["pairs"], prefix * s["shard_pairs"])
  data_dir = str(work / "data")
  small_dir = str(SHARED / s["small"])
  sizes = {
      "small": dict(label="Multi30k" if not quick else "Multi30k tiny",
                    new=dict(dataset="multi30k", manual_dir=small_dir),
                    old=dict(dataset="multi30k", manual_dir=small_dir)),
      "prefix": dict(label=size_label(prefix_pairs),
                     new=dict(train_files=prefix_glob(corpus, prefix)),
                     old=dict(dataset="parallel_text",
                              manual_dir=str(plain_copy(corpus, prefix)))),
      "full": dict(label=size_label(s["pairs"]),
                   new=dict(train_files=str(corpus / "train-*.{lang}.gz")),
                   old=dict(dataset="parallel_text",
                            manual_dir=str(plain_copy(corpus, corpus_stats["shards"])))
                   if args.old_full else None),
  }
  old_sizes = ["small", "prefix"] + (["full"] if args.old_full else [])
  drain_settings = dict(seconds=s["seconds"], min_batches=s["min_batches"], warmup=s["warmup"])

  def spec(kind, size, path, packing=False, **more):
    common = dict(data_dir=data_dir, vocab_size=tokenizer["vocab_size"])
    fields = dict(sizes[size][path], **common, tokenize_once=path == "new", packing=packing)
    return dict(kind=kind, size=sizes[size]["label"], path=path, data=fields,
                tokenizer=tokenizer["path"], drain=drain_settings, **more)

  print("measuring in child processes", flush=True)
  results = run_children({
      "prepare": [spec("prepare", size, "new") for size in sizes]
                 + [spec("prepare", size, "old") for size in old_sizes if size != "small"],
      "start": [spec("start", size, "new", packing) for size in sizes for packing in (False, True)]
               + [spec("start", size, "old") for size in old_sizes],
      "workers": [spec("workers", size, path, packing, workers=list(s["workers"]))
                  for size, path, packing in s["worker_runs"]],
      "one_core": [spec("one_core", "full", "new", packing) for packing in (False, True)]
                  + [spec("one_core", "prefix", "old")],
      "packers": [spec("packers", "prefix", "new", True)],
  }, separate=s["separate"], extra=extra)
  prepares, starts, one_core = results["prepare"], results["start"], results["one_core"]
  workers = [row for group in results["workers"] for row in group]
  packers = results["packers"][0]

  def system(row):
    path = "old (tokenize every batch)" if row["path"] == "old" else (
        "new, packed" if row["packing"] else "new, bucketed")
    return f"{path} @ {row['size']}"

  rows = []
  for row in starts:
    rows.append(dict(row, system=f"{system(row)}: threads", mode="threads"))
  for row in workers:
    rows.append(dict(row, system=f"{system(row)}: {row['workers']} workers", mode="workers"))
  for row in one_core:
    rows.append(dict(row, system=f"{system(row)}: one core", mode="one core"))
  for row in packers:
    rows.append(dict(row, mode="packers", path="new", packing=True))
  appetite = tpu_appetite()
  best_core = {r["packing"]: r["slots/s/side"] for r in one_core if r["path"] == "new"}
  old_core = next((r["slots/s/side"] for r in one_core if r["path"] == "old"), float("nan"))
  for row in appetite:
    row["cores, new bucketed"] = row["slots/s/side"] / best_core[False]
    row["cores, new packed"] = row["slots/s/side"] / best_core[True]
    row["cores, old"] = row["slots/s/side"] / old_core

  full_label = sizes["full"]["label"]
  new_full = {r["packing"]: r for r in starts if r["path"] == "new" and r["size"] == full_label}
  old_prefix = next(r for r in starts
                    if r["path"] == "old" and r["size"] == sizes["prefix"]["label"])
  old_full = next((r for r in starts if r["path"] == "old" and r["size"] == full_label), None)
  extrapolated = old_prefix["first batch s"] * s["pairs"] / prefix_pairs
  targets = [
      dict(target="first batch at full size once prepared <= 10 s",
           measured=max(new_full[False]["first batch s"], new_full[True]["first batch s"]),
           met=max(new_full[False]["first batch s"], new_full[True]["first batch s"])
           <= TARGETS["first batch s"]),
      dict(target=">= 2 M slots/s/side from one core (new path, packed and bucketed)",
           measured=min(best_core.values()),
           met=min(best_core.values()) >= TARGETS["one core slots/s/side"]),
      dict(target="peak memory < 2 GB at full size (new path, threads)",
           measured=max(new_full[False]["peak MB"], new_full[True]["peak MB"]),
           met=max(new_full[False]["peak MB"], new_full[True]["peak MB"]) < TARGETS["peak MB"]),
      dict(target="packing padding <= 5 %",
           measured=new_full[True]["stats"]["padding_fraction"],
           met=new_full[True]["stats"]["padding_fraction"] <= TARGETS["packing padding"]),
  ]

  print(json.dumps(corpus_stats, indent=1))
  print(benchmarking.format_table(prepares, ["size", "path", "tfds s", "prepare s", "pack s",
                                             "peak MB", "pairs"]))
  print(benchmarking.format_table(starts, ["size", "path", "packing", "first batch s", "peak MB",
                                           "slots/s/side", "padding measured"]))
  print(benchmarking.format_table(rows, ["system", "slots/s/side", "padding measured", "batches"]))
  print(benchmarking.format_table(appetite, ["target", "sharding", "step ms", "slots/s/side",
                                             "cores, new bucketed", "cores, new packed",
                                             "cores, old"]))
  print(f"old path at {full_label}, extrapolated from {sizes['prefix']['label']}: "
        f"{extrapolated:.1f} s to the first batch"
        + (f" (measured: {old_full['first batch s']:.1f} s)" if old_full else ""))
  print(benchmarking.format_table(targets))
  benchmarking.report(args, {
      "benchmark": "input_pipeline", "cpu": cpu_description(), "preset": PRESET,
      "settings": s, "corpus": corpus_stats, "tokenizer": tokenizer,
      "sizes": {k: v["label"] for k, v in sizes.items()}, "prepare": prepares, "starts": starts,
      "workers": workers, "one_core": one_core, "packers": packers, "appetite": appetite,
      "old_full_extrapolated_first_batch_s": extrapolated, "targets": targets,
      "total_s": time.perf_counter() - started, "rows": rows},
      plot=lambda rows, path: plot(rows, path, appetite))


if __name__ == "__main__":
  main()
