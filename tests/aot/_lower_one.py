"""Subprocess helper of test_programs_in_order.py: lowers one program in a fresh process and
prints the argument count of its ``main``.

Usage: python _lower_one.py TARGET PROGRAM CONFIG_JSON
"""

import json
import os
import re
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

from seq2seq_jax import aot  # noqa: E402
from seq2seq_jax.aot import programs as programs_lib  # noqa: E402
from seq2seq_jax.configs import ExperimentConfig  # noqa: E402


def main_arguments(lowered) -> int:
  """How many arguments the lowered program's ``main`` takes (StableHLO text)."""
  header = next(line for line in lowered.as_text().splitlines()
                if "func.func public @main(" in line)
  return len(set(re.findall(r"%arg(\d+): ", header)))


def main():
  target_name, program, config_path = sys.argv[1:4]
  config = ExperimentConfig.from_dict(json.loads(open(config_path).read()))
  target = aot.parse_target(target_name)
  mesh = aot.target_mesh(target, config.train.model_parallelism)
  built = programs_lib.build_program(program, config, mesh)
  print("ARGUMENTS", main_arguments(built.jitted.lower(*built.args)), flush=True)


if __name__ == "__main__":
  main()
