"""Subprocess helper of test_sharding.py: trains or evaluates a preset on N host CPU devices.

Usage:
  python _run_sharded.py DEVICES train WORKDIR PRESET [--set section.field=value ...]
  python _run_sharded.py DEVICES evaluate WORKDIR MESH [MESH ...]

``DEVICES`` is this process's device count (fixed at start-up, hence a
subprocess). Several processes form one run when JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID are set (``maybe_initialize_distributed``).
``evaluate`` restores the run's latest checkpoint (the whole train state) onto
each ``MESH`` (``DATAxMODEL:replicated|fsdp``, e.g. ``4x2:fsdp``) built from the
first DATA*MODEL devices and prints the validation loss of the config's first
``train.eval_batches`` batches, computed as the training loop computes it.
Prints one line ``RESULT {json}``.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={int(sys.argv[1])}").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from seq2seq_jax.training import sharding  # noqa: E402


def _train(workdir, preset, overrides):
  from seq2seq_jax import presets
  from seq2seq_jax.training.loop import train
  config = presets.apply_overrides(presets.get_preset(preset), overrides)
  placement = {}

  def record_placement(step, state):
    # How the loop placed the state it built from the config (no hook decides it).
    if step == 1:
      leaves = jax.tree_util.tree_flatten_with_path(state)[0]
      path, largest = max(leaves, key=lambda item: item[1].size)
      placement.update(
          largest="/".join(sharding._key_name(k) for k in path), spec=str(largest.sharding.spec),
          bytes=largest.nbytes, device_bytes=sharding.per_device_bytes(largest),
          state_bytes=sum(leaf.nbytes for _, leaf in leaves),
          state_device_bytes=sum(sharding.per_device_bytes(leaf) for _, leaf in leaves))
    return state

  result = train(config, workdir, progress=False, step_hook=record_placement)
  return {"step": result.step, "metrics": result.metrics, "placement": placement}


def _evaluate(workdir, meshes):
  import pathlib

  import numpy as np

  from seq2seq_jax.checkpoints import Checkpointer
  from seq2seq_jax.training.restore import load_params
  from seq2seq_jax.data import pipeline
  from seq2seq_jax.data.tokenizer import Tokenizer
  from seq2seq_jax.training import optimizer as optimizer_lib
  from seq2seq_jax.training import schedules
  from seq2seq_jax.training import step as step_lib

  workdir = pathlib.Path(workdir)
  tokenizer = Tokenizer.load(workdir / "tokenizer.model")
  out = {}
  with Checkpointer(workdir / "checkpoints", async_save=False) as checkpointer:
    config = checkpointer.load_config()
    model = step_lib.build_model(config.model)
    schedule = schedules.make_schedule(config.train)
    optimizer = optimizer_lib.make_optimizer(config.train, schedule)
    batches = pipeline.make_eval_batches(config.data, tokenizer)
    for name in meshes:
      shape, _, parameter_sharding = name.partition(":")
      data, model_parallelism = (int(x) for x in shape.split("x"))
      mesh = sharding.make_mesh(model_parallelism, jax.devices()[:data * model_parallelism])
      abstract = step_lib.abstract_train_state(
          model, optimizer, mesh=mesh,
          state_sharding_fn=sharding.state_sharding_fn(parameter_sharding))
      state = checkpointer.restore(abstract, step="latest")
      params, _ = load_params(workdir / "checkpoints", mesh=mesh,
                              parameter_sharding=parameter_sharding)
      jax.tree.map(np.testing.assert_array_equal, params, state.params)
      eval_step = step_lib.make_eval_step(model, mesh=mesh, params=state.params)
      sums = {"loss": 0.0, "tokens": 0.0}
      for number, batch in enumerate(batches):
        if number >= config.train.eval_batches:
          break
        values = jax.device_get(eval_step(state.params, step_lib.shard_batch(batch, mesh)))
        sums["loss"] += float(values["loss"])
        sums["tokens"] += float(values["tokens"])
      specs = {"/".join(sharding._key_name(k) for k in path): str(leaf.sharding.spec)
               for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}
      out[name] = {"step": int(jax.device_get(state.step)),
                   "val_loss": sums["loss"] / max(sums["tokens"], 1.0),
                   "devices": len(mesh.devices.flat), "specs": specs}
  return out


def main():
  sharding.maybe_initialize_distributed()  # before anything touches devices
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if cache:
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  command, workdir = sys.argv[2:4]
  if command == "train":
    overrides = [arg for arg in sys.argv[5:] if arg != "--set"]
    result = _train(workdir, sys.argv[4], overrides)
  elif command == "evaluate":
    result = _evaluate(workdir, sys.argv[4:])
  else:
    raise SystemExit(f"unknown command {command!r}: use train or evaluate")
  result.update(process_index=jax.process_index(), process_count=jax.process_count(),
                device_count=jax.device_count())
  print("RESULT", json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
