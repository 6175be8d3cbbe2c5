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
    "Array",
    "ArrayLike",
    "DType",
    "PRNGKey",
    "PyTree",
    "Shape",
]
