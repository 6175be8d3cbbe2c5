"""Fixtures of the data tests: one prepared multi30k_tiny and one tokenizer per session."""

import functools

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

