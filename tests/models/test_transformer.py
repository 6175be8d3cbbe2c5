"""Transformer: cached decoding parity, causality, padding invariance, dtypes, configs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.configs import TransformerConfig
from seq2seq_jax.models.registry import build_model
from seq2seq_jax.models.transformer import Transformer
from seq2seq_jax.types import BOS_ID, PAD_ID
from tests.models.model_checks import (check_cached_decode_parity,
                                       check_causal_through_gradients,
                                       check_source_padding_changes_no_logit, perturbed_init,
                                       transformer_variants)

V, D, H, F, S, T = 13, 12, 3, 20, 7, 5  # pairwise distinct sizes

BASE = TransformerConfig(vocab_size=V, model_dim=D, num_heads=H, mlp_dim=F, num_encoder_layers=2,
                         num_decoder_layers=2, max_len=16, dropout_rate=0.0)

INPUTS = jnp.array([[5, 6, 7, 8, 9, 4, 2], [10, 11, 4, 2, 0, 0, 0]], jnp.int32)
TARGETS = jnp.array([[7, 8, 9, 5, 2], [12, 4, 2, 0, 0]], jnp.int32)


def init(config):
  model = Transformer(config)
  return model, perturbed_init(model, INPUTS, TARGETS)


VARIANTS = transformer_variants(BASE)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cached_decode_step_matches_teacher_forced_decode(name):
  model, params = init(VARIANTS[name])
  check_cached_decode_parity(model, params, INPUTS, TARGETS, start_id=BOS_ID, cache_len=T)


def test_decode_step_past_the_cache_is_nan_not_silent():
  model, params = init(BASE)
  variables = {"params": params}
  memory = model.apply(variables, INPUTS, method="encode")
  cache = model.apply(variables, memory, 2, method="init_cache")
  tokens_B = jnp.full((2,), BOS_ID, jnp.int32)
  for _ in range(2):
    logits_BV, cache = model.apply(variables, memory, tokens_B, cache, method="decode_step")
    assert np.all(np.isfinite(logits_BV))
  logits_BV, _ = model.apply(variables, memory, tokens_B, cache, method="decode_step")
  assert np.all(np.isnan(logits_BV))


def test_init_cache_rejects_decode_len_past_positions():
  model, params = init(BASE)
  memory = model.apply({"params": params}, INPUTS, method="encode")
  with pytest.raises(ValueError, match="max_decode_len=17.*max_len=16"):
    model.apply({"params": params}, memory, 17, method="init_cache")


def test_inputs_longer_than_positions_are_rejected():
  model, params = init(BASE)
  with pytest.raises(ValueError, match="length 17 > TransformerConfig.max_len=16"):
    model.apply({"params": params}, jnp.ones((2, 17), jnp.int32), TARGETS)


@pytest.mark.parametrize("name", ["post_sinusoidal", "pre_learned_untied"])
def test_later_targets_do_not_change_earlier_logits(name):
  model, params = init(VARIANTS[name])
  base = model.apply({"params": params}, INPUTS, TARGETS)
  for t in range(T - 2):  # change targets after t+1; logits up to t+1 read only targets <= t
    changed = TARGETS.at[:, t + 1:].set((TARGETS[:, t + 1:] + 3) % V)
    logits = model.apply({"params": params}, INPUTS, changed)
    np.testing.assert_allclose(logits[:, :t + 2], base[:, :t + 2], rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits[:, t + 2:], base[:, t + 2:])


def test_causality_through_gradients():
  """d logits[:, t] / d (decoder input at position u) is zero exactly when u > t."""
  model, params = init(BASE)

  def perturbs(context, out):
    return context.module.name == "target_positions" and context.method_name == "__call__"

  check_causal_through_gradients(model, params, INPUTS, TARGETS, D, perturbs=perturbs)


@pytest.mark.parametrize("name", ["post_sinusoidal", "pre_learned_untied"])
def test_source_padding_changes_no_logit(name):
  model, params = init(VARIANTS[name])
  check_source_padding_changes_no_logit(model, params, INPUTS, TARGETS, pad_id=PAD_ID)


def test_attention_maps_shapes_and_normalisation():
  model, params = init(BASE)
  logits, attention = model.apply({"params": params}, INPUTS, TARGETS, return_attention=True)
  assert logits.shape == (2, T, V)
  assert attention["encoder_self"].shape == (2, 2, H, S, S)
  assert attention["decoder_self"].shape == (2, 2, H, T, T)
  assert attention["cross"].shape == (2, 2, H, T, S)
  np.testing.assert_allclose(attention["cross"].sum(-1), 1.0, rtol=1e-5)
  assert np.all(attention["cross"][:, 1, :, :, 4:] == 0)  # row 1's source padding
  assert np.all(np.triu(np.asarray(attention["decoder_self"]), k=1) == 0)


def test_shapes_dtypes_with_and_without_jit_and_no_recompile():
  model, params = init(BASE)
  traces = []

  def forward(p, x, y):
    traces.append(1)
    return model.apply({"params": p}, x, y)

  eager = forward(params, INPUTS, TARGETS)
  jitted = jax.jit(forward)
  first = jitted(params, INPUTS, TARGETS)
  second = jitted(params, INPUTS + 1, TARGETS)
  assert eager.shape == first.shape == (2, T, V)
  assert eager.dtype == first.dtype == jnp.float32
  np.testing.assert_allclose(first, eager, rtol=1e-5, atol=1e-5)
  assert second.shape == first.shape
  assert len(traces) == 2  # one eager call, one trace for both jitted calls


def test_bfloat16_compute_keeps_float32_params_and_logits():
  config = dataclasses.replace(BASE, dtype="bfloat16")
  model, params = init(config)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  logits = jax.jit(model.apply)({"params": params}, INPUTS, TARGETS)
  assert logits.dtype == jnp.float32 and np.all(np.isfinite(logits))
  _, float32_params = init(BASE)
  reference = Transformer(BASE).apply({"params": float32_params}, INPUTS, TARGETS)
  assert np.abs(np.asarray(logits) - np.asarray(reference)).max() < 0.25


def test_dropout_uses_the_dropout_stream():
  model, params = init(dataclasses.replace(BASE, dropout_rate=0.3, attention_dropout_rate=0.2))
  apply = lambda seed: model.apply({"params": params}, INPUTS, TARGETS, deterministic=False,
                                   rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(apply(0), apply(0))
  assert not np.allclose(apply(0), apply(1))
  assert not np.allclose(apply(0), model.apply({"params": params}, INPUTS, TARGETS))


def test_parameter_structure_follows_sharing_options():
  shared = jax.tree_util.tree_leaves_with_path(init(BASE)[1])
  names = {jax.tree_util.keystr(path) for path, _ in shared}
  assert not any("target_embedding" in n or "output_projection" in n for n in names)
  untied = init(VARIANTS["pre_learned_untied"])[1]
  assert "target_embedding" in untied and "output_projection" in untied
  assert untied["output_projection"]["kernel"].shape == (D, V)


def test_build_model_returns_transformer():
  assert isinstance(build_model(BASE), Transformer)
  with pytest.raises(TypeError, match="no model is registered"):
    build_model(object())


@pytest.mark.parametrize("field, value, words", [
    ("model_dim", 25, ("25", "3")),
    ("vocab_size", 0, ("vocab_size", "0")),
    ("dropout_rate", 1.5, ("dropout_rate", "1.5")),
    ("positions", "rotary", ("positions", "rotary", "sinusoidal")),
    ("norm", "middle", ("norm", "middle")),
    ("dtype", "float64", ("dtype", "float64")),
    ("num_encoder_layers", -1, ("num_encoder_layers", "-1")),
])
def test_bad_config_names_field_and_value(field, value, words):
  kwargs = dict(vocab_size=V, model_dim=24, num_heads=3)
  kwargs[field] = value
  with pytest.raises(ValueError) as error:
    TransformerConfig(**kwargs)
  for word in words:
    assert word in str(error.value)


def test_config_is_frozen_and_keyword_only():
  with pytest.raises(dataclasses.FrozenInstanceError):
    BASE.model_dim = 4  # type: ignore[misc]
  with pytest.raises(TypeError):
    TransformerConfig(11)  # type: ignore[misc]
