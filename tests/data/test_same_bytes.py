"""The data path's output on a fixed corpus, byte for byte: the training batches and their order
(bucketed and packed, on threads and in 2 grain workers, one host of two, the text path, the
user's own files), the evaluation batches, the prepared ids and the packing cache.

The digests were recorded from the code before the data modules were split by stage
(``sources -> prepared -> packing -> batches -> iterators``); a move that changes a byte
anywhere on the path fails here. The vocabulary is a fixed word hash, not a trained
sentencepiece model, so that no tokenizer version enters the digests.
"""

import dataclasses
import hashlib
import pathlib
import zlib

import numpy as np
import pytest

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import make_eval_batches, make_train_dataset, make_train_iterator
from seq2seq_jax.data import prepared

pytestmark = pytest.mark.data  # reads ../shared/data (fails under CI=true when missing)

# sha256 of each case's output, recorded from the code before the split (see the docstring).
GOLDEN = {
    "bucketed": "b639c3542a5870f7c17cfa5b6b6a8b97e8fcd2b7b8476f9eb996b0435412a838",
    "packed": "df76e2614820525d144a58d6c14c19f6b9c51f93b387be5850a29ba6d70767d9",
    "text path": "b639c3542a5870f7c17cfa5b6b6a8b97e8fcd2b7b8476f9eb996b0435412a838",
    "host 1 of 2": "1e6640f3cc8ae6d38a8ed8c65a30f5a49263debc568794580ddf650b63cda1c4",
    "train_files packed": "df76e2614820525d144a58d6c14c19f6b9c51f93b387be5850a29ba6d70767d9",
    "eval batches": "18c874735913d0586821590c63b9f4c49b517d4a9c9d3fb0d907a84f6b411a06",
    "prepared ids": "2f07559b9f6b0a5f61f250bf3f27c9b4196f74ef2abf00fd2a5cd2b1fd39e70b",
    "packing cache": "51b5069d10be404ba15d55df3378dcc5b56d1e19905ea18d3a8494bc8e073d78",
    "train_files ids": "8dd0d04cc2df5148a3fd058e856f8abab0130912ee2fddd107a29ff740b44461",
    "stats": "b768943841afed66d3bd18ebb20a572fa3488011c59f3550320545849eea07a9",
}


class WordIds:
  """A vocabulary that needs no training: a word's id is its CRC32 modulo the free ids."""

  pad_id, eos_id, vocab_size = 0, 2, 1000

  def _encode(self, texts):
    return [[zlib.crc32(word.encode()) % (self.vocab_size - 4) + 4 for word in text.split()]
            + [self.eos_id] for text in texts]

  def encode_source(self, texts, lang=None, target_lang=None):
    return self._encode(texts)

  def encode_target(self, texts, lang=None):
    return self._encode(texts)

  def to_dict(self):
    return {"kind": "crc32 of words", "vocab_size": self.vocab_size}

  def __repr__(self):
    return f"WordIds({self.vocab_size})"


def _add_batch(digest, batch) -> None:
  for key in sorted(batch):
    value = np.asarray(batch[key])
    digest.update(f"{key} {value.dtype.str} {value.shape}".encode())
    digest.update(np.ascontiguousarray(value).tobytes())


def _batches(config: DataConfig, **options) -> str:
  """The digest of two epochs of training batches, in order."""
  digest = hashlib.sha256()
  iterator = make_train_iterator(config, WordIds(), num_epochs=2, **options)
  try:
    count = 0
    for batch in iterator:
      _add_batch(digest, batch)
      count += 1
  finally:
    iterator.close()
  digest.update(str(count).encode())
  return digest.hexdigest()


def _files(folder: pathlib.Path, *, skip: tuple[str, ...] = ()) -> str:
  """The digest of every file of ``folder`` but the packing caches (names and bytes)."""
  digest = hashlib.sha256()
  for path in sorted(folder.iterdir()):
    if path.is_file() and not path.name.startswith("packing-") and path.name not in skip:
      digest.update(path.name.encode() + b"\0" + path.read_bytes())
  return digest.hexdigest()


def _packing(folder: pathlib.Path) -> str:
  """The digest of the packing caches' names and arrays (``np.savez`` stamps the zip entries
  with the time they were written, so the files' bytes differ between runs)."""
  digest = hashlib.sha256()
  for path in sorted(folder.glob("packing-*.npz")):
    with np.load(path) as cached:
      digest.update(path.name.encode())
      for name in sorted(cached.files):
        digest.update(name.encode() + cached[name].tobytes())
  return digest.hexdigest()


def outputs(multi30k_tiny: pathlib.Path, data_dir: pathlib.Path) -> dict[str, str]:
  """Every case's digest (the keys of ``GOLDEN``)."""
  tokenizer = WordIds()
  base = DataConfig(manual_dir=str(multi30k_tiny), data_dir=str(data_dir), vocab_size=1000,
                    max_source_len=20, max_target_len=20, bucket_lengths=(8, 12, 16, 20),
                    batch_tokens=320, batch_multiple=8, eval_batch_size=16, shuffle_seed=3)
  packed = dataclasses.replace(base, packing=True, too_long="truncate")
  files = dataclasses.replace(packed, train_files=str(multi30k_tiny / "train.{lang}"))
  got = {}
  for name, config in (("bucketed", base), ("packed", packed)):
    got[name] = _batches(config)
    again = _batches(dataclasses.replace(config, num_workers=2))
    assert again == got[name], f"{name}: 2 grain workers gave other batches than threads"
  got["text path"] = _batches(dataclasses.replace(base, tokenize_once=False))
  got["host 1 of 2"] = _batches(base, shard_index=1, shard_count=2)
  got["train_files packed"] = _batches(files)
  digest = hashlib.sha256()
  for batch in make_eval_batches(base, tokenizer):
    _add_batch(digest, batch)
  got["eval batches"] = digest.hexdigest()
  ids = prepared.prepare_ids(base, tokenizer)
  got["prepared ids"] = _files(ids.directory)
  got["packing cache"] = _packing(ids.directory)
  # The folder of the user's files is named for their paths and times, which meta.json
  # holds; the shards and the index are the ids.
  got["train_files ids"] = _files(prepared.prepare_ids(files, tokenizer).directory,
                                  skip=("meta.json",))
  _, bucketed_stats = make_train_dataset(base, tokenizer)
  _, packed_stats = make_train_dataset(packed, tokenizer)
  got["stats"] = hashlib.sha256(f"{bucketed_stats} {packed_stats}".encode()).hexdigest()
  return got


def test_the_data_path_gives_the_same_bytes(multi30k_tiny, tmp_path):
  got = outputs(multi30k_tiny, tmp_path)
  assert got["text path"] == got["bucketed"]  # both paths promise the same batches
  assert {name: got[name] for name in GOLDEN} == GOLDEN
