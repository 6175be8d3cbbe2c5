"""Training-step time against sequence length: the scan RNN against the Transformer.

The seeds' argument measured: a recurrent encoder-decoder must take its time steps
one after another (a ``lax.scan`` per direction and for the decoder), while the
Transformer's attention handles every position of a layer in one matmul. Both train
with the library's step on batches of 16 rows at source = target length 16 to 512,
timed alternately at each length.

  python benchmarks/rnn_vs_transformer.py [--out FILE.json] [--plot FILE.png]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/rnn_vs_transformer.py   # tiny sizes, for CI
"""

from __future__ import annotations

import pathlib

from seq2seq_jax import RNNConfig, TransformerConfig, benchmarking



def settings(quick: bool) -> dict:
  """Models, batch, lengths; tiny in quick mode."""
  if quick:
    return dict(models={
        "Transformer": TransformerConfig(vocab_size=500, model_dim=32, num_heads=2, mlp_dim=64,
                                         num_encoder_layers=1, num_decoder_layers=1, max_len=64),
        "RNN": RNNConfig(vocab_size=500, cell="gru", embed_dim=16, hidden_dim=32,
                         bidirectional=True, attention="additive", max_len=64)},
        batch=4, lengths=(8, 32), rounds=2)
  return dict(models={
      "Transformer": TransformerConfig(vocab_size=8000, model_dim=256, num_heads=4, mlp_dim=1024,
                                       num_encoder_layers=3, num_decoder_layers=3, max_len=512),
      "RNN": RNNConfig(vocab_size=8000, cell="gru", embed_dim=256, hidden_dim=512,
                       bidirectional=True, attention="additive", dropout_rate=0.3, max_len=512)},
      batch=16, lengths=(16, 32, 64, 128, 256, 512), rounds=3)


def plot(rows: list[dict], path: pathlib.Path) -> None:
  with benchmarking.saved_figure(path, columns=2, size=(10, 4)) as (left, right):
    for name, style in (("Transformer", "-o"), ("RNN", "--s")):
      points = [r for r in rows if r["model"] == name]
      lengths = [r["length"] for r in points]
      left.plot(lengths, [r["step_ms"] for r in points], style, label=name)
      right.plot(lengths, [r["tokens/s"] for r in points], style, label=name)
    for ax in (left, right):
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_xlabel("source = target length")
      ax.legend()
    left.set_ylabel("training step (ms)")
    left.set_title("step time against length")
    right.set_ylabel("target tokens / s")
    right.set_title("throughput against length")


def main() -> None:
  args = benchmarking.parse_args(benchmarking.argument_parser(__file__, __doc__))
  s = settings(benchmarking.quick_mode())
  rows = []
  for length in s["lengths"]:
    runners = {name: benchmarking.make_train_step_runner(
        config, batch_size=s["batch"], source_len=length, target_len=length)
        for name, config in s["models"].items()}
    timings = benchmarking.time_interleaved(runners, rounds=s["rounds"])
    for name, timing in timings.items():
      flops, _ = benchmarking.model_train_flops_per_token(
          runners[name], batch_size=s["batch"], source_len=length, target_len=length)
      tokens_per_s = runners[name].tokens / timing.median_s
      rows.append({"length": length, "model": name, "batch": s["batch"],
                   "step_ms": 1e3 * timing.median_s, "tokens/s": tokens_per_s,
                   "MFLOP/token": flops / 1e6, "GFLOP/s": flops * tokens_per_s / 1e9,
                   "compile_s": timing.first_s, "timing": timing.to_dict()})
    by_name = {r["model"]: r for r in rows[-len(timings):]}
    by_name["RNN"]["rnn/transformer"] = by_name["RNN"]["step_ms"] / by_name["Transformer"]["step_ms"]
    del runners  # frees the donated states before the next, longer length

  print(benchmarking.format_table(rows, ["length", "model", "batch", "step_ms", "tokens/s",
                                         "MFLOP/token", "GFLOP/s", "rnn/transformer",
                                         "compile_s"]))
  benchmarking.report(args, {
      "benchmark": "rnn_vs_transformer",
      "models": {name: config.__dict__ for name, config in s["models"].items()}, "rows": rows},
      plot=plot)


if __name__ == "__main__":
  main()
