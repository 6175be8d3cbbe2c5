"""RNNSeq2Seq: the model contract, cached decoding parity, padding invariance, attention."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.configs import RNNConfig
from seq2seq_jax.models.registry import build_model
from seq2seq_jax.models.base import shift_right
from seq2seq_jax.models.rnn_seq2seq import RNNSeq2Seq
from seq2seq_jax.types import BOS_ID

B, S, T, V, E, H = 2, 5, 4, 13, 3, 6  # pairwise distinct (T == 4 only for the targets)
SOURCE_BS = jnp.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], jnp.int32)  # unpadded + padded rows
TARGETS_BT = jnp.array([[4, 11, 12, 2], [7, 2, 0, 0]], jnp.int32)

CELLS = ("lstm", "gru", "simple")
ATTENTIONS = ("none", "additive", "dot", "general")


def _config(cell, attention, bidirectional, variant=0, **overrides):
  """Spreads the other options over the grid so each is exercised somewhere."""
  luong = attention in ("dot", "general")
  fields = dict(vocab_size=V, cell=cell, embed_dim=E, hidden_dim=H, attention=attention,
                bidirectional=bidirectional, dropout_rate=0.0,
                num_encoder_layers=1 + variant % 2, num_decoder_layers=1 + (variant // 2) % 2,
                reverse_source=variant % 3 == 0, input_feeding=luong and variant % 2 == 0,
                share_embeddings=variant % 4 != 1, tie_output=variant % 5 == 2,
                attention_dim=5 if attention == "additive" and variant % 2 else 0, max_len=8)
  fields.update(overrides)
  return RNNConfig(**fields)


def _random_params(model, seed):
  """Parameters of the model's structure filled with N(0, 0.5^2): no initializer runs
  (flax's orthogonal init costs seconds of QR compiles), and biases are non-zero."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), SOURCE_BS, TARGETS_BT)["params"]
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.5, s.shape), s.dtype), shapes)


def _parity_fn(model):
  """One jitted program: teacher-forced logits and the cached step-by-step logits."""

  def run(params, source_BS, targets_BT):
    variables = {"params": params}
    memory = model.apply(variables, source_BS, method=model.encode)
    full_BTV = model.apply(variables, memory, targets_BT, method=model.decode)
    cache = model.apply(variables, memory, targets_BT.shape[1], method=model.init_cache)

    def step(cache, tokens_B):
      logits_BV, cache = model.apply(variables, memory, tokens_B, cache, method=model.decode_step)
      return cache, logits_BV

    cache, stepped_TBV = jax.lax.scan(step, cache, shift_right(targets_BT).T)
    return full_BTV, jnp.swapaxes(stepped_TBV, 0, 1), memory, cache

  return jax.jit(run)


GRID = list(itertools.product(CELLS, ATTENTIONS, (False, True)))


@pytest.mark.parametrize("cell,attention,bidirectional", GRID)
def test_decode_step_equals_teacher_forced_decode_at_every_position(cell, attention,
                                                                    bidirectional):
  variant = GRID.index((cell, attention, bidirectional))
  config = _config(cell, attention, bidirectional, variant)
  model = RNNSeq2Seq(config)
  params = _random_params(model, variant)
  full_BTV, stepped_BTV, memory, cache = _parity_fn(model)(params, SOURCE_BS, TARGETS_BT)
  assert full_BTV.shape == (B, T, V) and full_BTV.dtype == jnp.float32
  np.testing.assert_allclose(stepped_BTV, full_BTV, rtol=1e-5, atol=1e-5)
  # Contract: every memory leaf is batch first; cache leaves are batch first or scalars.
  for leaf in jax.tree.leaves(memory):
    assert leaf.shape[0] == B
  for leaf in jax.tree.leaves(cache):
    assert leaf.ndim == 0 or leaf.shape[0] == B
  layers = jax.tree.leaves(cache["layers"])
  assert all(leaf.shape == (B, config.num_decoder_layers, H) for leaf in layers)
  assert int(cache["index"]) == T


