"""The step estimate against the published TPU runs of benchmarks/tpu_anchors.py, from its JSON.

The script compiled each run's configuration (1-3 hours on 2 CPU cores); its JSON keeps
what the compiler said (``cycles``: the program's estimated cycles). These tests turn those
cycles into the step estimate with the library's code as it is now, and check the printed
ranges against them: an estimate or a range that is no longer the published runs' fails
here (made-up runs and ranges show the check failing), as does a README, guide or
RESULTS.md that says another range.
"""

import copy
import dataclasses
import importlib.util
import json
import pathlib
import re

import pytest

from seq2seq_jax import aot, presets
from seq2seq_jax.aot import report as report_lib
from seq2seq_jax.aot import targets as targets_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS_JSON = ROOT / "benchmarks" / "results" / "tpu_anchors.json"


def _script():
  spec = importlib.util.spec_from_file_location("tpu_anchors",
                                                ROOT / "benchmarks" / "tpu_anchors.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


ANCHORS = _script()
PAYLOAD = json.loads(RESULTS_JSON.read_text())
ROWS = PAYLOAD["rows"]
UNMEASURED = [c for c, chip in targets_lib.CHIPS.items()
              if chip.platform == "tpu" and c not in report_lib.STEP_RANGES]


def _rows_now() -> list[dict]:
  """The JSON's rows with the step estimate the library makes now of their cycles."""
  rows = copy.deepcopy(ROWS)
  for row in rows:
    row["report"]["cycles_step_seconds"] = report_lib.cycle_seconds(
        row["cycles"], aot.parse_target(row["target"]))
  return rows


def _made_up(name: str, generation: str, ratio: float, *, rows_a_device: int = 8,
             bound: str = "upper") -> dict:
  """A run that was never published: measured / cyc. ms is ``ratio``."""
  return {"name": name, "generation": generation, "bound": bound, "overrides": [],
          "length": None, "precision": "bfloat16", "rows": rows_a_device, "devices": 1,
          "measured_s": ratio * 0.125, "report": {"cycles_step_seconds": 0.125}}


def test_the_json_is_of_every_anchor_at_full_size():
  assert not PAYLOAD["settings"]["quick"]
  assert [row["name"] for row in ROWS] == [a["name"] for a in ANCHORS.ANCHORS]
  for row in ROWS:
    assert row["report"]["rows"] == row["rows"] and row["report"]["fits"]
    assert row["report"]["model"].startswith("Transformer 6+6 d1024 h16 f4096")
    assert row["generation"] == aot.parse_target(row["target"]).chip.name
    # The ranges are of einsum programs: the guides say so beside a fused one.
    assert row["report"]["attention_impl"] == "einsum" and not row["report"]["kernels"]


def test_the_runs_span_two_generations_and_three_sources():
  assert len(ROWS) >= 6
  assert len({row["generation"] for row in ROWS}) >= 2
  assert len({row["source_name"].split(" v0.")[0] for row in ROWS}) >= 3


def test_the_printed_ranges_are_the_runs_own():
  """STEP_RANGES against the runs' ratios by the library's estimate now: the same ends
  (rounded outwards), runs, programs and upper bounds, every run inside, and no range
  where a generation has no run."""
  rows = _rows_now()
  assert ANCHORS.range_problems(rows, report_lib.STEP_RANGES) == []
  # The JSON's estimate is the library's: a change to cycle_seconds shows here too.
  for now, row in zip(rows, ROWS):
    assert now["report"]["cycles_step_seconds"] == pytest.approx(
        row["report"]["cycles_step_seconds"], rel=1e-6), row["name"]
  for chip in UNMEASURED:
    assert report_lib.step_range(chip) is None
    assert report_lib.range_text(chip) == "not measured (no published run)"
    assert report_lib.step_range_seconds(chip, 0.1) is None


def test_the_range_check_fails_on_a_made_up_run_or_range():
  printed = report_lib.STEP_RANGES
  # A v3 run twice as slow as fairseq's: outside the printed range, which is no longer the runs'.
  fairseq = next(row for row in ROWS if row["name"].startswith("fairseq"))
  slow = dict(copy.deepcopy(fairseq), name="made-up v3-8", measured_s=2 * fairseq["measured_s"])
  problems = ANCHORS.range_problems(ROWS + [slow], printed)
  assert any(p.startswith("made-up v3-8: 2.751x lies outside TPU v3's printed 0.57-1.38x")
             for p in problems), problems
  assert "TPU v3: printed 0.57-1.38x (5 runs, 4 programs, 4 upper bounds), the runs give " \
         "0.57-2.76x (6 runs, 4 programs, 4 upper bounds)" in problems, problems
  # A range that holds every run but is not theirs (the old t-based v3 band), or miscounts.
  wide = dict(printed, v3=report_lib.StepRange(low=0.29, high=2.3, runs=5, programs=4,
                                               upper_bounds=4))
  assert ANCHORS.range_problems(ROWS, wide) == [
      "TPU v3: printed 0.29-2.30x (5 runs, 4 programs, 4 upper bounds), the runs give "
      "0.57-1.38x (5 runs, 4 programs, 4 upper bounds)"]
  miscounted = dict(printed, v4=report_lib.StepRange(low=0.39, high=0.54, runs=3, programs=3,
                                                     upper_bounds=3))
  assert len(ANCHORS.range_problems(ROWS, miscounted)) == 1
  # A made-up v5e run with no range printed for it, and a range printed with no run.
  problems = ANCHORS.range_problems(ROWS + [_made_up("made-up v5e", "v5e", 0.7)], printed)
  assert problems == ["TPU v5e: 1 run but no range printed (it is 0.70-0.70x (1 run, 1 "
                      "program, 1 upper bound))"]
  invented = dict(printed, v6e=report_lib.StepRange(low=0.5, high=1.0, runs=2, programs=2,
                                                    upper_bounds=0))
  assert ANCHORS.range_problems(ROWS, invented) == [
      "TPU v6e: a range is printed (0.50-1.00x (2 runs, 2 programs, 0 upper bounds)) but no "
      "run was published"]


def test_each_run_held_out_against_the_range_of_the_others_on_hand_set_ratios():
  rows = [_made_up("low", "v3", 0.5, rows_a_device=4), _made_up("mid", "v3", 0.6),
          _made_up("high", "v3", 0.7), _made_up("alone", "v4", 0.9, bound="exact")]
  held = {entry["name"]: entry for entry in ANCHORS.held_out(rows, "cycles")}
  assert held["mid"]["others"] == {"range": (0.5, 0.7), "runs": 2, "inside": True,
                                   "outside_by": None, "side": None}
  assert held["low"]["others"]["side"] == "below"
  assert held["low"]["others"]["outside_by"] == pytest.approx(1.2)
  assert held["high"]["others"]["side"] == "above"
  assert held["high"]["others"]["outside_by"] == pytest.approx(0.7 / 0.6)
  # "mid" and "high" are one program (8 rows a device): held out from each other too.
  assert held["mid"]["other_programs"]["range"] == (0.5, 0.5)
  assert held["mid"]["other_programs"]["outside_by"] == pytest.approx(1.2)
  assert held["alone"]["others"]["range"] is None and not held["alone"]["others"]["inside"]
  observed = ANCHORS.observed_ranges(rows, "cycles")
  assert observed["v3"]["runs"] == 3 and observed["v3"]["programs"] == 2
  assert observed["v3"]["upper_bounds"] == 3 and observed["v4"]["upper_bounds"] == 0
  assert observed["v5e"] is None


def test_where_the_leave_one_out_view_of_the_published_runs_fails():
  """RESULTS.md names these runs: the ends of each generation's range, outside the
  others'; and the v4-128 run is inside only by its own program's other run."""
  held = ANCHORS.held_out(_rows_now(), ANCHORS.LIBRARY_METHOD)
  outside = [e["name"] for e in held if not e["others"]["inside"]]
  assert outside == ["fairseq dummy_mt, TPU v3-8", "MLPerf v0.6 Google tpu-v3-32, TensorFlow/T2T",
                     "MLPerf v0.7 Google tpu-v4-16-TF, TensorFlow/Lingvo",
                     "MLPerf v0.7 Google tpu-v4-512-TF, TensorFlow/Lingvo"]
  apart = [e["name"] for e in held if not e["other_programs"]["inside"]]
  assert apart == outside[:3] + ["MLPerf v0.7 Google tpu-v4-128-TF, TensorFlow/Lingvo",
                                 outside[3]]


def test_runs_of_one_program_have_one_estimate_and_the_rest_differ():
  """``program_key``: runs alike in it compiled to cycles within 0.01 % of each other (their
  collectives carry none); runs not alike differ by more than 1 %."""
  for i, a in enumerate(ROWS):
    for b in ROWS[i + 1:]:
      relative = abs(a["cycles"] - b["cycles"]) / max(a["cycles"], b["cycles"])
      if ANCHORS.program_key(a) == ANCHORS.program_key(b):
        assert relative < 1e-4, (a["name"], b["name"], relative)
      elif a["generation"] == b["generation"]:
        assert relative > 0.01, (a["name"], b["name"], relative)
  assert len(set(ANCHORS.program_labels(ROWS))) == 6


def test_the_json_reads_back_as_itself_and_refuses_a_changed_run(tmp_path):
  rows, compiled = ANCHORS.read_back(RESULTS_JSON, list(ANCHORS.ANCHORS), quick=False)
  assert json.loads(json.dumps(rows)) == ROWS and compiled == PAYLOAD["settings"]["compiled"]
  changed = copy.deepcopy(PAYLOAD)
  changed["rows"][2]["measured_s"] *= 1.01
  path = tmp_path / "anchors.json"
  path.write_text(json.dumps(changed))
  with pytest.raises(ValueError, match=r"run 'fairseq dummy_mt, TPU v3-8' has measured_s="):
    ANCHORS.read_back(path, list(ANCHORS.ANCHORS), quick=False)


def test_a_compiled_program_read_back_from_disk_reports_as_the_compiled_one(tmp_path):
  target = aot.parse_target("v4:1x1x1")
  compiler = ANCHORS.DiskCompiler(tmp_path, target.topology)
  tiny = presets.get_preset("tiny_transformer")
  first = aot.compile_report(tiny, target, "train", compiler=compiler)
  assert len(list(tmp_path.glob("*.hlo.gz"))) == 1
  again = aot.compile_report(tiny, target, "train", compiler=compiler)
  assert len(list(tmp_path.glob("*.hlo.gz"))) == 1  # read back, not compiled again
  for field in ("per_chip_bytes", "flops_per_chip", "bytes_accessed_per_chip",
                "hbm_traffic_per_chip", "cycles_step_seconds", "estimated_step_seconds",
                "step_range_seconds", "attention_impl"):
    assert getattr(again, field) == getattr(first, field), field
  # A v4 report carries v4's range times its own estimate.
  v4 = report_lib.STEP_RANGES["v4"]
  assert first.step_range_seconds == pytest.approx(
      (v4.low * first.cycles_step_seconds, v4.high * first.cycles_step_seconds))
  assert first.attention_impl == "einsum"
  table = aot.format_table([first])
  assert f"TPU v4: {report_lib.range_text('v4')}" in table and "einsum-attention" not in table
  fused = dataclasses.replace(first, attention_impl="splash")
  assert "Those runs are of einsum-attention programs; attention_impl=splash" in (
      aot.format_table([first, fused]))


def test_results_md_s_anchor_tables_are_the_script_s():
  text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
  section = text.split(ANCHORS.BEGIN)[1].split(ANCHORS.END)[0]
  assert section.strip() == ANCHORS.render_markdown(PAYLOAD).strip()


def _section(text: str, heading: str) -> str:
  """``text`` from ``heading`` to the next heading of its level."""
  level = heading.split(" ")[0]
  rest = text.split(heading + "\n", 1)[1]
  return re.split(rf"\n{level} ", rest, maxsplit=1)[0]


def test_every_place_that_states_the_range_states_the_same_one():
  """README, the TPU guide, RESULTS.md, ``seq2seq-jax compile``'s help, aot.report's
  docstring and the tables' footnote each say "TPU v3: <range>" for every generation with
  a range, name the rest with no range, and claim no coverage ("95 %", prediction bands)."""
  readme = (ROOT / "README.md").read_text()
  results = (ROOT / "benchmarks/RESULTS.md").read_text()
  places = {"README.md": _section(readme, "## Will it fit a TPU?"),
            "README.md's headline table": _section(readme, "## Headline results"),
            "the TPU guide": (ROOT / "docs/guides/tpu.md").read_text(),
            "RESULTS.md": _section(results, "## TPU estimates"),
            "seq2seq-jax compile": (ROOT / "seq2seq_jax/cli/compile.py").read_text(),
            "aot.report": report_lib.__doc__,
            "the footnote": report_lib.range_note(targets_lib.CHIPS)}
  for name, text in places.items():
    text = " ".join(text.split())
    assert "95 %" not in text and "prediction band" not in text, name
    assert not re.search(r"TPU (v5e|v5p|v6e): [0-9]", text), name
    if name == "README.md's headline table":
      continue  # one row: the ranges without their counts
    for chip in report_lib.STEP_RANGES:
      assert f"TPU {chip}: {report_lib.range_text(chip)}" in text, (name, chip)
    assert "not measured" in text or "no published run" in text, name
    for chip in UNMEASURED:
      assert chip in text, (name, chip)
  headline = " ".join(places["README.md's headline table"].split())
  for chip, observed in report_lib.STEP_RANGES.items():
    assert f"TPU {chip}: {observed.low:.2f}-{observed.high:.2f}x" in headline, chip


def test_the_footnote_prints_no_range_without_runs_and_names_einsum_beside_a_fused_program():
  note = report_lib.range_note(["v4", "v5e"], ["einsum"])
  assert f"TPU v4: {report_lib.range_text('v4')}" in note
  assert "TPU v5e: not measured (no published run)" in note and "einsum" not in note
  fused = report_lib.range_note(["v4"], ["einsum", "splash", "auto"])
  assert "Those runs are of einsum-attention programs; attention_impl=auto/splash" in fused
  # No range printed (v5e alone): nothing to qualify.
  unmeasured = report_lib.range_note(["v5e"], ["splash"])
  assert "einsum" not in unmeasured and not re.search(r"[0-9]x", unmeasured)
