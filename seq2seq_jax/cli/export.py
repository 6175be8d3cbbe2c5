"""Writes one file holding the model's encode + search as StableHLO (jax.export) for a fixed set of
batch shapes, its parameters and its tokenizer.
seq2seq_jax.serving.load_exported(FILE).translate(sentences) runs it without the model's Python
code, on any of --platforms.
"""

from __future__ import annotations

import argparse

from seq2seq_jax.cli import flags

HELP = "serialize encode + search with jax.export for CPU, CUDA and TPU"


def add_arguments(parser: argparse.ArgumentParser) -> None:
  flags.add_search_flags(parser)
  parser.add_argument("--out", required=True, metavar="FILE", help="the artifact to write")
  parser.add_argument("--platforms", default="cpu,cuda,tpu",
                      help="comma-separated jax.export platforms: cpu, cuda, rocm, tpu "
                           "(default: %(default)s)")
  parser.add_argument("--bucket-lengths", default=None, metavar="L1,L2,...",
                      help="padded source lengths to export (default: the run's buckets)")


def run(args: argparse.Namespace) -> int:
  from seq2seq_jax.inference import exported
  translator = flags.translator(args)
  lengths = None
  if args.bucket_lengths:
    try:
      lengths = tuple(int(x) for x in args.bucket_lengths.split(",") if x.strip())
    except ValueError:
      raise ValueError(f"--bucket-lengths {args.bucket_lengths!r}: expected comma-separated "
                       "integers, e.g. 16,32,64") from None
  platforms = tuple(p.strip() for p in args.platforms.split(",") if p.strip())
  info = exported.export_translator(
      translator, args.out, platforms=platforms, bucket_lengths=lengths,
      beam_size=args.beam_size, alpha=args.alpha, method=args.method,
      max_decode_len=args.max_decode_len, source_lang=args.source_lang,
      target_lang=args.target_lang, **flags.decode_options(args))
  print(f"wrote {args.out} ({info.bytes / 2**20:.1f} MiB): {info.method} for "
        f"{', '.join(info.platforms)}, batch shapes "
        f"{', '.join(f'{r}x{l}' for r, l in info.shapes)}")
  return 0
