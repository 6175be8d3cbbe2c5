"""Where a corpus's text comes from, worked out once: the first stage of the data path.

The data path runs one way, each module importing only those before it: ``sources``
(this module, on ``text_files`` and the tfds ``builders``) -> ``prepared`` (token ids
written once) -> ``packing`` -> ``batches`` -> ``iterators`` (``plans`` holds what
packing's and the bucket plans share).

``resolve(data_config, split)`` works out, once, where a split comes from and gives a
``SplitSource``: the user's own files (``DataConfig.train_files``, matched into shards,
for the training split) or the tfds builder of the corpus (``multi30k``,
``parallel_text``, ``tfds:NAME``), the data dir, and the corpus's name in prepared
folders. The later stages take that result, and it hands them the text as data: a
``SplitSource`` is iterable, its pairs in order a ``TextChunk`` at a time (the
empty-lines rule applied, what it dropped counted in the chunks themselves).
``prepared`` names its folder after the source and writes those chunks as ids,
``tokenizer`` trains on the first of them, ``beam`` spreads the shards or ranges over
workers, and ``pairs()`` gives the tfds split (prepared once, when first read) for
random access. ``load_eval_text`` gives a split's raw sentences (for BLEU).

Example:
  >>> config = DataConfig(manual_dir="../shared/data/multi30k_tiny", vocab_size=500)
  >>> source = resolve(config, "val")
  >>> source.reads_files, source.name.startswith("multi30k/de-en_")
  (False, True)
  >>> pairs = source.pairs()  # prepares the corpus once
  Downloading and preparing dataset ...
  >>> len(pairs), load_eval_text(config).sources[0] == pairs[0][0]
  (50, True)
  >>> chunk = next(iter(source))  # the text in order, a TextChunk at a time
  >>> len(chunk.sources), chunk.dropped, chunk.sources[0] == pairs[0][0]
  (50, 0, True)
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import pathlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import text_files
from seq2seq_jax.data.text_files import DataError

if TYPE_CHECKING:
  from seq2seq_jax.data.builders import TextPairs

_CHUNK = 4096  # pairs read per chunk


class TextChunk(NamedTuple):
  """Pairs of a split in file order, as iterating its ``SplitSource`` reads them."""

  lines_C: np.ndarray  # int64 [C]: each kept pair's 0-based line in the whole split
  sources: list[str]  # [C] source sentences
  targets: list[str]  # [C] target sentences
  dropped: int  # pairs with an empty side left out since the chunk before (empty_lines="drop")


@dataclasses.dataclass(frozen=True, eq=False)
class SplitSource:
  """One split of a corpus and where its text comes from (``resolve`` works it out).

  Iterating it reads the text: the pairs in order, a ``TextChunk`` at a time.

  Attributes:
    data_config: the corpus, the languages, ``data_dir`` and ``empty_lines``.
    split: the split's name.
    data_dir: ``DataConfig.data_dir`` expanded, or the default
      (``builders.resolve_data_dir``).
    shards: ``DataConfig.train_files`` matched, one ``{lang: path}`` per shard
      (``train_file_shards``), when this is the training split of such a config;
      None for a tfds split.
    builder: the corpus's tfds builder (``builders.get_builder``, not prepared yet);
      None for the user's own files.
    name: the ``corpus`` part of a prepared folder (``prepared``): the tfds dataset,
      its config and version, or ``files/`` and 12 hex digits of the files' paths,
      sizes and modification times.
  """

  data_config: DataConfig
  split: str
  data_dir: str
  shards: tuple[dict[str, pathlib.Path], ...] | None
  builder: Any
  name: str

  @property
  def reads_files(self) -> bool:
    """Whether the text is the user's own files (else a tfds split)."""
    return self.shards is not None

  def pairs(self) -> TextPairs:
    """The split's pairs of the tfds corpus in file order, preparing the corpus first if
    needed (``builders.load_split``, with this source's builder)."""
    from seq2seq_jax.data import builders  # tfds is slow to import
    # The user's own files have no builder: their tfds corpus, as load_split reads it.
    builder = self.builder if self.builder is not None else builders.get_builder(
        self.data_config)
    return builders.split_pairs(builders.prepare_builder(builder, self.data_config),
                                self.data_config, self.split)

  def __iter__(self) -> Iterator[TextChunk]:
    """The split's pairs in order, ``_CHUNK`` at a time: the text ``prepared`` writes as ids.

    A pair with an empty (or blank) side is refused (``DataError`` naming the file and
    line, or the split and pair) or, with ``DataConfig.empty_lines="drop"``, left out and
    counted in the ``dropped`` of the next chunk; a last chunk without pairs counts those
    after the last pair kept. So the chunks' pairs and their ``dropped`` add up to every
    pair read, and a pass needs no counter beside it.
    """
    data_config = self.data_config
    drop = data_config.empty_lines == "drop"
    counts: dict[str, int] = {"lines": 0, "empty_dropped": 0}
    if self.shards is None:
      pairs = self.pairs()
      chunks = pair_range_chunks(pairs, 0, len(pairs), chunk=_CHUNK, drop_empty=drop,
                                 counts=counts)
    else:
      langs = (data_config.source_lang, data_config.target_lang)
      chunks = (chunk for shard in self.shards
                for chunk in text_files.stream_aligned(shard, langs, chunk=_CHUNK,
                                                       drop_empty=drop, counts=counts))
    counted = 0  # the pairs dropped that a chunk has reported
    for lines_C, sources, targets in chunks:
      yield TextChunk(lines_C, sources, targets, dropped=counts["empty_dropped"] - counted)
      counted = counts["empty_dropped"]
    if counts["empty_dropped"] > counted:
      yield TextChunk(np.zeros(0, np.int64), [], [], dropped=counts["empty_dropped"] - counted)


