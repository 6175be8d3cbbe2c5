"""The notebooks' shared start: quick mode, the data beside a checkout, where runs go."""

import pathlib
import re

import pytest

from seq2seq_jax import tutorial


@pytest.fixture
def checkout(tmp_path) -> pathlib.Path:
  """``tmp/work/{repo/{seq2seq_jax,colabs},shared/data/{multi30k/raw,multi30k_tiny}}``."""
  repo = tmp_path / "work" / "repo"
  for folder in (repo / "seq2seq_jax", repo / "colabs",
                 tmp_path / "work" / "shared" / "data" / "multi30k" / "raw",
                 tmp_path / "work" / "shared" / "data" / "multi30k_tiny"):
    folder.mkdir(parents=True)
  return repo


def test_a_full_run_in_colabs_uses_the_shared_corpus_and_the_root_workdirs(checkout, capsys):
  session = tutorial.start(cwd=checkout / "colabs", environ={})
  shared = checkout.parent / "shared" / "data"
  assert session.quick is False
  assert session.multi30k_dir == str((shared / "multi30k" / "raw").resolve())
  assert session.workdirs == checkout / "workdirs"
  assert capsys.readouterr().out == (f"quick mode: False; data: {session.multi30k_dir}; "
                                     f"runs in {checkout / 'workdirs'}\n")


def test_quick_mode_reads_the_tiny_copy_and_runs_in_a_fresh_folder(checkout):
  session = tutorial.start(cwd=checkout / "colabs", environ={"SEQ2SEQ_JAX_QUICK": "1"})
  assert session.quick is True
  assert session.multi30k_dir.endswith("multi30k_tiny")
  assert session.workdirs.is_dir() and not any(session.workdirs.iterdir())
  assert checkout not in session.workdirs.parents


def test_without_shared_data_the_builder_downloads(tmp_path):
  session = tutorial.start(cwd=tmp_path, environ={"SEQ2SEQ_JAX_QUICK": "0"})
  assert session.multi30k_dir == ""  # DataConfig(manual_dir="") downloads the official files
  assert session.workdirs == tmp_path / "workdirs"  # not a checkout: the folder itself


def test_finish_says_what_the_notebook_test_reads(checkout, capsys):
  session = tutorial.start(cwd=checkout / "colabs", environ={})
  capsys.readouterr()
  session.finish()
  assert re.fullmatch(r"notebook ran in [\d.]+ minutes \(full mode\) on \S.*\n",
                      capsys.readouterr().out)
