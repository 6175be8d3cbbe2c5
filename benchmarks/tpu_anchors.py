"""The compile report's step time against published, measured TPU training runs.

Each anchor is a run someone published with its hardware, batch and time: a Transformer
(the big one of Vaswani et al. 2017: d 1024, 16 heads, FFN 4096, 6 + 6 layers) trained on
WMT en-de on TPU v3 or v4, by four programs from three sources (``ANCHORS``):

- the Flax WMT example (google/flax ``examples/wmt``): wall time over steps of two runs in
  its README, evaluations included (upper bounds);
- fairseq's maintainer (fairseq issue 2506): a rate, target tokens a second, PyTorch/XLA;
- Google's MLPerf Training submissions, logs in mlcommons/training_results_v0.6 (T2T on
  v3) and v0.7 (Lingvo on v4): the time between two epochs' ``block_start`` lines over the
  steps of an epoch, an upper bound (each interval also holds one beam-search decode of the
  3,003-sentence evaluation set).

The matching config (``wmt14_transformer_big`` with each run's norm, dropout, vocabulary,
precision and packing, replicated parameters) is compiled for the same slice and batch, and
the report's step estimates are set against the measured step: "cyc. ms"
(``CompileReport.cycles_step_seconds``, the compiler's cycles, the library's estimate) and
the two rooflines (``METHODS``). Nothing measured is fitted into an estimate: the anchors
only test them and set the bands.

Each anchor is held out in turn: the 95 % prediction band of the other anchors of its chip
generation (``aot.report.prediction_band``) must hold its ratio (``held_out``). The method
whose held-out bands hold the most anchors, then the narrowest, is chosen (``choose``); the
library's estimate must be it, and ``aot.report.STEP_BANDS`` holds its band of each
generation from all its anchors, rounded outwards (``printed_band``; the script prints the
figures). RESULTS.md's anchor tables are this script's ``render_markdown`` output
(``--results-md`` writes them in; tests/aot/test_anchors.py checks both against the JSON).

Compiled programs are kept under ``--cache`` (default ``.cache/tpu_anchors``): a full run
compiles for 1-3 hours on 2 CPU cores and needs 6-10 GB of memory a compile; a rerun reads
them back in minutes.

  python benchmarks/tpu_anchors.py --plot benchmarks/results/tpu_anchors.png \\
      --results-md benchmarks/RESULTS.md
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/tpu_anchors.py   # the tiny preset, for CI
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
import math
import pathlib
import statistics
import time
import types
from typing import Any

MLPERF_V06 = ("mlcommons/training_results_v0.6 (commit f312518c2d6107eec983750eed23950f1f0c8a0e)"
              ", Google/results/{platform}/transformer/result_0..9.txt and "
              "Google/benchmarks/transformer/{platform}/run_and_time.sh "
              "(T2T transformer_mlperf_tpu: transformer_base_v3 with d 1024, FFN 4096, 16 "
              "heads; pre-norm, dropout 0.1, shared embedding and softmax; "
              "translate_ende_wmt32k_packed, rows of 256; bfloat16 activations)")
MLPERF_V07 = ("mlcommons/training_results_v0.7 (commit 0a8a85a209c8e45b661596c382cc20f4e32fd2fe)"
              ", Google/results/{platform}/transformer/result_0..9.txt, "
              "Google/benchmarks/transformer/{platform}/run_and_time.sh and "
              "implementations/transformer-research-TF-{platform_short}/lingvo/tasks/mt/params/"
              "mlperf.py (Lingvo WmtEnDeMlPerf: d 1024, FFN 4096, 16 heads, vocabulary 33,708, "
              "pre-norm, dropout 0.1, shared embedding and softmax, packed rows of 256, "
              "bfloat16 activations)")
FLAX_WMT = ("google/flax examples/wmt/README.md (v3-8 row: commit 5c0b56e4, run 2021-08-04; "
            "v3-32 row: commit d68c833e, run 2021-11-05) and examples/wmt/configs/default.py "
            "(pre-norm, dropout and attention dropout 0.1, 32k shared sentencepiece "
            "vocabulary, packed rows of 256, 32 rows a TensorCore, bfloat16)")
FAIRSEQ = ("https://github.com/facebookresearch/fairseq/issues/2506 (myleott, 2020-08-31): "
           "'v3-8 gives 72k wps' for train.py --task dummy_mt --arch "
           "transformer_vaswani_wmt_en_de_big --share-all-embeddings --dropout 0.3 "
           "--attention-dropout=0.1 --max-tokens 5000 --tpu --distributed-world-size 8 "
           "(no --bf16); fairseq/tasks/dummy_mt.py: rows of 31 tokens a side, "
           "5000 // 30 = 166 rows a device, 30 target tokens counted a row, 50,000 types")

# The Transformer big as each program ran it: pre-norm, dropout 0.1 everywhere, bfloat16,
# packed rows of 256 a side (the preset's own packing), parameters replicated (data parallel).
PACKED_PRE_NORM = ("model.norm=pre", "model.dropout_rate=0.1", "model.attention_dropout_rate=0.1",
                   "train.parameter_sharding=replicated")
MLPERF_VOCAB = ("model.vocab_size=33708", "data.vocab_size=33708")  # the wmt32k subwords
# fairseq's transformer_vaswani_wmt_en_de_big (post-norm, shared embeddings) on dummy_mt,
# float32 tensors (PyTorch/XLA without --bf16), no packing.
FAIRSEQ_BIG = ("data.packing=false", "train.compute_dtype=float32", "model.vocab_size=50000",
               "data.vocab_size=50000", "model.dropout_rate=0.3",
               "model.attention_dropout_rate=0.1", "train.parameter_sharding=replicated")


def _mlperf(version: str, platform: str, target: str, rows: int, interval_s: float,
            steps: int, framework: str) -> dict[str, Any]:
  template = MLPERF_V06 if version == "v0.6" else MLPERF_V07
  short = platform.removesuffix("-TF")
  return dict(
      name=f"MLPerf {version} Google {platform}, {framework}", source_name=f"MLPerf {version}",
      framework=framework, target=target, rows=rows, length=None,
      overrides=PACKED_PRE_NORM + MLPERF_VOCAB, precision="bfloat16",
      tokens=f"{rows:,} packed rows x 256 a side", interval_s=interval_s, steps=steps,
      measured_s=interval_s / steps, bound="upper",
      how=(f"{interval_s:.2f} s between two epochs' block_start (median over the 10 logged "
           f"runs of each run's shortest interval) / {steps:,} steps an epoch; the interval "
           "also holds one decode of the evaluation set"),
      source=template.format(platform=platform, platform_short=short))


ANCHORS: tuple[dict[str, Any], ...] = (
    dict(name="Flax WMT example, TPU v3-8", source_name="Flax WMT example", framework="JAX/Flax",
         target="v3-8", rows=256, length=None, overrides=PACKED_PRE_NORM, precision="bfloat16",
         tokens="256 packed rows x 256 a side", steps=100_000, wall_s=13 * 3600 + 18 * 60,
         measured_s=(13 * 3600 + 18 * 60) / 100_000, bound="upper",
         how="13 h 18 min for 100,000 steps, with an evaluation every 1,000", source=FLAX_WMT),
    dict(name="Flax WMT example, TPU v3-32", source_name="Flax WMT example", framework="JAX/Flax",
         target="v3-32", rows=1024, length=None, overrides=PACKED_PRE_NORM, precision="bfloat16",
         tokens="1,024 packed rows x 256 a side", steps=25_000, wall_s=3 * 3600 + 1 * 60,
         measured_s=(3 * 3600 + 1 * 60) / 25_000, bound="upper",
         how="3 h 1 min for 25,000 steps, with an evaluation every 1,000", source=FLAX_WMT),
    dict(name="fairseq dummy_mt, TPU v3-8", source_name="fairseq issue 2506",
         framework="PyTorch/XLA", target="v3-8", rows=8 * 166, length=31,
         overrides=FAIRSEQ_BIG, precision="float32", tokens="1,328 rows x 31 a side, unpacked",
         measured_s=8 * 166 * 30 / 72_000, bound="exact",
         how="39,840 target tokens a step at 72,000 a second", source=FAIRSEQ),
    _mlperf("v0.6", "tpu-v3-32", "v3-32", 512, 176.17, 1087, "TensorFlow/T2T"),
    _mlperf("v0.6", "tpu-v3-128", "v3-128", 512, 60.86, 1087, "TensorFlow/T2T"),
    _mlperf("v0.7", "tpu-v4-16-TF", "v4:2x2x2", 512, 164.46, 1107, "TensorFlow/Lingvo"),
    _mlperf("v0.7", "tpu-v4-128-TF", "v4:4x4x4", 512, 29.41, 1107, "TensorFlow/Lingvo"),
    _mlperf("v0.7", "tpu-v4-512-TF", "v4:4x8x8", 2048, 8.196, 277, "TensorFlow/Lingvo"),
)


class DiskCompiler:
  """Compiled programs kept on disk (``aot.compile_report``'s ``compiler``).

  The compiled program's HLO text, cost analysis and memory analysis, keyed by the
  lowered program, the target's topology and the jax and libtpu versions: a change to
  the program or the compiler compiles again, a rerun reads them back.
  """

  def __init__(self, directory: pathlib.Path, topology: str):
    self.directory = directory
    self.topology = topology

  def _key(self, lowered: Any) -> str:
    import jax  # noqa: PLC0415
    try:
      libtpu = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
      libtpu = "none"
    text = f"{self.topology}\n{jax.__version__}\n{libtpu}\n{lowered.as_text()}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]

  def __call__(self, lowered: Any) -> Any:
    key = self._key(lowered)
    meta, hlo = self.directory / f"{key}.json", self.directory / f"{key}.hlo.gz"
    if meta.is_file() and hlo.is_file():
      saved = json.loads(meta.read_text())
      return _Stored(gzip.decompress(hlo.read_bytes()).decode(), saved["cost"], saved["memory"])
    compiled = lowered.compile()
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, (list, tuple)):
      cost = cost[0] if cost else {}
    stored = _Stored(
        compiled.as_text(), {k: float(v) for k, v in cost.items()},
        {name: int(getattr(memory, name)) for name in (
            "argument_size_in_bytes", "temp_size_in_bytes", "output_size_in_bytes",
            "generated_code_size_in_bytes", "alias_size_in_bytes")})
    self.directory.mkdir(parents=True, exist_ok=True)
    hlo.write_bytes(gzip.compress(stored.as_text().encode(), 6))
    meta.write_text(json.dumps({"topology": self.topology, "cost": stored.cost,
                                "memory": stored.memory}))
    return stored


class _Stored:
  """What ``compile_program`` reads of a compiled program, read back from disk."""

  def __init__(self, text: str, cost: dict[str, float], memory: dict[str, int]):
    self.text, self.cost, self.memory = text, cost, memory

  def as_text(self) -> str:
    return self.text

  def cost_analysis(self) -> dict[str, float]:
    return dict(self.cost)

  def memory_analysis(self) -> Any:
    return types.SimpleNamespace(**self.memory)


# The candidate models of a step's time, each read off the same compiled program (a
# CompileReport's fields); the library's is the one the held-out check chooses (``choose``).
METHODS: dict[str, tuple[str, str]] = {
    "cycles": ("cycles_step_seconds", "cyc. ms: the compiler's estimated cycles summed, a cycle "
               "timed by a large matmul at peak (aot.report.cycle_seconds)"),
    "roofline": ("estimated_step_seconds", "est. ms: max(FLOPs / peak, bytes accessed / "
                 "bandwidth)"),
    "hbm roofline": ("hbm_step_seconds", "HBM ms: max(FLOPs / peak, HBM traffic / bandwidth)"),
}
LIBRARY_METHOD = "cycles"  # what CompileReport.cycles_step_seconds and STEP_BANDS are of
GENERATIONS = ("v3", "v4", "v5e", "v5p", "v6e")


def ratios(rows: list[dict[str, Any]], method: str) -> list[float]:
  """Measured over estimated step time of each row, by ``method``."""
  field = METHODS[method][0]
  return [row["measured_s"] / row["report"][field] for row in rows]


def held_out(rows: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
  """Each row's ratio against the band the other rows of its chip generation give
  (``aot.report.prediction_band``; none from fewer than two others)."""
  from seq2seq_jax.aot import report as report_lib  # noqa: PLC0415
  values = ratios(rows, method)
  out = []
  for i, row in enumerate(rows):
    others = [v for j, v in enumerate(values) if j != i
              and rows[j]["generation"] == row["generation"]]
    band = report_lib.prediction_band(others)
    out.append({"name": row["name"], "generation": row["generation"], "ratio": values[i],
                "others": len(others), "band": band,
                "held": band is not None and band[0] <= values[i] <= band[1]})
  return out


def bands(rows: list[dict[str, Any]], method: str) -> dict[str, tuple[float, float] | None]:
  """Each generation's band from all its rows (``None``: fewer than two, or none)."""
  from seq2seq_jax.aot import report as report_lib  # noqa: PLC0415
  values = ratios(rows, method)
  return {g: report_lib.prediction_band([v for v, row in zip(values, rows)
                                         if row["generation"] == g]) for g in GENERATIONS}


def choose(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
  """The method whose held-out bands hold the most rows; ties go to the narrowest bands
  (their mean log width over the generations that have one). Returns it and every
  method's score."""
  scores = {}
  for method in METHODS:
    generation_bands = [b for b in bands(rows, method).values() if b is not None]
    width = (statistics.mean(math.log(hi / lo) for lo, hi in generation_bands)
             if generation_bands else math.inf)
    scores[method] = {"held": sum(r["held"] for r in held_out(rows, method)),
                      "rows": len(rows), "mean_log_width": width}
  best = max(scores, key=lambda m: (scores[m]["held"], -scores[m]["mean_log_width"]))
  return best, scores


def printed_band(band: tuple[float, float]) -> tuple[float, float]:
  """``band`` rounded outwards to two significant digits, as ``aot.report.STEP_BANDS`` holds
  it (so that the printed band holds the computed one)."""
  def digits(x: float) -> float:
    return 10.0 ** (math.floor(math.log10(x)) - 1)
  low, high = band
  return (round(math.floor(low / digits(low) + 1e-9) * digits(low), 12),
          round(math.ceil(high / digits(high) - 1e-9) * digits(high), 12))


def _band(band: tuple[float, float] | None) -> str:
  return "none (fewer than two runs)" if band is None else f"{band[0]:.2g}-{band[1]:.2g}x"


def render_markdown(payload: dict[str, Any]) -> str:
  """RESULTS.md's tables of the anchors, from this script's JSON: the runs, each held out,
  the methods compared, and the band of each chip generation."""
  rows = payload["rows"]
  method = payload["method"]
  field = METHODS[method][0]
  lines = ["| run | source | framework | slice | batch a step | precision | measured ms a step "
           "| exact or bound | est. ms | measured / est. | cyc. ms | measured / cyc. |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for row in rows:
    report, at_most = row["report"], "<= " if row["bound"] == "upper" else ""
    lines.append(
        f"| {row['name']} | {row['source_name']} | {row['framework']} | {row['target']} "
        f"({row['chips']} chips, {row['devices']} devices) | {row['tokens']} | "
        f"{row['precision']} | {at_most}{row['measured_s'] * 1e3:.1f} | "
        f"{'upper bound' if row['bound'] == 'upper' else 'exact (a rate)'} | "
        f"{report['estimated_step_seconds'] * 1e3:.1f} | "
        f"{at_most}{row['measured_s'] / report['estimated_step_seconds']:.2f}x | "
        f"{report['cycles_step_seconds'] * 1e3:.1f} | "
        f"{at_most}{row['measured_s'] / report['cycles_step_seconds']:.2f}x |")
  lines += ["", f"Each run held out ({method}, `{field}`): the 95 % prediction band of the "
            "other runs of its chip generation.", "",
            "| run | generation | measured / estimate | band of the others | held |",
            "|---|---|---|---|---|"]
  for entry in payload["held_out"][method]:
    runs = f"{entry['others']} run{'s' * (entry['others'] != 1)}"
    lines.append(f"| {entry['name']} | {entry['generation']} | {entry['ratio']:.2f}x | "
                 f"{_band(entry['band'])} ({runs}) | {'yes' if entry['held'] else '**no**'} |")
  lines += ["", "The methods compared (each row held out as above; the band of each generation "
            "from all its runs, rounded outwards):", "",
            "| method | rows held | " + " | ".join(f"band {g}" for g in ("v3", "v4")) + " |",
            "|---|---|---|---|"]
  for name, score in payload["scores"].items():
    generation_bands = payload["bands"][name]
    chosen = " (chosen)" if name == method else ""
    lines.append(f"| {METHODS[name][1].split(':')[0]}{chosen} | {score['held']} of "
                 f"{score['rows']} | " + " | ".join(
                     _band(generation_bands[g] and printed_band(generation_bands[g]))
                     for g in ("v3", "v4")) + " |")
  lines += ["", "The band to plan with, per chip generation (real step / cyc. ms; rounded "
            "outwards: `aot.report.STEP_BANDS`):", "",
            "| generation | published runs | band |", "|---|---|---|"]
  for generation in GENERATIONS:
    count = sum(row["generation"] == generation for row in rows)
    band = payload["bands"][method][generation]
    lines.append(f"| TPU {generation} | {count} | "
                 f"{'not measured' if not count else _band(band and printed_band(band))} |")
  return "\n".join(lines) + "\n"


BEGIN, END = "<!-- tpu_anchors.py: begin -->", "<!-- tpu_anchors.py: end -->"


def write_into(path: pathlib.Path, markdown: str) -> None:
  """Replaces what lies between ``BEGIN`` and ``END`` in ``path`` with ``markdown``."""
  text = path.read_text()
  head, _, rest = text.partition(BEGIN)
  _, _, tail = rest.partition(END)
  if not rest:
    raise ValueError(f"{path} has no {BEGIN} ... {END} section")
  path.write_text(f"{head}{BEGIN}\n{markdown}{END}{tail}")


def main() -> None:
  from seq2seq_jax import aot, benchmarking, presets

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--cache", type=pathlib.Path,
                      default=pathlib.Path(__file__).resolve().parent.parent / ".cache"
                      / "tpu_anchors", help="where compiled programs are kept")
  parser.add_argument("--only", default="", help="anchors whose name contains this")
  parser.add_argument("--results-md", type=pathlib.Path, default=None,
                      help="write the tables into this file's tpu_anchors.py section "
                           "(benchmarks/RESULTS.md)")
  args = benchmarking.parse_args(parser)
  quick = benchmarking.quick_mode()
  rows = []
  for anchor in ANCHORS:
    if args.only and args.only not in anchor["name"]:
      continue
    start = time.perf_counter()
    overrides = [o for o in anchor["overrides"]
                 if not quick or not o.startswith(("model.", "data."))]
    config = presets.apply_overrides(
        presets.get_preset("tiny_transformer" if quick else "wmt14_transformer_big"), overrides)
    target = aot.parse_target(anchor["target"])
    report = aot.compile_report(config, target, "train", rows=None if quick else anchor["rows"],
                                length=None if quick else anchor["length"],
                                compiler=DiskCompiler(args.cache, target.topology))
    rate = aot.report.cycles_per_second(target)
    row = dict(anchor, devices=target.devices, chips=target.chips, generation=target.chip.name,
               cycles=report.cycles_step_seconds * rate, report=report.to_dict(),
               compile_s=time.perf_counter() - start)
    rows.append(row)
    at_most = "<= " if anchor["bound"] == "upper" else ""
    print(f"{anchor['name']}: {report.rows} rows x {report.source_len}+{report.target_len}, "
          f"measured {at_most}{anchor['measured_s'] * 1e3:.1f} ms; est. "
          f"{report.estimated_step_seconds * 1e3:.1f} ms ({at_most}"
          f"{anchor['measured_s'] / report.estimated_step_seconds:.2f}x), cyc. "
          f"{report.cycles_step_seconds * 1e3:.1f} ms ({at_most}"
          f"{anchor['measured_s'] / report.cycles_step_seconds:.2f}x) "
          f"({row['compile_s']:.0f} s)", flush=True)
  method, scores = choose(rows)
  payload = {"benchmark": "tpu_anchors",
             "note": "published step times against compiler-derived estimates (libtpu on this "
                     "CPU); no TPU used here",
             "settings": {"quick": quick}, "rows": rows, "method": method, "scores": scores,
             "held_out": {m: held_out(rows, m) for m in METHODS},
             "bands": {m: bands(rows, m) for m in METHODS}}
  markdown = render_markdown(payload)
  print(markdown)
  printed = {g: tuple(round(x, 6) for x in printed_band(b))
             for g, b in payload["bands"][LIBRARY_METHOD].items() if b is not None}
  print(f"aot.report.STEP_BANDS should read: {printed}")
  if args.results_md:
    write_into(args.results_md, markdown)
    print(f"wrote the tables into {args.results_md}")
  benchmarking.report(args, payload, plot=_plot)


def _plot(rows, path) -> None:
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, ax = plt.subplots(figsize=(7, 3.2))
  values = ratios(rows, LIBRARY_METHOD)
  colours = {"v3": "tab:blue", "v4": "tab:orange"}
  ax.scatter(range(len(rows)), values, c=[colours.get(r["generation"], "k") for r in rows])
  for generation, band in bands(rows, LIBRARY_METHOD).items():
    if band is not None:
      ax.axhspan(*band, color=colours.get(generation, "k"), alpha=0.12,
                 label=f"TPU {generation} band")
  ax.set_xticks(range(len(rows)), [r["target"] for r in rows], rotation=30, fontsize=7)
  ax.set_yscale("log")
  ax.set_ylabel("real step / cyc. ms")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
