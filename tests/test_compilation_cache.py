"""The tests' persistent compilation cache: a torn entry costs a compile, never a test."""

import pathlib
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _torn_entry(name: str) -> tuple:
  """Compiles a program only this test makes, then cuts its cache entry in half."""
  cache = pathlib.Path(jax.config.jax_compilation_cache_dir)
  offset = float(uuid.uuid4().int % 10_000)  # a constant of its own: a key of its own

  def program(x):
    return jnp.sin(x) * 3.0 + offset

  program.__name__ = name
  before = set(cache.glob(f"jit_{name}-*"))
  x = jnp.arange(4.0)
  want = np.sin(np.arange(4.0)) * 3.0 + offset
  np.testing.assert_allclose(jax.jit(program)(x), want, rtol=1e-6)
  (entry,) = set(cache.glob(f"jit_{name}-*-cache")) - before
  data = entry.read_bytes()
  entry.write_bytes(data[:len(data) // 2])
  jax.clear_caches()  # the next call reads the persistent cache again
  return program, x, want


def test_a_torn_cache_entry_is_recompiled_not_an_error():
  # The entry is truly torn: jax warns when it reads it (conftest keeps that warning from
  # becoming an error under filterwarnings = error; without it the second call would raise).
  program, x, want = _torn_entry("torn_entry_warns")
  with pytest.warns(UserWarning, match="Error reading persistent compilation cache entry"):
    np.testing.assert_allclose(jax.jit(program)(x), want, rtol=1e-6)
  program, x, want = _torn_entry("torn_entry_passes")
  np.testing.assert_allclose(jax.jit(program)(x), want, rtol=1e-6)
