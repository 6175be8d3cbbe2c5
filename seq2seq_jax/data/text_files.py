"""Aligned text files: one sentence per line, one file per language and split.

``read_aligned`` reads ``{split}.{lang}`` files (plain or ``.gz``) strictly and
raises ``DataError`` naming the file, the line and the fix for anything a
training run would otherwise get silently wrong: invalid UTF-8, an empty file,
an empty line, files of different line counts. Nothing is dropped or repaired.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import pathlib
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np


class DataError(ValueError):
  """Bad input data; the message names the file (and line) and how to fix it."""


def split_files(directory: str | pathlib.Path, langs: Iterable[str]) -> dict[str, dict[str, pathlib.Path]]:
  """Finds ``{split}.{lang}`` (or ``.gz``) files in ``directory``.

  Args:
    directory: folder holding the files.
    langs: language codes to look for.

  Returns:
    ``{split: {lang: path}}`` for every split with at least one of ``langs``;
    splits are sorted by name, languages keep their order in ``langs``.
  """
  directory = pathlib.Path(directory).expanduser()
  if not directory.is_dir():
    raise DataError(f"{directory} is not a directory: pass the folder that holds the "
                    "{split}.{lang} text files (e.g. train.de, train.en)")
  found: dict[str, dict[str, pathlib.Path]] = {}
  for path in sorted(directory.iterdir()):
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    split, _, lang = name.rpartition(".")
    if not split or lang not in langs or not path.is_file():
      continue
    if lang in found.get(split, {}):
      raise DataError(f"{directory} holds both {name} and {name}.gz: keep only one of them")
    found.setdefault(split, {})[lang] = path
  return {split: {lang: files[lang] for lang in langs if lang in files}
          for split, files in sorted(found.items())}


def read_bytes(path: str | pathlib.Path) -> bytes:
  """The file's bytes, decompressed when the name ends in ``.gz``."""
  path = pathlib.Path(path)
  data = path.read_bytes()
  return gunzip(data, str(path)) if path.name.endswith(".gz") else data


def gunzip(data: bytes, name: str) -> bytes:
  """Decompresses gzip ``data``; ``name`` (file or URL) goes into the error message."""
  try:
    return gzip.decompress(data)
  except (OSError, EOFError) as e:
    raise DataError(f"{name}: not a readable gzip file ({e}); download it again or "
                    "pass the decompressed text file") from e


def invalid_utf8(name: str, line: int, column: int, reason: str) -> DataError:
  """The error for bytes that are not UTF-8 at ``line`` (1-based), byte ``column`` (1-based)."""
  return DataError(f"{name}: line {line}, byte {column}: invalid UTF-8 ({reason}); re-encode "
                   "the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)")


def decode_line(raw: bytes, name: str, number: int) -> str:
  """One line of a file as text, without its ``\\n`` or ``\\r\\n``; a UTF-8 byte order
  mark on line 1 is dropped.

  Raises:
    DataError: the bytes are not UTF-8 (naming the file, the line and the byte).
  """
  if raw.endswith(b"\n"):
    raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise invalid_utf8(name, number, e.start + 1, e.reason) from e
  return text[1:] if number == 1 and text.startswith("\ufeff") else text


def decode_lines(data: bytes, name: str) -> list[str]:
  """Splits UTF-8 text into its lines, rejecting what cannot be a sentence per line.

  Args:
    data: the file's bytes.
    name: the file name used in error messages (e.g. ``train.en``).

  Returns:
    The lines without their ``\\n`` (or ``\\r\\n``) ends, text otherwise unchanged.

  Raises:
    DataError: invalid UTF-8, an empty file, or an empty line; the message names
      the file, the line number (1-based) and the fix.
  """
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    raise invalid_utf8(name, line, column, e.reason) from e
  if text.startswith("\ufeff"):
    text = text[1:]  # a UTF-8 byte order mark is not part of the first sentence
  if text.endswith("\n"):
    text = text[:-1]
  if not text.strip():
    raise DataError(f"{name}: the file is empty; it must hold one sentence per line, "
                    "aligned with the other language's file")
  lines = text.split("\n")
  for number, line in enumerate(lines, 1):
    if line.endswith("\r"):
      line = lines[number - 1] = line[:-1]
    if not line.strip():
      raise DataError(f"{name}: line {number} is empty; every line must hold a sentence "
                      "aligned with the same line of the other language's file: delete the "
                      "line from both files or fill it in")
  return lines


