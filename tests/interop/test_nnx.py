"""The Transformer inside a flax.nnx program: wrapped by the Linen-to-NNX bridge, trained with
``nnx.Optimizer``, decoded by the library's searches; the same numbers as the Linen model."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import seq2seq_jax as s2s

CONFIG = s2s.TransformerConfig(vocab_size=13, model_dim=16, num_heads=2, mlp_dim=24,
                               num_encoder_layers=2, num_decoder_layers=2, max_len=32,
                               dropout_rate=0.0)
STEPS = 50


def _copy_batch(seed: int):
  """Random sources of words 3..12 then EOS; the target is the source (a copy task)."""
  rng = np.random.default_rng(seed)
  inputs = np.concatenate([rng.integers(3, CONFIG.vocab_size, (4, 5)),
                           np.full((4, 1), 2)], axis=1).astype(np.int32)
  return jnp.asarray(inputs), jnp.asarray(inputs)


def _loss(logits_BTV, targets_BT):
  return optax.softmax_cross_entropy_with_integer_labels(logits_BTV, targets_BT).mean()


def _nnx_model(params):
  """The other project's side: the library's Linen Transformer as an NNX module."""
  inputs, targets = _copy_batch(0)
  model = nnx.bridge.ToNNX(s2s.Transformer(CONFIG), rngs=nnx.Rngs(0)).lazy_init(inputs, targets)
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(model, state)
  return model


@pytest.fixture(scope="module")
def trained():
  """The same Adam steps from the same start, once through NNX and once through Linen."""
  linen_model = s2s.Transformer(CONFIG)
  inputs, targets = _copy_batch(0)
  params0 = linen_model.init(jax.random.key(1), inputs, targets)["params"]
  tx = optax.adam(1e-2)

  model = _nnx_model(params0)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  @nnx.jit
  def nnx_step(model, optimizer, inputs, targets):
    loss, grads = nnx.value_and_grad(lambda m: _loss(m(inputs, targets), targets))(model)
    optimizer.update(model, grads)
    return loss

  @jax.jit
  def linen_step(params, opt_state, inputs, targets):
    loss, grads = jax.value_and_grad(
        lambda p: _loss(linen_model.apply({"params": p}, inputs, targets), targets))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  params, opt_state = params0, tx.init(params0)
  nnx_losses, linen_losses = [], []
  for step in range(STEPS):
    batch = _copy_batch(step)
    nnx_losses.append(float(nnx_step(model, optimizer, *batch)))
    params, opt_state, loss = linen_step(params, opt_state, *batch)
    linen_losses.append(float(loss))
  return dict(model=model, linen_model=linen_model, params0=params0, linen_params=params,
              nnx_losses=nnx_losses, linen_losses=linen_losses)


def test_bridge_holds_the_linen_parameter_tree(trained):
  nnx_params = nnx.to_pure_dict(nnx.state(trained["model"], nnx.Param))
  assert (jax.tree.structure(nnx_params) == jax.tree.structure(trained["linen_params"]))


def test_nnx_optimizer_training_equals_linen_training(trained):
  np.testing.assert_allclose(trained["nnx_losses"], trained["linen_losses"], rtol=1e-5)
  assert trained["nnx_losses"][-1] < trained["nnx_losses"][0]  # it trained
  nnx_params = nnx.to_pure_dict(nnx.state(trained["model"], nnx.Param))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               nnx_params, trained["linen_params"])
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()),
                                       nnx_params, trained["params0"]))
  assert max(moved) > 1e-3


@pytest.mark.parametrize("decode_config", [s2s.DecodeConfig(method="greedy", max_decode_len=9),
                                           s2s.DecodeConfig(method="beam", beam_size=3,
                                                            alpha=0.6, max_decode_len=9)],
                         ids=["greedy", "beam"])
def test_generate_with_nnx_parameters_equals_linen(trained, decode_config):
  inputs, _ = _copy_batch(11)
  nnx_params = nnx.to_pure_dict(nnx.state(trained["model"], nnx.Param))
  tokens, scores = s2s.generate(trained["linen_model"], nnx_params, inputs, decode_config)
  linen_tokens, linen_scores = s2s.generate(trained["linen_model"], trained["linen_params"],
                                            inputs, decode_config)
  np.testing.assert_array_equal(tokens, linen_tokens)
  np.testing.assert_allclose(scores, linen_scores, rtol=1e-4)
  assert len({tuple(row) for row in np.asarray(tokens).tolist()}) > 1  # outputs follow inputs


def test_searches_driven_by_the_nnx_module_itself(trained):
  """No Linen params in sight: the step function calls the NNX module's own methods."""
  inputs, _ = _copy_batch(12)
  batch, length = inputs.shape[0], 9

  @nnx.jit(static_argnums=2)
  def beam_decode(model, inputs, beam_size):
    memory = model.encode(inputs)
    cache = model.init_cache(memory, length)
    memory = s2s.expand_to_beams(memory, beam_size)
    graphdef, state = nnx.split(model)

    def step_fn(tokens, cache):
      # The search's lax.while_loop body is a trace of its own: NNX modules are used there
      # through split / merge (a bridge module draws from its Rngs at every call).
      return nnx.merge(graphdef, state, copy=True).decode_step(memory, tokens, cache)

    return s2s.beam_search(step_fn, cache, batch_size=batch, beam_size=beam_size,
                           max_decode_len=length, alpha=0.6, bos_id=1, eos_id=2)

  tokens_BWT, scores_BW = beam_decode(trained["model"], inputs, 3)
  expected, expected_scores = s2s.generate(
      trained["linen_model"], trained["linen_params"], inputs,
      s2s.DecodeConfig(method="beam", beam_size=3, alpha=0.6, max_decode_len=length),
      n_best=True)
  np.testing.assert_array_equal(tokens_BWT, expected)
  np.testing.assert_allclose(scores_BW, expected_scores, rtol=1e-4)
