"""File-to-file translation: seq2seq_jax's translate_file, CTranslate2's translate_file, an HF loop.

A 20,000-line file of Multi30k German training sentences is translated file to
file by (1) ``seq2seq_jax.inference.translate_file`` (windows sorted by length,
bucketed batches, one batch ahead of the host), (2) CTranslate2's
``Translator.translate_file`` (with the checkpoint's sentencepiece model and
detokenizer as its tokenize / detokenize functions) and (3) a plain Hugging Face loop (``MarianTokenizer``,
``generate``, ``batch_decode``, ``write``) over the same ``save_pretrained``
directory at the same batch size, alternated round by round. (4) The same
batches, tokenized, padded and placed beforehand, through the library's jitted
search one after the other (as ``decode_throughput.py`` times ``generate``): the
in-memory decoding rate the file path is compared with (the host pipeline must
not stall the device: file / in-memory >= 0.9).

Models: ``pretrained.fixtures.build_random_marian`` at T-small's size (3 + 3
layers, d 256, FFN 1024, vocabulary 8,000) and at OPUS-MT's (6 + 6, d 512, FFN
2048, vocabulary 58,101; a smaller file, it is 8x slower); random weights, so EOS
is suppressed and every system writes exactly ``--output-len`` tokens per line;
greedy search.

Memory: peak resident memory (``VmHWM`` of a child process, read by itself) of
``translate_file`` on a 200,000-line file against a 20,000-line one (the input
pipeline holds one window: flat, <= 1.2x), beside ``Translator.translate`` on
the whole file in memory, with a tiny model so that the input, not the model,
is what grows.

  python benchmarks/translate_file.py [--out FILE.json] [--plot FILE.png]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/translate_file.py   # tiny sizes, for CI
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE.parent.parent / "shared" / "data" / "multi30k" / "raw"
MODELS = {
    "T-small": dict(vocab_size=8000, model_dim=256, layers=3, heads=4, ffn=1024,
                    spm_vocab_size=4000),
    "OPUS-MT-sized": dict(vocab_size=58101, model_dim=512, layers=6, heads=8, ffn=2048,
                          spm_vocab_size=8000),
}
TINY = dict(vocab_size=1200, model_dim=32, layers=1, heads=2, ffn=64, spm_vocab_size=500)


def settings(quick: bool) -> dict:
  if quick:
    return dict(models={"T-small": TINY, "OPUS-MT-sized": TINY}, lines={"T-small": 96,
                                                                        "OPUS-MT-sized": 48},
                warmup_lines=32, output_len=6, batch=16, rounds=1,
                memory_lines=(400, 4000), window=200)
  return dict(models=MODELS, lines={"T-small": 20_000, "OPUS-MT-sized": 2_000},
              warmup_lines=1_000, output_len=16, batch=32, rounds=2,
              memory_lines=(20_000, 200_000), window=20_000)


# A child process: translate a file with the tiny model and report nothing but its exit status;
# the parent reads its peak resident memory from wait4.
_MEMORY_CHILD = """
import sys
from seq2seq_jax import pretrained
from seq2seq_jax.configs import DecodeConfig, TranslateFileConfig
from seq2seq_jax.inference import Translator, translate_file
model_dir, source, output, mode, window, out_len = sys.argv[1:7]
eos = pretrained.load(model_dir, with_tokenizer=False).config.eos_id
translator = Translator.from_pretrained(model_dir, batch_size=256, decode_config=DecodeConfig(
    max_decode_len=int(out_len), suppress_ids=(eos,)))
if mode == "file":
  translate_file(translator, source, output, overwrite=True,
                 config=TranslateFileConfig(window_lines=int(window), progress="none"))
else:
  lines = open(source, encoding="utf-8").read().splitlines()
  open(output, "w", encoding="utf-8").write("\\n".join(translator.translate(lines)) + "\\n")
