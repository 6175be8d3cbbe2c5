"""Tokenizers of Hugging Face translation checkpoints (OPUS-MT, M2M100, NLLB-200, mBART-50,
T5 / mT5 / MADLAD-400), without transformers.

``MarianTokenizer`` and ``M2M100Tokenizer`` read the files the checkpoints ship and
run sentencepiece directly; ``NllbTokenizer`` reads NLLB's ``tokenizer.json`` with
the ``tokenizers`` library (transformers 5 keeps NLLB only in that form);
``MBart50Tokenizer`` and ``T5Tokenizer`` run the directory's ``tokenizer.json`` when
it has one (transformers 5 runs that file for these families) and sentencepiece
otherwise. Ids and decoded text match transformers 5's tokenizers. Every tokenizer
has ``encode_source(texts, lang, target_lang=...)``, ``encode_target``,
``target_prefix`` (ids forced first on the decoder side), ``decode_batch`` and a dict
form (``to_dict``, ``tokenizer_from_dict``); a language goes where the family puts it
(M2M100, NLLB, mBART-50: codes on both sides and the target code forced;
OPUS-MT and MADLAD-400: the target's code in front of the source).

Example:
  >>> tokenizer = load_tokenizer("opus-mt-de-en", "marian")  # a save_pretrained directory
  >>> rows = tokenizer.encode_source(["Ein Hund läuft."])      # pieces, then EOS (id 0)
  >>> tokenizer.decode_batch(rows)  # up to the first EOS; special tokens skipped
  ['Ein Hund läuft.']
  >>> m2m = load_tokenizer("m2m100_418M", "m2m_100")
  >>> row = m2m.encode_source(["Ein Hund."], lang="de")[0]  # language code, pieces, EOS
  >>> row[0] == m2m.target_prefix("de")[0], row[-1] == m2m.eos_id
  (True, True)
  >>> m2m.target_prefix("en")[0] - m2m.target_prefix("de")[0]  # codes in M2M100's order
  2
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import sentencepiece as spm

# Language codes of fairseq's M2M100 releases, in id order: the code at index i
# has id len(vocab.json) + i. transformers' ``language_codes`` picks the list.
_M2M100_LANGUAGE_CODES = {
    "m2m100": tuple(
        "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl "
        "gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml "
        "mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl "
        "tn tr uk ur uz vi wo xh yi yo zh zu".split()),
    "wmt21": tuple("en ha is ja cs ru zh de".split()),
}
# NLLB-200's codes look like ``eng_Latn``: ISO 639-3 and ISO 15924 script.
_NLLB_CODE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")
_SPIECE_SPACE = "\u2581"
# Named special tokens in the order transformers lists them (``all_special_tokens``).
_NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                   "mask_token")
_FORMAT_VERSION = 1


# ---------------------------------------------------------------------------------------------
# Reading files


def _read_json(path: pathlib.Path, fix: str) -> Any:
  if not path.is_file():
    raise ValueError(f"{path} is missing: {fix}")
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as error:
    raise ValueError(f"{path} is not valid JSON ({error}): {fix}") from None


def _read_bytes(path: pathlib.Path, fix: str) -> bytes:
  if not path.is_file():
    raise ValueError(f"{path} is missing: {fix}")
  return path.read_bytes()


def _read_config(directory: pathlib.Path, fix: str, *, optional: bool = False,
                 legacy: bool = True) -> dict[str, Any]:
  """``tokenizer_config.json`` as a dict (``optional``: {} when absent) with, unless not
  ``legacy``, the older files folded in (``_legacy_merge``)."""
  path = directory / "tokenizer_config.json"
  config: Any = {}
  if not optional or path.is_file():
    config = _read_json(path, fix)
    if not isinstance(config, dict):
      raise ValueError(f"{path} must hold a JSON object: {fix}")
  return _legacy_merge(config, directory) if legacy else config


def _check_vocab(vocab: Any, where: str) -> dict[str, int]:
  if (not isinstance(vocab, dict) or not vocab
      or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                 for k, v in vocab.items())):
    raise ValueError(f"{where} must map each piece (a string) to its id (an integer); re-save the "
                     "tokenizer with transformers' save_pretrained")
  return dict(vocab)


def _load_processor(model: bytes, where: str,
                    kwargs: Mapping[str, Any]) -> spm.SentencePieceProcessor:
  try:
    return spm.SentencePieceProcessor(model_proto=model, **kwargs)
  except (RuntimeError, TypeError, OSError) as error:
    raise ValueError(f"{where} is not a sentencepiece model ({error}): copy the checkpoint's "
                     "file again") from None


def _token_content(value: Any, where: str) -> str:
  """A token given as a string or as a serialised ``AddedToken`` (a dict with ``content``)."""
  if isinstance(value, str):
    return value
  if isinstance(value, dict) and isinstance(value.get("content"), str):
    return value["content"]
  raise ValueError(f"{where} must be a token string or a dict with a 'content' string, got "
                   f"{value!r}: fix tokenizer_config.json")


def _named(config: Mapping[str, Any], name: str, default: str) -> str:
  """A named special token of tokenizer_config.json (``eos_token`` ...), or its default."""
  return _token_content(config.get(name, default), f"tokenizer_config.json: {name!r}")


def _special_ids(config: Mapping[str, Any], id_of: Callable[[str], int | None],
                 missing: str) -> tuple[int, int, int]:
  """Ids of tokenizer_config.json's ``pad_token``, ``eos_token`` and ``unk_token`` (by
  default ``<pad>``, ``</s>``, ``<unk>``); ``id_of`` gives a token's id, None for one
  the tokenizer lacks, which raises ``missing`` formatted with the field and token."""
  ids = []
  for name, default in (("pad_token", "<pad>"), ("eos_token", "</s>"), ("unk_token", "<unk>")):
    token = _named(config, name, default)
    index = id_of(token)
    if index is None:
      raise ValueError(missing.format(name=name, token=repr(token)))
    ids.append(index)
  return ids[0], ids[1], ids[2]


def _legacy_merge(config: dict[str, Any], directory: pathlib.Path) -> dict[str, Any]:
  """Folds ``special_tokens_map.json`` and ``added_tokens.json`` into the config, as
  transformers does for a config without ``added_tokens_decoder`` (files written
  before transformers 4.34)."""
  if "added_tokens_decoder" in config:
    return config
  config = dict(config)
  path = directory / "special_tokens_map.json"
  if path.is_file():
    special_map = _read_json(path, "delete it or re-save the tokenizer with save_pretrained")
    if not isinstance(special_map, dict):
      raise ValueError(f"{path} must hold a JSON object: delete it or re-save the tokenizer")
    extras = list(config.get("extra_special_tokens") or [])
    for key, value in special_map.items():
      if key == "extra_special_tokens" and isinstance(value, list):
        extras += [token for token in value if token not in extras]
      else:
        config[key] = value
    if extras:
      config["extra_special_tokens"] = extras
  path = directory / "added_tokens.json"
  if path.is_file():
    added = _read_json(path, "delete it or re-save the tokenizer with save_pretrained")
    if not isinstance(added, dict) or not all(isinstance(v, int) for v in added.values()):
      raise ValueError(f"{path} must map tokens to integer ids: delete it or re-save the tokenizer")
    specials = {_token_content(config[name], name) for name in _NAMED_SPECIALS if config.get(name)}
    specials |= {_token_content(token, "extra_special_tokens")
                 for token in (config.get("extra_special_tokens")
                               or config.get("additional_special_tokens") or [])}
    config["added_tokens_decoder"] = {
        str(index): {"content": token, "lstrip": False, "rstrip": False, "single_word": False,
                     "normalized": token not in specials, "special": token in specials}
        for token, index in added.items()}
  return config


# ---------------------------------------------------------------------------------------------
# Added and special tokens, as transformers' Python tokenizers handle them


def _split_atomic(text: str, pattern: re.Pattern | None) -> list[str]:
  """``text`` cut before and after each match of ``pattern`` (tokens never split), empty
  segments dropped."""
  if pattern is None:
    return [text] if text else []
  segments, start = [], 0
  for match in pattern.finditer(text):
    segments += [text[start:match.start()], match.group()]
    start = match.end()
  segments.append(text[start:])
  return [segment for segment in segments if segment]


def _atomic_pattern(tokens: Sequence[str]) -> re.Pattern | None:
  """A pattern matching any of ``tokens``, the longest first (None: no tokens)."""
  by_length = sorted(set(tokens), key=len, reverse=True)
  return re.compile("|".join(map(re.escape, by_length))) if by_length else None


@dataclasses.dataclass(frozen=True)
class _Added:
  """An added token: cut out of the text before sentencepiece sees it."""
  content: str
  lstrip: bool = False
  rstrip: bool = False
  single_word: bool = False


class _AddedTokens:
  """Added tokens with their ids, and which of them are special (skipped when decoding).

  Mirrors ``PythonBackend``: the tokens of ``added_tokens_decoder`` keep their ids;
  each special token not among them takes its vocabulary id or, when the vocabulary
  lacks it, the next id past the vocabulary.
  """

  def __init__(self, config: Mapping[str, Any], base_vocab: Mapping[str, int],
               defaults: Mapping[str, str]):
    self.ids: dict[str, int] = {}
    self.tokens: dict[str, _Added] = {}
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
      raise ValueError("tokenizer_config.json: 'added_tokens_decoder' must map ids to tokens; "
                       "re-save the tokenizer with save_pretrained")
    for key, entry in decoder.items():
      where = f"tokenizer_config.json: added_tokens_decoder[{key!r}]"
      content = _token_content(entry, where)
      try:
        index = int(key)
      except ValueError:
        raise ValueError(f"{where}: the key must be an integer id; re-save the tokenizer") from None
      flags = entry if isinstance(entry, dict) else {}
      self.ids[content] = index
      self.tokens[content] = _Added(content, bool(flags.get("lstrip")), bool(flags.get("rstrip")),
                                    bool(flags.get("single_word")))

    specials = [_token_content(config[name] if name in config else defaults[name],
                               f"tokenizer_config.json: {name!r}")
                for name in _NAMED_SPECIALS
                if config.get(name, defaults.get(name)) is not None]
    extras = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    if not isinstance(extras, list):
      raise ValueError("tokenizer_config.json: 'extra_special_tokens' must be a list of tokens; "
                       "re-save the tokenizer with save_pretrained")
    specials += [_token_content(value, "tokenizer_config.json: 'extra_special_tokens'")
                 for value in extras]
    self.special: tuple[str, ...] = tuple(dict.fromkeys(specials))

    # transformers adds them as plain strings: their lstrip/rstrip settings are not kept.
    next_id = len(set(base_vocab) | set(self.ids))
    for token in self.special:
      if token in self.ids:
        continue
      if token in base_vocab:
        self.ids[token] = base_vocab[token]
      else:
        self.ids[token] = next_id
        next_id += 1
      self.tokens[token] = _Added(token)
    self.by_id = {index: content for content, index in self.ids.items()}
    self.special_ids = frozenset(self.ids[token] for token in self.special)
    self._pattern = _atomic_pattern(list(self.ids))

  def split(self, text: str) -> list[str]:
    """The text cut at added tokens (leftmost, longest first); each token its own segment."""
    segments = _split_atomic(text, self._pattern)
    # The strip and whole-word options of added tokens act on the neighbouring segments.
    for i, segment in enumerate(segments):
      token = self.tokens.get(segment)
      if token is None:
        continue
      left = segments[i - 1] if i > 0 else None
      right = segments[i + 1] if i + 1 < len(segments) else None
      if token.rstrip and right:
        segments[i + 1] = right.lstrip()
      if token.lstrip and left:
        segments[i - 1] = left.rstrip()
      if token.single_word:
        if left and left[-1] != " ":
          segments[i - 1] += segment
          segments[i] = ""
        elif right and right[0] != " ":
          segments[i + 1] = segment + segments[i + 1]
          segments[i] = ""
    return [segment for segment in segments if segment]

  def is_atomic(self, segment: str) -> bool:
    return segment in self.ids or segment in self.special


def _clean_up_spaces(text: str) -> str:
  """transformers' ``clean_up_tokenization``: drops the space before punctuation and clitics."""
  for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                         (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                         (" 're", "'re")):
    text = text.replace(spaced, joined)
  return text


