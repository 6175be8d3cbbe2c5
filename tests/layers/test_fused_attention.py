"""Fused attention (``attention_impl``) against the einsums: every mask, forward and gradients.

Splash runs here through Pallas' interpret mode (exact, slow: small shapes, lengths
of its 128-position tiles). cuDNN cannot run on a CPU: its call is
``fused_attention.jax_attention`` with implementation "cudnn", and the same call
with "xla" checks its masks; the tests that fake a GPU platform route "cudnn" there.
That it lowers to cuDNN's kernel is checked for the compile-only H100
(``tests/aot/test_fused_kernels.py``, run by ``make test-cuda``).
"""

import logging
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.layers import attention, fused_attention
from seq2seq_jax.layers.attention import AttentionMask

B, H, K = 2, 3, 16  # with T = 256 and S = 128 below: pairwise distinct
T, S = 256, 128


def _segments(lengths, total):
  ids = np.zeros(total, np.int32)
  start = 0
  for n, length in enumerate(lengths, start=1):
    ids[start:start + length] = n
    start += length
  return ids


def _cases():
  """name -> (mask, queries, keys). Row 0 and row 1 differ in every case."""
  valid = lambda lengths, total: jnp.asarray(np.arange(total)[None] < np.array(lengths)[:, None])
  q_segments = jnp.asarray(np.stack([_segments((100, 120), T), _segments((256,), T)]))
  self_segments = jnp.asarray(np.stack([_segments((90, 100, 30), T), _segments((200,), T)]))
  k_segments = jnp.asarray(np.stack([_segments((60, 50), S), _segments((128,), S)]))
  empty_k_segments = jnp.asarray(np.stack([np.zeros(S, np.int32), _segments((128,), S)]))
  return {
      "padding": (AttentionMask(key_valid=valid((200, 256), T)), T, T),
      "causal": (AttentionMask(causal=True), T, T),
      "causal_padding": (AttentionMask(key_valid=valid((256, 170), T), causal=True), T, T),
      "cross_padding": (AttentionMask(key_valid=valid((100, 128), S)), T, S),
      "packed_self": (AttentionMask(key_valid=self_segments != 0,
                                    query_segment_ids=self_segments,
                                    key_segment_ids=self_segments), T, T),
      "packed_causal": (AttentionMask(query_segment_ids=self_segments,
                                      key_segment_ids=self_segments, causal=True), T, T),
      "packed_cross": (AttentionMask(key_valid=k_segments != 0, query_segment_ids=q_segments,
                                     key_segment_ids=k_segments), T, S),
      # Row 0 attends no key at all: the einsums give the mean of the values and no
      # gradient to q or k; every kernel must give the same, forward and backward.
      "empty_rows": (AttentionMask(key_valid=valid((0, 90), S)), T, S),
      "packed_empty_rows": (AttentionMask(key_valid=empty_k_segments != 0,
                                          query_segment_ids=q_segments,
                                          key_segment_ids=empty_k_segments), T, S),
  }


def _real_queries(mask, queries):
  """bool [B, T]: the queries whose output is used (not padding of a packed row)."""
  if mask.packed:
    return np.asarray(mask.query_segment_ids != 0)
  return np.ones((B, queries), bool)


def _qkv(seed, queries, keys, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.standard_normal(shape), dtype)
               for shape in ((B, queries, H, K), (B, keys, H, K), (B, keys, H, K)))


def _outputs_and_grads(implementation, mask, q, k, v, real_BT):
  weights_BTHK = jnp.asarray(np.random.default_rng(9).standard_normal(q.shape), q.dtype)
  weights_BTHK = weights_BTHK * jnp.asarray(real_BT[:, :, None, None], q.dtype)

  def loss(q, k, v):
    out = attention.dot_product_attention(q, k, v, mask, implementation=implementation)
    return jnp.sum((out * weights_BTHK).astype(jnp.float32)), out

  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out, grads


def _assert_close(got, want, real_BT, tolerance):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got[real_BT], want[real_BT], rtol=tolerance, atol=tolerance)