# This process's peak resident set since it started (a forked parent's would count in
# getrusage's ru_maxrss).
print(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1])
"""


def peak_rss_mb(arguments: list[str]) -> float:
  """Peak resident memory (MB) of ``python -c _MEMORY_CHILD arguments``, run to the end."""
  done = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, *arguments], capture_output=True,
                        text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"memory child {arguments} failed:\n{done.stderr[-3000:]}")
  return int(done.stdout.split()[-1]) / 1024  # VmHWM is in KiB


def write_lines(path: pathlib.Path, lines: list[str], count: int) -> pathlib.Path:
  """``count`` lines: ``lines`` repeated as often as needed."""
  with open(path, "w", encoding="utf-8") as stream:
    for line in itertools.islice(itertools.cycle(lines), count):
      stream.write(line + "\n")
  return path


def main() -> None:
  from seq2seq_jax import benchmarking  # noqa: PLC0415
  from seq2seq_jax import benchmark_runtimes as runtimes  # noqa: PLC0415

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--corpus", type=pathlib.Path, default=CORPUS,
                      help="Multi30k raw folder (train.de, train.en; default: %(default)s)")
  started = runtimes.start(parser, "translate_file", settings(benchmarking.quick_mode()),
                           rounds_flag=False)
  if started is None:
    return
  args, s, (ctranslate2, torch, transformers) = started
  if not (args.corpus / "train.de").is_file():
    raise SystemExit(f"{args.corpus / 'train.de'} is missing: pass --corpus with the Multi30k "
                     "raw folder (see ../shared/data/README.md)")
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  import sentencepiece as spm  # noqa: PLC0415

  from seq2seq_jax import pretrained  # noqa: PLC0415
  from seq2seq_jax.configs import DecodeConfig, TranslateFileConfig  # noqa: PLC0415
  from seq2seq_jax.inference import Translator, translate_file  # noqa: PLC0415
  from seq2seq_jax.pretrained import fixtures  # noqa: PLC0415

  threads = os.cpu_count() or 1
  out_len, batch = s["output_len"], s["batch"]
  corpus = (args.corpus / "train.de").read_text(encoding="utf-8").splitlines()
  rows, agreement, memory = [], {}, {}
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    warmup_file = write_lines(tmp / "warmup.de", corpus, s["warmup_lines"])
    for label, sizes in s["models"].items():
      directory = tmp / label
      fixtures.build_random_marian(directory, data_dir=args.corpus, **sizes)
      source = write_lines(tmp / f"{label}.de", corpus, s["lines"][label])
      count = s["lines"][label]
      eos = pretrained.load(directory, with_tokenizer=False).config.eos_id
      decode = DecodeConfig(method="greedy", max_decode_len=out_len, suppress_ids=(eos,))
      translator = Translator.from_pretrained(directory, batch_size=batch, decode_config=decode)
      file_config = TranslateFileConfig(window_lines=s["window"], max_rows=batch,
                                        batch_tokens=batch * 256, progress="none")

      hf_tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
      hf_model = transformers.MarianMTModel.from_pretrained(directory).eval()
      hf_model.generation_config.forced_eos_token_id = None  # all run to out_len
      hf_model.generation_config.max_length = out_len + 1  # counts the decoder start
      ctranslate2.converters.TransformersConverter(str(directory)).convert(
          str(tmp / f"{label}-ct2"), force=True)
      ct2 = ctranslate2.Translator(str(tmp / f"{label}-ct2"), device="cpu", inter_threads=1,
                                   intra_threads=threads)
      source_sp = spm.SentencePieceProcessor(model_file=str(directory / "source.spm"))
      # CTranslate2 returns vocabulary tokens; the checkpoint's own tokenizer turns them into
      # text as it does ours (random weights emit vocab.json's filler tokens, which the
      # sentencepiece model alone does not know).
      vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))

      def ct2_detokenize(tokens, vocab=vocab):
        return translator.tokenizer.decode_batch([[vocab[t] for t in tokens]])[0]

      def ours(path, output):
        return translate_file(translator, path, output, config=file_config, overwrite=True)

      def ct2_file(path, output):
        return ct2.translate_file(
            str(path), str(output), max_batch_size=batch, batch_type="examples", beam_size=1,
            max_decoding_length=out_len, min_decoding_length=out_len,
            source_tokenize_fn=lambda text: source_sp.encode(text, out_type=str) + ["</s>"],
            target_detokenize_fn=ct2_detokenize)

      def hf_loop(path, output):
        with open(path, encoding="utf-8") as lines, open(output, "w", encoding="utf-8") as out:
          while chunk := [line.rstrip("\n") for line in itertools.islice(lines, batch)]:
            inputs = hf_tokenizer(chunk, return_tensors="pt", padding=True)
            with torch.inference_mode():
              tokens = hf_model.generate(**inputs, num_beams=1, do_sample=False,
                                         min_length=out_len + 1)
            out.write("\n".join(hf_tokenizer.batch_decode(tokens, skip_special_tokens=True))
                      + "\n")

      # The in-memory rate: the file's batches, tokenized, padded and placed beforehand,
      # through the same jitted search; only device work is timed.
      def placed_batches(path):
        lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
        encoded = translator.encode(lines)
        plan = translator.plan([len(ids) for ids in encoded], max_rows=batch,
                               batch_tokens=file_config.batch_tokens,
                               row_multiple=file_config.row_multiple)
        return [translator.place_batch(encoded, b) for b in plan]

      search = translator.search(translator.resolve_decode_config())
      rng = jax.random.key(0)  # greedy: unused

      def in_memory(batches):
        return [search(translator.params, b, rng) for b in batches]

      full_batches = placed_batches(source)
      # One batch of each shape the file's plan uses: the in-memory warm-up (first) then
      # compiles every program the file path runs too, so no round compiles.
      one_per_shape = list({b.shape: b for b in full_batches}.values())
      outputs = {name: tmp / f"{label}-{name}.en" for name in ("ours", "ct2", "hf")}
      systems = {
          "seq2seq_jax in-memory": lambda: in_memory(full_batches),
          "seq2seq_jax translate_file": lambda: ours(source, outputs["ours"]),
          "CTranslate2 translate_file": lambda: ct2_file(source, outputs["ct2"]),
          "HF generate loop": lambda: hf_loop(source, outputs["hf"]),
      }
      warmups = {
          "seq2seq_jax in-memory": lambda: in_memory(one_per_shape),
          "seq2seq_jax translate_file": lambda: ours(warmup_file, tmp / "w-ours.en"),
          "CTranslate2 translate_file": lambda: ct2_file(warmup_file, tmp / "w-ct2.en"),
          "HF generate loop": lambda: hf_loop(warmup_file, tmp / "w-hf.en"),
      }
      timings = benchmarking.time_interleaved(systems, rounds=s["rounds"], warmup_fns=warmups)
      ours_rate = count / timings["seq2seq_jax translate_file"].median_s
      for name, timing in timings.items():
        rate = count / timing.median_s
        spread = [count / t for t in timing.times_s]
        rows.append({"task": label, "system": name, "lines": count, "sentences/s": rate,
                     "sentences/s min": min(spread), "sentences/s max": max(spread),
                     "tokens/s": rate * out_len, "ours/system": ours_rate / rate,
                     "timing": timing.to_dict()})
      texts = {name: path.read_text(encoding="utf-8").splitlines()
               for name, path in outputs.items()}
      assert all(len(t) == count for t in texts.values()), {k: len(t) for k, t in texts.items()}
      agreement[label] = {f"{name} identical lines": float(np.mean(
          [a == b for a, b in zip(texts["ours"], texts[name])])) for name in ("ct2", "hf")}

    # Peak memory: the input pipeline on 10x the lines, with the tiny model.
    directory = tmp / "tiny"
    fixtures.build_random_marian(directory, data_dir=args.corpus, **TINY)
    for lines in s["memory_lines"]:
      path = write_lines(tmp / f"memory-{lines}.de", corpus, lines)
      for mode in ("file", "in-memory"):
        memory[f"{mode} {lines}"] = peak_rss_mb([str(directory), str(path),
                                                 str(tmp / "memory.en"), mode,
                                                 str(s["window"]), "4"])
  small, large = s["memory_lines"]
  ratios = {
      "file / in-memory rate": {
          label: next(r["sentences/s"] for r in rows if r["task"] == label
                      and r["system"] == "seq2seq_jax translate_file")
          / next(r["sentences/s"] for r in rows if r["task"] == label
                 and r["system"] == "seq2seq_jax in-memory") for label in s["models"]},
      "peak RSS, translate_file": memory[f"file {large}"] / memory[f"file {small}"],
      "peak RSS, Translator.translate in memory": (memory[f"in-memory {large}"]
                                                   / memory[f"in-memory {small}"]),
  }
  print(f"{out_len} tokens per line, batch {batch}, greedy, {threads} threads; torch "
        f"{torch.__version__}, transformers {transformers.__version__}, ctranslate2 "
        f"{ctranslate2.__version__}")
  print(benchmarking.format_table(rows, ["task", "system", "lines", "sentences/s",
                                         "sentences/s min", "sentences/s max", "tokens/s",
                                         "ours/system"]))
  print("identical output lines:", json.dumps(agreement))
  print("peak resident memory (MB):", json.dumps({k: round(v) for k, v in memory.items()}))
  print("ratios:", json.dumps(ratios, indent=1))
  benchmarking.report(args, {
      "benchmark": "translate_file", "settings": s, "rows": rows, "agreement": agreement,
      "peak_rss_mb": memory, "ratios": ratios,
      "versions": runtimes.versions(ctranslate2, torch, transformers)},
      plot=functools.partial(benchmarking.plot_rates_by_task, rate_key="sentences/s",
                             xlabel=lambda task: "sentences / s, file to file"))


if __name__ == "__main__":
  main()