@pytest.mark.parametrize("attention", ["none", "additive", "general"])
def test_padding_invariance(attention):
  config = _config("lstm", attention, True, variant=3, reverse_source=True,
                   input_feeding=attention == "general")
  model = RNNSeq2Seq(config)
  params = _random_params(model, 0)
  apply = jax.jit(lambda s, t: model.apply({"params": params}, s, t))
  logits_BTV = apply(SOURCE_BS, TARGETS_BT)
  pad_source = jnp.pad(SOURCE_BS, ((0, 0), (0, 3)))
  pad_targets = jnp.pad(TARGETS_BT, ((0, 0), (0, 2)))
  padded_BTV = apply(pad_source, pad_targets)
  np.testing.assert_allclose(padded_BTV[:, :T], logits_BTV, rtol=1e-5, atol=1e-6)
  if attention == "additive":
    # A row's logits do not depend on the other rows or on their lengths.
    alone_BTV = apply(SOURCE_BS[1:, :3], TARGETS_BT[1:, :2])
    np.testing.assert_allclose(alone_BTV, logits_BTV[1:, :2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attention", ["additive", "dot", "general"])
def test_cross_attention_is_a_distribution_over_real_source_tokens(attention):
  config = _config("gru", attention, attention != "dot", variant=1)
  model = RNNSeq2Seq(config)
  params = _random_params(model, 1)
  logits_BTV, attention_maps = jax.jit(
      lambda s, t: model.apply({"params": params}, s, t, return_attention=True))(SOURCE_BS,
                                                                                 TARGETS_BT)
  cross_BTS = attention_maps["cross"]
  assert set(attention_maps) == {"cross"} and cross_BTS.shape == (B, T, S)
  assert logits_BTV.shape == (B, T, V) and cross_BTS.dtype == jnp.float32
  np.testing.assert_allclose(cross_BTS.sum(-1), 1.0, rtol=1e-6)
  assert np.all(np.asarray(cross_BTS[1, :, 3:]) == 0.0)
  assert np.all(np.asarray(cross_BTS[1, :, :3]) > 0.0)


def test_return_attention_without_attention_raises():
  model = RNNSeq2Seq(_config("lstm", "none", False))
  params = _random_params(model, 0)
  with pytest.raises(ValueError, match="attention is 'none'"):
    model.apply({"params": params}, SOURCE_BS, TARGETS_BT, return_attention=True)


def test_thought_vector_bridge_only_when_sizes_differ_and_source_matters():
  same = RNNSeq2Seq(_config("lstm", "none", False, num_encoder_layers=2, num_decoder_layers=2))
  params = _random_params(same, 0)
  assert not any(name.startswith("bridge") for name in params)
  bridged = RNNSeq2Seq(_config("lstm", "none", True))
  params = _random_params(bridged, 0)
  assert {"bridge_0", "bridge_1"} <= set(params)  # one per LSTM carry leaf (c, h)

  # The decoder sees the source only through the final state: it must still matter.
  def loss(source_embedding):
    p = dict(params, source_embed={"embedding": source_embedding})
    return bridged.apply({"params": p}, SOURCE_BS, TARGETS_BT).sum()

  grad = jax.jit(jax.grad(loss))(params["source_embed"]["embedding"])
  assert np.abs(np.asarray(grad[jnp.asarray([5, 9])])).sum() > 0


def test_init_cache_rejects_a_decode_length_past_max_len_and_steps_past_it_are_nan():
  model = RNNSeq2Seq(_config("gru", "general", False))
  params = _random_params(model, 0)
  variables = {"params": params}
  memory = model.apply(variables, SOURCE_BS, method=model.encode)
  with pytest.raises(ValueError, match=r"max_decode_len=9 must be in \[1, RNNSeq2Seq.max_len=8\]"):
    model.apply(variables, memory, 9, method=model.init_cache)
  cache = model.apply(variables, memory, 1, method=model.init_cache)
  bos_B = jnp.full((B,), BOS_ID, jnp.int32)
  logits_BV, cache = model.apply(variables, memory, bos_B, cache, method=model.decode_step)
  assert np.all(np.isfinite(logits_BV))
  logits_BV, _ = model.apply(variables, memory, bos_B, cache, method=model.decode_step)
  assert np.all(np.isnan(logits_BV))
  with pytest.raises(ValueError, match="source length 9 exceeds"):
    model.apply(variables, jnp.ones((B, 9), jnp.int32), method=model.encode)


def test_dropout_uses_the_dropout_stream():
  model = RNNSeq2Seq(_config("lstm", "additive", True, dropout_rate=0.5, num_encoder_layers=2))
  params = _random_params(model, 0)
  run = jax.jit(lambda key: model.apply({"params": params}, SOURCE_BS, TARGETS_BT,
                                        deterministic=False, rngs={"dropout": key}))
  first = run(jax.random.key(1))
  assert not np.allclose(first, run(jax.random.key(2)))
  np.testing.assert_array_equal(first, run(jax.random.key(1)))


def test_shift_right_and_registry():
  np.testing.assert_array_equal(shift_right(TARGETS_BT),
                                [[BOS_ID, 4, 11, 12], [BOS_ID, 7, 2, 0]])
  assert isinstance(build_model(_config("gru", "dot", False)), RNNSeq2Seq)


def test_config_validation_names_the_field():
  with pytest.raises(ValueError, match="RNNConfig.cell='rnn'"):
    RNNConfig(vocab_size=V, cell="rnn")
  with pytest.raises(ValueError, match="input_feeding"):
    RNNConfig(vocab_size=V, attention="none", input_feeding=True)


@pytest.mark.parametrize("cell", CELLS)
def test_bfloat16_compute_traces_with_float32_params_and_logits(cell):
  # Shapes and dtypes only (no compile): the recurrent state must keep one dtype in the scans.
  model = RNNSeq2Seq(_config(cell, "additive", True, dtype="bfloat16", num_decoder_layers=2))
  variables = jax.eval_shape(model.init, jax.random.key(0), SOURCE_BS, TARGETS_BT)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables))
  logits = jax.eval_shape(lambda v: model.apply(v, SOURCE_BS, TARGETS_BT), variables)
  assert logits.shape == (B, T, V) and logits.dtype == jnp.float32


def test_beam_search_through_generate_equals_uncached_decoding():
  # The library's generate expands the cache to B * W rows and shares the scalar leaves.
  from seq2seq_jax.configs import DecodeConfig
  from seq2seq_jax.decoding.generation import generate, generate_uncached
  model = RNNSeq2Seq(_config("gru", "additive", True, variant=1))
  params = _random_params(model, 4)
  decode_config = DecodeConfig(method="beam", beam_size=3, max_decode_len=6)
  tokens_BT, scores_B = generate(model, params, SOURCE_BS, decode_config)
  reference_BT, reference_B = generate_uncached(model, params, SOURCE_BS, decode_config)
  np.testing.assert_array_equal(tokens_BT, reference_BT)
  np.testing.assert_allclose(scores_B, reference_B, rtol=1e-5, atol=1e-5)
