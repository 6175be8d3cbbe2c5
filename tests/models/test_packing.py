"""Packed rows (several pairs a row, segment ids and positions): each pair as if alone.

The heart is parity: the logits of a pair inside a packed row equal those of the same
pair run alone, for every position scheme (sinusoidal, learned, T5's relative bias);
the packed loss and gradients equal the unpacked ones; and a test that fails if the
segment mask is dropped.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seq2seq_jax.configs import (DataConfig, ExperimentConfig, RNNConfig, T5Config,
                                 TransformerConfig)
from seq2seq_jax.layers import attention
from seq2seq_jax.layers.embeddings import PositionEmbedding
from seq2seq_jax.models.base import PACKING_KEYS, shift_right, special_ids
from seq2seq_jax.models.registry import build_model
from seq2seq_jax.training import step as step_lib
from tests.models.model_checks import transformer_variants

V, D, H, F, L = 13, 12, 3, 20, 11  # pairwise distinct; L: the packed row length

TRANSFORMER = TransformerConfig(vocab_size=V, model_dim=D, num_heads=H, mlp_dim=F,
                                num_encoder_layers=2, num_decoder_layers=2, max_len=16,
                                dropout_rate=0.0)
T5_BASE = T5Config(vocab_size=V, model_dim=D, num_heads=H, head_dim=5, mlp_dim=F,
                   num_encoder_layers=2, num_decoder_layers=2, relative_buckets=8,
                   relative_max_distance=5, max_len=16, dropout_rate=0.0)

VARIANTS = {
    **transformer_variants(TRANSFORMER),
    # Marian's ids: decoding starts from pad (the last id), eos is 0; its own position table.
    "marian_ids": dataclasses.replace(TRANSFORMER, positions="sinusoidal_marian",
                                      pad_id=V - 1, decoder_start_id=V - 1, eos_id=0,
                                      output_bias=True, embedding_norm=True),
    "xla_attention": dataclasses.replace(TRANSFORMER, attention_impl="xla"),
    "t5_relative": T5_BASE,
    "t5_gated_untied": dataclasses.replace(T5_BASE, activation="gelu_tanh", gated_ffn=True,
                                           tie_output=False, scale_output=False),
}

# (source length, target length) of each pair, EOS included; rows of L tokens a side.
ROWS = [[(5, 3), (4, 6), (2, 2)],  # three pairs; the targets fill all but 0 slots
        [(7, 4), (3, 5)],          # two pairs, padding after
        [(1, 1)]]                  # one short pair, mostly padding


def _pairs(config, seed=0, rows=ROWS):
  """Random pairs of the given lengths: ordinary tokens, then the model's EOS."""
  ids = special_ids(build_model(config))
  reserved = {ids.pad_id, ids.decoder_start_id, ids.eos_id}
  ordinary = np.array([t for t in range(V) if t not in reserved])
  rng = np.random.default_rng(seed)
  out = []
  for row in rows:
    out.append([])
    for source_len, target_len in row:
      side = lambda n: np.append(rng.choice(ordinary, n - 1), ids.eos_id).astype(np.int32)
      out[-1].append((side(source_len), side(target_len)))
  return out


def _pack(pairs, pad_id):
  """The packed batch the input pipeline builds: pairs one after the other in each row."""
  rows = len(pairs)
  batch = {"inputs": np.full((rows, L), pad_id, np.int32),
           "targets": np.full((rows, L), pad_id, np.int32),
           **{key: np.zeros((rows, L), np.int32) for key in PACKING_KEYS},
           "weights": np.ones(rows, np.float32)}
  for r, row in enumerate(pairs):
    column = {"inputs": 0, "targets": 0}
    for segment, (source, target) in enumerate(row, start=1):
      for key, ids in (("inputs", source), ("targets", target)):
        where = slice(column[key], column[key] + len(ids))
        batch[key][r, where] = ids
        batch[f"{key}_segment_ids"][r, where] = segment
        batch[f"{key}_positions"][r, where] = np.arange(len(ids))
        column[key] += len(ids)
  return batch


