"""Translators serialized with ``jax.export``: StableHLO for CPU, CUDA and TPU, parameters, tokenizer.

``export_translator`` lowers a Translator's encode + search (``decoding.search_fn``)
once per batch shape ``[rows, length]`` (its bucket lengths times power-of-two
row counts up to its ``batch_size``), for every platform asked for in one
multi-platform module, and writes one zip file: ``manifest.json`` (shapes, search
settings, special ids, parameter layout), ``tokenizer.json``, the parameters as
raw arrays, and one serialized ``jax.export.Exported`` per shape.

``load_exported`` reads it back into an ``ExportedTranslator`` whose
``translate(sentences)`` tokenizes, plans batches as the Translator does (sorted
by length, padded to the exported shapes) and calls the deserialized programs:
no model, config or search code of this library runs, only ``jax.export`` and the
tokenizer. On the platform it was exported for it gives the Translator's output.

Example:
  >>> from seq2seq_jax.inference import Translator
  >>> translator = Translator.from_workdir("runs/tiny")
  >>> info = export_translator(translator, "tiny.s2sx", platforms=("cpu", "cuda", "tpu"),
  ...                          bucket_lengths=(16,), row_counts=(1, 2), beam_size=4)
  >>> info.platforms, info.shapes  # (rows, length); the longest a sentence can be is added
  (('cpu', 'cuda', 'tpu'), ((1, 16), (1, 64), (2, 16), (2, 64)))
  >>> sentences = ["Ein Hund rennt.", "Zwei Männer sitzen auf einer Bank."]
  >>> load_exported("tiny.s2sx").translate(sentences) == translator.translate(sentences,
  ...                                                                         beam_size=4)
  True
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import zipfile
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.data.tokenizer import tokenizer_from_json, tokenizer_to_json
from seq2seq_jax.inference.batching import encode_sources, pad_batch, plan_batches, truncate_rows

FORMAT = "seq2seq_jax.exported"
FORMAT_VERSION = 1
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


@dataclasses.dataclass(frozen=True)
class ExportInfo:
  """What ``export_translator`` wrote."""

  path: str
  bytes: int
  platforms: tuple[str, ...]
  shapes: tuple[tuple[int, int], ...]  # (rows, length) of each exported program
  method: str


def _program_name(rows: int, length: int) -> str:
  return f"programs/{rows}x{length}.jaxexport"


def _row_counts(batch_size: int) -> tuple[int, ...]:
  """1, 2, 4, ... up to ``batch_size`` (itself included): the Translator's row counts."""
  counts, rows = [], 1
  while rows < batch_size:
    counts.append(rows)
    rows *= 2
  return tuple(counts) + (batch_size,)


def _portable(model: Any) -> Any:
  """``model`` as an artifact runs it: with the einsums, whatever its ``attention_impl``.

  One exported module serves every platform it names, and a fused kernel belongs to
  one (splash is a TPU kernel, cuDNN's a GPU one; traced here, splash would be its
  interpret mode on every platform). The einsums are the same function.
  """
  config = getattr(model, "config", None)
  if getattr(config, "attention_impl", "einsum") == "einsum":
    return model
  from seq2seq_jax.layers import fused_attention  # pylint: disable=import-outside-toplevel
  fused_attention.say_once(f"export: the artifact runs the einsums, not attention_impl "
                           f"{config.attention_impl!r} (one module serves every platform)")
  return model.clone(config=dataclasses.replace(config, attention_impl="einsum"))


