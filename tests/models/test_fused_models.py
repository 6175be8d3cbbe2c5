"""The Transformer and T5 through every ``attention_impl``: the kernels are reached, and the
logits and gradients are the einsums', packed rows and padding included.

Rows of 128 positions, splash's tile (in Pallas' interpret mode here). cuDNN runs as
its call with XLA's implementation on a faked GPU platform (see
``tests/layers/test_fused_attention.py``).
"""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seq2seq_jax.configs import DataConfig, ExperimentConfig, T5Config, TransformerConfig
from seq2seq_jax.layers import fused_attention
from seq2seq_jax.models.registry import build_model
from tests.layers.test_fused_attention import _FakeGPU, spy_on_kernels

V, D, H, F = 17, 24, 3, 20  # pairwise distinct; head width 8
ROW = 128  # positions a row, a side: one splash tile

TRANSFORMER = TransformerConfig(vocab_size=V, model_dim=D, num_heads=H, mlp_dim=F,
                                num_encoder_layers=2, num_decoder_layers=1, max_len=ROW,
                                dropout_rate=0.0)
T5 = T5Config(vocab_size=V, model_dim=D, num_heads=H, head_dim=8, mlp_dim=F,
              num_encoder_layers=2, num_decoder_layers=1, relative_buckets=8,
              relative_max_distance=16, max_len=ROW, dropout_rate=0.0)


def _packed_batch(seed=0, pad_id=0):
  """Two packed rows (three pairs and two pairs, then padding) with segment ids and positions."""
  rng = np.random.default_rng(seed)
  batch = {key: np.zeros((2, ROW), np.int32) for key in (
      "inputs", "targets", "inputs_segment_ids", "targets_segment_ids", "inputs_positions",
      "targets_positions")}
  for side, rows in (("inputs", [(40, 50, 30), (70, 20)]), ("targets", [(45, 35, 40), (60, 30)])):
    batch[side][:] = pad_id
    for r, lengths in enumerate(rows):
      start = 0
      for n, length in enumerate(lengths, start=1):
        batch[side][r, start:start + length] = rng.integers(4, V, length)
        batch[side][r, start + length - 1] = 2
        batch[f"{side}_segment_ids"][r, start:start + length] = n
        batch[f"{side}_positions"][r, start:start + length] = np.arange(length)
        start += length
  return {key: jnp.asarray(value) for key, value in batch.items()}


def _padded_batch(seed=1):
  rng = np.random.default_rng(seed)
  inputs = rng.integers(4, V, (2, ROW))
  targets = rng.integers(4, V, (2, ROW))
  inputs[0, 90:] = 0
  targets[1, 100:] = 0
  return {"inputs": jnp.asarray(inputs, jnp.int32), "targets": jnp.asarray(targets, jnp.int32)}


def _logits_and_grads(config, params, batch):
  model = build_model(config)
  extra = {key: value for key, value in batch.items() if key not in ("inputs", "targets")}
  real_BT = (batch["targets"] != config.pad_id).astype(jnp.float32)
  weights_BTV = jax.random.normal(jax.random.key(3), (*batch["targets"].shape, V)) * real_BT[..., None]

  def loss(params):
    logits = model.apply({"params": params}, batch["inputs"], batch["targets"], **extra)
    return jnp.sum(logits * weights_BTV), logits

  (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
  return logits, grads, np.asarray(real_BT, bool)


def _check(config, implementation, batch, tolerance):
  """Logits elementwise; each gradient by the norm of its error, relative to its own norm
  or, for gradients near zero (a key projection's bias: softmax ignores a shift common
  to all keys), to 1 % of the whole gradient's. Single elements would not do: bfloat16
  sums taken in another order cancel differently."""
  params = build_model(config).init(jax.random.key(0), batch["inputs"][:, :4],
                                    batch["targets"][:, :4])["params"]
  want_logits, want_grads, real = _logits_and_grads(config, params, batch)
  fused = dataclasses.replace(config, attention_impl=implementation)
  got_logits, got_grads, _ = _logits_and_grads(fused, params, batch)
  np.testing.assert_allclose(np.asarray(got_logits)[real], np.asarray(want_logits)[real],
                             rtol=tolerance, atol=tolerance)
  floor = 1e-2 * float(optax.tree.norm(want_grads))
  for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(got_grads),
                               jax.tree.leaves(want_grads)):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    error = np.linalg.norm(got - want) / max(np.linalg.norm(want), floor)
    assert error < tolerance, f"{jax.tree_util.keystr(path)}: relative error {error:.2g}"


