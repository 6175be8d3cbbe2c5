"""Checkpoints that lose nothing: state, data-iterator state, tokenizer and config together.

A checkpoint is an orbax step directory with these items:

========== ============================================================================
item       content
========== ============================================================================
params     the model's parameters (restorable alone: ``training.restore.load_params``)
opt_state  the optimizer's state
data       the grain training iterator's position (``grain.checkpoint.CheckpointSave``)
config     ``ExperimentConfig.to_dict()``
tokenizer  ``{"sentencepiece_base64": ...}``: the run's vocabulary
meta       ``{"step", "model_kind", "metrics"}`` (``metrics`` holds ``bleu`` when evaluated)
========== ============================================================================

``Checkpointer`` keeps the latest ``keep`` steps and, beside them, the step with
the best validation BLEU (orbax's ``max_to_keep`` with ``best_fn`` would keep only
the best and delete the latest, losing steps on resume). Saves are asynchronous;
``wait_until_finished`` (called by ``close``) must run before the process exits.

Example:
  ``train`` saves through ``Checkpointer.save(state, config=config,
  tokenizer=tokenizer, data_iterator=iterator, metrics={"bleu": ...})``; this
  reads what it left in ``runs/tiny``, a run of the ``tiny_transformer`` preset:

  >>> checkpointer = Checkpointer("runs/tiny/checkpoints", keep=2)
  >>> checkpointer.latest_step(), checkpointer.load_config(40).model.model_dim
  (40, 32)
  >>> checkpointer.close()

Restoring the parameters alone, onto any mesh, builds the model and its shardings:
``seq2seq_jax.training.restore.load_params`` (``s2s.load_params``), which also averages
checkpoints.
"""

from __future__ import annotations

import base64
import os
import pathlib
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from seq2seq_jax.configs import ExperimentConfig
from seq2seq_jax.data.tokenizer import tokenizer_from_json as tokenizer_from_json
from seq2seq_jax.data.tokenizer import tokenizer_to_json as tokenizer_to_json
from seq2seq_jax.types import PyTree

_ITEMS = ("params", "opt_state", "data", "config", "tokenizer", "meta")


class CheckpointError(ValueError):
  """A checkpoint is missing, unreadable, or does not fit the model or config at hand."""


def item_handlers() -> dict[str, Any]:
  """orbax's handler of each item of a checkpoint (the module docstring's table)."""
  return {"params": ocp.StandardCheckpointHandler(), "opt_state": ocp.StandardCheckpointHandler(),
          "data": grain.checkpoint.CheckpointHandler(), "config": ocp.JsonCheckpointHandler(),
          "tokenizer": ocp.JsonCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}


def _bleu(metrics: Any) -> float:
  return float(metrics["bleu"])


