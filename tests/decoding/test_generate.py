"""generate: cached decoding equals the uncached reference for every model; no recompiles."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.configs import DecodeConfig, RNNConfig, TransformerConfig
from seq2seq_jax.decoding import decode_length, generate, generate_uncached
from seq2seq_jax.decoding import generation
from seq2seq_jax.types import EOS_ID, PAD_ID

V, S, T, W = 13, 7, 6, 3  # pairwise distinct; batch 2

INPUTS_BS = jnp.array([[5, 6, 7, 8, 9, 4, EOS_ID], [10, 11, 4, EOS_ID, PAD_ID, PAD_ID, PAD_ID]],
                      jnp.int32)
METHODS = {
    "greedy": DecodeConfig(method="greedy", max_decode_len=T),
    "beam": DecodeConfig(method="beam", beam_size=W, alpha=0.6, max_decode_len=T),
    "sample": DecodeConfig(method="sample", temperature=1.5, top_k=6, top_p=0.95,
                           max_decode_len=T),
}


@functools.lru_cache(maxsize=None)
def init(model, seed=0):
  """Random parameters drawn with numpy in the model's shapes: nothing to compile."""
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), INPUTS_BS, INPUTS_BS[:, :T]))
  rng = np.random.default_rng(seed)
  # Wide enough that the random model is confident and emits EOS now and then.
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.7, s.shape), s.dtype),
                      shapes["params"])


def transformer():
  from seq2seq_jax.models.transformer import Transformer
  return Transformer(TransformerConfig(vocab_size=V, model_dim=12, num_heads=3, mlp_dim=20,
                                       num_encoder_layers=2, num_decoder_layers=2, max_len=16,
                                       dropout_rate=0.0))


def assert_same_outputs(config, model, params):
  n_best = config.method == "beam"
  cached = generate(model, params, INPUTS_BS, config, n_best=n_best)
  uncached = generate_uncached(model, params, INPUTS_BS, config, n_best=n_best)
  np.testing.assert_array_equal(cached[0], uncached[0])
  np.testing.assert_allclose(cached[1], uncached[1], rtol=1e-4, atol=1e-5)
  tokens = np.asarray(cached[0]).reshape(-1, T)
  assert np.all(np.isfinite(cached[1])) and np.all(tokens != 1)  # no BOS in outputs
  return cached


# Sampling runs the same step function as greedy; its path through generate is
# exercised by test_sampling_uses_the_config_seed_unless_given_a_key.
@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_transformer_generate_equals_the_uncached_reference(method):
  model = transformer()
  tokens, _ = assert_same_outputs(METHODS[method], model, init(model))
  assert tokens.shape == ((2, W, T) if method == "beam" else (2, T))


RNN_CONFIGS = {
    "lstm_bidirectional_additive": RNNConfig(vocab_size=V, cell="lstm", embed_dim=6,
                                             hidden_dim=10, num_encoder_layers=2,
                                             num_decoder_layers=2, bidirectional=True,
                                             attention="additive", dropout_rate=0.0),
    "gru_luong_input_feeding": RNNConfig(vocab_size=V, cell="gru", embed_dim=8, hidden_dim=10,
                                         attention="general", input_feeding=True,
                                         reverse_source=True, dropout_rate=0.0),
}


# Beam search drives decode_step hardest: the whole cache is reordered every step.
@pytest.mark.parametrize("name", list(RNN_CONFIGS))
def test_rnn_generate_equals_the_uncached_reference(name):
  # Imported here so this module collects before the model exists; never skipped.
  from seq2seq_jax.models.rnn_seq2seq import RNNSeq2Seq
  model = RNNSeq2Seq(RNN_CONFIGS[name])
  assert_same_outputs(METHODS["beam"], model, init(model))


def test_beam_generate_returns_the_best_hypothesis_by_default():
  model = transformer()
  params = init(model)
  nbest_BWT, nbest_BW = generate(model, params, INPUTS_BS, METHODS["beam"], n_best=True)
  best_BT, best_B = generate(model, params, INPUTS_BS, METHODS["beam"])
  np.testing.assert_array_equal(best_BT, nbest_BWT[:, 0])
  np.testing.assert_allclose(best_B, nbest_BW[:, 0])
  assert np.all(np.diff(np.asarray(nbest_BW), axis=1) <= 0)  # best first
  with pytest.raises(ValueError, match="n_best"):
    generate(model, params, INPUTS_BS, METHODS["greedy"], n_best=True)


def test_a_second_call_with_the_same_shapes_does_not_recompile():
  model = transformer()
  params = init(model)
  config = METHODS["greedy"]
  first, _ = generate(model, params, INPUTS_BS, config)
  compiled = generation._generate._cache_size()
  other_inputs = jnp.flip(INPUTS_BS, axis=0)
  second, _ = generate(model, init(model, seed=1), other_inputs, config)
  assert generation._generate._cache_size() == compiled
  assert not np.array_equal(first, second)  # it did run on the new arguments
  # The counter does move when something static changes.
  generate(model, params, INPUTS_BS, DecodeConfig(method="greedy", max_decode_len=T - 1))
  assert generation._generate._cache_size() == compiled + 1


def test_sampling_uses_the_config_seed_unless_given_a_key():
  model = transformer()
  params = init(model)
  config = DecodeConfig(method="sample", max_decode_len=T, seed=3)
  seeded, _ = generate(model, params, INPUTS_BS, config)
  keyed, _ = generate(model, params, INPUTS_BS, config, rng=jax.random.key(3))
  np.testing.assert_array_equal(seeded, keyed)


def test_decode_length_follows_the_config_and_the_model_limit():
  model = transformer()  # max_len 16
  assert decode_length(model, 4, DecodeConfig(max_decode_len=0)) == 16  # ceil(1.5 * 4) + 10
  assert decode_length(model, 2, DecodeConfig(max_decode_len=0, max_decode_len_ratio=1.0)) == 12
  assert decode_length(model, 30, DecodeConfig(max_decode_len=9)) == 9
  # An explicit limit beyond the model is not capped: the model says it cannot.
  with pytest.raises(ValueError, match="max_len"):
    generate(model, init(model), INPUTS_BS, DecodeConfig(max_decode_len=17))


def test_generate_checks_its_arguments():
  model = transformer()
  params = init(model)
  with pytest.raises(TypeError, match="DecodeConfig"):
    generate(model, params, INPUTS_BS, {"method": "greedy"})
  with pytest.raises(ValueError, match="inputs_BS"):
    generate(model, params, INPUTS_BS[0], METHODS["greedy"])
