"""The output projections: the tied custom VJP against autodiff, both operand orders, the dense layer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.layers.embeddings import (TRANSPOSED_LOGITS_MAX_ROWS, TokenEmbedding,
                                             VocabProjection, output_logits, vocab_logits)


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
  # The same products; on the CPU a few rows are summed in the vocabulary-major order,
  # which may round the last bit differently.
  np.testing.assert_allclose(np.asarray(jax.jit(output_logits)(x_BTD, table_VD), np.float32),
                             np.asarray(jax.jit(plain)(x_BTD, table_VD), np.float32),
                             rtol=tolerance, atol=tolerance)
  for g, w in zip(got, want):
    assert g.dtype == w.dtype == dtype
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("rows", [1, 4, TRANSPOSED_LOGITS_MAX_ROWS, TRANSPOSED_LOGITS_MAX_ROWS + 1])
@pytest.mark.parametrize("weight_axes", ["VD", "DV"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_vocab_logits_against_float64(rows, weight_axes, with_bias):
  # Both operand orders (few rows: the table on the left, the bias added in that layout)
  # give the same logits.
  rng = np.random.default_rng(rows)
  x_ND = rng.normal(size=(rows, 16)).astype(np.float32)
  table_VD = rng.normal(size=(37, 16)).astype(np.float32)
  bias_V = rng.normal(size=(37,)).astype(np.float32) if with_bias else None
  weight = table_VD if weight_axes == "VD" else table_VD.T.copy()
  got = jax.jit(vocab_logits, static_argnames="weight_axes")(
      jnp.asarray(x_ND[:, None]), jnp.asarray(weight), weight_axes=weight_axes, bias=bias_V)
  assert got.shape == (rows, 1, 37) and got.dtype == jnp.float32
  want = x_ND.astype(np.float64) @ table_VD.astype(np.float64).T
  if with_bias:
    want = want + bias_V
  np.testing.assert_allclose(np.asarray(got)[:, 0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [3, TRANSPOSED_LOGITS_MAX_ROWS + 1])
def test_tied_attend_with_a_bias_matches_its_gradient(rows):
  # The decoding step's biased, vocabulary-major form and the training form: same
  # logits, and gradients equal to autodiff of the plain expression.
  rng = np.random.default_rng(rows)
  embed = TokenEmbedding(vocab_size=37, dim=16)
  x = jnp.asarray(rng.normal(size=(rows, 1, 16)), jnp.float32)
  params = embed.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
  bias_V = jnp.asarray(rng.normal(size=(37,)), jnp.float32)

  def ours(x, table, bias):
    return embed.apply({"params": {"embedding": table}}, x, bias, method=TokenEmbedding.attend)

  def plain(x, table, bias):
    return jnp.einsum("BTD,VD->BTV", x, table) + bias[None, None, :]

  np.testing.assert_allclose(jax.jit(ours)(x, params["embedding"], bias_V),
                             plain(x, params["embedding"], bias_V), rtol=1e-5, atol=1e-5)
  loss = lambda project: lambda *a: jnp.sum(jnp.sin(project(*a)))
  for g, w in zip(jax.grad(loss(ours), argnums=(0, 1, 2))(x, params["embedding"], bias_V),
                  jax.grad(loss(plain), argnums=(0, 1, 2))(x, params["embedding"], bias_V)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows", [3, 40])
def test_vocab_projection_is_a_dense_layer(rows):
  # Same parameters (names, shapes, initial values) and outputs as nn.Dense: checkpoints
  # written with either load into the other.
  x = jnp.asarray(np.random.default_rng(0).normal(size=(rows, 2, 8)), jnp.float32)
  ours = VocabProjection(13)
  dense = nn.Dense(13)
  params = ours.init(jax.random.key(1), x)["params"]
  dense_params = dense.init(jax.random.key(1), x)["params"]
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, dense_params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(dense_params)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(ours.apply({"params": params}, x),
                             dense.apply({"params": params}, x), rtol=1e-5, atol=1e-5)