def spy_on_kernels(monkeypatch) -> list[str]:
  """The resolved implementations that reach ``fused_attention.fused_attention``, in order."""
  reached = []
  real = fused_attention.fused_attention

  def spied(*args, implementation, **kwargs):
    reached.append(implementation)
    return real(*args, implementation=implementation, **kwargs)

  monkeypatch.setattr(fused_attention, "fused_attention", spied)
  return reached


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("implementation", ["xla", "splash"])
def test_each_kernel_equals_the_einsums_forward_and_backward(monkeypatch, implementation, case):
  """"xla" is also cuDNN's call (``jax_attention``), with XLA's implementation."""
  mask, queries, keys = _cases()[case]
  q, k, v = _qkv(1, queries, keys)
  real = _real_queries(mask, queries)
  want_out, want_grads = _outputs_and_grads(None, mask, q, k, v, real)
  reached = spy_on_kernels(monkeypatch)
  got_out, got_grads = _outputs_and_grads(implementation, mask, q, k, v, real)
  assert reached == [implementation]
  _assert_close(got_out, want_out, real, 2e-5)
  _assert_close(got_grads[0], want_grads[0], real, 2e-5)  # dq: real queries
  for got, want in zip(got_grads[1:], want_grads[1:]):  # dk, dv: every key
    _assert_close(got, want, np.ones(got.shape[:2], bool), 2e-5)


def test_a_dropped_segment_mask_would_fail_the_comparison():
  """The comparison above can fail: splash without the segment ids differs from the einsums."""
  mask, queries, keys = _cases()["packed_cross"]
  q, k, v = _qkv(2, queries, keys)
  real = _real_queries(mask, queries)
  want = attention.dot_product_attention(q, k, v, mask)
  got = fused_attention.splash_attention(q, k, v, None, scale=K ** -0.5)
  assert np.max(np.abs(np.asarray(got - want))[real]) > 1e-2


def fake_device(monkeypatch, platform, kind, capability=None):
  """Traces as if for a device of ``platform``, ``kind`` (its ``device_kind``) and, for an
  NVIDIA GPU, compute ``capability``."""
  device = types.SimpleNamespace(platform=platform, device_kind=kind)
  if capability is not None:
    device.compute_capability = capability
  monkeypatch.setattr(fused_attention, "_traced_device", lambda: device)


class _FakeGPU:
  """Traces as if for an NVIDIA GPU and runs cuDNN's call through XLA's implementation."""

  def __init__(self, monkeypatch, capability="9.0"):
    self.calls = []
    real = jax.nn.dot_product_attention

    def recorded(*args, implementation=None, **kwargs):
      self.calls.append(dict(kwargs, implementation=implementation))
      return real(*args, implementation="xla" if implementation == "cudnn" else implementation,
                  **kwargs)

    fake_device(monkeypatch, "gpu", "NVIDIA H100 80GB HBM3", capability)
    monkeypatch.setattr(jax.nn, "dot_product_attention", recorded)


def _assert_cudnn_equals_the_einsums(mask, queries, keys):
  q, k, v = _qkv(3, queries, keys, jnp.bfloat16)
  real = _real_queries(mask, queries)
  want_out, want_grads = _outputs_and_grads(None, mask, q, k, v, real)
  for implementation in ("cudnn", "auto"):
    got_out, got_grads = _outputs_and_grads(implementation, mask, q, k, v, real)
    _assert_close(got_out, want_out, real, 3e-2)
    _assert_close(got_grads[0], want_grads[0], real, 6e-2)
    for got, want in zip(got_grads[1:], want_grads[1:]):
      _assert_close(got, want, np.ones(got.shape[:2], bool), 6e-2)


@pytest.mark.parametrize("case", ["causal_padding", "cross_padding", "empty_rows"])
def test_cudnn_takes_padding_as_lengths_and_causality_as_its_own(monkeypatch, case):
  """Nothing T x S reaches cuDNN: each row's key length and its causal flag."""
  gpu = _FakeGPU(monkeypatch)
  mask, queries, keys = _cases()[case]
  _assert_cudnn_equals_the_einsums(mask, queries, keys)
  call = gpu.calls[-1]
  assert call["implementation"] == "cudnn" and call["is_causal"] == mask.causal
  assert call["mask"] is None and call["bias"] is None
  want_lengths = np.maximum(np.asarray(mask.key_valid).sum(axis=1), 1)
  np.testing.assert_array_equal(call["key_value_seq_lengths"], want_lengths)


