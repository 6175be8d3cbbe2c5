"""Recurrent encoders: scan against a Python loop, padding, reversal, and the cell equations."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.layers.recurrent import (RNNEncoder, carry_hidden, make_cell, reverse_padded,
                                          sequence_lengths)

B, S, E, H = 2, 5, 3, 4  # pairwise distinct
LENGTHS = np.array([5, 3])  # row 0 unpadded, row 1 padded


def _loop_direction(cell, step, params, x_SE, length, backward):
  """Steps one row through the cell by hand; returns outputs [S, H] and the final carry."""
  carry = cell.initialize_carry(jax.random.key(0), (1, x_SE.shape[-1]))
  outputs = np.zeros((x_SE.shape[0], cell.features), np.float32)
  order = range(length - 1, -1, -1) if backward else range(length)
  for t in order:
    carry, y = step({"params": params}, carry, x_SE[None, t])
    outputs[t] = np.asarray(y[0])
  return outputs, jax.tree.map(lambda c: np.asarray(c[0]), carry)


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
def test_scan_encoder_equals_python_loop_both_directions(kind):
  encoder = RNNEncoder(cell=kind, hidden_dim=H, num_layers=2, bidirectional=True)
  x_BSE = jax.random.normal(jax.random.key(1), (B, S, E))
  variables = encoder.init(jax.random.key(2), x_BSE, jnp.asarray(LENGTHS))
  outputs_BSD, final = encoder.apply(variables, x_BSE, jnp.asarray(LENGTHS))
  assert outputs_BSD.shape == (B, S, 2 * H)
  params = variables["params"]
  cell = make_cell(kind, H)
  step = jax.jit(cell.apply)  # one compile per input width, reused by every step
  for b, length in enumerate(LENGTHS):
    layer_input = np.asarray(x_BSE[b])
    for layer in range(2):
      fwd, fwd_carry = _loop_direction(cell, step, params[f"forward_{layer}"], layer_input, length, False)
      bwd, bwd_carry = _loop_direction(cell, step, params[f"backward_{layer}"], layer_input, length, True)
      layer_input = np.concatenate([fwd, bwd], axis=-1)
      expected_final = jax.tree.map(lambda f, k: np.concatenate([f, k]), fwd_carry, bwd_carry)
      got_final = jax.tree.map(lambda c, layer=layer: np.asarray(c[b, layer]), final)
      jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6),
                   got_final, expected_final)
    # layer_input is the loop's top layer: real positions match, padding is zero.
    np.testing.assert_allclose(outputs_BSD[b], layer_input, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(outputs_BSD[1, 3:]) == 0)


def test_unidirectional_final_state_is_state_at_last_real_token():
  encoder = RNNEncoder(cell="lstm", hidden_dim=H, num_layers=1)
  x_BSE = jax.random.normal(jax.random.key(3), (B, S, E))
  variables = encoder.init(jax.random.key(4), x_BSE, jnp.asarray(LENGTHS))
  outputs_BSD, (c_BLH, h_BLH) = encoder.apply(variables, x_BSE, jnp.asarray(LENGTHS))
  assert h_BLH.shape == c_BLH.shape == (B, 1, H)
  for b, length in enumerate(LENGTHS):
    np.testing.assert_allclose(h_BLH[b, 0], outputs_BSD[b, length - 1], rtol=1e-6)
  # Row 1's final state is not the state after stepping through its padding.
  assert not np.allclose(h_BLH[1, 0], outputs_BSD[0, S - 1])


def test_encoder_ignores_padding_content_and_extra_padding():
  encoder = RNNEncoder(cell="gru", hidden_dim=H, num_layers=2, bidirectional=True)
  lengths = jnp.asarray(LENGTHS)
  x_BSE = jax.random.normal(jax.random.key(5), (B, S, E))
  variables = encoder.init(jax.random.key(6), x_BSE, lengths)
  apply = jax.jit(encoder.apply)
  out_BSD, final = apply(variables, x_BSE, lengths)
  # Garbage in the padded slots and three more padded slots change nothing real.
  noisy_BSE = jnp.concatenate([x_BSE, jnp.zeros((B, 3, E))], axis=1)
  noise = 7.0 * jax.random.normal(jax.random.key(7), noisy_BSE.shape)
  real_BS1 = (jnp.arange(S + 3)[None, :] < lengths[:, None])[..., None]
  noisy_BSE = jnp.where(real_BS1, noisy_BSE, noise)
  noisy_out_BSD, noisy_final = apply(variables, noisy_BSE, lengths)
  np.testing.assert_allclose(noisy_out_BSD[:, :S], out_BSD, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(noisy_out_BSD[:, S:]) == 0)
  np.testing.assert_allclose(noisy_final, final, rtol=1e-5, atol=1e-6)


def test_reverse_padded_reverses_only_real_tokens():
  tokens_BS = jnp.array([[4, 5, 6, 2], [7, 2, 0, 0], [0, 0, 0, 0]])
  lengths_B = sequence_lengths(tokens_BS)
  np.testing.assert_array_equal(lengths_B, [4, 2, 0])
  reversed_BS = reverse_padded(tokens_BS, lengths_B)
  np.testing.assert_array_equal(reversed_BS, [[2, 6, 5, 4], [2, 7, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(reverse_padded(reversed_BS, lengths_B), tokens_BS)
  vectors_BSE = jnp.arange(4 * 3, dtype=jnp.float32).reshape(1, 4, 3)
  np.testing.assert_array_equal(reverse_padded(vectors_BSE, jnp.array([3]))[0, :, 0],
                                [6, 3, 0, 9])


def test_make_cell_rejects_unknown_kind():
  with pytest.raises(ValueError, match="cell='rnn'"):
    make_cell("rnn", 4)


# One step of each cell against its equations in float64 NumPy, with flax's weights.

def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _cell_step(kind, seed):
  cell = make_cell(kind, H)
  x_BE = jax.random.normal(jax.random.key(seed), (B, E))
  carry = jax.tree.map(lambda c: c + 0.5 * jax.random.normal(jax.random.key(seed + 1), c.shape),
                       cell.initialize_carry(jax.random.key(0), (B, E)))
  params = cell.init(jax.random.key(seed + 2), carry, x_BE)["params"]
  # Non-zero biases, so that a bias applied in the wrong place shows.
  params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(seed + 3), p.shape)
                        if p.ndim == 1 else p, params)
  new_carry, y = cell.apply({"params": params}, carry, x_BE)
  as64 = lambda tree: jax.tree.map(lambda a: np.asarray(a, np.float64), tree)
  return as64(params), np.asarray(x_BE, np.float64), as64(carry), as64(new_carry), np.asarray(y)


def test_lstm_step_equals_numpy_equations():
  p, x, (c, h), (new_c, new_h), y = _cell_step("lstm", 10)

  def gate(name):  # flax puts the bias on the recurrent (h) side of the LSTM
    return x @ p[f"i{name}"]["kernel"] + h @ p[f"h{name}"]["kernel"] + p[f"h{name}"]["bias"]

  i, f, o = _sigmoid(gate("i")), _sigmoid(gate("f")), _sigmoid(gate("o"))
  g = np.tanh(gate("g"))
  c_expected = f * c + i * g
  h_expected = o * np.tanh(c_expected)
  np.testing.assert_allclose(new_c, c_expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new_h, h_expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(y, h_expected, rtol=1e-5, atol=1e-6)
  assert carry_hidden((new_c, new_h)) is new_h


def test_gru_step_equals_numpy_equations_cudnn_form():
  p, x, h, new_h, y = _cell_step("gru", 20)
  dense = lambda name, v: v @ p[name]["kernel"] + p[name].get("bias", 0.0)
  r = _sigmoid(dense("ir", x) + dense("hr", h))
  z = _sigmoid(dense("iz", x) + dense("hz", h))
  # cuDNN / PyTorch form: the reset gate scales (U_n h + b_hn), not U_n (r * h).
  n = np.tanh(dense("in", x) + r * dense("hn", h))
  expected = (1.0 - z) * n + z * h
  np.testing.assert_allclose(new_h, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
  # Cho 2014's form differs for these weights, so the test tells the two apart.
  cho = np.tanh(dense("in", x) + (r * h) @ p["hn"]["kernel"])
  assert not np.allclose((1.0 - z) * cho + z * h, new_h, atol=1e-4)


def test_simple_step_equals_numpy_equation():
  p, x, h, new_h, _ = _cell_step("simple", 30)
  expected = np.tanh(x @ p["i"]["kernel"] + p["i"]["bias"] + h @ p["h"]["kernel"])
  np.testing.assert_allclose(new_h, expected, rtol=1e-5, atol=1e-6)


def test_cells_compute_in_requested_dtype_with_float32_params():
  cell = make_cell("gru", H, dtype=jnp.bfloat16)
  x = jnp.ones((B, E), jnp.bfloat16)
  carry = cell.initialize_carry(jax.random.key(0), (B, E))
  variables = cell.init(jax.random.key(1), carry, x)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables))
  _, y = cell.apply(variables, carry.astype(jnp.bfloat16), x)
  assert y.dtype == jnp.bfloat16
  assert isinstance(cell, nn.GRUCell)
