"""Shared constants and array aliases: token ids, the masking constant, shape letters.

Shape-letter glossary. Arrays carry their shape as a suffix (``inputs_BS``,
``logits_BTV``) and einsum strings use the same letters:

====== ========================================= ====== ============================
letter meaning                                   letter meaning
====== ========================================= ====== ============================
B      batch                                     H      attention heads
S      source length / key positions             K      per-head width (D = H * K)
T      target length / query positions           F      feed-forward hidden width
D      model or RNN width                        V      vocabulary
W      beam width                                L      layers (stacked caches only)
N      rows seen by a decoding step (B or B * W) C      classes
====== ========================================= ====== ============================

Token ids are fixed across the library and passed to the sentencepiece trainer
so the vocabulary agrees: PAD 0, BOS 1, EOS 2, UNK 3. Data holds pieces followed
by EOS; BOS never appears in data, only ``shift_right`` and the decoders add it.
"""

from __future__ import annotations

from typing import Any

import jax


PAD_ID: int = 0
BOS_ID: int = 1
EOS_ID: int = 2
UNK_ID: int = 3

# Large finite negative rather than -inf: a fully masked row then softmaxes to a
# uniform distribution instead of NaN, and (x + NEG_INF) stays finite in f32/bf16.
NEG_INF: float = -1e9

# Logits of at most VOCAB_MAJOR_MAX_ROWS rows (a decoding step of batch x beams <= 32)
# are laid out vocabulary-major: the models compute them as [V, N] and hand over the
# transposed view (see layers.embeddings.vocab_logits). From VOCAB_MAJOR_MIN_ROWS rows
# on, the decoding step's reductions over the vocabulary (log-softmax, argmax) are
# written along that axis, so XLA's CPU backend reads them as they lie and never
# materializes an [N, V] copy; below it a [V, N] array is (nearly) an [N, V] one, and
# the row-wise reductions are faster (58,101 ids, log-softmax and argmax, row-wise /
# vocabulary-major: 0.18 / 1.0 ms for one row, 1.05 / 0.93 ms at 8 rows, 3.7 / 1.4 ms
# at 32).
VOCAB_MAJOR_MIN_ROWS: int = 8
VOCAB_MAJOR_MAX_ROWS: int = 32


def reads_vocab_major(rows: int) -> bool:
  """Whether a step's reductions over ``[rows, V]`` logits run along the vocabulary-major layout.

  Example:
    >>> reads_vocab_major(1), reads_vocab_major(32), reads_vocab_major(128)
    (False, True, False)
  """
  return VOCAB_MAJOR_MIN_ROWS <= rows <= VOCAB_MAJOR_MAX_ROWS

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
DType = Any
PRNGKey = jax.Array
PyTree = Any
Shape = tuple[int, ...]

__all__ = [
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "UNK_ID",
    "NEG_INF",
    "VOCAB_MAJOR_MIN_ROWS",
    "VOCAB_MAJOR_MAX_ROWS",
    "reads_vocab_major",
    "Array",
    "ArrayLike",
    "DType",
    "PRNGKey",
    "PyTree",
    "Shape",
]
