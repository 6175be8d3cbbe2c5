"""Text in, text out: tokenize, bucket, generate on every device of a mesh, restore order, detokenize.

Example:
  >>> translator = Translator.from_workdir("runs/tiny", mesh=make_mesh())  # what ``train`` wrote
  >>> two = translator.translate(["Ein Hund läuft.", "Zwei Männer sitzen auf einer Bank."],
  ...                            beam_size=4, alpha=0.6)
  >>> len(two), all(isinstance(text, str) for text in two)
  (2, True)
  >>> translator.translate(["Ein Hund läuft."], beam_size=4, alpha=0.6) == two[:1]  # alone
  True

Whole files, resumable, in bounded memory: ``inference.translate_file(translator, ...)``
(``inference/files.py``), which builds on this class.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pathlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from seq2seq_jax.configs import DecodeConfig
from seq2seq_jax import quantization
from seq2seq_jax import text_controls
from seq2seq_jax.decoding import check_controls, length_penalty, search_fn
from seq2seq_jax.layers.partitioning import activation_sharding
from seq2seq_jax.inference.batching import (MODEL_LIMIT, PlannedBatch, TruncationHandler,
                                            bucket_length, encode_sources, pad_batch,
                                            plan_batches, reaching, truncate_rows)
from seq2seq_jax.models.base import special_ids
from seq2seq_jax.training.sharding import DATA_AXIS, make_mesh
from seq2seq_jax.types import Array, PyTree


CONTROLS = ("target_prefix", "constraints")  # per-row arrays a search may take, in this order
# from_pretrained's source limit where the model takes more: the ratio rule's output limit
# and the decode cache follow the source limit, for every sentence.
_PRETRAINED_SOURCE_LIMIT = 256


def _target_logprobs(model: nn.Module, params: PyTree, inputs_BS: Array,
                     targets_BT: Array, mesh: Mesh | None = None) -> Array:
  """log p(target token | source, previous targets) ``[B, T]``, float32 (teacher forcing)."""
  with activation_sharding(mesh):
    logits_BTV = model.apply({"params": params}, inputs_BS, targets_BT)
  logprobs_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logprobs_BTV, targets_BT[..., None], axis=-1)[..., 0]


def _jit_on_mesh(fn: Callable, mesh: Mesh, *, row_args: int, keyed: bool) -> Callable:
  """``fn`` jitted with parameters replicated, then ``row_args`` arguments split by rows
  over the data axis, then (``keyed``) a replicated random key; outputs replicated, so
  every host of a multi-host run holds them whole."""
  replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P(DATA_AXIS))
  return jax.jit(fn, in_shardings=(replicated,) + (rows,) * row_args + (replicated,) * keyed,
                 out_shardings=replicated)


def search_program(model: nn.Module, config: DecodeConfig, mesh: Mesh, *, n_best: bool = False,
                   controls: tuple[str, ...] = ()) -> Callable:
  """The search a ``Translator`` runs, jitted over ``mesh``: ``(params, inputs_BS, *controls,
  rng) -> (tokens, scores)``.

  Parameters replicated, rows split over the ``data`` axis (activations too), the
  outputs replicated. ``controls`` names the per-row arrays that follow the
  sources, in ``CONTROLS`` order: ``"target_prefix"`` ``[B, P]``, ``"constraints"``
  ``[B, C, L]``. ``config.max_decode_len`` fixes the output limit. Also what
  ``seq2seq_jax.aot`` compiles for a TPU target.
  """
  unknown = set(controls) - set(CONTROLS)
  if unknown:
    raise ValueError(f"unknown controls {sorted(unknown)}; known: {', '.join(CONTROLS)}")
  search = search_fn(model, config, max_decode_len=config.max_decode_len, n_best=n_best)

  def run(params, inputs_BS, *rest):
    *arrays, rng = rest
    given = dict(zip(controls, arrays))
    with activation_sharding(mesh):
      return search(params, inputs_BS, rng, given.get("target_prefix"),
                    given.get("constraints"))
  return _jit_on_mesh(run, mesh, row_args=1 + len(controls), keyed=True)


def score_program(model: nn.Module, mesh: Mesh) -> Callable:
  """Forced decoding jitted over ``mesh``: ``(params, inputs_BS, targets_BT) -> logprobs_BT``,
  each target token's log-probability (the ``Translator.score`` program)."""
  return _jit_on_mesh(functools.partial(_target_logprobs, model, mesh=mesh), mesh, row_args=2,
                      keyed=False)


