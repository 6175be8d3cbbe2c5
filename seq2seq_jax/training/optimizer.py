"""AdamW with a weight-decay mask and global-norm clipping.

Gradient accumulation is not an optimizer wrapper here: ``train_step`` scans
over microbatches and sums token-weighted gradients, so one call is one update
and the result equals the update of the whole batch.
"""

from __future__ import annotations

import jax
import optax

from seq2seq_jax.configs import TrainConfig
from seq2seq_jax.types import PyTree

# Leaves never decayed, by name: biases, LayerNorm scales, token and position tables.
_NO_DECAY_NAMES = ("bias", "scale", "embedding", "position_embedding")


def _leaf_name(path) -> str:
  key = path[-1]
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  return str(key)


def decay_mask(params: PyTree) -> PyTree:
  """True for the leaves that weight decay applies to: the kernels of dense layers.

  Biases, LayerNorm scales and embedding tables (token and learned position) are
  excluded, and so is any other leaf with fewer than two dimensions.

  Example:
    >>> import jax.numpy as jnp
    >>> decay_mask({"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)}})
    {'dense': {'bias': False, 'kernel': True}}
  """
  def decays(path, leaf) -> bool:
    name = _leaf_name(path)
    return name not in _NO_DECAY_NAMES and "embed" not in name and leaf.ndim >= 2

  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(config: TrainConfig, schedule: optax.Schedule) -> optax.GradientTransformation:
  """Global-norm clipping (unless ``clip_norm == 0``), then AdamW masked by ``decay_mask``.

  Args:
    config: ``adam_b1``, ``adam_b2``, ``adam_eps``, ``weight_decay``, ``clip_norm``.
    schedule: the learning rate as a function of the update count.
  """
  adamw = optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
                      weight_decay=config.weight_decay, mask=decay_mask)
  if config.clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(config.clip_norm), adamw)
  return adamw
