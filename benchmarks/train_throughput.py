"""Training throughput: target tokens/s and model FLOP utilisation of the library's train step.

Models: T-small (3+3 layers, d 256, 4 heads, FFN 1024, vocab 8000), T-base (6+6, d 512,
8 heads, FFN 2048, vocab 32000) and the RNN with attention (the multi30k_rnn_attention
preset: bidirectional GRU, additive attention), each on full batches of 64 x 24
tokens. FLOPs per token come from the config (Transformer) or the step's jaxpr
(RNN); utilisation divides the achieved rate by the float32 matmul peak that XLA
reaches on this machine, measured here before and after the models.

  python benchmarks/train_throughput.py [--out FILE.json] [--plot FILE.png]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/train_throughput.py   # tiny sizes, for CI
"""

from __future__ import annotations

import pathlib

from seq2seq_jax import RNNConfig, TransformerConfig, benchmarking



def workloads(quick: bool) -> list[dict]:
  """(name, model config, batch, length) rows; tiny ones in quick mode."""
  if quick:
    tiny = dict(vocab_size=500, model_dim=32, num_heads=2, mlp_dim=64, num_encoder_layers=1,
                num_decoder_layers=1)
    return [
        dict(name="T-tiny", config=TransformerConfig(**tiny), batch=8, length=8),
        dict(name="RNN-tiny", config=RNNConfig(vocab_size=500, cell="gru", embed_dim=16,
                                               hidden_dim=32, bidirectional=True,
                                               attention="additive"), batch=8, length=8),
    ]
  return [
      dict(name="T-small", config=TransformerConfig(
          vocab_size=8000, model_dim=256, num_heads=4, mlp_dim=1024, num_encoder_layers=3,
          num_decoder_layers=3), batch=64, length=24),
      dict(name="T-base", config=TransformerConfig(vocab_size=32000), batch=64, length=24),
      dict(name="RNN-attention", config=RNNConfig(
          vocab_size=8000, cell="gru", embed_dim=256, hidden_dim=512, bidirectional=True,
          attention="additive", dropout_rate=0.3), batch=64, length=24),
  ]


def measure(workload: dict, *, repeats: int, peak: float) -> dict:
  """Times the library's jitted, donated train step on one device; returns one table row."""
  config, batch, length = workload["config"], workload["batch"], workload["length"]
  runner = benchmarking.make_train_step_runner(config, batch_size=batch, source_len=length,
                                               target_len=length)
  flops, counted = benchmarking.model_train_flops_per_token(
      runner, batch_size=batch, source_len=length, target_len=length)
  timing = benchmarking.time_fn(runner, repeats=repeats, warmup=2)
  tokens_per_s = runner.tokens / timing.median_s
  return {"model": workload["name"], "batch": batch, "length": length,
          "step_ms": 1e3 * timing.median_s, "tokens/s": tokens_per_s,
          "MFLOP/token": flops / 1e6, "GFLOP/s": flops * tokens_per_s / 1e9,
          "MFU": flops * tokens_per_s / peak, "compile_s": timing.first_s,
          "flops_from": counted, "timing": timing.to_dict()}


def plot(rows: list[dict], path: pathlib.Path, peak: float) -> None:
  with benchmarking.saved_figure(path, columns=2, size=(9, 3.5)) as (left, right):
    names = [r["model"] for r in rows]
    left.bar(names, [r["tokens/s"] for r in rows], color="tab:blue")
    left.set_ylabel("target tokens / s")
    left.set_title("training throughput")
    right.bar(names, [100 * r["MFU"] for r in rows], color="tab:orange")
    right.set_ylabel(f"% of matmul peak ({peak / 1e9:.0f} GFLOP/s)")
    right.set_title("model FLOP utilisation")


def main() -> None:
  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--repeats", type=int, default=None)
  args = benchmarking.parse_args(parser)
  quick = benchmarking.quick_mode()
  repeats = args.repeats or (2 if quick else 7)
  peak_size = 256 if quick else 2048

  peak_before = benchmarking.measure_matmul_peak(size=peak_size, repeats=3 if quick else 5)
  rows = [measure(w, repeats=repeats, peak=peak_before) for w in workloads(quick)]
  peak_after = benchmarking.measure_matmul_peak(size=peak_size, repeats=3 if quick else 5)
  peak = max(peak_before, peak_after)
  for row in rows:  # against the better of the two peak measurements
    row["MFU"] = row["GFLOP/s"] * 1e9 / peak

  print(f"float32 matmul peak measured with XLA: {peak / 1e9:.1f} GFLOP/s "
        f"(before {peak_before / 1e9:.1f}, after {peak_after / 1e9:.1f})")
  print(benchmarking.format_table(rows, ["model", "batch", "length", "step_ms", "tokens/s",
                                         "MFLOP/token", "GFLOP/s", "MFU", "compile_s",
                                         "flops_from"]))
  benchmarking.report(args, {
      "benchmark": "train_throughput", "peak_flops": peak, "peak_before": peak_before,
      "peak_after": peak_after, "rows": rows}, plot=lambda rows, path: plot(rows, path, peak))


if __name__ == "__main__":
  main()