def _unknown_language(lang: Any, known: Sequence[str], what: str) -> ValueError:
  listed = ", ".join(known) if known else "none"
  return ValueError(f"{what}: unknown language {lang!r}; this checkpoint knows: {listed}")


def _truncate_at_eos(row: Sequence[int], eos_id: int, start_is_eos: bool) -> list[int]:
  ids = [int(i) for i in row]
  # HF generate returns the decoder start first; for M2M100 and NLLB that is EOS itself.
  begin = 1 if start_is_eos and ids[:1] == [eos_id] else 0
  end = ids.index(eos_id, begin) + 1 if eos_id in ids[begin:] else len(ids)
  return ids[begin:end]


def _write_json(path: pathlib.Path, data: Any) -> None:
  path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _b64(data: bytes) -> str:
  return base64.b64encode(data).decode("ascii")


def _unb64(d: Mapping[str, Any], key: str, kind: str) -> bytes:
  try:
    return base64.b64decode(d[key], validate=True)
  except KeyError:
    raise ValueError(f"tokenizer dict of kind {kind!r} lacks {key!r}: store it with "
                     "to_dict()") from None
  except (ValueError, TypeError):
    raise ValueError(f"tokenizer dict field {key!r} is not base64: store it with "
                     "to_dict()") from None


def _field(d: Mapping[str, Any], key: str, kind: str) -> Any:
  if key not in d:
    raise ValueError(f"tokenizer dict of kind {kind!r} lacks {key!r}: store it with to_dict()")
  return d[key]


def _check_kind(d: Mapping[str, Any], kind: str) -> None:
  if not isinstance(d, Mapping) or d.get("kind") != kind:
    got = d.get("kind") if isinstance(d, Mapping) else type(d).__name__
    raise ValueError(f"tokenizer dict has kind {got!r}, expected {kind!r}: use tokenizer_from_dict")


# ---------------------------------------------------------------------------------------------
# tokenizer.json, run by the tokenizers library


def _import_tokenizers():
  try:
    import tokenizers  # noqa: PLC0415 - optional: only tokenizer.json needs it
  except ImportError:
    raise ImportError("NLLB's tokenizer is a tokenizer.json of the 'tokenizers' library: "
                      "pip install tokenizers") from None
  return tokenizers


