"""XLA:CPU's own fast paths, measured on this CPU: which flags pay for decoding, float and int8.

Each flag set runs in fresh processes (XLA reads ``XLA_FLAGS`` when its CPU client
starts), the flag sets alternated round by round. A process times ``generate`` of a
random OPUS-MT-sized Transformer (6 + 6 layers, d 512, FFN 2048, 58,101 ids; ``--model
small`` for a quick look) over 32 sources of 24 tokens, greedy, 32 tokens each (EOS
suppressed), at batch 32 and batch 1, in float32, bfloat16 and int8 (``quantize="int8"``);
the median of its timings after a warm-up is its figure, and each flag set's figure is
the median over rounds, reported against the default flags of the same rounds. The
CPU's instruction set (``platforms.cpu_instruction_set``) and the load average are
recorded: ``seq2seq_jax.platforms.CPU_FLAGS`` keeps, per instruction set, only what paid
here.

  python benchmarks/cpu_flags.py [--out FILE.json] [--rounds N]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/cpu_flags.py   # tiny sizes, for CI
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Candidates: oneDNN for dots, and the YNNPACK / XNNPACK fusions that are off by default.
FLAG_SETS = {
    "default": "",
    "onednn": "--xla_cpu_use_onednn=true",
    "ynn dot+eltwise": "--xla_cpu_experimental_ynn_fusion_type=+dot,+eltwise",
    "ynn reduce": "--xla_cpu_experimental_ynn_fusion_type=+reduce",
    "xnn graph greedy": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
}

_PROBE = r"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
from seq2seq_jax import DecodeConfig, Transformer, TransformerConfig, generate, quantization
import dataclasses
size = json.loads(sys.argv[1])
config = TransformerConfig(vocab_size=size["vocab"], model_dim=size["dim"], num_heads=size["heads"],
                           mlp_dim=size["ffn"], num_encoder_layers=size["layers"],
                           num_decoder_layers=size["layers"], max_len=128, activation="swish")
model = Transformer(config)
ids = jnp.ones((1, 4), jnp.int32)
params = jax.jit(model.init)(jax.random.key(0), ids, ids)["params"]
variants = {"float32": (model, params),
            "bfloat16": (Transformer(dataclasses.replace(config, dtype="bfloat16")), params),
            "int8": quantization.quantize(model, params, "int8")}
rng = np.random.default_rng(0)
sources = rng.integers(4, config.vocab_size, size=(32, size["source_len"])).astype(np.int32)
sources[:, -1] = config.eos_id
decode = DecodeConfig(method="greedy", max_decode_len=size["output_len"],
                      suppress_ids=(config.eos_id,))
out = {}
for batch in (32, 1):
  inputs = jnp.asarray(sources[:batch])
  for name, (m, p) in variants.items():
    run = lambda: jax.block_until_ready(generate(m, p, inputs, decode))
    run()
    times = []
    for _ in range(size["repeats"]):
      start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
    out[f"{name} batch {batch}"] = batch * size["output_len"] / float(np.median(times))
print(json.dumps(out))
"""


def settings(quick: bool) -> dict:
  if quick:
    return dict(size=dict(vocab=300, dim=32, heads=2, ffn=64, layers=1, source_len=8,
                          output_len=6, repeats=1), rounds=1,
                flag_sets=["default", "onednn"])
  return dict(size=dict(vocab=58101, dim=512, heads=8, ffn=2048, layers=6, source_len=24,
                        output_len=32, repeats=3), rounds=3, flag_sets=list(FLAG_SETS))


def _probe(flags: str, size: dict) -> dict:
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(
      f for f in (env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8",
                                                   "").strip(), flags) if f)
  result = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(size)], env=env,
                          capture_output=True, text=True, check=False)
  if result.returncode:
    raise RuntimeError(f"probe with XLA_FLAGS={flags!r} failed:\n{result.stderr[-3000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
  import numpy as np  # noqa: PLC0415

  from seq2seq_jax import benchmarking, platforms  # noqa: PLC0415
  from seq2seq_jax import benchmark_runtimes as runtimes  # noqa: PLC0415

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument("--model", choices=("opus-mt", "small"), default="opus-mt")
  parser.add_argument("--flag-sets", default=None,
                      help="comma-separated names of FLAG_SETS to time (default: all); "
                           "'default' is always timed")
  args = benchmarking.parse_args(parser)
  s = settings(benchmarking.quick_mode())
  if args.flag_sets:
    chosen = [n.strip() for n in args.flag_sets.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(FLAG_SETS))
    if unknown:
      parser.error(f"--flag-sets: unknown {', '.join(unknown)}; known: {', '.join(FLAG_SETS)}")
    s = dict(s, flag_sets=["default"] + [n for n in chosen if n != "default"])
  if args.model == "small":
    s = dict(s, size=dict(s["size"], vocab=8000, dim=256, heads=4, ffn=1024, layers=3))
  rounds = args.rounds or s["rounds"]
  load_before = os.getloadavg()
  figures: dict[str, dict[str, list[float]]] = {name: {} for name in s["flag_sets"]}
  for r in range(rounds):
    names = s["flag_sets"][r % len(s["flag_sets"]):] + s["flag_sets"][:r % len(s["flag_sets"])]
    for name in names:
      for task, rate in _probe(FLAG_SETS[name], s["size"]).items():
        figures[name].setdefault(task, []).append(rate)
      print(f"round {r + 1}: {name} done", flush=True)
  rows = []
  for name, tasks in figures.items():
    for task, rates in tasks.items():
      default = float(np.median(figures["default"][task]))
      rows.append({"system": name, "task": task, "tokens/s": float(np.median(rates)),
                   "x default": float(np.median(rates)) / default, "rates": rates})
  print(f"{runtimes.describe_cpu()} (load before {'/'.join(f'{x:.2f}' for x in load_before)})")
  print(benchmarking.format_table(rows, ["task", "system", "tokens/s", "x default"]))
  benchmarking.report(args, {"benchmark": "cpu_flags", "settings": s, "flag_sets": FLAG_SETS,
                             "instruction_set": platforms.cpu_instruction_set(),
                             "load_before": load_before, "rows": rows})


if __name__ == "__main__":
  main()
