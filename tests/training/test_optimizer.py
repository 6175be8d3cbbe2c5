"""The weight-decay mask and what AdamW does with it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from seq2seq_jax.configs import TrainConfig
from seq2seq_jax.training.optimizer import decay_mask, make_optimizer
from seq2seq_jax.training.step import build_model, init_params
from training.conftest import tiny_rnn, tiny_transformer


def _flat(tree):
  return {jax.tree_util.keystr(path): leaf for path, leaf in
          jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_transformer_mask_decays_kernels_only():
  config = tiny_transformer(positions="learned", tie_output=False, norm="pre")
  params = init_params(build_model(config), jax.random.key(0))
  mask = _flat(decay_mask(params))
  decayed = {k for k, v in mask.items() if v}
  assert decayed and all(k.endswith("['kernel']") for k in decayed)
  for key, value in mask.items():
    if key.endswith(("['bias']", "['scale']", "['embedding']", "['position_embedding']")):
      assert not value, key
  assert mask["['source_embedding']['embedding']"] is False
  assert mask["['source_positions']['position_embedding']"] is False
  assert mask["['encoder_norm']['scale']"] is False
  assert mask["['output_projection']['kernel']"] is True
  assert mask["['encoder_layers_0']['self_attention']['query']['kernel']"] is True


def test_rnn_mask_decays_kernels_only():
  params = init_params(build_model(tiny_rnn()), jax.random.key(0))
  mask = _flat(decay_mask(params))
  assert any(mask.values())
  for key, value in mask.items():
    assert value == key.endswith("['kernel']"), key


def test_adamw_leaves_masked_leaves_undecayed():
  params = {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)},
            "embed": {"embedding": jnp.ones((4, 2))}, "norm": {"scale": jnp.ones(3)}}
  optimizer = make_optimizer(TrainConfig(weight_decay=0.5, clip_norm=1.0),
                             optax.constant_schedule(0.1))
  state = optimizer.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = optimizer.update(zeros, state, params)
  new = optax.apply_updates(params, updates)
  np.testing.assert_allclose(new["dense"]["kernel"], 1 - 0.1 * 0.5)  # decoupled decay
  for leaf in (new["dense"]["bias"], new["embed"]["embedding"], new["norm"]["scale"]):
    np.testing.assert_array_equal(leaf, 1.0)


def _run(optimizer, grads_list):
  params = {"w": jnp.zeros(4)}
  state = optimizer.init(params)
  for grads in grads_list:
    updates, state = optimizer.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params["w"]


def test_clipping_by_global_norm_happens_before_adam():
  # Adam is invariant to one constant gradient scale, so two steps of different
  # norms are needed to see the clipping: 20 is clipped to 1, 0.5 is not.
  grads_list = [{"w": jnp.full(4, 10.0)}, {"w": jnp.array([0.25, -0.25, 0.25, -0.25])}]
  schedule = optax.constant_schedule(0.1)
  ours = _run(make_optimizer(TrainConfig(clip_norm=1.0), schedule), grads_list)
  reference = _run(optax.chain(optax.clip_by_global_norm(1.0),
                               optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0)),
                   grads_list)
  unclipped = _run(make_optimizer(TrainConfig(clip_norm=0.0), schedule), grads_list)
  np.testing.assert_allclose(ours, reference, rtol=1e-6)
  assert not np.allclose(ours, unclipped, rtol=1e-3)
