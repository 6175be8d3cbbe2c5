"""The ``seq2seq-jax`` command line: one subcommand per task (``prepare`` for now).

Flags become configs here and nowhere else. Each subcommand is a function
``run_NAME(args) -> exit status`` registered by ``_add_NAME(subparsers)``; add
``train`` / ``evaluate`` / ``translate`` the same way.

Example:
  seq2seq-jax prepare --dataset multi30k --manual-dir ../shared/data/multi30k/raw
  seq2seq-jax prepare --dataset multi30k  # downloads the official files
  seq2seq-jax prepare --dataset parallel_text --manual-dir my_corpus --source-lang de \\
      --target-lang en --tokenizer runs/x/tokenizer.model --vocab-size 8000
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from seq2seq_jax.configs import DataConfig


def _add_data_flags(parser: argparse.ArgumentParser) -> None:
  """Flags of ``DataConfig`` that say which corpus; shared by the data-reading subcommands."""
  defaults = DataConfig()
  parser.add_argument("--dataset", default=defaults.dataset,
                      help="'multi30k', 'parallel_text' or 'tfds:NAME' (default: %(default)s)")
  parser.add_argument("--manual-dir", default=defaults.manual_dir, metavar="PATH",
                      help="local copy of the corpus: a folder of {split}.{lang} files, plain or "
                           ".gz (multi30k: downloaded when omitted)")
  parser.add_argument("--data-dir", default=defaults.data_dir, metavar="DIR",
                      help="where prepared data is kept (default: ~/.cache/seq2seq_jax/tfds)")
  parser.add_argument("--source-lang", default=defaults.source_lang)
  parser.add_argument("--target-lang", default=defaults.target_lang)


def _data_config(args: argparse.Namespace, **overrides) -> DataConfig:
  return DataConfig(dataset=args.dataset, manual_dir=args.manual_dir, data_dir=args.data_dir,
                    source_lang=args.source_lang, target_lang=args.target_lang, **overrides)


def _add_prepare(subparsers) -> None:
  parser = subparsers.add_parser(
      "prepare", help="download (or read), check and prepare a corpus as array_record files",
      description="Prepares a corpus once into the data dir; training and evaluation read it "
                  "from there. Optionally trains the sentencepiece vocabulary too.")
  _add_data_flags(parser)
  parser.add_argument("--tokenizer", default="", metavar="PATH",
                      help="also train a sentencepiece vocabulary on the training split and save "
                           "it here (e.g. runs/NAME/tokenizer.model)")
  parser.add_argument("--vocab-size", type=int, default=DataConfig().vocab_size,
                      help="size of that vocabulary (default: %(default)s)")
  parser.set_defaults(run=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
  from seq2seq_jax.data import builders, tokenizer  # tfds is slow to import: only when needed

  data_config = _data_config(args, vocab_size=args.vocab_size)
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


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="seq2seq-jax", description="Sequence-to-sequence models for machine translation.")
  parser.add_argument("--verbose", "-v", action="store_true", help="log at INFO level")
  subparsers = parser.add_subparsers(dest="command", required=True, title="commands")
  _add_prepare(subparsers)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Runs ``seq2seq-jax`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

  Bad input (a config value, a data file) prints one ``error:`` line that names
  the field or file and the fix, and returns 2, without a traceback.
  """
  parser = build_parser()
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                      format="%(levelname)s %(name)s: %(message)s")
  from seq2seq_jax.data.text_files import DataError
  try:
    return args.run(args)
  except (DataError, ValueError, FileNotFoundError) as e:
    print(f"seq2seq-jax {args.command}: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
