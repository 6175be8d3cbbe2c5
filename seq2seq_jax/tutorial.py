"""What the tutorial notebooks (``colabs/``) share: quick mode, where data and runs live, timing.

Each notebook starts with ``session = tutorial.start()`` and ends with
``session.finish()``. Quick mode (``SEQ2SEQ_JAX_QUICK=1``, as CI runs the notebooks)
means tiny models on the 300-line ``multi30k_tiny`` copy and a fresh temporary
folder for the runs; otherwise full runs go to ``workdirs/`` at the checkout's root
(or the current folder), where a rerun of a notebook finds them finished.

Example:
  >>> session = start(environ={"SEQ2SEQ_JAX_QUICK": "0"})  # doctest: +ELLIPSIS
  quick mode: False; data: ...; runs in .../workdirs
  >>> session.finish()  # the last cell  # doctest: +ELLIPSIS
  notebook ran in ... minutes (full mode) on cpu
"""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile
import time
from collections.abc import Mapping

from seq2seq_jax.benchmarking import quick_mode


@dataclasses.dataclass(frozen=True)
class Session:
  """A notebook's settings, read once at its start."""

  quick: bool  # SEQ2SEQ_JAX_QUICK=1: tiny models and a few steps (CI)
  multi30k_dir: str  # a local copy of Multi30k's raw files; "" downloads the official ones
  workdirs: pathlib.Path  # where the notebook's training runs go
  started: float  # time.time() at the start

  def finish(self) -> None:
    """Prints how long the notebook ran, in which mode, on which device."""
    import jax  # pylint: disable=import-outside-toplevel
    print(f"notebook ran in {(time.time() - self.started) / 60:.1f} minutes "
          f"({'quick' if self.quick else 'full'} mode) on {jax.devices()[0].device_kind}")


def start(*, cwd: pathlib.Path | None = None,
          environ: Mapping[str, str] | None = None) -> Session:
  """Reads quick mode, finds the data and the runs' folder; prints them.

  Args:
    cwd: where the notebook runs (default: the current folder); inside a checkout's
      ``colabs/`` the checkout's root is the one above it.
    environ: the environment (default: ``os.environ``).

  Returns:
    The ``Session``. Multi30k is read from ``shared/data`` beside the checkout when
    that folder exists (``multi30k_tiny`` in quick mode, ``multi30k/raw`` else);
    otherwise ``multi30k_dir`` is empty and the library's builder downloads it.
  """
  from seq2seq_jax.aot.targets import quiet_libtpu  # pylint: disable=import-outside-toplevel
  quiet_libtpu()  # before jax starts: no TPU warnings where libtpu is installed without a TPU
  cwd = pathlib.Path.cwd() if cwd is None else cwd
  quick = quick_mode(environ)
  root = cwd.parent if (cwd.parent / "seq2seq_jax").is_dir() else cwd
  shared = root.parent / "shared" / "data"
  multi30k_dir = ""
  if shared.is_dir():
    multi30k_dir = str((shared / ("multi30k_tiny" if quick else "multi30k/raw")).resolve())
  workdirs = pathlib.Path(tempfile.mkdtemp()) if quick else (root / "workdirs").absolute()
  print(f"quick mode: {quick}; data: {multi30k_dir or 'download'}; runs in {workdirs}")
  return Session(quick=quick, multi30k_dir=multi30k_dir, workdirs=workdirs,
                 started=time.time())
