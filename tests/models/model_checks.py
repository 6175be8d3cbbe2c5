"""What the Transformer and T5 tests (and the packing tests) check the same way."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def transformer_variants(base):
  """The Transformer's norm / position / sharing combinations, built on ``base``."""
  return {
      "post_sinusoidal": base,
      "pre_sinusoidal": dataclasses.replace(base, norm="pre"),
      "post_learned": dataclasses.replace(base, positions="learned"),
      "pre_learned_untied": dataclasses.replace(base, norm="pre", positions="learned",
                                                share_embeddings=False, tie_output=False),
  }


def perturbed_init(model, inputs, targets):
  """``model``'s parameters, each moved off its initial value (norm scales not 1, biases not 0)."""
  params = model.init(jax.random.key(0), inputs, targets)["params"]
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return jax.tree.unflatten(tree, [p + 0.1 * jax.random.normal(k, p.shape)
                                   for p, k in zip(leaves, keys)])


def check_cached_decode_parity(model, params, inputs, targets, *, start_id, cache_len):
  """Step-by-step cached decoding gives the teacher-forced logits at every position."""
  variables = {"params": params}
  steps = targets.shape[1]
  full_BTV = model.apply(variables, inputs, targets)
  memory = model.apply(variables, inputs, method="encode")
  cache = model.apply(variables, memory, cache_len, method="init_cache")
  step = jax.jit(lambda m, tok, c: model.apply(variables, m, tok, c, method="decode_step"))
  tokens_B = jnp.full((inputs.shape[0],), start_id, jnp.int32)
  for t in range(steps):
    logits_BV, cache = step(memory, tokens_B, cache)
    np.testing.assert_allclose(logits_BV, full_BTV[:, t], rtol=2e-5, atol=2e-5,
                               err_msg=f"position {t}")
    tokens_B = targets[:, t]
  assert int(cache["index"]) == steps


def check_causal_through_gradients(model, params, inputs, targets, model_dim, *, perturbs):
  """d logits[:, t] / d (decoder input vector at u) is zero exactly when u > t.

  ``perturbs(context, out)``: whether the intercepted call's output ``out`` is the
  decoder input the perturbation is added to.
  """
  steps = targets.shape[1]

  def logits_from_perturbation(delta_BTD):
    def add_delta(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      return out + delta_BTD if perturbs(context, out) else out
    with nn.intercept_methods(add_delta):
      return model.apply({"params": params}, inputs, targets)

  delta = jnp.zeros((targets.shape[0], steps, model_dim))
  for t in range(steps):
    grad_BTD = jax.grad(lambda d: logits_from_perturbation(d)[:, t].sum())(delta)
    norms_T = np.abs(np.asarray(grad_BTD)).sum(axis=(0, 2))
    assert np.all(norms_T[t + 1:] == 0), f"position {t} sees the future: {norms_T}"
    assert np.all(norms_T[:t + 1] > 0), f"position {t} ignores its past: {norms_T}"


def check_source_padding_changes_no_logit(model, params, inputs, targets, pad_id):
  """Four more pad tokens after every source row leave every logit as it was."""
  base = model.apply({"params": params}, inputs, targets)
  padded = jnp.pad(inputs, ((0, 0), (0, 4)), constant_values=pad_id)
  np.testing.assert_allclose(model.apply({"params": params}, padded, targets), base,
                             rtol=1e-5, atol=1e-5)
