"""Pieces every encoder-decoder model shares: the decoder-input shift and the length checks."""

from __future__ import annotations

import jax.numpy as jnp

from seq2seq_jax.types import BOS_ID, Array


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
