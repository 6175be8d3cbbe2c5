"""A joint sentencepiece vocabulary for source and target, trained on the training split.

Ids follow ``seq2seq_jax.types``: PAD 0, BOS 1, EOS 2, UNK 3, passed to the
trainer explicitly (sentencepiece's own defaults differ). Text is not
normalized and whitespace is kept, so ``decode(encode(x)) == x`` for every
sentence whose characters the vocabulary covers (all of the training text).

Example:
  >>> tokenizer = train_tokenizer(DataConfig(manual_dir="../shared/data/multi30k_tiny",
  ...                                        vocab_size=500))  # prepares the corpus once
  Downloading and preparing dataset ...
  >>> ids = tokenizer.encode("Ein Hund läuft.")  # pieces only; the pipeline appends EOS
  >>> tokenizer.decode(ids + [EOS_ID, PAD_ID])
  'Ein Hund läuft.'
  >>> tokenizer.save("run/tokenizer.model")
  >>> Tokenizer.load("run/tokenizer.model").encode("Ein Hund läuft.") == ids
  True
"""

from __future__ import annotations

import base64
import io
import logging
import os
import pathlib
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.types import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# Training reads at most this many pairs (a fixed random sample of larger splits).
MAX_TRAINING_PAIRS = 1_000_000

_log = logging.getLogger(__name__)


class Tokenizer:
  """Text <-> ids with a sentencepiece model; picklable (grain workers) and saveable.

  Besides ``encode`` / ``decode`` it has the methods every tokenizer of the library
  has (the pretrained ones too), which the pipeline, the trainer and the Translator
  use: ``encode_source``, ``encode_target``, ``target_prefix``, ``decode_batch``,
  the ids ``pad_id``, ``eos_id``, ``unk_id`` and ``languages``.

  Attributes:
    vocab_size: number of ids, the 4 reserved ones included.
  """

  pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
  languages: tuple[str, ...] = ()  # one language pair: no language codes

  def __init__(self, model_proto: bytes):
    self._proto = bytes(model_proto)
    self._processor = spm.SentencePieceProcessor(model_proto=self._proto)
    reserved = {PAD_ID: self._processor.pad_id(), BOS_ID: self._processor.bos_id(),
                EOS_ID: self._processor.eos_id(), UNK_ID: self._processor.unk_id()}
    if any(want != got for want, got in reserved.items()):
      raise ValueError(f"this sentencepiece model has PAD/BOS/EOS/UNK ids {list(reserved.values())}, "
                       f"the library needs {list(reserved)}: train it with train_tokenizer")
    self.vocab_size = self._processor.get_piece_size()

  def __getstate__(self):
    return {"proto": self._proto}

  def __setstate__(self, state):
    self.__init__(state["proto"])

  def __eq__(self, other) -> bool:
    return isinstance(other, Tokenizer) and self._proto == other._proto

  def __repr__(self) -> str:
    return f"Tokenizer(vocab_size={self.vocab_size})"

  def to_bytes(self) -> bytes:
    """The serialized sentencepiece model (what ``save`` writes)."""
    return self._proto

  @classmethod
  def from_bytes(cls, model_proto: bytes) -> Tokenizer:
    return cls(model_proto)

  def save(self, path: str | os.PathLike) -> None:
    """Writes the model to ``path`` (e.g. ``run_dir/tokenizer.model``), creating folders."""
    path = pathlib.Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(self._proto)
    partial.replace(path)

  @classmethod
  def load(cls, path: str | os.PathLike) -> Tokenizer:
    path = pathlib.Path(path).expanduser()
    if not path.is_file():
      raise FileNotFoundError(f"{path}: no tokenizer model; train one with train_tokenizer "
                              "(or `seq2seq-jax prepare`) or point to the run's tokenizer.model")
    return cls(path.read_bytes())

  def encode(self, text: str) -> list[int]:
    """Piece ids of ``text``, without EOS."""
    return self._processor.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Piece ids of each text, without EOS."""
    return self._processor.encode(list(texts))

  @property
  def source_vocab_size(self) -> int:
    return self.vocab_size

  def encode_source(self, texts: Sequence[str], lang: str | None = None, *,
                    target_lang: str | None = None) -> list[list[int]]:
    """Model inputs: each text's pieces and EOS. ``lang`` and ``target_lang`` must be
    None (one pair)."""
    self._no_language(lang)
    self._no_language(target_lang)
    return [ids + [EOS_ID] for ids in self.encode_batch(texts)]

  def encode_target(self, texts: Sequence[str], lang: str | None = None) -> list[list[int]]:
    """Decoder targets: each text's pieces and EOS. ``lang`` must be None (one pair)."""
    self._no_language(lang)
    return [ids + [EOS_ID] for ids in self.encode_batch(texts)]

  def target_prefix(self, lang: str | None = None) -> list[int]:
    """Ids forced at the start of every output: none for this tokenizer."""
    self._no_language(lang)
    return []

  def _no_language(self, lang: str | None) -> None:
    if lang is not None:
      raise ValueError(f"language {lang!r} given, but this tokenizer serves one language pair "
                       "(a run's joint vocabulary) and has no language codes")

  def decode(self, ids: Iterable[int]) -> str:
    """Text of ``ids``: stops at the first EOS, skips PAD and BOS.

    Args:
      ids: a 1-D sequence or array of ids, e.g. one row of ``[B, T]`` output.
    """
    pieces = []
    for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
      if i == EOS_ID:
        break
      if i in (PAD_ID, BOS_ID):
        continue
      if not 0 <= i < self.vocab_size:
        raise ValueError(f"id {i} is outside this tokenizer's vocabulary [0, {self.vocab_size}): "
                         "the model's vocab_size must equal the tokenizer's")
      pieces.append(i)
    return self._processor.decode(pieces)

  def decode_batch(self, ids_BT) -> list[str]:
    """Text of each row of ``ids_BT`` (int ``[B, T]``)."""
    return [self.decode(row) for row in np.asarray(ids_BT)]

  def id_to_piece(self, i: int) -> str:
    return self._processor.id_to_piece(i)


