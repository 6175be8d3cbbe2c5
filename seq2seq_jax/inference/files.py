"""Whole files: read a window of lines, sort it by length, decode it on every device, write in order.

``translate_file`` holds one window of lines (``TranslateFileConfig.window_lines``)
in memory whatever the file's size. Each window is tokenized, sorted by length and
cut into token-budget batches of a few bucket shapes (``batching.plan_batches``),
which the Translator decodes over its device mesh, one batch ahead of the host.
Results are written in input order as soon as every line before them is done,
then flushed, and a small side record ``OUTPUT.progress.json`` says how many lines
and bytes are complete. After Ctrl-C or kill -9, the same call continues after
the last complete line: windows start at fixed multiples of ``window_lines`` and
a window's plan depends only on its lines, so every sentence is decoded in the
same batch as in an uninterrupted run and the finished file is byte-identical.
A record made with other settings (model, search, batching, input) is refused,
naming them.

Output lines: the translation; with ``scores``, ``TEXT ||| LOGPROB`` (the output's
total log-probability, EOS included); with ``n_best=K``, K lines ``INDEX ||| TEXT |||
SCORE`` per input (INDEX counts input lines from 0; SCORE is the beam's ranking
score, the log-probability divided by the GNMT length penalty; best first); with
``references``, the forced-decoding log-probability of each line of that file
given the same line of the input (``Translator.score``). ``prefixes`` and
``constraints`` name files aligned with the input as well: a target prefix per
line, and the phrases (tab-separated) each translation must contain (empty lines
for none; ``Translator.translate``'s ``target_prefix`` and ``constraints``). An
empty input line gives an empty output (K of them with n-best); invalid UTF-8 stops with an error naming
the line; a line longer than the translator's source limit (``max_source_len``) is
truncated with a warning naming it and the limit's origin.

Several hosts (``jax.distributed``): every host reads the input and plans the same
batches; each feeds and decodes its own share of every batch's rows on its
devices, and process 0 writes the one output.

Example:
  >>> from seq2seq_jax.training.sharding import make_mesh
  >>> translator = Translator.from_workdir("runs/tiny", mesh=make_mesh())  # every device
  >>> result = translate_file(translator, "corpus.de", "corpus.en", beam_size=4)
  >>> result.lines, result.decoded, len(pathlib.Path("corpus.en").read_text().splitlines())
  (40, 40, 40)
  >>> translate_file(translator, "corpus.de", "corpus.en", beam_size=4).decoded  # done: resumes
  0
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import logging
import os
import pathlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import jax
import numpy as np

from seq2seq_jax import text_controls
from seq2seq_jax.configs import DecodeConfig, TranslateFileConfig
from seq2seq_jax.data.text_files import DataError, decode_line
from seq2seq_jax.inference.batching import MODEL_LIMIT, warn_truncated
from seq2seq_jax.inference.translator import Translator, output_lengths, total_logprobs
from seq2seq_jax.training.sharding import broadcast_json
from seq2seq_jax.types import NEG_INF

logger = logging.getLogger("seq2seq_jax")

RECORD_SUFFIX = ".progress.json"
_RECORD_FORMAT = 1
_TRUNCATION_WARNINGS = 20  # warnings naming a line; after that, one count at the end


class ResumeError(ValueError):
  """An output cannot be resumed (other settings, changed files); the message says why."""


class TranslationInterrupted(KeyboardInterrupt):
  """Ctrl-C during ``translate_file``: ``lines_done`` lines of ``output`` are complete."""

  def __init__(self, lines_done: int, output: str | None):
    super().__init__(f"interrupted after {lines_done} complete lines")
    self.lines_done = lines_done
    self.output = output


@dataclasses.dataclass(frozen=True)
class FileResult:
  """What a ``translate_file`` call did."""

  lines: int  # input lines, all of them
  decoded: int  # lines decoded by this call (a resumed call skips the finished ones)
  resumed_from: int  # lines already complete when the call started
  tokens: int  # tokens generated (or scored) by this call
  truncated: int  # lines cut to the length limit (Translator.max_source_len; targets: max_len)
  seconds: float
  output: str | None  # None: standard output


# ------------------------------------------------------------------------------- reading


class _EncodedLines:
  """A text stream without a byte buffer (a notebook's or a test's stdin) read as UTF-8 lines."""

  def __init__(self, text: Any):
    self.text = text

  def readline(self) -> bytes:
    return self.text.readline().encode("utf-8")

  def close(self) -> None:
    pass


def _stdin() -> Any:
  buffer = getattr(sys.stdin, "buffer", None)
  return buffer if buffer is not None else _EncodedLines(sys.stdin)


def _open_input(path: str | None) -> tuple[BinaryIO, str]:
  if path is None or path == "-":
    return _stdin(), "<stdin>"
  if str(path).endswith(".gz"):
    return gzip.open(path, "rb"), str(path)
  return open(path, "rb"), str(path)  # pylint: disable=consider-using-with


def count_lines(path: str | os.PathLike) -> int:
  """Lines of a file (a last line without ``\\n`` counts), read in 1 MiB pieces."""
  stream, _ = _open_input(str(path))
  count, last = 0, b"\n"
  with stream:
    while piece := stream.read(1 << 20):
      count += piece.count(b"\n")
      last = piece[-1:]
  return count + (last != b"\n")


class _Lines:
  """Reads a binary stream a window of lines at a time, keeping the line number and offset."""

  def __init__(self, stream: BinaryIO, name: str, *, line: int = 0, offset: int = 0):
    self.stream, self.name, self.line, self.offset = stream, name, line, offset
    if offset:
      stream.seek(offset)

  def window(self, size: int) -> list[str]:
    lines = []
    while len(lines) < size:
      raw = self.stream.readline()
      if not raw:
        break
      self.offset += len(raw)
      self.line += 1
      lines.append(decode_line(raw, self.name, self.line))
    return lines


def _fingerprint_file(path: str) -> dict[str, Any]:
  """Size and a hash of the first and last 64 KiB: a changed input is noticed cheaply."""
  size = os.path.getsize(path)
  digest = hashlib.sha256()
  with open(path, "rb") as stream:
    digest.update(stream.read(1 << 16))
    stream.seek(max(0, size - (1 << 16)))
    digest.update(stream.read(1 << 16))
  return {"bytes": size, "sha256_ends": digest.hexdigest()[:16]}


def params_fingerprint(params: Any) -> str:
  """A short hash of a parameter tree: names, shapes and 1,024 evenly spaced values per leaf."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    values = np.asarray(jax.device_get(leaf), np.float32).ravel()
    digest.update(f"{jax.tree_util.keystr(path)}{np.shape(leaf)}".encode())
    digest.update(values[::max(1, values.size // 1024)].tobytes())
  return digest.hexdigest()[:16]


# ------------------------------------------------------------------------------- writing


def _record_path(output: str) -> pathlib.Path:
  return pathlib.Path(output + RECORD_SUFFIX)


class _Writer:
  """Appends finished lines to the output, flushed, and keeps the side record in step.

  The output is fsynced before the record is replaced (atomically), so the record
  never claims bytes the file lacks; bytes past the record (a kill between the two)
  are cut off on resume.
  """

  def __init__(self, output: str | None, settings: dict[str, Any] | None):
    self.output, self.settings = output, settings
    self.bytes = 0
    if output is None:  # bytes when stdout has a buffer (a notebook's has not): UTF-8 always
      self.stream = getattr(sys.stdout, "buffer", None) or sys.stdout
    else:
      self.stream = open(output, "ab")  # pylint: disable=consider-using-with
      self.bytes = self.stream.seek(0, io.SEEK_END)

  def write(self, text: str, position: dict[str, int], *, complete: bool = False) -> None:
    if text:
      data = text.encode("utf-8")
      self.stream.write(data if self.stream is not sys.stdout else text)
      self.bytes += len(data)
      self.stream.flush()
    if self.output is None:
      return
    os.fsync(self.stream.fileno())
    record = {"format": _RECORD_FORMAT, "complete": complete, "output_bytes": self.bytes,
              **position, "settings": self.settings}
    path = _record_path(self.output)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)

  def close(self) -> None:
    if self.output is not None:
      self.stream.close()
    else:
      self.stream.flush()


class _NoWriter:
  """A process other than 0 of a multi-host run: decodes its rows, writes nothing."""

  def write(self, text: str, position: dict[str, int], *, complete: bool = False) -> None:
    pass

  def close(self) -> None:
    pass


def _differences(saved: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
  found = []
  for key in sorted(set(saved) | set(now)):
    old, new = saved.get(key), now.get(key)
    if isinstance(old, dict) and isinstance(new, dict):
      found += _differences(old, new, f"{prefix}{key}.")
    elif old != new:
      found.append(f"{prefix}{key} was {old!r}, now {new!r}")
  return found


# Files read beside the input, line by line (TranslateFileConfig fields naming them).
SIDE_FILES = ("references", "prefixes", "constraints")


def _fresh_start() -> dict[str, Any]:
  """The position of an output begun now: no line done, the first window at byte 0."""
  return {"lines_done": 0, "window_line": 0, "window_offset": 0,
          **{f"{side}_offset": 0 for side in SIDE_FILES}, "complete": False}


def _resume_point(output: str, settings: dict[str, Any], overwrite: bool) -> dict[str, Any]:
  """Where an output continues (process 0): the record's position, checked against the file."""
  fresh = _fresh_start()
  path = _record_path(output)
  if overwrite:
    path.unlink(missing_ok=True)
    open(output, "wb").close()  # pylint: disable=consider-using-with
    return fresh
  exists = os.path.exists(output) and os.path.getsize(output) > 0
  if not path.is_file():
    if exists:
      raise ResumeError(f"{output} exists but has no progress record {path.name}: it was not "
                        "written by an interrupted translation. Pass --overwrite (overwrite=True) "
                        "to replace it, or choose another output file")
    return fresh
  try:
    record = json.loads(path.read_text(encoding="utf-8"))
    position = {key: int(record[key]) for key in fresh if key != "complete"
                and not key.endswith("_offset")}
    position.update({key: int(record.get(key, 0)) for key in fresh if key.endswith("_offset")})
    saved_bytes, saved_settings = int(record["output_bytes"]), record["settings"]
  except (ValueError, KeyError, TypeError) as error:
    raise ResumeError(f"{path}: not a readable progress record ({error}); delete it and the "
                      f"output, or pass --overwrite") from None
  changed = _differences(saved_settings, settings)
  if changed:
    raise ResumeError(f"{output} was begun with other settings: {'; '.join(changed)}. Rerun "
                      "with the settings it was begun with to resume it, or pass --overwrite "
                      "to start over")
  size = os.path.getsize(output) if os.path.exists(output) else 0
  if size < saved_bytes:
    raise ResumeError(f"{output} has {size} bytes but its progress record {path.name} says "
                      f"{saved_bytes} are complete: the file was changed. Pass --overwrite to "
                      "start over")
  if size > saved_bytes:  # a write after the last record update: redone below
    os.truncate(output, saved_bytes)
  return {**position, "complete": bool(record.get("complete"))}


def _start(output: str | None, settings: dict[str, Any] | None, overwrite: bool,
           writer_process: bool) -> dict[str, Any]:
  """Where this call begins, decided by process 0 (which alone touches the output) and
  shared with every host; a refusal is raised on all of them."""
  start, error = _fresh_start(), None
  if writer_process and settings is not None:
    try:
      start = _resume_point(output, settings, overwrite)
    except ResumeError as e:
      error = str(e)
  elif writer_process and output is not None:  # from stdin: written afresh, never resumed
    open(output, "wb").close()  # pylint: disable=consider-using-with
  shared = broadcast_json("translate_file:start", {"error": error, "start": start})
  if shared["error"]:
    raise ResumeError(shared["error"] if writer_process else
                      f"process 0 refused to resume: {shared['error']}")
  return shared["start"]


class _CtrlC:
  """Ctrl-C noted by a handler and raised at the next batch boundary, never inside whatever
  Python runs at that instant: a KeyboardInterrupt raised in a garbage-collection callback
  (jax has one) is printed and dropped, and the run would go on. A second Ctrl-C raises at
  once. Outside the main thread (no handler can be installed) it does nothing."""

  def __init__(self):
    self.pressed = False
    self._previous: Any = None

  def __enter__(self) -> "_CtrlC":
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGINT, self._handle)
    return self

  def _handle(self, signum, frame) -> None:
    if self.pressed:
      raise KeyboardInterrupt
    self.pressed = True

  def check(self) -> None:
    if self.pressed:
      raise KeyboardInterrupt

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGINT, self._previous)


# ------------------------------------------------------------------------------- progress


class _Progress:
  """A tqdm bar (sentences/s, tokens/s, ETA) on a terminal, else a plain line now and then."""

  def __init__(self, mode: str, *, name: str, total: int | None, initial: int, every_s: float):
    if mode == "auto":
      mode = "bar" if sys.stderr.isatty() else "lines"
    self.mode, self.name, self.total, self.every_s = mode, name, total, every_s
    self.done, self.decoded, self.tokens = initial, 0, 0
    self.start = self.last = time.perf_counter()
    self.bar = None
    if mode == "bar":
      from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
      self.bar = tqdm(total=total, initial=initial, unit=" sentences", dynamic_ncols=True,
                      desc=name, file=sys.stderr, smoothing=0.05)

  def update(self, lines: int, decoded: int, tokens: int) -> None:
    """``lines`` more lines are finished (written or not: a window is written once its
    earlier lines are), ``decoded`` of them by the model, with ``tokens`` tokens."""
    self.done += lines
    self.decoded += decoded
    self.tokens += tokens
    now = time.perf_counter()
    if self.bar is not None:
      self.bar.update(lines)
      self.bar.set_postfix_str(f"{self.tokens / max(now - self.start, 1e-9):,.0f} tokens/s",
                               refresh=False)
    elif self.mode == "lines" and now - self.last >= self.every_s:
      self.last = now
      print(self.line(now), file=sys.stderr, flush=True)

  def line(self, now: float) -> str:
    seconds = max(now - self.start, 1e-9)
    rate = self.decoded / seconds
    text = f"{self.name}: {self.done:,}"
    if self.total:
      text += f"/{self.total:,} lines ({100 * self.done / self.total:.1f}%)"
    else:
      text += " lines"
    text += f", {rate:,.1f} sentences/s, {self.tokens / seconds:,.0f} tokens/s"
    if self.total and rate > 0:
      eta = int((self.total - self.done) / rate)
      text += f", ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}"
    return text

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
    elif self.mode == "lines":
      print(self.line(time.perf_counter()), file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- the loop


def _clean(text: str) -> str:
  """One output line: a newline inside a translation would break the line alignment."""
  return text.replace("\r", " ").replace("\n", " ")


def _settings(translator: Translator, decode: DecodeConfig, config: TranslateFileConfig, *,
              input_path: str | None, source_lang: str | None, target_lang: str | None,
              model_name: str | None) -> dict[str, Any]:
  """Everything that fixes the output's bytes; a resume must match it exactly."""
  settings = {
      "model": {"name": model_name or type(translator.model).__name__,
                "parameters": params_fingerprint(translator.params),
                "max_source_len": translator.max_source_len,
                "bucket_lengths": list(translator.bucket_lengths)},
      "search": {k: list(v) if isinstance(v, tuple) else v
                 for k, v in dataclasses.asdict(decode).items()},
      "source_lang": source_lang, "target_lang": target_lang,
      "batching": {k: getattr(config, k) for k in ("window_lines", "batch_tokens", "max_rows",
                                                   "row_multiple")},
      "output": {"n_best": config.n_best, "scores": config.scores},
  }
  compute = {"quantize": getattr(translator, "quantize", "none"),
             "dtype": getattr(getattr(translator.model, "config", None), "dtype", "float32")}
  if compute != {"quantize": "none", "dtype": "float32"}:  # records before int8 have no key
    settings["model"]["compute"] = compute
  if input_path is not None:
    settings["input"] = _fingerprint_file(input_path)
  for side in SIDE_FILES:
    if getattr(config, side):
      settings[side] = _fingerprint_file(getattr(config, side))
  return settings


def translate_file(translator: Translator, input_path: str | os.PathLike | None,
                   output_path: str | os.PathLike | None, *,
                   config: TranslateFileConfig = TranslateFileConfig(),
                   beam_size: int | None = None, alpha: float | None = None,
                   method: str | None = None, max_decode_len: int | None = None,
                   source_lang: str | None = None, target_lang: str | None = None,
                   overwrite: bool = False, model_name: str | None = None,
                   **decode_options: Any) -> FileResult:
  """Translates ``input_path`` line by line into ``output_path`` (see the module docstring).

  Args:
    translator: the model, tokenizer and device mesh (``Translator(..., mesh=make_mesh())``
      decodes on every device of every host).
    input_path: a text file (``.gz`` too), or None / "-" for standard input.
    output_path: the file to write, or None for standard output. A file is resumed
      when its progress record says it is unfinished (only file-to-file).
    config: windows, batches, output form (n-best, scores, references), progress.
    beam_size, alpha, method, max_decode_len, source_lang, target_lang: the search, as
      ``Translator.translate`` takes it.
    overwrite: start over even though ``output_path`` exists.
    model_name: how the resume check names the model (e.g. the workdir and step);
      a fingerprint of the parameters is checked as well.
    **decode_options: other ``DecodeConfig`` fields (``no_repeat_ngram_size=3`` ...), as
      ``Translator.translate`` takes them.

  Returns:
    A ``FileResult``.

  Raises:
    DataError: invalid UTF-8 (naming the file and line), or references with another
      line count than the input.
    ResumeError: the output cannot be resumed with these settings (naming them).
    TranslationInterrupted: Ctrl-C; the output holds the complete lines so far and
      the same call continues it.
  """
  started = time.perf_counter()
  input_path = None if input_path in (None, "-") else str(input_path)
  output_path = None if output_path in (None, "-") else str(output_path)
  if input_path is not None and output_path is not None and (
      os.path.abspath(input_path) == os.path.abspath(output_path)):
    raise ValueError(f"{output_path} is also the input; write the translation to another file")
  decode = translator.resolve_decode_config(beam_size=beam_size, alpha=alpha, method=method,
                                            max_decode_len=max_decode_len,
                                            target_lang=target_lang, **decode_options)
  if config.n_best and (decode.method != "beam" or config.n_best > decode.beam_size):
    raise ValueError(f"n_best={config.n_best} needs beam search with at least that many beams; "
                     f"got method={decode.method!r}, beam_size={decode.beam_size}: pass "
                     f"--beam-size {max(config.n_best, 2)} (or more)")
  resumable = input_path is not None and output_path is not None
  settings = _settings(translator, decode, config, input_path=input_path,
                       source_lang=source_lang, target_lang=target_lang,
                       model_name=model_name) if resumable else None
  writer_process = jax.process_index() == 0
  start = _start(output_path, settings, overwrite, writer_process)
  total = count_lines(input_path) if input_path is not None else None
  if start["complete"]:
    logger.warning("%s is complete (%d lines); nothing to do (pass --overwrite to redo it)",
                   output_path, start["lines_done"])
    return FileResult(lines=start["lines_done"], decoded=0, resumed_from=start["lines_done"],
                      tokens=0, truncated=0, seconds=time.perf_counter() - started,
                      output=output_path)

  stream, name = _open_input(input_path)
  reader = _Lines(stream, name, line=start["window_line"], offset=start["window_offset"])
  sides: dict[str, _Lines] = {}  # the files read beside the input, aligned line by line
  for side in SIDE_FILES:
    if getattr(config, side):
      side_stream, side_name = _open_input(getattr(config, side))
      sides[side] = _Lines(side_stream, side_name, line=start["window_line"],
                           offset=start[f"{side}_offset"])
  writer = _Writer(output_path, settings) if writer_process else _NoWriter()
  progress = _Progress(config.progress if writer_process else "none", name=name, total=total,
                       initial=start["lines_done"], every_s=config.report_every_s)
  ctrl_c = _CtrlC()
  state = _Run(translator=translator, decode=decode, config=config, source_lang=source_lang,
               target_lang=target_lang, writer=writer, progress=progress,
               lines_done=start["lines_done"], ctrl_c=ctrl_c)
  def side_offsets() -> dict[str, int]:
    return {f"{side}_offset": sides[side].offset if side in sides else 0 for side in SIDE_FILES}

  def next_window() -> dict[str, int]:  # where the window after those read so far starts
    return {"lines_done": state.lines_done, "window_line": reader.line,
            "window_offset": reader.offset, **side_offsets()}

  try:
    with ctrl_c:
      while True:
        position = {"window_line": reader.line, "window_offset": reader.offset, **side_offsets()}
        lines = reader.window(config.window_lines)
        side_lines = {side: lines_of.window(config.window_lines)
                      for side, lines_of in sides.items()}
        for side, got in side_lines.items():
          if len(got) != len(lines):
            shorter, longer = ((sides[side].name, name) if len(got) < len(lines)
                               else (name, sides[side].name))
            raise DataError(f"{shorter} ends at line "
                            f"{position['window_line'] + min(len(lines), len(got))} but {longer} "
                            f"goes on: the input and the {side} must be aligned line by line")
        if not lines:
          break
        state.window(lines, side_lines, position=position, name=name)
        writer.write("", next_window())  # a resume from here starts with the next window
      writer.write("", next_window(), complete=True)
  except KeyboardInterrupt as interrupt:
    raise TranslationInterrupted(state.lines_done, output_path) from interrupt
  finally:
    progress.close()
    writer.close()
    if input_path is not None:
      stream.close()
    for lines_of in sides.values():
      lines_of.stream.close()
  if state.truncated > _TRUNCATION_WARNINGS:
    logger.warning("%s: %d lines in all were truncated to their limit (the first %d "
                   "are named above)", name, state.truncated, _TRUNCATION_WARNINGS)
  return FileResult(lines=state.lines_done, decoded=progress.decoded,
                    resumed_from=start["lines_done"], tokens=progress.tokens,
                    truncated=state.truncated, seconds=time.perf_counter() - started,
                    output=output_path)


@dataclasses.dataclass
class _Run:
  """The state of one ``translate_file`` call across its windows."""

  translator: Translator
  decode: DecodeConfig
  config: TranslateFileConfig
  source_lang: str | None
  target_lang: str | None
  writer: Any
  progress: _Progress
  lines_done: int
  ctrl_c: _CtrlC = dataclasses.field(default_factory=_CtrlC)
  truncated: int = 0

  def _on_truncate(self, what: str, origin: str = MODEL_LIMIT) -> Callable[[int, int, int], None]:
    def warn(number: int, tokens: int, limit: int) -> None:
      if number <= self.lines_done:  # finished before a resume: warned about then
        return
      self.truncated += 1
      if self.truncated <= _TRUNCATION_WARNINGS:
        warn_truncated(what, number, tokens, limit, origin)
    return warn

  def window(self, lines: list[str], side_lines: dict[str, list[str]], *,
             position: dict[str, int], name: str) -> None:
    """Decodes one window and writes its lines in order as they complete."""
    targets = side_lines.get("references")
    first = position["window_line"]
    skip = max(0, self.lines_done - first)  # lines of this window already written
    todo = list(range(len(lines))) if targets is not None else [
        i for i, line in enumerate(lines) if line.strip()]
    numbers = [first + i + 1 for i in todo]
    encoded = self.translator.encode([lines[i] for i in todo], self.source_lang,
                                     target_lang=self.target_lang,
                                     numbers=numbers, what=f"{name}: line",
                                     on_truncate=self._on_truncate(
                                         f"{name}: line", self.translator.source_limit_origin))
    decoded_lines = set(todo)
    ready = {i: self._empty(first + i) for i in range(skip, len(lines))
             if i not in decoded_lines}
    self.progress.update(len(ready), 0, 0)  # empty lines are done at once
    next_line = skip

    def emit(decoded: int, tokens: int) -> None:
      nonlocal next_line
      written = []
      while next_line in ready:
        written.append(ready.pop(next_line))
        next_line += 1
      self.lines_done = first + next_line
      if written:
        self.writer.write("".join(written), {"lines_done": self.lines_done, **position})
      self.progress.update(decoded, decoded, tokens)

    if targets is not None:
      batches = self._score(encoded, targets, todo, numbers, skip)
    else:
      batches = self._translate(encoded, todo, skip, first, len(lines),
                                self._controls(side_lines, todo, first))
    for outputs, tokens in batches:
      fresh = {i: text for i, text in outputs.items() if i >= skip}
      ready.update(fresh)
      emit(len(fresh), tokens)
      self.ctrl_c.check()  # a Ctrl-C stops here, after the finished lines are written
    emit(0, 0)
    if next_line != len(lines):
      raise AssertionError(f"window at line {first + 1}: {len(lines) - next_line} lines were "
                           "never decoded")

  def _pending_plan(self, plan, todo: Sequence[int], skip: int):
    return [batch for batch in plan if any(todo[j] >= skip for j in batch.indices)]

  def _controls(self, side_lines: dict[str, list[str]], todo: Sequence[int],
                first: int) -> text_controls.SentenceControls | None:
    """The window's target prefixes and constraint phrases, tokenized and checked."""
    prefixes, phrases = side_lines.get("prefixes"), side_lines.get("constraints")
    if prefixes is None and phrases is None:
      return None
    files = {"target_prefix": self.config.prefixes, "constraints": self.config.constraints}
    return text_controls.sentence_controls(
        self.translator.tokenizer, self.decode, eos_id=self.translator.ids.eos_id,
        count=len(prefixes if prefixes is not None else phrases), todo=todo,
        target_prefix=prefixes, constraints=None if phrases is None else [
            [p for p in line.split("\t") if p.strip()] for line in phrases],
        target_lang=self.target_lang,
        name=lambda field, i: f"{files[field]}: line {first + i + 1}:")

  def _translate(self, encoded, todo, skip, first, window_size, controls=None):
    config, decode = self.config, self.decode
    # A full window pads every bucket's last batch to full rows too: one program per
    # bucket for the whole file (fewer compilations, flat memory); the last, partial
    # window (or a short input) takes power-of-two tails.
    plan = self.translator.plan([len(ids) for ids in encoded], max_rows=config.max_rows,
                                batch_tokens=config.batch_tokens,
                                row_multiple=config.row_multiple,
                                full_tails=window_size == config.window_lines)
    rng = jax.random.fold_in(jax.random.key(decode.seed), first // config.window_lines)
    eos = self.translator.ids.eos_id
    tokenizer = self.translator.tokenizer
    for decoded in self.translator.decode_batches(
        encoded, self._pending_plan(plan, todo, skip), decode, n_best=bool(config.n_best),
        rng=rng, controls=controls):
      outputs = {}
      if config.n_best:
        count, width, length = decoded.tokens.shape
        flat_NT = decoded.tokens.reshape(count * width, length)
        texts = tokenizer.decode_batch(flat_NT)
        best_NT = decoded.tokens[:, 0]
        for r, j in enumerate(decoded.batch.indices):
          hypotheses = [(texts[r * width + w], decoded.scores[r, w]) for w in range(width)
                        if decoded.scores[r, w] > 0.5 * NEG_INF][:config.n_best]
          outputs[todo[j]] = "".join(f"{first + todo[j]} ||| {_clean(text)} ||| {score:.6f}\n"
                                     for text, score in hypotheses)
      else:
        best_NT = decoded.tokens
        texts = tokenizer.decode_batch(best_NT)
        logprobs = (total_logprobs(best_NT, decoded.scores, decode, eos) if config.scores
                    else None)
        for r, j in enumerate(decoded.batch.indices):
          text = _clean(texts[r])
          outputs[todo[j]] = (f"{text} ||| {logprobs[r]:.6f}\n" if config.scores
                              else f"{text}\n")
      yield outputs, int(output_lengths(best_NT, eos).sum())

  def _score(self, encoded, targets, todo, numbers, skip):
    outputs = self.translator.encode_targets(
        targets, self.target_lang, numbers=numbers, what=f"{self.config.references}: line",
        on_truncate=self._on_truncate(f"{self.config.references}: line"))
    prefix = len(self.translator.tokenizer.target_prefix(self.target_lang))
    config = self.config
    plan = self.translator.score_plan(
        encoded, outputs, max_rows=config.max_rows, batch_tokens=config.batch_tokens,
        row_multiple=config.row_multiple, full_tails=len(targets) == config.window_lines)
    for batch, values in self.translator.score_batches(
        encoded, outputs, self._pending_plan(plan, todo, skip), prefix=prefix):
      yield ({todo[j]: f"{value:.6f}\n" for j, value in zip(batch.indices, values)},
             sum(len(outputs[j]) for j in batch.indices))

  def _empty(self, line_index: int) -> str:
    if self.config.n_best:
      return f"{line_index} |||  ||| 0.000000\n" * self.config.n_best
    return " ||| 0.000000\n" if self.config.scores else "\n"
