"""The built wheel and sdist: what they hold, and the wheel working outside this checkout.

The wheel goes into a fresh virtual environment (no editable install, no source tree on
the path, the working directory elsewhere) with the pinned versions of constraints.txt,
and runs the README's first example there. pip's cache makes the install quick after
the first run on a machine.
"""

import os
import pathlib
import re
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

import seq2seq_jax
from tests.docs import examples

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> pathlib.Path:
  out = tmp_path_factory.mktemp("dist")
  subprocess.run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out),
                  str(REPO_ROOT)], check=True, capture_output=True, text=True)
  return out


def _only(folder: pathlib.Path, pattern: str) -> pathlib.Path:
  found = sorted(folder.glob(pattern))
  assert len(found) == 1, found
  return found[0]


@pytest.mark.slow
def test_wheel_and_sdist_hold_the_package_its_marker_and_version(dist):
  wheel = _only(dist, "seq2seq_jax-*.whl")
  assert wheel.name.startswith(f"seq2seq_jax-{seq2seq_jax.__version__}-py3-none-any")
  names = zipfile.ZipFile(wheel).namelist()
  assert "seq2seq_jax/py.typed" in names
  assert "seq2seq_jax/decoding/beam.py" in names
  assert not [name for name in names if name.startswith(("tests/", "benchmarks/", "docs/"))]
  metadata = zipfile.ZipFile(wheel).read(
      f"seq2seq_jax-{seq2seq_jax.__version__}.dist-info/METADATA").decode()
  assert f"Version: {seq2seq_jax.__version__}" in metadata
  assert "seq2seq-jax = seq2seq_jax.cli:main" in zipfile.ZipFile(wheel).read(
      f"seq2seq_jax-{seq2seq_jax.__version__}.dist-info/entry_points.txt").decode()
  sdist = _only(dist, f"seq2seq_jax-{seq2seq_jax.__version__}.tar.gz")
  members = tarfile.open(sdist).getnames()
  assert f"seq2seq_jax-{seq2seq_jax.__version__}/seq2seq_jax/py.typed" in members


_RUN_README_EXAMPLE = """
import doctest, pathlib, sys
import seq2seq_jax
assert "site-packages" in seq2seq_jax.__file__, seq2seq_jax.__file__
block = pathlib.Path(sys.argv[1]).read_text()
test = doctest.DocTestParser().get_doctest(block, {}, "README first example", None, 0)
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
runner.run(test)
failed, attempted = runner.summarize(verbose=False)
print(f"{attempted} examples, {failed} failed, from {seq2seq_jax.__file__}")
sys.exit(1 if failed or not attempted else 0)
"""


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_venv_and_runs_the_readme_example(dist, tmp_path):
  started = time.perf_counter()
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
  python = venv / "bin" / "python"
  env = {key: value for key, value in os.environ.items()
         if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
  install = subprocess.run(
      [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
       "-c", str(REPO_ROOT / "constraints.txt"), str(_only(dist, "seq2seq_jax-*.whl"))],
      env=env, capture_output=True, text=True)
  assert install.returncode == 0, install.stderr[-3000:]
  installed = time.perf_counter() - started

  first = examples.python_blocks(REPO_ROOT / "README.md")[0]
  assert first.is_session and "s2s.Transformer(config)" in first.source
  (tmp_path / "example.txt").write_text(first.source)
  (tmp_path / "run.py").write_text(_RUN_README_EXAMPLE)
  work = tmp_path / "elsewhere"
  work.mkdir()
  run = subprocess.run([str(python), str(tmp_path / "run.py"), str(tmp_path / "example.txt")],
                       cwd=work, env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                       text=True)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  assert re.search(r"^\d+ examples, 0 failed, from .*/venv/lib/", run.stdout, re.MULTILINE)
  print(f"wheel install {installed:.0f} s, example {time.perf_counter() - started - installed:.0f} s")