@pytest.mark.parametrize("batch_kind", ["packed", "padded"])
@pytest.mark.parametrize("implementation", ["xla", "splash"])
def test_the_transformer_reaches_the_kernel_and_equals_the_einsums(monkeypatch, implementation,
                                                                   batch_kind):
  batch = _packed_batch() if batch_kind == "packed" else _padded_batch()
  reached = spy_on_kernels(monkeypatch)
  _check(TRANSFORMER, implementation, batch, 2e-4)
  # Each encoder layer's self attention, each decoder layer's self and cross attention.
  layers = TRANSFORMER.num_encoder_layers + 2 * TRANSFORMER.num_decoder_layers
  assert reached == [implementation] * layers


@pytest.mark.parametrize("implementation", ["cudnn", "auto"])
def test_the_transformer_reaches_cudnn_on_a_gpu_packed_rows_included(monkeypatch, implementation):
  gpu = _FakeGPU(monkeypatch)
  config = dataclasses.replace(TRANSFORMER, dtype="bfloat16")
  reached = spy_on_kernels(monkeypatch)
  _check(config, implementation, _packed_batch(2), 0.1)
  layers = config.num_encoder_layers + 2 * config.num_decoder_layers
  assert reached == ["cudnn"] * layers
  assert {call["implementation"] for call in gpu.calls} == {"cudnn"}


def test_t5_takes_the_kernel_where_no_bias_is_added(monkeypatch, caplog):
  """T5's self attention adds its relative position bias: the einsums; cross attention: splash."""
  monkeypatch.setattr(fused_attention, "_LOGGED", set())
  reached = spy_on_kernels(monkeypatch)
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax"):
    _check(T5, "splash", _packed_batch(pad_id=T5.pad_id), 2e-4)
  assert reached == ["splash"] * T5.num_decoder_layers
  assert any("bias" in record.getMessage() for record in caplog.records)


def test_the_xla_choice_calls_jax_nn_dot_product_attention(monkeypatch):
  """The defect this replaced: a user wrapping it counted 0 calls."""
  calls = []
  real = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, "dot_product_attention",
                      lambda *a, **k: calls.append(k) or real(*a, **k))
  config = dataclasses.replace(TRANSFORMER, attention_impl="xla")
  batch = _padded_batch()
  model = build_model(config)
  params = model.init(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
  calls.clear()
  model.apply({"params": params}, batch["inputs"], batch["targets"])
  assert len(calls) == config.num_encoder_layers + 2 * config.num_decoder_layers
  assert [call["is_causal"] for call in calls] == [False, False, True, False]


def test_attention_weights_run_the_einsums_and_decoding_steps_say_so(monkeypatch, caplog):
  monkeypatch.setattr(fused_attention, "_LOGGED", set())
  config = dataclasses.replace(TRANSFORMER, attention_impl="splash")
  batch = _padded_batch()
  model = build_model(config)
  params = model.init(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
  reached = spy_on_kernels(monkeypatch)
  einsum_model = build_model(TRANSFORMER)
  logits, weights = model.apply({"params": params}, batch["inputs"], batch["targets"],
                                return_attention=True)
  want_logits, want_weights = einsum_model.apply({"params": params}, batch["inputs"],
                                                 batch["targets"], return_attention=True)
  assert not reached
  np.testing.assert_array_equal(logits, want_logits)
  for name in want_weights:
    np.testing.assert_array_equal(weights[name], want_weights[name])
  memory = model.apply({"params": params}, batch["inputs"], method="encode")
  cache = model.apply({"params": params}, memory, 4, method="init_cache")
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax"):
    step_logits, _ = model.apply({"params": params}, memory, batch["targets"][:, 0], cache,
                                 method="decode_step")
  want_memory = einsum_model.apply({"params": params}, batch["inputs"], method="encode")
  want_step, _ = einsum_model.apply({"params": params}, want_memory, batch["targets"][:, 0],
                                    cache, method="decode_step")
  np.testing.assert_allclose(step_logits, want_step, rtol=2e-4, atol=2e-4)
  assert any("decoding steps" in record.getMessage() for record in caplog.records)


def test_packing_with_every_choice_is_a_valid_config():
  data = DataConfig(vocab_size=V, packing=True, max_source_len=ROW, max_target_len=ROW,
                    bucket_lengths=(64, ROW))
  for implementation in ("einsum", "xla", "cudnn", "splash", "auto"):
    ExperimentConfig(model=dataclasses.replace(TRANSFORMER, attention_impl=implementation),
                     data=data)
    ExperimentConfig(model=dataclasses.replace(T5, attention_impl=implementation), data=data)
  with pytest.raises(ValueError, match="attention_impl.*flash"):
    dataclasses.replace(TRANSFORMER, attention_impl="flash")