class _JsonPieces:
  """The pieces of a ``tokenizer.json`` run by the ``tokenizers`` library, without the
  special tokens its post-processor adds (the tokenizer classes place those).

  transformers 5 runs this file for NLLB, mBART-50 and the T5 family: its pipeline (a
  ``▁`` piece for a trailing space or a run of spaces, added tokens cut out of the
  text with their own spacing) differs from sentencepiece's at those places.
  """

  def __init__(self, text: str, clean_up: bool, *,
               fix: str = ("copy the checkpoint's file again or delete it (sentencepiece then "
                           "runs the model file)")):
    tokenizers = _import_tokenizers()
    self.text = str(text)
    try:
      self.backend = tokenizers.Tokenizer.from_str(self.text)
    except Exception as error:  # the Rust side raises plain Exceptions
      raise ValueError(f"tokenizer.json cannot be read by the tokenizers library ({error}): "
                       f"{fix}") from None
    self.backend.no_truncation()
    self.backend.no_padding()
    self.clean_up = clean_up  # transformers' clean_up_tokenization when decoding

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    return [list(e.ids) for e in self.backend.encode_batch(list(texts),
                                                            add_special_tokens=False)]

  def decode(self, rows: Sequence[Sequence[int]]) -> list[str]:
    texts = self.backend.decode_batch([list(row) for row in rows], skip_special_tokens=True)
    return [_clean_up_spaces(text) for text in texts] if self.clean_up else list(texts)


def _read_tokenizer_json(directory: pathlib.Path) -> str | None:
  path = directory / "tokenizer.json"
  return path.read_text(encoding="utf-8") if path.is_file() else None


# ---------------------------------------------------------------------------------------------
# What the families share

# to_dict fields that hold a model file's bytes (base64 in the dict).
_BINARY_FIELDS = ("source_spm", "target_spm", "spm_model")
# A saved file's content: bytes, text, or a vocabulary written as JSON (None: not written).
_FileContent = bytes | str | Mapping[str, int] | None


class _Tokenizer:
  """What every tokenizer here shares: its dict form, its saved directory, decoding rows
  that end at EOS, a repr.

  A family sets ``kind`` (its dict's tag), ``_FIELDS`` (its ``__init__`` keywords,
  which are its dict's fields too: name -> whether ``from_dict`` requires it),
  ``_TOKENIZER_CLASS`` (transformers' class, written to tokenizer_config.json) and
  ``_START_IS_EOS`` (generated rows start with EOS, the decoder start, dropped when
  decoding), and implements ``_arguments``, ``_files`` and ``_decode``.
  """

  kind: str
  _FIELDS: Mapping[str, bool]
  _TOKENIZER_CLASS: str
  _START_IS_EOS = False
  _config: dict[str, Any]
  eos_id: int
  vocab_size: int
  languages: tuple[str, ...]

  def __repr__(self) -> str:
    return (f"{type(self).__name__}(vocab_size={self.vocab_size}, "
            f"languages={len(self.languages)})")

  def _arguments(self) -> dict[str, Any]:
    """The ``__init__`` keywords that rebuild this tokenizer, in its dict's order (model
    files as bytes)."""
    raise NotImplementedError

  def _files(self) -> dict[str, _FileContent]:
    """File name -> content of a saved directory, tokenizer_config.json aside."""
    raise NotImplementedError

  def _saved_config(self) -> dict[str, Any]:
    """tokenizer_config.json as ``save`` writes it."""
    return {"tokenizer_class": self._TOKENIZER_CLASS, **self._config}

  def _decode(self, ids: Sequence[int]) -> str:
    raise NotImplementedError

  def _decode_rows(self, rows: list[list[int]]) -> list[str]:
    return [self._decode(row) for row in rows]

  def decode_batch(self, rows: Sequence[Sequence[int]]) -> list[str]:
    """Text of each row up to its first EOS: ``batch_decode(rows, skip_special_tokens=True)``.

    For the families whose decoding starts from EOS (M2M100, NLLB, mBART-50) a leading
    EOS, the decoder start, is dropped first.
    """
    return self._decode_rows([_truncate_at_eos(row, self.eos_id, self._START_IS_EOS)
                              for row in rows])

  def to_dict(self) -> dict[str, Any]:
    """A JSON-serialisable copy (model files in base64); ``from_dict`` restores it."""
    d: dict[str, Any] = {"kind": self.kind, "format_version": _FORMAT_VERSION}
    for key, value in self._arguments().items():
      d[key] = _b64(value) if isinstance(value, bytes) else value
    return d

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> Self:
    """The tokenizer of a ``to_dict()``."""
    _check_kind(d, cls.kind)
    kwargs = {}
    for key, required in cls._FIELDS.items():
      if key in _BINARY_FIELDS:
        kwargs[key] = _unb64(d, key, cls.kind)
      else:
        kwargs[key] = _field(d, key, cls.kind) if required else d.get(key)
    return cls(**kwargs)

  def save(self, path: str | os.PathLike) -> None:
    """Writes a directory that the family's tokenizer in transformers (``MarianTokenizer``,
    ``M2M100Tokenizer``, ...) loads with ``from_pretrained``."""
    directory = pathlib.Path(path).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in self._files().items():
      if isinstance(content, bytes):
        (directory / name).write_bytes(content)
      elif isinstance(content, str):
        (directory / name).write_text(content, encoding="utf-8")
      elif content is not None:
        _write_json(directory / name, content)
    _write_json(directory / "tokenizer_config.json", self._saved_config())


class _LanguageCodes(_Tokenizer):
  """The families that mark the language on both sides (M2M100, NLLB, mBART-50): a code
  token per language (``_lang_ids``), ``[code] pieces </s>`` on each side (``_encode``),
  the target's code forced first when decoding, which starts from EOS."""

  _START_IS_EOS = True
  _lang_ids: dict[str, int]

  def _encode(self, texts: Sequence[str], code: int) -> list[list[int]]:
    raise NotImplementedError

  def _lang_id(self, lang: str | None, side: str) -> int:
    name = type(self).__name__
    if lang is None:
      lang = self._config.get("src_lang" if side == "source" else "tgt_lang")
    if lang is None:
      raise _unknown_language(lang, self.languages,
                              f"{name}: pass the {side} language (lang=...)")
    if lang not in self._lang_ids:
      raise _unknown_language(lang, self.languages, f"{name} ({side} side)")
    return self._lang_ids[lang]

  def encode_source(self, texts: Sequence[str], lang: str | None = None, *,
                    target_lang: str | None = None) -> list[list[int]]:
    """``[code] pieces </s>`` per text, as ``tokenizer(texts)`` with ``src_lang=lang``.

    Args:
      texts: sentences.
      lang: the source language; None takes ``src_lang`` of tokenizer_config.json and
        raises when that is unset (transformers would silently use a default).
      target_lang: only checked: these families force the target code on the decoder side.
    """
    if target_lang is not None:
      self._lang_id(target_lang, "target")
    return self._encode(texts, self._lang_id(lang, "source"))

  def encode_target(self, texts: Sequence[str], lang: str | None = None) -> list[list[int]]:
    """``[code] pieces </s>`` per text, as ``tokenizer(text_target=texts)`` with
    ``tgt_lang=lang`` (None: ``tgt_lang`` of tokenizer_config.json, else an error)."""
    return self._encode(texts, self._lang_id(lang, "target"))

  def target_prefix(self, lang: str | None = None) -> list[int]:
    """``[id of lang's code]``: what generation forces after the decoder start (EOS)."""
    return [self._lang_id(lang, "target")]


