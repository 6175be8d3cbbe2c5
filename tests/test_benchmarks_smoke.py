"""Every benchmark script runs in quick mode and writes valid JSON; speed is never asserted.

Each script runs as a subprocess with ``SEQ2SEQ_JAX_QUICK=1`` (tiny models, a few
steps), as CI runs it. ``compare_pytorch.py`` needs the optional ``bench`` extra
(torch, transformers, ctranslate2), which CI does not install: its test is skipped,
never failed, when torch cannot be imported here.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
HAS_TORCH = importlib.util.find_spec("torch") is not None and (
    importlib.util.find_spec("transformers") is not None)
# Skipped locally without torch, transformers and ctranslate2; under CI=true their absence fails.
NEEDS_BENCH_EXTRA = pytest.mark.skipif(
    not HAS_TORCH and os.environ.get("CI", "").lower() not in ("1", "true", "yes"),
    reason="needs the 'bench' extra: torch, transformers and ctranslate2")


def _run(script: str, tmp_path: pathlib.Path, *extra: str) -> dict:
  out = tmp_path / f"{script}.json"
  plot = tmp_path / f"{script}.png"
  env = dict(os.environ, SEQ2SEQ_JAX_QUICK="1")
  # One host device, as a user runs the scripts (conftest forces 8 for the sharding tests).
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(
      "--xla_force_host_platform_device_count=8", "").strip()
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(BENCHMARKS.parent / ".cache" / "jax"))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  result = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), "--out", str(out),
                           "--plot", str(plot), *extra], env=env, capture_output=True, text=True,
                          timeout=900)
  assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
  payload = json.loads(out.read_text())
  assert payload["benchmark"] == script
  assert payload["machine"]["quick"] is True
  assert plot.stat().st_size > 0
  return payload


def _check_rows(rows: list[dict], rate_key: str) -> None:
  assert rows
  for row in rows:
    assert row[rate_key] > 0
    assert len(row["timing"]["times_s"]) >= 1


def _check_runtimes(rows: list[dict], rate_key: str, tasks, systems) -> None:
  """Rows are timed and every task was run by every one of ``systems``."""
  _check_rows(rows, rate_key)
  seen = {(r["task"], r["system"]) for r in rows}
  for task in tasks:
    assert {(task, s) for s in systems} <= seen, task


@pytest.mark.slow
def test_train_throughput_quick(tmp_path):
  payload = _run("train_throughput", tmp_path)
  _check_rows(payload["rows"], "tokens/s")
  assert {r["model"] for r in payload["rows"]} == {"T-tiny", "RNN-tiny"}
  assert payload["peak_flops"] > 0
  assert all(0 < r["MFU"] for r in payload["rows"])


@pytest.mark.slow
def test_decode_throughput_quick(tmp_path):
  payload = _run("decode_throughput", tmp_path)
  _check_rows(payload["rows"], "tokens/s")
  assert {(r["method"], r["decoder"]) for r in payload["rows"]} == {
      ("greedy", "cached"), ("greedy", "uncached"), ("beam4", "cached"), ("beam4", "uncached")}


@pytest.mark.slow
def test_decode_controls_quick(tmp_path):
  payload = _run("decode_controls", tmp_path)
  _check_rows(payload["rows"], "tokens/s")
  systems = {r["system"] for r in payload["rows"]}
  assert {"beam4", "constraints (2 x 2 tokens)", "num_beam_groups=2", "ensemble of 2",
          "no_repeat_ngram_size=3", "greedy"} <= systems
  assert all(r["ratio"] > 0 for r in payload["rows"])


@pytest.mark.slow
def test_rnn_vs_transformer_quick(tmp_path):
  payload = _run("rnn_vs_transformer", tmp_path)
  _check_rows(payload["rows"], "step_ms")
  assert {r["model"] for r in payload["rows"]} == {"RNN", "Transformer"}
  assert len({r["length"] for r in payload["rows"]}) >= 2


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TORCH and os.environ.get("CI", "").lower() not in ("1", "true", "yes"),
                    reason="compare_pytorch needs the optional 'bench' extra (torch, "
                           "transformers); `make setup` installs it, and under CI=true its "
                           "absence fails this test")
def test_compare_pytorch_quick(tmp_path):
  payload = _run("compare_pytorch", tmp_path)
  _check_rows(payload["rows"], "tokens/s")
  systems = {(r["task"], r["system"]) for r in payload["rows"]}
  assert ("train", "torch eager") in systems and ("greedy", "HF MarianMT") in systems
  # Every peer produced the forced output length.
  lengths = {r["output_len"] for r in payload["rows"] if r["task"] != "train"}
  assert lengths == {payload["settings"]["output_len"]}


# Every system of benchmark_runtimes.compare: this library in float32, bfloat16, int8 and
# int8 with bfloat16 compute; HF; CTranslate2 in float32, int8 and int8_float32.
RUNTIMES = ("seq2seq_jax", "seq2seq_jax bf16", "seq2seq_jax int8", "seq2seq_jax int8 bf16",
            "HF generate", "CTranslate2", "CTranslate2 int8", "CTranslate2 int8_float32")


@pytest.mark.slow
@NEEDS_BENCH_EXTRA
def test_pretrained_opus_mt_quick(tmp_path):
  payload = _run("pretrained_opus_mt", tmp_path)
  _check_runtimes(payload["rows"], "tokens/s",
                  ("greedy batch 32", "beam4 batch 32", "greedy batch 1", "beam4 batch 1"),
                  RUNTIMES)
  assert all(row["x CT2 int8"] > 0 for row in payload["rows"])
  assert payload["machine"]["instruction_set"] and payload["machine"]["load_average"]
  # The same weights give the same greedy tokens in all three runtimes.
  for batch in payload["agreement"].values():
    assert batch["HF identical rows"] == 1.0 and batch["CTranslate2 identical rows"] == 1.0


@pytest.mark.slow
@NEEDS_BENCH_EXTRA
def test_pretrained_families_quick(tmp_path):
  # --models and --sentences as quick mode has them: the options' parsing on the way.
  payload = _run("pretrained_families", tmp_path, "--models", "T5-small-sized,mBART-sized",
                 "--sentences", "32:32")
  assert payload["settings"]["sentences"] == {"32": 32}
  models = ("T5-small-sized", "mBART-sized")
  # Quick mode times batch 32 alone (batch 1 is the same loop; pretrained_opus_mt's quick
  # run above times both through the shared benchmark_runtimes.compare_batches).
  _check_runtimes(payload["rows"], "tokens/s",
                  [f"{m} {search} batch 32" for m in models for search in ("greedy", "beam4")],
                  RUNTIMES)
  for model in models:
    # The same weights give the same greedy tokens in all three runtimes.
    agreement = payload["agreement"][model]
    assert agreement["HF identical rows"] == 1.0, agreement
    assert agreement["CTranslate2 identical rows"] == 1.0, agreement
  loads = {(r["model"], r["load"]): r for r in payload["loads"]}
  assert len(loads) == 6
  for row in loads.values():
    assert row["seconds"] > 0 and row["param MB"] > 0 and row["peak - start MB"] >= 0
  assert [r["model"] for r in payload["finite_check"]] == ["T5-small-sized", "mBART-sized"]
  assert all(r["load s (check)"] > 0 and r["load s (no check)"] > 0
             for r in payload["finite_check"])


@pytest.mark.slow
@NEEDS_BENCH_EXTRA
def test_translate_file_quick(tmp_path):
  payload = _run("translate_file", tmp_path)
  _check_runtimes(payload["rows"], "sentences/s", ("T-small", "OPUS-MT-sized"),
                  ("seq2seq_jax translate_file", "seq2seq_jax in-memory",
                   "CTranslate2 translate_file", "HF generate loop"))
  # The same weights write the same lines in all three runtimes, file to file.
  for model in payload["agreement"].values():
    assert model == {"ct2 identical lines": 1.0, "hf identical lines": 1.0}
  assert all(mb > 0 for mb in payload["peak_rss_mb"].values())
  assert len(payload["peak_rss_mb"]) == 4 and payload["ratios"]["peak RSS, translate_file"] > 0


@pytest.mark.slow
def test_tpu_compile_quick(tmp_path):
  payload = _run("tpu_compile", tmp_path)
  records = payload["rows"]
  assert {r["section"] for r in records} == {"train", "sharding", "generate"}
  assert all(r["fits"] and r["estimated_step_seconds"] > 0 for r in records)
  largest = next(r for r in records if r["variant"] == "largest batch")
  preset = next(r for r in records if r["variant"] == "preset batch")
  assert largest["rows"] >= preset["rows"] and largest["max_batch_probes"]
  step = next(r for r in records if r["section"] == "generate")["decode_step"]
  assert step["hbm_bound_seconds"] > 0 and step["estimate_over_bound"] > 1


@pytest.mark.slow
def test_input_pipeline_quick(tmp_path):
  payload = _run("input_pipeline", tmp_path, "--work-dir", str(tmp_path / "work"))
  _check_rows(payload["rows"], "slots/s/side")
  corpus = payload["corpus"]
  # The stand-in's English side follows WMT'14's mean word count (25.8) and keeps its tail.
  assert abs(corpus["en_words_mean"] / corpus["mean_en_words"] - 1) < 0.15
  assert corpus["en_words_p99"] > 3 * corpus["en_words_median"]
  sizes = list(payload["sizes"].values())
  starts = {(r["size"], r["path"], r["packing"]) for r in payload["starts"]}
  assert starts == {(size, "new", packing) for size in sizes for packing in (False, True)} | {
      (size, "old", False) for size in sizes[:2]}  # the old path at the largest: extrapolated
  for row in payload["starts"]:
    assert row["first batch s"] > 0 and row["peak MB"] > 0
    assert 0 <= row["padding measured"] < 1
  assert all(r["prepare s"] > 0 and r["pack s"] > 0
             for r in payload["prepare"] if r["path"] == "new")
  assert {r["workers"] for r in payload["workers"]} == set(payload["settings"]["workers"])
  assert {(r["path"], r["packing"]) for r in payload["one_core"]} == {
      ("new", False), ("new", True), ("old", False)}
  systems = {r["system"] for r in payload["packers"]}
  assert "grain FirstFitPackIterDataset (in memory)" in systems
  assert any(s.startswith("seq2seq_jax planned packing") for s in systems)
  # Every packer packs the same pairs: those of the prefix within the limits.
  assert {(r["size"], r["pairs"]) for r in payload["packers"]} == {
      (payload["sizes"]["prefix"], payload["packers"][0]["pairs"])}
  assert payload["appetite"] and all(r["cores, new packed"] > 0 for r in payload["appetite"])
  assert len(payload["targets"]) == 4
  assert all(isinstance(target["met"], bool) for target in payload["targets"])


@pytest.mark.slow
def test_tpu_anchors_quick(tmp_path):
  """The script on the tiny preset (its ratios mean nothing at that size; the full-size
  runs' checks against the printed ranges are tests/aot/test_anchors.py's, from the JSON):
  every anchor compiled for its own slice, each held out, and the tables rendered from the
  JSON as RESULTS.md holds them."""
  payload = _run("tpu_anchors", tmp_path, "--cache", str(tmp_path / "cache"))
  spec = importlib.util.spec_from_file_location("tpu_anchors", BENCHMARKS / "tpu_anchors.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  rows = payload["rows"]
  assert [r["name"] for r in rows] == [a["name"] for a in script.ANCHORS]
  for row in rows:
    assert row["generation"] == row["target"].split(":")[0].split("-")[0]
    assert row["devices"] == (2 * row["chips"] if row["generation"] == "v3" else row["chips"])
    assert row["report"]["fits"] and row["report"]["cycles_step_seconds"] > 0
    assert row["cycles"] > 0
  assert payload["method"] in script.METHODS
  held = payload["held_out"][payload["method"]]
  assert [h["name"] for h in held] == [r["name"] for r in rows]
  for entry, row in zip(held, rows):
    field = script.METHODS[payload["method"]][0]
    assert entry["ratio"] == pytest.approx(row["measured_s"] / row["report"][field])
  markdown = script.render_markdown(payload)
  assert all(row["name"] in markdown for row in rows)
  assert "TPU v5e | 0 | not measured" in markdown
  # Compiled programs are kept by topology and program: at least one a slice, at most one a
  # run (runs on one slice whose quick programs are alike share one: the tiny preset drops
  # the runs' model and data settings).
  kept = len(list((tmp_path / "cache").glob("*.hlo.gz")))
  assert len({row["target"] for row in rows}) <= kept <= len(rows), kept


@pytest.mark.slow
def test_attention_kernels_quick(tmp_path):
  payload = _run("attention_kernels", tmp_path)
  records = {r["attention_impl"]: r for r in payload["rows"]}
  assert set(records) == {"einsum", "auto"}
  assert all(r["fits"] and r["target"] == "v5e-1" for r in records.values())
  # The einsum program holds no kernel; "auto" reaches splash, costed by formula.
  assert records["einsum"]["kernel_flops"] is None and not records["einsum"]["kernels"]
  assert records["auto"]["kernel_flops"] > 0 and "splash" in records["auto"]["kernels"]
  assert records["auto"]["cyc_ms"] > 0 and records["einsum"]["cyc_ms"] > 0


@pytest.mark.slow
def test_cpu_flags_quick(tmp_path):
  payload = _run("cpu_flags", tmp_path, "--flag-sets", "onednn")
  assert payload["settings"]["flag_sets"] == ["default", "onednn"]
  rows = {(r["system"], r["task"]): r for r in payload["rows"]}
  for flags in ("default", "onednn"):
    for task in ("float32 batch 32", "int8 batch 32", "bfloat16 batch 1", "int8 batch 1"):
      assert rows[flags, task]["tokens/s"] > 0
  assert all(rows["default", task]["x default"] == 1.0 for _, task in rows)
  assert payload["instruction_set"] and payload["load_before"]


def test_cpu_flags_names_an_unknown_flag_set():
  result = subprocess.run([sys.executable, str(BENCHMARKS / "cpu_flags.py"), "--flag-sets",
                           "onednn,fast"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, SEQ2SEQ_JAX_QUICK="1"))
  assert result.returncode == 2
  assert "--flag-sets: unknown fast; known: default, onednn" in result.stderr, result.stderr
