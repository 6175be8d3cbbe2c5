"""Ensembles: one member equals the model; two members equal a float64 average of their
log-probabilities, cached or not, whatever their families."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.configs import DecodeConfig, RNNConfig, TransformerConfig
from seq2seq_jax.decoding import generate, generate_uncached
from seq2seq_jax.models.ensemble import Ensemble, ensemble_params
from seq2seq_jax.models.rnn_seq2seq import RNNSeq2Seq
from seq2seq_jax.models.transformer import Transformer
from seq2seq_jax.types import BOS_ID, EOS_ID, NEG_INF, PAD_ID

V, S, T = 13, 7, 6  # batch 2

INPUTS_BS = jnp.array([[5, 6, 7, 8, 9, 4, EOS_ID], [10, 11, 4, EOS_ID, PAD_ID, PAD_ID, PAD_ID]],
                      jnp.int32)
TRANSFORMER = Transformer(TransformerConfig(vocab_size=V, model_dim=12, num_heads=3, mlp_dim=20,
                                            num_encoder_layers=2, num_decoder_layers=2,
                                            max_len=16, dropout_rate=0.0))
RNN = RNNSeq2Seq(RNNConfig(vocab_size=V, cell="gru", embed_dim=8, hidden_dim=10,
                           attention="general", input_feeding=True, dropout_rate=0.0))


@functools.lru_cache(maxsize=None)
def init(model, seed):
  """Random parameters drawn with numpy in the model's shapes, wide enough to be confident."""
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), INPUTS_BS, INPUTS_BS[:, :T]))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.7, s.shape), s.dtype),
                      shapes["params"])


def _float64_logprobs(model, params, targets_BT):
  logits = np.asarray(model.apply({"params": params}, INPUTS_BS, targets_BT), np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _reference(members, targets_BT, weights, average):
  """float64 next-token log-probabilities of the ensemble, renormalized, ``[B, T, V]``."""
  weights = np.asarray(weights, np.float64) / np.sum(weights)
  logprobs = np.stack([_float64_logprobs(m, p, targets_BT) for m, p in members])
  if average == "log":
    combined = np.tensordot(weights, logprobs, axes=1)
  else:
    combined = np.log(np.tensordot(weights, np.exp(logprobs), axes=1))
  shifted = combined - combined.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


MEMBERS = [(TRANSFORMER, 0), (RNN, 1)]


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_an_ensemble_of_one_is_the_model(method):
  config = DecodeConfig(method=method, beam_size=3, max_decode_len=T)
  params = init(TRANSFORMER, 0)
  alone = generate(TRANSFORMER, params, INPUTS_BS, config, n_best=method == "beam")
  one = generate(Ensemble(models=(TRANSFORMER,)), ensemble_params([params]), INPUTS_BS, config,
                 n_best=method == "beam")
  np.testing.assert_array_equal(one[0], alone[0])
  np.testing.assert_array_equal(one[1], alone[1])


@pytest.mark.parametrize("weights, average", [((1.0, 1.0), "log"), ((3.0, 1.0), "log"),
                                              ((1.0, 2.0), "probability")])
def test_decode_equals_a_float64_average_of_the_members(weights, average):
  members = [(m, init(m, seed)) for m, seed in MEMBERS]
  ensemble = Ensemble(models=tuple(m for m, _ in members), weights=weights, average=average)
  params = ensemble_params([p for _, p in members])
  targets_BT = jnp.array([[3, 4, 5, 6, 7, EOS_ID], [8, 9, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
  scores = np.asarray(ensemble.apply({"params": params}, INPUTS_BS, targets_BT), np.float64)
  shifted = scores - scores.max(-1, keepdims=True)
  ours = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  np.testing.assert_allclose(ours, _reference(members, targets_BT, weights, average), atol=2e-5)


def test_greedy_equals_a_float64_reference_search():
  # Teacher-forced float64 log-probabilities of the averaged members, one token at a time.
  members = [(m, init(m, seed)) for m, seed in MEMBERS]
  ensemble = Ensemble(models=(TRANSFORMER, RNN))
  tokens, scores = generate(ensemble, ensemble_params([p for _, p in members]), INPUTS_BS,
                            DecodeConfig(method="greedy", max_decode_len=T))
  for row in range(2):
    out, total = [], 0.0
    while len(out) < T:
      targets = np.array([out + [PAD_ID] * (T - len(out))] * 2, np.int32)
      logprobs = _reference(members, jnp.asarray(targets), (1.0, 1.0), "log")[row, len(out)]
      logprobs[[PAD_ID, BOS_ID]] = NEG_INF
      out.append(int(np.argmax(logprobs)))
      total += logprobs[out[-1]]
      if out[-1] == EOS_ID:
        break
    assert np.asarray(tokens[row]).tolist()[:len(out)] == out
    np.testing.assert_allclose(scores[row], total, rtol=1e-4)


@pytest.mark.parametrize("config", [DecodeConfig(method="beam", beam_size=3, max_decode_len=T),
                                    DecodeConfig(method="beam", beam_size=4, num_beam_groups=2,
                                                 diversity_penalty=0.5, max_decode_len=T)])
def test_cached_ensemble_equals_the_uncached_reference(config):
  # A Transformer's KV cache and an RNN's state in one tuple, reordered by beam search.
  ensemble = Ensemble(models=(TRANSFORMER, RNN), weights=(2.0, 1.0))
  params = ensemble_params([init(TRANSFORMER, 2), init(RNN, 3)])
  cached = generate(ensemble, params, INPUTS_BS, config, n_best=True)
  uncached = generate_uncached(ensemble, params, INPUTS_BS, config, n_best=True)
  np.testing.assert_array_equal(cached[0], uncached[0])
  np.testing.assert_allclose(cached[1], uncached[1], rtol=1e-4, atol=1e-5)


def test_members_must_share_the_vocabulary_and_ids():
  other_vocab = RNNSeq2Seq(RNNConfig(vocab_size=V + 1, hidden_dim=4, embed_dim=4))
  with pytest.raises(ValueError, match=r"output vocabularies of sizes \[13, 14\]"):
    Ensemble(models=(TRANSFORMER, other_vocab))
  other_ids = RNNSeq2Seq(RNNConfig(vocab_size=V, hidden_dim=4, embed_dim=4, eos_id=3))
  with pytest.raises(ValueError, match=r"models\[1\] has special ids"):
    Ensemble(models=(TRANSFORMER, other_ids))
  with pytest.raises(ValueError, match="one positive weight per member"):
    Ensemble(models=(TRANSFORMER, RNN), weights=(1.0,))
  with pytest.raises(ValueError, match="average='mean'"):
    Ensemble(models=(TRANSFORMER,), average="mean")
  assert Ensemble(models=(TRANSFORMER, RNN)).config.max_len == 16  # the smaller limit
