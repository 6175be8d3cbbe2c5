"""Subprocess helper of test_loop.py: trains a config and signals itself (or, with NAN, makes
the parameters NaN) at a chosen step.

Usage: python _run_train.py WORKDIR CONFIG_JSON [SIGNAL|NAN STEP]
"""

import json
import os
import pathlib
import signal
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from seq2seq_jax.configs import ExperimentConfig  # noqa: E402
from seq2seq_jax.training.loop import train  # noqa: E402


def main():
  workdir, config_path = sys.argv[1:3]
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if cache:
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  config = ExperimentConfig.from_dict(json.loads(open(config_path).read()))
  hook = None
  if len(sys.argv) > 3 and sys.argv[3] == "NAN":
    at_step = int(sys.argv[4])

    def hook(step, state):
      if step == at_step:
        return state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
      return state
  elif len(sys.argv) > 3:
    signum, at_step = getattr(signal, sys.argv[3]), int(sys.argv[4])

    every = config.train.checkpoint_every
    landed = pathlib.Path(workdir) / "checkpoints" / str((at_step - 1) // every * every)

    def hook(step, state):
      if step == at_step:
        if signum == signal.SIGKILL:
          # Let the last asynchronous save before this step land (up to two minutes on a
          # busy machine), as a real kill might not: the test then knows what to resume from.
          deadline = time.monotonic() + 120.0
          while not landed.is_dir() and time.monotonic() < deadline:
            time.sleep(0.2)
          time.sleep(1.0)
        os.kill(os.getpid(), signum)
      return state

  result = train(config, workdir, step_hook=hook)
  print("RESULT", json.dumps({"step": result.step, "interrupted": result.interrupted,
                              "resumed_from": result.resumed_from}), flush=True)


if __name__ == "__main__":
  main()
