"""The layers T5 adds, against float64 NumPy: RMSNorm, relative position buckets and bias,
the gated feed-forward layer, attention with a score bias and without scaling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.layers.attention import KVCache, MultiHeadAttention, dot_product_attention
from seq2seq_jax.layers.feedforward import FeedForward
from seq2seq_jax.layers.normalization import RMSNorm
from seq2seq_jax.layers.relative_position import RelativePositionBias, relative_position_buckets

B, T, S, H, K, D, F = 2, 3, 5, 4, 6, 7, 9  # pairwise distinct


def _buckets_float64(relative, bidirectional, num_buckets, max_distance):
  """T5's bucketing written from its definition, one offset at a time, in float64."""
  out = []
  for offset in np.ravel(relative):
    bucket, buckets = 0, num_buckets
    if bidirectional:
      buckets //= 2
      bucket += buckets if offset > 0 else 0
      distance = abs(offset)
    else:
      distance = max(-offset, 0)
    exact = buckets // 2
    if distance < exact:
      bucket += distance
    else:
      scaled = np.log(distance / exact) / np.log(max_distance / exact) * (buckets - exact)
      bucket += min(exact + int(scaled), buckets - 1)
    out.append(bucket)
  return np.asarray(out).reshape(np.shape(relative))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 12), (64, 256)])
def test_buckets_against_float64_definition(bidirectional, num_buckets, max_distance):
  relative = np.arange(-600, 601)
  ours = relative_position_buckets(relative, bidirectional=bidirectional,
                                   num_buckets=num_buckets, max_distance=max_distance)
  np.testing.assert_array_equal(ours, _buckets_float64(relative, bidirectional, num_buckets,
                                                       max_distance))
  assert ours.dtype == np.int32 and ours.min() >= 0 and ours.max() < num_buckets
  if not bidirectional:  # later keys share bucket 0 (the causal mask hides them)
    assert np.all(ours[relative > 0] == 0)


def test_buckets_equal_transformers():
  torch = pytest.importorskip("torch")
  t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
  relative = np.arange(-3000, 3001)
  for bidirectional in (True, False):
    theirs = t5.T5Attention._relative_position_bucket(
        torch.tensor(relative), bidirectional=bidirectional, num_buckets=32,
        max_distance=128).numpy()
    ours = relative_position_buckets(relative, bidirectional=bidirectional, num_buckets=32,
                                     max_distance=128)
    np.testing.assert_array_equal(ours, theirs)


def test_position_bias_full_and_one_row_agree():
  module = RelativePositionBias(num_heads=H, num_buckets=8, max_distance=10, bidirectional=False)
  params = module.init(jax.random.key(0), T, S)
  full_1HTS = module.apply(params, 6, 6)
  table = np.asarray(params["params"]["relative_attention_bias"])
  buckets = relative_position_buckets(np.arange(6)[None] - np.arange(6)[:, None],
                                      bidirectional=False, num_buckets=8, max_distance=10)
  np.testing.assert_array_equal(np.asarray(full_1HTS)[0], np.transpose(table[buckets], (2, 0, 1)))
  for index in range(6):
    row_HS = module.apply(params, jnp.int32(index), 6, method="row")
    np.testing.assert_array_equal(np.asarray(row_HS), np.asarray(full_1HTS)[0, :, index])


def test_rms_norm_against_float64():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B, T, D)).astype(np.float32) * 3
  scale = rng.normal(size=(D,)).astype(np.float32)
  y = RMSNorm(epsilon=1e-6).apply({"params": {"scale": scale}}, jnp.asarray(x))
  x64 = x.astype(np.float64)
  want = scale * x64 / np.sqrt(np.mean(x64 ** 2, axis=-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-6)
  half = RMSNorm(dtype=jnp.bfloat16).apply({"params": {"scale": scale}}, jnp.asarray(x))
  assert half.dtype == jnp.bfloat16


def test_gated_feed_forward_against_float64():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(B, T, D)).astype(np.float32)
  layer = FeedForward(F, D, activation="gelu_tanh", gated=True, use_bias=False)
  params = layer.init(jax.random.key(0), jnp.asarray(x))["params"]
  assert set(params) == {"wi_0", "wi_1", "wo"}
  assert all(set(p) == {"kernel"} for p in params.values())  # no biases
  y = layer.apply({"params": params}, jnp.asarray(x))
  w0, w1, wo = (np.asarray(params[n]["kernel"], np.float64) for n in ("wi_0", "wi_1", "wo"))
  a = x.astype(np.float64) @ w0
  gelu_tanh = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))
  np.testing.assert_allclose(np.asarray(y), (gelu_tanh * (x @ w1)) @ wo, rtol=1e-5, atol=1e-5)


def test_attention_with_bias_and_without_scaling_against_float64():
  rng = np.random.default_rng(2)
  q = rng.normal(size=(B, T, H, K)).astype(np.float32)
  k = rng.normal(size=(B, S, H, K)).astype(np.float32)
  v = rng.normal(size=(B, S, H, K)).astype(np.float32)
  bias = rng.normal(size=(1, H, T, S)).astype(np.float32)
  mask = np.ones((B, 1, T, S), bool)
  mask[1, :, :, 3:] = False
  out, weights = dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                       jnp.asarray(mask), bias=jnp.asarray(bias), scale=1.0,
                                       return_weights=True)
  scores = np.einsum("bthk,bshk->bhts", q.astype(np.float64), k) + bias
  scores = np.where(mask, scores, -np.inf)
  want_weights = np.exp(scores - scores.max(-1, keepdims=True))
  want_weights /= want_weights.sum(-1, keepdims=True)
  np.testing.assert_allclose(np.asarray(weights), want_weights, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(out), np.einsum("bhts,bshk->bthk", want_weights, v),
                             rtol=1e-5, atol=1e-5)


def test_unscaled_cached_step_with_bias_equals_full_attention():
  """``step`` with a bias row per position equals causal attention with the full bias."""
  rng = np.random.default_rng(3)
  attention = MultiHeadAttention(num_heads=H, head_dim=K, out_dim=D, use_bias=False,
                                 scale_queries=False)
  x = jnp.asarray(rng.normal(size=(B, S, D)).astype(np.float32))
  params = attention.init(jax.random.key(0), x, x)
  assert "bias" not in params["params"]["query"]
  bias_1HSS = jnp.asarray(rng.normal(size=(1, H, S, S)).astype(np.float32))
  causal = jnp.tril(jnp.ones((S, S), bool))[None, None]
  full = attention.apply(params, x, x, causal, bias=bias_1HSS)
  cache = KVCache.zeros(rows=B, layers=1, length=S, heads=H, head_dim=K)
  for t in range(S):
    out, cache = attention.apply(params, x[:, t:t + 1], cache, jnp.int32(t),
                                 bias_HT=bias_1HSS[0, :, t], block_size=2, method="step")
    np.testing.assert_allclose(np.asarray(out[:, 0]), np.asarray(full[:, t]), rtol=1e-5,
                               atol=1e-5, err_msg=f"position {t}")
