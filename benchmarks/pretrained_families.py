"""A T5-small-sized and an mBART-50-sized checkpoint in three runtimes, alternated in one run;
what a load costs (peak memory, the NaN check).

``seq2seq_jax.pretrained.fixtures.build_random_t5`` and ``build_random_mbart50`` write
``save_pretrained`` directories of t5-small's shape (6 + 6 layers, d 512, 8 heads of
64, FFN 2048, ReLU, tied output with T5's rescale, 32,128 ids) and mbart-large-50's
(12 + 12 layers, d 1024, 16 heads, FFN 4096, GELU, 250,054 ids), random weights.
Each is loaded by ``seq2seq_jax.pretrained.load`` (JAX), by transformers
(``generate``, PyTorch float32) and converted by CTranslate2's own
``TransformersConverter`` (float32, and its ``int8`` and ``int8_float32`` compute
types); this library also runs in bfloat16, int8 and int8 with bfloat16 compute.
Random weights give no natural end, so every system generates exactly ``output_len``
tokens (EOS suppressed); the float32 greedy outputs of the three are compared token
by token first, then generated tokens/s are timed for greedy and beam 4 at batch 32
and batch 1, systems alternated round by round, each with all the machine's threads
(``seq2seq_jax.benchmark_runtimes``); the CPU, its instruction set and the load
average are printed with the table.

Loading, measured in fresh processes: the peak resident memory of
``pretrained.load`` (one ``model.safetensors``, and the same tensors as safetensors
shards with an index) and of transformers' ``from_pretrained``, against the bytes
of the parameters; and the load time with and without the check for NaN and
infinity (``check_finite``), alternated.

  python benchmarks/pretrained_families.py [--out FILE.json] [--plot FILE.png] [--rounds N] [--skip-hf]
      [--models T5-small-sized,mBART-sized] [--sentences 32:64,1:4]
  python benchmarks/pretrained_families.py --loads-only   # only the loads' peak memory
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/pretrained_families.py   # tiny sizes, batch 32 only: for CI
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

# Run in a fresh process: the peak resident memory of one load, and the time it took.
_LOAD_PROBE = """
import json, resource, sys, time
import jax, numpy as np
from seq2seq_jax import pretrained
what, path, check = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def kib():
  # VmHWM: this process's own peak. ru_maxrss is not: Linux carries the parent's peak
  # across fork and exec, so a probe started by a large parent read 0 above its start.
  for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
      return int(line.split()[1])
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def reset_peak():
  # Writing 5 to clear_refs sets VmHWM back to the current resident size (Linux >= 4.0):
  # the peak read after the load is then the load's own.
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    pass
if what == "hf":
  import torch, transformers
  torch.ones(1)
  reset_peak()
  before = kib(); started = time.perf_counter()
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(path)
  seconds = time.perf_counter() - started
  params = sum(p.numel() * p.element_size() for p in model.parameters())
else:
  jax.numpy.zeros(1).block_until_ready()
  reset_peak()
  before = kib(); started = time.perf_counter()
  checkpoint = pretrained.load(path, with_tokenizer=False, check_finite=check)
  jax.block_until_ready(checkpoint.params)
  seconds = time.perf_counter() - started
  params = sum(np.asarray(x).nbytes for x in jax.tree.leaves(checkpoint.params))
print(json.dumps({"before_bytes": before * 1024, "peak_bytes": kib() * 1024,
                  "param_bytes": params, "seconds": seconds}))
