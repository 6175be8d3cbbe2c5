"""What a training run left, read back: its parameters onto any mesh, and averages of them.

``seq2seq_jax.checkpoints`` stores and restores whole runs (the ``Checkpointer``);
restoring the parameters alone needs the model's shapes and shardings, which training
defines, so it lives here. ``load_params`` serves programs that only run the model (the
``Translator``, evaluation); ``average_checkpoints`` writes the mean of the latest N.

Example:
  ``train`` wrote ``runs/tiny``, a run of the ``tiny_transformer`` preset:

  >>> params, config = load_params("runs/tiny/checkpoints", step="best")
  >>> params["source_embedding"]["embedding"].shape  # [V, D]
  (500, 32)
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from seq2seq_jax.checkpoints import CheckpointError, Checkpointer, item_handlers
from seq2seq_jax.configs import ExperimentConfig
from seq2seq_jax.training import sharding as sharding_lib
from seq2seq_jax.training.step import build_model, init_params
from seq2seq_jax.types import PyTree


def _abstract_params(model_config, mesh=None, parameter_sharding: str = "replicated") -> PyTree:
  """The parameters' shapes with their target shardings: on ``mesh`` by
  ``parameter_sharding`` (see ``training.sharding``), else on the first device."""
  model = build_model(model_config)
  shapes = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  if mesh is None:
    single = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = jax.tree.map(lambda _: single, shapes)
  else:
    shardings = sharding_lib.tree_shardings(shapes, mesh, parameter_sharding)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                      shardings)


def load_params(directory: str | os.PathLike, *, step: int | str | None = "latest",
                model_config: Any = None, mesh: jax.sharding.Mesh | None = None,
                parameter_sharding: str = "replicated") -> tuple[PyTree, ExperimentConfig]:
  """Parameters and config of a checkpoint, for programs that only run the model.

  Args:
    directory: a run's checkpoints folder (``WORKDIR/checkpoints``).
    step: ``"latest"``, ``"best"`` (highest validation BLEU) or a step number.
    model_config: when given, the model the caller will run; a checkpoint of
      another architecture raises ``CheckpointError`` naming the difference.
      Default: the checkpoint's own ``config.model``.
    mesh: restore onto this mesh (``training.sharding.make_mesh``), whatever
      device count or mesh wrote the checkpoint; default: the first device.
    parameter_sharding: with ``mesh``: ``"replicated"`` or ``"fsdp"``.

  Returns:
    ``(params, config)``: parameters placed as asked, and the saved config.

  Example:
    >>> import jax.numpy as jnp
    >>> from seq2seq_jax import build_model
    >>> params, config = load_params("runs/tiny/checkpoints", step="best")
    >>> model = build_model(config.model)
    >>> inputs = jnp.array([[5, 6, 2]])
    >>> model.apply({"params": params}, inputs, inputs).shape  # [B, T, V]
    (1, 3, 500)
  """
  with Checkpointer(directory, keep=1, async_save=False) as checkpointer:
    step = checkpointer.resolve_step(step)
    config = checkpointer.load_config(step)
    if model_config is not None and type(model_config) is not type(config.model):
      raise CheckpointError(
          f"{checkpointer.directory}/{step} holds a {type(config.model).__name__} model "
          f"({config.model_kind}), not a {type(model_config).__name__}: build the model from the "
          "checkpoint's config")
    abstract = _abstract_params(model_config or config.model, mesh, parameter_sharding)
    params = checkpointer.restore_params(abstract, step=step)
  return params, config


def average_checkpoints(directory: str | os.PathLike, output_directory: str | os.PathLike, *,
                        num_last: int) -> int:
  """Averages the parameters of the latest ``num_last`` checkpoints into a new checkpoint.

  The result, in ``output_directory`` at the latest step, holds the averaged params
  (float32 mean), the config and tokenizer of the latest checkpoint and the
  averaged steps in ``meta["averaged_steps"]``; no optimizer or data state, so it
  serves ``load_params`` and evaluation, not resuming.

  Returns:
    The step number the average was written under.
  """
  with Checkpointer(directory, keep=1, async_save=False) as source:
    steps = source.all_steps()
    if num_last <= 0 or num_last > len(steps):
      raise ValueError(f"num_last={num_last} must be in [1, {len(steps)}]: {source.directory} "
                       f"keeps steps {steps}")
    chosen = steps[-num_last:]
    config = source.load_config(chosen[-1])
    tokenizer = source.load_tokenizer_json(chosen[-1])
    abstract = _abstract_params(config.model)
    total = None
    for step in chosen:
      params = source.restore_params(abstract, step=step)
      params = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
      total = params if total is None else jax.tree.map(np.add, total, params)
  average = jax.tree.map(lambda x: (x / len(chosen)).astype(np.float32), total)
  output = pathlib.Path(output_directory).expanduser().absolute()
  manager = ocp.CheckpointManager(output, options=ocp.CheckpointManagerOptions(
      enable_async_checkpointing=False, create=True), item_handlers=item_handlers())
  manager.save(chosen[-1], args=ocp.args.Composite(
      params=ocp.args.StandardSave(average),
      config=ocp.args.JsonSave(config.to_dict()),
      tokenizer=ocp.args.JsonSave(tokenizer),
      meta=ocp.args.JsonSave({"step": chosen[-1], "model_kind": config.model_kind, "metrics": {},
                              "averaged_steps": chosen})), force=True)
  manager.wait_until_finished()
  manager.close()
  return chosen[-1]
