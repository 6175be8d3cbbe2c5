"""A glibc malloc setting that makes XLA's per-step scratch memory cheap to map on the CPU backend.

On the CPU, XLA allocates one scratch buffer per execution of a compiled program
(354 MB for the T-small train step at batch 64 x 24) and frees it when the step
ends. glibc serves an allocation that large from a fresh ``mmap`` (XLA's threads
allocate from per-thread arenas, and those map anything beyond 64 MB directly,
whatever the thresholds) and unmaps it on ``free``: every step then faults in
every 4 KiB page again, about 93,000 page faults and 200 ms of kernel time in a
750 ms step on two cores. With ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc
2.35 or newer) glibc asks for transparent huge pages on the blocks it maps, so the
same buffer takes about 180 faults of 2 MiB: the T-small step went from about 780
to 555 ms (benchmarks/RESULTS.md, "Host memory"). The memory still goes back to
the system at every ``free``.

Keeping the buffer mapped instead (``MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0``, no
trimming) was no faster, and it never returns memory: a process whose shapes keep
growing (``benchmarks/rnn_vs_transformer.py``, 16 to 512 tokens) ran out of 24 GiB.

glibc reads the variable once, when the process starts, so it must be in the
environment before Python starts. The ``seq2seq-jax`` command and the benchmark
scripts restart themselves once with it (``reexec_with_tuned_malloc``); from a
Python session (a notebook), start the interpreter with it:

  GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python ...

It needs transparent huge pages in ``madvise`` or ``always`` mode
(``/sys/kernel/mm/transparent_hugepage/enabled``); elsewhere it does nothing.
Set ``SEQ2SEQ_JAX_TUNE_MALLOC=0`` to keep glibc's defaults.
"""

from __future__ import annotations

import os
import pathlib
import platform
import sys
from collections.abc import Mapping

# Transparent huge pages for the blocks malloc maps (glibc >= 2.35).
TUNED_MALLOC_ENV: dict[str, str] = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
OPT_OUT_VARIABLE = "SEQ2SEQ_JAX_TUNE_MALLOC"
_MALLOC_VARIABLES = ("MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_MMAP_MAX_",
                     "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                     "GLIBC_TUNABLES")


def has_hugetlb_tunable() -> bool:
  """Whether this process runs on Linux with glibc 2.35 or newer (where the setting exists)."""
  if not sys.platform.startswith("linux"):
    return False
  name, version = platform.libc_ver()
  try:
    return name == "glibc" and tuple(int(p) for p in version.split(".")[:2]) >= (2, 35)
  except ValueError:
    return False


def transparent_huge_pages() -> str:
  """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or ``""``."""
  try:
    text = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text("ascii")
  except OSError:
    return ""
  return text[text.find("[") + 1:text.find("]")] if "[" in text else ""


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
  if malloc_is_tuned(environ) or not has_hugetlb_tunable():
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