def export_translator(translator: Any, path: str | os.PathLike, *,
                      platforms: Sequence[str] = ("cpu",),
                      bucket_lengths: Sequence[int] | None = None,
                      row_counts: Sequence[int] | None = None, beam_size: int | None = None,
                      alpha: float | None = None, method: str | None = None,
                      max_decode_len: int | None = None, source_lang: str | None = None,
                      target_lang: str | None = None, **decode_options: Any) -> ExportInfo:
  """Writes ``translator``'s encode + search as a ``jax.export`` artifact (module docstring).

  Args:
    translator: a ``Translator``.
    path: the file to write (replaced atomically).
    platforms: ``jax.export`` platforms; one module serves all of them.
    bucket_lengths: padded source lengths to export (default: the translator's);
      each at most its ``max_source_len``, which is always added (every sentence
      must fit some shape).
    row_counts: batch rows to export (default: 1, 2, 4, ... up to its ``batch_size``,
      the Translator's own shapes).
    beam_size, alpha, method, max_decode_len, source_lang, target_lang: the search
      baked in, as ``Translator.translate`` takes them. Beam search exports all W
      hypotheses.
    **decode_options: other ``DecodeConfig`` fields baked in (``no_repeat_ngram_size=3``,
      ``repetition_penalty=1.2`` ...).

  Raises:
    ValueError: an unknown platform, a bucket longer than the model reads; a
      failure to lower for a platform names the platform.
  """
  unknown = [p for p in platforms if p not in PLATFORMS]
  if unknown or not platforms:
    raise ValueError(f"platforms={tuple(platforms)}: each must be one of {', '.join(PLATFORMS)}")
  config = translator.resolve_decode_config(beam_size=beam_size, alpha=alpha, method=method,
                                            max_decode_len=max_decode_len,
                                            target_lang=target_lang, **decode_options)
  lengths = tuple(sorted(set(bucket_lengths or translator.bucket_lengths)))
  if lengths[-1] > translator.max_source_len:
    raise ValueError(f"bucket length {lengths[-1]} exceeds the translator's max_source_len="
                     f"{translator.max_source_len}; sentences are truncated to that anyway")
  if lengths[-1] < translator.max_source_len:
    lengths += (translator.max_source_len,)  # every sentence must fit some shape
  rows = tuple(sorted(set(row_counts or _row_counts(translator.batch_size))))
  from seq2seq_jax.decoding import search_fn  # pylint: disable=import-outside-toplevel
  n_best = config.method == "beam"
  search = search_fn(_portable(translator.model), config,
                     max_decode_len=config.max_decode_len, n_best=n_best)
  params = jax.device_get(translator.params)
  leaves, treedef = jax.tree.flatten(params)
  key_data = jax.random.key_data(jax.random.key(config.seed))

  def run(leaves, inputs_BS, key_data):
    return search(jax.tree.unflatten(treedef, leaves), inputs_BS,
                  jax.random.wrap_key_data(key_data))

  leaf_avals = [jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype) for x in leaves]
  programs = {}
  for count in rows:
    for length in lengths:
      inputs = jax.ShapeDtypeStruct((count, length), jnp.int32)
      key = jax.ShapeDtypeStruct(key_data.shape, key_data.dtype)
      try:
        program = jax.export.export(jax.jit(run), platforms=tuple(platforms))(
            leaf_avals, inputs, key)
      except Exception as error:  # jax raises several types; all mean "cannot lower here"
        raise ValueError(f"lowering the {config.method} search for platforms "
                         f"{', '.join(platforms)} failed at shape {count}x{length}: "
                         f"{type(error).__name__}: {error}") from error
      programs[_program_name(count, length)] = program.serialize()
  ids = translator.ids
  manifest = {
      "format": FORMAT, "version": FORMAT_VERSION, "platforms": list(platforms),
      "shapes": [[count, length] for count in rows for length in lengths],
      "search": {k: list(v) if isinstance(v, tuple) else v
                 for k, v in dataclasses.asdict(config).items()},
      "n_best": n_best, "seed": config.seed, "source_lang": source_lang,
      "target_lang": target_lang, "max_source_len": translator.max_source_len,
      "pad_id": ids.pad_id, "eos_id": ids.eos_id,
      "params": [{"dtype": np.asarray(x).dtype.name, "shape": list(np.shape(x))}
                 for x in leaves],
      "jax": jax.__version__,
  }
  path = pathlib.Path(path)
  partial = path.with_name(path.name + ".partial")
  with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED) as archive:
    archive.writestr("manifest.json", json.dumps(manifest, indent=1))
    archive.writestr("tokenizer.json", json.dumps(tokenizer_to_json(translator.tokenizer)))
    for index, leaf in enumerate(leaves):
      archive.writestr(f"params/{index:05d}.bin", np.ascontiguousarray(leaf).tobytes())
    for name, blob in programs.items():
      archive.writestr(name, bytes(blob))
  os.replace(partial, path)
  return ExportInfo(path=str(path), bytes=path.stat().st_size, platforms=tuple(platforms),
                    shapes=tuple((c, l) for c in rows for l in lengths), method=config.method)


