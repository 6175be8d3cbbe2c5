"""Translation for users: the Translator, whole files across every device, exported artifacts.

- ``Translator``: text in, text out (``translate``, ``score``), batches split over
  the ``data`` axis of a device mesh.
- ``translate_file``: a file of any size, line by line into another, in bounded
  memory, resumable after an interruption, with progress, n-best lists, scores and
  forced decoding of given translations (``seq2seq-jax translate``).
- ``export_translator`` / ``load_exported``: encode + search serialized with
  ``jax.export`` (StableHLO) for CPU, CUDA and TPU with the tokenizer, run without
  the model's Python code (``seq2seq-jax export``; ``seq2seq_jax.serving``).

The command line is a thin layer over these.
"""

from seq2seq_jax.inference.batching import PlannedBatch as PlannedBatch
from seq2seq_jax.inference.batching import plan_batches as plan_batches
from seq2seq_jax.inference.exported import ExportInfo as ExportInfo
from seq2seq_jax.inference.exported import ExportedTranslator as ExportedTranslator
from seq2seq_jax.inference.exported import export_translator as export_translator
from seq2seq_jax.inference.exported import load_exported as load_exported
from seq2seq_jax.inference.files import FileResult as FileResult
from seq2seq_jax.inference.files import ResumeError as ResumeError
from seq2seq_jax.inference.files import TranslationInterrupted as TranslationInterrupted
from seq2seq_jax.inference.files import translate_file as translate_file
from seq2seq_jax.inference.translator import DecodedBatch as DecodedBatch
from seq2seq_jax.inference.translator import Translator as Translator

__all__ = [
    "DecodedBatch",
    "ExportInfo",
    "ExportedTranslator",
    "FileResult",
    "PlannedBatch",
    "ResumeError",
    "TranslationInterrupted",
    "Translator",
    "export_translator",
    "load_exported",
    "plan_batches",
    "translate_file",
]