"""


def settings(quick: bool) -> dict:
  if quick:
    return dict(models={
        "T5-small-sized": dict(vocab_size=1152, model_dim=32, layers=1, heads=2, head_dim=8,
                               ffn=64, spm_pieces=1000, spm_vocab_size=500),
        "mBART-sized": dict(model_dim=32, layers=1, heads=2, ffn=64, spm_pieces=1000,
                            spm_vocab_size=500, max_positions=64)},
        sentences={32: 32}, source_len=(6, 12), output_len=8, rounds=2, load_rounds=1,
        shard_bytes=20_000)
  return dict(models={"T5-small-sized": {}, "mBART-sized": {}}, sentences={32: 64, 1: 4},
              source_len=(10, 30), output_len=32, rounds=3, load_rounds=3,
              shard_bytes=500 * 2 ** 20)


def _probe(what: str, path: pathlib.Path, check: bool = True) -> dict:
  env = dict(os.environ)
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(
      "--xla_force_host_platform_device_count=8", "").strip()
  result = subprocess.run([sys.executable, "-c", _LOAD_PROBE, what, str(path),
                           "1" if check else "0"], env=env, capture_output=True, text=True,
                          check=False)
  if result.returncode:
    raise RuntimeError(f"load probe {what} {path} failed:\n{result.stderr[-3000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def _shard(directory: pathlib.Path, out: pathlib.Path, shard_bytes: int) -> int:
  """The checkpoint again, its tensors in safetensors shards of about ``shard_bytes``."""
  from safetensors.numpy import load_file, save_file  # noqa: PLC0415
  import shutil  # noqa: PLC0415

  shutil.copytree(directory, out, ignore=shutil.ignore_patterns("model.safetensors"))
  tensors = load_file(str(directory / "model.safetensors"))
  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    current[name] = tensors[name]
    size += tensors[name].nbytes
    if size >= shard_bytes:
      shards.append(current)
      current, size = {}, 0
  if current:
    shards.append(current)
  weight_map = {}
  for i, shard in enumerate(shards, start=1):
    name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, str(out / name), metadata={"format": "pt"})
    weight_map.update({tensor: name for tensor in shard})
  del tensors, shards, current
  (out / "model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {}, "weight_map": weight_map}))
  return len(set(weight_map.values()))


def _load_rows(name: str, directory: pathlib.Path, tmp: pathlib.Path, s: dict) -> list[dict]:
  import numpy as np  # noqa: PLC0415

  sharded = tmp / f"{directory.name}-sharded"
  shards = _shard(directory, sharded, s["shard_bytes"])
  rows = []
  for label, what, path in (("seq2seq_jax, model.safetensors", "ours", directory),
                            (f"seq2seq_jax, {shards} safetensors shards", "ours", sharded),
                            ("transformers from_pretrained", "hf", directory)):
    probe = _probe(what, path)
    rows.append({"model": name, "load": label, "param MB": probe["param_bytes"] / 2 ** 20,
                 "peak - start MB": (probe["peak_bytes"] - probe["before_bytes"]) / 2 ** 20,
                 "x params": (probe["peak_bytes"] - probe["before_bytes"])
                 / probe["param_bytes"], "seconds": probe["seconds"]})
  return rows


def _finite_check_cost(name: str, directory: pathlib.Path, s: dict) -> dict:
  """Load times with and without ``check_finite``, alternated, in fresh processes."""
  import numpy as np  # noqa: PLC0415

  times: dict[bool, list[float]] = {True: [], False: []}
  for _ in range(s["load_rounds"]):
    for check in (True, False):
      times[check].append(_probe("ours", directory, check)["seconds"])
  with_check, without = float(np.median(times[True])), float(np.median(times[False]))
  return {"model": name, "load s (check)": with_check, "load s (no check)": without,
          "check s": with_check - without, "check %": 100 * (with_check / without - 1),
          "times with": times[True], "times without": times[False]}


def main() -> None:
  from seq2seq_jax import benchmarking  # noqa: PLC0415
  from seq2seq_jax import benchmark_runtimes as runtimes  # noqa: PLC0415
  from seq2seq_jax.pretrained import fixtures  # noqa: PLC0415

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--keep", type=pathlib.Path, default=None,
                      help="build the checkpoints here and keep them (default: a temp dir)")
  parser.add_argument("--skip-hf", action="store_true",
                      help="time without transformers (the int8 comparison needs only CTranslate2)")
  parser.add_argument("--loads-only", action="store_true",
                      help="measure only the loads' peak memory (no timing: memory does not "
                      "depend on what else runs on the machine)")
  parser.add_argument("--models", default=None,
                      help="comma-separated models to time (default: all); 'T5-small-sized', "
                           "'mBART-sized'")
  parser.add_argument("--sentences", default=None,
                      help="batch:sources pairs, e.g. '32:32,1:4' (default: the mode's)")
  started = runtimes.start(parser, "pretrained_families", settings(benchmarking.quick_mode()))
  if started is None:
    return
  args, s, (ctranslate2, torch, transformers) = started
  if args.models:
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(chosen) - set(s["models"]))
    if unknown:
      parser.error(f"--models: unknown {', '.join(unknown)}; known: {', '.join(s['models'])}")
    s = dict(s, models={m: s["models"][m] for m in chosen})
  if args.sentences:
    try:
      sentences = {int(b): int(n) for b, n in (pair.split(":") for pair in args.sentences.split(","))}
    except ValueError:
      parser.error(f"--sentences={args.sentences!r}: give batch:sources pairs, e.g. '32:32,1:4'")
    s = dict(s, sentences=sentences)
  threads = os.cpu_count() or 1
  out_len = s["output_len"]
  rows, agreement, loads, checks = [], {}, [], []
  builders = {"T5-small-sized": fixtures.build_random_t5,
              "mBART-sized": fixtures.build_random_mbart50}
  with tempfile.TemporaryDirectory() as tmp_name:
    tmp = pathlib.Path(tmp_name)
    root = args.keep or tmp
    for name, overrides in s["models"].items():
      directory = root / name
      if not (directory / "build_info.json").is_file():
        builders[name](directory, **overrides)
      loads += _load_rows(name, directory, tmp, s)
      if args.loads_only:
        continue
      checks.append(_finite_check_cost(name, directory, s))
      loaded = runtimes.load_all(directory, tmp / f"{name}-ct2", ctranslate2=ctranslate2,
                                 transformers=transformers, threads=threads)
      model_rows, by_batch = runtimes.compare_batches(
          loaded, s["sentences"], lengths=s["source_len"], output_len=out_len,
          rounds=s["rounds"], with_hf=not args.skip_hf)
      agreement.update({name if batch == 32 else f"{name} batch {batch}": values
                        for batch, values in by_batch.items()})
      rows += [{**row, "task": f"{name} {row['task']}"} for row in model_rows]
      del loaded
  print(f"{out_len} tokens per output, sentences by batch {s['sentences']}, {threads} threads; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, ctranslate2 "
        f"{ctranslate2.__version__}; {runtimes.describe_cpu()}")
  if rows:
    print("greedy agreement:", json.dumps(agreement))
    print(benchmarking.format_table(rows, ["task", "system", "tokens/s", "tokens/s min",
                                           "tokens/s max", "ours/system", "x CT2 int8"]))
  print(benchmarking.format_table(loads, ["model", "load", "param MB", "peak - start MB",
                                          "x params", "seconds"]))
  if checks:
    print(benchmarking.format_table(checks, ["model", "load s (check)", "load s (no check)",
                                             "check s", "check %"]))
  path = benchmarking.write_json(args.out, {
      "benchmark": "pretrained_families",
      "settings": {**s, "sentences": {str(k): v for k, v in s["sentences"].items()}},
      "loads_only": args.loads_only,
      "versions": runtimes.versions(ctranslate2, torch, transformers),
      "agreement": agreement, "rows": rows, "loads": loads, "finite_check": checks})
  print(f"wrote {path}")
  if args.plot and rows:
    benchmarking.plot_rates_by_task(rows, args.plot)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
  main()
