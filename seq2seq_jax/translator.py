"""The ``Translator``; it lives in ``seq2seq_jax.inference.translator`` (this name keeps working)."""

from seq2seq_jax.inference.translator import Translator as Translator

__all__ = ["Translator"]
