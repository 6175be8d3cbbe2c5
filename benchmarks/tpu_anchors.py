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
precision and packing, replicated parameters, einsum attention) is compiled for the same
slice and batch, and the report's step estimates are set against the measured step: "cyc.
ms" (``CompileReport.cycles_step_seconds``, the compiler's cycles, the library's estimate)
and the two rooflines (``METHODS``). Nothing measured is fitted into an estimate.

Eight runs carry no statistics worth the name: seven are upper bounds, and two pairs have
one batch a device, so one device program and one estimate each (``program_key``). What
they give is each generation's observed range of measured / estimate (``observed_ranges``),
with its runs, programs and upper bounds; ``aot.report.STEP_RANGES`` holds it, rounded
outwards (``printed_range``; ``range_problems`` says where the two disagree). Each run is
also held out (``held_out``): its ratio against the range of the others of its generation,
and of its generation's other programs. A run that sets an end of the range lies outside
the others' by construction; the table says by how much. RESULTS.md's anchor tables are
this script's ``render_markdown`` output (``--results-md`` writes them in;
tests/aot/test_anchors.py checks both against the JSON).

Compiled programs are kept under ``--cache`` (default ``.cache/tpu_anchors``): a full run
compiles for 1-3 hours on 2 CPU cores and needs 6-10 GB of memory a compile; a rerun reads
them back in minutes. ``--from-json`` reads the compiled figures back from an earlier run's
JSON instead (no compile, no cache), refusing any run the script now defines otherwise.

  python benchmarks/tpu_anchors.py --plot benchmarks/results/tpu_anchors.png \\
      --results-md benchmarks/RESULTS.md
  python benchmarks/tpu_anchors.py --from-json benchmarks/results/tpu_anchors.json \\
      --plot benchmarks/results/tpu_anchors.png --results-md benchmarks/RESULTS.md
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/tpu_anchors.py   # the tiny preset, for CI
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib.metadata
import json
import math
import pathlib
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
# CompileReport's fields). The library reports the first, "cycles"; the others are compared
# on the same runs (an in-sample comparison, not a test of any of them).
METHODS: dict[str, tuple[str, str]] = {
    "cycles": ("cycles_step_seconds", "cyc. ms: the compiler's estimated cycles summed, a cycle "
               "timed by a large matmul at peak (aot.report.cycle_seconds)"),
    "roofline": ("estimated_step_seconds", "est. ms: max(FLOPs / peak, bytes accessed / "
                 "bandwidth)"),
    "hbm roofline": ("hbm_step_seconds", "HBM ms: max(FLOPs / peak, HBM traffic / bandwidth)"),
}
LIBRARY_METHOD = "cycles"  # what CompileReport.cycles_step_seconds and STEP_RANGES are of
GENERATIONS = ("v3", "v4", "v5e", "v5p", "v6e")


def ratios(rows: list[dict[str, Any]], method: str) -> list[float]:
  """Measured over estimated step time of each row, by ``method``."""
  field = METHODS[method][0]
  return [row["measured_s"] / row["report"][field] for row in rows]


