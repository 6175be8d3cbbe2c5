"""Trains a preset, changed with --set section.field=value (sections: model, data, train, decode).
The workdir keeps config.json, metrics.jsonl, the tokenizer and checkpoints; rerunning the same
command resumes from the latest checkpoint. Ctrl-C saves a checkpoint and stops.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from seq2seq_jax.cli import flags

HELP = "train a model; rerunning the same command resumes it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
  flags.add_preset_flag(parser, "named config; default: the workdir's saved config.json when it "
                                "has one, else multi30k_transformer")
  parser.add_argument("--workdir", required=True, help="the run's folder")
  flags.add_set_flag(parser, "change one config field (repeatable)")
  parser.add_argument("--restart", action="store_true",
                      help="start over although the workdir holds a run (its files are moved "
                           "aside, not deleted)")
  parser.add_argument("--quiet", action="store_true", help="no progress lines")
  parser.add_argument("--init-from", default=None, metavar="DIR",
                      help="fine-tune a pretrained checkpoint (a transformers save_pretrained "
                           "directory of MarianMT or M2M100/NLLB): its model, parameters, "
                           "tokenizer and search replace the preset's")


def train_config(args: argparse.Namespace):
  """The workdir's saved config (when no --preset) or the preset, with --set applied."""
  saved = pathlib.Path(args.workdir) / "config.json"
  base = None
  if args.preset is None and saved.is_file():
    try:
      base = flags.read_config(saved)
    except ValueError as error:
      raise ValueError(f"{error}; pass --preset to start from a preset instead") from None
  elif getattr(args, "init_from", None):
    from seq2seq_jax import pretrained, presets
    preset = presets.get_preset(args.preset or "multi30k_transformer")
    base = pretrained.experiment_config(pretrained.load(args.init_from), data=preset.data,
                                        train=preset.train)
  return flags.experiment_config(base, args)


def run(args: argparse.Namespace) -> int:
  from seq2seq_jax.training import loop
  from seq2seq_jax.training.sharding import maybe_initialize_distributed

  maybe_initialize_distributed()  # before anything touches devices; a no-op on one host
  config = train_config(args)
  start = time.perf_counter()
  result = loop.train(config, args.workdir, restart=args.restart, progress=not args.quiet)
  minutes = (time.perf_counter() - start) / 60
  if result.interrupted:
    print(f"interrupted at step {result.step} after {minutes:.1f} min; checkpoint saved. Rerun "
          "the same command to resume.", file=sys.stderr)
    return 130
  summary = {k: result.metrics[k] for k in ("loss", "val_loss", "bleu") if k in result.metrics}
  print(f"trained {result.step} steps in {minutes:.1f} min: "
        + ", ".join(f"{k} {v:.4g}" for k, v in summary.items())
        + (f"; best validation BLEU {result.best_bleu:.2f} at step {result.best_step}"
           if result.best_bleu is not None else ""))
  return 0