@pytest.mark.parametrize("case", ["packed_causal", "packed_cross", "packed_empty_rows"])
def test_cudnn_takes_packed_rows_as_a_bias_and_says_so(monkeypatch, caplog, case):
  monkeypatch.setattr(fused_attention, "_LOGGED", set())
  gpu = _FakeGPU(monkeypatch)
  mask, queries, keys = _cases()[case]
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax"):
    _assert_cudnn_equals_the_einsums(mask, queries, keys)
  call = gpu.calls[-1]
  assert call["mask"].shape == (B, 1, queries, keys) and call["is_causal"] == mask.causal
  assert any("[B, 1, T, S] bias" in r.getMessage() for r in caplog.records)


def test_cudnn_is_refused_by_name_when_traced_for_another_platform():
  mask, queries, keys = _cases()["padding"]
  q, k, v = _qkv(4, queries, keys, jnp.bfloat16)
  with pytest.raises(ValueError, match="attention_impl='cudnn' needs an NVIDIA GPU.*cpu"):
    attention.dot_product_attention(q, k, v, mask, implementation="cudnn")


def test_auto_runs_the_einsums_on_the_cpu_bit_for_bit(monkeypatch):
  calls = []
  monkeypatch.setattr(jax.nn, "dot_product_attention", lambda *a, **k: calls.append(k))
  monkeypatch.setattr(fused_attention, "splash_attention", lambda *a, **k: calls.append(k))
  mask, queries, keys = _cases()["packed_cross"]
  q, k, v = _qkv(5, queries, keys)
  np.testing.assert_array_equal(attention.dot_product_attention(q, k, v, mask, implementation="auto"),
                                attention.dot_product_attention(q, k, v, mask))
  assert not calls
  assert fused_attention.resolve("auto") == "einsum"


@pytest.mark.parametrize("platform, kind, capability, kernel", [
    ("tpu", "TPU v5 lite", None, "splash"), ("gpu", "NVIDIA H100 80GB HBM3", "9.0", "cudnn"),
    ("gpu", "NVIDIA A100-SXM4-40GB", "8.0", "cudnn"),
    ("gpu", "NVIDIA GeForce GTX 1080 Ti", "6.1", "einsum"),  # pre-Ampere: no flash attention
    ("gpu", "Tesla V100-SXM2-16GB", "7.0", "einsum"),
    ("gpu", "AMD Instinct MI300X", "gfx942", "einsum"), ("cpu", "cpu", None, "einsum")])
def test_auto_resolves_by_the_traced_platform(monkeypatch, platform, kind, capability, kernel):
  fake_device(monkeypatch, platform, kind, capability)
  assert fused_attention.resolve("auto") == kernel
  assert fused_attention.resolve("xla") == "xla"


def _refusal_cases():
  q, k, _ = _qkv(6, T, S)
  short_q, short_k, _ = _qkv(6, 24, 40)
  bias = jnp.zeros((1, H, T, S))
  no = dict(bias=None, use_dropout=False, return_weights=False)
  return [
      ("splash", q, k, dict(no, use_dropout=True), "attention dropout"),
      ("cudnn", q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), dict(no, bias=bias),
       "bias"),
      ("splash", q, k, dict(no, bias=bias), "bias"),
      ("splash", short_q, short_k, no, "not multiples of splash's block of 128"),
      ("cudnn", q, k, no, "bfloat16 or float16, not float32"),
      ("old_gpu", q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), no,
       "compute capability 8.0 or later, not 7.5"),
      ("xla", q, k, dict(no, return_weights=True), "weights are asked for"),
  ]


@pytest.mark.parametrize("implementation, q, k, flags, reason", _refusal_cases())
def test_each_refusal_is_named(monkeypatch, implementation, q, k, flags, reason):
  if implementation == "old_gpu":
    fake_device(monkeypatch, "gpu", "NVIDIA GeForce RTX 2080", "7.5")
    implementation = "cudnn"
  assert reason in fused_attention.refusal(implementation, q, k, **flags)


def test_a_refused_call_runs_the_einsums_and_says_why_once(monkeypatch, caplog):
  monkeypatch.setattr(fused_attention, "_LOGGED", set())
  q, k, v = _qkv(7, 24, 40)  # lengths splash does not tile
  mask = AttentionMask(key_valid=jnp.ones((B, 40), bool))
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax"):
    for _ in range(2):
      got = attention.dot_product_attention(q, k, v, mask, implementation="splash")
  np.testing.assert_array_equal(got, attention.dot_product_attention(q, k, v, mask))
  said = [r.getMessage() for r in caplog.records if "not multiples" in r.getMessage()]
  assert len(said) == 1 and "'splash'" in said[0] and "runs the einsums" in said[0]


