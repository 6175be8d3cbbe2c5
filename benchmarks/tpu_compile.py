"""The library's programs through the real TPU compiler, for TPU slices this machine lacks.

Compiler-derived estimates, not measurements: libtpu compiles each program for an
abstract slice on this CPU (``seq2seq_jax.aot``) and its memory and cost analyses,
against each chip's published peak and bandwidth, give per-chip GiB, an estimated
step time (a roofline: the larger of FLOPs / peak and bytes / bandwidth) and the
MFU that time implies.

Sections (``--sections``, default all):
- ``train``: every preset (the Multi30k ones, WMT'14 base and big) on v4-8, v5e-8,
  v5p-8 and v6e-8, at the preset's batch (its longest bucket) and at the largest
  batch that fits (bisection over compiles, to within ``--tolerance``).
- ``sharding``: WMT base and big on v5e:2x4 and v4:2x2x1 with replicated
  parameters, FSDP, tensor parallelism (model axis 2) and both.
- ``generate``: OPUS-MT, NLLB-200 600M and 1.3B shapes (their config.json figures),
  greedy and beam 4 at batch 32 and 256 on v5e-1: the whole program's memory, and
  one decoding step against the HBM-bandwidth bound (parameters and caches read once).
  OPUS-MT's beam 4 also with int8 weights and products (``quantize="int8"``, variant
  ``"beam b32 int8"``): the bound then counts the int8 weights.
- ``choices``: the CPU-only choices (vocabulary-major logits, two-stage argmax and
  top-k) and the dropout generator (Philox, threefry, rbg) judged on v5e-1.

Results go to ``--out`` as they come, one row per compile report; a rerun skips
what is there (``--redo`` recompiles). WMT big's compiles take minutes each here.
``--plot`` draws the estimated MFU of each preset's largest training batch.

  python benchmarks/tpu_compile.py [--sections train,sharding,generate,choices] [--out F]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/tpu_compile.py   # tiny sizes, for CI
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import tempfile
import time
from typing import Any

TRAIN_TARGETS = ("v4-8", "v5e-8", "v5p-8", "v6e-8")
SHARDING_TARGETS = ("v5e:2x4", "v4:2x2x1")
SHARDINGS = {"replicated": [], "fsdp": ["train.parameter_sharding=fsdp"],
             "tp2": ["train.model_parallelism=2"],
             "fsdp+tp2": ["train.parameter_sharding=fsdp", "train.model_parallelism=2"]}
# config.json figures of the published checkpoints (transformers' layouts).
PUBLISHED = {
    "opus-mt-de-en": dict(model_type="marian", architectures=["MarianMTModel"],
                          vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
                          encoder_attention_heads=8, decoder_attention_heads=8,
                          encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                          activation_function="swish", max_position_embeddings=512,
                          scale_embedding=True, pad_token_id=58100, eos_token_id=0,
                          decoder_start_token_id=58100),
    "nllb-200-distilled-600M": dict(model_type="m2m_100",
                                    architectures=["M2M100ForConditionalGeneration"],
                                    vocab_size=256206, d_model=1024, encoder_layers=12,
                                    decoder_layers=12, encoder_attention_heads=16,
                                    decoder_attention_heads=16, encoder_ffn_dim=4096,
                                    decoder_ffn_dim=4096, max_position_embeddings=1024),
    "nllb-200-1.3B": dict(model_type="m2m_100", architectures=["M2M100ForConditionalGeneration"],
                          vocab_size=256206, d_model=1024, encoder_layers=24, decoder_layers=24,
                          encoder_attention_heads=16, decoder_attention_heads=16,
                          encoder_ffn_dim=8192, decoder_ffn_dim=8192,
                          max_position_embeddings=1024),
}


def settings(quick: bool) -> dict[str, Any]:
  if quick:
    return dict(train_presets=["tiny_transformer"], train_targets=["v5e-8"],
                sharding_presets=["tiny_transformer"], sharding_targets=["v5e:2x4"],
                shardings=["replicated", "fsdp"], published=["tiny-marian"],
                generate_rows=[8], methods=["greedy"], generate_target="v5e-1",
                source_len=16, choices=False, max_rows=64,
                int8=dict(published=["tiny-marian"], methods=["greedy"]))
  from seq2seq_jax.presets import PRESETS
  return dict(train_presets=[p for p in PRESETS if p != "tiny_transformer"],
              train_targets=list(TRAIN_TARGETS),
              sharding_presets=["wmt14_transformer_base", "wmt14_transformer_big"],
              sharding_targets=list(SHARDING_TARGETS), shardings=list(SHARDINGS),
              published=list(PUBLISHED), generate_rows=[32, 256], methods=["greedy", "beam"],
              generate_target="v5e-1", source_len=64, choices=True, max_rows=1 << 16,
              int8=dict(published=["opus-mt-de-en"], methods=["beam"]))


def _record(report, **labels) -> dict[str, Any]:
  record = dict(labels, **report.to_dict())
  record.pop("settings", None)
  record["settings"] = report.settings
  return record


class Results:
  """The records of ``--out``, keyed by their labels; written after each new one."""

  def __init__(self, path: pathlib.Path, redo: bool):
    self.path = path
    self.records: list[dict[str, Any]] = []
    if path.is_file() and not redo:
      saved = json.loads(path.read_text(encoding="utf-8"))
      self.records = saved.get("rows", saved.get("records", []))  # "records": before report()

  @staticmethod
  def key(labels: dict[str, Any]) -> str:
    return json.dumps(labels, sort_keys=True)

  def has(self, labels: dict[str, Any]) -> bool:
    return any(self.key({k: r.get(k) for k in labels}) == self.key(labels) for r in self.records)

  def add(self, record: dict[str, Any]) -> None:
    self.records.append(record)
    self.write()

  def payload(self) -> dict[str, Any]:
    return {"benchmark": "tpu_compile",
            "note": "compiler-derived estimates (libtpu on this CPU), not measurements",
            "rows": self.records}

  def write(self) -> None:
    from seq2seq_jax import benchmarking
    benchmarking.write_json(self.path, self.payload())


def plot_mfu(records: list[dict[str, Any]], path: pathlib.Path) -> None:
  """Estimated MFU of each preset's largest training batch, one panel per target."""
  from seq2seq_jax import benchmarking
  rows = [{"task": r["target"], "system": r["name"], "MFU %": 100 * (r["estimated_mfu"] or 0)}
          for r in records if r["section"] == "train" and r["variant"] == "largest batch"]
  if not rows:
    rows = [{"task": r["target"], "system": f"{r['name']} {r['variant']}",
             "MFU %": 100 * (r["estimated_mfu"] or 0)} for r in records]
  benchmarking.plot_rates_by_task(rows, path, rate_key="MFU %",
                                  xlabel=lambda task: "estimated MFU, %")