class ExportedTranslator:
  """An exported translator: ``translate(sentences)`` with the artifact's programs alone.

  Attributes:
    platforms: what the artifact was exported for.
    shapes: its batch shapes ``(rows, length)``.
    search: the search settings baked in (a dict of ``DecodeConfig``'s fields).
    tokenizer: the tokenizer it carries.
  """

  def __init__(self, path: str | os.PathLike):
    self.path = str(path)
    try:
      archive = zipfile.ZipFile(path)  # pylint: disable=consider-using-with
    except (OSError, zipfile.BadZipFile) as error:
      raise ValueError(f"{path}: not an exported translator ({error}); write one with "
                       "`seq2seq-jax export`") from None
    with archive:
      try:
        manifest = json.loads(archive.read("manifest.json"))
      except (KeyError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: no readable manifest.json ({error}); write the artifact "
                         "again with `seq2seq-jax export`") from None
      if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format {manifest.get('format')!r} version "
                         f"{manifest.get('version')!r}; this library reads {FORMAT!r} version "
                         f"{FORMAT_VERSION}: export it again")
      self.platforms = tuple(manifest["platforms"])
      here = jax.export.default_export_platform()
      if here not in self.platforms:
        raise ValueError(f"{path} was exported for {', '.join(self.platforms)}; this machine "
                         f"runs {here}: export again with --platforms including {here}")
      self.tokenizer = tokenizer_from_json(json.loads(archive.read("tokenizer.json")))
      self.params = [
          jnp.asarray(np.frombuffer(archive.read(f"params/{i:05d}.bin"),
                                    dtype=jnp.dtype(spec["dtype"])).reshape(spec["shape"]))
          for i, spec in enumerate(manifest["params"])]
      self.shapes = tuple((int(c), int(l)) for c, l in manifest["shapes"])
      self._blobs = {shape: archive.read(_program_name(*shape)) for shape in self.shapes}
    self.search = manifest["search"]
    self._manifest = manifest
    self._programs: dict[tuple[int, int], Any] = {}

  def _program(self, rows: int, length: int):
    if (rows, length) not in self._programs:
      program = jax.export.deserialize(bytearray(self._blobs[rows, length]))
      self._programs[rows, length] = jax.jit(program.call)
    return self._programs[rows, length]

  def translate(self, sentences: Sequence[str], *, return_scores: bool = False
                ) -> list[str] | list[tuple[str, float]]:
    """Translations of ``sentences`` in their order (``Translator.translate``'s rules:
    an empty line gives '', a long one is truncated with a warning).

    Args:
      sentences: source texts.
      return_scores: also return each output's search score (beam: divided by the
        GNMT length penalty), as ``(text, score)`` pairs.
    """
    manifest = self._manifest
    outputs: list[Any] = [("", 0.0) if return_scores else ""] * len(sentences)
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    encoded = truncate_rows(
        encode_sources(self.tokenizer, [sentences[i] for i in todo], manifest["source_lang"],
                       manifest.get("target_lang")),
        manifest["max_source_len"])
    lengths = sorted({length for _, length in self.shapes})
    counts = sorted({count for count, _ in self.shapes})
    key = jax.random.key(manifest["seed"])
    plan = plan_batches([len(ids) for ids in encoded], bucket_lengths=lengths,
                        max_rows=counts[-1])
    for batch in plan:
      rows = next(c for c in counts if c >= batch.rows)
      inputs_BS = pad_batch([encoded[j] for j in batch.indices], length=batch.length,
                            count=rows, pad_id=manifest["pad_id"], eos_id=manifest["eos_id"])
      tokens, scores = self._program(rows, batch.length)(
          self.params, inputs_BS, jax.random.key_data(jax.random.fold_in(key, batch.indices[0])))
      tokens, scores = np.asarray(tokens), np.asarray(scores)
      if manifest["n_best"]:
        tokens, scores = tokens[:, 0], scores[:, 0]
      texts = self.tokenizer.decode_batch(tokens[:len(batch.indices)])
      for r, j in enumerate(batch.indices):
        outputs[todo[j]] = (texts[r], float(scores[r])) if return_scores else texts[r]
    return outputs


def load_exported(path: str | os.PathLike) -> ExportedTranslator:
  """Reads an artifact written by ``export_translator`` / ``seq2seq-jax export``.

  Raises:
    ValueError: not an artifact, another format version, or exported for other
      platforms than this machine's (the message names them).
  """
  return ExportedTranslator(path)


__all__ = ["ExportInfo", "ExportedTranslator", "export_translator", "load_exported"]
