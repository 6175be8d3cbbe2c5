"""Scaled dot-product attention against a float64 NumPy reference; masks; the cached step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.layers import attention
from seq2seq_jax.types import NEG_INF

B, T, S, H, K = 2, 3, 5, 4, 6  # pairwise distinct, so a swapped axis cannot pass


def reference_attention(q, k, v, mask):
  """softmax(Q K^T / sqrt(K) + mask) V in float64, written independently of the library."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
  if mask is not None:
    scores = np.where(np.asarray(mask), scores, NEG_INF)
  scores = scores - scores.max(-1, keepdims=True)
  weights = np.exp(scores)
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("bhts,bshk->bthk", weights, v), weights


def random_qkv(seed, queries=T, keys=S):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32)
               for shape in ((B, queries, H, K), (B, keys, H, K), (B, keys, H, K)))


def _masks():
  """kind -> (the mask the library gets, its dense form for the reference, T, S).

  The dense forms are written out here, independently of the library's mask code;
  "attention_mask" hands ``dot_product_attention`` an ``AttentionMask`` instead.
  """
  keys_BS = jnp.array([[4, 5, 6, 0, 0], [7, 8, 9, 10, 11]])
  queries_BT = jnp.array([[4, 5, 0], [6, 7, 8]])
  square_BT = jnp.array([[4, 5, 6, 7, 0], [4, 5, 6, 7, 8]])
  padding = (keys_BS != 0)[:, None, None, :]
  padding_with_queries = jnp.logical_and(padding, (queries_BT != 0)[:, None, :, None])
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((S, S), bool)), (B, 1, S, S))
  combined = jnp.logical_and(causal, (square_BT != 0)[:, None, None, :])
  as_attention_mask = attention.AttentionMask(key_valid=square_BT != 0, causal=True)
  return {
      "none": (None, None, T, S),
      "padding": (padding, padding, T, S),
      "padding_with_queries": (padding_with_queries, padding_with_queries, T, S),
      "causal": (causal, causal, S, S),
      "combined": (combined, combined, S, S),
      "attention_mask": (as_attention_mask, combined, S, S),
  }


@pytest.mark.parametrize("kind", ["none", "padding", "padding_with_queries", "causal", "combined",
                                  "attention_mask"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_float64_reference(kind, seed):
  mask, dense, queries, keys = _masks()[kind]
  q, k, v = random_qkv(seed, queries, keys)
  out, weights = attention.dot_product_attention(q, k, v, mask, return_weights=True)
  want_out, want_weights = reference_attention(q, k, v, dense)
  assert out.shape == (B, queries, H, K) and weights.shape == (B, H, queries, keys)
  np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
  if dense is not None:  # masked positions get exactly zero weight unless the row is all masked
    full = np.broadcast_to(np.asarray(dense), weights.shape)
    live_rows = full.any(-1, keepdims=True)
    assert np.all(np.asarray(weights)[~full & np.broadcast_to(live_rows, full.shape)] == 0)


def test_fully_masked_row_is_uniform_not_nan():
  q, k, v = random_qkv(3)
  mask = jnp.zeros((B, 1, T, S), bool)
  _, weights = attention.dot_product_attention(q, k, v, mask, return_weights=True)
  np.testing.assert_allclose(weights, np.full((B, H, T, S), 1 / S), rtol=1e-6)


def test_dense_attention_mask_shapes_and_values():
  tokens = jnp.array([[3, 4, 0], [5, 0, 0]])
  padding = attention.AttentionMask(key_valid=tokens != 0).dense(batch=2, queries=3)
  assert padding.shape == (2, 1, 1, 3)
  np.testing.assert_array_equal(padding[:, 0, 0], [[True, True, False], [True, False, False]])
  causal = attention.AttentionMask(causal=True).dense(batch=2, queries=3)
  assert causal.shape == (2, 1, 3, 3)
  np.testing.assert_array_equal(causal[1, 0], np.tril(np.ones((3, 3), bool)))
  both = attention.AttentionMask(key_valid=tokens != 0, causal=True).dense(batch=2, queries=3)
  np.testing.assert_array_equal(both[1, 0], [[True, False, False]] * 3)
  np.testing.assert_array_equal(both[0, 0], [[True, False, False], [True, True, False],
                                              [True, True, False]])
  assert attention.AttentionMask().dense(batch=2, queries=3) is None


def test_bad_mask_and_shapes_are_named():
  q, k, v = random_qkv(0)
  with pytest.raises(ValueError, match="axis S has size 4"):
    attention.dot_product_attention(q, k, v, jnp.ones((B, 1, T, 4), bool))
  with pytest.raises(ValueError, match="bool"):
    attention.dot_product_attention(q, k, v, jnp.ones((B, 1, T, S), jnp.float32))
  with pytest.raises(ValueError, match="shapes do not line up"):
    attention.dot_product_attention(q, k[:, :, :2], v[:, :, :2])
  with pytest.raises(ValueError, match="implementation"):
    attention.dot_product_attention(q, k, v, implementation="flash")


def test_dropout_needs_rng_and_drops_weights():
  q, k, v = random_qkv(0)
  with pytest.raises(ValueError, match="dropout_rng"):
    attention.dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=False)
  out_a = attention.dot_product_attention(q, k, v, dropout_rng=jax.random.key(0),
                                          dropout_rate=0.5, deterministic=False)
  out_b = attention.dot_product_attention(q, k, v, dropout_rng=jax.random.key(0),
                                          dropout_rate=0.5, deterministic=False)
  plain = attention.dot_product_attention(q, k, v)
  np.testing.assert_array_equal(out_a, out_b)
  assert not np.allclose(out_a, plain)
  # deterministic=True ignores the rate
  np.testing.assert_array_equal(
      attention.dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=True), plain)


