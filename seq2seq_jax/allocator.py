"""glibc malloc settings that keep XLA's per-step scratch memory mapped on the CPU backend.

On the CPU, XLA allocates one scratch buffer per execution of a compiled program
(354 MB for the T-small train step at batch 64 x 24) and frees it when the step
ends. glibc serves an allocation that large from a fresh ``mmap`` (XLA's threads
allocate from per-thread arenas, and those map anything beyond 64 MB directly,
whatever the thresholds) and unmaps it on ``free``: every step then faults in and
zeroes every page again, about 93,000 page faults and 200 ms of kernel time in a
700 ms step on two cores. With a single arena (``MALLOC_ARENA_MAX=1``), no mmap
allocations (``MALLOC_MMAP_MAX_=0``) and no trimming, the buffer comes from the
heap and stays mapped between steps: no faults, and the step ran 18-20 % faster
(benchmarks/RESULTS.md, "Host memory").

glibc reads these variables once, when the process starts, so they must be in the
environment before Python does. The ``seq2seq-jax`` command and the benchmark
scripts restart themselves once with them (``reexec_with_tuned_malloc``); a Python
session (a notebook) sets them for the processes it starts, or the user starts
Python with them:

  MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1099511627776 python ...

The cost: memory freed by the process stays with it (it is reused, not returned
to the system), and every thread allocates from one arena. Set
``SEQ2SEQ_JAX_TUNE_MALLOC=0`` to keep glibc's defaults.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

# One arena, never mmap, never trim. glibc's own names (the trailing "_" is theirs).
TUNED_MALLOC_ENV: dict[str, str] = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
}
OPT_OUT_VARIABLE = "SEQ2SEQ_JAX_TUNE_MALLOC"
_MALLOC_VARIABLES = ("MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_MMAP_MAX_",
                     "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                     "GLIBC_TUNABLES")


def is_glibc() -> bool:
  """Whether this process runs on Linux with glibc (where the settings mean something)."""
  return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def malloc_is_tuned(environ: Mapping[str, str] | None = None) -> bool:
  """Whether ``environ`` (default: this process's) holds every ``TUNED_MALLOC_ENV`` value."""
  environ = os.environ if environ is None else environ
  return all(environ.get(name) == value for name, value in TUNED_MALLOC_ENV.items())


def without_malloc_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
  """A copy of ``environ`` without any glibc malloc variable: for a child on the defaults."""
  environ = os.environ if environ is None else environ
  return {k: v for k, v in environ.items() if k not in _MALLOC_VARIABLES}


def should_reexec(environ: Mapping[str, str] | None = None) -> bool:
  """Whether ``reexec_with_tuned_malloc`` would restart the process.

  Not when the settings are already in place, not off glibc, not when the user
  opted out (``SEQ2SEQ_JAX_TUNE_MALLOC=0``), and not when the user chose any malloc
  variable of their own: theirs win.
  """
  environ = os.environ if environ is None else environ
  if malloc_is_tuned(environ) or not is_glibc():
    return False
  if environ.get(OPT_OUT_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off"):
    return False
  return not any(name in environ for name in _MALLOC_VARIABLES)


def reexec_with_tuned_malloc() -> None:
  """Restarts this process, same interpreter and arguments, with ``TUNED_MALLOC_ENV`` set.

  Returns without doing anything when ``should_reexec()`` is false, so the
  restarted process goes on past the call. Call it first thing in a program's
  ``main``, before any work worth keeping: the process image is replaced.
  """
  if not should_reexec():
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, list(sys.orig_argv), {**os.environ, **TUNED_MALLOC_ENV})