def _alone(pairs, pad_id):
  """One pair a row, padded to L: the unpacked batch of the same pairs."""
  flat = [pair for row in pairs for pair in row]
  batch = {"inputs": np.full((len(flat), L), pad_id, np.int32),
           "targets": np.full((len(flat), L), pad_id, np.int32)}
  for i, (source, target) in enumerate(flat):
    batch["inputs"][i, :len(source)] = source
    batch["targets"][i, :len(target)] = target
  return batch


def _init(config):
  model = build_model(config)
  x = jnp.ones((1, 4), jnp.int32)
  params = model.init(jax.random.key(0), x, x[:, :3])["params"]
  # Perturb every parameter so norm scales and biases are not the trivial 1 / 0.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return model, jax.tree.unflatten(tree, [p + 0.1 * jax.random.normal(k, p.shape)
                                          for p, k in zip(leaves, keys)])


def _packed_logits(model, params, batch):
  return model.apply({"params": params}, batch["inputs"], batch["targets"],
                     **{key: batch[key] for key in PACKING_KEYS})


def _segments(pairs):
  """(row, target start column, target length, flat pair index) of every pair."""
  out, flat = [], 0
  for r, row in enumerate(pairs):
    column = 0
    for _, target in row:
      out.append((r, column, len(target), flat))
      column += len(target)
      flat += 1
  return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_packed_pair_has_the_logits_it_has_alone(name):
  config = VARIANTS[name]
  model, params = _init(config)
  pairs = _pairs(config)
  packed_RTV = _packed_logits(model, params, _pack(pairs, config.pad_id))
  alone = _alone(pairs, config.pad_id)
  alone_NTV = model.apply({"params": params}, alone["inputs"], alone["targets"])
  for r, start, length, n in _segments(pairs):
    np.testing.assert_allclose(packed_RTV[r, start:start + length], alone_NTV[n, :length],
                               rtol=1e-5, atol=1e-5, err_msg=f"{name}: row {r}, pair {n}")


def test_the_xla_route_honours_the_segment_mask_as_the_einsums_do():
  """``jax.nn.dot_product_attention(implementation="xla")`` under a packed row's masks."""
  rng = np.random.default_rng(3)
  q, k, v = (jnp.asarray(rng.normal(size=(2, L, H, 4)), jnp.float32) for _ in range(3))
  segments = jnp.asarray(_pack(_pairs(TRANSFORMER, rows=ROWS[:2]), 0)["inputs_segment_ids"])
  causal = attention.AttentionMask(causal=True).dense(batch=segments.shape[0], queries=L)
  same_segment = attention.make_segment_mask(segments, segments)
  for mask in (same_segment, jnp.logical_and(causal, same_segment)):
    ours = attention.dot_product_attention(q, k, v, mask)
    fused = attention.dot_product_attention(q, k, v, mask, implementation="xla")
    # Padded queries attend nowhere: both give uniform rows there; compare the real ones.
    real = np.asarray(segments != 0)
    np.testing.assert_allclose(np.asarray(fused)[real], np.asarray(ours)[real], rtol=1e-5,
                               atol=1e-5)