def _path_str(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _shapes(tree: PyTree) -> dict[str, tuple[int, ...]]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {_path_str(path): tuple(leaf.shape) for path, leaf in leaves}


def check_params_match(saved: PyTree, expected: PyTree, where: str) -> None:
  """Raises ``CheckpointError`` naming the parameters that differ in name or shape.

  Args:
    saved: the checkpoint's parameter metadata (anything with ``.shape`` leaves).
    expected: the parameters (or their shapes) of the model at hand.
    where: the checkpoint's path, for the message.
  """
  saved_shapes, expected_shapes = _shapes(saved), _shapes(expected)
  if saved_shapes == expected_shapes:
    return
  missing = sorted(set(expected_shapes) - set(saved_shapes))
  extra = sorted(set(saved_shapes) - set(expected_shapes))
  reshaped = sorted(k for k in set(saved_shapes) & set(expected_shapes)
                    if saved_shapes[k] != expected_shapes[k])
  parts = []
  for label, names in (("missing from the checkpoint", missing), ("not in the model", extra)):
    if names:
      parts.append(f"{len(names)} {label} (e.g. {', '.join(names[:3])})")
  if reshaped:
    name = reshaped[0]
    parts.append(f"{len(reshaped)} with other shapes (e.g. {name}: checkpoint "
                 f"{saved_shapes[name]}, model {expected_shapes[name]})")
  raise CheckpointError(f"{where} holds parameters of another model architecture: "
                        f"{'; '.join(parts)}. Build the model from the checkpoint's own config "
                        "(load_params returns it) or train a new run in another workdir")


class Checkpointer:
  """Saves and restores training checkpoints in ``directory`` (see the module docstring).

  Args:
    directory: the checkpoints' folder (created if missing).
    keep: how many of the latest steps to keep; the best-BLEU step is kept beside them.
    async_save: write in a background thread (call ``wait_until_finished`` / ``close``).
  """

  def __init__(self, directory: str | os.PathLike, *, keep: int = 2, async_save: bool = True):
    if keep <= 0:
      raise ValueError(f"keep={keep} must be a positive number of checkpoints")
    self.directory = pathlib.Path(directory).expanduser().absolute()
    policy = checkpoint_managers.AnyPreservationPolicy([
        checkpoint_managers.LatestN(keep),
        # Ascending order by BLEU: the last one (the highest) is kept. Steps saved
        # without a BLEU are left to LatestN.
        checkpoint_managers.BestN(get_metric_fn=_bleu, reverse=False, n=1,
                                  keep_checkpoints_without_metrics=False)])
    options = ocp.CheckpointManagerOptions(preservation_policy=policy,
                                           enable_async_checkpointing=async_save, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_handlers=item_handlers())

  # ---- what is there -------------------------------------------------------------------------
  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def best_step(self) -> int | None:
    """The kept step with the highest validation BLEU, or None when none has one."""
    best, best_bleu = None, None
    for step in self.all_steps():
      bleu = self.load_meta(step).get("metrics", {}).get("bleu")
      if bleu is not None and (best_bleu is None or bleu > best_bleu):
        best, best_bleu = step, bleu
    return best

  def resolve_step(self, step: int | str | None) -> int:
    """``None`` / ``"latest"``, ``"best"`` or a number -> an existing step; raises if none."""
    if step in (None, "latest"):
      resolved = self.latest_step()
    elif step == "best":
      resolved = self.best_step()
      if resolved is None:
        raise CheckpointError(f"{self.directory}: no checkpoint has a validation BLEU; use "
                              "step='latest' or a step number")
    else:
      resolved = int(step)
      if resolved not in self.all_steps():
        raise CheckpointError(f"{self.directory}: no checkpoint at step {resolved}; kept steps: "
                              f"{self.all_steps()}")
    if resolved is None:
      raise CheckpointError(f"{self.directory}: no checkpoint found; train first or point to the "
                            "run's checkpoints folder")
    return resolved

  # ---- saving --------------------------------------------------------------------------------
  def save(self, state: Any, *, config: ExperimentConfig, tokenizer: Any = None,
           data_iterator: grain.DatasetIterator | None = None,
           metrics: dict[str, float] | None = None) -> bool:
    """Writes ``state`` (a ``TrainState``) at step ``state.step`` with everything to resume.

    Args:
      state: has ``step``, ``params`` and ``opt_state``.
      config: the run's config.
      tokenizer: the run's ``Tokenizer``, a pretrained checkpoint's tokenizer, or None.
      data_iterator: the training iterator, positioned at the next batch to train on.
      metrics: e.g. ``{"bleu": 21.3, "val_loss": 2.1}``; ``bleu`` ranks the best checkpoint.

    Returns:
      Whether a save started (False if this step is already saved).
    """
    step = int(jax.device_get(state.step))
    if step in self.all_steps():
      return False
    metrics = {k: float(v) for k, v in (metrics or {}).items()}
    items = {
        "params": ocp.args.StandardSave(state.params),
        "opt_state": ocp.args.StandardSave(state.opt_state),
        "config": ocp.args.JsonSave(config.to_dict()),
        "tokenizer": ocp.args.JsonSave(tokenizer_to_json(tokenizer)),
        "meta": ocp.args.JsonSave({"step": step, "model_kind": config.model_kind,
                                   "metrics": metrics}),
    }
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    return self._manager.save(step, args=ocp.args.Composite(**items),
                              metrics={"bleu": metrics["bleu"]} if "bleu" in metrics else None)

  # ---- restoring -----------------------------------------------------------------------------
  def _restore(self, step: int, **items) -> Any:
    return self._manager.restore(step, args=ocp.args.Composite(**items))

  def load_meta(self, step: int | str | None = None) -> dict[str, Any]:
    return dict(self._restore(self.resolve_step(step), meta=ocp.args.JsonRestore())["meta"])

  def load_config(self, step: int | str | None = None) -> ExperimentConfig:
    """The config saved with a checkpoint."""
    step = self.resolve_step(step)
    values = self._restore(step, config=ocp.args.JsonRestore())["config"]
    try:
      return ExperimentConfig.from_dict(values)
    except (TypeError, ValueError) as error:
      raise CheckpointError(f"{self.directory}/{step}/config: {error}") from None

  def load_tokenizer_json(self, step: int | str | None) -> dict[str, Any]:
    """The saved tokenizer item as it is stored (``{"sentencepiece_base64": ...}`` or a
    pretrained checkpoint's)."""
    return dict(self._restore(self.resolve_step(step),
                              tokenizer=ocp.args.JsonRestore())["tokenizer"])

  def load_tokenizer_bytes(self, step: int | str | None = None) -> bytes | None:
    """The serialized sentencepiece model of a run's own ``Tokenizer`` (``from_bytes``);
    None when the checkpoint holds none or a pretrained checkpoint's tokenizer."""
    encoded = self.load_tokenizer_json(step).get("sentencepiece_base64")
    return base64.b64decode(encoded) if encoded else None

  def load_tokenizer(self, step: int | str | None = None) -> Any:
    """The tokenizer saved with a checkpoint (the run's own or a pretrained one), or None."""
    return tokenizer_from_json(self.load_tokenizer_json(step))

  def check_params(self, abstract_params: PyTree, step: int | str | None = None) -> None:
    """Raises ``CheckpointError`` unless the saved parameters have these names and shapes."""
    step = self.resolve_step(step)
    saved = self._manager.item_metadata(step)["params"]
    saved = getattr(saved, "tree", saved)
    check_params_match(saved, abstract_params, f"{self.directory}/{step}")

  def restore(self, abstract_state: Any, *, step: int | str | None = None,
              data_iterator: grain.DatasetIterator | None = None) -> Any:
    """The ``TrainState`` of a checkpoint, placed as ``abstract_state``'s shardings say.

    Args:
      abstract_state: a ``TrainState`` of ``jax.ShapeDtypeStruct`` with shardings
        (``training.step.abstract_train_state``).
      step: ``None`` (latest), ``"best"`` or a number.
      data_iterator: restored in place to the saved position when given.

    Raises:
      CheckpointError: the checkpoint holds another architecture.
    """
    step = self.resolve_step(step)
    self.check_params(abstract_state.params, step)
    items = {"params": ocp.args.StandardRestore(abstract_state.params),
             "opt_state": ocp.args.StandardRestore(abstract_state.opt_state)}
    if data_iterator is not None:
      if not (self.directory / str(step) / "data").exists():
        raise CheckpointError(f"{self.directory}/{step} has no data-iterator state; it cannot "
                              "resume training exactly (was it written by average_checkpoints?)")
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    restored = self._restore(step, **items)
    step_array = jax.device_put(np.asarray(step, np.int32), abstract_state.step.sharding)
    return abstract_state.replace(step=step_array, params=restored["params"],
                                  opt_state=restored["opt_state"])

  def restore_params(self, abstract_params: PyTree, *, step: int | str | None = None) -> PyTree:
    """Only the parameters, e.g. for translation or evaluation."""
    step = self.resolve_step(step)
    self.check_params(abstract_params, step)
    return self._restore(step, params=ocp.args.StandardRestore(abstract_params))["params"]

  def wait_until_finished(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Finishes pending saves and releases the manager."""
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
