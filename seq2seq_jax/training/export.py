"""The training step serialized with ``jax.export`` for accelerators this machine lacks.

``export_train_step`` lowers the jitted, donating train step of ``make_train_step``
with the state's and the batch's ``NamedSharding``s on a device mesh, for the
platforms asked for (``"tpu"``, ``"cuda"`` ...), on any machine: the check that the
training program, FSDP and tensor-parallel shardings included, lowers for an
accelerator before a run starts on one. The step takes and returns the state as a
flat list of arrays (optax's state classes have no ``jax.export`` serialization);
``flat_train_state`` gives that list.

Example:
  >>> from seq2seq_jax.configs import TransformerConfig
  >>> model_config = TransformerConfig(vocab_size=64, model_dim=16, num_heads=2, mlp_dim=32,
  ...                                  num_encoder_layers=1, num_decoder_layers=1)
  >>> exported = export_train_step(model_config, TrainConfig(parameter_sharding="fsdp"),
  ...                              batch_rows=8, source_len=12, target_len=12,
  ...                              platforms=("tpu", "cuda"))
  >>> exported.platforms, exported.nr_devices == jax.device_count()
  (('tpu', 'cuda'), True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from seq2seq_jax.configs import TrainConfig
from seq2seq_jax.training import sharding as sharding_lib
from seq2seq_jax.training import step as step_lib


def flat_train_state(state: Any) -> list[jax.Array]:
  """The state's arrays in the order the exported step takes and returns them."""
  return jax.tree.leaves(state)


def export_train_step(model_config: Any, train_config: TrainConfig = TrainConfig(), *,
                      batch_rows: int, source_len: int, target_len: int,
                      platforms: Sequence[str], mesh: Mesh | None = None
                      ) -> jax.export.Exported:
  """``make_train_step``'s program for a ``[batch_rows, source_len / target_len]`` batch.

  Args:
    model_config: a ``TransformerConfig`` or ``RNNConfig``.
    train_config: optimizer, schedule, label smoothing, gradient accumulation and the
      parameter placement (``parameter_sharding``, ``model_parallelism``).
    batch_rows, source_len, target_len: the global batch shape.
    platforms: ``jax.export`` platforms, e.g. ``("tpu", "cuda")``.
    mesh: default ``make_mesh(train_config.model_parallelism)`` over every device here;
      the exported program runs on a mesh of as many devices.

  Returns:
    A ``jax.export.Exported`` of ``(state_leaves, batch, key_data) -> (state_leaves,
    metrics)``; ``batch`` is ``{"inputs", "targets"}`` int32 split over ``data``,
    ``key_data`` the raw data of the run's dropout key.
  """
  mesh = mesh or sharding_lib.make_mesh(train_config.model_parallelism)
  sharding_lib.check_model_parallelism(model_config, mesh.shape[sharding_lib.MODEL_AXIS])
  dtype = None if train_config.compute_dtype == "float32" else train_config.compute_dtype
  model = step_lib.build_model(model_config, compute_dtype=dtype)
  state, train_step = step_lib.abstract_train_program(model, train_config, mesh=mesh)
  leaves, treedef = jax.tree.flatten(state)
  key_data = jax.random.key_data(jax.random.key(0))
  replicated = NamedSharding(mesh, P())
  rows = step_lib.batch_sharding(mesh)

  def flat_step(leaves, batch, key_data):
    new_state, metrics = train_step(jax.tree.unflatten(treedef, leaves), batch,
                                    jax.random.wrap_key_data(key_data))
    return jax.tree.leaves(new_state), metrics

  leaf_shardings = [leaf.sharding for leaf in leaves]
  program = jax.jit(flat_step, in_shardings=(leaf_shardings, rows, replicated),
                    out_shardings=(leaf_shardings, replicated), donate_argnums=0)
  batch = {name: jax.ShapeDtypeStruct((batch_rows, length), jnp.int32, sharding=rows)
           for name, length in (("inputs", source_len), ("targets", target_len))}
  key = jax.ShapeDtypeStruct(key_data.shape, key_data.dtype, sharding=replicated)
  return jax.export.export(program, platforms=tuple(platforms))(leaves, batch, key)