def resolve(data_config: DataConfig, split: str | None = None) -> SplitSource:
  """Where ``split`` (default: the training split) of ``data_config``'s corpus comes from.

  The user's files (``DataConfig.train_files``) are matched, or the tfds builder is
  made (not prepared: ``SplitSource.pairs`` prepares the corpus when it is read).

  Raises:
    DataError: ``train_files`` matches nothing, or a shard has no partner (both named);
      ``DataConfig.manual_dir`` or ``dataset`` name no usable corpus.
  """
  from seq2seq_jax.data import builders  # tfds is slow to import
  split = split or data_config.train_split
  data_dir = builders.resolve_data_dir(data_config)
  if data_config.train_files and split == data_config.train_split:
    shards = tuple(train_file_shards(data_config))
    listing = []
    for shard in shards:
      for lang, path in sorted(shard.items()):
        stat = path.stat()
        listing.append(f"{lang} {path.resolve()} {stat.st_size} {stat.st_mtime_ns}")
    name = "files/" + hashlib.sha256("\n".join(listing).encode()).hexdigest()[:12]
    return SplitSource(data_config=data_config, split=split, data_dir=data_dir, shards=shards,
                       builder=None, name=name)
  builder = builders.get_builder(data_config)
  config_name = builder.builder_config.name if builder.builder_config else "default"
  return SplitSource(data_config=data_config, split=split, data_dir=data_dir, shards=None,
                     builder=builder, name=f"{builder.name}/{config_name}/{builder.version}")


def train_file_shards(data_config: DataConfig) -> list[dict[str, pathlib.Path]]:
  """``DataConfig.train_files`` matched: one ``{lang: path}`` per shard.

  The pattern is a path glob with ``{lang}`` for the language code (e.g.
  ``train-*.{lang}.gz``); a shard's two files agree on every wildcard. Shards are
  sorted by the source language's path.

  Raises:
    DataError: nothing matches, or a shard of one language has no partner in the
      other (both paths named).
  """
  pattern = os.path.expanduser(data_config.train_files)
  first, second = data_config.source_lang, data_config.target_lang
  keys: dict[str, dict[tuple[str, ...], str]] = {}
  for lang in (first, second):
    regex = _glob_regex(pattern, lang)
    keys[lang] = {}
    for path in sorted(glob.glob(pattern.replace("{lang}", lang))):
      match = regex.match(path)
      if match:
        keys[lang][match.groups()] = path
  if not keys[first] and not keys[second]:
    raise DataError(f"DataConfig.train_files={pattern!r} matches no file for {first} or {second}: "
                    "check the path; '{lang}' stands for the language code")
  for lang, other in ((first, second), (second, first)):
    for key, path in keys[lang].items():
      if key not in keys[other]:
        partner = _fill(pattern, other, key)
        raise DataError(f"{path} has no partner {partner}: every {lang} shard needs its "
                        f"{other} translation, line by line; add it or move {path} away")
  return [{first: pathlib.Path(keys[first][key]), second: pathlib.Path(keys[second][key])}
          for key in sorted(keys[first], key=lambda k: keys[first][k])]


