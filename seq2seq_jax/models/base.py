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


def shift_right(targets_BT: Array, bos_id: int = BOS_ID, *,
                segment_ids_BT: Array | None = None) -> Array:
  """Decoder inputs for teacher forcing: BOS, then the targets without their last token.

  ``segment_ids_BT``: for packed rows (several targets one after the other,
  numbered 1, 2, ... and 0 on padding), every segment starts with ``bos_id``: the
  first token of a segment reads the decoder start, never the previous target's EOS.

  Example:
    >>> shift_right(jnp.array([[5, 6, 2]]))
    Array([[1, 5, 6]], dtype=int32)
    >>> shift_right(jnp.array([[5, 2, 7, 2]]), segment_ids_BT=jnp.array([[1, 1, 2, 2]]))
    Array([[1, 5, 1, 7]], dtype=int32)
  """
  bos_B1 = jnp.full((targets_BT.shape[0], 1), bos_id, dtype=targets_BT.dtype)
  shifted_BT = jnp.concatenate([bos_B1, targets_BT[:, :-1]], axis=1)
  if segment_ids_BT is None:
    return shifted_BT
  if segment_ids_BT.shape != targets_BT.shape:
    raise ValueError(f"segment_ids_BT {segment_ids_BT.shape} must have the shape of targets_BT "
                     f"{targets_BT.shape}")
  # Column 0 compares with itself: it keeps the BOS the shift put there.
  previous_BT = jnp.concatenate([segment_ids_BT[:, :1], segment_ids_BT[:, :-1]], axis=1)
  return jnp.where(segment_ids_BT == previous_BT, shifted_BT, bos_id).astype(targets_BT.dtype)


def check_decode_len(max_decode_len: int, max_len: int, model_name: str) -> None:
  """Raises when a decode loop would run past the model's position limit."""
  if not 0 < max_decode_len <= max_len:
    raise ValueError(f"max_decode_len={max_decode_len} must be in [1, {model_name}.max_len="
                     f"{max_len}]; decode fewer tokens or build the model with a larger max_len")


# The batch keys of packed rows (``DataConfig.packing``), also the keyword arguments of
# the packing models' ``__call__``: segment ids 1, 2, ... per pair (0 on padding) and
# positions restarting at 0 in each segment, int32 [B, S] for inputs, [B, T] for targets.
PACKING_KEYS = ("inputs_segment_ids", "inputs_positions", "targets_segment_ids",
                "targets_positions")


def check_packing(tokens_BT: Array, segment_ids: Array | None, positions: Array | None,
                  what: str) -> bool:
  """Whether a side is packed: its segment ids and positions, given together, int, shaped as
  its tokens. Raises ``ValueError`` naming ``what`` (``"inputs"`` or ``"targets"``) otherwise.

  Example:
    >>> check_packing(jnp.ones((2, 3), jnp.int32), None, None, "inputs")
    False
  """
  if segment_ids is None and positions is None:
    return False
  if segment_ids is None or positions is None:
    missing = "positions" if positions is None else "segment ids"
    raise ValueError(f"packed {what} need both segment ids and positions; the {missing} are "
                     f"missing (a packed batch has {what}_segment_ids and {what}_positions)")
  for name, value in (("segment ids", segment_ids), ("positions", positions)):
    if value.shape != tokens_BT.shape or not jnp.issubdtype(value.dtype, jnp.integer):
      raise ValueError(f"the {name} of packed {what} must be integers shaped like the tokens "
                       f"{tokens_BT.shape}; got {value.dtype} {value.shape}")
  return True


def with_weights(result: Any, return_weights: bool) -> tuple[Array, Array | None]:
  """``(out, weights)`` of an attention call made with ``return_weights`` (weights None without)."""
  return result if return_weights else (result, None)
