"""Tests of the glibc malloc setting: when a process restarts, and that it page-faults far less."""

import json
import os
import subprocess
import sys

import pytest

from seq2seq_jax import allocator

needs_glibc = pytest.mark.skipif(not allocator.has_hugetlb_tunable(),
                                 reason="the setting is glibc's (Linux, glibc >= 2.35); elsewhere "
                                        "a no-op")

# A program that restarts itself with the settings, then counts the minor page
# faults of a jitted function whose XLA scratch buffer is about 100 MB.
_PROBE = """
import json, resource, sys
from seq2seq_jax import allocator
allocator.reexec_with_tuned_malloc()
import jax, jax.numpy as jnp
f = jax.jit(lambda x: (jnp.cumsum(x, axis=0) * jnp.cumsum(x, axis=1)).sum())
x = jnp.ones((2048, 4096))
temp = f.lower(x).compile().memory_analysis().temp_size_in_bytes
faults = []
for _ in range(12):  # the heap settles over the first few calls
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(x).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
faults = sorted(faults[6:])[2]  # the median of the last six
print(json.dumps({"faults": faults, "temp": temp, "tuned": allocator.malloc_is_tuned(),
                  "argv": sys.argv[1:]}))
"""


def _run_probe(env: dict) -> dict:
  out = subprocess.run([sys.executable, "-c", _PROBE, "first", "--second"], env=env,
                       capture_output=True, text=True, timeout=300, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_should_reexec_only_for_a_plain_glibc_environment(monkeypatch):
  monkeypatch.setattr(allocator, "has_hugetlb_tunable", lambda: True)
  assert allocator.should_reexec({"PATH": "/bin"})
  assert not allocator.should_reexec(dict(allocator.TUNED_MALLOC_ENV))  # already restarted
  assert not allocator.should_reexec({"SEQ2SEQ_JAX_TUNE_MALLOC": "0"})
  assert not allocator.should_reexec({"SEQ2SEQ_JAX_TUNE_MALLOC": "off"})
  assert allocator.should_reexec({"SEQ2SEQ_JAX_TUNE_MALLOC": "1"})
  assert not allocator.should_reexec({"MALLOC_ARENA_MAX": "4"})  # the user's own choice wins
  assert not allocator.should_reexec({"GLIBC_TUNABLES": "glibc.malloc.check=3"})
  monkeypatch.setattr(allocator, "has_hugetlb_tunable", lambda: False)
  assert not allocator.should_reexec({"PATH": "/bin"})


def test_without_malloc_settings_strips_only_malloc_variables():
  env = {"PATH": "/bin", "HOME": "/h", **allocator.TUNED_MALLOC_ENV,
         "MALLOC_MMAP_THRESHOLD_": "1", "MALLOC_ARENA_MAX": "2"}
  assert allocator.without_malloc_settings(env) == {"PATH": "/bin", "HOME": "/h"}
  assert allocator.malloc_is_tuned(env)
  assert not allocator.malloc_is_tuned(allocator.without_malloc_settings(env))


@needs_glibc
def test_restarted_process_keeps_its_arguments_and_faults_far_less_in_scratch_memory():
  plain = allocator.without_malloc_settings()
  tuned = _run_probe(plain)
  default = _run_probe({**plain, allocator.OPT_OUT_VARIABLE: "0"})
  assert tuned["tuned"] and not default["tuned"]
  assert tuned["argv"] == default["argv"] == ["first", "--second"]
  # glibc's defaults map the ~100 MB scratch buffer afresh on every call: each of
  # its 4 KiB pages faults in again. With huge pages, one fault maps 2 MiB.
  pages = tuned["temp"] / 4096
  assert default["faults"] > 0.5 * pages, default
  if allocator.transparent_huge_pages() in ("always", "madvise"):
    assert tuned["faults"] < 0.1 * default["faults"], (tuned, default)