def _say(record: dict[str, Any]) -> None:
  total = record["per_chip_bytes"]["total"] / 2**30
  est, mfu = record["estimated_step_seconds"], record["estimated_mfu"]
  est_text = "-" if est is None else f"{est * 1e3:9.3f}"
  mfu_text = "-" if mfu is None else f"{100 * mfu:5.1f}"
  print(f"{record['section']:9s} {record['name']:28s} {record['variant']:18s} "
        f"{record['target']:9s} {record['rows']:6d} rows x {record['source_len']:3d}  "
        f"{total:7.2f} GiB  fits={str(record['fits']):5s} est {est_text} ms  MFU {mfu_text}% "
        f"({record['compile_seconds']:.0f} s)", flush=True)


def run_train(results: Results, s: dict[str, Any], tolerance: float) -> None:
  from seq2seq_jax import aot, presets
  for name in s["train_presets"]:
    config = presets.get_preset(name)
    for target in s["train_targets"]:
      labels = dict(section="train", name=name, variant="preset batch", target=target)
      if not results.has(labels):
        record = _record(aot.compile_report(config, target, "train"), **labels)
        results.add(record)
        _say(record)
      labels = dict(section="train", name=name, variant="largest batch", target=target)
      if not results.has(labels):
        best = aot.find_max_batch(config, target, "train", max_rows=s["max_rows"],
                                  tolerance=tolerance)
        record = _record(best, **labels)
        results.add(record)
        _say(record)


