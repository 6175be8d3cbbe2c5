"""Writes the parameters of a run trained with --init-from, with the config, generation config and
tokenizer of the checkpoint it started from, as a save_pretrained directory that transformers
(and --pretrained) load.
"""

from __future__ import annotations

import argparse

from seq2seq_jax.cli import flags

HELP = "write a fine-tuned run in transformers' layout"


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--workdir", required=True, help="a run trained with --init-from")
  parser.add_argument("--checkpoint", default=None, metavar="best|latest|STEP")
  parser.add_argument("--out", required=True, metavar="DIR", help="the directory to write")


def run(args: argparse.Namespace) -> int:
  from seq2seq_jax import pretrained
  translator = flags.model_translator(workdir=args.workdir,
                                        checkpoint=args.checkpoint)
  init_from = translator.config.train.init_from
  if not init_from:
    raise ValueError(f"{args.workdir}: this run did not start from a pretrained checkpoint "
                     "(train.init_from is empty); only fine-tuned checkpoints have a "
                     "transformers layout to write")
  pretrained.save(pretrained.load(init_from), args.out, params=translator.params)
  print(f"wrote step {translator.step} of {args.workdir} to {args.out} (layout of {init_from})")
  return 0
