"""Int8 inference (seq2seq_jax.quantization): what is int8, what stays float, parity, refusals.

Tiny models with pairwise-distinct sizes; the pretrained families' accuracy against
float32 is in tests/pretrained/test_quantized.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax import platforms, quantization
from seq2seq_jax.configs import DecodeConfig, RNNConfig, T5Config, TransformerConfig
from seq2seq_jax.decoding import generate, generate_uncached
from seq2seq_jax.layers import quantized
from seq2seq_jax.models.ensemble import Ensemble, ensemble_params
from seq2seq_jax.models.registry import build_model

V, D, H, K, F = 37, 24, 3, 8, 40  # pairwise distinct
INPUTS = jnp.array([[5, 6, 7, 8, 9, 4, 2], [10, 11, 4, 2, 0, 0, 0]], jnp.int32)
TARGETS = jnp.array([[7, 8, 9, 5, 3, 2], [12, 4, 2, 0, 0, 0]], jnp.int32)

TRANSFORMER = TransformerConfig(vocab_size=V, model_dim=D, num_heads=H, mlp_dim=F,
                                num_encoder_layers=2, num_decoder_layers=2, max_len=32,
                                dropout_rate=0.0, attention_dropout_rate=0.0)
T5_BASE = T5Config(vocab_size=V, model_dim=D, num_heads=H, head_dim=K - 1, mlp_dim=F,
                   num_encoder_layers=2, num_decoder_layers=1, relative_buckets=8,
                   relative_max_distance=5, max_len=32, dropout_rate=0.0)
VARIANTS = {
    "transformer_tied": TRANSFORMER,
    "transformer_pre_untied": dataclasses.replace(TRANSFORMER, norm="pre", positions="learned",
                                                  share_embeddings=False, tie_output=False),
    "t5_tied": T5_BASE,
    "t5_gated_untied": dataclasses.replace(T5_BASE, activation="gelu_tanh", gated_ffn=True,
                                           tie_output=False, scale_output=False),
}


def _init(config, seed=0):
  model = build_model(config)
  params = model.init(jax.random.key(seed), INPUTS, TARGETS)["params"]
  # Off their initial values: biases not 0, norm scales not 1.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return model, jax.tree.unflatten(tree, [p + 0.1 * jax.random.normal(k, p.shape)
                                          for p, k in zip(leaves, keys)])


_PROGRAMS: dict = {}


def _logits(model, params):
  """Teacher-forced logits of INPUTS -> TARGETS, one jitted program per model."""
  if model not in _PROGRAMS:
    _PROGRAMS[model] = jax.jit(lambda p: model.apply({"params": p}, INPUTS, TARGETS))
  return _PROGRAMS[model](params)


def _relative_error(model, params, int8_model, int8_params):
  """RMS logit error over the RMS of the float logits' deviation, on valid target positions."""
  ref = np.asarray(_logits(model, params))
  out = np.asarray(_logits(int8_model, int8_params))
  valid = np.asarray(TARGETS != model.config.pad_id)
  centred = ref - ref.mean(-1, keepdims=True)
  return np.sqrt(np.mean((out - ref)[valid] ** 2)) / np.sqrt(np.mean(centred[valid] ** 2))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_int8_logits_are_close_and_wrong_weights_are_not(name):
  model, params = _init(VARIANTS[name])
  int8_model, int8_params = quantization.quantize(model, params, "int8")
  error = _relative_error(model, params, int8_model, int8_params)
  assert error < 0.05, error
  # The bound tells int8 rounding from a real fault: the int8 model of other weights.
  _, other = _init(VARIANTS[name], seed=5)
  _, other_int8 = quantization.quantize(model, other, "int8")
  assert _relative_error(model, params, int8_model, other_int8) > 0.3