def run_sharding(results: Results, s: dict[str, Any]) -> None:
  from seq2seq_jax import aot, presets
  for name in s["sharding_presets"]:
    for target in s["sharding_targets"]:
      for variant in s["shardings"]:
        labels = dict(section="sharding", name=name, variant=variant, target=target)
        if results.has(labels):
          continue
        config = presets.apply_overrides(presets.get_preset(name), SHARDINGS[variant])
        record = _record(aot.compile_report(config, target, "train"), **labels)
        results.add(record)
        _say(record)


def _published_dir(root: pathlib.Path, name: str) -> pathlib.Path:
  directory = root / name
  directory.mkdir(parents=True, exist_ok=True)
  config = PUBLISHED.get(name) or dict(PUBLISHED["opus-mt-de-en"], vocab_size=1000, d_model=64,
                                        encoder_ffn_dim=128, decoder_ffn_dim=128,
                                        encoder_layers=2, decoder_layers=2,
                                        encoder_attention_heads=4, decoder_attention_heads=4,
                                        pad_token_id=999, decoder_start_token_id=999)
  (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
  return directory


def run_generate(results: Results, s: dict[str, Any]) -> None:
  from seq2seq_jax import aot, configs, pretrained, quantization
  from seq2seq_jax.models.registry import build_model
  runs = [(name, method, "none") for name in s["published"] for method in s["methods"]]
  runs += [(name, method, "int8") for name in s["int8"]["published"] if name in s["published"]
           for method in s["int8"]["methods"]]
  with tempfile.TemporaryDirectory() as tmp:
    for name, method, quantize in runs:
      model_config, _ = pretrained.load_config(_published_dir(pathlib.Path(tmp), name))
      model_config = dataclasses.replace(model_config, dtype="bfloat16")
      model = quantization.quantized_model(build_model(model_config), quantize)
      for rows in s["generate_rows"]:
        variant = f"{method} b{rows}" + ("" if quantize == "none" else f" {quantize}")
        labels = dict(section="generate", name=name, variant=variant,
                      target=s["generate_target"])
        if results.has(labels):
          continue
        limit = s["source_len"]
        config = configs.ExperimentConfig(
            model=model_config,
            data=configs.DataConfig(max_source_len=limit, max_target_len=limit,
                                    bucket_lengths=(limit,), batch_tokens=8 * limit),
            decode=configs.DecodeConfig(method=method, beam_size=4))
        report = aot.compile_report(config, s["generate_target"], "generate", rows=rows,
                                    length=limit, model=model)
        record = _record(report, **labels)
        results.add(record)
        _say(record)
        step = report.decode_step or {}
        if step:
          print(f"          decoding step: est {step['estimated_seconds'] * 1e3:.3f} ms, "
                f"HBM bound {step['hbm_bound_seconds'] * 1e3:.3f} ms "
                f"({step['estimate_over_bound']:.2f}x)", flush=True)


def run_choices(results: Results) -> None:
  """Each CPU-only choice forced on and off in programs compiled for v5e-1."""
  import jax
  import jax.numpy as jnp

  from seq2seq_jax import aot, configs, platforms, presets
  from seq2seq_jax.layers import dropout as dropout_lib

  target = "v5e-1"
  opus = configs.TransformerConfig(vocab_size=58101, model_dim=512, num_heads=8, mlp_dim=2048,
                                   activation="swish")
  base = presets.get_preset("multi30k_transformer")
  cpu_branch, other_branch = (lambda cpu, other, *args: cpu(*args),
                              lambda cpu, other, *args: other(*args))
  original_on_cpu = platforms.on_cpu
  for method, rows in (("greedy", 8), ("greedy", 32), ("beam", 8)):
    config = dataclasses.replace(base, model=opus,
                                 decode=dataclasses.replace(base.decode, method=method))
    for variant, choose in (("cpu choices", cpu_branch), ("plain", other_branch)):
      labels = dict(section="choices", name=f"opus-mt decode {method} {rows}", variant=variant,
                    target=target)
      if results.has(labels):
        continue
      platforms.on_cpu = choose  # every platform_dependent choice forced one way
      try:
        report = aot.compile_report(config, target, "generate", rows=rows, length=32)
      finally:
        platforms.on_cpu = original_on_cpu
      record = _record(report, **labels)
      results.add(record)
      _say(record)

  def threefry(rng, rate, shape):
    return jax.random.bernoulli(rng, 1.0 - rate, shape)

  def rbg(rng, rate, shape):
    key = jax.random.wrap_key_data(jax.random.bits(rng, (4,), jnp.uint32), impl="rbg")
    return jax.random.bernoulli(key, 1.0 - rate, shape)

  train = presets.apply_overrides(base, [
      "model.vocab_size=32000", "model.model_dim=512", "model.num_heads=8", "model.mlp_dim=2048",
      "model.num_encoder_layers=2", "model.num_decoder_layers=2", "model.dropout_rate=0.1",
      "model.attention_dropout_rate=0.1", "train.compute_dtype=bfloat16",
      "data.vocab_size=32000"])
  original_mask = dropout_lib.keep_mask
  for variant, mask in (("philox", dropout_lib.philox_keep_mask), ("threefry", threefry),
                        ("rbg", rbg)):
    labels = dict(section="choices", name="train 2+2 d512 dropout", variant=variant,
                  target=target)
    if results.has(labels):
      continue
    dropout_lib.keep_mask = mask
    try:
      report = aot.compile_report(train, target, "train", rows=128, length=64)
    finally:
      dropout_lib.keep_mask = original_mask
    record = _record(report, **labels)
    results.add(record)
    _say(record)


def main() -> None:
  from seq2seq_jax import benchmarking

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--sections", default="train,sharding,generate,choices")
  parser.add_argument("--tolerance", type=float, default=0.125,
                      help="largest batch to within this fraction (default %(default)s)")
  parser.add_argument("--redo", action="store_true", help="recompile what --out already holds")
  parser.add_argument("--names", default="",
                      help="only these presets and published models (comma-separated)")
  parser.add_argument("--targets", default="", help="only these targets (comma-separated)")
  parser.add_argument("--shardings", default="",
                      help=f"only these shardings (comma-separated; of {', '.join(SHARDINGS)})")
  args = benchmarking.parse_args(parser)
  s = settings(benchmarking.quick_mode())
  for flag, keys in ((args.names, ("train_presets", "sharding_presets", "published")),
                     (args.targets, ("train_targets", "sharding_targets")),
                     (args.shardings, ("shardings",))):
    wanted = [name.strip() for name in flag.split(",") if name.strip()]
    for key in keys if wanted else ():
      s[key] = [name for name in s[key] if name in wanted]
  results = Results(args.out, args.redo)
  start = time.perf_counter()
  sections = [name.strip() for name in args.sections.split(",") if name.strip()]
  for name in sections:
    if name == "train":
      run_train(results, s, args.tolerance)
    elif name == "sharding":
      run_sharding(results, s)
    elif name == "generate":
      run_generate(results, s)
    elif name == "choices":
      if s["choices"]:
        run_choices(results)
    else:
      sys.exit(f"unknown section {name!r}; known: train, sharding, generate, choices")
  print(f"{len(results.records)} records ({time.perf_counter() - start:.0f} s); "
        "compiler-derived estimates, not measurements")
  benchmarking.report(args, results.payload(), plot=plot_mfu)


if __name__ == "__main__":
  main()