def test_jax_nn_route_agrees_with_einsums():
  mask, _, _, _ = _masks()["padding"]
  q, k, v = random_qkv(4)
  ours = attention.dot_product_attention(q, k, v, mask)
  fused = attention.dot_product_attention(q, k, v, mask, implementation="xla")
  np.testing.assert_allclose(fused, ours, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
def test_cudnn_route_agrees_with_einsums():
  """On a real GPU (the CPU checks cuDNN's call through XLA: test_fused_attention.py)."""
  keys_BS = jnp.array([[4, 5, 6, 0, 0, 0], [7, 8, 9, 10, 11, 12]])
  mask = attention.AttentionMask(key_valid=keys_BS != 0)
  q, k, v = (a.astype(jnp.bfloat16) for a in random_qkv(5, queries=4, keys=6))
  ours = attention.dot_product_attention(q, k, v, mask)
  fused = attention.dot_product_attention(q, k, v, mask, implementation="cudnn")
  np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(ours, np.float32),
                             rtol=2e-2, atol=2e-2)


def test_bfloat16_softmax_runs_in_float32():
  q, k, v = (a.astype(jnp.bfloat16) for a in random_qkv(6))
  out, weights = attention.dot_product_attention(q, k, v, return_weights=True)
  assert out.dtype == jnp.bfloat16 and weights.dtype == jnp.bfloat16
  want, _ = reference_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                                v.astype(jnp.float32), None)
  np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fused_projections_match_each_projection_in_float64(dtype):
  D = 10
  mha = attention.MultiHeadAttention(num_heads=H, head_dim=K, out_dim=D, dtype=dtype)
  x_BSD = jax.random.normal(jax.random.key(1), (B, S, D))
  variables = mha.init(jax.random.key(0), x_BSD, x_BSD)
  names = ("query", "key", "value")
  got = mha.apply(variables, x_BSD, names, method=attention.MultiHeadAttention._project)
  tol = 1e-5 if dtype == jnp.float32 else 3e-2
  for name, got_BSHK in zip(names, got, strict=True):
    p = {k: np.asarray(v, np.float64) for k, v in variables["params"][name].items()}
    want = np.einsum("bsd,dhk->bshk", np.asarray(x_BSD, np.float64), p["kernel"]) + p["bias"]
    assert got_BSHK.dtype == dtype and got_BSHK.shape == (B, S, H, K)
    np.testing.assert_allclose(np.asarray(got_BSHK, np.float64), want, rtol=tol, atol=tol)
  # Self attention (the same array twice) projects q, k and v together; a copy of
  # the array goes through the projections one by one: the same result.
  causal = attention.AttentionMask(causal=True).dense(batch=B, queries=S)
  fused = mha.apply(variables, x_BSD, x_BSD, causal)
  separate = mha.apply(variables, x_BSD, jnp.array(x_BSD, copy=True), causal)
  np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(separate, np.float32),
                             rtol=tol, atol=tol)