def put_global(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A host array (the same on every host) placed as ``sharding`` says, on one host or many."""
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def to_host(array: jax.Array) -> np.ndarray:
  """A replicated (or fully addressable) array as NumPy, on every host of a multi-host run."""
  if array.is_fully_addressable:
    return np.asarray(array)
  return np.asarray(array.addressable_data(0))


def output_lengths(tokens_NT: np.ndarray, eos_id: int) -> np.ndarray:
  """Generated tokens per row, EOS included (the whole row when it has no EOS): ``[N]``."""
  is_eos_NT = tokens_NT == eos_id
  return np.where(is_eos_NT.any(-1), is_eos_NT.argmax(-1) + 1, tokens_NT.shape[-1])


def total_logprobs(tokens_NT: np.ndarray, scores_N: np.ndarray, config: DecodeConfig,
                   eos_id: int) -> np.ndarray:
  """The total log-probability of each output, from a search's scores ``[N]`` (float64).

  Beam search divides by the GNMT length penalty of the output's length (EOS
  included); this multiplies it back. Greedy and sampling scores are totals already.
  """
  scores_N = np.asarray(scores_N, np.float64)
  if config.method != "beam":
    return scores_N
  lengths_N = output_lengths(tokens_NT, eos_id)
  return scores_N * np.asarray(length_penalty(lengths_N, config.alpha), np.float64)


def _one_ahead(items: Sequence[Any], dispatch: Callable[[Any], Any]) -> Iterator[tuple[Any, Any]]:
  """``(item, dispatch(item))`` for each item, yielded once the next item is dispatched: JAX
  runs asynchronously, so the devices work on one batch while the caller handles the last."""
  pending = None
  for item in items:
    running = (item, dispatch(item))
    if pending is not None:
      yield pending
    pending = running
  if pending is not None:
    yield pending


@dataclasses.dataclass(frozen=True)
class DecodedBatch:
  """One decoded batch of a plan, on the host, padding rows dropped.

  ``tokens`` is ``[n, T]``, or ``[n, W, T]`` for an n-best search; ``scores`` is
  ``[n]`` or ``[n, W]``: the search's scores (beam: divided by the length penalty).
  """

  batch: PlannedBatch
  tokens: np.ndarray
  scores: np.ndarray


class Translator:
  """Translates lists of sentences with a trained model (whole files: ``translate_file``).

  Sources are sorted by length and cut into batches; each batch is padded to one
  of a few bucket lengths and row counts, so a whole corpus compiles a handful of
  programs and a single sentence never recompiles. Rows decode independently: a
  sentence's translation does not depend on its neighbours in the batch, nor on
  the number of devices. Batches are split over the ``data`` axis of ``mesh``
  (``NamedSharding``, the mesh code of training), parameters replicated; while
  the devices decode one batch, the host prepares the next.

  Args:
    model: a model with the encode / init_cache / decode_step contract.
    params: its parameters.
    tokenizer: the run's ``seq2seq_jax.data.tokenizer.Tokenizer``, or a pretrained
      checkpoint's (``seq2seq_jax.pretrained.tokenizers``).
    decode_config: default search settings (``translate`` may override them).
    max_source_len: longest source in tokens (EOS included); longer inputs are
      truncated with a warning on the ``seq2seq_jax`` logger that names the limit
      and where it comes from. Default: the model's ``max_len`` (a Transformer's
      position table), or 128 for a model that states none.
    bucket_lengths: padded source lengths; they are extended to ``max_source_len``
      by doubling the largest below it (``batching.reaching``), so a limit above the
      buckets compiles a few more shapes, never one per length.
    batch_size: most rows decoded at once by ``translate`` and ``score``.
    mesh: a ``("data", "model")`` mesh (``seq2seq_jax.make_mesh()``: every device of
      every host); default: the first device alone.
    quantize: ``"int8"`` decodes with int8 weights and int8 products
      (``seq2seq_jax.quantization``: Transformer and T5 models, so every pretrained
      family); ``"none"`` (default) as given. ``model`` and ``params`` are then the
      quantized ones.
  """

  def __init__(self, model: nn.Module, params: PyTree, tokenizer: Any, *,
               decode_config: DecodeConfig = DecodeConfig(), max_source_len: int | None = None,
               bucket_lengths: Sequence[int] = (16, 32, 64), batch_size: int = 64,
               mesh: Mesh | None = None, quantize: str = "none"):
    model_max = getattr(getattr(model, "config", None), "max_len", None)
    if max_source_len is None:
      max_source_len = model_max or 128
      # where the limit comes from, as truncation warnings say it
      self.source_limit_origin = MODEL_LIMIT if model_max else "the Translator's default"
    else:
      self.source_limit_origin = (f"the max_source_len given (--max-source-len; the model "
                                  f"takes {model_max})" if model_max else
                                  "the max_source_len given (--max-source-len)")
    if model_max and max_source_len > model_max:
      raise ValueError(f"max_source_len={max_source_len} exceeds the model's max_len={model_max}: "
                       f"give at most {model_max} (--max-source-len)")
    if batch_size <= 0:
      raise ValueError(f"batch_size={batch_size} must be positive")
    self.quantize = quantization.check_mode(quantize)
    model, params = quantization.quantize(model, params, quantize)
    self.model = model
    self.tokenizer = tokenizer
    self.decode_config = decode_config
    self.max_source_len = max_source_len
    self.bucket_lengths = reaching(bucket_lengths, max_source_len)
    self.batch_size = batch_size
    self.config = None  # the ExperimentConfig, when loaded with from_workdir
    self.step = None  # the checkpoint step, when loaded with from_workdir
    self.pretrained = None  # the pretrained.Pretrained, when loaded with from_pretrained
    self.ids = special_ids(model)
    self.mesh = mesh if mesh is not None else make_mesh(devices=jax.devices()[:1])
    self.data_devices = self.mesh.shape[DATA_AXIS]  # batch rows come in multiples of this
    self._replicated = NamedSharding(self.mesh, P())
    self._rows = NamedSharding(self.mesh, P(DATA_AXIS))
    self.params = jax.tree.map(lambda x: put_global(jax.device_get(x), self._replicated), params)
    self._programs: dict[Any, Callable] = {}

  @classmethod
  def from_workdir(cls, workdir: str | os.PathLike, *, step: int | str | None = None,
                   dtype: str | None = None, **kwargs) -> "Translator":
    """Loads the model, parameters, tokenizer and settings a training run saved.

    Args:
      workdir: the training run's directory (holding ``checkpoints/``).
      step: ``"best"`` (highest validation BLEU), ``"latest"`` or a step number;
        default: the best when a checkpoint has a validation BLEU, else the latest.
      dtype: the compute dtype to decode in, "float32" or "bfloat16" (parameters stay
        float32); default: the run's.
      **kwargs: overrides of the constructor's keyword arguments (``mesh=...``,
        ``quantize="int8"``, ``max_source_len=...``; the source limit defaults to the model's
        ``max_len``, not to the run's ``data.max_source_len``, which filtered or cut training
        pairs).

    Raises:
      CheckpointError: ``workdir`` holds no checkpoint (the message says where it looked).
    """
    from seq2seq_jax import checkpoints
    from seq2seq_jax.models.registry import build_model
    from seq2seq_jax.training import restore

    directory = pathlib.Path(workdir).expanduser() / "checkpoints"
    if not directory.is_dir():
      raise checkpoints.CheckpointError(
          f"{directory} does not exist: {workdir} is not a training run's workdir; train first "
          "(seq2seq-jax train --workdir ...) or point to the right folder")
    with checkpoints.Checkpointer(directory, keep=1, async_save=False) as checkpointer:
      if step is None:
        step = "best" if checkpointer.best_step() is not None else "latest"
      step = checkpointer.resolve_step(step)
      tokenizer = checkpointer.load_tokenizer(step)
    if tokenizer is None:
      raise checkpoints.CheckpointError(f"{directory}/{step} holds no tokenizer")
    params, config = restore.load_params(directory, step=step)
    options = dict(decode_config=config.decode, bucket_lengths=config.data.bucket_lengths,
                   batch_size=config.data.eval_batch_size)
    options.update(kwargs)
    if dtype is not None:  # inference in another compute dtype than the run trained in
      config = dataclasses.replace(config, model=dataclasses.replace(config.model, dtype=dtype))
    translator = cls(build_model(config.model), params, tokenizer, **options)
    translator.config, translator.step = config, step
    return translator

  @classmethod
  def from_pretrained(cls, path: str | os.PathLike, *, dtype: str = "float32",
                      **kwargs) -> "Translator":
    """Loads a published checkpoint (OPUS-MT / Marian, M2M100, NLLB) saved by transformers.

    Searches as its ``generation_config.json`` says (``pretrained.decode_config``),
    except the length limit, which follows the ratio rule of ``max_decode_len``
    unless ``translate`` is given one.

    Args:
      path: a ``save_pretrained`` directory (see ``seq2seq_jax.pretrained.load``).
      dtype: compute dtype, "float32" or "bfloat16".
      **kwargs: overrides of the constructor's keyword arguments (``mesh=...``,
        ``quantize="int8"``; then ``pretrained.params`` is None: only the int8 copy is kept).
        The source limit defaults to 256 tokens where the model takes more (OPUS-MT 512,
        NLLB 1,024): the output limit and the decode cache grow with it, for every
        sentence; ``max_source_len=`` raises it up to the model's ``max_len``.
    """
    from seq2seq_jax import pretrained  # pylint: disable=import-outside-toplevel
    checkpoint = pretrained.load(path, dtype=dtype)
    model_max = checkpoint.config.max_len
    options = dict(decode_config=dataclasses.replace(checkpoint.decode_config, max_decode_len=0),
                   max_source_len=min(model_max, _PRETRAINED_SOURCE_LIMIT),
                   bucket_lengths=(16, 32, 64, 128), batch_size=32)
    options.update(kwargs)
    translator = cls(checkpoint.model, checkpoint.params, checkpoint.tokenizer, **options)
    if "max_source_len" not in kwargs:
      translator.source_limit_origin = (
          MODEL_LIMIT if translator.max_source_len == model_max else
          f"from_pretrained's default (the model takes {model_max}: raise it with "
          "max_source_len= or --max-source-len)")
    if translator.quantize != "none":  # the float parameters would stay in memory beside
      checkpoint = dataclasses.replace(checkpoint, params=None)
    translator.pretrained = checkpoint
    return translator

  @classmethod
  def ensemble(cls, translators: Sequence["Translator"], *, weights: Sequence[float] | None = None,
               average: str = "log", **kwargs) -> "Translator":
    """One translator whose model is an ``Ensemble`` of the given translators' models.

    The members must share one vocabulary (equal tokenizers); the first one's
    tokenizer, search settings, bucketing and mesh are kept, the shortest source
    limit applies. ``weights`` and ``average`` are ``Ensemble``'s.

    Example:
      >>> one, two = Translator.from_workdir("runs/tiny"), Translator.from_workdir("runs/tiny")
      >>> both = Translator.ensemble([one, two])
      >>> both.translate(["Ein Hund läuft."]) == one.translate(["Ein Hund läuft."])  # same model
      True
    """
    from seq2seq_jax.models.ensemble import Ensemble, ensemble_params

    if not translators:
      raise ValueError("an ensemble needs at least one translator")
    first, *others = translators
    for i, other in enumerate(others, start=1):
      if not text_controls.same_vocabulary(first.tokenizer, other.tokenizer):
        raise ValueError(f"ensemble member {i} has another vocabulary than member 0: an "
                         "ensemble averages predictions over one shared vocabulary")
    model = Ensemble(models=tuple(t.model for t in translators), average=average,
                     weights=None if weights is None else tuple(weights))
    options = dict(decode_config=first.decode_config, batch_size=first.batch_size,
                   max_source_len=min(t.max_source_len for t in translators),
                   bucket_lengths=first.bucket_lengths, mesh=first.mesh)
    options.update(kwargs)
    translator = cls(model, ensemble_params([t.params for t in translators]), first.tokenizer,
                     **options)
    if "max_source_len" not in kwargs:  # the shortest member's limit, and its reason
      translator.source_limit_origin = min(
          translators, key=lambda t: t.max_source_len).source_limit_origin
    translator.config, translator.step = first.config, first.step
    translator.pretrained = first.pretrained
    quantized = {t.quantize for t in translators} - {"none"}
    if quantized:  # members quantized one by one: say so for the whole
      translator.quantize = quantized.pop()
    return translator

  # ---- settings ------------------------------------------------------------------------------
  def max_decode_len(self, config: DecodeConfig) -> int:
    """The output limit used for every batch: the ratio applied to ``max_source_len``."""
    limit = config.decode_len(self.max_source_len)
    model_max = getattr(getattr(self.model, "config", None), "max_len", None)
    return min(limit, model_max) if model_max else limit

  def resolve_decode_config(self, *, beam_size: int | None = None, alpha: float | None = None,
                            method: str | None = None, max_decode_len: int | None = None,
                            target_lang: str | None = None,
                            **decode_options: Any) -> DecodeConfig:
    """The search ``translate`` runs: the defaults with these overrides, one fixed length limit.

    Arguments as ``translate``'s. The limit is the same for every batch, whatever
    its bucket, so a sentence's translation does not depend on the longest sentence
    it was batched with; searches stop as soon as every row has finished, so the
    limit costs nothing when unused.
    """
    config = text_controls.with_decode_options(self.decode_config, decode_options)
    changes: dict[str, Any] = {}
    if beam_size is not None:
      changes["beam_size"] = beam_size
      changes["method"] = "beam" if beam_size > 1 else "greedy"
    if alpha is not None:
      changes["alpha"] = alpha
    if method is not None:
      changes["method"] = method
    if max_decode_len is not None:
      changes["max_decode_len"] = max_decode_len
    prefix = self.tokenizer.target_prefix(target_lang)
    if len(prefix) > 1:
      raise ValueError(f"target prefix {prefix} has {len(prefix)} tokens; only one (a "
                       "language code) can be forced")
    if prefix:
      changes["forced_bos_id"] = prefix[0]
    if not changes.get("max_decode_len", config.max_decode_len):
      changes["max_decode_len"] = self.max_decode_len(config)
    return dataclasses.replace(config, **changes)

  # ---- tokens --------------------------------------------------------------------------------
  def encode(self, sentences: Sequence[str], source_lang: str | None = None, *,
             target_lang: str | None = None, numbers: Sequence[int] | None = None,
             what: str = "sentence",
             on_truncate: TruncationHandler | None = None) -> list[list[int]]:
    """Token ids of each sentence as the model reads them (language codes and EOS
    included, as the tokenizer adds them), truncated to ``max_source_len``.

    Args:
      sentences: source texts.
      source_lang: a multilingual checkpoint's source language code.
      target_lang: the target language, for checkpoints that mark it in the source
        (multilingual OPUS-MT's ``>>xx<<``, MADLAD-400's ``<2xx>``).
      numbers: how warnings name each sentence (e.g. its line number); default its index.
      what: the noun before the number in warnings ("sentence", "input.de: line").
      on_truncate: called as ``on_truncate(number, tokens, limit)`` for each truncated
        sentence instead of the warning.
    """
    rows = encode_sources(self.tokenizer, list(sentences), source_lang, target_lang)
    return truncate_rows(rows, self.max_source_len, what=what, numbers=numbers,
                         on_truncate=on_truncate, origin=self.source_limit_origin)

  def _pad(self, rows: list[list[int]], length: int, count: int) -> np.ndarray:
    return pad_batch(rows, length=length, count=count, pad_id=self.ids.pad_id,
                     eos_id=self.ids.eos_id)

  def plan(self, lengths: Sequence[int], *, max_rows: int | None = None,
           batch_tokens: int | None = None, row_multiple: int = 1,
           bucket_lengths: Sequence[int] | None = None,
           full_tails: bool = False) -> list[PlannedBatch]:
    """Batches for sources of token ``lengths`` (``batching.plan_batches``): at most
    ``max_rows`` (default ``batch_size``) rows, a multiple of ``row_multiple`` and of
    the mesh's data axis."""
    return plan_batches(lengths, bucket_lengths=bucket_lengths or self.bucket_lengths,
                        max_rows=max_rows or self.batch_size, batch_tokens=batch_tokens,
                        row_multiple=math.lcm(row_multiple, self.data_devices),
                        full_tails=full_tails)

  # ---- decoding ------------------------------------------------------------------------------
  def _program(self, key: Any, build: Callable[[], Callable]) -> Callable:
    """A jitted program (``search_program``, ``score_program``), built once."""
    if key not in self._programs:
      self._programs[key] = build()
    return self._programs[key]

  def place_batch(self, encoded: Sequence[Sequence[int]], batch: PlannedBatch) -> jax.Array:
    """The sources of ``batch`` padded to its shape ``[rows, length]``, rows split over the
    mesh's data axis (on every host, each its devices' rows): what ``search`` reads."""
    inputs_BS = self._pad([encoded[i] for i in batch.indices], batch.length, batch.rows)
    return put_global(inputs_BS, self._rows)

  def search(self, config: DecodeConfig, *, n_best: bool = False,
             controls: tuple[str, ...] = ()) -> Callable:
    """The jitted search over the mesh: ``(params, inputs_BS, *controls, rng) -> (tokens,
    scores)``, ``controls`` naming the per-row arrays that follow the sources, in this
    order: ``"target_prefix"`` ``[B, P]``, ``"constraints"`` ``[B, C, L]`` (``search_program``)."""
    return self._program(("search", config, n_best, controls),
                         lambda: search_program(self.model, config, self.mesh, n_best=n_best,
                                                controls=controls))

  def decode_batches(self, encoded: Sequence[Sequence[int]], plan: Sequence[PlannedBatch],
                     config: DecodeConfig, *, n_best: bool = False,
                     rng: jax.Array | None = None,
                     controls: text_controls.SentenceControls | None = None
                     ) -> Iterator[DecodedBatch]:
    """Decodes the batches of ``plan`` in order, yielding each on the host.

    The next batch is sent to the devices before the previous one is fetched, so the
    host's work (padding, detokenizing, writing) overlaps the devices'. A batch
    samples with ``fold_in(rng, i)``, ``i`` its first sentence's index in ``encoded``
    (default ``rng``: ``key(config.seed)``): the same key wherever the plan is cut.
    ``controls`` holds the target prefixes and constraint phrases of the sentences
    of ``encoded`` (``text_controls.sentence_controls``); a batch none of whose
    sentences has one runs the plain search.
    """
    rng = jax.random.key(config.seed) if rng is None else rng

    def dispatch(batch: PlannedBatch):
      arrays = {} if controls is None else controls.batch_arrays(
          batch.indices, batch.rows, pad_id=self.ids.pad_id)
      if arrays:
        prefix, phrases = check_controls(self.model, config, batch.rows, config.max_decode_len,
                                         arrays.get("target_prefix"), arrays.get("constraints"))
        arrays = {name: value for name, value in (("target_prefix", prefix),
                                                  ("constraints", phrases))
                  if value is not None}
      search = self.search(config, n_best=n_best, controls=tuple(arrays))
      return search(self.params, self.place_batch(encoded, batch),
                    *(put_global(np.asarray(value, np.int32), self._rows)
                      for value in arrays.values()),
                    jax.random.fold_in(rng, batch.indices[0]))

    for batch, (tokens, scores) in _one_ahead(plan, dispatch):
      count = len(batch.indices)
      yield DecodedBatch(batch, to_host(tokens)[:count], to_host(scores)[:count])

  def translate(self, sentences: Sequence[str], *, beam_size: int | None = None,
                alpha: float | None = None, method: str | None = None,
                max_decode_len: int | None = None, source_lang: str | None = None,
                target_lang: str | None = None, target_prefix: Sequence[str] | None = None,
                constraints: Sequence[Sequence[str]] | None = None,
                **decode_options: Any) -> list[str]:
    """Translations of ``sentences``, in their order; an empty line gives ''.

    Args:
      sentences: source texts.
      beam_size: > 1 implies beam search unless ``method`` says otherwise.
      alpha: the GNMT length-penalty exponent of beam search.
      method: "greedy", "beam" or "sample".
      max_decode_len: the most tokens generated per sentence, EOS and a forced
        language code included (as transformers' ``max_new_tokens``); default: the
        ratio rule of ``max_decode_len()``.
      source_lang, target_lang: language codes of multilingual checkpoints
        (M2M100 "de", NLLB "deu_Latn", mBART-50 "de_DE"; the target's code is forced
        as the first output token; OPUS-MT and MADLAD-400 mark only the target, in
        front of the source). Must be None for single-pair models.
      target_prefix: one text per sentence ('' for none) that its translation must
        begin with (after a forced language code); the search goes on from there.
      constraints: one list of phrases per sentence ([] for none) that its
        translation must contain; needs beam search (see ``decoding.constraints``).
      **decode_options: other ``DecodeConfig`` fields for this call, e.g.
        ``no_repeat_ngram_size=3``, ``repetition_penalty=1.2``,
        ``num_beam_groups=2, diversity_penalty=0.5``, ``early_stopping=True``.

    Example:
      >>> translator = Translator.from_pretrained("opus-mt-de-en")
      >>> out = translator.translate(["Ein Hund läuft im Park."], beam_size=4,
      ...                            target_prefix=["The dog"], constraints=[["park"]],
      ...                            no_repeat_ngram_size=3)
      >>> out[0].startswith("The dog"), "park" in out[0]
      (True, True)
    """
    config = self.resolve_decode_config(beam_size=beam_size, alpha=alpha, method=method,
                                        max_decode_len=max_decode_len, target_lang=target_lang,
                                        **decode_options)
    outputs = [""] * len(sentences)
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    encoded = self.encode([sentences[i] for i in todo], source_lang, target_lang=target_lang)
    controls = text_controls.sentence_controls(
        self.tokenizer, config, eos_id=self.ids.eos_id, count=len(sentences), todo=todo,
        target_prefix=target_prefix, constraints=constraints, target_lang=target_lang)
    if controls.prefixes is None and controls.phrases is None:
      controls = None
    plan = self.plan([len(ids) for ids in encoded])
    for decoded in self.decode_batches(encoded, plan, config, controls=controls):
      texts = self.tokenizer.decode_batch(decoded.tokens)
      for j, text in zip(decoded.batch.indices, texts):
        outputs[todo[j]] = text
    return outputs

  # ---- forced decoding -----------------------------------------------------------------------
  def encode_targets(self, targets: Sequence[str], target_lang: str | None = None, *,
                     numbers: Sequence[int] | None = None, what: str = "target",
                     on_truncate: TruncationHandler | None = None) -> list[list[int]]:
    """Decoder targets (forced prefix, pieces, EOS), truncated to the model's ``max_len``."""
    max_len = getattr(getattr(self.model, "config", None), "max_len", None) or 1 << 30
    return truncate_rows(self.tokenizer.encode_target(list(targets), target_lang), max_len,
                         what=what, numbers=numbers, on_truncate=on_truncate)

  def score_plan(self, inputs: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                 **plan_options) -> list[PlannedBatch]:
    """Batches for forced decoding, by the longer side of each pair (``plan``'s options)."""
    return self.plan([max(len(src), len(tgt)) for src, tgt in zip(inputs, outputs)],
                     bucket_lengths=self._target_buckets(), **plan_options)

  def _target_buckets(self) -> tuple[int, ...]:
    max_len = getattr(getattr(self.model, "config", None), "max_len", None) or 1 << 30
    return tuple(sorted(set(self.bucket_lengths) | {max_len}))

  def score_batches(self, inputs: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                    plan: Sequence[PlannedBatch], *, prefix: int = 0
                    ) -> Iterator[tuple[PlannedBatch, list[float]]]:
    """Forced decoding of the batches of ``plan`` (``score_plan``), one batch ahead on the
    devices: each pair's summed target log p, its first ``prefix`` tokens fed but not
    scored (float64 sums of float32 log-probabilities)."""
    program = self._program(("score",), lambda: score_program(self.model, self.mesh))
    target_buckets = self._target_buckets()

    def dispatch(batch: PlannedBatch):
      sources = [inputs[j] for j in batch.indices]
      targets = [outputs[j] for j in batch.indices]
      inputs_BS = self._pad(sources, bucket_length(self.bucket_lengths, max(map(len, sources))),
                            batch.rows)
      targets_BT = self._pad(targets, bucket_length(target_buckets, max(map(len, targets))),
                             batch.rows)
      return program(self.params, put_global(inputs_BS, self._rows),
                     put_global(targets_BT, self._rows))

    for batch, logprobs in _one_ahead(plan, dispatch):
      logprobs_BT = to_host(logprobs)
      yield batch, [float(np.sum(logprobs_BT[r, prefix:len(outputs[j])], dtype=np.float64))
                    for r, j in enumerate(batch.indices)]

  def score(self, sources: Sequence[str], targets: Sequence[str], *,
            source_lang: str | None = None, target_lang: str | None = None) -> list[float]:
    """Forced decoding: for each pair, the sum of log p over the target's tokens and EOS.

    The model reads each source and is fed each target (teacher forcing); the score
    is the natural-log probability the model gives the target's tokens, EOS
    included, not divided by any length penalty. A forced prefix (a multilingual
    checkpoint's target language code) is fed but not scored, as generation forces
    it. Targets longer than the model's ``max_len`` are truncated with a warning.
    """
    if len(sources) != len(targets):
      raise ValueError(f"score needs one target per source; got {len(sources)} sources and "
                       f"{len(targets)} targets")
    prefix = len(self.tokenizer.target_prefix(target_lang))
    return self.score_ids(self.encode(list(sources), source_lang, target_lang=target_lang),
                          self.encode_targets(list(targets), target_lang), prefix=prefix)

  def score_ids(self, inputs: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], *,
                prefix: int = 0) -> list[float]:
    """``score`` of token ids: ``inputs`` as ``encode`` gives them, ``outputs`` as
    ``encode_targets`` (EOS last); the first ``prefix`` target tokens are not scored."""
    scores = [0.0] * len(inputs)
    for batch, values in self.score_batches(inputs, outputs, self.score_plan(inputs, outputs),
                                            prefix=prefix):
      for j, value in zip(batch.indices, values):
        scores[j] = value
    return scores
