"""The tied output projection's custom VJP against autodiff of the plain einsum."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.layers.embeddings import output_logits


@pytest.mark.parametrize("dtype, tolerance", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_output_logits_gradients_match_autodiff(dtype, tolerance):
  rng = np.random.default_rng(0)
  x_BTD = jnp.asarray(rng.normal(size=(2, 3, 8)), dtype)
  table_VD = jnp.asarray(rng.normal(size=(11, 8)), dtype)
  weights_BTV = jnp.asarray(rng.normal(size=(2, 3, 11)), jnp.float32)

  def plain(x, table):
    return jnp.einsum("BTD,VD->BTV", x, table, preferred_element_type=jnp.float32)

  def objective(project):
    return lambda x, table: jnp.sum(jnp.sin(project(x, table)) * weights_BTV)

  got = jax.jit(jax.grad(objective(output_logits), argnums=(0, 1)))(x_BTD, table_VD)
  want = jax.jit(jax.grad(objective(plain), argnums=(0, 1)))(x_BTD, table_VD)
  np.testing.assert_array_equal(np.asarray(jax.jit(output_logits)(x_BTD, table_VD)),
                                np.asarray(jax.jit(plain)(x_BTD, table_VD)))
  for g, w in zip(got, want):
    assert g.dtype == w.dtype == dtype
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               rtol=tolerance, atol=tolerance)
