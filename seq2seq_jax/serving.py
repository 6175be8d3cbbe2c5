"""Serving exported translators: ``load_exported(FILE).translate(sentences)``.

An artifact written by ``seq2seq-jax export`` (``inference.export_translator``)
holds StableHLO programs for CPU, CUDA and/or TPU, the parameters and the
tokenizer; running it needs ``jax`` and the tokenizer, not the model's code. The
implementation lives in ``seq2seq_jax.inference.exported``.

Example:
  >>> from seq2seq_jax import serving
  >>> translator = serving.load_exported("m30k.s2sx")
  >>> translator.translate(["Ein Hund rennt."])
"""

from seq2seq_jax.inference.exported import ExportedTranslator as ExportedTranslator
from seq2seq_jax.inference.exported import load_exported as load_exported

__all__ = ["ExportedTranslator", "load_exported"]
