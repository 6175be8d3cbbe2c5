"""Prepares a corpus once into the data dir; training and evaluation read it from there. Optionally
trains the sentencepiece vocabulary too.
"""

from __future__ import annotations

import argparse
import time

from seq2seq_jax.cli import flags
from seq2seq_jax.configs import DataConfig

HELP = "download (or read), check and prepare a corpus as array_record files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
  flags.add_data_flags(parser)
  parser.add_argument("--tokenizer", default="", metavar="PATH",
                      help="also train a sentencepiece vocabulary on the training split and save "
                           "it here (e.g. runs/NAME/tokenizer.model)")
  parser.add_argument("--vocab-size", type=int, default=DataConfig().vocab_size,
                      help="size of that vocabulary (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
  from seq2seq_jax.data import builders, tokenizer  # tfds is slow to import: only when needed

  data_config = flags.data_config(args, vocab_size=args.vocab_size)
  start = time.perf_counter()
  builder = builders.prepare_dataset(data_config)
  print(f"prepared {data_config.dataset} ({data_config.source_lang}-{data_config.target_lang}) "
        f"in {builder.data_dir} ({time.perf_counter() - start:.1f} s)")
  for name, split in sorted(builder.info.splits.items()):
    print(f"  {name}: {split.num_examples} pairs")
  if args.tokenizer:
    start = time.perf_counter()
    vocab = tokenizer.train_tokenizer(data_config)
    vocab.save(args.tokenizer)
    print(f"trained a {vocab.vocab_size}-piece vocabulary on {data_config.train_split}, saved to "
          f"{args.tokenizer} ({time.perf_counter() - start:.1f} s)")
  return 0
