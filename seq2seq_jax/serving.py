"""Serving exported translators: ``load_exported(FILE).translate(sentences)``.

An artifact written by ``seq2seq-jax export`` (``inference.export_translator``)
holds StableHLO programs for CPU, CUDA and/or TPU, the parameters and the
tokenizer; running it needs ``jax`` and the tokenizer, not the model's code. The
implementation lives in ``seq2seq_jax.inference.exported``.

Example:
  >>> from seq2seq_jax import inference, serving
  >>> _ = inference.export_translator(inference.Translator.from_workdir("runs/tiny"),
  ...                                 "tiny.s2sx", platforms=("cpu",), row_counts=(1,))
  >>> translator = serving.load_exported("tiny.s2sx")  # no model code from here on
  >>> [type(text).__name__ for text in translator.translate(["Ein Hund rennt."])]
  ['str']
"""

from seq2seq_jax.inference.exported import ExportedTranslator as ExportedTranslator
from seq2seq_jax.inference.exported import load_exported as load_exported

__all__ = ["ExportedTranslator", "load_exported"]
