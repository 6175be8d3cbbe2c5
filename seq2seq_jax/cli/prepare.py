"""Prepares a corpus once into the data dir; training and evaluation read it from there. With
``--tokenizer`` it also writes the training split as token ids (ArrayRecord shards and a lengths
index, ``seq2seq_jax.data.prepared``), which every training start then reads instead of text;
the tokenizer file is loaded when it exists, else trained on the training split and saved.
With ``--beam`` an Apache Beam pipeline writes those ids (``seq2seq_jax.data.beam``; the runner
and its settings from ``--beam-options``).
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import time

from seq2seq_jax.cli import flags
from seq2seq_jax.configs import DataConfig

HELP = "download (or read), check and prepare a corpus as array_record files, and its token ids"


def add_arguments(parser: argparse.ArgumentParser) -> None:
  flags.add_data_flags(parser)
  parser.add_argument("--train-files", default="", metavar="GLOB",
                      help="the training split from your own text shards, '{lang}' for the "
                           "language code, e.g. 'corpus/train-*.{lang}.gz' (DataConfig.train_files)")
  parser.add_argument("--empty-lines", choices=("refuse", "drop"), default="refuse",
                      help="a training pair with an empty side: an error, or dropped and counted")
  parser.add_argument("--tokenizer", default="", metavar="PATH",
                      help="the run's sentencepiece vocabulary (e.g. runs/NAME/tokenizer.model): "
                           "loaded when the file exists, else trained on the training split and "
                           "saved there; then the training split is written as token ids")
  parser.add_argument("--vocab-size", type=int, default=DataConfig().vocab_size,
                      help="size of that vocabulary (default: %(default)s)")
  parser.add_argument("--beam", action="store_true",
                      help="write the token ids with an Apache Beam pipeline (seq2seq_jax.data.beam;"
                           ' needs pip install "seq2seq-jax[beam]") into the same folder')
  parser.add_argument("--beam-options", default="", metavar="FLAGS",
                      help="Beam's pipeline options as one string, e.g. '--runner=DataflowRunner "
                           "--project=P --region=R --temp_location=gs://B/tmp' (implies --beam; "
                           "default: DirectRunner here)")


def _prepare_ids_with_beam(data_config: DataConfig, vocab, options: str):
  """``--beam``: the ids written by ``seq2seq_jax.data.beam.run_prepare`` with ``options``."""
  try:
    from seq2seq_jax.data import beam
  except ImportError as e:  # the extra is not installed: one error line, not a traceback
    raise ValueError(str(e)) from e
  return beam.run_prepare(data_config, vocab, pipeline_options=shlex.split(options))


def run(args: argparse.Namespace) -> int:
  from seq2seq_jax.data import builders, tokenizer  # tfds is slow to import: only when needed

  from seq2seq_jax.data import prepared

  if (args.beam or args.beam_options) and not args.tokenizer:
    raise ValueError("--beam writes token ids: give --tokenizer PATH (the vocabulary they use)")
  data_config = flags.data_config(args, vocab_size=args.vocab_size, train_files=args.train_files,
                                  empty_lines=args.empty_lines)
  if not data_config.train_files or data_config.manual_dir or data_config.dataset != "multi30k":
    start = time.perf_counter()
    builder = builders.prepare_dataset(data_config)
    print(f"prepared {data_config.dataset} ({data_config.source_lang}-{data_config.target_lang}) "
          f"in {builder.data_dir} ({time.perf_counter() - start:.1f} s)")
    for name, split in sorted(builder.info.splits.items()):
      print(f"  {name}: {split.num_examples} pairs")
  if args.tokenizer:
    start = time.perf_counter()
    existed = pathlib.Path(args.tokenizer).expanduser().is_file()
    vocab = tokenizer.load_or_train_tokenizer(data_config, args.tokenizer)
    print(f"{'loaded' if existed else 'trained'} a {vocab.vocab_size}-piece vocabulary "
          f"({args.tokenizer}, {time.perf_counter() - start:.1f} s)")
    start = time.perf_counter()
    if args.beam or args.beam_options:
      ids = _prepare_ids_with_beam(data_config, vocab, args.beam_options)
    else:
      ids = prepared.prepare_ids(data_config, vocab)
    print(f"token ids of {data_config.train_split}: {len(ids)} pairs, "
          f"{sum(ids.meta['num_tokens'])} tokens in {ids.directory} "
          f"({time.perf_counter() - start:.1f} s)")
  return 0
