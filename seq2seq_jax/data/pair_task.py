"""A translation-pair detection task with hard negatives, for decomposable attention.

Given a (source, target) sentence pair, tell whether the target translates the
source. Each true pair is matched by a false one whose target is a near neighbour
of the true target: within a token or so of its length and sharing as many (IDF
weighted) words with it as possible, so neither length nor shared names or numbers
give the answer away. Tokens are lowercased words and punctuation (no subwords).
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import re

import numpy as np
import scipy.sparse

from seq2seq_jax.types import PAD_ID, UNK_ID

_TOKEN = re.compile(r"\w+|[^\w\s]")
_FIRST_WORD_ID = 4  # ids 0-3 are PAD, BOS, EOS, UNK as everywhere in the library


def tokenize(text: str) -> list[str]:
  """Lowercased words and single punctuation marks: ``"A dog." -> ["a", "dog", "."]``."""
  return _TOKEN.findall(text.lower())


def read_parallel(directory: str | pathlib.Path, split: str, source_lang: str = "de",
                  target_lang: str = "en") -> tuple[list[str], list[str]]:
  """Reads ``{split}.{source_lang}`` and ``{split}.{target_lang}``, aligned line by line.

  Raises:
    FileNotFoundError: a file is missing.
    ValueError: the line counts differ (names both files and counts).
  """
  directory = pathlib.Path(directory)
  sides = []
  for lang in (source_lang, target_lang):
    path = directory / f"{split}.{lang}"
    if not path.exists():
      raise FileNotFoundError(f"{path} not found: expected aligned files {split}.{source_lang} "
                              f"and {split}.{target_lang} in {directory}")
    sides.append(path.read_text(encoding="utf-8").rstrip("\n").split("\n"))
  if len(sides[0]) != len(sides[1]):
    raise ValueError(f"{directory}/{split}.{source_lang} has {len(sides[0])} lines but "
                     f"{split}.{target_lang} has {len(sides[1])}; the files must be aligned")
  return sides[0], sides[1]


@dataclasses.dataclass(frozen=True)
class WordVocab:
  """A joint word vocabulary: ids 0-3 reserved (PAD, BOS, EOS, UNK), words from 4 on."""

  words: tuple[str, ...]

  @classmethod
  def build(cls, sentences: list[list[str]], *, min_count: int = 1) -> WordVocab:
    """Words seen at least ``min_count`` times, most frequent first (ties alphabetical)."""
    counts = collections.Counter(word for sentence in sentences for word in sentence)
    kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return cls(tuple(kept))

  def __post_init__(self):
    object.__setattr__(self, "_ids", {w: i + _FIRST_WORD_ID for i, w in enumerate(self.words)})

  @property
  def size(self) -> int:
    return len(self.words) + _FIRST_WORD_ID

  def encode(self, sentences: list[list[str]], max_len: int) -> tuple[np.ndarray, int]:
    """int32 ids ``[N, max_len]`` right padded with PAD, and how many rows were truncated."""
    ids = np.full((len(sentences), max_len), PAD_ID, dtype=np.int32)
    truncated = 0
    for row, sentence in enumerate(sentences):
      truncated += len(sentence) > max_len
      for col, word in enumerate(sentence[:max_len]):
        ids[row, col] = self._ids.get(word, UNK_ID)
    return ids, truncated


def hard_negatives(sentences: list[list[str]], *, num_candidates: int = 5,
                   max_length_difference: int = 1, chunk_size: int = 1024) -> np.ndarray:
  """For each sentence, the indices of its ``num_candidates`` nearest other sentences.

  Nearness is the IDF-weighted sum over the word types two sentences share, among
  sentences whose token counts differ by at most ``max_length_difference`` (when a
  sentence has too few such neighbours the length limit is dropped for it). Exact
  duplicates of the sentence's text are never chosen.

  Returns:
    int64 ``[N, num_candidates]``, best first.
  """
  n = len(sentences)
  if n <= num_candidates:
    raise ValueError(f"need more than num_candidates={num_candidates} sentences; got {n}")
  types = [sorted(set(s)) for s in sentences]
  index = {w: i for i, w in enumerate(sorted({w for t in types for w in t}))}
  rows = np.repeat(np.arange(n), [len(t) for t in types])
  cols = np.array([index[w] for t in types for w in t], dtype=np.int64)
  binary = scipy.sparse.csr_matrix((np.ones(len(cols), np.float32), (rows, cols)),
                                   shape=(n, len(index)))
  document_frequency = np.asarray(binary.sum(axis=0)).ravel()
  idf = np.log(n / document_frequency).astype(np.float32)
  weighted = binary @ scipy.sparse.diags(idf)
  lengths = np.array([len(s) for s in sentences])
  text_ids = np.unique([" ".join(s) for s in sentences], return_inverse=True)[1]
  neighbours = np.empty((n, num_candidates), dtype=np.int64)
  for start in range(0, n, chunk_size):
    stop = min(start + chunk_size, n)
    overlap = (weighted[start:stop] @ binary.T).toarray()
    # Lift every in-length candidate above every out-of-length one, so the length
    # limit holds wherever enough candidates meet it.
    near = np.abs(lengths[start:stop, None] - lengths[None, :]) <= max_length_difference
    score = overlap + np.where(near, 1e6, 0.0)
    score[text_ids[start:stop, None] == text_ids[None, :]] = -np.inf  # itself and duplicates
    top = np.argpartition(-score, num_candidates, axis=1)[:, :num_candidates]
    order = np.argsort(-np.take_along_axis(score, top, axis=1), axis=1, kind="stable")
    neighbours[start:stop] = np.take_along_axis(top, order, axis=1)
  return neighbours


@dataclasses.dataclass(frozen=True)
class PairSplit:
  """One split: token ids of both sides and the hard-negative table of the targets."""

  source_ids: np.ndarray  # int32 [N, max_len]
  target_ids: np.ndarray  # int32 [N, max_len]
  neighbours: np.ndarray  # int64 [N, num_candidates]: near-duplicate targets, best first
  truncated: int  # sentences cut to max_len (either side)

  def __len__(self) -> int:
    return len(self.source_ids)

  def pairs(self, rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
    """Every true pair plus one hard negative per source sentence (label 1 = translation).

    Args:
      rng: draws each negative among the candidates (fresh negatives each epoch);
        None takes the nearest, a fixed set for evaluation.

    Returns:
      ``(a_ids [2N, L], b_ids [2N, L], labels [2N])``, true pairs first.
    """
    n = len(self)
    if rng is None:
      choice = self.neighbours[:, 0]
    else:
      choice = self.neighbours[np.arange(n), rng.integers(0, self.neighbours.shape[1], n)]
    a_ids = np.concatenate([self.source_ids, self.source_ids])
    b_ids = np.concatenate([self.target_ids, self.target_ids[choice]])
    labels = np.concatenate([np.ones(n, np.int32), np.zeros(n, np.int32)])
    return a_ids, b_ids, labels


@dataclasses.dataclass(frozen=True)
class PairTask:
  """The vocabulary and the prepared splits of a pair-detection task."""

  vocab: WordVocab
  splits: dict[str, PairSplit]
  max_len: int


def build_pair_task(directory: str | pathlib.Path, *, train_split: str = "train",
                    eval_splits: tuple[str, ...] = ("val", "test_2016_flickr"),
                    source_lang: str = "de", target_lang: str = "en", max_len: int = 48,
                    min_count: int = 2, num_candidates: int = 5,
                    max_length_difference: int = 1, limit: int = 0) -> PairTask:
  """Reads a parallel corpus and prepares the pair task.

  The vocabulary comes from the training split only (both languages, words seen
  ``min_count`` times). Negatives of each split are drawn from that split's own
  targets, so no evaluation sentence ever appears in training.

  Args:
    directory: folder of aligned ``{split}.{lang}`` files (e.g. multi30k/raw).
    train_split: split for the vocabulary and training.
    eval_splits: held-out splits.
    source_lang: language of the first sentence.
    target_lang: language of the second sentence (the one negatives replace).
    max_len: token limit of a sentence; longer ones are truncated (counted).
    min_count: vocabulary threshold.
    num_candidates: negatives to draw from per sentence.
    max_length_difference: largest token-count difference of a negative.
    limit: if > 0, use only the first ``limit`` lines of every split (tests).
  """
  tokenized = {}
  for split in (train_split, *eval_splits):
    source, target = read_parallel(directory, split, source_lang, target_lang)
    if limit:
      source, target = source[:limit], target[:limit]
    tokenized[split] = ([tokenize(s) for s in source], [tokenize(t) for t in target])
  vocab = WordVocab.build(tokenized[train_split][0] + tokenized[train_split][1],
                          min_count=min_count)
  splits = {}
  for split, (source, target) in tokenized.items():
    source_ids, cut_source = vocab.encode(source, max_len)
    target_ids, cut_target = vocab.encode(target, max_len)
    neighbours = hard_negatives(target, num_candidates=num_candidates,
                                max_length_difference=max_length_difference)
    splits[split] = PairSplit(source_ids, target_ids, neighbours, cut_source + cut_target)
  return PairTask(vocab, splits, max_len)

