"""Parameters exchanged through orbax with a project that knows nothing of this library's
checkpoint code: each side saves with its own tools and the other restores into an abstract
tree (shapes, dtypes, shardings) that it built itself."""

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import seq2seq_jax as s2s
from seq2seq_jax.training import make_optimizer, rsqrt_schedule
from seq2seq_jax.training.step import create_train_state

CONFIG = s2s.TransformerConfig(vocab_size=19, model_dim=16, num_heads=2, mlp_dim=24,
                               num_encoder_layers=1, num_decoder_layers=2, max_len=64)
INPUTS = jnp.array([[5, 6, 7, 2], [8, 9, 2, 0]], jnp.int32)
DECODE = s2s.DecodeConfig(method="beam", beam_size=2, max_decode_len=8)


def _assert_same_tree(restored, expected):
  assert jax.tree.structure(restored) == jax.tree.structure(expected)
  jax.tree.map(np.testing.assert_array_equal, restored, expected)


def test_a_run_saved_by_the_library_restores_in_a_plain_orbax_nnx_project(tmp_path):
  # This library's side: a checkpoint as the trainer writes it (Checkpointer.save).
  mesh = s2s.make_mesh()
  optimizer = make_optimizer(s2s.TrainConfig(), rsqrt_schedule(1e-3, 10))
  state = create_train_state(s2s.Transformer(CONFIG), optimizer, rng=jax.random.key(3),
                             mesh=mesh)
  config = s2s.ExperimentConfig(model=CONFIG, data=s2s.DataConfig(vocab_size=19))
  with s2s.Checkpointer(tmp_path / "checkpoints", async_save=False) as checkpointer:
    checkpointer.save(state, config=config)
    step = checkpointer.latest_step()

  # The other project: an NNX model built by the bridge; it asks orbax for the "params"
  # item of the step folder, into the abstract tree of its own parameters.
  model = nnx.bridge.ToNNX(s2s.Transformer(CONFIG), rngs=nnx.Rngs(0)).lazy_init(INPUTS, INPUTS)
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                          nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  restored = ocp.StandardCheckpointer().restore(tmp_path / "checkpoints" / str(step) / "params",
                                                abstract)
  _assert_same_tree(restored, jax.device_get(state.params))
  state_nnx = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state_nnx, restored)
  nnx.update(model, state_nnx)
  np.testing.assert_allclose(model(INPUTS, INPUTS), s2s.Transformer(CONFIG).apply(
      {"params": state.params}, INPUTS, INPUTS), rtol=1e-6)


def test_parameters_saved_by_another_project_restore_into_the_library_model(tmp_path):
  # The other project: trains its own way (here: one optax step on NNX state) and saves a
  # plain dict of arrays with orbax.
  model = nnx.bridge.ToNNX(s2s.Transformer(CONFIG), rngs=nnx.Rngs(7)).lazy_init(INPUTS, INPUTS)
  nnx_optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  grads = nnx.grad(lambda m: m(INPUTS, INPUTS).mean())(model)
  nnx_optimizer.update(model, grads)
  saved = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "their_params", saved)

  # This library's side: the abstract tree from its own model, with a sharding per leaf.
  library_model = s2s.Transformer(CONFIG)
  shapes = jax.eval_shape(lambda: library_model.init(jax.random.key(0), INPUTS, INPUTS))["params"]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                          shapes)
  params = ocp.StandardCheckpointer().restore(tmp_path / "their_params", abstract)
  _assert_same_tree(params, saved)
  tokens, scores = s2s.generate(library_model, params, INPUTS, DECODE)
  expected_tokens, expected_scores = s2s.generate(library_model, saved, INPUTS, DECODE)
  np.testing.assert_array_equal(tokens, expected_tokens)
  np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)


_REFUSED_RESTORE = """
import dataclasses, sys
import jax, jax.numpy as jnp
import orbax.checkpoint as ocp
import seq2seq_jax as s2s
config = s2s.TransformerConfig(**{config!r})
inputs = jnp.array({inputs!r}, jnp.int32)
wider = s2s.Transformer(dataclasses.replace(config, model_dim=32))
abstract = jax.eval_shape(lambda: wider.init(jax.random.key(0), inputs, inputs))["params"]
try:
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.restore({path!r}, abstract)
except ValueError as error:
  print("refused:", error)
  sys.exit(0)
print("restored a checkpoint of other shapes")
sys.exit(1)
"""


def test_a_mismatched_abstract_tree_is_refused(tmp_path):
  """The exchange fails loudly, not silently, when the two sides disagree on a shape.

  The refused restore runs in its own process: orbax restores each array in a task of
  its own, and after the refusal the remaining tasks fail on a closed event loop at
  some later moment, which pytest would report in whichever test runs then.
  """
  params = s2s.Transformer(CONFIG).init(jax.random.key(0), INPUTS, INPUTS)["params"]
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "params", params)
  fields = {f.name: getattr(CONFIG, f.name) for f in dataclasses.fields(CONFIG)
            if getattr(CONFIG, f.name) != f.default}
  script = _REFUSED_RESTORE.format(config=fields, inputs=np.asarray(INPUTS).tolist(),
                                   path=str(tmp_path / "params"))
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stdout + result.stderr
  assert "not compatible with the stored shape" in result.stdout