class _SentencePieceModel(_Tokenizer):
  """The families whose tokenizer is one sentencepiece model file (``_SPM_FILE``) and,
  when the directory has one, ``tokenizer.json`` (mBART-50, T5): with it, the pieces
  come from the ``tokenizers`` library running that file, as transformers 5 runs it;
  without it, from sentencepiece. ``_FIX`` says how to mend a directory without them."""

  _FIELDS = {"spm_model": True, "config": True, "tokenizer_json": False}
  _SPM_FILE: str
  _FIX: str
  _CONFIG_OPTIONAL = False  # a directory without tokenizer_config.json takes the defaults

  def __init__(self, *, spm_model: bytes, config: Mapping[str, Any],
               tokenizer_json: str | None = None):
    """Builds the tokenizer from in-memory files; ``from_directory`` reads them from disk."""
    self._config = dict(config)
    self._spm_bytes = bytes(spm_model)
    self._sp = _load_processor(self._spm_bytes, self._SPM_FILE,
                               self._config.get("sp_model_kwargs") or {})
    self._clean_up = bool(self._config.get("clean_up_tokenization_spaces", False))
    self._json = None if tokenizer_json is None else _JsonPieces(tokenizer_json, self._clean_up)

  @classmethod
  def from_directory(cls, path: str | os.PathLike) -> Self:
    """Reads the sentencepiece model, ``tokenizer_config.json`` and, when present,
    ``tokenizer.json``."""
    directory = pathlib.Path(path).expanduser()
    config = _read_config(directory, cls._FIX, optional=cls._CONFIG_OPTIONAL)
    return cls(spm_model=_read_bytes(directory / cls._SPM_FILE, cls._FIX), config=config,
               tokenizer_json=_read_tokenizer_json(directory))

  def _piece_ids(self, ids: Sequence[int]) -> list[int]:
    """The sentencepiece ids of the ids decoding keeps."""
    raise NotImplementedError

  def _decode(self, ids: Sequence[int]) -> str:
    text = self._sp.decode(self._piece_ids(ids))
    return _clean_up_spaces(text) if self._clean_up else text

  def _decode_rows(self, rows: list[list[int]]) -> list[str]:
    return self._json.decode(rows) if self._json is not None else super()._decode_rows(rows)

  def _arguments(self) -> dict[str, Any]:
    arguments = {"spm_model": self._spm_bytes, "config": dict(self._config)}
    if self._json is not None:
      arguments["tokenizer_json"] = self._json.text
    return arguments

  def _files(self) -> dict[str, _FileContent]:
    return {self._SPM_FILE: self._spm_bytes,
            "tokenizer.json": None if self._json is None else self._json.text}

  def _saved_config(self) -> dict[str, Any]:
    config = {key: value for key, value in self._config.items()
              if key not in ("backend", "added_tokens_decoder")}
    return {**config, "tokenizer_class": self._TOKENIZER_CLASS}


# ---------------------------------------------------------------------------------------------
# Marian (OPUS-MT)


