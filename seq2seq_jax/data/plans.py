"""What packing's and the bucket plans share: the shapes of batches, and the epoch plan.

``bucket_rows`` gives the global rows of a training batch of a length: the token
budget's share, a multiple of ``batch_multiple`` (packed rows are of the largest
bucket length); ``bucket_index`` the bucket a pair of a length goes to.
``EpochPlan`` maps a batch number to a plan item, epoch by epoch, each epoch planned
from ``(seed, epoch)`` alone: ``packing.PackedBatchPlan`` (packed rows) and
``batches.TrainBatchPlan`` (bucketed rows) say which pairs make up each batch of an
epoch; the base turns a batch number into an epoch and a position, plans an epoch
when a batch of it is first asked for, and keeps the latest epoch's plan. It is a
grain ``MapDataset``, so the iterators map a batch builder over it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import grain
import numpy as np

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data.text_files import DataError


def bucket_rows(data_config: DataConfig, length: int) -> int:
  """Global rows of a training batch of bucket ``length``: a multiple of batch_multiple."""
  rows = data_config.batch_tokens // length // data_config.batch_multiple * data_config.batch_multiple
  if rows <= 0:
    raise ValueError(f"DataConfig.batch_tokens={data_config.batch_tokens} cannot hold "
                     f"batch_multiple={data_config.batch_multiple} rows of length {length}: raise "
                     f"batch_tokens to at least {data_config.batch_multiple * length}")
  return rows


def bucket_index(data_config: DataConfig, length_N: np.ndarray) -> np.ndarray:
  """Index into bucket_lengths of the smallest bucket >= each length."""
  index_N = np.searchsorted(np.asarray(data_config.bucket_lengths), length_N, side="left")
  assert (index_N < len(data_config.bucket_lengths)).all(), "lengths are clipped before bucketing"
  return index_N


class EpochPlan(grain.MapDataset):
  """Batch number -> plan item, epoch by epoch: each epoch planned from ``(seed, epoch)`` alone
  (``plan_epoch``), the latest epoch's plan kept. Subclasses set ``batches_per_epoch``."""

  batches_per_epoch: int

  def __init__(self, *, seed: int, num_epochs: int | None):
    super().__init__()
    self._seed = seed
    self._num_epochs = num_epochs
    self._cache: tuple[int, Any] | None = None
    self._lock = threading.Lock()

  def _check_not_empty(self) -> None:
    if not self.batches_per_epoch:
      raise DataError("no training pair is left after filtering: raise DataConfig.max_source_len "
                      "/ max_target_len or set too_long='truncate'")

  def __len__(self) -> int:
    if self._num_epochs is None:
      return sys.maxsize
    return self._num_epochs * self.batches_per_epoch

  def __str__(self) -> str:
    return (f"{type(self).__name__}(batches_per_epoch={self.batches_per_epoch}, "
            f"seed={self._seed})")

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_lock"] = None
    state["_cache"] = None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def plan_epoch(self, epoch: int) -> Any:
    raise NotImplementedError

  def item(self, plan: Any, position: int):
    """Batch ``position`` of an epoch's ``plan``."""
    return plan[position]

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    if index < 0 or index >= len(self):
      raise IndexError(f"batch {index} is outside [0, {len(self)})")
    epoch, position = divmod(index, self.batches_per_epoch)
    with self._lock:
      if self._cache is None or self._cache[0] != epoch:
        self._cache = (epoch, self.plan_epoch(epoch))
      plan = self._cache[1]
    return self.item(plan, position)