@pytest.mark.parametrize("block_size", [2, 3, 32])  # several blocks, a clamped last block, one
def test_multi_head_step_matches_full_causal_attention(block_size):
  D, L, layer = 10, 3, 1
  mha = attention.MultiHeadAttention(num_heads=H, head_dim=K, out_dim=D)
  x_BTD = jax.random.normal(jax.random.key(1), (B, S, D))
  params = mha.init(jax.random.key(0), x_BTD, x_BTD)
  causal = jnp.tril(jnp.ones((S, S), bool))[None, None]  # [1, 1, T, T]: every row
  full_BTD = mha.apply(params, x_BTD, x_BTD, causal)
  cache = attention.KVCache.zeros(rows=B, layers=L, length=S, heads=H, head_dim=K)
  step = jax.jit(lambda x, c, t: mha.apply(params, x, c, t, layer=layer, block_size=block_size,
                                           method="step"))
  for t in range(S):
    out_B1D, cache = step(x_BTD[:, t:t + 1], cache, jnp.int32(t))
    np.testing.assert_allclose(out_B1D[:, 0], full_BTD[:, t], rtol=1e-5, atol=1e-5)
  # Other layers' buffers are untouched.
  assert not np.any(cache.key[0]) and not np.any(cache.key[2]) and np.all(cache.key[1])


def _written_cache(rng, rows, length, filled):
  """A KVCache with random keys and values at positions < filled, written through ``write``."""
  cache = attention.KVCache.zeros(rows=rows, layers=2, length=length, heads=H, head_dim=K)
  for t in range(filled):
    for layer in range(2):
      k, v = (jnp.asarray(rng.standard_normal((rows, H, K)), jnp.float32) for _ in range(2))
      cache = cache.write(k, v, jnp.int32(t), layer)
  return cache


def _reference_step(q_NHK, key_NLTHK, value_NLTHK, layer, index):
  """One query per row over positions <= index, float64."""
  k = np.asarray(key_NLTHK, np.float64)[:, layer, :index + 1]
  v = np.asarray(value_NLTHK, np.float64)[:, layer, :index + 1]
  scores = np.einsum("nhk,nshk->nhs", np.asarray(q_NHK, np.float64), k)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("nhs,nshk->nhk", weights, v)


@pytest.mark.parametrize("block_size", [1, 2, 4, 7, 64])
def test_kv_cache_reads_blocks_up_to_the_position_only(block_size):
  rng = np.random.default_rng(0)
  cache = _written_cache(rng, rows=3, length=7, filled=5)
  q_NHK = jnp.asarray(rng.standard_normal((3, H, K)), jnp.float32)
  for index in range(5):
    got = cache.attend(q_NHK, jnp.int32(index), 1, block_size=block_size)
    np.testing.assert_allclose(got, _reference_step(q_NHK, *cache.resolved(), 1, index),
                               rtol=1e-5, atol=1e-5, err_msg=f"index {index}")
  # Garbage past the position must not leak in: positions >= 5 were never written,
  # so fill them with huge values and read again at index 4.
  poisoned = cache.replace(key=tuple(b.at[:, 5:].set(1e4) for b in cache.key),
                           value=tuple(b.at[:, 5:].set(1e4) for b in cache.value))
  np.testing.assert_allclose(poisoned.attend(q_NHK, jnp.int32(4), 1, block_size=block_size),
                             cache.attend(q_NHK, jnp.int32(4), 1, block_size=block_size),
                             rtol=1e-6)


