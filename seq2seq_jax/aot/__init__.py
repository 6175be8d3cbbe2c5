"""Ahead-of-time compilation for TPUs this machine does not have: memory, FLOPs and fit.

With libtpu installed (``pip install "jax[tpu]"``; no TPU needed), the real TPU
compiler compiles the library's programs (``train``, ``eval``, ``generate``,
``score``) for an abstract slice (``"v5e:2x4"``, Colab's ``"v5e-1"``) from shapes
alone, and reports per chip what they need and what they are estimated to cost.
Compiler-derived estimates, not measurements.

Example:
  >>> from seq2seq_jax import aot, presets
  >>> report = aot.compile_report(presets.get_preset("tiny_transformer"), "v5e-1", "train")
  >>> report.fits, report.chips, report.per_chip_bytes["total"] < 2**30
  (True, 1, True)

Command line: ``seq2seq-jax compile --target v5e:2x4 --preset wmt14_transformer_base``.
"""

from seq2seq_jax.aot.programs import PROGRAMS as PROGRAMS
from seq2seq_jax.aot.programs import Program as Program
from seq2seq_jax.aot.programs import build_program as build_program
from seq2seq_jax.aot.report import CompileReport as CompileReport
from seq2seq_jax.aot.report import compile_program as compile_program
from seq2seq_jax.aot.report import compile_report as compile_report
from seq2seq_jax.aot.report import find_max_batch as find_max_batch
from seq2seq_jax.aot.report import fit_summary as fit_summary
from seq2seq_jax.aot.report import format_table as format_table
from seq2seq_jax.aot.targets import CHIPS as CHIPS
from seq2seq_jax.aot.targets import Chip as Chip
from seq2seq_jax.aot.targets import Target as Target
from seq2seq_jax.aot.targets import parse_target as parse_target
from seq2seq_jax.aot.targets import target_devices as target_devices
from seq2seq_jax.aot.targets import target_mesh as target_mesh

__all__ = ["PROGRAMS", "Program", "build_program", "CompileReport", "compile_program",
           "compile_report", "find_max_batch", "fit_summary", "format_table", "CHIPS", "Chip", "Target",
           "parse_target", "target_devices", "target_mesh"]
