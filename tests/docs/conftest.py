"""The folder examples run in: a checkout's view of ../shared, and what the examples name.

An example runs in an empty folder whose parent holds ``shared`` (a link to the
corpora beside this checkout), so ``../shared/data/...`` means what it means in a
checkout. Examples that name a trained run (``runs/tiny``) or a published checkpoint
(``opus-mt-de-en``, ``m2m100_418M``, ``mbart-large-50-many-to-many-mmt``,
``madlad400-3b-mt``) find one there under that name: a run that ``seq2seq_jax.train``
wrote for the ``tiny_transformer`` preset, and the small MarianMT, M2M100, mBART-50 and
MADLAD-layout checkpoints that ``seq2seq_jax.pretrained.fixtures`` builds for the
pretrained tests (real checkpoints of those families, trained for minutes, not
the published weights, which this machine cannot download). A file an example
translates (``corpus.de``) holds the first lines of Multi30k's German test set.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import filelock
import pytest

from tests.pretrained import conftest as pretrained_checkpoints

# Names an example may use -> how to provide it.
TINY_RUN = "runs/tiny"
STAND_INS = {"opus-mt-de-en": "marian-de-en", "m2m100_418M": "m2m100-de-en",
             "mbart-large-50-many-to-many-mmt": "mbart50-de-en",
             "madlad400-3b-mt": "madlad-de-en"}
# file name -> (the corpus file under ../shared/data it copies, how many lines)
INPUT_FILES = {"corpus.de": ("multi30k_tiny/test_2016_flickr.de", 40)}


def _shared_root(tmp_path_factory) -> pathlib.Path:
  base = tmp_path_factory.getbasetemp()
  # xdist workers have their own basetemp; its parent belongs to this test run.
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _tiny_run(root: pathlib.Path, corpus: pathlib.Path) -> pathlib.Path:
  """A finished ``tiny_transformer`` run on multi30k_tiny, trained once per test session."""
  import seq2seq_jax as s2s  # noqa: PLC0415

  run = root / "examples-tiny-run"
  with filelock.FileLock(str(root / "examples-tiny-run.lock")):
    if not (run / "done").is_file():
      shutil.rmtree(run, ignore_errors=True)
      config = s2s.apply_overrides(s2s.get_preset("tiny_transformer"), [
          f"data.manual_dir={corpus}", f"data.data_dir={root / 'examples-tfds'}"])
      s2s.train(config, run / "run")
      (run / "done").touch()
  return run / "run"


class Workspace:
  """Makes the folder one example runs in (see the module docstring)."""

  def __init__(self, request, tmp_path_factory):
    self._request = request
    self._factory = tmp_path_factory

  def make(self, text: str) -> pathlib.Path:
    """A fresh folder for an example whose source is ``text``, holding what it names."""
    parent = self._factory.mktemp("example")
    shared = pretrained_checkpoints._multi30k_raw(self._request).parents[2]
    (parent / "shared").symlink_to(shared, target_is_directory=True)
    work = parent / "work"
    work.mkdir()
    root = _shared_root(self._factory)
    if TINY_RUN in text:
      corpus = shared / "data" / "multi30k_tiny"
      shutil.copytree(_tiny_run(root, corpus), work / TINY_RUN)
    for name, (source, count) in INPUT_FILES.items():
      if name in text:
        lines = (shared / "data" / source).read_text(encoding="utf-8").splitlines()[:count]
        (work / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    for name, built in STAND_INS.items():
      if name in text:
        checkpoint = pretrained_checkpoints._checkpoint(self._request, self._factory, built)
        (work / name).symlink_to(checkpoint, target_is_directory=True)
    return work


@pytest.fixture(scope="session")
def workspace(request, tmp_path_factory) -> Workspace:
  return Workspace(request, tmp_path_factory)


@pytest.fixture
def in_workspace(monkeypatch, tmp_path):
  """Returns ``enter(folder)``: run in ``folder`` with ``~`` a folder of this test's own."""
  def enter(folder: pathlib.Path) -> None:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))  # ~/.cache/seq2seq_jax/tfds of the examples
    monkeypatch.chdir(folder)
  return enter