def test_what_is_int8_and_what_stays_float():
  model, params = _init(VARIANTS["transformer_pre_untied"])
  _, int8_params = quantization.quantize(model, params, "int8")
  is_leaf = quantized.is_quantized
  paths = {jax.tree_util.keystr(path): leaf for path, leaf
           in jax.tree_util.tree_leaves_with_path(int8_params, is_leaf=is_leaf)}
  int8 = {path for path, leaf in paths.items() if is_leaf(leaf)}
  layer = "['decoder_layers_1']"
  for part in ("['self_attention']['query']", "['self_attention']['out']",
               "['cross_attention']['key']", "['feed_forward']['wi']", "['feed_forward']['wo']"):
    assert f"{layer}{part}['kernel']" in int8
  for table in ("['source_embedding']['embedding']", "['target_embedding']['embedding']",
                "['output_projection']['kernel']"):
    assert table in int8
  floats = set(paths) - int8
  assert "['output_projection']['bias']" in floats
  assert f"{layer}['feed_forward_residual']['norm']['scale']" in floats
  assert "['target_positions']['position_embedding']" in floats
  # One scale per output channel: [D, H, K] kernels per (head, unit), tables per id,
  # the [D, V] output projection per column.
  query = paths[f"{layer}['self_attention']['query']['kernel']"].array
  assert query.qvalue.dtype == jnp.int8 and query.scale.shape == (1, H, D // H)
  assert paths["['source_embedding']['embedding']"].array.scale.shape == (V, 1)
  assert paths["['output_projection']['kernel']"].array.scale.shape == (1, V)
  out = paths[f"{layer}['self_attention']['out']['kernel']"].array
  np.testing.assert_allclose(out.qvalue * out.scale,
                             params["decoder_layers_1"]["self_attention"]["out"]["kernel"],
                             atol=float(out.scale.max()) * 0.51)
  assert quantization.is_quantized(int8_params) and not quantization.is_quantized(params)


@pytest.mark.parametrize("name", ["transformer_tied", "t5_gated_untied"])
def test_cached_int8_steps_match_the_teacher_forced_int8_decode(name):
  # Activations are quantized per row (token): a decoding step and the teacher-forced
  # decoder quantize the same rows alike.
  model, params = _init(VARIANTS[name])
  int8_model, int8_params = quantization.quantize(model, params, "int8")
  variables = {"params": int8_params}
  full_BTV = _logits(int8_model, int8_params)
  memory = jax.jit(lambda v: int8_model.apply(v, INPUTS, method="encode"))(variables)
  cache = int8_model.apply(variables, memory, 10, method="init_cache")
  step = jax.jit(lambda m, tok, c: int8_model.apply(variables, m, tok, c, method="decode_step"))
  tokens_B = jnp.full((2,), model.config.decoder_start_id, jnp.int32)
  differences = []
  for t in range(TARGETS.shape[1]):
    logits_BV, cache = step(memory, tokens_B, cache)
    differences.append(np.abs(np.asarray(logits_BV) - np.asarray(full_BTV[:, t])).max(-1))
    tokens_B = TARGETS[:, t]
  # The jitted step's floats differ from the decoder's in the last bits; where one lies on
  # a rounding boundary its int8 value moves by one step (logits by about 1 %). Every other
  # row is the same to float rounding.
  differences = np.stack(differences)
  assert differences.max() < 0.05, differences
  assert np.mean(differences < 1e-4) >= 0.75, differences


def test_generate_greedy_and_beam_with_int8_equal_the_uncached_search():
  model, params = _init(VARIANTS["transformer_tied"])
  int8_model, int8_params = quantization.quantize(model, params, "int8")
  for config in (DecodeConfig(method="greedy", max_decode_len=8),
                 DecodeConfig(method="beam", beam_size=3, alpha=0.6, max_decode_len=8)):
    tokens, scores = generate(int8_model, int8_params, INPUTS, config)
    reference, reference_scores = generate_uncached(int8_model, int8_params, INPUTS, config)
    np.testing.assert_array_equal(tokens, reference)
    np.testing.assert_allclose(scores, reference_scores, rtol=1e-4, atol=1e-4)


def test_bfloat16_compute_with_int8_keeps_bfloat16_activations():
  config = dataclasses.replace(VARIANTS["t5_gated_untied"], dtype="bfloat16")
  model, params = _init(config)
  int8_model, int8_params = quantization.quantize(model, params, "int8")
  memory = jax.eval_shape(lambda p: int8_model.apply({"params": p}, INPUTS, method="encode"),
                          int8_params)
  assert memory["encoded"].dtype == jnp.bfloat16
  assert all(k.dtype == jnp.bfloat16 for k in memory["cross_key"])
  logits = _logits(int8_model, int8_params)
  assert logits.dtype == jnp.float32
  float_model, float_params = _init(VARIANTS["t5_gated_untied"])
  assert _relative_error(float_model, float_params, int8_model, int8_params) < 0.05


def test_an_ensemble_of_int8_members_decodes():
  model, params = _init(VARIANTS["transformer_tied"])
  _, other = _init(VARIANTS["transformer_tied"], seed=3)
  ensemble = Ensemble(models=(model, model))
  int8_model, int8_params = quantization.quantize(ensemble, ensemble_params([params, other]))
  config = DecodeConfig(method="beam", beam_size=2, max_decode_len=6)
  tokens, _ = generate(int8_model, int8_params, INPUTS, config)
  reference, _ = generate(ensemble, ensemble_params([params, other]), INPUTS, config)
  assert tokens.shape == reference.shape == (2, 6)


def test_models_and_modes_that_cannot_be_quantized_are_named():
  rnn = build_model(RNNConfig(vocab_size=V, embed_dim=8, hidden_dim=8))
  with pytest.raises(ValueError, match="RNNSeq2Seq"):
    quantization.quantize(rnn, {}, "int8")
  model, params = _init(VARIANTS["transformer_tied"])
  with pytest.raises(ValueError, match="mode='int4'.*'none', 'int8'"):
    quantization.quantize(model, params, "int4")
  int8_model, int8_params = quantization.quantize(model, params, "int8")
  with pytest.raises(ValueError, match="quantized already"):
    quantization.quantize(int8_model, int8_params, "int8")
  assert quantization.quantize(model, params, "none") == (model, params)


def _int8_weight(w, channel_axis):
  import qwix  # noqa: PLC0415
  from qwix._src.providers import ptq  # noqa: PLC0415

  return ptq.WithAux(qwix.quantize(jnp.asarray(w), jnp.int8, channelwise_axes=(channel_axis,),
                                   calibration_method=quantized.CALIBRATION),
                     quantization._table_how(channel_axis))


@pytest.mark.parametrize("rows", [1, 8, 32, 40])
@pytest.mark.parametrize("weight_axes", ["VD", "DV"])
def test_int8_logits_are_the_int8_equations_in_either_layout(rows, weight_axes):
  # Against float64 NumPy: activations per row and weights per id rounded to absmax / 127,
  # the integer product, both scales, the bias. On the CPU, 2 to VOCAB_MAJOR_MAX_ROWS rows
  # are computed vocabulary-major ([V, N] int32 product) and handed over transposed.
  vocab, dim = 301, D
  rng = np.random.default_rng(rows)
  x_ND = rng.standard_normal((rows, dim)).astype(np.float32)
  table_VD = rng.standard_normal((vocab, dim)).astype(np.float32)
  bias_V = rng.standard_normal(vocab).astype(np.float32)
  weight = _int8_weight(table_VD if weight_axes == "VD" else table_VD.T,
                        0 if weight_axes == "VD" else 1)
  program = jax.jit(lambda x, w, b: quantized.logits(x, w, weight_axes, b))
  out = np.asarray(program(x_ND, weight, bias_V))

  def rounded(a, axis):
    scale = np.abs(a.astype(np.float64)).max(axis=axis, keepdims=True) / 127
    return np.clip(np.round(a / scale), -127, 127), scale

  qx, sx = rounded(x_ND, 1)
  qw, sw = rounded(table_VD, 1)
  reference = (qx @ qw.T) * sx * sw.T + bias_V
  np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)
  hlo = program.lower(x_ND, weight, bias_V).as_text(dialect="hlo")
  vocab_major = f"s32[{vocab},{rows}]" in hlo
  assert vocab_major == (1 < rows <= platforms.VOCAB_MAJOR_MAX_ROWS), hlo
