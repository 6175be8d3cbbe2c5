"""Decoding throughput: sentences/s and tokens/s, cached ``generate`` against ``generate_uncached``.

T-small with random weights wrapped in ``SuppressEOS``, so every output runs to the
forced length (16, 64 and 256 tokens): greedy and beam 4, the KV-cached decoder
against the reference that re-runs the whole decoder every step, timed alternately
in one run at the same batch. The uncached decoder's cost grows with the square
of the length, so long outputs run small batches and its beam search runs only at
16 tokens: the script then finishes in minutes on two cores.

  python benchmarks/decode_throughput.py [--out FILE.json] [--plot FILE.png]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/decode_throughput.py   # tiny sizes, for CI
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax import DecodeConfig, TransformerConfig, benchmarking, build_model
from seq2seq_jax.decoding import generate, generate_uncached



def settings(quick: bool) -> dict:
  """Model, batch and lengths; tiny in quick mode."""
  if quick:
    return dict(config=TransformerConfig(vocab_size=500, model_dim=32, num_heads=2, mlp_dim=64,
                                         num_encoder_layers=1, num_decoder_layers=1, max_len=64),
                source_len=8, lengths=(8, 16), batch={8: 4, 16: 2}, rounds=2,
                uncached_beam_max=8)
  return dict(config=TransformerConfig(vocab_size=8000, model_dim=256, num_heads=4, mlp_dim=1024,
                                       num_encoder_layers=3, num_decoder_layers=3, max_len=256),
              source_len=20, lengths=(16, 64, 256), batch={16: 32, 64: 8, 256: 2}, rounds=2,
              uncached_beam_max=16)


def main() -> None:
  args = benchmarking.parse_args(benchmarking.argument_parser(__file__, __doc__))
  s = settings(benchmarking.quick_mode())
  config = s["config"]
  model = benchmarking.SuppressEOS(build_model(config))
  params = {"model": build_model(config).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32),
                                              jnp.ones((1, 3), jnp.int32))["params"]}
  sources = benchmarking.synthetic_sources(np.random.default_rng(0),
                                           num_sentences=max(s["batch"].values()),
                                           source_len=s["source_len"],
                                           vocab_size=config.vocab_size)
  rows = []
  for length in s["lengths"]:
    for method in ("greedy", "beam"):
      decode_config = DecodeConfig(method=method, beam_size=4, max_decode_len=length)
      # Both decoders at the same batch; the uncached one gets small batches at long
      # lengths (its cost grows with length squared) and beam search only when short.
      batches = {"cached": s["batch"][length]}
      if method == "greedy" or length <= s["uncached_beam_max"]:
        batches["uncached"] = s["batch"][length]
      decoders = {"cached": generate, "uncached": generate_uncached}
      fns = {name: (lambda fn=decoders[name], src=sources[:rows_]: fn(model, params, src,
                                                                      decode_config))
             for name, rows_ in batches.items()}
      timings = benchmarking.time_interleaved(fns, rounds=s["rounds"])
      tokens, _ = generate(model, params, sources[:1], decode_config)
      assert tokens.shape == (1, length) and not np.any(np.asarray(tokens) == 2)
      label = "greedy" if method == "greedy" else "beam4"
      for name, timing in timings.items():
        sentences_per_s = batches[name] / timing.median_s
        rows.append({"length": length, "method": label, "decoder": name,
                     "batch": batches[name], "sentences/s": sentences_per_s,
                     "tokens/s": sentences_per_s * length, "median_s": timing.median_s,
                     "compile_s": timing.first_s, "timing": timing.to_dict()})
      if "uncached" in timings:
        cached, uncached = rows[-2], rows[-1]
        cached["speedup"] = cached["tokens/s"] / uncached["tokens/s"]

  print(f"{type(model.model).__name__} d={config.model_dim} "
        f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, vocab "
        f"{config.vocab_size}, sources of {s['source_len']} tokens, EOS suppressed")
  print(benchmarking.format_table(rows, ["length", "method", "decoder", "batch", "sentences/s",
                                         "tokens/s", "speedup", "median_s", "compile_s"]))
  benchmarking.report(args, {"benchmark": "decode_throughput", "model": config.__dict__,
                             "rows": rows}, plot=plot)


def plot(rows: list[dict], path: pathlib.Path) -> None:
  with benchmarking.saved_figure(path) as (ax,):
    for method in ("greedy", "beam4"):
      for decoder, style in (("cached", "-o"), ("uncached", "--s")):
        points = [(r["length"], r["tokens/s"]) for r in rows
                  if r["method"] == method and r["decoder"] == decoder]
        if points:
          ax.plot(*zip(*points), style, label=f"{method} {decoder}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("output tokens per sentence")
    ax.set_ylabel("generated tokens / s")
    ax.set_title("cached vs uncached decoding")
    ax.legend()


if __name__ == "__main__":
  main()
