"""T5: cached decoding parity, causality, padding invariance, the contract, configs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.configs import DecodeConfig, ExperimentConfig, T5Config
from seq2seq_jax.decoding import generate, generate_uncached
from seq2seq_jax.models.registry import build_model
from seq2seq_jax.models.t5 import T5
from tests.models.model_checks import (check_cached_decode_parity,
                                       check_causal_through_gradients,
                                       check_source_padding_changes_no_logit, perturbed_init)

V, D, H, K, F, S, T = 13, 12, 3, 5, 20, 7, 6  # pairwise distinct; H * K != D

BASE = T5Config(vocab_size=V, model_dim=D, num_heads=H, head_dim=K, mlp_dim=F,
                num_encoder_layers=2, num_decoder_layers=3, relative_buckets=8,
                relative_max_distance=5, max_len=16, dropout_rate=0.0)

# T5's ids: pad 0 (also the decoder start), eos 1.
INPUTS = jnp.array([[5, 6, 7, 8, 9, 4, 1], [10, 11, 4, 1, 0, 0, 0]], jnp.int32)
TARGETS = jnp.array([[7, 8, 9, 5, 3, 1], [12, 4, 1, 0, 0, 0]], jnp.int32)

VARIANTS = {
    "t5_relu_tied": BASE,
    "v1_1_gated_untied": dataclasses.replace(BASE, activation="gelu_tanh", gated_ffn=True,
                                             tie_output=False, scale_output=False),
    "asymmetric_depth": dataclasses.replace(BASE, num_encoder_layers=1, num_decoder_layers=2),
}


def init(config):
  model = T5(config)
  return model, perturbed_init(model, INPUTS, TARGETS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cached_decode_step_matches_teacher_forced_decode(name):
  model, params = init(VARIANTS[name])
  # A cache longer than the targets: the position bias row must be read at each step's index.
  # The decoder start is pad (0).
  check_cached_decode_parity(model, params, INPUTS, TARGETS, start_id=0, cache_len=T + 5)


def test_decode_step_past_the_cache_is_nan_and_long_caches_are_refused():
  model, params = init(BASE)
  variables = {"params": params}
  memory = model.apply(variables, INPUTS, method="encode")
  cache = model.apply(variables, memory, 2, method="init_cache")
  tokens_B = jnp.zeros((2,), jnp.int32)
  for _ in range(2):
    logits_BV, cache = model.apply(variables, memory, tokens_B, cache, method="decode_step")
    assert np.all(np.isfinite(logits_BV))
  logits_BV, _ = model.apply(variables, memory, tokens_B, cache, method="decode_step")
  assert np.all(np.isnan(logits_BV))
  with pytest.raises(ValueError, match="max_decode_len=17.*T5Config.max_len=16"):
    model.apply(variables, memory, 17, method="init_cache")
  with pytest.raises(ValueError, match="length 17 > T5Config.max_len=16"):
    model.apply(variables, jnp.ones((2, 17), jnp.int32), TARGETS)


def test_causality_through_gradients():
  """d logits[:, t] / d (decoder input vector at u) is zero exactly when u > t."""
  model, params = init(VARIANTS["v1_1_gated_untied"])

  def perturbs(context, out):
    # The decoder's token vectors: the embedding called on [B, T] decoder inputs (the
    # encoder's call has S != T positions).
    return (context.module.name == "embedding" and context.method_name == "__call__"
            and out.shape == (2, T, D))

  check_causal_through_gradients(model, params, INPUTS, TARGETS, D, perturbs=perturbs)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_source_padding_changes_no_logit(name):
  model, params = init(VARIANTS[name])
  check_source_padding_changes_no_logit(model, params, INPUTS, TARGETS, pad_id=0)


def test_attention_maps_shapes_and_parameter_structure():
  model, params = init(VARIANTS["v1_1_gated_untied"])
  logits, attention = model.apply({"params": params}, INPUTS, TARGETS, return_attention=True)
  assert logits.shape == (2, T, V) and logits.dtype == jnp.float32
  assert attention["encoder_self"].shape == (2, 2, H, S, S)
  assert attention["decoder_self"].shape == (3, 2, H, T, T)
  assert attention["cross"].shape == (3, 2, H, T, S)
  np.testing.assert_allclose(attention["cross"].sum(-1), 1.0, rtol=1e-5)
  assert np.all(attention["cross"][:, 1, :, :, 4:] == 0)  # row 1's source padding
  names = {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)}
  assert not any("bias']" in n and "relative" not in n for n in names)  # no layer has a bias
  assert params["output_projection"]["kernel"].shape == (D, V)
  assert params["encoder_position_bias"]["relative_attention_bias"].shape == (8, H)
  assert params["encoder_layers_0"]["self_attention"]["query"]["kernel"].shape == (D, H, K)
  assert "output_projection" not in init(BASE)[1]


def test_tied_output_rescale_is_d_to_the_minus_half():
  model, params = init(BASE)
  unscaled = T5(dataclasses.replace(BASE, scale_output=False))
  ratio = (model.apply({"params": params}, INPUTS, TARGETS)
           / unscaled.apply({"params": params}, INPUTS, TARGETS))
  np.testing.assert_allclose(ratio, D ** -0.5, rtol=1e-4)


def test_bfloat16_compute_keeps_float32_params_and_logits():
  model, params = init(dataclasses.replace(BASE, dtype="bfloat16"))
  logits = jax.jit(model.apply)({"params": params}, INPUTS, TARGETS)
  assert logits.dtype == jnp.float32 and np.all(np.isfinite(logits))
  reference = T5(BASE).apply({"params": params}, INPUTS, TARGETS)
  assert np.abs(np.asarray(logits) - np.asarray(reference)).max() < 0.25


def test_dropout_uses_the_dropout_stream():
  model, params = init(dataclasses.replace(BASE, dropout_rate=0.3))
  apply = lambda seed: model.apply({"params": params}, INPUTS, TARGETS, deterministic=False,
                                   rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(apply(0), apply(0))
  assert not np.allclose(apply(0), apply(1))


def test_generate_cached_equals_uncached_for_greedy_and_beam():
  model, params = init(VARIANTS["v1_1_gated_untied"])
  for config in (DecodeConfig(method="greedy", max_decode_len=8),
                 DecodeConfig(method="beam", beam_size=3, alpha=0.6, max_decode_len=8)):
    cached = generate(model, params, INPUTS, config)
    uncached = generate_uncached(model, params, INPUTS, config)
    np.testing.assert_array_equal(np.asarray(cached[0]), np.asarray(uncached[0]))
    np.testing.assert_allclose(np.asarray(cached[1]), np.asarray(uncached[1]), rtol=1e-4)


def test_build_model_and_experiment_config_know_t5():
  assert isinstance(build_model(BASE), T5)
  config = ExperimentConfig(model=dataclasses.replace(BASE, max_len=64, pad_id=0, eos_id=2,
                                                      decoder_start_id=1))
  values = config.to_dict()
  assert values["model"]["kind"] == "t5"
  assert ExperimentConfig.from_dict(values) == config


@pytest.mark.parametrize("field, value, words", [
    ("head_dim", 0, ("head_dim", "positive")),
    ("relative_buckets", 2, ("relative_buckets", ">= 4")),
    ("activation", "tanh", ("activation", "gelu_tanh")),
    ("eos_id", 0, ("eos_id", "pad_id=0")),
    ("dropout_rate", 1.0, ("dropout_rate",)),
])
def test_bad_config_names_field_and_value(field, value, words):
  with pytest.raises(ValueError) as error:
    dataclasses.replace(BASE, **{field: value})
  for word in words:
    assert word in str(error.value)
