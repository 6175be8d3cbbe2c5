"""The host training loop: data in, steps, progress, validation, checkpoints, clean stops.

``train(config, workdir)`` trains the model of an ``ExperimentConfig`` and leaves
in ``workdir``:

- ``config.json``: the resolved config (``ExperimentConfig.to_dict``);
- ``run_info.json``: seed, package versions, git commit, devices, one entry per session;
- ``tokenizer.model``: the run's sentencepiece vocabulary;
- ``metrics.jsonl``: one JSON object per logged step: ``step`` (updates done,
  1-based), ``loss`` (mean of the per-step losses since the previous line),
  ``log_every`` (how many steps that mean covers), ``learning_rate``,
  ``steps_per_sec``, ``tokens_per_sec`` (target tokens), ``grad_norm``,
  ``accuracy``; at validation steps also ``val_loss``, ``val_ppl``, ``bleu``,
  ``bleu_signature``;
- ``checkpoints/``: see ``seq2seq_jax.checkpoints``.

Faults: Ctrl-C (SIGINT) finishes the current step, saves and returns
(``TrainResult.interrupted``); rerunning the same call resumes from the latest
checkpoint, data position included, and says so; a different config is refused
(``ConfigMismatchError``) unless ``restart=True``, except for the settings that
change neither a batch nor an update (``RESUMABLE_FIELDS``: a preempted run may
come back with another ``data.num_workers``); after ``kill -9`` a rerun loses
only the steps since the last checkpoint; a non-finite loss raises
``NonFiniteLossError`` naming the step, and the last good checkpoint stays. The
data iterator (and its worker processes) ends with the call, on success or error.

Example:
  >>> from seq2seq_jax import presets
  >>> config = presets.apply_overrides(presets.get_preset("tiny_transformer"),
  ...                                  ["data.manual_dir=../shared/data/multi30k_tiny"])
  >>> result = train(config, "runs/first", progress=False)  # 40 steps of a tiny model
  Downloading and preparing dataset ...
  >>> result.step, result.metrics["loss"] < 6.0, result.interrupted
  (40, True, False)
  >>> train(config, "runs/first", progress=False).step  # a rerun resumes: nothing left to do
  40
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import jax
import numpy as np

from seq2seq_jax import allocator
from seq2seq_jax import checkpoints as checkpoints_lib
from seq2seq_jax.configs import ExperimentConfig
from seq2seq_jax.training import optimizer as optimizer_lib
from seq2seq_jax.training import schedules
from seq2seq_jax.training import sharding as sharding_lib
from seq2seq_jax.training import step as step_lib
from seq2seq_jax.training import validation
from seq2seq_jax.types import BOS_ID, EOS_ID, PAD_ID

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "tensorflow-datasets",
             "sentencepiece", "sacrebleu", "numpy")

# step_hook(step, state) -> state or None: runs before update number ``step`` (1-based).
StepHook = Callable[[int, step_lib.TrainState], "step_lib.TrainState | None"]


# Fields a resumed run may change: how batches are built (batch i is the same with any number of
# workers) and how often the run logs and saves; none changes a batch, an update or a metric.
RESUMABLE_FIELDS = frozenset({"data.num_workers", "train.log_every", "train.checkpoint_every",
                              "train.keep_checkpoints"})


class ConfigMismatchError(ValueError):
  """The workdir holds a run with another config."""


class NonFiniteLossError(FloatingPointError):
  """The training loss became NaN or infinite."""


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """What ``train`` did.

  Attributes:
    step: updates done (the state's step at return).
    interrupted: stopped by SIGINT before ``num_steps`` (a checkpoint was saved).
    resumed_from: the checkpoint step this session started from, or None.
    metrics: the last logged training metrics and the last validation metrics.
    best_bleu: the highest validation BLEU of the run so far, or None.
    best_step: its checkpoint step.
    workdir: where everything is.
  """

  step: int
  interrupted: bool
  resumed_from: int | None
  metrics: dict[str, Any]
  best_bleu: float | None
  best_step: int | None
  workdir: str


def _changed_fields(saved: ExperimentConfig, current: ExperimentConfig) -> dict[str, str]:
  """``"section.field"`` -> ``"section.field: saved X, now Y"`` for every field that differs."""
  def flat(config):
    return {f"{section}.{key}": value for section, values in config.to_dict().items()
            for key, value in values.items()}
  old, new = flat(saved), flat(current)
  return {key: f"{key}: saved {old.get(key, '<absent>')!r}, now {new.get(key, '<absent>')!r}"
          for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)}


def config_diff(saved: ExperimentConfig, current: ExperimentConfig) -> list[str]:
  """``"section.field: saved X, now Y"`` for every field that differs."""
  return list(_changed_fields(saved, current).values())


def _git_commit() -> dict[str, Any] | None:
  root = pathlib.Path(__file__).resolve().parents[2]
  try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                            timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return {"commit": commit, "dirty": bool(dirty)}


def _versions() -> dict[str, str | None]:
  versions: dict[str, str | None] = {"python": platform.python_version()}
  for name in _PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  return versions


def _is_writer() -> bool:
  """Process 0 writes the run's files; the others only write their checkpoint shards."""
  return jax.process_index() == 0


def _barrier(name: str) -> None:
  sharding_lib.sync_processes(name)


def _write_json(path: pathlib.Path, value: Any) -> None:
  partial = path.with_name(path.name + ".partial")
  partial.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
  partial.replace(path)


def _record_session(workdir: pathlib.Path, config: ExperimentConfig, resumed_from: int | None,
                    mesh) -> None:
  _write_json(workdir / "config.json", config.to_dict())
  path = workdir / "run_info.json"
  info = json.loads(path.read_text()) if path.exists() else {"sessions": []}
  info["seed"] = config.train.seed
  info["sessions"].append({
      "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "resumed_from": resumed_from, "versions": _versions(), "git": _git_commit(),
      "argv": sys.argv, "devices": [str(d) for d in jax.devices()],
      "process_count": jax.process_count(), "mesh": dict(mesh.shape)})
  _write_json(path, info)


def _trim_metrics(path: pathlib.Path, last_step: int) -> None:
  """Drops lines logged after ``last_step`` (by a run killed after its last checkpoint)."""
  if not path.exists():
    return
  kept = [line for line in path.read_text().splitlines()
          if line.strip() and json.loads(line)["step"] <= last_step]
  path.write_text("".join(line + "\n" for line in kept))


def _set_aside(workdir: pathlib.Path) -> None:
  """``restart=True``: moves the old run's files aside instead of deleting them."""
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  old = workdir / f"replaced-{stamp}"
  for name in ("checkpoints", "metrics.jsonl", "config.json", "run_info.json", "tokenizer.model"):
    if (workdir / name).exists():
      old.mkdir(exist_ok=True)
      shutil.move(str(workdir / name), str(old / name))
  if old.exists():
    print(f"restart: the previous run's files were moved to {old}", flush=True)


class _Interrupt:
  """Turns the first SIGINT into a flag checked between steps; a second one stops at once."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def _handle(self, signum, frame):
    del frame
    self.requested = True
    print(f"\nsignal {signum}: saving a checkpoint after this step (Ctrl-C again to abort)",
          file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGINT, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGINT, self._previous)


def _format_eta(seconds: float) -> str:
  seconds = int(seconds)
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _compile_in_step(train_step, compiled_shapes: set, state, batch, rng) -> None:
  """Multi-process: compiles the step for a new batch shape, then waits for every host.

  Hosts compile at different speeds; a host that runs the step's first
  collective long before the others would time out (gloo on CPUs, after 30 s).
  The jitted step reuses the program compiled here.
  """
  shapes = tuple(sorted((key, value.shape) for key, value in batch.items()))
  if shapes not in compiled_shapes:
    train_step.lower(state, batch, rng).compile()
    _barrier(f"train step compiled for {shapes}")
    compiled_shapes.add(shapes)


def _load_tokenizer(config: ExperimentConfig, workdir: pathlib.Path,
                    checkpointer: checkpoints_lib.Checkpointer, resume_step: int | None,
                    tokenizer):
  from seq2seq_jax.data import tokenizer as tokenizer_lib
  path = workdir / "tokenizer.model"
  if resume_step is not None:
    tokenizer = checkpointer.load_tokenizer(resume_step) or tokenizer
  vocab_size = getattr(config.model, "output_vocab_size", config.model.vocab_size)
  if not isinstance(tokenizer, (tokenizer_lib.Tokenizer, type(None))):
    # A pretrained checkpoint's tokenizer: it lives in the checkpoints, not in a file.
    if tokenizer.vocab_size > vocab_size:
      raise ValueError(f"the tokenizer has {tokenizer.vocab_size} target ids but the model's "
                       f"vocabulary has {vocab_size}")
    return tokenizer
  if tokenizer is None:
    # Process 0 trains (or loads) and saves it; the others then load that file.
    if _is_writer():
      tokenizer = tokenizer_lib.load_or_train_tokenizer(config.data, path)
    _barrier("seq2seq_jax: tokenizer saved")
    if tokenizer is None:
      tokenizer = tokenizer_lib.load_or_train_tokenizer(config.data, path)
  if not path.exists() and _is_writer():
    tokenizer.save(path)
  if tokenizer.vocab_size > vocab_size:
    raise ValueError(f"the tokenizer has {tokenizer.vocab_size} pieces but model.vocab_size="
                     f"{vocab_size}: set model.vocab_size to {tokenizer.vocab_size}")
  # The run's own vocabulary has PAD 0, BOS 1, EOS 2; a model built with other ids (T5Config's
  # defaults are T5's 0 / 0 / 1) would learn to end outputs with a piece.
  if (config.model.pad_id, config.model.eos_id) != (PAD_ID, EOS_ID):
    raise ValueError(f"model.pad_id={config.model.pad_id}, model.eos_id={config.model.eos_id}: "
                     f"the run's own sentencepiece vocabulary has PAD {PAD_ID} and EOS {EOS_ID}; "
                     f"set model.pad_id={PAD_ID}, model.eos_id={EOS_ID} (and "
                     f"model.decoder_start_id={BOS_ID})")
  return tokenizer


def _pretrained_start(config: ExperimentConfig):
  """The checkpoint ``config.train.init_from`` names, checked against ``config.model``."""
  from seq2seq_jax import pretrained  # pylint: disable=import-outside-toplevel
  checkpoint = pretrained.load(config.train.init_from)
  free = ("dropout_rate", "attention_dropout_rate", "activation_dropout_rate", "dtype",
          "attention_impl")
  if type(checkpoint.config) is not type(config.model):
    raise ValueError(f"TrainConfig.init_from={config.train.init_from!r} holds a "
                     f"{type(checkpoint.config).__name__}, but config.model is a "
                     f"{type(config.model).__name__}; build the run with "
                     "seq2seq_jax.pretrained.experiment_config (the CLI's --init-from does)")
  own = {field.name for field in dataclasses.fields(checkpoint.config)}
  theirs = dataclasses.replace(checkpoint.config, **{f: getattr(config.model, f)
                                                    for f in free if f in own})
  if theirs != config.model:
    differences = config_diff(dataclasses.replace(config, model=theirs), config)
    raise ValueError(f"TrainConfig.init_from={config.train.init_from!r}: config.model differs "
                     f"from the checkpoint's ({'; '.join(differences)}); build it with "
                     "seq2seq_jax.pretrained.experiment_config (the CLI's --init-from does)")
  return checkpoint


def _set_up_workdir(workdir: str | os.PathLike, *, restart: bool,
                    log: Callable[..., None]) -> pathlib.Path:
  """The run's folder, made ready on every host (the old run set aside if ``restart``)."""
  workdir = pathlib.Path(workdir).expanduser().absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  if jax.default_backend() == "cpu" and allocator.should_reexec():
    setting = " ".join(f"{k}={v}" for k, v in allocator.TUNED_MALLOC_ENV.items())
    log("note: glibc's default malloc faults XLA's scratch memory in page by page at every "
        f"step; starting Python with {setting} makes CPU steps faster (seq2seq_jax.allocator; "
        "`seq2seq-jax train` does it)")
  if restart and _is_writer():
    _set_aside(workdir)
  _barrier("seq2seq_jax: workdir ready")
  return workdir


def _refuse_another_run(config: ExperimentConfig, workdir: pathlib.Path,
                        checkpointer: checkpoints_lib.Checkpointer, resume_step: int | None,
                        log: Callable[..., None]) -> None:
  """Raises ``ConfigMismatchError`` if the checkpoint to resume holds another config; a change
  of ``RESUMABLE_FIELDS`` alone is logged and allowed."""
  if resume_step is None:
    return
  changed = _changed_fields(checkpointer.load_config(resume_step), config)
  allowed = [line for key, line in changed.items() if key in RESUMABLE_FIELDS]
  refused = [line for key, line in changed.items() if key not in RESUMABLE_FIELDS]
  if refused:
    raise ConfigMismatchError(
        f"{workdir} holds a run (checkpoint step {resume_step}) with another config:\n  "
        + "\n  ".join(refused)
        + "\nRerun with the saved config (workdir/config.json) to resume, pass restart=True "
        "(--restart) to start over in this workdir, or use another workdir")
  if allowed:
    log(f"Resuming with {'; '.join(allowed)} (the batches and updates stay the same)")


_WINDOW_KEYS = ("loss", "nll", "accuracy", "grad_norm")


class _Window:
  """The steps since the last metrics line: the next line reports their means and speed."""

  def __init__(self, first_step: int):
    self.first_step = first_step
    self.start = time.perf_counter()
    self.values: dict[str, list[float]] = {key: [] for key in _WINDOW_KEYS}
    self.tokens = 0.0

  def add(self, metrics: dict[str, Any]) -> None:
    for key in _WINDOW_KEYS:
      self.values[key].append(float(metrics[key]))
    self.tokens += float(metrics["tokens"])

  def means(self, step: int, learning_rate: float) -> dict[str, Any]:
    """The ``metrics.jsonl`` fields of a training line, in their order, up to ``step``."""
    elapsed = max(time.perf_counter() - self.start, 1e-9)
    count = step - self.first_step
    mean = {key: float(np.mean(values)) for key, values in self.values.items()}
    return {"step": step, "loss": mean["loss"], "log_every": count, "nll": mean["nll"],
            "accuracy": mean["accuracy"], "grad_norm": mean["grad_norm"],
            "learning_rate": learning_rate, "steps_per_sec": count / elapsed,
            "tokens_per_sec": self.tokens / elapsed}


class _Run:
  """One session of ``train``: set-up (the constructor), restore, then step, evaluate, save.

  ``train`` calls them in that order and decides when to log, evaluate and save;
  the run holds what set-up built, the state, and the progress since the last line.
  """

  state: step_lib.TrainState  # from ``restore``, then from every ``take_step``
  step: int  # updates done, ``state.step`` on the host
  metrics_file: TextIO  # ``metrics.jsonl`` (process 0) or the null device, open after restore
  last_train: dict[str, Any]  # the last training line
  last_eval: dict[str, Any]  # the last validation metrics

  def __init__(self, config: ExperimentConfig, workdir: pathlib.Path,
               checkpointer: checkpoints_lib.Checkpointer, *, tokenizer,
               state_sharding_fn: step_lib.StateShardingFn | None, log: Callable[..., None]):
    """Set-up: checks the workdir's run, loads the tokenizer, builds the model and the data."""
    from seq2seq_jax.data import iterators  # the data stack loads tfds; import when training
    train_config = config.train
    self.config, self.workdir, self.checkpointer, self.log = config, workdir, checkpointer, log
    self.resume_step = checkpointer.latest_step()
    _refuse_another_run(config, workdir, checkpointer, self.resume_step, log)
    self._pretrained = None
    if train_config.init_from and self.resume_step is None:
      self._pretrained = _pretrained_start(config)
      tokenizer = tokenizer or self._pretrained.tokenizer
    tokenizer = _load_tokenizer(config, workdir, checkpointer, self.resume_step, tokenizer)
    self.tokenizer = tokenizer

    sharding_lib.check_model_parallelism(config.model, train_config.model_parallelism)
    self.mesh = sharding_lib.make_mesh(train_config.model_parallelism)
    if state_sharding_fn is None:
      state_sharding_fn = sharding_lib.state_sharding_fn(train_config.parameter_sharding)
    self._state_sharding_fn = state_sharding_fn
    dtype = None if train_config.compute_dtype == "float32" else train_config.compute_dtype
    self._schedule = schedules.make_schedule(train_config)
    self._optimizer = optimizer_lib.make_optimizer(train_config, self._schedule)
    self.model = step_lib.build_model(config.model, compute_dtype=dtype)
    self.iterator = iterators.make_train_iterator(config.data, tokenizer,
                                                 shard_index=jax.process_index(),
                                                 shard_count=jax.process_count())
    self._validator: validation.Validator | None = None
    self._compiled_shapes: set = set()

  def restore(self) -> None:
    """Restore: the latest checkpoint's state and data position, or a new state; then the
    session's record, the jitted step, and ``metrics_file`` open for appending."""
    train_config = self.config.train
    root_rng = jax.random.key(train_config.seed)
    if self.resume_step is not None:
      abstract = step_lib.abstract_train_state(self.model, self._optimizer, mesh=self.mesh,
                                               state_sharding_fn=self._state_sharding_fn)
      self.state = self.checkpointer.restore(abstract, step=self.resume_step,
                                             data_iterator=self.iterator)
      if _is_writer():
        _trim_metrics(self.workdir / "metrics.jsonl", self.resume_step)
      self.log(f"Resumed from checkpoint step {self.resume_step} in {self.checkpointer.directory}")
    else:
      self.state = step_lib.create_train_state(
          self.model, self._optimizer, rng=jax.random.fold_in(root_rng, 0), mesh=self.mesh,
          state_sharding_fn=self._state_sharding_fn,
          params=None if self._pretrained is None else self._pretrained.params)
      if self._pretrained is not None:
        self.log(f"Starting from the parameters of {train_config.init_from}")
    if _is_writer():
      _record_session(self.workdir, self.config, self.resume_step, self.mesh)
    self._dropout_rng = jax.random.fold_in(root_rng, 1)
    self._train_step = step_lib.make_train_step(
        self.model, self._optimizer, self._schedule, mesh=self.mesh, state=self.state,
        label_smoothing=train_config.label_smoothing,
        grad_accum_steps=train_config.grad_accum_steps)

    self.step = int(jax.device_get(self.state.step))
    self.last_train, self.last_eval = {}, {}
    self._window = _Window(self.step)
    self._session_start, self._session_first_step = time.perf_counter(), self.step
    metrics_path = self.workdir / "metrics.jsonl"
    if self.step >= train_config.num_steps and metrics_path.exists():
      lines = metrics_path.read_text().splitlines()
      self.last_train = json.loads(lines[-1]) if lines else {}  # a finished run: report its end
      self.log(f"Nothing to do: the run already has {self.step} of {train_config.num_steps} "
               "steps")
    self.metrics_file = (open(metrics_path, "a", encoding="utf-8") if _is_writer()
                         else open(os.devnull, "w", encoding="utf-8"))

  def take_step(self, step_hook: StepHook | None) -> dict[str, Any]:
    """Step: one update on the next batch; returns its metrics, on the host.

    Raises:
      NonFiniteLossError: the loss is NaN or infinite; nothing is saved.
    """
    batch = next(self.iterator)
    if step_hook is not None:
      self.state = step_hook(self.step + 1, self.state) or self.state
    sharded = step_lib.shard_batch(batch, self.mesh)
    if jax.process_count() > 1:
      _compile_in_step(self._train_step, self._compiled_shapes, self.state, sharded,
                       self._dropout_rng)
    self.state, metrics = self._train_step(self.state, sharded, self._dropout_rng)
    metrics = jax.device_get(metrics)
    loss = float(metrics["loss"])
    if not math.isfinite(loss):
      good = self.checkpointer.latest_step()
      raise NonFiniteLossError(
          f"non-finite training loss ({loss}) at step {self.step + 1}; stopped without saving. "
          f"The last good checkpoint is step {good} in {self.checkpointer.directory}. Lower "
          "train.learning_rate, raise train.warmup_steps, set train.clip_norm, or use "
          "float32 compute")
    self.step += 1
    self._window.add(metrics)
    return metrics

  def evaluation_due(self) -> bool:
    """At every ``eval_every`` steps, and at the last step."""
    every, num_steps = self.config.train.eval_every, self.config.train.num_steps
    return bool(every and self.step % every == 0) or self.step == num_steps

  def window_means(self, metrics: dict[str, Any]) -> dict[str, Any]:
    """The training line of the steps since the last one (``metrics``: the last step's)."""
    self.last_train = self._window.means(self.step, float(metrics["learning_rate"]))
    return dict(self.last_train)

  def evaluate(self) -> dict[str, Any]:
    """Evaluate: validation loss and BLEU of the current parameters, and the seconds taken."""
    if self._validator is None:
      self._validator = validation.Validator(self.config, self.tokenizer, self.model, self.mesh,
                                             self.state.params)
    _barrier("validation")
    eval_start = time.perf_counter()
    self.last_eval = self._validator(self.state.params)
    return {**self.last_eval, "eval_seconds": time.perf_counter() - eval_start}

  def write(self, record: dict[str, Any], *, evaluated: bool) -> None:
    """Appends ``record`` to ``metrics.jsonl``, logs the progress line, starts a new window."""
    self.metrics_file.write(json.dumps(record) + "\n")
    self.metrics_file.flush()
    num_steps = self.config.train.num_steps
    session_rate = (self.step - self._session_first_step) / max(
        time.perf_counter() - self._session_start, 1e-9)
    eta = (num_steps - self.step) / max(session_rate, 1e-9)
    last = self.last_train
    line = (f"step {self.step}/{num_steps} | {last['steps_per_sec']:.2f} steps/s | "
            f"{last['tokens_per_sec']:,.0f} tokens/s | loss {last['loss']:.4f}"
            f" | lr {last['learning_rate']:.3g} | ETA {_format_eta(eta)}")
    if evaluated:
      line += (f" | val_loss {self.last_eval['val_loss']:.4f} | BLEU {self.last_eval['bleu']:.2f}")
    self.log(line)
    self._window = _Window(self.step)

  def save(self, *, evaluated: bool) -> None:
    """Save: a checkpoint of the state, tokenizer and data position (with BLEU if ``evaluated``)."""
    metrics = ({"bleu": self.last_eval["bleu"], "val_loss": self.last_eval["val_loss"]}
               if evaluated else None)
    self.checkpointer.save(self.state, config=self.config, tokenizer=self.tokenizer,
                           data_iterator=self.iterator, metrics=metrics)

  def close(self) -> None:
    """Ends the data iterator's threads and worker processes (``train`` calls it last)."""
    self.iterator.close()

  def result(self, *, interrupted: bool) -> TrainResult:
    """What the session did, once its checkpoints are written."""
    self.checkpointer.wait_until_finished()
    best_step = self.checkpointer.best_step()
    best_bleu = None
    if best_step is not None:
      best_bleu = self.checkpointer.load_meta(best_step)["metrics"].get("bleu")
    return TrainResult(step=self.step, interrupted=interrupted, resumed_from=self.resume_step,
                       metrics={**self.last_train, **self.last_eval}, best_bleu=best_bleu,
                       best_step=best_step, workdir=str(self.workdir))


def train(config: ExperimentConfig, workdir: str | os.PathLike, *, restart: bool = False,
          tokenizer=None, progress: bool = True, step_hook: StepHook | None = None,
          state_sharding_fn: step_lib.StateShardingFn | None = None) -> TrainResult:
  """Trains ``config.model`` on ``config.data`` for ``config.train.num_steps`` updates.

  Resumes from ``workdir/checkpoints`` when it holds a checkpoint of the same config
  (``RESUMABLE_FIELDS`` may differ). The data iterator's worker processes end when
  the call returns or raises.

  Args:
    config: the whole run.
    workdir: the run's folder (created if missing).
    restart: start over even though ``workdir`` holds a run (its files are moved
      to ``workdir/replaced-TIMESTAMP``, nothing is deleted).
    tokenizer: a ``Tokenizer`` to use for a new run; default: ``workdir/tokenizer.model``,
      trained on the training split when absent, or the tokenizer of the pretrained
      checkpoint ``config.train.init_from`` names (whose parameters a new run then
      starts from). A resumed run uses its checkpoint's.
    progress: print a progress line at every logged step.
    step_hook: ``hook(step, state) -> state | None`` before update ``step`` (1-based);
      for experiments and fault-injection tests.
    state_sharding_fn: where the state lives on the mesh; default:
      ``sharding.state_sharding_fn(config.train.parameter_sharding)`` on a mesh
      whose ``model`` axis has ``config.train.model_parallelism`` devices.

  Multi-host: call ``sharding.maybe_initialize_distributed()`` first (the command
  line does); every process runs ``train`` with the same arguments and reads its
  own rows of every batch; process 0 alone writes the run's files, all processes
  write their shards of the checkpoints.

  Returns:
    A ``TrainResult``.

  Raises:
    ConfigMismatchError: the workdir's run has another config and ``restart`` is False.
    NonFiniteLossError: the loss became NaN or infinite (the message names the step).
    CheckpointError: the workdir's checkpoint holds another model architecture.
  """
  if not isinstance(config, ExperimentConfig):
    raise TypeError(f"config must be an ExperimentConfig; got {type(config).__name__}")
  log = (lambda *a: print(*a, flush=True)) if progress else (lambda *a: None)
  workdir = _set_up_workdir(workdir, restart=restart, log=log)
  with checkpoints_lib.Checkpointer(workdir / "checkpoints",
                                    keep=config.train.keep_checkpoints) as checkpointer:
    run = _Run(config, workdir, checkpointer, tokenizer=tokenizer,
               state_sharding_fn=state_sharding_fn, log=log)
    try:
      run.restore()
      interrupted = False
      with _Interrupt() as interrupt, run.metrics_file:
        while run.step < config.train.num_steps:
          metrics = run.take_step(step_hook)
          interrupted = interrupt.requested
          evaluate = run.evaluation_due()
          if evaluate or interrupted or run.step % config.train.log_every == 0:
            record = run.window_means(metrics)  # timed before the validation
            if evaluate:
              record.update(run.evaluate())
            run.write(record, evaluated=evaluate)
          if evaluate or interrupted or run.step % config.train.checkpoint_every == 0:
            run.save(evaluated=evaluate)
          if interrupted:
            log(f"Interrupted: saved checkpoint step {run.step} in {checkpointer.directory}; "
                "rerun the same command to resume")
            break
      return run.result(interrupted=interrupted)
    finally:
      # Worker processes would otherwise live as long as a traceback holds the run, and leak
      # their shared memory at exit.
      run.close()