def test_changing_one_pair_changes_no_other_pair_of_its_row():
  """Fails if any mask is dropped: pair 2's source and target reach pairs 1 and 3 only
  through a leak (the encoder is bidirectional, so a missing encoder mask is caught even
  for pair 1)."""
  for config in (TRANSFORMER, T5_BASE):
    model, params = _init(config)
    pairs = _pairs(config)
    other = _pairs(config, seed=1)
    changed = [list(row) for row in pairs]
    changed[0][1] = other[0][1]  # row 0's second pair: new source and target tokens
    before = _packed_logits(model, params, _pack(pairs, config.pad_id))
    after = _packed_logits(model, params, _pack(changed, config.pad_id))
    (_, s1, n1, _), (_, s2, n2, _), (_, s3, n3, _) = _segments(pairs)[:3]
    assert not np.allclose(before[0, s2:s2 + n2], after[0, s2:s2 + n2], atol=1e-3)
    np.testing.assert_allclose(after[0, s1:s1 + n1], before[0, s1:s1 + n1], rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(after[0, s3:s3 + n3], before[0, s3:s3 + n3], rtol=1e-6,
                               atol=1e-6)
    # The control: the same rows read unpacked (no segment ids) do leak into pair 1.
    plain = lambda b: model.apply({"params": params}, b["inputs"], b["targets"])
    assert not np.allclose(plain(_pack(pairs, config.pad_id))[0, s1:s1 + n1],
                           plain(_pack(changed, config.pad_id))[0, s1:s1 + n1], atol=1e-4)


@pytest.mark.parametrize("name", ["post_learned", "t5_relative"])
def test_the_packed_loss_is_the_unpacked_loss(name):
  config = VARIANTS[name]
  model, params = _init(config)
  pairs = _pairs(config)
  packed = step_lib.eval_step(params, _pack(pairs, config.pad_id), model=model,
                              label_smoothing=0.1)
  alone = step_lib.eval_step(params, _alone(pairs, config.pad_id), model=model,
                             label_smoothing=0.1)
  # Every real target token once: the targets' lengths, summed.
  assert float(packed["tokens"]) == float(alone["tokens"]) == sum(
      len(t) for row in pairs for _, t in row)
  for key in ("loss", "nll", "correct"):
    np.testing.assert_allclose(packed[key], alone[key], rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("name", ["pre_sinusoidal", "t5_relative"])
def test_a_packed_train_step_has_the_unpacked_gradients(name):
  """``optax.identity`` makes the update the gradient itself (params + g): the packed batch,
  whole or in two microbatches, moves every parameter as the unpacked batch does."""
  config = VARIANTS[name]
  model, params = _init(config)
  pairs = _pairs(config, rows=ROWS[:2])  # two rows: two microbatches of one row
  optimizer = optax.identity()
  state = step_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                              opt_state=optimizer.init(params))

  def gradient(batch, grad_accum_steps):
    new, metrics = step_lib.train_step(state, batch, jax.random.key(0), model=model,
                                       optimizer=optimizer, schedule=optax.constant_schedule(1.0),
                                       label_smoothing=0.1, grad_accum_steps=grad_accum_steps)
    return jax.tree.map(jnp.subtract, new.params, params), metrics

  want, want_metrics = gradient(_alone(pairs, config.pad_id), 1)
  for accum in (1, 2):
    got, metrics = gradient(_pack(pairs, config.pad_id), accum)
    assert float(metrics["tokens"]) == float(want_metrics["tokens"])
    np.testing.assert_allclose(metrics["loss"], want_metrics["loss"], rtol=1e-5)
    for path, g in jax.tree_util.tree_leaves_with_path(got):
      np.testing.assert_allclose(g, _at(want, path), rtol=1e-4, atol=1e-6,
                                 err_msg=f"{jax.tree_util.keystr(path)}, {accum} microbatches")


def _at(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


def test_each_target_segment_starts_from_the_decoder_start_id():
  targets = jnp.array([[5, 6, 2, 7, 2, 8, 9, 2, 0, 0]])
  segments = jnp.array([[1, 1, 1, 2, 2, 3, 3, 3, 0, 0]])
  np.testing.assert_array_equal(shift_right(targets, 1, segment_ids_BT=segments),
                                [[1, 5, 6, 1, 7, 1, 8, 9, 1, 0]])
  np.testing.assert_array_equal(shift_right(targets, 1), [[1, 5, 6, 2, 7, 2, 8, 9, 2, 0]])


def test_the_segment_mask_keeps_segments_apart_and_attends_no_padding():
  query = jnp.array([[1, 1, 2, 0]])
  key = jnp.array([[1, 2, 2, 2, 0]])
  want = [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 1, 0], [0, 0, 0, 0, 0]]
  mask = attention.make_segment_mask(query, key)
  assert mask.shape == (1, 1, 4, 5) and mask.dtype == jnp.bool_
  np.testing.assert_array_equal(mask[0, 0], want)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_position_vectors_are_read_at_the_given_positions(kind):
  positions_BT = jnp.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
  table = PositionEmbedding(max_len=8, dim=4, kind=kind)
  x_BTD = jnp.zeros((2, 6, 4))
  variables = table.init(jax.random.key(0), x_BTD)
  by_position = table.apply(variables, x_BTD, positions_BT=positions_BT)
  whole = table.apply(variables, jnp.zeros((1, 8, 4)))[0]  # rows 0..7 of the table
  np.testing.assert_array_equal(by_position, whole[positions_BT])
  np.testing.assert_array_equal(by_position[1], table.apply(variables, x_BTD)[1])
  # A position past the table reads NaN, not the last row.
  past = table.apply(variables, x_BTD, positions_BT=positions_BT.at[0, 0].set(8))
  assert np.isnan(past[0, 0]).all() and not np.isnan(past[0, 1:]).any()


def test_half_a_packing_or_a_packed_side_alone_is_refused():
  model, params = _init(TRANSFORMER)
  batch = _pack(_pairs(TRANSFORMER), TRANSFORMER.pad_id)
  variables = {"params": params}
  with pytest.raises(ValueError, match="positions are missing"):
    model.apply(variables, batch["inputs"], batch["targets"],
                inputs_segment_ids=batch["inputs_segment_ids"])
  memory = model.apply(variables, batch["inputs"], method="encode")
  with pytest.raises(ValueError, match="memory encoded from packed inputs"):
    model.apply(variables, memory, batch["targets"], segment_ids=batch["targets_segment_ids"],
                positions=batch["targets_positions"], method="decode")
  with pytest.raises(ValueError, match="shaped like the tokens"):
    model.apply(variables, batch["inputs"], method="encode",
                segment_ids=batch["inputs_segment_ids"][:, :-1],
                positions=batch["inputs_positions"][:, :-1])


def test_the_rnn_refuses_packing_by_name():
  rnn = RNNConfig(vocab_size=V, embed_dim=4, hidden_dim=6, attention="general")
  data = DataConfig(vocab_size=V, packing=True, max_source_len=16, max_target_len=16,
                    bucket_lengths=(8, 16))
  with pytest.raises(ValueError, match=r"data\.packing.*'rnn' model \(RNNConfig\)"):
    ExperimentConfig(model=rnn, data=data)
  ExperimentConfig(model=rnn, data=dataclasses.replace(data, packing=False))  # fine unpacked
  ExperimentConfig(model=TRANSFORMER, data=data)
  ExperimentConfig(model=T5_BASE, data=data)
  model, params = _init(rnn)
  batch = _pack(_pairs(rnn), rnn.pad_id)
  with pytest.raises(ValueError, match="RNNSeq2Seq cannot train on packed rows"):
    _packed_logits(model, params, batch)
  # The training step hands a packed batch's keys on, so the RNN refuses there too.
  optimizer = optax.identity()
  state = step_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                              opt_state=optimizer.init(params))
  with pytest.raises(ValueError, match="inputs_segment_ids"):
    step_lib.train_step(state, batch, jax.random.key(0), model=model, optimizer=optimizer,
                        schedule=optax.constant_schedule(1.0))


def test_packed_rows_must_fit_the_model():
  data = DataConfig(vocab_size=V, packing=True, max_source_len=16, max_target_len=16,
                    bucket_lengths=(8, 16, 32))
  with pytest.raises(ValueError, match=r"model\.max_len=16.*packed row length.*32"):
    ExperimentConfig(model=TRANSFORMER, data=data)
  ExperimentConfig(model=TRANSFORMER, data=dataclasses.replace(data, packing=False))

