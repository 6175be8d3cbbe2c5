"""Runs the real TPU compiler (libtpu, which needs no TPU: pip install 'jax[tpu]') on the library's
programs for an abstract TPU slice, from shapes alone, and prints per chip the bytes of
arguments, temporaries and outputs, whether they fit the chip's HBM, the compiler's FLOPs and
bytes accessed, and estimated step times and MFUs: a roofline against the chip's published peak
and bandwidth, and the compiler's own cycle estimate, the one to plan with (published training
steps of the Transformer big, einsum attention, took as a multiple of it TPU v3: 0.57-1.38x (5
runs, 4 programs, 4 upper bounds); TPU v4: 0.39-0.54x (3 runs, 2 programs, 3 upper bounds),
the lowest and highest of those runs; v5e, v5p and v6e: not measured, no range).
Compiler-derived estimates, not measurements. Exit status 1 when a program does not fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

from seq2seq_jax.cli import flags

HELP = "compile programs for a TPU slice without one: memory, FLOPs, fit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--target", required=True, metavar="TPU",
                      help="CHIP:TOPOLOGY (v5e:2x4, v4:2x2x1, v5p:2x2x1, v6e:2x2, v3:4x4) or a Cloud "
                           "TPU type (v5e-8, v4-8, v3-8, v5e-1, v6e-1)")
  model = parser.add_mutually_exclusive_group()
  flags.add_preset_flag(model, "a named config (default: multi30k_transformer)")
  model.add_argument("--pretrained", metavar="DIR",
                     help="a published checkpoint's directory; only its config.json (and "
                          "generation_config.json) is read")
  model.add_argument("--config", metavar="FILE",
                     help="an experiment config JSON, e.g. a training run's config.json")
  parser.add_argument("--program", default="train", metavar="NAMES",
                      help="train, eval, generate or score; several separated by commas "
                           "(default: %(default)s)")
  flags.add_set_flag(parser, "change one config field (repeatable), e.g. "
                             "train.parameter_sharding=fsdp, train.model_parallelism=2, "
                             "train.compute_dtype=bfloat16, decode.method=beam")
  parser.add_argument("--batch", type=int, default=None, metavar="ROWS",
                      help="global batch rows (default: the run's own batch)")
  parser.add_argument("--length", type=int, default=None, metavar="TOKENS",
                      help="padded sequence length (default: the longest training bucket, "
                           "with data.packing the largest bucket; generate and score: the "
                           "source limit)")
  parser.add_argument("--max-batch", action="store_true",
                      help="also find the largest batch that fits: a line through the memory of two "
                           "compiles, confirmed by a third")
  parser.add_argument("--max-batch-method", choices=("predict", "bisect"), default="predict",
                      help="predict: at most three compiles, a lower bound where the compiler "
                           "rematerializes near the limit (the report says so); bisect: the "
                           "largest batch, 10-15 compiles")
  parser.add_argument("--json", default=None, metavar="FILE",
                      help="write the reports as JSON: one object, or a list for several")


def compile_config(args: argparse.Namespace):
  """The experiment ``compile`` reports on: a pretrained model's, a config file or a preset."""
  from seq2seq_jax import configs
  base = None
  if args.pretrained:
    from seq2seq_jax import pretrained
    model_config, search = pretrained.load_config(args.pretrained)
    limit = min(model_config.max_len, 256)
    buckets = tuple(b for b in (16, 32, 64, 128) if b < limit) + (limit,)
    base = configs.ExperimentConfig(
        model=model_config,
        data=configs.DataConfig(max_source_len=limit, max_target_len=limit,
                                bucket_lengths=buckets, batch_tokens=max(8192, 8 * limit)),
        decode=dataclasses.replace(search, max_decode_len=0))
  elif args.config:
    base = flags.read_config(pathlib.Path(args.config))
  return flags.experiment_config(base, args)


def run(args: argparse.Namespace) -> int:
  from seq2seq_jax import aot

  target = aot.parse_target(args.target)  # an unknown target fails before any work
  config = compile_config(args)
  names = [name.strip() for name in args.program.split(",") if name.strip()]
  unknown = [name for name in names if name not in aot.PROGRAMS]
  if unknown or not names:
    raise ValueError(f"--program {args.program!r}: known programs are "
                     f"{', '.join(aot.PROGRAMS)}")
  reports = []
  for name in names:
    report = aot.compile_report(config, target, name, rows=args.batch, length=args.length)
    reports.append(report)
    if args.max_batch:
      reports.append(aot.find_max_batch(config, target, name, length=args.length,
                                        start_rows=args.batch, first=report,
                                        method=args.max_batch_method))
  print(aot.format_table(reports))
  for report in reports:
    if report.max_batch_probes:
      print(f"largest {report.program} batch that fits on {report.target}: {report.rows} rows "
            f"({len(report.max_batch_probes)} compiles: {report.max_batch_method})")
  if args.json:
    records = [r.to_dict() for r in reports]
    pathlib.Path(args.json).write_text(
        json.dumps(records[0] if len(records) == 1 else records, indent=2) + "\n",
        encoding="utf-8")
  return 0 if all(r.fits for r in reports if not r.max_batch_probes) else 1
