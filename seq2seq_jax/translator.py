"""Text in, text out: tokenize, bucket, generate, restore order, detokenize.

Example:
  >>> translator = Translator.from_workdir("runs/tiny")  # a run that ``train`` wrote
  >>> two = translator.translate(["Ein Hund läuft.", "Zwei Männer sitzen auf einer Bank."],
  ...                            beam_size=4, alpha=0.6)
  >>> len(two), all(isinstance(text, str) for text in two)
  (2, True)
  >>> translator.translate(["Ein Hund läuft."], beam_size=4, alpha=0.6) == two[:1]  # alone
  True
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.configs import DecodeConfig
from seq2seq_jax.decoding import generate
from seq2seq_jax.models.base import special_ids
from seq2seq_jax.types import Array, PyTree

logger = logging.getLogger("seq2seq_jax")


def _ceil_to(buckets: Sequence[int], n: int) -> int:
  return next(b for b in buckets if b >= n)


@functools.partial(jax.jit, static_argnames=("model",))
def _target_logprobs(model: nn.Module, params: PyTree, inputs_BS: Array,
                     targets_BT: Array) -> Array:
  """log p(target token | source, previous targets) ``[B, T]``, float32 (teacher forcing)."""
  logits_BTV = model.apply({"params": params}, inputs_BS, targets_BT)
  logprobs_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logprobs_BTV, targets_BT[..., None], axis=-1)[..., 0]


class Translator:
  """Translates lists of sentences with a trained model.

  Sources are sorted by length and cut into batches; each batch is padded to one
  of a few bucket lengths and a power-of-two row count, so a whole corpus
  compiles a handful of programs and a single sentence never recompiles. Rows
  decode independently: a sentence's translation does not depend on its
  neighbours in the batch.

  Args:
    model: a model with the encode / init_cache / decode_step contract.
    params: its parameters.
    tokenizer: the run's ``seq2seq_jax.data.tokenizer.Tokenizer``, or a pretrained
      checkpoint's (``seq2seq_jax.pretrained.tokenizers``).
    decode_config: default search settings (``translate`` may override them).
    max_source_len: longest source in tokens (EOS included); longer inputs are
      truncated with a warning on the ``seq2seq_jax`` logger.
    bucket_lengths: padded source lengths; ``max_source_len`` is always added.
    batch_size: most rows decoded at once.
  """

  def __init__(self, model: nn.Module, params: PyTree, tokenizer: Any, *,
               decode_config: DecodeConfig = DecodeConfig(), max_source_len: int = 128,
               bucket_lengths: Sequence[int] = (16, 32, 64), batch_size: int = 64):
    model_max = getattr(getattr(model, "config", None), "max_len", max_source_len)
    if max_source_len > model_max:
      raise ValueError(f"max_source_len={max_source_len} exceeds the model's max_len={model_max}")
    if batch_size <= 0:
      raise ValueError(f"batch_size={batch_size} must be positive")
    self.model = model
    self.params = params
    self.tokenizer = tokenizer
    self.decode_config = decode_config
    self.max_source_len = max_source_len
    self.bucket_lengths = tuple(sorted({b for b in bucket_lengths if b < max_source_len}
                                       | {max_source_len}))
    self.batch_size = batch_size
    self.config = None  # the ExperimentConfig, when loaded with from_workdir
    self.step = None  # the checkpoint step, when loaded with from_workdir
    self.pretrained = None  # the pretrained.Pretrained, when loaded with from_pretrained
    self.ids = special_ids(model)
    self.row_buckets = tuple(sorted({min(2 ** i, batch_size)
                                     for i in range(batch_size.bit_length() + 1)}))

  @classmethod
  def from_workdir(cls, workdir: str | os.PathLike, *, step: int | str | None = None,
                   **kwargs) -> "Translator":
    """Loads the model, parameters, tokenizer and settings a training run saved.

    Args:
      workdir: the training run's directory (holding ``checkpoints/``).
      step: ``"best"`` (highest validation BLEU), ``"latest"`` or a step number;
        default: the best when a checkpoint has a validation BLEU, else the latest.
      **kwargs: overrides of the constructor's keyword arguments.

    Raises:
      CheckpointError: ``workdir`` holds no checkpoint (the message says where it looked).
    """
    from seq2seq_jax import checkpoints
    from seq2seq_jax.models.registry import build_model

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
    params, config = checkpoints.load_params(directory, step=step)
    options = dict(decode_config=config.decode,
                   max_source_len=min(config.model.max_len, config.data.max_source_len),
                   bucket_lengths=config.data.bucket_lengths,
                   batch_size=config.data.eval_batch_size)
    options.update(kwargs)
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
      **kwargs: overrides of the constructor's keyword arguments.
    """
    from seq2seq_jax import pretrained  # pylint: disable=import-outside-toplevel
    checkpoint = pretrained.load(path, dtype=dtype)
    options = dict(decode_config=dataclasses.replace(checkpoint.decode_config, max_decode_len=0),
                   max_source_len=min(checkpoint.config.max_len, 256),
                   bucket_lengths=(16, 32, 64, 128), batch_size=32)
    options.update(kwargs)
    translator = cls(checkpoint.model, checkpoint.params, checkpoint.tokenizer, **options)
    translator.pretrained = checkpoint
    return translator

  @classmethod
  def ensemble(cls, translators: Sequence["Translator"], *, weights: Sequence[float] | None = None,
               average: str = "log", **kwargs) -> "Translator":
    """One translator whose model is an ``Ensemble`` of the given translators' models.

    The members must share one vocabulary (equal tokenizers); the first one's
    tokenizer, search settings and bucketing are kept, the shortest source limit
    applies. ``weights`` and ``average`` are ``Ensemble``'s.

    Example:
      >>> one, two = Translator.from_workdir("runs/tiny"), Translator.from_workdir("runs/tiny")
      >>> both = Translator.ensemble([one, two])
      >>> both.translate(["Ein Hund läuft."]) == one.translate(["Ein Hund läuft."])  # same model
      True
    """
    from seq2seq_jax.models.ensemble import Ensemble, ensemble_params
    from seq2seq_jax.text_controls import same_vocabulary

    first, *others = translators
    for i, other in enumerate(others, start=1):
      if not same_vocabulary(first.tokenizer, other.tokenizer):
        raise ValueError(f"ensemble member {i} has another vocabulary than member 0: an "
                         "ensemble averages predictions over one shared vocabulary")
    model = Ensemble(models=tuple(t.model for t in translators), average=average,
                     weights=None if weights is None else tuple(weights))
    options = dict(decode_config=first.decode_config, batch_size=first.batch_size,
                   max_source_len=min(t.max_source_len for t in translators),
                   bucket_lengths=first.bucket_lengths)
    options.update(kwargs)
    translator = cls(model, ensemble_params([t.params for t in translators]), first.tokenizer,
                     **options)
    translator.config, translator.step = first.config, first.step
    translator.pretrained = first.pretrained
    return translator

  def max_decode_len(self, config: DecodeConfig) -> int:
    """The output limit used for every batch: the ratio applied to ``max_source_len``."""
    limit = config.decode_len(self.max_source_len)
    model_max = getattr(getattr(self.model, "config", None), "max_len", None)
    return min(limit, model_max) if model_max else limit

  def _truncate(self, rows: list[list[int]], limit: int, what: str) -> list[list[int]]:
    """Rows longer than ``limit`` keep their first ``limit - 1`` ids and their last (EOS)."""
    out = []
    for i, ids in enumerate(rows):
      if len(ids) > limit:
        logger.warning("%s %d has %d tokens; truncated to the model's limit of %d "
                       "(EOS included)", what, i, len(ids), limit)
        ids = ids[:limit - 1] + ids[-1:]
      out.append(list(ids))
    return out

  def encode(self, sentences: Sequence[str], source_lang: str | None = None) -> list[list[int]]:
    """Token ids of each sentence as the model reads them (language code and EOS
    included, as the tokenizer adds them), truncated to ``max_source_len``."""
    rows = self.tokenizer.encode_source(list(sentences), source_lang)
    return self._truncate(rows, self.max_source_len, "sentence")

  def _pad(self, rows: list[list[int]], length: int, count: int) -> np.ndarray:
    """``count`` rows of ``length`` ids; rows past ``len(rows)`` are an empty sentence."""
    batch = np.full((count, length), self.ids.pad_id, np.int32)
    batch[:, 0] = self.ids.eos_id
    for r, ids in enumerate(rows):
      batch[r, :len(ids)] = ids
    return batch

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
        (M2M100 "de", NLLB "deu_Latn"); the target's code is forced as the first
        output token. Must be None for single-pair models.
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
    from seq2seq_jax import text_controls

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
      # One limit for every batch, whatever its bucket, so a sentence's translation
      # does not depend on the longest sentence it was batched with. Searches stop
      # as soon as every row has finished, so the limit costs nothing when unused.
      changes["max_decode_len"] = self.max_decode_len(config)
    config = dataclasses.replace(config, **changes)
    outputs = [""] * len(sentences)
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    encoded = self.encode([sentences[i] for i in todo], source_lang)
    controls = text_controls.sentence_controls(
        self.tokenizer, config, eos_id=self.ids.eos_id, count=len(sentences), todo=todo,
        target_prefix=target_prefix, constraints=constraints, target_lang=target_lang)
    order = sorted(range(len(todo)), key=lambda j: -len(encoded[j]))
    for start in range(0, len(order), self.batch_size):
      chunk = order[start:start + self.batch_size]
      length = _ceil_to(self.bucket_lengths, max(len(encoded[j]) for j in chunk))
      rows = _ceil_to(self.row_buckets, len(chunk))
      inputs_BS = self._pad([encoded[j] for j in chunk], length, rows)
      tokens_BT, _ = generate(self.model, self.params, inputs_BS, config,
                              **controls.batch_arrays(chunk, rows, pad_id=self.ids.pad_id))
      texts = self.tokenizer.decode_batch(np.asarray(tokens_BT)[:len(chunk)])
      for j, text in zip(chunk, texts):
        outputs[todo[j]] = text
    return outputs

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
    inputs = self.encode(list(sources), source_lang)
    max_len = getattr(getattr(self.model, "config", None), "max_len", None) or 1 << 30
    outputs = self._truncate(self.tokenizer.encode_target(list(targets), target_lang), max_len,
                             "target")
    scores = [0.0] * len(sources)
    order = sorted(range(len(sources)), key=lambda j: -max(len(inputs[j]), len(outputs[j])))
    target_buckets = tuple(sorted(set(self.bucket_lengths) | {max_len}))
    for start in range(0, len(order), self.batch_size):
      chunk = order[start:start + self.batch_size]
      rows = _ceil_to(self.row_buckets, len(chunk))
      inputs_BS = self._pad([inputs[j] for j in chunk],
                            _ceil_to(self.bucket_lengths, max(len(inputs[j]) for j in chunk)), rows)
      targets_BT = self._pad([outputs[j] for j in chunk],
                             _ceil_to(target_buckets, max(len(outputs[j]) for j in chunk)), rows)
      logprobs_BT = np.asarray(_target_logprobs(self.model, self.params, inputs_BS, targets_BT))
      for r, j in enumerate(chunk):
        scores[j] = float(np.sum(logprobs_BT[r, prefix:len(outputs[j])], dtype=np.float64))
    return scores