class MarianTokenizer(_Tokenizer):
  """OPUS-MT's tokenizer: source and target sentencepiece models, one or two vocabularies.

  Matches transformers' ``MarianTokenizer``: no text normalisation (its Moses
  punctuation normaliser is set up but never applied), a leading ``>>xx<<``
  language code kept whole, pieces missing from the vocabulary mapped to
  ``<unk>``, EOS appended. With one shared vocabulary transformers decodes with
  the *source* sentencepiece model, and so does this class.

  Attributes:
    pad_id, eos_id, unk_id: ids of ``<pad>``, ``</s>``, ``<unk>`` (OPUS-MT: last id, 0, 1).
    vocab_size: ids of the target vocabulary (the decoder's output size).
    source_vocab_size: ids of the source vocabulary (``vocab.json``).
    languages: the codes ``xx`` of the ``>>xx<<`` tokens in the source vocabulary
      (multilingual-target models); empty for a bilingual model.
  """

  kind = "marian"
  _FIELDS = {"source_spm": True, "target_spm": True, "vocab": True, "target_vocab": False,
             "config": True}
  _TOKENIZER_CLASS = "MarianTokenizer"

  def __init__(self, *, source_spm: bytes, target_spm: bytes, vocab: Mapping[str, int],
               target_vocab: Mapping[str, int] | None, config: Mapping[str, Any]):
    """Builds the tokenizer from in-memory files; ``from_directory`` reads them from disk."""
    self._config = dict(config)
    self.separate_vocabs = bool(self._config.get("separate_vocabs", False))
    if self.separate_vocabs and target_vocab is None:
      raise ValueError("target_vocab.json is missing: tokenizer_config.json sets separate_vocabs, "
                       "so the target vocabulary must be saved beside vocab.json")
    self._source_bytes, self._target_bytes = bytes(source_spm), bytes(target_spm)
    self._vocab = _check_vocab(vocab, "vocab.json")
    self._target_vocab = (_check_vocab(target_vocab, "target_vocab.json")
                          if self.separate_vocabs else None)
    kwargs = self._config.get("sp_model_kwargs") or {}
    self._source_sp = _load_processor(self._source_bytes, "source.spm", kwargs)
    self._target_sp = _load_processor(self._target_bytes, "target.spm", kwargs)

    self._added = _AddedTokens(self._config, self._vocab,
                               {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    self._unk_token = _named(self._config, "unk_token", "<unk>")
    for name, table in (("vocab.json", self._vocab), ("target_vocab.json", self._target_vocab)):
      if table is not None and self._unk_token not in table:
        raise ValueError(f"{name} lacks the unknown token {self._unk_token!r}: add it (OPUS-MT "
                         "gives it id 1) or fix 'unk_token' in tokenizer_config.json")
    decode_table = self._target_vocab if self.separate_vocabs else self._vocab
    self._id_to_piece = {index: piece for piece, index in decode_table.items()}
    self._clean_up = bool(self._config.get("clean_up_tokenization_spaces", False))

    self.eos_id = self._token_id(_named(self._config, "eos_token", "</s>"), self._vocab)
    self.unk_id = self._token_id(self._unk_token, self._vocab)
    self.pad_id = self._token_id(_named(self._config, "pad_token", "<pad>"), self._vocab)
    self.source_vocab_size = len(self._vocab)
    self.vocab_size = len(self._target_vocab) if self.separate_vocabs else len(self._vocab)
    # The file that sets vocab_size, for messages.
    self.vocab_file = "target_vocab.json" if self.separate_vocabs else "vocab.json"
    self.languages: tuple[str, ...] = tuple(
        piece[2:-2] for piece in self._vocab
        if piece.startswith(">>") and piece.endswith("<<") and len(piece) > 4)

  @classmethod
  def from_directory(cls, path: str | os.PathLike) -> MarianTokenizer:
    """Reads ``source.spm``, ``target.spm``, ``vocab.json`` (and ``target_vocab.json`` with
    separate vocabularies) and ``tokenizer_config.json`` from a ``save_pretrained`` directory."""
    directory = pathlib.Path(path).expanduser()
    fix = "save the tokenizer with transformers' MarianTokenizer.save_pretrained here"
    config = _read_config(directory, fix)
    target_vocab = None
    if config.get("separate_vocabs", False):
      target_vocab = _read_json(directory / "target_vocab.json",
                                "tokenizer_config.json sets separate_vocabs, so the target "
                                "vocabulary must be saved beside vocab.json")
    return cls(source_spm=_read_bytes(directory / "source.spm", fix),
               target_spm=_read_bytes(directory / "target.spm", fix),
               vocab=_read_json(directory / "vocab.json", fix), target_vocab=target_vocab,
               config=config)

  def __repr__(self) -> str:
    return (f"MarianTokenizer(vocab_size={self.vocab_size}, source_vocab_size="
            f"{self.source_vocab_size}, separate_vocabs={self.separate_vocabs}, "
            f"languages={len(self.languages)})")

  def _token_id(self, token: str, table: Mapping[str, int]) -> int:
    if token in self._added.ids:
      return self._added.ids[token]
    return table.get(token, table[self._unk_token])

  def _check_lang(self, lang: str | None) -> None:
    if lang is not None and lang not in self.languages:
      raise _unknown_language(lang, self.languages, "MarianTokenizer (the >>xx<< codes of "
                                                    "vocab.json)")

  def _encode(self, text: str, target: bool) -> list[int]:
    sp = self._target_sp if target else self._source_sp
    table = self._target_vocab if target and self.separate_vocabs else self._vocab
    ids = []
    for segment in self._added.split(text):
      if self._added.is_atomic(segment):
        ids.append(self._token_id(segment, table))
        continue
      pieces = []
      # A leading >>xx<< is one token, never cut by sentencepiece.
      if segment.startswith(">>") and (end := segment.find("<<")) != -1:
        pieces.append(segment[:end + 2])
        segment = segment[end + 2:]
      pieces += sp.encode(segment, out_type=str)
      ids += [self._token_id(piece, table) for piece in pieces]
    return ids + [self.eos_id]

  def encode_source(self, texts: Sequence[str], lang: str | None = None, *,
                    target_lang: str | None = None) -> list[list[int]]:
    """Source ids of each text, EOS last: ``tokenizer(texts)["input_ids"]``.

    Args:
      texts: sentences.
      lang: without ``target_lang``, the target language of a multilingual model
        (OPUS-MT marks the target on the source side: this argument's meaning before
        ``target_lang`` existed); ignored when ``target_lang`` is given.
      target_lang: the target language of a multilingual model; prepends its
        ``>>lang<<`` token (the same ids as transformers on ``f">>{lang}<< {text}"``).
        None (and no ``lang``) leaves the texts as they are (they may carry their
        own code).
    """
    lang = lang if target_lang is None else target_lang
    self._check_lang(lang)
    if lang is not None:
      texts = [f">>{lang}<< {text}" for text in texts]
    return [self._encode(text, target=False) for text in texts]

  def encode_target(self, texts: Sequence[str], lang: str | None = None) -> list[list[int]]:
    """Target ids of each text, EOS last: ``tokenizer(text_target=texts)["input_ids"]``.

    ``lang`` is only checked: OPUS-MT marks the target language on the source side.
    """
    self._check_lang(lang)
    return [self._encode(text, target=True) for text in texts]

  def target_prefix(self, lang: str | None = None) -> list[int]:
    """Ids forced after the decoder start: none for Marian (``lang`` is only checked)."""
    self._check_lang(lang)
    return []

  def _piece(self, index: int) -> str:
    if index in self._added.by_id:
      return self._added.by_id[index]
    if index in self._id_to_piece:
      return self._id_to_piece[index]
    sp = self._target_sp if self.separate_vocabs else self._source_sp
    if 0 <= index < sp.get_piece_size():
      return sp.id_to_piece(index) or self._unk_token
    return self._unk_token

  def _decode(self, ids: Sequence[int]) -> str:
    sp = self._target_sp if self.separate_vocabs else self._source_sp
    text, pending = "", []
    for index in ids:
      if index in self._added.special_ids:
        continue
      piece = self._piece(index)
      if piece in self._added.special:  # a special token reached through a non-special id
        text += sp.decode_pieces(pending) + piece + " "
        pending = []
      else:
        pending.append(piece)
    text = (text + sp.decode_pieces(pending)).replace(_SPIECE_SPACE, " ").strip()
    return _clean_up_spaces(text) if self._clean_up else text

  def _arguments(self) -> dict[str, Any]:
    return {"source_spm": self._source_bytes, "target_spm": self._target_bytes,
            "vocab": dict(self._vocab), "target_vocab": self._target_vocab,
            "config": dict(self._config)}

  def _files(self) -> dict[str, _FileContent]:
    return {"source.spm": self._source_bytes, "target.spm": self._target_bytes,
            "vocab.json": self._vocab, "target_vocab.json": self._target_vocab}


# ---------------------------------------------------------------------------------------------
# M2M100


class M2M100Tokenizer(_LanguageCodes):
  """M2M100's tokenizer: one sentencepiece model, a fairseq vocabulary, language-code tokens.

  Ids are ``[__lang__] pieces </s>`` on both sides, as in transformers 5. The
  language tokens take the ids past ``vocab.json`` in fairseq's order; they are
  special (skipped when decoding) only when ``tokenizer_config.json`` (or
  ``special_tokens_map.json``) lists them, as the published checkpoints do.

  Attributes:
    pad_id, eos_id, unk_id: ids of ``<pad>``, ``</s>``, ``<unk>`` (1, 2, 3).
    vocab_size: ``vocab.json`` + language codes + ``num_madeup_words``: the size of
      the published checkpoints' embeddings (128,112 for M2M100).
    source_vocab_size: the same (one vocabulary for both sides).
    languages: the codes the checkpoint knows (``de``, ``en``, ...).
  """

  kind = "m2m_100"
  _FIELDS = {"spm_model": True, "vocab": True, "config": True}
  _TOKENIZER_CLASS = "M2M100Tokenizer"

  def __init__(self, *, spm_model: bytes, vocab: Mapping[str, int], config: Mapping[str, Any]):
    """Builds the tokenizer from in-memory files; ``from_directory`` reads them from disk."""
    self._config = dict(config)
    self._spm_bytes = bytes(spm_model)
    self._vocab = _check_vocab(vocab, "vocab.json")
    self._sp = _load_processor(self._spm_bytes, "sentencepiece.bpe.model",
                               self._config.get("sp_model_kwargs") or {})
    codes = self._config.get("language_codes", "m2m100")
    if codes not in _M2M100_LANGUAGE_CODES:
      raise ValueError(f"tokenizer_config.json: language_codes={codes!r} is unknown; use one of "
                       f"{sorted(_M2M100_LANGUAGE_CODES)}")
    self.languages: tuple[str, ...] = _M2M100_LANGUAGE_CODES[codes]
    self._lang_ids = {lang: len(self._vocab) + i for i, lang in enumerate(self.languages)}
    self._lang_token_ids = {f"__{lang}__": index for lang, index in self._lang_ids.items()}
    self._id_to_lang_token = {index: token for token, index in self._lang_token_ids.items()}
    self._id_to_piece = {index: piece for piece, index in self._vocab.items()}
    self._unk_token = _named(self._config, "unk_token", "<unk>")
    if self._unk_token not in self._vocab:
      raise ValueError(f"vocab.json lacks the unknown token {self._unk_token!r}: add it (fairseq "
                       "gives it id 3) or fix 'unk_token' in tokenizer_config.json")
    # transformers counts the vocabulary through its id -> token map (range(len(vocab.json))).
    base_vocab = {self._piece_of(i, with_added=False): i for i in range(len(self._vocab))}
    self._added = _AddedTokens(self._config, base_vocab,
                               {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
                                "pad_token": "<pad>", "unk_token": "<unk>"})
    self._clean_up = bool(self._config.get("clean_up_tokenization_spaces", False))
    self.eos_id = self._token_id(_named(self._config, "eos_token", "</s>"))
    self.pad_id = self._token_id(_named(self._config, "pad_token", "<pad>"))
    self.unk_id = self._token_id(self._unk_token)
    self.vocab_size = (len(self._vocab) + len(self.languages)
                       + int(self._config.get("num_madeup_words", 8)))
    self.source_vocab_size = self.vocab_size
    self.vocab_file = "vocab.json"  # plus the language codes and made-up words

  @classmethod
  def from_directory(cls, path: str | os.PathLike) -> M2M100Tokenizer:
    """Reads ``vocab.json``, ``sentencepiece.bpe.model`` and ``tokenizer_config.json``."""
    directory = pathlib.Path(path).expanduser()
    fix = "save the tokenizer with transformers' M2M100Tokenizer.save_pretrained here"
    return cls(spm_model=_read_bytes(directory / "sentencepiece.bpe.model", fix),
               vocab=_read_json(directory / "vocab.json", fix),
               config=_read_config(directory, fix))

  def _token_id(self, token: str) -> int:
    if token in self._added.ids:
      return self._added.ids[token]
    if token in self._lang_token_ids:
      return self._lang_token_ids[token]
    return self._vocab.get(token, self._vocab[self._unk_token])

  def _piece_of(self, index: int, with_added: bool = True) -> str:
    if with_added and index in self._added.by_id:
      return self._added.by_id[index]
    if index in self._id_to_lang_token:
      return self._id_to_lang_token[index]
    return self._id_to_piece.get(index, self._unk_token)

  def _pieces(self, text: str) -> list[int]:
    ids = []
    for segment in self._added.split(text):
      if self._added.is_atomic(segment):
        ids.append(self._token_id(segment))
      else:
        ids += [self._token_id(piece) for piece in self._sp.encode(segment, out_type=str)]
    return ids

  def _encode(self, texts: Sequence[str], code: int) -> list[list[int]]:
    return [[code, *self._pieces(text), self.eos_id] for text in texts]

  def _decode(self, ids: Sequence[int]) -> str:
    text, pending = "", []
    for index in ids:
      if index in self._added.special_ids:
        continue
      piece = self._piece_of(index)
      if piece in self._added.special:  # e.g. a made-up word's id, shown as <unk>
        text += self._sp.decode(pending) + piece
        pending = []
      else:
        pending.append(piece)
    text = (text + self._sp.decode(pending)).strip()
    return _clean_up_spaces(text) if self._clean_up else text

  def _arguments(self) -> dict[str, Any]:
    return {"spm_model": self._spm_bytes, "vocab": dict(self._vocab),
            "config": dict(self._config)}

  def _files(self) -> dict[str, _FileContent]:
    return {"sentencepiece.bpe.model": self._spm_bytes, "vocab.json": self._vocab}


# ---------------------------------------------------------------------------------------------
# NLLB-200


class NllbTokenizer(_LanguageCodes):
  """NLLB-200's tokenizer from ``tokenizer.json`` (transformers 5 has no sentencepiece form).

  The pieces come from the ``tokenizers`` library running the file's own
  pipeline; the language code and EOS are placed as transformers'
  ``NllbTokenizer`` places them: ``[code] pieces </s>``, or ``pieces </s> [code]``
  when tokenizer_config.json sets ``legacy_behaviour``.

  Attributes:
    pad_id, eos_id, unk_id: ids of ``<pad>``, ``</s>``, ``<unk>`` (1, 2, 3).
    vocab_size, source_vocab_size: ids the tokenizer knows, added tokens included
      (the model's embedding may be padded beyond it: 256,206 against 256,204).
    languages: the ``xxx_Yyyy`` codes among its special tokens.
  """

  kind = "nllb"
  _FIELDS = {"tokenizer_json": True, "config": True}
  _TOKENIZER_CLASS = "NllbTokenizer"

  def __init__(self, *, tokenizer_json: str, config: Mapping[str, Any]):
    """Builds the tokenizer from the text of tokenizer.json and tokenizer_config.json's dict."""
    self._config = dict(config)
    self._json = _JsonPieces(tokenizer_json, False, fix="copy the checkpoint's file again")
    backend = self._json.backend
    self._legacy = bool(self._config.get("legacy_behaviour", False))
    self.pad_id, self.eos_id, self.unk_id = _special_ids(
        self._config, backend.token_to_id, "tokenizer.json lacks {name} {token}: fix "
        "tokenizer_config.json or re-save the tokenizer with save_pretrained")
    self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
    self.source_vocab_size = self.vocab_size
    self.vocab_file = "tokenizer.json"
    added = sorted(backend.get_added_tokens_decoder().items())
    self._lang_ids = {token.content: index for index, token in added
                      if token.special and _NLLB_CODE.fullmatch(token.content)}
    self.languages: tuple[str, ...] = tuple(self._lang_ids)
    model_type = json.loads(self._json.text).get("model", {}).get("type")
    # transformers skips the clean-up for BPE models (it would eat spaces before punctuation).
    self._json.clean_up = (bool(self._config.get("clean_up_tokenization_spaces", False))
                           and model_type != "BPE")

  @classmethod
  def from_directory(cls, path: str | os.PathLike) -> NllbTokenizer:
    """Reads ``tokenizer.json`` and ``tokenizer_config.json``."""
    directory = pathlib.Path(path).expanduser()
    fix = "save the tokenizer with transformers' NllbTokenizer.save_pretrained here"
    config = _read_config(directory, fix, legacy=False)
    path_json = directory / "tokenizer.json"
    if not path_json.is_file():
      raise ValueError(f"{path_json} is missing: {fix} (transformers 5 writes NLLB's tokenizer "
                       "only as tokenizer.json)")
    return cls(tokenizer_json=path_json.read_text(encoding="utf-8"), config=config)

  def _encode(self, texts: Sequence[str], code: int) -> list[list[int]]:
    rows = self._json.encode(texts)
    if self._legacy:
      return [[*row, self.eos_id, code] for row in rows]
    return [[code, *row, self.eos_id] for row in rows]

  def _decode_rows(self, rows: list[list[int]]) -> list[str]:
    return self._json.decode(rows)

  def _arguments(self) -> dict[str, Any]:
    return {"tokenizer_json": self._json.text, "config": dict(self._config)}

  def _files(self) -> dict[str, _FileContent]:
    return {"tokenizer.json": self._json.text}


# ---------------------------------------------------------------------------------------------
# mBART-50

# mBART-50's language codes in id order: the code at index i has id (pieces + 1) + i.
_MBART50_LANGUAGE_CODES = tuple(
    "ar_AR cs_CZ de_DE en_XX es_XX et_EE fi_FI fr_XX gu_IN hi_IN it_IT ja_XX kk_KZ ko_KR lt_LT "
    "lv_LV my_MM ne_NP nl_XX ro_RO ru_RU si_LK tr_TR vi_VN zh_CN af_ZA az_AZ bn_IN fa_IR he_IL "
    "hr_HR id_ID ka_GE km_KH mk_MK ml_IN mn_MN mr_IN pl_PL ps_AF pt_XX sv_SE sw_KE ta_IN te_IN "
    "th_TH tl_XX uk_UA ur_PK xh_ZA gl_ES sl_SI".split())
_FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0-3 of fairseq's vocabularies


class MBart50Tokenizer(_LanguageCodes, _SentencePieceModel):
  """mBART-50's tokenizer: its sentencepiece model in fairseq's layout, 52 language codes.

  Ids: ``<s> <pad> </s> <unk>`` are 0-3, the model's piece i is i + 1, then the
  language codes (``ar_AR`` ... ``sl_SI``) and ``<mask>``: 250,054 ids for the
  published models. Both sides are ``[code] pieces </s>``; generation starts from
  EOS and forces the target code first (``target_prefix``). The language codes
  and the special tokens are cut out of the text and skipped when decoding, as
  transformers does. Reads ``sentencepiece.bpe.model`` (which the published
  checkpoints ship) and, when the directory has one, ``tokenizer.json``
  (transformers 5's ``save_pretrained`` writes it): with it, the pieces come from
  the ``tokenizers`` library running that file, as transformers 5 runs it, so ids
  and text are transformers' also where its pipeline differs from sentencepiece (a
  trailing space or a run of spaces kept as a ``▁`` piece); without it, from
  sentencepiece, as fairseq has them.

  Attributes:
    pad_id, eos_id, unk_id: 1, 2, 3.
    vocab_size, source_vocab_size: every id (pieces, codes, ``<mask>``).
    languages: the 52 codes.
  """

  kind = "mbart50"
  _TOKENIZER_CLASS = "MBart50Tokenizer"
  _SPM_FILE = "sentencepiece.bpe.model"
  _FIX = ("copy the checkpoint's sentencepiece.bpe.model and tokenizer_config.json here "
          "(the published mBART-50 checkpoints ship them; transformers 5's save_pretrained "
          "writes only tokenizer.json)")

  def __init__(self, *, spm_model: bytes, config: Mapping[str, Any],
               tokenizer_json: str | None = None):
    """Builds the tokenizer from in-memory files; ``from_directory`` reads them from disk."""
    super().__init__(spm_model=spm_model, config=config, tokenizer_json=tokenizer_json)
    pieces = self._sp.get_piece_size()
    self.languages: tuple[str, ...] = _MBART50_LANGUAGE_CODES
    self._lang_ids = {code: pieces + 1 + i for i, code in enumerate(self.languages)}
    mask = _named(self._config, "mask_token", "<mask>")
    self._special_ids = {token: i for i, token in enumerate(_FAIRSEQ_SPECIALS)}
    self._special_ids.update(self._lang_ids)
    self._special_ids[mask] = pieces + 1 + len(self.languages)
    self._pattern = _atomic_pattern(list(self._special_ids))
    self._pieces_count = pieces
    self.pad_id, self.eos_id, self.unk_id = 1, 2, 3
    self.vocab_size = pieces + 2 + len(self.languages)
    self.source_vocab_size = self.vocab_size
    self.vocab_file = "sentencepiece.bpe.model"  # plus the codes and <mask>

  def _pieces(self, text: str) -> list[int]:
    ids = []
    for segment in _split_atomic(text, self._pattern):
      if segment in self._special_ids:
        ids.append(self._special_ids[segment])
        continue
      for piece in self._sp.encode(segment):
        ids.append(self.unk_id if self._sp.is_unknown(piece) else piece + 1)
    return ids

  def _encode(self, texts: Sequence[str], code: int) -> list[list[int]]:
    rows = (self._json.encode(texts) if self._json is not None
            else [self._pieces(text) for text in texts])
    return [[code, *row, self.eos_id] for row in rows]

  def _piece_ids(self, ids: Sequence[int]) -> list[int]:
    # Special ids (codes, <s>, <pad>, </s>, <unk>, <mask>) are skipped, as
    # skip_special_tokens does; the rest are the model's pieces shifted by one.
    return [i - 1 for i in ids if 4 <= i <= self._pieces_count]


# ---------------------------------------------------------------------------------------------
# T5, mT5, MADLAD-400

_MADLAD_CODE = re.compile(r"<2([^<>\s]+)>")


class T5Tokenizer(_SentencePieceModel):
  """The T5 family's tokenizer: ``spiece.model`` run by sentencepiece, ``<extra_id_N>`` after it.

  Ids are the sentencepiece model's own (``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2 in T5's
  models), then ``extra_ids`` sentinels (tokenizer_config.json, default 100) in
  reverse: ``<extra_id_0>`` is the last id. Text is pieces then EOS on both sides.
  When the directory has a ``tokenizer.json`` (transformers 5's ``save_pretrained``
  writes it; the published checkpoints mostly ship it) the pieces come from the
  ``tokenizers`` library running it, as transformers 5 runs it; otherwise from
  sentencepiece, with the special tokens, the sentinels and the model's
  user-defined pieces cut out of the text first. Decoding skips pad, EOS, unk and
  the sentinels.
  MADLAD-400 marks the target language with a ``<2xx>`` piece in front of the
  source: ``encode_source(texts, target_lang="de")`` gives the ids of
  ``"<2de> " + text``.

  Attributes:
    pad_id, eos_id, unk_id: from tokenizer_config.json's tokens (T5: 0, 1, 2).
    vocab_size, source_vocab_size: pieces + sentinels (the model's embedding may be
      larger: 32,128 against 32,100 for T5).
    languages: the ``xx`` of the model's ``<2xx>`` pieces (MADLAD-400); empty for T5.
  """

  kind = "t5"
  _TOKENIZER_CLASS = "T5Tokenizer"
  _SPM_FILE = "spiece.model"
  _FIX = ("copy the checkpoint's spiece.model here (the published T5, mT5 and MADLAD-400 "
          "checkpoints ship it; transformers 5's save_pretrained writes only tokenizer.json)")
  _CONFIG_OPTIONAL = True

  def __init__(self, *, spm_model: bytes, config: Mapping[str, Any],
               tokenizer_json: str | None = None):
    """Builds the tokenizer from in-memory files; ``from_directory`` reads them from disk."""
    from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415

    super().__init__(spm_model=spm_model, config=config, tokenizer_json=tokenizer_json)
    pieces = self._sp.get_piece_size()
    extra_ids = self._config.get("extra_ids", 100)
    if not isinstance(extra_ids, int) or isinstance(extra_ids, bool) or extra_ids < 0:
      raise ValueError(f"tokenizer_config.json: extra_ids={extra_ids!r} must be an integer "
                       ">= 0; fix it or re-save the tokenizer")
    self._sentinels = {f"<extra_id_{i}>": pieces + extra_ids - 1 - i for i in range(extra_ids)}
    proto = sentencepiece_model_pb2.ModelProto.FromString(self._spm_bytes)
    user_defined = [p.piece for p in proto.pieces
                    if p.type == sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED]
    self._atomic = {**{piece: self._sp.piece_to_id(piece) for piece in user_defined},
                    **self._sentinels}

    def piece_id(token: str) -> int | None:
      index = self._sp.piece_to_id(token)
      return index if self._sp.id_to_piece(index) == token else None

    self.pad_id, self.eos_id, self.unk_id = _special_ids(
        self._config, piece_id, "spiece.model has no {name} {token}: fix tokenizer_config.json "
        "or copy the checkpoint's spiece.model again")
    # Special tokens written in the text are theirs, as transformers cuts them out.
    self._atomic.update({self._sp.id_to_piece(i): i
                         for i in (self.pad_id, self.eos_id, self.unk_id)})
    self._pattern = _atomic_pattern(list(self._atomic))
    self._skipped = {self.pad_id, self.eos_id, self.unk_id, *self._sentinels.values()}
    self._pieces_count = pieces
    self.vocab_size = pieces + extra_ids
    self.source_vocab_size = self.vocab_size
    self.vocab_file = "spiece.model"  # plus the extra_ids of tokenizer_config.json
    self.languages: tuple[str, ...] = tuple(
        match.group(1) for i in range(pieces)
        if (match := _MADLAD_CODE.fullmatch(self._sp.id_to_piece(i))))

  def _check_target(self, lang: str | None) -> None:
    if lang is not None and lang not in self.languages:
      raise _unknown_language(lang, self.languages, "T5Tokenizer (the <2xx> target codes of "
                                                    "spiece.model)")

  def _encode(self, texts: Sequence[str]) -> list[list[int]]:
    if self._json is not None:
      return [row + [self.eos_id] for row in self._json.encode(texts)]
    rows = []
    for text in texts:
      ids = []
      for segment in _split_atomic(text, self._pattern):
        ids += [self._atomic[segment]] if segment in self._atomic else self._sp.encode(segment)
      rows.append(ids + [self.eos_id])
    return rows

  def encode_source(self, texts: Sequence[str], lang: str | None = None, *,
                    target_lang: str | None = None) -> list[list[int]]:
    """Source ids, pieces then EOS: ``tokenizer(texts)["input_ids"]``.

    Args:
      texts: sentences.
      lang: the source language: only checked (MADLAD-400 marks the target alone); a
        T5 without ``<2xx>`` codes takes none.
      target_lang: MADLAD-400's target language: ``<2xx>`` goes in front of each text
        (the ids of transformers on ``f"<2{target_lang}> {text}"``). None leaves the
        texts as they are (they may carry their own code).
    """
    self._check_target(lang)
    self._check_target(target_lang)
    if target_lang is not None:
      texts = [f"<2{target_lang}> {text}" for text in texts]
    return self._encode(texts)

  def encode_target(self, texts: Sequence[str], lang: str | None = None) -> list[list[int]]:
    """Target ids, pieces then EOS (``lang`` is only checked: the target carries no code)."""
    self._check_target(lang)
    return self._encode(texts)

  def target_prefix(self, lang: str | None = None) -> list[int]:
    """Ids forced after the decoder start: none (``lang`` is only checked)."""
    self._check_target(lang)
    return []

  def _piece_ids(self, ids: Sequence[int]) -> list[int]:
    return [i for i in ids if i not in self._skipped and 0 <= i < self._pieces_count]

  def _saved_config(self) -> dict[str, Any]:
    return {**super()._saved_config(), "extra_ids": len(self._sentinels)}


# ---------------------------------------------------------------------------------------------
# Dispatch

PretrainedTokenizer = (MarianTokenizer | M2M100Tokenizer | NllbTokenizer | MBart50Tokenizer
                       | T5Tokenizer)
_KINDS = {cls.kind: cls for cls in (MarianTokenizer, M2M100Tokenizer, NllbTokenizer,
                                    MBart50Tokenizer, T5Tokenizer)}


def _tokenizer_class(directory: pathlib.Path) -> str:
  """``tokenizer_class`` of the directory's tokenizer_config.json ("" when unset)."""
  config = _read_json(directory / "tokenizer_config.json", "save the tokenizer with "
                      "transformers' save_pretrained into this directory")
  return str(config.get("tokenizer_class") or "") if isinstance(config, dict) else ""


def load_tokenizer(path: str | os.PathLike, model_type: str) -> PretrainedTokenizer:
  """The tokenizer of a ``save_pretrained`` directory.

  Args:
    path: the checkpoint directory.
    model_type: ``config.json``'s ``model_type``: ``"marian"``, ``"m2m_100"`` (M2M100
      and NLLB-200 share it; ``tokenizer_class`` in tokenizer_config.json, or the files
      present, tell them apart), ``"mbart"`` (mBART-50's tokenizer), ``"t5"`` or
      ``"mt5"``; ``"nllb"`` forces NLLB.
  """
  directory = pathlib.Path(path).expanduser()
  if model_type == "marian":
    return MarianTokenizer.from_directory(directory)
  if model_type in ("t5", "mt5"):
    return T5Tokenizer.from_directory(directory)
  if model_type == "mbart":
    tokenizer_class = _tokenizer_class(directory)
    if tokenizer_class and not tokenizer_class.startswith("MBart50"):
      raise ValueError(f"{directory / 'tokenizer_config.json'}: tokenizer_class="
                       f"{tokenizer_class!r}; the mBART checkpoints this library reads are "
                       "mBART-50's, with MBart50Tokenizer (mBART-25's MBartTokenizer puts the "
                       "language code last and starts decoding with it); load with "
                       "with_tokenizer=False for ids only")
    return MBart50Tokenizer.from_directory(directory)
  if model_type == "nllb":
    return NllbTokenizer.from_directory(directory)
  if model_type == "m2m_100":
    tokenizer_class = _tokenizer_class(directory)
    is_nllb = tokenizer_class.startswith("Nllb") or (
        not tokenizer_class and (directory / "tokenizer.json").is_file()
        and not (directory / "vocab.json").is_file())
    return (NllbTokenizer if is_nllb else M2M100Tokenizer).from_directory(directory)
  raise ValueError(f"model_type={model_type!r} has no tokenizer here; use 'marian', 'm2m_100', "
                   "'nllb', 'mbart', 't5' or 'mt5'")


def tokenizer_from_dict(d: Mapping[str, Any]) -> PretrainedTokenizer:
  """Rebuilds a tokenizer from its ``to_dict()``."""
  kind = d.get("kind") if isinstance(d, Mapping) else None
  if kind not in _KINDS:
    raise ValueError(f"tokenizer dict has kind {kind!r}; expected one of {sorted(_KINDS)} "
                     "(written by a tokenizer's to_dict())")
  return _KINDS[kind].from_dict(d)


__all__ = ["MarianTokenizer", "M2M100Tokenizer", "NllbTokenizer", "MBart50Tokenizer",
           "T5Tokenizer", "PretrainedTokenizer", "load_tokenizer", "tokenizer_from_dict"]
