"""Translation for users: the Translator, whole files across every device, exported artifacts.

- ``Translator``: text in, text out (``translate``, ``score``), batches split over a
  device mesh.
- ``translate_file``: a file of any size, line by line into another, in bounded
  memory, resumable after an interruption, with progress, n-best lists and scores.
- ``export_translator`` / ``load_exported``: encode + search serialized with
  ``jax.export`` (StableHLO) for CPU, CUDA and TPU, with the tokenizer, and run
  without the model's Python code (``seq2seq_jax.serving``).
"""

from seq2seq_jax.inference.batching import PlannedBatch as PlannedBatch
from seq2seq_jax.inference.batching import plan_batches as plan_batches
from seq2seq_jax.inference.translator import DecodedBatch as DecodedBatch
from seq2seq_jax.inference.translator import Translator as Translator

__all__ = [
    "DecodedBatch",
    "PlannedBatch",
    "Translator",
    "plan_batches",
]
