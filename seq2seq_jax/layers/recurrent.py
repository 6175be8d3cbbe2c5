"""Recurrent encoders: flax.linen cells scanned with ``nn.RNN``.

Stacked, bidirectional, reversed-source and length-aware. Rows are right padded
(real tokens first); a row's length is its count of non-PAD tokens.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seq2seq_jax.layers.dropout import Dropout
from seq2seq_jax.types import PAD_ID, Array, PyTree

# Gate equations of the flax 0.12 cells (W_* act on the input x, U_* on the state h):
#   lstm:   i, f, o = sigmoid(W x + U h + b); g = tanh(W_g x + U_g h + b_g)
#           c' = f * c + i * g;  h' = o * tanh(c');  carry (c, h)
#   gru:    r = sigmoid(W_r x + b_ir + U_r h);  z = sigmoid(W_z x + b_iz + U_z h)
#           n = tanh(W_n x + b_in + r * (U_n h + b_hn))   <- cuDNN / PyTorch form:
#           the reset gate multiplies U_n h + b_hn, not Cho 2014's U_n (r * h).
#           h' = (1 - z) * n + z * h
#   simple: h' = tanh(W x + b + U h)
CELLS = {"lstm": nn.LSTMCell, "gru": nn.GRUCell, "simple": nn.SimpleCell}


def make_cell(kind: str, features: int, *, dtype: Any = jnp.float32,
              name: str | None = None) -> nn.RNNCellBase:
  """A flax cell of ``kind`` ("lstm", "gru" or "simple") with float32 parameters."""
  if kind not in CELLS:
    raise ValueError(f"cell={kind!r}: must be one of {', '.join(map(repr, CELLS))}")
  return CELLS[kind](features=features, dtype=dtype, param_dtype=jnp.float32, name=name)


def sequence_lengths(tokens_BS: Array, *, pad_id: int = PAD_ID) -> Array:
  """int32 ``[B]``: the number of real (non-PAD) tokens of each right-padded row."""
  return jnp.sum(tokens_BS != pad_id, axis=1, dtype=jnp.int32)


def reverse_padded(x_BS: Array, lengths_B: Array) -> Array:
  """Reverses the first ``lengths[b]`` entries of each row; padding stays at the end.

  Args:
    x_BS: ``[B, S, ...]`` tokens or vectors.
    lengths_B: int real lengths.

  Returns:
    ``[B, S, ...]``; applying it twice gives ``x_BS`` back.
  """
  positions_1S = jnp.arange(x_BS.shape[1])[None, :]
  lengths_B1 = lengths_B[:, None]
  index_BS = jnp.where(positions_1S < lengths_B1, lengths_B1 - 1 - positions_1S, positions_1S)
  index_BS = index_BS.reshape(index_BS.shape + (1,) * (x_BS.ndim - 2))
  return jnp.take_along_axis(x_BS, index_BS, axis=1)


def carry_hidden(carry: PyTree) -> Array:
  """The output state h of a cell's carry (the LSTM carry is ``(c, h)``)."""
  return carry[1] if isinstance(carry, tuple) else carry


class RNNEncoder(nn.Module):
  """A stack of (bi)directional recurrent layers over embedded, right-padded rows.

  Each layer is an ``nn.RNN`` scan given the row lengths, so the final state of a
  row is its state at its last real token, and the backward direction reverses
  only the real tokens (``flip_sequences``; outputs restored to source order with
  ``keep_order``). Outputs at padded positions are zero. Dropout is applied
  between layers.

  Example:
    >>> enc = RNNEncoder(cell="gru", hidden_dim=8, num_layers=2, bidirectional=True)
    >>> x, lengths = jnp.ones((2, 5, 4)), jnp.array([5, 3])
    >>> (out, final), _ = enc.init_with_output(jax.random.key(0), x, lengths)
    >>> out.shape, final.shape
    ((2, 5, 16), (2, 2, 16))
  """

  cell: str = "lstm"
  hidden_dim: int = 64  # per direction
  num_layers: int = 1
  bidirectional: bool = False
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  @property
  def output_dim(self) -> int:
    return self.hidden_dim * (2 if self.bidirectional else 1)

  def _zero_carry(self, cell: nn.RNNCellBase, x_BSD: Array) -> PyTree:
    # The state lives in the compute dtype: flax's default float32 carry would turn
    # into bfloat16 after one SimpleCell step and break the scan's carry types.
    carry = cell.initialize_carry(jax.random.key(0), x_BSD[:, 0].shape)
    return jax.tree.map(lambda c: c.astype(self.dtype), carry)

  @nn.compact
  def __call__(self, inputs_BSE: Array, lengths_B: Array, *,
               deterministic: bool = True) -> tuple[Array, PyTree]:
    """Runs the stack.

    Args:
      inputs_BSE: embedded rows, real positions first.
      lengths_B: int real lengths (0 < length <= S; a row of length 0 gets zeros).
      deterministic: no dropout when True.

    Returns:
      ``(outputs_BSD, final)``: the top layer's states (forward and backward
      concatenated, D = hidden_dim * directions), and every layer's final carry,
      each leaf ``[B, L, D]`` (a ``(c, h)`` pair for the LSTM).
    """
    real_BS1 = (jnp.arange(inputs_BSE.shape[1])[None, :] < lengths_B[:, None])[..., None]
    nonempty_B1 = (lengths_B > 0)[:, None]
    x_BSD = inputs_BSE.astype(self.dtype)
    finals = []
    for layer in range(self.num_layers):
      if layer > 0:
        x_BSD = Dropout(self.dropout_rate)(x_BSD, deterministic=deterministic)
      # Cells are named here so their parameters read encoder/forward_0/..., backward_0/...
      forward_cell = make_cell(self.cell, self.hidden_dim, dtype=self.dtype,
                               name=f"forward_{layer}")
      carry, out_BSD = nn.RNN(forward_cell, return_carry=True)(
          x_BSD, initial_carry=self._zero_carry(forward_cell, x_BSD), seq_lengths=lengths_B)
      if self.bidirectional:
        backward_cell = make_cell(self.cell, self.hidden_dim, dtype=self.dtype,
                                  name=f"backward_{layer}")
        carry_back, out_back_BSD = nn.RNN(backward_cell, return_carry=True)(
            x_BSD, initial_carry=self._zero_carry(backward_cell, x_BSD), seq_lengths=lengths_B,
            reverse=True, keep_order=True)
        carry = jax.tree.map(lambda f, b: jnp.concatenate([f, b], axis=-1), carry, carry_back)
        out_BSD = jnp.concatenate([out_BSD, out_back_BSD], axis=-1)
      # The scan also steps over padding; those outputs are meaningless, so zero them.
      x_BSD = jnp.where(real_BS1, out_BSD, 0).astype(self.dtype)
      finals.append(jax.tree.map(lambda c: jnp.where(nonempty_B1, c, 0), carry))
    final = jax.tree.map(lambda *cs: jnp.stack(cs, axis=1), *finals)
    return x_BSD, final
