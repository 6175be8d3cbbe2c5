"""Published translation checkpoints in JAX: OPUS-MT (MarianMT), M2M100 / NLLB-200, mBART-50,
and the T5 family (T5, flan-T5, mT5, MADLAD-400).

``load(path)`` reads a directory as transformers' ``save_pretrained`` writes it
(``config.json``, ``model.safetensors``, a sharded ``model.safetensors.index.json``
or ``pytorch_model.bin``, ``generation_config.json``, the tokenizer files) into this
library's ``Transformer`` or ``T5``, its parameters, a sentencepiece tokenizer and a
``DecodeConfig``, without torch or transformers. ``save`` writes them back in that
layout. Each checkpoint family is one module here: a mapping of names and shapes
onto the library's parameters (``marian``, ``m2m100``, ``mbart``, ``t5``) and its
tokenizer (``tokenizers``).

Example:
  >>> import seq2seq_jax as s2s
  >>> from seq2seq_jax import pretrained
  >>> checkpoint = pretrained.load("opus-mt-de-en")  # a local save_pretrained directory
  >>> checkpoint.family, type(checkpoint.model).__name__
  ('marian', 'Transformer')
  >>> input_ids = checkpoint.tokenizer.encode_source(["Ein Hund läuft."])
  >>> tokens, scores = s2s.generate(checkpoint.model, checkpoint.params, input_ids,
  ...                               checkpoint.decode_config)
  >>> [type(text) for text in checkpoint.tokenizer.decode_batch(tokens)]
  [<class 'str'>]
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import flax.linen as nn

from seq2seq_jax.configs import (DataConfig, DecodeConfig, ExperimentConfig, T5Config,
                                 TrainConfig, TransformerConfig)
from seq2seq_jax.models.registry import build_model
from seq2seq_jax.pretrained import _convert, _io, m2m100, marian, mbart, t5
from seq2seq_jax.types import PyTree

logger = logging.getLogger("seq2seq_jax")

# transformers' model_type -> the module that maps that family onto this library.
FAMILIES = {marian.MODEL_TYPE: marian, m2m100.MODEL_TYPE: m2m100, mbart.MODEL_TYPE: mbart,
            **{model_type: t5 for model_type in t5.MODEL_TYPES}}
# What each family's module supports, for messages.
_ARCHITECTURES = ("MarianMTModel, M2M100ForConditionalGeneration, MBartForConditionalGeneration, "
                  "T5ForConditionalGeneration, MT5ForConditionalGeneration")

ModelConfig = TransformerConfig | T5Config

# generation_config.json fields that would change outputs in ways this library's
# search does not reproduce (a warning names them); decode_config honours the others.
_UNSUPPORTED_GENERATION = {"min_length": 0, "min_new_tokens": None, "do_sample": False,
                           "encoder_no_repeat_ngram_size": 0,
                           "encoder_repetition_penalty": 1.0}


@dataclasses.dataclass
class Pretrained:
  """A loaded checkpoint: this library's model, parameters, tokenizer and search settings.

  Attributes:
    model: a ``Transformer`` or a ``T5`` (the encode / decode / init_cache /
      decode_step contract).
    params: its parameters, float32 jax arrays.
    tokenizer: a ``tokenizers.MarianTokenizer``, ``M2M100Tokenizer``,
      ``NllbTokenizer``, ``MBart50Tokenizer`` or ``T5Tokenizer`` (None when loaded
      with ``with_tokenizer=False``).
    decode_config: the search of ``generation_config.json`` (see ``decode_config``).
    family: transformers' ``model_type``: ``"marian"``, ``"m2m_100"``, ``"mbart"``,
      ``"t5"`` or ``"mt5"``.
    hf_config: ``config.json`` as read, written back by ``save``.
    generation_config: ``generation_config.json`` as read ({} when absent).
    path: where it was loaded from.
  """

  model: nn.Module
  params: PyTree
  tokenizer: Any
  decode_config: DecodeConfig
  family: str
  hf_config: dict[str, Any]
  generation_config: dict[str, Any]
  path: pathlib.Path | None = None

  @property
  def config(self) -> ModelConfig:
    return self.model.config


def _resolve(path: str | os.PathLike) -> pathlib.Path:
  directory = pathlib.Path(path).expanduser()
  if directory.is_dir():
    return directory
  if directory.exists():
    raise ValueError(f"{directory}: is a file; pass the directory save_pretrained wrote")
  name = str(path)
  if name.count("/") == 1 and not name.startswith((".", "/", "~")):
    try:
      import huggingface_hub  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise ValueError(f"{name}: no such directory; to fetch it from the Hugging Face hub "
                       "install huggingface_hub, or pass a local directory") from None
    try:
      return pathlib.Path(huggingface_hub.snapshot_download(
          name, allow_patterns=["*.json", "*.safetensors", "pytorch_model.bin", "*.spm",
                                "*.model", "*.txt"]))
    except Exception as error:  # network, authentication, unknown id: all say why
      raise ValueError(f"{name}: no such directory, and the hub download failed: "
                       f"{type(error).__name__}: {error}") from None
  raise ValueError(f"{directory}: no such directory")


def _family(hf_config: dict[str, Any], source: pathlib.Path):
  model_type = hf_config.get("model_type")
  architectures = hf_config.get("architectures") or []
  if model_type not in FAMILIES:
    raise ValueError(f"{source}: model_type={model_type!r} is not supported; this library "
                     f"loads {', '.join(sorted(FAMILIES))} ({_ARCHITECTURES})")
  family = FAMILIES[model_type]
  unknown = [a for a in architectures if a not in family.ARCHITECTURES]
  if unknown:
    raise ValueError(f"{source}: architectures={unknown} is not supported for model_type="
                     f"{model_type!r}; supported: {', '.join(family.ARCHITECTURES)}")
  return family


def decode_config(generation: dict[str, Any], config: ModelConfig,
                  source: pathlib.Path) -> DecodeConfig:
  """The ``DecodeConfig`` of a ``generation_config.json``.

  Honoured, with transformers' defaults where a field is absent: ``num_beams`` (beam
  search when > 1), ``max_new_tokens`` or ``max_length`` (which counts the decoder
  start, so ``max_length - 1`` tokens are generated), ``forced_bos_token_id``,
  ``forced_eos_token_id`` (EOS at the length limit), single-token ``bad_words_ids``
  (never generated), ``length_penalty`` (1.0: the exponent of the ``"power"`` form
  ``length ** length_penalty``), ``early_stopping`` (False), ``num_beam_groups`` and
  ``diversity_penalty``, ``no_repeat_ngram_size``, ``repetition_penalty`` and
  ``renormalize_logits``. Fields that change outputs in ways this search does not
  reproduce (``min_length``, ``do_sample``...) are named in a warning.
  """
  where = source / "generation_config.json"
  for name, neutral in _UNSUPPORTED_GENERATION.items():
    if generation.get(name, neutral) not in (neutral, None):
      logger.warning("%s: %s=%r is not supported and is ignored", where, name,
                     generation[name])
  bad = generation.get("bad_words_ids") or []
  if not isinstance(bad, list) or any(not isinstance(ids, list) or len(ids) != 1 for ids in bad):
    raise ValueError(f"{where}: bad_words_ids={bad!r}: only single-token entries "
                     "([[id], ...]) are supported")
  forced_eos = generation.get("forced_eos_token_id")
  if forced_eos is not None and forced_eos != config.eos_id:
    raise ValueError(f"{where}: forced_eos_token_id={forced_eos!r} differs from the model's "
                     f"eos id {config.eos_id}; only the model's EOS can be forced")
  if generation.get("max_new_tokens"):
    max_decode_len = int(generation["max_new_tokens"])
  else:
    max_decode_len = int(generation.get("max_length") or 20) - 1
  max_decode_len = min(max_decode_len, config.max_len)
  beams = int(generation.get("num_beams") or 1)
  forced_bos = generation.get("forced_bos_token_id")
  length_penalty = float(generation.get("length_penalty", 1.0))
  if length_penalty < 0:
    logger.warning("%s: length_penalty=%r < 0 (favouring short outputs) is not supported; "
                   "using 0", where, length_penalty)
    length_penalty = 0.0
  groups = int(generation.get("num_beam_groups") or 1)
  return DecodeConfig(
      method="beam" if beams > 1 else "greedy", beam_size=max(beams, 1),
      alpha=length_penalty, length_penalty_form="power",
      early_stopping=generation.get("early_stopping", False),
      num_beam_groups=groups if beams > 1 else 1,
      diversity_penalty=float(generation.get("diversity_penalty") or 0.0) if groups > 1 else 0.0,
      no_repeat_ngram_size=int(generation.get("no_repeat_ngram_size") or 0),
      repetition_penalty=float(generation.get("repetition_penalty") or 1.0),
      renormalize_logits=bool(generation.get("renormalize_logits", False)),
      max_decode_len=max(max_decode_len, 1), forced_bos_id=forced_bos,
      force_eos_at_limit=forced_eos is not None,
      suppress_ids=tuple(sorted({ids[0] for ids in bad})))


def load_config(path: str | os.PathLike, *,
                dtype: str = "float32") -> tuple[ModelConfig, DecodeConfig]:
  """The model config and the search of a checkpoint directory, from its ``config.json``
  (and ``generation_config.json``) alone: no weights, no tokenizer.

  What ``seq2seq-jax compile --pretrained DIR`` needs to compile a published model's
  programs from its shapes: a ``TransformerConfig`` (Marian, M2M100, NLLB, mBART) or
  a ``T5Config`` (T5, mT5, MADLAD-400), which ``build_model`` builds. Raises
  ``ValueError`` naming the file and field, as ``load``.

  Example:
    >>> config, search = load_config("opus-mt-de-en")
    >>> type(config).__name__, config.positions, search.method
    ('TransformerConfig', 'sinusoidal_marian', 'beam')
  """
  directory = _resolve(path)
  hf_config = _io.read_json(directory / "config.json", "config.json")
  family = _family(hf_config, directory / "config.json")
  config = family.model_config(hf_config, directory / "config.json", dtype)
  return config, decode_config(_generation(directory), config, directory)


def _generation(directory: pathlib.Path) -> dict[str, Any]:
  path = directory / "generation_config.json"
  return _io.read_json(path, "generation_config.json") if path.is_file() else {}


def load(path: str | os.PathLike, *, dtype: str = "float32", with_tokenizer: bool = True,
         check_finite: bool = True) -> Pretrained:
  """Loads a MarianMT, M2M100 / NLLB, mBART or T5-family checkpoint directory.

  The tensors are read and converted one at a time (``model.safetensors``, the
  shards of ``model.safetensors.index.json``, or ``pytorch_model.bin``), so the
  load holds the parameters and one tensor in flight, not the checkpoint twice.

  Args:
    path: a local directory as ``save_pretrained`` writes it; a hub id
      ("Helsinki-NLP/opus-mt-de-en") is fetched with ``huggingface_hub`` when it
      is installed and online.
    dtype: the compute dtype, "float32" or "bfloat16" (parameters stay float32).
    with_tokenizer: False loads a directory without tokenizer files (token ids in
      and out only); ``tokenizer`` is then None.
    check_finite: refuse a tensor holding NaN or infinity (a damaged file), naming
      it; the check reads each value once more (its cost: benchmarks/RESULTS.md).

  Raises:
    ValueError: naming the file and the field, for a directory without weights,
      an unsupported architecture, a truncated or corrupt weights file, a tensor
      that is missing, unknown, of the wrong shape or not finite, or tokenizer
      files that do not fit the vocabulary of config.json.
  """
  directory = _resolve(path)
  hf_config = _io.read_json(directory / "config.json", "config.json")
  family = _family(hf_config, directory / "config.json")
  config = family.model_config(hf_config, directory / "config.json", dtype)
  weights = _io.read_weights(directory)
  if hasattr(family, "config_for_weights"):  # what only the tensors tell (T5's untied head)
    config = family.config_for_weights(config, weights, check_finite=check_finite)
  rules = family.rules(config, weights)
  model = build_model(config)
  ids = jnp.zeros((1, 1), jnp.int32)
  expected = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids))["params"]
  used = {rule.hf_name for rule in rules}
  unknown = sorted(n for n in weights if n not in used and not family.ignored(n))
  if unknown:
    raise ValueError(f"{weights.path}: tensors {unknown[:5]}{' ...' if len(unknown) > 5 else ''} "
                     f"have no place in the {family.MODEL_TYPE} model config.json describes")
  params = _convert.apply_rules(rules, weights, expected, check_finite=check_finite)
  missing = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(expected)
             if not _has_path(params, p)]
  if missing:
    raise ValueError(f"{weights.path}: no tensor for parameters {missing}")
  family.check_fixed_tensors(config, weights)
  generation = _generation(directory)
  tokenizer = None
  if with_tokenizer:
    from seq2seq_jax.pretrained import tokenizers  # pylint: disable=import-outside-toplevel
    tokenizer = tokenizers.load_tokenizer(directory, hf_config["model_type"])
    _check_tokenizer_fits(tokenizer, config, directory)
  return Pretrained(model=model, params=params, tokenizer=tokenizer,
                    decode_config=decode_config(generation, config, directory),
                    family=hf_config["model_type"], hf_config=hf_config,
                    generation_config=generation,
                    path=directory)


def _check_tokenizer_fits(tokenizer: Any, config: ModelConfig, directory: pathlib.Path) -> None:
  """Tokenizer ids past the embedding would index nothing: both files are named."""
  source_rows = config.vocab_size
  target_rows = getattr(config, "output_vocab_size", config.vocab_size)
  for side, ids, rows in (("target", tokenizer.vocab_size, target_rows),
                          ("source", tokenizer.source_vocab_size, source_rows)):
    if ids > rows:
      raise ValueError(
          f"{directory / tokenizer.vocab_file}: the tokenizer has {ids} {side} ids but "
          f"{directory / 'config.json'} gives the model {rows} (vocab_size); the tokenizer "
          "files and config.json come from different checkpoints: copy the tokenizer files "
          "saved with these weights")


def _has_path(tree: dict, path) -> bool:
  for key in path:
    name = key.key if hasattr(key, "key") else key
    if not isinstance(tree, dict) or name not in tree:
      return False
    tree = tree[name]
  return True


def save(checkpoint: Pretrained, path: str | os.PathLike, *, params: PyTree | None = None) -> None:
  """Writes ``checkpoint`` (or ``params``, e.g. fine-tuned ones) in transformers' layout.

  ``config.json``, ``generation_config.json``, ``model.safetensors`` (float32, tied
  tables stored once as transformers itself stores them, written one tensor at a
  time) and the tokenizer files: the family's ``from_pretrained`` in transformers
  (``MarianMTModel``, ``M2M100ForConditionalGeneration``,
  ``MBartForConditionalGeneration``, ``T5ForConditionalGeneration``,
  ``MT5ForConditionalGeneration``) and its tokenizer load the directory.

  Raises:
    ValueError: for a parameter the layout cannot hold (an output bias an M2M100
      or T5 checkpoint does not have, trained away from zero).
  """
  directory = pathlib.Path(path)
  directory.mkdir(parents=True, exist_ok=True)
  family = FAMILIES[checkpoint.family]
  params = checkpoint.params if params is None else params
  entries = []
  for rule in family.rules(checkpoint.config, None):
    value = _convert.get_path(params, rule.path)
    if rule.hf_name is None:
      if np.any(np.asarray(value) != 0):
        raise ValueError(f"parameter {'/'.join(rule.path)} is not zero, but a "
                         f"{checkpoint.family} checkpoint has no such tensor; it cannot be saved "
                         "in transformers' layout")
      continue
    shape = np.shape(rule.to_hf(np.broadcast_to(np.float32(0), np.shape(value))))
    entries.append((rule.hf_name, shape,
                    lambda rule=rule, value=value: rule.to_hf(np.asarray(value, np.float32))))
  _io.write_safetensors(entries, directory / "model.safetensors")
  (directory / "config.json").write_text(json.dumps(checkpoint.hf_config, indent=2) + "\n")
  if checkpoint.generation_config:
    (directory / "generation_config.json").write_text(
        json.dumps(checkpoint.generation_config, indent=2) + "\n")
  if checkpoint.tokenizer is not None:
    checkpoint.tokenizer.save(directory)


def experiment_config(checkpoint: Pretrained, *, data: DataConfig = DataConfig(),
                      train: TrainConfig = TrainConfig()) -> ExperimentConfig:
  """A training run that fine-tunes ``checkpoint`` on ``data`` (see ``training.train``).

  The model is the checkpoint's, ``train.init_from`` its directory, the search its
  generation config (with the target language code of ``data.target_lang`` forced
  for multilingual checkpoints; limited by the ratio rule).
  """
  if checkpoint.path is None:
    raise ValueError("experiment_config needs a checkpoint loaded from a directory")
  decode = dataclasses.replace(checkpoint.decode_config, max_decode_len=0)
  tokenizer = checkpoint.tokenizer
  if tokenizer is not None and tokenizer.languages:
    prefix = tokenizer.target_prefix(data.target_lang)
    decode = dataclasses.replace(decode, forced_bos_id=prefix[0] if prefix else None)
  return ExperimentConfig(model=checkpoint.config, data=data, decode=decode,
                          train=dataclasses.replace(train, init_from=str(checkpoint.path)))