def test_kv_cache_gather_rows_moves_histories_without_copying_buffers():
  rng = np.random.default_rng(1)
  rows, length = 4, 6
  cache = _written_cache(rng, rows=rows, length=length, filled=2)
  # Reference: the same history kept by copying rows physically, as a plain gather would.
  copied_k, copied_v = (np.asarray(a) for a in cache.resolved())
  for t, parents in ((2, [1, 1, 3, 0]), (3, [2, 0, 0, 3]), (4, [3, 3, 1, 2])):
    cache = cache.gather_rows(jnp.array(parents))
    copied_k, copied_v = copied_k[parents], copied_v[parents]
    k, v = (jnp.asarray(rng.standard_normal((rows, H, K)), jnp.float32) for _ in range(2))
    cache = cache.write(k, v, jnp.int32(t), 0)
    copied_k[:, 0, t], copied_v[:, 0, t] = k, v
    got_k, got_v = cache.resolved()
    np.testing.assert_array_equal(np.asarray(got_k)[:, :, :t + 1], copied_k[:, :, :t + 1])
    np.testing.assert_array_equal(np.asarray(got_v)[:, :, :t + 1], copied_v[:, :, :t + 1])
    q_NHK = jnp.asarray(rng.standard_normal((rows, H, K)), jnp.float32)
    np.testing.assert_allclose(cache.attend(q_NHK, jnp.int32(t), 0, block_size=2),
                               _reference_step(q_NHK, copied_k, copied_v, 0, t),
                               rtol=1e-5, atol=1e-5)
  # A different row count (tiling for beams) copies the histories out.
  tiled = cache.gather_rows(jnp.repeat(jnp.arange(rows), 2))
  assert tiled.key[0].shape[0] == 2 * rows
  np.testing.assert_array_equal(np.asarray(tiled.resolved()[0])[:, :, :5],
                                np.repeat(copied_k, 2, axis=0)[:, :, :5])


@pytest.mark.parametrize("branch", ["cpu", "other"])
def test_kv_cache_of_beams_follows_slots_on_every_platform(branch, monkeypatch):
  # The CPU gathers each row's entries; other platforms (TPU) score every row of the
  # sentence's group and keep the one the slot names. Both run here: `on_cpu` is
  # forced to the branch a program lowered for that platform would hold.
  if branch == "other":
    monkeypatch.setattr(attention, "on_cpu", lambda cpu, other, *args: other(*args))
  rng = np.random.default_rng(2)
  sentences, beams, length = 2, 3, 7
  cache = _written_cache(rng, rows=sentences, length=length, filled=2)
  copied_k, copied_v = (np.asarray(a) for a in cache.resolved())
  cache = cache.gather_rows(jnp.repeat(jnp.arange(sentences), beams))  # expand_to_beams
  assert cache.beams == beams and not cache.rows_in_order
  copied_k, copied_v = np.repeat(copied_k, beams, 0), np.repeat(copied_v, beams, 0)
  rows = sentences * beams
  for t, parents in ((2, [[1, 1, 0], [2, 0, 0]]), (3, [[2, 0, 0], [1, 1, 2]]),
                     (4, [[0, 2, 1], [2, 2, 2]]), (5, [[1, 0, 1], [0, 1, 2]])):
    flat = (np.arange(sentences)[:, None] * beams + np.array(parents)).reshape(rows)
    cache = cache.gather_rows(jnp.asarray(flat))
    copied_k, copied_v = copied_k[flat], copied_v[flat]
    k, v = (jnp.asarray(rng.standard_normal((rows, H, K)), jnp.float32) for _ in range(2))
    cache = cache.write(k, v, jnp.int32(t), 1)
    copied_k[:, 1, t], copied_v[:, 1, t] = k, v
    q_NHK = jnp.asarray(rng.standard_normal((rows, H, K)), jnp.float32)
    for block_size in (2, 8):
      np.testing.assert_allclose(cache.attend(q_NHK, jnp.int32(t), 1, block_size=block_size),
                                 _reference_step(q_NHK, copied_k, copied_v, 1, t),
                                 rtol=1e-5, atol=1e-5, err_msg=f"step {t}, blocks {block_size}")
  got_k, _ = cache.resolved()
  np.testing.assert_array_equal(np.asarray(got_k)[:, :, :6], copied_k[:, :, :6])