def train_tokenizer_from_text(sentences: Iterable[str], vocab_size: int, *,
                              model_type: str = "unigram") -> Tokenizer:
  """Trains a sentencepiece model on ``sentences`` with the library's reserved ids.

  Args:
    sentences: training sentences of both languages (a joint vocabulary).
    vocab_size: number of ids including PAD/BOS/EOS/UNK.
    model_type: sentencepiece's "unigram" or "bpe".

  Raises:
    ValueError: ``vocab_size`` is more than this text can fill (the message gives
      the largest size that works).
  """
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        character_coverage=1.0,  # every training character gets a piece: no UNK in training text
        normalization_rule_name="identity", remove_extra_whitespaces=False,  # exact round trip
        input_sentence_size=2 * MAX_TRAINING_PAIRS, shuffle_input_sentence=True,
        num_threads=max(1, min(8, os.cpu_count() or 1)), minloglevel=2)
  except RuntimeError as e:
    limit = re.search(r"value <= (\d+)", str(e))
    if limit:
      raise ValueError(f"DataConfig.vocab_size={vocab_size} is more than this training text can "
                       f"fill: set it to at most {limit.group(1)}") from e
    raise
  return Tokenizer(model.getvalue())


def training_sentences(pairs, *, max_pairs: int = MAX_TRAINING_PAIRS,
                       seed: int = 0) -> Iterator[str]:
  """Source and target sentences of ``pairs`` (a ``TextPairs``), a fixed sample if large."""
  count = len(pairs)
  if count > max_pairs:
    indices = np.sort(np.random.default_rng(seed).choice(count, max_pairs, replace=False))
  else:
    indices = np.arange(count)
  for start in range(0, len(indices), 4096):
    for source, target in pairs.__getitems__(indices[start:start + 4096].tolist()):
      yield source
      yield target


