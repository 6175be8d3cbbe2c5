"""The flag groups that several commands share, and what they become: configs and Translators.

Flags become configs here and in the command modules, nowhere else in the library.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
from typing import Any

from seq2seq_jax.configs import DataConfig, DecodeConfig, ExperimentConfig


def add_data_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
  """Flags of ``DataConfig`` that say which corpus: ``prepare`` and ``evaluate``."""
  defaults = DataConfig()
  parser.add_argument("--dataset", default=defaults.dataset,
                      help="'multi30k', 'parallel_text' or 'tfds:NAME' (default: %(default)s)")
  parser.add_argument("--manual-dir", default=defaults.manual_dir, metavar="PATH",
                      help="local copy of the corpus: a folder of {split}.{lang} files, plain or "
                           ".gz (multi30k: downloaded when omitted)")
  parser.add_argument("--data-dir", default=defaults.data_dir, metavar="DIR",
                      help="where prepared data is kept (default: ~/.cache/seq2seq_jax/tfds)")
  parser.add_argument("--source-lang", default=defaults.source_lang)
  parser.add_argument("--target-lang", default=defaults.target_lang)


def data_config(args: argparse.Namespace, **overrides) -> DataConfig:
  """The ``DataConfig`` of ``add_data_flags``' flags, with ``overrides``."""
  return DataConfig(dataset=args.dataset, manual_dir=args.manual_dir, data_dir=args.data_dir,
                    source_lang=args.source_lang, target_lang=args.target_lang, **overrides)


# --------------------------------------------------------------------- experiments: train, compile


def add_preset_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str) -> None:
  """``--preset NAME``, one of ``presets.PRESETS`` (default None: the command decides)."""
  from seq2seq_jax.presets import PRESETS
  parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help=help)


def add_set_flag(parser: argparse.ArgumentParser, help: str) -> None:
  """``--set SECTION.FIELD=VALUE`` (repeatable) into ``args.overrides``."""
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE", help=help)


def read_config(path: pathlib.Path) -> ExperimentConfig:
  """An ``ExperimentConfig`` JSON file (a run's ``config.json``); a bad one raises
  ``ValueError`` naming the file."""
  try:
    return ExperimentConfig.from_dict(json.loads(path.read_text(encoding="utf-8")))
  except (OSError, json.JSONDecodeError, ValueError, TypeError) as error:
    raise ValueError(f"{path}: {error}") from None


def experiment_config(base: ExperimentConfig | None, args: argparse.Namespace) -> ExperimentConfig:
  """``base`` (default: ``--preset``, else ``multi30k_transformer``) with ``--set`` applied."""
  from seq2seq_jax import presets
  if base is None:
    base = presets.get_preset(args.preset or "multi30k_transformer")
  return presets.apply_overrides(base, args.overrides)


# ----------------------------------------------------------- a model and its search: evaluate,
# translate, export


def add_decode_flags(parser: argparse.ArgumentParser) -> None:
  """The model (a run or a pretrained checkpoint), the search's settings, an ensemble."""
  model = parser.add_mutually_exclusive_group(required=True)
  model.add_argument("--workdir", help="a training run's folder")
  model.add_argument("--pretrained", metavar="DIR",
                     help="a published checkpoint saved by transformers (MarianMT / OPUS-MT, "
                          "M2M100, NLLB), see seq2seq_jax.pretrained")
  parser.add_argument("--checkpoint", default=None, metavar="best|latest|STEP",
                      help="which checkpoint of --workdir (default: best by validation BLEU, "
                           "else latest)")
  parser.add_argument("--beam-size", type=int, default=None,
                      help="beam width; 1 = greedy (default: the run's or checkpoint's)")
  parser.add_argument("--alpha", type=float, default=None,
                      help="beam search length penalty exponent (default: the run's)")
  parser.add_argument("--max-decode-len", type=int, default=None, metavar="N",
                      help="most tokens generated per sentence, EOS included (default: 1.5 x "
                           "the source limit + 10)")
  parser.add_argument("--batch-size", type=int, default=None, help="sentences decoded at once")
  parser.add_argument("--max-source-len", type=int, default=None, metavar="N",
                      help="longest source in tokens, EOS included; longer lines are truncated "
                           "with a warning (default: the model's max_len; a --pretrained "
                           "checkpoint's at most 256)")
  parser.add_argument("--quantize", choices=("none", "int8"), default="none",
                      help="int8: int8 weights and products (Transformer and T5 models, every "
                           "pretrained family; seq2seq_jax.quantization); default: %(default)s")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                      help="compute dtype to decode in; parameters stay float32 (default: the "
                           "run's, float32 for --pretrained)")
  parser.add_argument("--ensemble", action="append", default=[], metavar="DIR",
                      help="decode with an ensemble: another member, a training run's workdir "
                           "or a pretrained checkpoint with the same vocabulary (repeatable; "
                           "their log-probabilities are averaged)")
  parser.add_argument("--set", dest="decode_overrides", action="append", default=[],
                      metavar="decode.FIELD=VALUE",
                      help="change one DecodeConfig field (repeatable), e.g. "
                           "decode.no_repeat_ngram_size=3, decode.repetition_penalty=1.2, "
                           "decode.num_beam_groups=2, decode.diversity_penalty=0.5, "
                           "decode.length_penalty_form=power, decode.early_stopping=true")


