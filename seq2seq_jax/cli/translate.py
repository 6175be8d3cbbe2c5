"""Translates --input (default: standard input) line by line into --output (default: standard
output) on every visible device, in bounded memory: a window of lines is sorted by length and
decoded in token-budget batches; results are written in input order. File to file, the run is
resumable: after Ctrl-C or kill -9 the same command continues after the last complete line (a
side record OUTPUT.progress.json says how far it got). An empty line gives an empty line; a line
longer than the source limit (the model's max_len, or --max-source-len) is truncated with a
warning naming it; invalid UTF-8 is an error naming the line.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from seq2seq_jax.cli import flags

HELP = "translate a file (or stdin) line by line, on every device"


def add_arguments(parser: argparse.ArgumentParser) -> None:
  from seq2seq_jax.configs import TranslateFileConfig
  defaults = TranslateFileConfig()
  flags.add_search_flags(parser)
  parser.add_argument("--input", default=None, metavar="FILE",
                      help="sentences to translate, one per line, plain or .gz (default: stdin)")
  parser.add_argument("--output", default=None, metavar="FILE",
                      help="where translations go, one line per input line (default: stdout)")
  parser.add_argument("--n-best", type=int, default=0, metavar="K",
                      help="write K lines 'INDEX ||| TEXT ||| SCORE' per input, best first (beam "
                           "search; SCORE is the length-normalised log-probability)")
  parser.add_argument("--scores", action="store_true",
                      help="write 'TEXT ||| LOGPROB': each output's total log-probability")
  parser.add_argument("--score-references", default=None, metavar="FILE",
                      help="translate nothing: write the log-probability of each line of FILE "
                           "given the same line of the input (forced decoding)")
  parser.add_argument("--window", type=int, default=defaults.window_lines, metavar="LINES",
                      help="lines read, sorted and batched together (default: %(default)s)")
  parser.add_argument("--batch-tokens", type=int, default=defaults.batch_tokens, metavar="N",
                      help="padded source tokens in a full batch (default: %(default)s); "
                           f"--batch-size caps its rows (default: {defaults.max_rows})")
  parser.add_argument("--overwrite", action="store_true",
                      help="start --output over although it exists or is unfinished")
  parser.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default="auto",
                      help="a progress bar (on a terminal: auto), plain lines, or nothing")
  parser.add_argument("--prefix-file", default=None, metavar="FILE",
                      help="one target prefix per input line (an empty line for none): each "
                           "translation begins with its line's prefix")
  parser.add_argument("--constraints-file", default=None, metavar="FILE",
                      help="per input line, the phrases its translation must contain, separated "
                           "by tabs (an empty line for none); needs beam search")


def _model_name(args: argparse.Namespace, translator: Any) -> str:
  """How a resumed translation names its model: the checkpoint's folder (and step)."""
  if args.pretrained:
    return f"pretrained {pathlib.Path(args.pretrained).expanduser().absolute()}"
  return f"workdir {pathlib.Path(args.workdir).expanduser().absolute()} step {translator.step}"


def run(args: argparse.Namespace) -> int:
  import jax

  from seq2seq_jax.configs import TranslateFileConfig
  from seq2seq_jax.inference import files
  from seq2seq_jax.training.sharding import make_mesh, maybe_initialize_distributed

  maybe_initialize_distributed()  # before anything touches devices; a no-op on one host
  config = TranslateFileConfig(
      window_lines=args.window, batch_tokens=args.batch_tokens,
      max_rows=args.batch_size or TranslateFileConfig().max_rows, n_best=args.n_best,
      scores=args.scores, references=args.score_references or "", progress=args.progress,
      prefixes=args.prefix_file or "", constraints=args.constraints_file or "")
  translator = flags.translator(args, mesh=make_mesh())
  try:
    result = files.translate_file(
        translator, args.input, args.output, config=config, beam_size=args.beam_size,
        alpha=args.alpha, method=args.method, max_decode_len=args.max_decode_len,
        source_lang=args.source_lang, target_lang=args.target_lang, overwrite=args.overwrite,
        model_name=_model_name(args, translator), **flags.decode_options(args))
  except files.TranslationInterrupted as interrupted:
    where = (f"; {interrupted.lines_done} lines of {interrupted.output} are complete. Rerun the "
             "same command to resume" if interrupted.output else "")
    print(f"seq2seq-jax translate: interrupted{where}", file=sys.stderr)
    return 130
  if args.progress != "none" and result.decoded and jax.process_index() == 0:
    rate = result.decoded / max(result.seconds, 1e-9)
    devices = translator.mesh.devices.size
    print(f"seq2seq-jax translate: {result.lines} lines ({result.decoded} decoded"
          + (f", resumed after line {result.resumed_from}" if result.resumed_from else "")
          + f") in {result.seconds:.1f} s on {devices} device{'s' * (devices > 1)} of "
          f"{jax.process_count()} process{'es' * (jax.process_count() > 1)}: {rate:.1f} "
          f"sentences/s, {result.tokens / max(result.seconds, 1e-9):.0f} tokens/s"
          + (f" -> {result.output}" if result.output else ""), file=sys.stderr)
  return 0
