"""Pieces every encoder-decoder model shares: special ids, the decoder-input shift, length checks."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from seq2seq_jax.types import BOS_ID, EOS_ID, PAD_ID, Array


class SpecialIds(NamedTuple):
  """A model's special token ids: padding, the decoder's first input, end of output."""

  pad_id: int
  decoder_start_id: int
  eos_id: int


def special_ids(model: Any) -> SpecialIds:
  """The ids ``model.config`` declares, else the library's own (PAD 0, BOS 1, EOS 2).

  The library's models keep 0 / 1 / 2; converted checkpoints carry theirs (Marian
  starts decoding with its pad id, M2M100 with its eos id). A model written outside
  the library needs no config: it gets the defaults.

  Example:
    >>> special_ids(object())
    SpecialIds(pad_id=0, decoder_start_id=1, eos_id=2)
  """
  config = getattr(model, "config", None)
  return SpecialIds(pad_id=getattr(config, "pad_id", PAD_ID),
                    decoder_start_id=getattr(config, "decoder_start_id", BOS_ID),
                    eos_id=getattr(config, "eos_id", EOS_ID))


def shift_right(targets_BT: Array, bos_id: int = BOS_ID) -> Array:
  """Decoder inputs for teacher forcing: BOS, then the targets without their last token.

  Example:
    >>> shift_right(jnp.array([[5, 6, 2]]))
    Array([[1, 5, 6]], dtype=int32)
  """
  bos_B1 = jnp.full((targets_BT.shape[0], 1), bos_id, dtype=targets_BT.dtype)
  return jnp.concatenate([bos_B1, targets_BT[:, :-1]], axis=1)


def check_decode_len(max_decode_len: int, max_len: int, model_name: str) -> None:
  """Raises when a decode loop would run past the model's position limit."""
  if not 0 < max_decode_len <= max_len:
    raise ValueError(f"max_decode_len={max_decode_len} must be in [1, {model_name}.max_len="
                     f"{max_len}]; decode fewer tokens or build the model with a larger max_len")
