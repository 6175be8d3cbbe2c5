"""An OPUS-MT-sized MarianMT checkpoint in three runtimes, alternated in one run.

``seq2seq_jax.pretrained.fixtures.build_random_marian`` writes a ``save_pretrained``
directory of opus-mt-de-en's shape (6 + 6 layers, d 512, 8 heads, FFN 2048, Swish,
vocabulary 58,101; random weights). The same directory is loaded by
``seq2seq_jax.pretrained.load`` (JAX), by transformers (``MarianMTModel.generate``,
PyTorch float32) and converted by CTranslate2's own ``TransformersConverter``
(float32, and its ``int8`` and ``int8_float32`` compute types); this library also
runs in bfloat16, int8 (``quantize="int8"``) and int8 with bfloat16 compute. Random
weights give no natural end, so every system generates exactly ``output_len`` tokens
(EOS suppressed: ``DecodeConfig.suppress_ids``, ``min_new_tokens``,
``min_decoding_length``); the float32 greedy outputs of the three are compared token by
token first, then generated tokens/s are timed for greedy and beam 4 at batch 32 and
batch 1, systems alternated round by round, each with all the machine's threads
(``seq2seq_jax.benchmark_runtimes``). The CPU, its instruction set and the load average
are printed with the table and kept in the JSON.

  python benchmarks/pretrained_opus_mt.py [--out FILE.json] [--plot FILE.png] [--rounds N] [--skip-hf]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/pretrained_opus_mt.py   # tiny sizes, for CI
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile


def settings(quick: bool) -> dict:
  if quick:
    return dict(model=dict(vocab_size=1200, model_dim=32, layers=1, heads=2, ffn=64,
                           spm_vocab_size=500),
                sentences={32: 32, 1: 2}, source_len=(6, 12), output_len=8, rounds=2)
  return dict(model=dict(vocab_size=58101, model_dim=512, layers=6, heads=8, ffn=2048,
                         spm_vocab_size=8000),
              sentences={32: 64, 1: 4}, source_len=(10, 30), output_len=32, rounds=3)


def main() -> None:
  from seq2seq_jax import benchmarking  # noqa: PLC0415
  from seq2seq_jax import benchmark_runtimes as runtimes  # noqa: PLC0415
  from seq2seq_jax.pretrained import fixtures  # noqa: PLC0415

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--skip-hf", action="store_true",
                      help="time without transformers (the int8 comparison needs only CTranslate2)")
  started = runtimes.start(parser, "pretrained_opus_mt", settings(benchmarking.quick_mode()))
  if started is None:
    return
  args, s, (ctranslate2, torch, transformers) = started
  threads = os.cpu_count() or 1
  out_len = s["output_len"]
  with tempfile.TemporaryDirectory() as tmp:
    directory = pathlib.Path(tmp) / "opus-mt-sized"
    fixtures.build_random_marian(directory, **s["model"])
    loaded = runtimes.load_all(directory, pathlib.Path(tmp) / "ct2", ctranslate2=ctranslate2,
                               transformers=transformers, threads=threads)
    rows, by_batch = runtimes.compare_batches(loaded, s["sentences"], lengths=s["source_len"],
                                              output_len=out_len, rounds=s["rounds"],
                                              with_hf=not args.skip_hf)
    agreement = {f"batch{batch}": values for batch, values in by_batch.items()}
  print(f"model {s['model']}, {out_len} tokens per output, {threads} threads; torch "
        f"{torch.__version__}, transformers {transformers.__version__}, ctranslate2 "
        f"{ctranslate2.__version__}; {runtimes.describe_cpu()}")
  print("greedy agreement:", json.dumps(agreement))
  print(benchmarking.format_table(rows, ["task", "system", "tokens/s", "tokens/s min",
                                         "tokens/s max", "ours/system", "x CT2 int8"]))
  benchmarking.report(args, {
      "benchmark": "pretrained_opus_mt", "settings": {**s, "sentences": {str(k): v for k, v in
                                                                        s["sentences"].items()}},
      "versions": runtimes.versions(ctranslate2, torch, transformers),
      "agreement": agreement, "rows": rows})


if __name__ == "__main__":
  main()