def _first_sentences(chunks, max_pairs: int = MAX_TRAINING_PAIRS) -> Iterator[str]:
  """Source and target sentences of the first ``max_pairs`` pairs of ``chunks`` (a
  ``sources.SplitSource``, read in order)."""
  taken = 0
  for chunk in chunks:
    for source, target in zip(chunk.sources[:max_pairs - taken], chunk.targets[:max_pairs - taken]):
      yield source
      yield target
    taken += min(len(chunk.sources), max_pairs - taken)
    if taken >= max_pairs:
      return


def train_tokenizer(data_config: DataConfig, *, model_type: str = "unigram") -> Tokenizer:
  """Trains the joint vocabulary of ``data_config.vocab_size`` on its training split.

  Prepares the corpus first if needed (see ``sources.SplitSource.pairs``). With
  ``data_config.train_files`` it reads the first ``MAX_TRAINING_PAIRS`` pairs of those
  files instead (in shard order: shuffle the shards' contents if their order is
  not random).
  """
  from seq2seq_jax.data import sources  # builders import tfds; keep this module light
  source = sources.resolve(data_config, data_config.train_split)
  if data_config.train_files:
    tokenizer = train_tokenizer_from_text(_first_sentences(source),
                                          data_config.vocab_size, model_type=model_type)
    _log.info("trained a %d-piece sentencepiece vocabulary on %s", tokenizer.vocab_size,
              data_config.train_files)
    return tokenizer
  pairs = source.pairs()
  tokenizer = train_tokenizer_from_text(training_sentences(pairs), data_config.vocab_size,
                                        model_type=model_type)
  _log.info("trained a %d-piece sentencepiece vocabulary on %s", tokenizer.vocab_size, pairs)
  return tokenizer


def load_or_train_tokenizer(data_config: DataConfig, path: str | os.PathLike) -> Tokenizer:
  """Loads the run's tokenizer from ``path``, or trains it and saves it there.

  Raises:
    ValueError: the saved tokenizer's size differs from ``data_config.vocab_size``.
  """
  path = pathlib.Path(path).expanduser()
  if path.is_file():
    tokenizer = Tokenizer.load(path)
    if tokenizer.vocab_size != data_config.vocab_size:
      raise ValueError(f"{path} holds a vocabulary of {tokenizer.vocab_size} pieces but "
                       f"DataConfig.vocab_size={data_config.vocab_size}: set vocab_size to "
                       f"{tokenizer.vocab_size}, or delete {path} to train a new one")
    return tokenizer
  tokenizer = train_tokenizer(data_config)
  tokenizer.save(path)
  return tokenizer


def tokenizer_to_json(tokenizer: Any) -> dict[str, Any]:
  """A tokenizer as JSON, as checkpoints and exported artifacts store it: the run's
  sentencepiece model, or a pretrained checkpoint's tokenizer (``to_dict()``, with its
  ``kind``)."""
  if tokenizer is None:
    return {"sentencepiece_base64": None}
  if hasattr(tokenizer, "to_dict"):
    return {"pretrained": tokenizer.to_dict()}
  return {"sentencepiece_base64": base64.b64encode(tokenizer.to_bytes()).decode("ascii")}


def tokenizer_from_json(values: dict[str, Any]) -> Any:
  """Inverse of ``tokenizer_to_json``; None when nothing was stored."""
  if values.get("pretrained"):
    from seq2seq_jax.pretrained import tokenizers  # pylint: disable=import-outside-toplevel
    return tokenizers.tokenizer_from_dict(values["pretrained"])
  if values.get("sentencepiece_base64"):
    return Tokenizer.from_bytes(base64.b64decode(values["sentencepiece_base64"]))
  return None
