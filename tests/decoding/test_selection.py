"""Two-stage argmax and top-k against jnp.argmax and lax.top_k, ties and infinities included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.decoding import selection
from seq2seq_jax.platforms import VOCAB_MAJOR_MAX_ROWS, VOCAB_MAJOR_MIN_ROWS

# Row lengths: below the blocked threshold, with a divisor near sqrt (58101 = 181 x 321,
# the OPUS-MT vocabulary), a power of two, and a prime (no divisor: sliced blocks).
LENGTHS = [37, 2048 + 5 * 7, 58101, 8192, 5003]


def _rows(rng, length, *, ties: bool) -> np.ndarray:
  """Five rows: random floats, or a few distinct values (many ties across blocks)."""
  if ties:
    rows = rng.integers(0, 4, size=(5, length)).astype(np.float32)
  else:
    rows = rng.standard_normal((5, length)).astype(np.float32)
  rows[1, :] = -np.inf  # nothing finite
  rows[2, : length // 2] = -np.inf
  rows[3, -1] = rows[3].max() + 1  # the maximum in the last (possibly partial) block
  return rows


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("ties", [False, True])
# From VOCAB_MAJOR_MIN_ROWS to VOCAB_MAJOR_MAX_ROWS rows the maxima run along the
# vocabulary axis of x.T; other row counts along each row.
@pytest.mark.parametrize("rows", [5, VOCAB_MAJOR_MIN_ROWS, VOCAB_MAJOR_MAX_ROWS + 1])
def test_argmax_equals_jnp_argmax(length, ties, rows):
  rng = np.random.default_rng(length)
  x = _rows(rng, length, ties=ties)
  x = jnp.asarray(np.concatenate([x] * (rows // 5) + [x[:rows % 5]]))
  got = jax.jit(selection.argmax)(x)
  np.testing.assert_array_equal(got, jnp.argmax(x, axis=-1))
  assert got.dtype == jnp.int32


def test_argmax_keeps_leading_axes():
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 3, 4099)).astype(np.float32))
  np.testing.assert_array_equal(selection.argmax(x), jnp.argmax(x, axis=-1))


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("k", [1, 2, 8, 13])
def test_top_k_equals_lax_top_k(length, ties, k):
  x = jnp.asarray(_rows(np.random.default_rng(length + k), length, ties=ties))
  values, indices = jax.jit(selection.top_k, static_argnums=1)(x, k)
  want_values, want_indices = jax.lax.top_k(x, k)
  np.testing.assert_array_equal(values, want_values)
  np.testing.assert_array_equal(indices, want_indices)
  assert indices.dtype == jnp.int32


def test_top_k_ties_go_to_the_lowest_index_across_blocks():
  # Equal values in many blocks: the k chosen must be the first k positions holding them,
  # which a block choice that ignored the blocks' order would miss.
  length = 58101
  x = np.zeros((1, length), np.float32)
  x[0, ::997] = 5.0
  values, indices = selection.top_k(jnp.asarray(x), 8)
  np.testing.assert_array_equal(indices[0], np.arange(8) * 997)
  np.testing.assert_array_equal(values[0], np.full(8, 5.0))


def test_top_k_over_beams_of_a_vocabulary():
  # The beam search's call: [B, W * V] candidates, top 2W.
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((4, 4 * 58101)).astype(np.float32))
  values, indices = selection.top_k(x, 8)
  want_values, want_indices = jax.lax.top_k(x, 8)
  np.testing.assert_array_equal(indices, want_indices)
  np.testing.assert_array_equal(values, want_values)


@pytest.mark.parametrize("k", [0, 38, 2.0])
def test_top_k_rejects_a_k_outside_the_row(k):
  with pytest.raises(ValueError, match="0 < k <= 37"):
    selection.top_k(jnp.zeros((2, 37)), k)


@pytest.mark.parametrize("length", [37, 58101, 5003])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("branch", ["cpu", "other"])
def test_top_k_of_rows_equals_lax_top_k_over_the_flat_rows(length, ties, branch, monkeypatch):
  # Beam search's choice among W x V: off the CPU each row's best first, then the best
  # of those; both branches run here (`on_cpu` forced to the one another platform gets).
  if branch == "other":
    monkeypatch.setattr(selection.platforms, "on_cpu", lambda cpu, other, *args: other(*args))
  rng = np.random.default_rng(length + 1)
  x_BWV = np.stack([_rows(rng, length, ties=ties)[:4] for _ in range(3)])  # B 3, W 4
  x_BWV[0, :, :] = 1.0  # every candidate tied: the lowest flat indices win
  x_BWV = jnp.asarray(x_BWV)
  for k in (1, 8, 37):
    values, indices = jax.jit(selection.top_k_of_rows, static_argnums=1)(x_BWV, k)
    expected_values, expected_indices = jax.lax.top_k(x_BWV.reshape(3, 4 * length), k)
    np.testing.assert_array_equal(indices, expected_indices, err_msg=f"k={k}")
    np.testing.assert_array_equal(values, expected_values)
    assert indices.dtype == jnp.int32