def program_key(row: dict[str, Any]) -> tuple[Any, ...]:
  """What a row's device program is made of: its generation, settings, row length and rows
  a device. Two runs alike in all of them (one batch a device on slices of different size)
  compile to one device program but for its collectives, whose cycles the compiler does
  not write: one estimate, and not two independent checks of it."""
  return (row["generation"], tuple(row["overrides"]), row["length"], row["precision"],
          row["rows"] // row["devices"])


def program_labels(rows: list[dict[str, Any]]) -> list[str]:
  """``"A"``, ``"B"`` ...: one letter per distinct ``program_key``, in order of first run."""
  letters: dict[tuple[Any, ...], str] = {}
  for row in rows:
    letters.setdefault(program_key(row), chr(ord("A") + len(letters)))
  return [letters[program_key(row)] for row in rows]


def observed_ranges(rows: list[dict[str, Any]], method: str
                    ) -> dict[str, dict[str, Any] | None]:
  """Each generation's lowest and highest ratio over its rows, with how many rows, distinct
  programs and upper bounds there are, and which rows set the ends; ``None`` for a
  generation without a row."""
  values = ratios(rows, method)
  out: dict[str, dict[str, Any] | None] = {}
  for generation in GENERATIONS:
    mine = [(v, row) for v, row in zip(values, rows) if row["generation"] == generation]
    if not mine:
      out[generation] = None
      continue
    low, high = min(mine, key=lambda p: p[0]), max(mine, key=lambda p: p[0])
    out[generation] = {
        "low": low[0], "high": high[0], "runs": len(mine),
        "programs": len({program_key(row) for _, row in mine}),
        "upper_bounds": sum(row["bound"] == "upper" for _, row in mine),
        "low_run": low[1]["name"], "high_run": high[1]["name"],
        "low_bound": low[1]["bound"], "high_bound": high[1]["bound"]}
  return out


def printed_range(observed: dict[str, Any]) -> Any:
  """``observed`` (an ``observed_ranges`` entry) as ``aot.report.STEP_RANGES`` holds it: a
  ``StepRange`` with the ends rounded outwards to two decimals, so that the printed range
  holds every run."""
  from seq2seq_jax.aot import report as report_lib  # noqa: PLC0415
  return report_lib.StepRange(
      low=math.floor(observed["low"] * 100 + 1e-9) / 100,
      high=math.ceil(observed["high"] * 100 - 1e-9) / 100,
      runs=observed["runs"], programs=observed["programs"],
      upper_bounds=observed["upper_bounds"])


def _against(value: float, others: list[float]) -> dict[str, Any]:
  """``value`` against the range of ``others``: the range, whether it holds ``value``,
  and if not by what factor it lies outside (above: value / top; below: bottom / value)."""
  if not others:
    return {"range": None, "runs": 0, "inside": False, "outside_by": None, "side": None}
  low, high = min(others), max(others)
  side = "above" if value > high else "below" if value < low else None
  by = value / high if side == "above" else low / value if side == "below" else None
  return {"range": (low, high), "runs": len(others), "inside": side is None,
          "outside_by": by, "side": side}


def held_out(rows: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
  """Each row's ratio against the range of the other rows of its chip generation
  (``others``), and against that of the rows of its generation's other programs
  (``other_programs``: a row that shares its program with another is not held out from it
  by leaving the row alone out). A row that sets an end of its generation's range lies
  outside the others' by construction; ``outside_by`` says how far."""
  values = ratios(rows, method)
  out = []
  for i, row in enumerate(rows):
    same = [j for j in range(len(rows)) if j != i and rows[j]["generation"] == row["generation"]]
    others = [values[j] for j in same]
    other_programs = [values[j] for j in same if program_key(rows[j]) != program_key(row)]
    out.append({"name": row["name"], "generation": row["generation"], "ratio": values[i],
                "bound": row["bound"], "others": _against(values[i], others),
                "other_programs": _against(values[i], other_programs)})
  return out


def range_problems(rows: list[dict[str, Any]], printed: dict[str, Any],
                   method: str = LIBRARY_METHOD) -> list[str]:
  """What is wrong between ``rows`` (this script's JSON rows) and ``printed`` (a mapping
  like ``aot.report.STEP_RANGES``): a generation whose printed range is not its rows'
  (ends rounded outwards, counts of runs, programs and upper bounds), one printed without
  rows or with rows but not printed, and a row whose ratio lies outside its generation's
  printed range. Empty when they agree."""
  problems = []
  for generation, observed in observed_ranges(rows, method).items():
    shown = printed.get(generation)
    if observed is None:
      if shown is not None:
        problems.append(f"TPU {generation}: a range is printed ({shown.text()}) but no run "
                        "was published")
      continue
    expected = printed_range(observed)
    if shown is None:
      runs = f"{observed['runs']} run{'s' * (observed['runs'] != 1)}"
      problems.append(f"TPU {generation}: {runs} but no range printed "
                      f"(it is {expected.text()})")
    elif shown != expected:
      problems.append(f"TPU {generation}: printed {shown.text()}, the runs give "
                      f"{expected.text()}")
  for row, value in zip(rows, ratios(rows, method)):
    shown = printed.get(row["generation"])
    if shown is not None and not shown.low <= value <= shown.high:
      problems.append(f"{row['name']}: {value:.3f}x lies outside TPU {row['generation']}'s "
                      f"printed {shown.low:.2f}-{shown.high:.2f}x")
  return problems


def _span(entry: dict[str, Any]) -> str:
  span, runs = entry["range"], f"{entry['runs']} run{'s' * (entry['runs'] != 1)}"
  if span is None:
    return "none (no other run)"
  if span[0] == span[1]:
    return f"{span[0]:.2f}x ({runs})"
  return f"{span[0]:.2f}-{span[1]:.2f}x ({runs})"


def _end(observed: dict[str, Any], end: str) -> str:
  bound = "an upper bound" if observed[f"{end}_bound"] == "upper" else "exact"
  return f"{observed[end]:.3f}x: {observed[f'{end}_run']} ({bound})"


def _verdict(entry: dict[str, Any]) -> str:
  if entry["range"] is None:
    return "-"
  return "yes" if entry["inside"] else f"**no**: {entry['outside_by']:.2f}x {entry['side']}"


def _count(entries: list[dict[str, Any]], key: str, generation: str | None = None) -> str:
  mine = [e for e in entries if generation is None or e["generation"] == generation]
  return f"{sum(e[key]['inside'] for e in mine)} of {len(mine)}"


def render_markdown(payload: dict[str, Any]) -> str:
  """RESULTS.md's tables of the anchors, from this script's JSON: the runs, the range of
  each chip generation, each run held out, and the estimates compared."""
  rows = payload["rows"]
  method = payload["method"]
  labels = program_labels(rows)
  lines = ["| run | source | framework | slice | batch a step | precision | program | measured "
           "ms a step | exact or bound | est. ms | measured / est. | cyc. ms | measured / cyc. |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for row, label in zip(rows, labels):
    report, at_most = row["report"], "<= " if row["bound"] == "upper" else ""
    lines.append(
        f"| {row['name']} | {row['source_name']} | {row['framework']} | {row['target']} "
        f"({row['chips']} chips, {row['devices']} devices) | {row['tokens']} | "
        f"{row['precision']} | {label} | {at_most}{row['measured_s'] * 1e3:.1f} | "
        f"{'upper bound' if row['bound'] == 'upper' else 'exact (a rate)'} | "
        f"{report['estimated_step_seconds'] * 1e3:.1f} | "
        f"{at_most}{row['measured_s'] / report['estimated_step_seconds']:.2f}x | "
        f"{report['cycles_step_seconds'] * 1e3:.1f} | "
        f"{at_most}{row['measured_s'] / report['cycles_step_seconds']:.2f}x |")
  lines += ["", "Program: runs with one letter have the same batch a device and settings, so "
            "one device program (but for its collectives, which carry no cycles) and one "
            "estimate.", "",
            "The range per chip generation (measured step / cyc. ms, the lowest and highest "
            "of its runs, rounded outwards: `aot.report.STEP_RANGES`):", "",
            "| generation | published runs | range | programs | upper bounds | low end | "
            "high end |", "|---|---|---|---|---|---|---|"]
  for generation in GENERATIONS:
    observed = payload["ranges"][method][generation]
    if observed is None:
      lines.append(f"| TPU {generation} | 0 | not measured | - | - | - | - |")
      continue
    shown = printed_range(observed)
    lines.append(f"| TPU {generation} | {observed['runs']} | {shown.low:.2f}-{shown.high:.2f}x | "
                 f"{observed['programs']} | {observed['upper_bounds']} | "
                 f"{_end(observed, 'low')} | {_end(observed, 'high')} |")
  entries = payload["held_out"][method]
  field = METHODS[method][0]
  lines += ["", f"Each run held out ({method}, `{field}`): its ratio against the range of the "
            "other runs of its generation, and against the range of its generation's other "
            "programs (its program's other run left out too). Inside the other runs' range: "
            f"{_count(entries, 'others')} (v3 {_count(entries, 'others', 'v3')}, v4 "
            f"{_count(entries, 'others', 'v4')}); inside the other programs': "
            f"{_count(entries, 'other_programs')}.", "",
            "| run | generation | program | measured / cyc. | the other runs' range | inside | "
            "the other programs' range | inside |", "|---|---|---|---|---|---|---|---|"]
  for entry, label in zip(entries, labels):
    at_most = "<= " if entry["bound"] == "upper" else ""
    lines.append(
        f"| {entry['name']} | {entry['generation']} | {label} | {at_most}{entry['ratio']:.2f}x | "
        f"{_span(entry['others'])} | {_verdict(entry['others'])} | "
        f"{_span(entry['other_programs'])} | {_verdict(entry['other_programs'])} |")
  lines += ["", "The estimates compared on the same runs (their ranges, rounded outwards, and "
            "how many times wide: high / low):", "",
            "| estimate | range v3 | range v4 | inside the other runs' range |",
            "|---|---|---|---|"]
  for name in METHODS:
    cells = []
    for generation in ("v3", "v4"):
      observed = payload["ranges"][name][generation]
      shown = printed_range(observed)
      cells.append(f"{shown.low:.2f}-{shown.high:.2f}x (x{observed['high'] / observed['low']:.2f})")
    library = " (the library's)" if name == method else ""
    lines.append(f"| {METHODS[name][1].split(':')[0]}{library} | {cells[0]} | {cells[1]} | "
                 f"{_count(payload['held_out'][name], 'others')} |")
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


def _anchor_config(anchor: dict[str, Any], quick: bool) -> Any:
  from seq2seq_jax import presets  # noqa: PLC0415
  overrides = [o for o in anchor["overrides"] if not quick or not o.startswith(("model.", "data."))]
  return presets.apply_overrides(
      presets.get_preset("tiny_transformer" if quick else "wmt14_transformer_big"), overrides)


def read_back(path: pathlib.Path, anchors: list[dict[str, Any]], quick: bool
              ) -> tuple[list[dict[str, Any]], str]:
  """The rows of ``anchors`` from an earlier run's JSON at ``path``, without compiling: the
  compiler's figures as they were, the report's fields the library derives from a
  constant (``step_range_seconds``, ``attention_impl``) filled in again. Refuses a JSON
  whose run of an anchor is not the anchor as this script defines it (compile that one
  again instead). Returns the rows and when they were compiled."""
  from seq2seq_jax import aot  # noqa: PLC0415
  from seq2seq_jax.aot import report as report_lib  # noqa: PLC0415
  stored = json.loads(path.read_text())
  if stored["settings"]["quick"] != quick:
    raise ValueError(f"{path} was written with quick={stored['settings']['quick']}, this run "
                     f"has quick={quick}: set or unset SEQ2SEQ_JAX_QUICK to match")
  by_name = {row["name"]: row for row in stored["rows"]}
  fields = {f.name for f in dataclasses.fields(report_lib.CompileReport)}
  rows = []
  for anchor in anchors:
    row = by_name.get(anchor["name"])
    if row is None:
      raise ValueError(f"{path} has no run {anchor['name']!r}: compile it (drop --from-json)")
    for key, value in anchor.items():
      if json.loads(json.dumps(value)) != row.get(key):
        raise ValueError(f"{path}: run {anchor['name']!r} has {key}={row.get(key)!r} where "
                         f"the script now says {value!r}: compile it again (drop --from-json)")
    report = report_lib.CompileReport(**{k: v for k, v in row["report"].items() if k in fields})
    target = aot.parse_target(anchor["target"])
    report.step_range_seconds = report_lib.step_range_seconds(target.chip.name,
                                                              report.cycles_step_seconds)
    report.attention_impl = _anchor_config(anchor, quick).model.attention_impl
    rows.append(dict(row, report=report.to_dict()))
  compiled = stored["settings"].get("compiled") or stored["machine"]["time"]
  return rows, compiled


def _compile_row(anchor: dict[str, Any], quick: bool, cache: pathlib.Path) -> dict[str, Any]:
  """``anchor``'s row: its configuration compiled for its slice and batch (programs kept
  under ``cache``), the report beside the run's own figures."""
  from seq2seq_jax import aot  # noqa: PLC0415
  start = time.perf_counter()
  target = aot.parse_target(anchor["target"])
  report = aot.compile_report(_anchor_config(anchor, quick), target, "train",
                              rows=None if quick else anchor["rows"],
                              length=None if quick else anchor["length"],
                              compiler=DiskCompiler(cache, target.topology))
  rate = aot.report.cycles_per_second(target)
  row = dict(anchor, devices=target.devices, chips=target.chips, generation=target.chip.name,
             cycles=report.cycles_step_seconds * rate, report=report.to_dict(),
             compile_s=time.perf_counter() - start)
  at_most = "<= " if anchor["bound"] == "upper" else ""
  print(f"{anchor['name']}: {report.rows} rows x {report.source_len}+{report.target_len}, "
        f"measured {at_most}{anchor['measured_s'] * 1e3:.1f} ms; est. "
        f"{report.estimated_step_seconds * 1e3:.1f} ms ({at_most}"
        f"{anchor['measured_s'] / report.estimated_step_seconds:.2f}x), cyc. "
        f"{report.cycles_step_seconds * 1e3:.1f} ms ({at_most}"
        f"{anchor['measured_s'] / report.cycles_step_seconds:.2f}x) "
        f"({row['compile_s']:.0f} s)", flush=True)
  return row


def main() -> None:
  from seq2seq_jax import benchmarking  # noqa: PLC0415

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--cache", type=pathlib.Path,
                      default=pathlib.Path(__file__).resolve().parent.parent / ".cache"
                      / "tpu_anchors", help="where compiled programs are kept")
  parser.add_argument("--only", default="", help="anchors whose name contains this")
  parser.add_argument("--results-md", type=pathlib.Path, default=None,
                      help="write the tables into this file's tpu_anchors.py section "
                           "(benchmarks/RESULTS.md)")
  parser.add_argument("--from-json", type=pathlib.Path, default=None, metavar="JSON",
                      help="read the runs' compiled figures back from an earlier run's JSON "
                           "instead of compiling (the tables and ranges recomputed)")
  args = benchmarking.parse_args(parser)
  quick = benchmarking.quick_mode()
  anchors = [a for a in ANCHORS if not args.only or args.only in a["name"]]
  settings: dict[str, Any] = {"quick": quick}
  if args.from_json:
    rows, compiled = read_back(args.from_json, anchors, quick)
    settings.update(compiled=compiled, read_back_from=str(args.from_json))
    print(f"read {len(rows)} runs back from {args.from_json} (compiled {compiled})")
  else:
    rows = [_compile_row(anchor, quick, args.cache) for anchor in anchors]
  payload = {"benchmark": "tpu_anchors",
             "note": "published step times against compiler-derived estimates (libtpu on this "
                     "CPU); no TPU used here",
             "settings": settings, "rows": rows, "method": LIBRARY_METHOD,
             "ranges": {m: observed_ranges(rows, m) for m in METHODS},
             "held_out": {m: held_out(rows, m) for m in METHODS}}
  markdown = render_markdown(payload)
  print(markdown)
  printed = {g: printed_range(r) for g, r in payload["ranges"][LIBRARY_METHOD].items() if r}
  print(f"aot.report.STEP_RANGES should read: {printed}")
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
  markers = ["v" if r["bound"] == "upper" else "o" for r in rows]  # v: an upper bound
  for i, (value, row, marker) in enumerate(zip(values, rows, markers)):
    ax.scatter([i], [value], c=colours.get(row["generation"], "k"), marker=marker)
  for generation, observed in observed_ranges(rows, LIBRARY_METHOD).items():
    if observed is not None:
      ax.axhspan(observed["low"], observed["high"], color=colours.get(generation, "k"),
                 alpha=0.12, label=f"TPU {generation}: observed range")
  ax.set_xticks(range(len(rows)), [r["target"] for r in rows], rotation=30, fontsize=7)
  ax.set_yscale("log")
  ax.set_ylabel("real step / cyc. ms (v: upper bound)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
