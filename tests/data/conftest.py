"""Fixtures of the data tests: one prepared multi30k_tiny and one tokenizer per session."""

import functools
import gzip
import pathlib

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
