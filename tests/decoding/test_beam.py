"""Beam search: helpers one by one, hand-set cases, and exhaustive search on a tiny space."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from decoding_toys import MarkovToy, PrefixToy, run_jit
from seq2seq_jax.decoding import (beam_search, expand_to_beams, gather_beams, greedy_search,
                                  length_penalty)
from seq2seq_jax.layers.attention import KVCache
from seq2seq_jax.types import BOS_ID, EOS_ID, NEG_INF, PAD_ID


def beam(toy, cache, *, batch_size, beam_size, max_decode_len, alpha=0.0, step_fn=None):
  return run_jit(beam_search, step_fn or toy.step_fn, cache, batch_size=batch_size,
                 beam_size=beam_size, max_decode_len=max_decode_len, alpha=alpha,
                 bos_id=BOS_ID, eos_id=EOS_ID)


def greedy(toy, cache, *, batch_size, max_decode_len):
  return run_jit(greedy_search, toy.step_fn, cache, batch_size=batch_size,
                 max_decode_len=max_decode_len, bos_id=BOS_ID, eos_id=EOS_ID)


# Helpers ---------------------------------------------------------------------

def test_length_penalty_is_gnmt():
  np.testing.assert_allclose(length_penalty(jnp.array([1, 4, 7]), 0.6),
                             [(6 / 6) ** 0.6, (9 / 6) ** 0.6, (12 / 6) ** 0.6], rtol=1e-6)
  np.testing.assert_allclose(length_penalty(9, 0.0), 1.0)


def test_expand_to_beams_repeats_rows_and_shares_scalars():
  tree = {"index": jnp.array(3), "layers": jnp.arange(2 * 3 * 4).reshape(2, 3, 4),
          "nested": [jnp.array([7, 8])]}
  out = expand_to_beams(tree, 5)
  assert out["index"].shape == () and int(out["index"]) == 3
  assert out["layers"].shape == (10, 3, 4)
  for row in range(10):
    np.testing.assert_array_equal(out["layers"][row], tree["layers"][row // 5])
  np.testing.assert_array_equal(out["nested"][0], [7] * 5 + [8] * 5)
  with pytest.raises(ValueError, match="beam_size"):
    expand_to_beams(tree, 0)


def test_gather_beams_flat_and_unflat():
  beams_BW = jnp.array([[2, 0], [1, 1]])
  unflat_BWX = jnp.arange(2 * 3 * 4).reshape(2, 3, 4)
  out = gather_beams({"x": unflat_BWX, "i": jnp.array(5)}, beams_BW, flat=False)
  np.testing.assert_array_equal(out["x"], unflat_BWX[jnp.array([[0], [1]]), beams_BW])
  assert int(out["i"]) == 5
  # Flat: rows b * W + w, as step_fn sees them; stacked leaves [N, L, ...] keep their layers.
  flat_NLX = jnp.arange(6 * 2 * 3).reshape(6, 2, 3)
  out = gather_beams(flat_NLX, beams_BW, flat=True)
  np.testing.assert_array_equal(out, flat_NLX[jnp.array([2, 0, 4, 4])])


def test_nodes_with_gather_rows_reorder_themselves():
  cache = KVCache.zeros(rows=2, layers=1, length=3, heads=1, head_dim=2)
  for t in range(2):
    rows = jnp.arange(2, dtype=jnp.float32)[:, None, None] + 10 * t
    cache = cache.write(rows + 1, rows + 5, jnp.int32(t), 0)
  tree = {"kv": cache, "index": jnp.int32(2), "h": jnp.arange(2)}
  tiled = expand_to_beams(tree, 3)
  assert isinstance(tiled["kv"], KVCache) and tiled["kv"].key[0].shape == (6, 3, 1, 2)
  np.testing.assert_array_equal(tiled["h"], [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(tiled["kv"].resolved()[0][:, 0, :2, 0, 0],
                                np.repeat(cache.resolved()[0][:, 0, :2, 0, 0], 3, axis=0))
  beams_BW = jnp.array([[2, 2, 0], [1, 0, 0]])
  out = gather_beams(tiled, beams_BW, flat=True)
  assert out["kv"].key is tiled["kv"].key  # the buffers stay where they are
  np.testing.assert_array_equal(out["kv"].resolved()[0],
                                tiled["kv"].resolved()[0][jnp.array([2, 2, 0, 4, 3, 3])])
  with pytest.raises(ValueError, match="flat=True"):
    gather_beams({"kv": cache}, jnp.zeros((2, 1), jnp.int32), flat=False)


def test_cache_leaves_without_the_batch_axis_are_refused():
  toy = MarkovToy([{}, {}], max_len=3)
  cache = dict(toy.init_cache(), table=jnp.zeros((4, 2)))  # leading axis is not the batch
  with pytest.raises(ValueError, match=r"\['table'\].*axis 0"):
    beam_search(toy.step_fn, cache, batch_size=2, beam_size=2, max_decode_len=3, alpha=0.0,
                bos_id=BOS_ID, eos_id=EOS_ID)


# Hand-set cases ---------------------------------------------------------------

# Greedy takes 3 (0.6) then EOS (0.4): 0.24. Starting with 4 (0.4) then EOS (0.9): 0.36.
BEAM_BEATS_GREEDY = [{(0, BOS_ID): {3: 0.6, 4: 0.4},
                      (1, 3): {EOS_ID: 0.4, 5: 0.3, 4: 0.3},
                      (1, 4): {EOS_ID: 0.9, 3: 0.1}}]


def test_beam_beats_greedy():
  toy = MarkovToy(BEAM_BEATS_GREEDY, max_len=4)
  greedy_BT, greedy_B = greedy(toy, toy.init_cache(), batch_size=1, max_decode_len=4)
  np.testing.assert_array_equal(greedy_BT, [[3, EOS_ID, PAD_ID, PAD_ID]])
  np.testing.assert_allclose(greedy_B, [math.log(0.24)], rtol=1e-6)
  tokens_BWT, scores_BW = beam(toy, toy.init_cache(), batch_size=1, beam_size=2,
                               max_decode_len=4)
  np.testing.assert_array_equal(tokens_BWT, [[[4, EOS_ID, PAD_ID, PAD_ID],
                                              [3, EOS_ID, PAD_ID, PAD_ID]]])
  np.testing.assert_allclose(scores_BW, [[math.log(0.36), math.log(0.24)]], rtol=1e-6)


def test_length_penalty_can_prefer_the_longer_output():
  # [5, EOS]: 0.5 * 0.9 = 0.45 beats [3, 3, EOS]: 0.5 * 0.9 * 0.8 = 0.36 on log-probability,
  # but with alpha = 2 the longer one wins: log(0.36) / (8/6)**2 > log(0.45) / (7/6)**2.
  probs = [{(0, BOS_ID): {3: 0.5, 5: 0.5}, (1, 5): {EOS_ID: 0.9, 4: 0.1},
            (1, 3): {3: 0.9, EOS_ID: 0.1}, (2, 3): {EOS_ID: 0.8, 4: 0.2}}]
  toy = MarkovToy(probs, max_len=3)
  for alpha, best in ((0.0, [5, EOS_ID, PAD_ID]), (2.0, [3, 3, EOS_ID])):
    tokens_BWT, scores_BW = beam(toy, toy.init_cache(), batch_size=1, beam_size=2,
                                 max_decode_len=3, alpha=alpha)
    np.testing.assert_array_equal(tokens_BWT[0, 0], best)
    length = 2 if best[-1] == PAD_ID else 3
    logprob = math.log(0.45) if length == 2 else math.log(0.36)
    np.testing.assert_allclose(scores_BW[0, 0], logprob / ((5 + length) / 6) ** alpha,
                               rtol=1e-6)


def test_one_beam_keeps_an_earlier_eos_hypothesis_that_beats_greedy():
  # EOS first has 0.4; greedy prefers 3 (0.6) but every continuation ends at <= 0.6 * 0.5.
  probs = [{(0, BOS_ID): {3: 0.6, EOS_ID: 0.4}, (1, 3): {4: 0.5, 5: 0.3, EOS_ID: 0.2},
            (2, 4): {EOS_ID: 0.9, 3: 0.1}}]
  toy = MarkovToy(probs, max_len=4)
  greedy_BT, greedy_B = greedy(toy, toy.init_cache(), batch_size=1, max_decode_len=4)
  np.testing.assert_array_equal(greedy_BT, [[3, 4, EOS_ID, PAD_ID]])
  tokens_BWT, scores_BW = beam(toy, toy.init_cache(), batch_size=1, beam_size=1,
                               max_decode_len=4)
  np.testing.assert_array_equal(tokens_BWT, [[[EOS_ID, PAD_ID, PAD_ID, PAD_ID]]])
  np.testing.assert_allclose(scores_BW, [[math.log(0.4)]], rtol=1e-6)
  assert scores_BW[0, 0] > greedy_B[0]


def test_rows_that_never_emit_eos_are_returned_as_they_stand():
  toy = PrefixToy(seed=1, rows=2, max_len=4, eos_from=None)
  tokens_BWT, scores_BW = beam(toy, toy.init_cache(), batch_size=2, beam_size=3,
                               max_decode_len=4, alpha=0.6)
  assert np.all(tokens_BWT > EOS_ID)  # all real words, no EOS, no padding
  for row in range(2):
    best = toy.enumerate(row, 4, 0.6)[:3]
    np.testing.assert_array_equal(tokens_BWT[row], [tokens for _, tokens in best])
    np.testing.assert_allclose(scores_BW[row], [score for score, _ in best], rtol=1e-5)


def test_search_stops_early_once_no_live_beam_can_win():
  # Both beams end with near-certain EOS at the second token; 20 tokens would be allowed.
  probs = [{(0, BOS_ID): {3: 0.7, 4: 0.3}, (1, 3): {EOS_ID: 0.99, 5: 0.01},
            (1, 4): {EOS_ID: 0.98, 5: 0.02}}]
  toy = MarkovToy(probs, max_len=20)
  calls = []

  def counted_step_fn(tokens_N, cache):
    jax.debug.callback(lambda: calls.append(1))
    return toy.step_fn(tokens_N, cache)

  tokens_BWT, _ = beam(toy, toy.init_cache(), batch_size=1, beam_size=2, max_decode_len=20,
                       alpha=0.6, step_fn=counted_step_fn)
  jax.effects_barrier()
  np.testing.assert_array_equal(tokens_BWT[0, :, :3], [[3, EOS_ID, PAD_ID], [4, EOS_ID, PAD_ID]])
  # After step 2 the best live beam has log-prob <= log(0.7 * 0.01): even at the largest
  # length penalty it cannot beat log(0.3 * 0.98) / lp(2). Without early stopping: 20 calls.
  assert len(calls) == 2


# Against exhaustive search ------------------------------------------------------

@pytest.mark.parametrize("beam_size, alpha", [(40, 0.0), (40, 2.0), (9, 0.6)])
def test_a_beam_as_wide_as_the_search_space_is_exhaustive(alpha, beam_size):
  # 3 words + EOS, at most 3 tokens: 1 + 3 + 9 outputs end in EOS, 27 run to the limit.
  # 9 beams already hold every live prefix, so the 9 best come out exactly too.
  toy = PrefixToy(seed=7, rows=2, max_len=3, eos_from=0, eos_boost=1.0)
  tokens_BWT, scores_BW = beam(toy, toy.init_cache(), batch_size=2, beam_size=beam_size,
                               max_decode_len=3, alpha=alpha)
  for row in range(2):
    every = toy.enumerate(row, 3, alpha)
    assert len(every) == 40
    np.testing.assert_array_equal(tokens_BWT[row], [tokens for _, tokens in every[:beam_size]])
    np.testing.assert_allclose(scores_BW[row], [score for score, _ in every[:beam_size]],
                               rtol=1e-5)


def test_slots_beyond_the_search_space_are_empty():
  toy = PrefixToy(seed=7, rows=1, max_len=1, eos_from=0)
  tokens_BWT, scores_BW = beam(toy, toy.init_cache(), batch_size=1, beam_size=6,
                               max_decode_len=1, alpha=0.6)
  every = toy.enumerate(0, 1, 0.6)  # EOS and the three words
  np.testing.assert_array_equal(tokens_BWT[0, :4], [tokens for _, tokens in every])
  np.testing.assert_array_equal(tokens_BWT[0, 4:], PAD_ID)
  np.testing.assert_array_equal(scores_BW[0, 4:], NEG_INF)


# Against greedy -------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("eos_from", [None, 4])
def test_one_beam_without_length_penalty_is_greedy(seed, eos_from):
  # EOS cannot end a hypothesis early: it is impossible, or impossible before position 4
  # and then by far the most likely token, so greedy takes it as soon as beam search can.
  toy = PrefixToy(seed=seed, rows=3, max_len=7, eos_from=eos_from, eos_boost=30.0)
  greedy_BT, greedy_B = greedy(toy, toy.init_cache(), batch_size=3, max_decode_len=7)
  tokens_BWT, scores_BW = beam(toy, toy.init_cache(), batch_size=3, beam_size=1,
                               max_decode_len=7)
  np.testing.assert_array_equal(tokens_BWT[:, 0], greedy_BT)
  np.testing.assert_allclose(scores_BW[:, 0], greedy_B, rtol=1e-6)


def test_rows_decode_independently():
  toy = PrefixToy(seed=8, rows=3, max_len=5, eos_from=1, eos_boost=0.5)
  tokens_BWT, scores_BW = beam(toy, toy.init_cache(), batch_size=3, beam_size=4,
                               max_decode_len=5, alpha=0.6)
  assert not np.array_equal(tokens_BWT[0], tokens_BWT[1])
  for row in range(3):
    alone_1WT, alone_1W = beam(toy, toy.init_cache([row]), batch_size=1, beam_size=4,
                               max_decode_len=5, alpha=0.6)
    np.testing.assert_array_equal(alone_1WT[0], tokens_BWT[row])
    np.testing.assert_allclose(alone_1W[0], scores_BW[row], rtol=1e-6)


def test_a_transformer_s_beam_search_is_the_same_in_every_platform_s_branches(monkeypatch):
  # A TPU program holds the other branch of every `on_cpu` choice: the KVCache read as
  # each sentence's block of beams, the top-k of each row first. Run here, both
  # branches must give the same n-best lists.
  from seq2seq_jax import Transformer, TransformerConfig, platforms  # noqa: PLC0415
  from seq2seq_jax.configs import DecodeConfig  # noqa: PLC0415
  from seq2seq_jax.decoding.generation import generate  # noqa: PLC0415
  from seq2seq_jax.layers import attention  # noqa: PLC0415

  model = Transformer(TransformerConfig(vocab_size=2500, model_dim=32, num_heads=2, mlp_dim=64,
                                        num_encoder_layers=1, num_decoder_layers=2))
  inputs = jnp.asarray(np.random.default_rng(0).integers(3, 2500, (3, 7)), jnp.int32)
  inputs = inputs.at[:, -1].set(EOS_ID)
  params = model.init(jax.random.key(0), inputs, inputs)["params"]
  config = DecodeConfig(method="beam", beam_size=4, max_decode_len=12)
  cpu_tokens, cpu_scores = generate(model, params, inputs, config, n_best=True)
  other = lambda cpu, other, *args: other(*args)
  monkeypatch.setattr(platforms, "on_cpu", other)
  monkeypatch.setattr(attention, "on_cpu", other)
  # Another seed (sampling's only): not the compiled search of the call above, traced anew.
  tokens, scores = generate(model, params, inputs, dataclasses.replace(config, seed=1), n_best=True)
  np.testing.assert_array_equal(tokens, cpu_tokens)
  np.testing.assert_allclose(scores, cpu_scores, rtol=1e-5, atol=1e-5)