def test_weights_come_from_the_einsums_whatever_the_choice():
  mask, queries, keys = _cases()["packed_self"]
  q, k, v = _qkv(8, queries, keys)
  out, weights = attention.dot_product_attention(q, k, v, mask, implementation="splash",
                                                 return_weights=True)
  want_out, want_weights = attention.dot_product_attention(q, k, v, mask, return_weights=True)
  np.testing.assert_array_equal(out, want_out)
  np.testing.assert_array_equal(weights, want_weights)


def test_the_dense_form_is_the_masks_the_models_built():
  mask, queries, _ = _cases()["packed_cross"]
  want = jnp.logical_and(mask.key_valid[:, None, None, :],
                         attention.make_segment_mask(mask.query_segment_ids,
                                                     mask.key_segment_ids))
  np.testing.assert_array_equal(mask.dense(batch=B, queries=queries), want)
  causal = AttentionMask(causal=True).dense(batch=B, queries=5)
  np.testing.assert_array_equal(
      causal, jnp.broadcast_to(jnp.tril(jnp.ones((5, 5), bool)), (B, 1, 5, 5)))
  assert AttentionMask().dense(batch=B, queries=5) is None
  with pytest.raises(ValueError, match="go together"):
    AttentionMask(query_segment_ids=jnp.ones((B, 5), jnp.int32))


def test_xla_adds_a_score_bias_in_float32_as_the_einsums_do(monkeypatch):
  calls = []
  real = jax.nn.dot_product_attention

  def recorded(*args, **kwargs):
    calls.append(kwargs)
    return real(*args, **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", recorded)
  mask, queries, keys = _cases()["padding"]
  q, k, v = _qkv(11, queries, keys, jnp.bfloat16)
  # A bias whose values bfloat16 would round (8 bits of mantissa): 1 + 2^-10 ...
  bias = jnp.asarray(np.random.default_rng(12).standard_normal((1, H, queries, keys)) * 3.0
                     + 2.0 ** -10, jnp.float32)
  got = attention.dot_product_attention(q, k, v, mask, implementation="xla", bias=bias)
  want = attention.dot_product_attention(q, k, v, mask, bias=bias)
  assert calls[-1]["bias"].dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("rules_name", ["default", "heads_whole"])
def test_splash_on_a_data_x_model_mesh_runs_per_shard_by_the_active_rules(monkeypatch, rules_name):
  """The multi-device path: ``jax.shard_map`` over a 4 x 2 mesh, rows on data, heads on model
  unless the active rules say otherwise; the result is the einsums'."""
  from seq2seq_jax.layers import partitioning
  from seq2seq_jax.training.sharding import make_mesh
  mesh = make_mesh(2)
  rules = dict(partitioning.ACTIVATION_RULES)
  if rules_name == "heads_whole":
    rules[partitioning.HEADS] = None
  specs = []
  real = jax.shard_map

  def recorded(fn, **kwargs):
    specs.append(kwargs["in_specs"])
    return real(fn, **kwargs)

  monkeypatch.setattr(jax, "shard_map", recorded)
  mask, queries, keys = _cases()["packed_cross"]
  q, k, v = _qkv(13, queries, keys)
  # 4 rows (one per data shard) of 6 heads (3 per model shard)
  q, k, v = (jnp.concatenate([jnp.concatenate([x, -x], axis=2)] * 2) for x in (q, k, v))
  mask = jax.tree.map(lambda x: jnp.concatenate([x] * 2), mask)

  def run(q, k, v, mask):
    with partitioning.activation_sharding(mesh, tuple(rules.items())):
      return attention.dot_product_attention(q, k, v, mask, implementation="splash")

  got = jax.jit(run)(q, k, v, mask)
  want = attention.dot_product_attention(q, k, v, mask)
  real_BT = np.concatenate([_real_queries(_cases()["packed_cross"][0], queries)] * 2)
  _assert_close(got, want, real_BT, 2e-5)
  want_spec = ("data",) if rules_name == "heads_whole" else ("data", None, "model")
  assert tuple(specs[-1][0]) == want_spec
