"""Averages the parameters of a run's latest N checkpoints into a new run folder that
evaluate, translate and export read like any other (--workdir OUT).

The mean of the last few checkpoints of a run is usually a better model than the last
one alone (Vaswani et al. 2017 average the last 5 or 20; fairseq's and Marian's recipes
do the same): each checkpoint sits at a different point of the noise around a minimum.
The run must keep enough of them (train.keep_checkpoints, train.checkpoint_every).
"""

from __future__ import annotations

import argparse
import pathlib

HELP = "average the latest checkpoints of a run into a new run folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--workdir", required=True, help="the training run's folder")
  parser.add_argument("--last", type=int, required=True, metavar="N",
                      help="how many of the latest checkpoints to average")
  parser.add_argument("--out", default=None, metavar="DIR",
                      help="the new run folder (default: WORKDIR/average-N); evaluate it with "
                           "--workdir DIR")


def run(args: argparse.Namespace) -> int:
  from seq2seq_jax.checkpoints import CheckpointError
  from seq2seq_jax.training.restore import average_checkpoints

  workdir = pathlib.Path(args.workdir).expanduser()
  if not (workdir / "checkpoints").is_dir():
    raise CheckpointError(f"{workdir / 'checkpoints'} does not exist: --workdir {workdir} is "
                          "not a training run's folder")
  out = pathlib.Path(args.out).expanduser() if args.out else workdir / f"average-{args.last}"
  step = average_checkpoints(workdir / "checkpoints", out / "checkpoints", num_last=args.last)
  print(f"wrote {out / 'checkpoints' / str(step)}: the mean of the latest {args.last} "
        f"checkpoints of {workdir}")
  return 0
