"""Philox-2x32-10 against the published known-answer vectors; the dropout masks' statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.layers.dropout import Dropout, _mulhilo64, keep_mask, philox2x32

# Random123's kat_vectors for philox2x32 with 10 rounds (the generator keep_mask uses).
KNOWN_ANSWERS_2X32 = [
    ((0, 0), 0, (0xFF1DAE59, 0x6CD10DF2)),
    ((0xFFFFFFFF, 0xFFFFFFFF), 0xFFFFFFFF, (0x2C3F628B, 0xAB4FD7AD)),
    ((0x243F6A88, 0x85A308D3), 0x13198A2E, (0xDD7CE038, 0xF62A4C12)),
]


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS_2X32)
def test_philox2x32_matches_the_known_answers(counter, key, expected):
  block = jax.jit(philox2x32)
  words = block(tuple(jnp.uint32(c) for c in counter), jnp.uint32(key))
  assert [int(w) for w in words] == list(expected)
  batch = tuple(jnp.array([7, c, c], jnp.uint32) for c in counter)
  words = block(batch, jnp.uint32(key))
  assert [int(w[1]) for w in words] == list(expected)
  assert all(w.dtype == jnp.uint32 for w in words)


def test_mulhilo_against_python_integers():
  rng = np.random.default_rng(0)
  x = rng.integers(0, 2 ** 32, size=1000, dtype=np.uint64)
  x[:3] = [0, 1, 2 ** 32 - 1]
  for multiplier in (0xD256D193, 0xD2511F53, 0xFFFFFFFF):
    high, low = jax.jit(lambda x, m=multiplier: _mulhilo64(m, x))(jnp.asarray(x.astype(np.uint32)))
    assert high.dtype == low.dtype == jnp.uint32
    product = [int(v) * multiplier for v in x]
    assert np.asarray(high).tolist() == [p >> 32 for p in product]
    assert np.asarray(low).tolist() == [p & 0xFFFFFFFF for p in product]


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_masks_keep_the_right_share_independently(rate):
  n = 1 << 20
  a = np.asarray(keep_mask(jax.random.key(0), rate, (n,)), np.float64)
  b = np.asarray(keep_mask(jax.random.key(1), rate, (n,)), np.float64)
  sigma = np.sqrt(rate * (1 - rate) / n)
  assert abs(a.mean() - (1 - rate)) < 5 * sigma
  assert abs(b.mean() - (1 - rate)) < 5 * sigma
  # Uncorrelated across keys, and between neighbours within one mask.
  for x, y in ((a, b), (a[1:], a[:-1]), (a[4:], a[:-4])):
    assert abs(np.corrcoef(x, y)[0, 1]) < 5 / np.sqrt(n)


def test_mask_shape_and_the_same_key_gives_the_same_mask():
  first = keep_mask(jax.random.key(3), 0.3, (4, 5, 6))
  assert first.shape == (4, 5, 6) and first.dtype == jnp.bool_
  np.testing.assert_array_equal(first, keep_mask(jax.random.key(3), 0.3, (4, 5, 6)))
  with pytest.raises(ValueError, match="rate"):
    keep_mask(jax.random.key(3), 1.0, (2,))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dropout_scales_what_it_keeps_and_is_unbiased(dtype):
  x = jnp.full((512, 512), 3.0, dtype)
  y = Dropout(0.25).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  assert y.dtype == dtype
  values = np.unique(np.asarray(y, np.float32))
  np.testing.assert_allclose(values, [0.0, 4.0])
  assert abs(float(np.asarray(y, np.float32).mean()) - 3.0) < 0.03
  # Deterministic, rate 0 and rate 1 need no rng.
  np.testing.assert_array_equal(Dropout(0.25).apply({}, x, deterministic=True), x)
  np.testing.assert_array_equal(Dropout(0.0).apply({}, x, deterministic=False), x)
  assert not np.any(np.asarray(Dropout(1.0).apply({}, x, deterministic=False), np.float32))


def test_dropout_draws_from_the_dropout_stream():
  x = jnp.ones((64, 64))
  apply = lambda seed: Dropout(0.5).apply({}, x, deterministic=False,
                                          rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(apply(0), apply(0))
  assert np.any(np.asarray(apply(0)) != np.asarray(apply(1)))