def _glob_regex(pattern: str, lang: str) -> re.Pattern:
  """A regex of ``pattern`` (``*``, ``?`` and ``[...]`` as in glob) with ``{lang}`` filled in;
  each wildcard is a group."""
  out = []
  for piece in re.split(r"(\*|\?|\[[^\]]*\]|\{lang\})", pattern):
    if piece == "*":
      out.append("([^/]*)")
    elif piece == "?":
      out.append("([^/])")
    elif piece.startswith("[") and piece.endswith("]") and len(piece) > 2:
      body = piece[1:-1]
      out.append("([" + ("^" + body[1:] if body.startswith("!") else body) + "])")
    elif piece == "{lang}":
      out.append(re.escape(lang))
    else:
      out.append(re.escape(piece))
  return re.compile("".join(out) + r"\Z")


def _fill(pattern: str, lang: str, groups: tuple[str, ...]) -> str:
  """``pattern`` with ``{lang}`` and its wildcards filled in: the partner a shard lacks."""
  values = iter(groups)
  return re.sub(r"\*|\?|\[[^\]]*\]|\{lang\}",
                lambda m: lang if m.group(0) == "{lang}" else next(values), pattern)


def pair_range_chunks(pairs: Any, start: int, stop: int, *, chunk: int = _CHUNK,
                      drop_empty: bool = False, counts: dict[str, int] | None = None
                      ) -> Iterator[tuple[np.ndarray, list[str], list[str]]]:
  """Pairs ``start`` to ``stop`` of a tfds split (``builders.TextPairs``), ``chunk`` at a time.

  The tfds half of iterating a ``SplitSource``; the Beam pipeline reads one range per element.

  Yields:
    ``(lines_C, sources, targets)``: the 0-based indices in the split of the pairs kept.

  Raises:
    DataError: a pair with an empty side, unless ``drop_empty`` (then counted in
      ``counts["empty_dropped"]``); ``counts["lines"]`` grows by the pairs read.
  """
  counts = {} if counts is None else counts
  counts.setdefault("lines", 0)
  counts.setdefault("empty_dropped", 0)
  for first in range(start, stop, chunk):
    batch = pairs.__getitems__(list(range(first, min(first + chunk, stop))))
    keep = [i for i, (s, t) in enumerate(batch) if s.strip() and t.strip()]
    counts["lines"] += len(batch)
    if len(keep) < len(batch):
      if not drop_empty:
        bad = min(set(range(len(batch))) - set(keep))
        raise DataError(f"{pairs}: pair {first + bad} (0-based) has an empty side; set "
                        "DataConfig.empty_lines='drop' to leave such pairs out (they are counted)")
      counts["empty_dropped"] += len(batch) - len(keep)
    yield (np.asarray(keep, np.int64) + first, [batch[i][0] for i in keep],
           [batch[i][1] for i in keep])


@dataclasses.dataclass(frozen=True)
class EvalText:
  """Raw sentences of an evaluation split in file order (what BLEU compares against)."""

  sources: list[str]
  references: list[str]


def load_eval_text(data_config: DataConfig, split: str | None = None) -> EvalText:
  """Source sentences and references of a split, in file order, untokenized."""
  texts = list(resolve(data_config, split or data_config.eval_split).pairs())
  return EvalText(sources=[s for s, _ in texts], references=[t for _, t in texts])
