"""The step estimate against the published TPU runs of benchmarks/tpu_anchors.py, from its JSON.

The script compiled each run's configuration (1-3 hours on 2 CPU cores); its JSON keeps
what the compiler said (``cycles``: the program's estimated cycles). These tests turn those
cycles into the step estimate with the library's code as it is now, and check the printed
bands against them: a change to the estimate or to a band that no longer holds the
published runs fails here, as does a README, guide or RESULTS.md that says another band.
"""

import importlib.util
import json
import math
import pathlib

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


def _ratios_now() -> list[float]:
  """Each run's measured step over the estimate the library makes now of its cycles."""
  return [row["measured_s"] / report_lib.cycle_seconds(row["cycles"],
                                                       aot.parse_target(row["target"]))
          for row in ROWS]


def test_the_json_is_of_every_anchor_at_full_size():
  assert not PAYLOAD["settings"]["quick"]
  assert [row["name"] for row in ROWS] == [a["name"] for a in ANCHORS.ANCHORS]
  for row in ROWS:
    assert row["report"]["rows"] == row["rows"] and row["report"]["fits"]
    assert row["report"]["model"].startswith("Transformer 6+6 d1024 h16 f4096")
    assert row["generation"] == aot.parse_target(row["target"]).chip.name


def test_the_runs_span_two_generations_and_three_sources():
  assert len(ROWS) >= 6
  assert len({row["generation"] for row in ROWS}) >= 2
  assert len({row["source_name"].split(" v0.")[0] for row in ROWS}) >= 3


def test_each_run_lies_in_its_generation_s_printed_band():
  """The library's estimate of each run's compiled program, now, against STEP_BANDS."""
  for row, ratio in zip(ROWS, _ratios_now()):
    low, high = report_lib.STEP_BANDS[row["generation"]]
    assert low <= ratio <= high, (row["name"], ratio, (low, high))
    # The JSON's estimate is the library's: a change to cycle_seconds shows here too.
    assert ratio == pytest.approx(row["measured_s"] / row["report"]["cycles_step_seconds"],
                                  rel=1e-6)


def test_the_printed_bands_are_the_prediction_bands_of_the_runs():
  ratios = _ratios_now()
  for generation in ANCHORS.GENERATIONS:
    mine = [r for r, row in zip(ratios, ROWS) if row["generation"] == generation]
    band = report_lib.prediction_band(mine)
    if len(mine) < 2:
      assert generation not in report_lib.STEP_BANDS
      assert report_lib.band_text(generation) == "not measured"
      continue
    # Printed to two digits, rounded outwards, so the band printed holds the band computed.
    assert report_lib.STEP_BANDS[generation] == pytest.approx(ANCHORS.printed_band(band)), (
        generation, band)


def test_each_run_held_out_lies_in_the_band_of_the_others():
  held = ANCHORS.held_out(ROWS, ANCHORS.LIBRARY_METHOD)
  assert [entry["name"] for entry in held if not entry["held"]] == []


def test_the_library_s_estimate_is_the_method_the_held_out_check_chooses():
  method, scores = ANCHORS.choose(ROWS)
  assert method == ANCHORS.LIBRARY_METHOD == PAYLOAD["method"]
  assert scores[method]["held"] == len(ROWS)


def test_a_compiled_program_read_back_from_disk_reports_as_the_compiled_one(tmp_path):
  target = aot.parse_target("v5e-1")
  compiler = ANCHORS.DiskCompiler(tmp_path, target.topology)
  tiny = presets.get_preset("tiny_transformer")
  first = aot.compile_report(tiny, target, "train", compiler=compiler)
  assert len(list(tmp_path.glob("*.hlo.gz"))) == 1
  again = aot.compile_report(tiny, target, "train", compiler=compiler)
  assert len(list(tmp_path.glob("*.hlo.gz"))) == 1  # read back, not compiled again
  for field in ("per_chip_bytes", "flops_per_chip", "bytes_accessed_per_chip",
                "hbm_traffic_per_chip", "cycles_step_seconds", "estimated_step_seconds"):
    assert getattr(again, field) == getattr(first, field), field


def test_the_t_table_is_student_s():
  scipy_stats = pytest.importorskip("scipy.stats")
  for dof, value in report_lib._T_975.items():  # pylint: disable=protected-access
    assert value == pytest.approx(scipy_stats.t.ppf(0.975, dof), abs=6e-4)


def test_a_prediction_band_widens_with_spread_and_needs_two_runs():
  assert report_lib.prediction_band([0.8]) is None
  tight = report_lib.prediction_band([0.8, 0.82, 0.81])
  loose = report_lib.prediction_band([0.6, 0.82, 1.1])
  assert tight[0] < 0.8 and tight[1] > 0.82 and loose[0] < tight[0] and loose[1] > tight[1]
  # Symmetric in logarithms about the geometric mean.
  assert math.sqrt(loose[0] * loose[1]) == pytest.approx((0.6 * 0.82 * 1.1) ** (1 / 3))


def test_results_md_s_anchor_tables_are_the_script_s():
  text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
  section = text.split(ANCHORS.BEGIN)[1].split(ANCHORS.END)[0]
  assert section.strip() == ANCHORS.render_markdown(PAYLOAD).strip()


def test_every_place_that_states_the_band_states_the_same_one():
  """README, the TPU guide, RESULTS.md, ``seq2seq-jax compile``'s help and the tables'
  footnote each say "TPU v3: <band>" for every generation with a band, and that the rest
  are not measured."""
  places = {"README.md": ROOT / "README.md", "the TPU guide": ROOT / "docs/guides/tpu.md",
            "RESULTS.md": ROOT / "benchmarks/RESULTS.md",
            "seq2seq-jax compile": ROOT / "seq2seq_jax/cli/compile.py"}
  texts = {name: " ".join(path.read_text().split()) for name, path in places.items()}
  texts["the footnote"] = report_lib.band_note(targets_lib.CHIPS)
  unmeasured = [c for c, chip in targets_lib.CHIPS.items()
                if chip.platform == "tpu" and c not in report_lib.STEP_BANDS]
  for name, text in texts.items():
    for chip in report_lib.STEP_BANDS:
      assert f"TPU {chip}: {report_lib.band_text(chip)}" in text, (name, chip)
    assert "not measured" in text, name
    for chip in unmeasured:
      assert chip in text, (name, chip)
