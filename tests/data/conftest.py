"""Fixtures of the data tests: one prepared multi30k_tiny and one tokenizer per session."""

import dataclasses
import functools
import gzip
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import tensorflow_datasets as tfds

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import tokenizer as tokenizer_lib

tfds.display_progress_bar(False)

TINY_VOCAB = 500  # multi30k_tiny cannot fill much more than ~1,600 pieces


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  """One tfds data dir for the session: tiny, full and downloaded copies must coexist in it."""
  return tmp_path_factory.mktemp("tfds")


@pytest.fixture
def tiny_config(multi30k_tiny, data_dir) -> DataConfig:
  return DataConfig(manual_dir=str(multi30k_tiny), data_dir=str(data_dir), vocab_size=TINY_VOCAB,
                    max_source_len=32, max_target_len=32, bucket_lengths=(8, 16, 24, 32),
                    batch_tokens=1024, batch_multiple=8, eval_batch_size=16)


@functools.cache
def _trained(config: DataConfig) -> tokenizer_lib.Tokenizer:
  return tokenizer_lib.train_tokenizer(config)


@pytest.fixture
def tiny_tokenizer(tiny_config) -> tokenizer_lib.Tokenizer:
  return _trained(tiny_config)



def write_lines(path: pathlib.Path, lines: list[str], *, raw: bytes | None = None) -> None:
  """Writes ``lines`` (or ``raw`` bytes) to ``path``, gzipped when the name ends in .gz."""
  data = raw if raw is not None else "".join(line + "\n" for line in lines).encode()
  path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


@pytest.fixture
def sharded_files(multi30k_tiny, tmp_path):
  """The tiny train split as 3 shards of 120, 80 and 100 lines, the middle one gzipped."""
  folder = tmp_path / "corpus"
  folder.mkdir()
  lines = {lang: (multi30k_tiny / f"train.{lang}").read_text().splitlines() for lang in ("de", "en")}
  for k, (start, stop) in enumerate([(0, 120), (120, 200), (200, 300)]):
    for lang in ("de", "en"):
      write_lines(folder / f"train-{k}.{lang}{'.gz' if k == 1 else ''}", lines[lang][start:stop])
  return folder, lines


def folder_bytes(folder: pathlib.Path) -> dict[str, bytes]:
  """Every file under ``folder`` by its relative path: two folders equal byte for byte."""
  return {path.relative_to(folder).as_posix(): path.read_bytes()
          for path in sorted(folder.rglob("*")) if path.is_file()}


def partial_folders(data_dir: pathlib.Path) -> list[pathlib.Path]:
  """The unfinished ids folders under ``data_dir``."""
  return sorted(path for path in data_dir.glob("ids/**/*.partial-*") if path.is_dir())


def age_folder(folder: pathlib.Path, seconds: float | None = None) -> None:
  """Sets the modification time of ``folder`` and of all in it to ``seconds`` ago (default:
  just past ``prepared.ABANDONED_AFTER_S``): a folder in which nothing changed that long."""
  from seq2seq_jax.data import prepared
  then = time.time() - (prepared.ABANDONED_AFTER_S + 60 if seconds is None else seconds)
  for path in [folder, *folder.rglob("*")]:
    os.utime(path, (then, then))


def kill_a_prepare(config: DataConfig, tokenizer: tokenizer_lib.Tokenizer, tmp_path: pathlib.Path,
                   *, writer: str, records_per_shard: int, kill_at: int) -> None:
  """Runs a prepare (``writer``: "local" or "beam") in a process that kills itself (SIGKILL)
  at its ``kill_at``-th batch of records written."""
  tokenizer_path = tmp_path / "killed-tokenizer.model"
  tokenizer.save(tokenizer_path)
  env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2]))
  done = subprocess.run(
      [sys.executable, str(pathlib.Path(__file__).with_name("_kill_prepare.py")),
       json.dumps(dataclasses.asdict(config)), str(tokenizer_path), writer,
       str(records_per_shard), str(kill_at)], capture_output=True, text=True, timeout=300, env=env)
  assert done.returncode == -signal.SIGKILL, (done.stdout + done.stderr)[-3000:]
