"""The ``seq2seq-jax`` command line: ``prepare``, ``train``, ``average``, ``evaluate``,
``translate``, ``export``, ``save-pretrained``, ``compile``.

Flags become configs here and nowhere else. Each command is a module of this package
(``prepare``, ``train``, ``average``, ``evaluate``, ``translate``, ``export``,
``save_pretrained``, ``compile``): its docstring is the command's description, ``HELP`` its line in
``seq2seq-jax --help``, ``add_arguments(parser)`` its flags and ``run(args)`` returns its
exit status. The flag groups that several share, and the configs and Translators they
become, are in ``flags``.

Example::

  seq2seq-jax prepare --dataset multi30k --manual-dir ../shared/data/multi30k/raw
  seq2seq-jax prepare --dataset multi30k  # downloads the official files
  seq2seq-jax prepare --dataset parallel_text --manual-dir my_corpus --source-lang de \\
      --target-lang en --tokenizer runs/x/tokenizer.model --vocab-size 8000
  seq2seq-jax train --preset multi30k_transformer --workdir runs/m30k \\
      --set data.manual_dir=../shared/data/multi30k/raw --set train.num_steps=400
  seq2seq-jax average --workdir runs/m30k --last 5  # writes runs/m30k/average-5
  seq2seq-jax evaluate --workdir runs/m30k --split test_2016_flickr --beam-size 4
  echo "Ein Hund rennt." | seq2seq-jax translate --workdir runs/m30k --beam-size 4
  echo "Ein Hund rennt." | seq2seq-jax translate --pretrained opus-mt-de-en
  seq2seq-jax translate --workdir runs/m30k --input corpus.de --output corpus.en --beam-size 4
  seq2seq-jax translate --workdir runs/m30k --input corpus.de --output nbest.txt \\
      --beam-size 8 --n-best 4
  seq2seq-jax export --workdir runs/m30k --out m30k.s2sx --platforms cpu,cuda,tpu
  seq2seq-jax translate --pretrained opus-mt-de-en --beam-size 4 --prefix-file prefixes.txt \\
      --constraints-file phrases.tsv --set decode.no_repeat_ngram_size=3 < input.de
  seq2seq-jax translate --workdir runs/a --ensemble runs/b --beam-size 4 < input.de
  seq2seq-jax evaluate --pretrained opus-mt-de-en --manual-dir ../shared/data/multi30k/raw \\
      --split test_2016_flickr
  seq2seq-jax train --init-from opus-mt-de-en --workdir runs/ft \\
      --set data.manual_dir=../shared/data/multi30k/raw --set train.num_steps=1000
  seq2seq-jax save-pretrained --workdir runs/ft --out opus-mt-de-en-multi30k
  seq2seq-jax compile --target v5e:2x4 --preset wmt14_transformer_base \\
      --set train.parameter_sharding=fsdp --max-batch --json wmt_base.json
  seq2seq-jax compile --target v5e-1 --pretrained opus-mt-de-en --program generate,score
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from seq2seq_jax.cli import (average, compile, evaluate, export, prepare, save_pretrained,
                             train, translate)

# In the order ``seq2seq-jax --help`` lists them.
COMMANDS = (prepare, train, average, evaluate, translate, export, save_pretrained, compile)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="seq2seq-jax", description="Sequence-to-sequence models for machine translation.")
  parser.add_argument("--verbose", "-v", action="store_true", help="log at INFO level")
  subparsers = parser.add_subparsers(dest="command", required=True, title="commands")
  for command in COMMANDS:
    name = command.__name__.rpartition(".")[2].replace("_", "-")
    subparser = subparsers.add_parser(name, help=command.HELP, description=command.__doc__)
    command.add_arguments(subparser)
    subparser.set_defaults(run=command.run)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Runs ``seq2seq-jax`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

  Bad input (a config value, a data file) prints one ``error:`` line that names
  the field or file and the fix, and returns 2, without a traceback.

  Run as a program (``argv`` None), it first restarts itself once with the glibc
  malloc setting that maps XLA's per-step scratch memory in huge pages
  (``seq2seq_jax.allocator``; ``SEQ2SEQ_JAX_TUNE_MALLOC=0`` keeps the defaults).
  """
  if argv is None:
    from seq2seq_jax import allocator
    allocator.reexec_with_tuned_malloc()
  from seq2seq_jax.aot.targets import quiet_libtpu
  quiet_libtpu()  # before jax starts: no TPU warnings where libtpu is installed without a TPU
  parser = build_parser()
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                      format="%(levelname)s %(name)s: %(message)s")
  from seq2seq_jax.data.text_files import DataError
  if args.command != "translate" and not args.verbose:
    import tensorflow_datasets as tfds  # its per-split progress bars drown the training lines
    tfds.disable_progress_bar()
  try:
    return args.run(args)
  except (DataError, ValueError, FileNotFoundError) as e:
    # ValueError covers bad configs, ConfigMismatchError and CheckpointError.
    print(f"seq2seq-jax {args.command}: error: {e}", file=sys.stderr)
    return 2
  except FloatingPointError as e:  # NonFiniteLossError: the message names the step
    print(f"seq2seq-jax {args.command}: error: {e}", file=sys.stderr)
    return 3