def read_aligned(files: Mapping[str, str | pathlib.Path]) -> dict[str, list[str]]:
  """Reads line-aligned files of one split.

  Args:
    files: ``{lang: path}``, e.g. ``{"de": ".../train.de", "en": ".../train.en"}``.

  Returns:
    ``{lang: lines}`` with equally many lines per language; line i of one
    language translates line i of the other.

  Raises:
    DataError: as ``decode_lines``, or when the line counts differ (both files
      and both counts are named).
  """
  texts = {lang: decode_lines(read_bytes(path), pathlib.Path(path).name)
           for lang, path in files.items()}
  counts = {lang: len(lines) for lang, lines in texts.items()}
  if len(set(counts.values())) > 1:
    described = ", ".join(f"{pathlib.Path(files[lang]).name} has {n}" for lang, n in counts.items())
    raise DataError(f"line counts differ: {described} lines; the files must be line-aligned "
                    "(line i of one translates line i of the other): fix the file with the "
                    "extra or missing lines")
  return texts


def sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def content_key(checksums: Mapping[str, str]) -> str:
  """A short key of a set of files from their names and sha256 checksums.

  Args:
    checksums: ``{file name: sha256 of its decompressed text}``, e.g.
      ``{"train.de": "2c2b...", ...}``.

  Returns:
    12 hex digits; equal for equal contents wherever the files came from.
  """
  listing = "\n".join(f"{name} {checksums[name]}" for name in sorted(checksums))
  return hashlib.sha256(listing.encode()).hexdigest()[:12]


def _open_lines(path: pathlib.Path):
  return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def stream_aligned(files: Mapping[str, pathlib.Path], langs: Sequence[str], *, chunk: int = 4096,
                   drop_empty: bool = False, counts: dict[str, int] | None = None
                   ) -> Iterator[tuple[np.ndarray, list[str], list[str]]]:
  """Reads one pair of line-aligned files (plain or gzip) without holding them in memory.

  Args:
    files: ``{lang: path}`` of one shard.
    langs: ``(source, target)``: the order of the sides yielded.
    chunk: pairs per yielded block.
    drop_empty: leave out pairs with an empty side (counted) instead of raising.
    counts: ``"lines"`` (pairs read so far, over all shards: line numbers continue
      from it) and ``"empty_dropped"``, updated as it reads.

  Yields:
    ``(lines_C, sources, targets)``: the 0-based lines (continuing ``counts["lines"]``)
    and text of the pairs kept.

  Raises:
    DataError: invalid UTF-8, an empty line (unless dropped), a truncated gzip file,
      or files of different lengths; each names the file and the line.
  """
  counts = {} if counts is None else counts
  counts.setdefault("lines", 0)
  counts.setdefault("empty_dropped", 0)
  source_path, target_path = (pathlib.Path(files[lang]) for lang in langs)
  lines: list[int] = []
  sources: list[str] = []
  targets: list[str] = []
  first = counts["lines"]
  number = 0
  try:
    with _open_lines(source_path) as source_file, _open_lines(target_path) as target_file:
      for number, (raw_source, raw_target) in enumerate(
          itertools.zip_longest(source_file, target_file), 1):
        if raw_source is None or raw_target is None:
          short, long = ((source_path, target_path) if raw_source is None
                         else (target_path, source_path))
          raise DataError(f"line counts differ: {short} ends after line {number - 1}, {long} goes "
                          f"on: the files must be line-aligned; fix the file with the extra or "
                          "missing lines")
        source = decode_line(raw_source, str(source_path), number)
        target = decode_line(raw_target, str(target_path), number)
        if not source.strip() or not target.strip():
          if not drop_empty:
            empty = source_path if not source.strip() else target_path
            raise DataError(f"{empty}: line {number} is empty; delete the line from both files, "
                            "or set DataConfig.empty_lines='drop' to leave such pairs out "
                            "(they are counted)")
          counts["empty_dropped"] += 1
        else:
          lines.append(first + number - 1)
          sources.append(source)
          targets.append(target)
        if len(sources) == chunk:
          yield np.asarray(lines, np.int64), sources, targets
          lines, sources, targets = [], [], []
  except (OSError, EOFError) as e:  # gzip: a truncated or corrupt stream
    raise DataError(f"{source_path} / {target_path}: unreadable after line {number} ({e}); "
                    "download or decompress the file again") from e
  counts["lines"] = first + number
  if sources:
    yield np.asarray(lines, np.int64), sources, targets
