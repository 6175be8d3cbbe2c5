"""Additive (Bahdanau) and Luong (dot, general) attention against float64 NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.layers.attention import (AdditiveAttention, LuongAttention, masked_alignment)

B, T, S, Q, D, A = 2, 3, 5, 4, 6, 7  # pairwise distinct
REAL_B = np.array([5, 2])  # real source lengths


def _inputs(query_dim=Q, memory_dim=D):
  query_BTQ = jax.random.normal(jax.random.key(0), (B, T, query_dim))
  memory_BSD = jax.random.normal(jax.random.key(1), (B, S, memory_dim))
  mask_B11S = (np.arange(S)[None, :] < REAL_B[:, None])[:, None, None, :]
  return query_BTQ, memory_BSD, jnp.asarray(mask_B11S)


def _reference_softmax(scores_BTS):
  """float64 softmax over each row's real positions, zero on padding."""
  out = np.zeros_like(scores_BTS)
  for b, length in enumerate(REAL_B):
    row = scores_BTS[b, :, :length]
    e = np.exp(row - row.max(-1, keepdims=True))
    out[b, :, :length] = e / e.sum(-1, keepdims=True)
  return out


def _module(kind):
  if kind == "additive":
    return AdditiveAttention(attention_dim=A), (Q, D)
  if kind == "dot":
    return LuongAttention(kind="dot"), (D, D)
  return LuongAttention(kind="general", query_dim=Q), (Q, D)


def _reference_scores(kind, p, q, m):
  if kind == "additive":
    hidden = np.tanh((q @ p["query"]["kernel"])[:, :, None, :]
                     + (m @ p["key"]["kernel"] + p["key"]["bias"])[:, None, :, :])
    return hidden @ p["v"]
  if kind == "dot":
    return np.einsum("btd,bsd->bts", q, m)
  return np.einsum("btq,bsq->bts", q, m @ p["key"]["kernel"])  # q^T W_a h


@pytest.mark.parametrize("kind", ["additive", "dot", "general"])
def test_attention_equals_numpy_and_alignment_is_a_distribution_over_real_tokens(kind):
  module, (query_dim, memory_dim) = _module(kind)
  query_BTQ, memory_BSD, mask = _inputs(query_dim, memory_dim)
  variables = module.init(jax.random.key(2), query_BTQ, memory_BSD, mask)
  context_BTD, alignment_BTS = module.apply(variables, query_BTQ, memory_BSD, mask)
  assert context_BTD.shape == (B, T, memory_dim) and alignment_BTS.shape == (B, T, S)
  assert alignment_BTS.dtype == jnp.float32

  p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables.get("params", {}))
  q, m = np.asarray(query_BTQ, np.float64), np.asarray(memory_BSD, np.float64)
  expected_BTS = _reference_softmax(_reference_scores(kind, p, q, m))
  np.testing.assert_allclose(alignment_BTS, expected_BTS, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(context_BTD, np.einsum("bts,bsd->btd", expected_BTS, m),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(alignment_BTS.sum(-1), 1.0, rtol=1e-6)
  assert np.all(np.asarray(alignment_BTS[1, :, REAL_B[1]:]) == 0.0)

  # Padding invariance: whatever sits in the padded memory slots changes nothing.
  noisy_BSD = jnp.where(mask[:, 0, 0, :, None], memory_BSD, 100.0)
  noisy_context, noisy_alignment = module.apply(variables, query_BTQ, noisy_BSD, mask)
  np.testing.assert_allclose(noisy_context, context_BTD, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(noisy_alignment, alignment_BTS, rtol=1e-5, atol=1e-7)


def test_masked_alignment_fully_masked_row_is_uniform_and_finite():
  scores_BTS = jnp.array([[[1.0, 2.0, 3.0]]], jnp.bfloat16)
  nothing_B11S = jnp.zeros((1, 1, 1, 3), bool)
  alignment = masked_alignment(scores_BTS, nothing_B11S)
  assert alignment.dtype == jnp.float32
  np.testing.assert_allclose(alignment, np.full((1, 1, 3), 1 / 3), rtol=1e-6)


def test_masked_alignment_rejects_a_misshaped_mask():
  with pytest.raises(ValueError, match="axis S"):
    masked_alignment(jnp.zeros((B, T, S)), jnp.ones((B, 1, 1, S + 1), bool))


def test_dot_attention_needs_equal_widths():
  module = LuongAttention(kind="dot")
  query_BTQ, memory_BSD, mask = _inputs(Q, D)
  with pytest.raises(ValueError, match="query width 4 differs from key width 6"):
    module.init(jax.random.key(0), query_BTQ, memory_BSD, mask)


def test_bfloat16_attention_keeps_float32_alignment():
  module = AdditiveAttention(attention_dim=A, dtype=jnp.bfloat16)
  query_BTQ, memory_BSD, mask = _inputs()
  variables = module.init(jax.random.key(2), query_BTQ, memory_BSD, mask)
  context, alignment = module.apply(variables, query_BTQ, memory_BSD, mask)
  assert context.dtype == jnp.bfloat16 and alignment.dtype == jnp.float32
  np.testing.assert_allclose(alignment.sum(-1), 1.0, rtol=1e-6)
