"""An OPUS-MT-sized MarianMT checkpoint in three runtimes, alternated in one run.

``seq2seq_jax.pretrained.fixtures.build_random_marian`` writes a ``save_pretrained``
directory of opus-mt-de-en's shape (6 + 6 layers, d 512, 8 heads, FFN 2048, Swish,
vocabulary 58,101; random weights). The same directory is loaded by
``seq2seq_jax.pretrained.load`` (JAX), by transformers (``MarianMTModel.generate``,
PyTorch float32) and converted by CTranslate2's own ``TransformersConverter``
(float32). Random weights give no natural end, so every system generates exactly
``output_len`` tokens (EOS suppressed: ``DecodeConfig.suppress_ids``,
``min_new_tokens``, ``min_decoding_length``); the greedy outputs of the three are
compared token by token first, then generated tokens/s are timed for greedy and
beam 4 at batch 32 and batch 1, systems alternated round by round, each with all
the machine's threads.

  python benchmarks/pretrained_opus_mt.py [--out FILE.json] [--plot FILE.png] [--rounds N]
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

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--rounds", type=int, default=None,
                      help="alternated rounds per task (default 3; 2 in quick mode)")
  args = benchmarking.parse_args(parser)
  s = settings(benchmarking.quick_mode())
  if args.rounds is not None:
    if args.rounds < 1:
      parser.error(f"--rounds must be at least 1; got {args.rounds}")
    s["rounds"] = args.rounds
  peers = benchmarking.import_peers(args.out, "pretrained_opus_mt")
  if peers is None:
    return
  ctranslate2, torch, transformers = peers
  import numpy as np  # noqa: PLC0415

  from seq2seq_jax import pretrained  # noqa: PLC0415
  from seq2seq_jax.configs import DecodeConfig  # noqa: PLC0415
  from seq2seq_jax.decoding import generate  # noqa: PLC0415
  from seq2seq_jax.pretrained import fixtures  # noqa: PLC0415

  threads = os.cpu_count() or 1
  out_len = s["output_len"]
  rows, agreement = [], {}
  with tempfile.TemporaryDirectory() as tmp:
    directory = pathlib.Path(tmp) / "opus-mt-sized"
    fixtures.build_random_marian(directory, **s["model"])
    checkpoint = pretrained.load(directory)
    config = checkpoint.config
    hf_model = transformers.MarianMTModel.from_pretrained(directory).eval()
    # No forced EOS at the limit (OPUS-MT's generation config has one): all run to out_len.
    hf_model.generation_config.forced_eos_token_id = None
    hf_model.generation_config.max_length = out_len + 1  # counts the decoder start
    ctranslate2.converters.TransformersConverter(str(directory)).convert(
        str(pathlib.Path(tmp) / "ct2"), force=True)
    ct2 = ctranslate2.Translator(str(pathlib.Path(tmp) / "ct2"), device="cpu", inter_threads=1,
                                 intra_threads=threads)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    token_of = {i: t for t, i in vocab.items()}
    rng = np.random.default_rng(0)
    for batch, count in s["sentences"].items():
      # Source ids: random ordinary pieces (never pad / eos / unk), real lengths, EOS last.
      lengths = rng.integers(*s["source_len"], size=count)
      sources = [list(rng.integers(2, config.vocab_size - 1, size=n - 1)) + [config.eos_id]
                 for n in lengths]
      groups = [sources[i:i + batch] for i in range(0, count, batch)]
      width = max(lengths)
      padded = [np.array([row + [config.pad_id] * (width - len(row)) for row in group], np.int32)
                for group in groups]
      torch_batches = [torch.from_numpy(b.astype(np.int64)) for b in padded]
      token_batches = [[[token_of[int(i)] for i in row] for row in group] for group in groups]
      for beams in (1, 4):
        decode = DecodeConfig(method="greedy" if beams == 1 else "beam", beam_size=beams,
                              alpha=0.0, max_decode_len=out_len,
                              suppress_ids=(config.eos_id,))

        def run_ours():
          return [generate(checkpoint.model, checkpoint.params, b, decode)[0] for b in padded]

        def run_hf():
          with torch.inference_mode():
            return [hf_model.generate(b, attention_mask=b != config.pad_id, num_beams=beams,
                                      do_sample=False, min_length=out_len + 1,
                                      length_penalty=0.0)
                    for b in torch_batches]

        def run_ct2():
          return [ct2.translate_batch(b, beam_size=beams, max_decoding_length=out_len,
                                      min_decoding_length=out_len, length_penalty=0.0,
                                      max_batch_size=batch) for b in token_batches]

        systems = {"seq2seq_jax": run_ours, "HF generate": run_hf, "CTranslate2": run_ct2}
        if beams == 1:  # the same weights give the same greedy tokens in every runtime
          # Agreement means nothing if the weights give NaN (every engine then agrees).
          with torch.inference_mode():
            logits = hf_model(input_ids=torch_batches[0],
                              attention_mask=torch_batches[0] != config.pad_id,
                              decoder_input_ids=torch_batches[0][:, :4]).logits
          if not torch.isfinite(logits).all():
            raise RuntimeError("the random checkpoint gives non-finite logits: agreement "
                               "between the runtimes would be vacuous")
          ours = np.concatenate([np.asarray(t) for t in run_ours()])
          hf = np.concatenate([t.numpy()[:, 1:] for t in run_hf()])
          ct = np.array([[vocab[t] for t in r.hypotheses[0]] for g in run_ct2() for r in g])
          agreement[f"batch{batch}"] = {
              "rows": len(ours), "HF identical rows": float((ours == hf).all(1).mean()),
              "CTranslate2 identical rows": float((ours == ct).all(1).mean()),
              "HF identical tokens": float((ours == hf).mean()),
              "CTranslate2 identical tokens": float((ours == ct).mean())}
        timings = benchmarking.time_interleaved(systems, rounds=s["rounds"])
        ours_rate = count * out_len / timings["seq2seq_jax"].median_s
        for name, timing in timings.items():
          rate = count * out_len / timing.median_s
          spread = [count * out_len / t for t in timing.times_s]
          rows.append({"task": f"{'greedy' if beams == 1 else 'beam4'} batch {batch}",
                       "system": name, "tokens/s": rate, "tokens/s min": min(spread),
                       "tokens/s max": max(spread), "ours/system": ours_rate / rate,
                       "timing": timing.to_dict()})
  print(f"model {s['model']}, {out_len} tokens per output, {threads} threads; torch "
        f"{torch.__version__}, transformers {transformers.__version__}, ctranslate2 "
        f"{ctranslate2.__version__}")
  print("greedy agreement:", json.dumps(agreement))
  print(benchmarking.format_table(rows, ["task", "system", "tokens/s", "tokens/s min",
                                         "tokens/s max", "ours/system"]))
  benchmarking.report(args, {
      "benchmark": "pretrained_opus_mt", "settings": {**s, "sentences": {str(k): v for k, v in
                                                                        s["sentences"].items()}},
      "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                   "ctranslate2": ctranslate2.__version__},
      "agreement": agreement, "rows": rows})


if __name__ == "__main__":
  main()