def add_search_flags(parser: argparse.ArgumentParser) -> None:
  """``add_decode_flags`` with the search method and language codes: ``translate``, ``export``."""
  add_decode_flags(parser)
  parser.add_argument("--method", choices=("greedy", "beam", "sample"), default=None,
                      help="the search (default: beam when --beam-size > 1, else the run's)")
  parser.add_argument("--source-lang", default=None, metavar="CODE",
                      help="source language code of a multilingual checkpoint (M2M100: de)")
  parser.add_argument("--target-lang", default=None, metavar="CODE",
                      help="target language code of a multilingual checkpoint, forced as the "
                           "first output token (M2M100: en)")


def decode_options(args: argparse.Namespace) -> dict[str, Any]:
  """The ``--set decode.FIELD=VALUE`` flags as DecodeConfig fields and values."""
  from seq2seq_jax.presets import _parse_value
  fields = {f.name: f for f in dataclasses.fields(DecodeConfig)}
  options = {}
  for override in getattr(args, "decode_overrides", []):
    key, sep, text = override.partition("=")
    section, _, field = key.strip().rpartition(".")
    if not sep or section not in ("", "decode") or field not in fields:
      raise ValueError(f"--set {override!r}: expected decode.FIELD=VALUE with a DecodeConfig "
                       f"field: {', '.join(sorted(fields))}")
    options[field] = _parse_value(text, fields[field].type, key)
  return options


def translator(args: argparse.Namespace, **kwargs):
  """The Translator of ``add_decode_flags``' flags: one model, or an ``--ensemble``."""
  limit = getattr(args, "max_source_len", None)
  if limit is not None:
    kwargs["max_source_len"] = limit
  numerics = {"quantize": getattr(args, "quantize", "none"), "dtype": getattr(args, "dtype", None)}
  first = model_translator(workdir=args.workdir, pretrained=args.pretrained,
                           checkpoint=args.checkpoint, batch_size=args.batch_size, **numerics,
                           **kwargs)
  members = getattr(args, "ensemble", [])
  if not members:
    return first
  from seq2seq_jax.inference import Translator
  others = []
  for path in members:
    is_run = (pathlib.Path(path) / "checkpoints").is_dir()
    others.append(model_translator(workdir=path if is_run else None,
                                   pretrained=None if is_run else path,
                                   batch_size=args.batch_size, **numerics))
  return Translator.ensemble([first, *others],
                             **({} if limit is None else {"max_source_len": limit}))


def model_translator(*, workdir: str | None = None, pretrained: str | None = None,
                     checkpoint: str | None = None, batch_size: int | None = None,
                     quantize: str = "none", dtype: str | None = None, **kwargs):
  """The Translator of a training run's checkpoint (``best|latest|STEP``; default: best, else
  latest) or of a pretrained checkpoint's directory; ``quantize`` and ``dtype`` as
  ``--quantize`` and ``--dtype`` say (``dtype`` None: the run's, float32 for a checkpoint)."""
  from seq2seq_jax.inference import Translator
  if batch_size:
    kwargs["batch_size"] = batch_size
  kwargs["quantize"] = quantize
  if pretrained:
    if checkpoint is not None:
      raise ValueError("--checkpoint picks a step of a --workdir run; a --pretrained "
                       "checkpoint has one set of parameters")
    return Translator.from_pretrained(pretrained, dtype=dtype or "float32", **kwargs)
  kwargs["dtype"] = dtype
  step: int | str | None = checkpoint
  if checkpoint is not None and checkpoint not in ("best", "latest"):
    try:
      step = int(checkpoint)
    except ValueError:
      raise ValueError(f"--checkpoint {checkpoint!r}: expected best, latest or a step "
                       "number") from None
  return Translator.from_workdir(workdir, step=step, **kwargs)
