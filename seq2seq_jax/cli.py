"""The ``seq2seq-jax`` command line: ``prepare``, ``train``, ``evaluate``, ``translate``,
``export``, ``save-pretrained``, ``compile``.

Flags become configs here and nowhere else. Each subcommand is a function
``run_NAME(args) -> exit status`` registered by ``_add_NAME(subparsers)``.

Example::

  seq2seq-jax prepare --dataset multi30k --manual-dir ../shared/data/multi30k/raw
  seq2seq-jax prepare --dataset multi30k  # downloads the official files
  seq2seq-jax prepare --dataset parallel_text --manual-dir my_corpus --source-lang de \\
      --target-lang en --tokenizer runs/x/tokenizer.model --vocab-size 8000
  seq2seq-jax train --preset multi30k_transformer --workdir runs/m30k \\
      --set data.manual_dir=../shared/data/multi30k/raw --set train.num_steps=400
  seq2seq-jax evaluate --workdir runs/m30k --split test_2016_flickr --beam-size 4
  echo "Ein Hund rennt." | seq2seq-jax translate --workdir runs/m30k --beam-size 4
  echo "Ein Hund rennt." | seq2seq-jax translate --pretrained opus-mt-de-en
  seq2seq-jax translate --workdir runs/m30k --input corpus.de --output corpus.en --beam-size 4
  seq2seq-jax translate --workdir runs/m30k --input corpus.de --output nbest.txt \\
      --beam-size 8 --n-best 4
  seq2seq-jax export --workdir runs/m30k --out m30k.s2sx --platforms cpu,cuda,tpu
  seq2seq-jax translate --pretrained opus-mt-de-en --beam-size 4 --prefix-file prefixes.txt \\
      --constraints-file phrases.tsv --set decode.no_repeat_ngram_size=3 < input.de
  seq2seq-jax translate --workdir runs/a --ensemble runs/b --beam-size 4 < input.de
  seq2seq-jax evaluate --pretrained opus-mt-de-en --manual-dir ../shared/data/multi30k/raw \
      --split test_2016_flickr
  seq2seq-jax train --init-from opus-mt-de-en --workdir runs/ft \
      --set data.manual_dir=../shared/data/multi30k/raw --set train.num_steps=1000
  seq2seq-jax save-pretrained --workdir runs/ft --out opus-mt-de-en-multi30k
  seq2seq-jax compile --target v5e:2x4 --preset wmt14_transformer_base \
      --set train.parameter_sharding=fsdp --max-batch --json wmt_base.json
  seq2seq-jax compile --target v5e-1 --pretrained opus-mt-de-en --program generate,score
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from seq2seq_jax.configs import DataConfig


def _add_data_flags(parser: argparse.ArgumentParser) -> None:
  """Flags of ``DataConfig`` that say which corpus; shared by the data-reading subcommands."""
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


def _data_config(args: argparse.Namespace, **overrides) -> DataConfig:
  return DataConfig(dataset=args.dataset, manual_dir=args.manual_dir, data_dir=args.data_dir,
                    source_lang=args.source_lang, target_lang=args.target_lang, **overrides)


def _add_prepare(subparsers) -> None:
  parser = subparsers.add_parser(
      "prepare", help="download (or read), check and prepare a corpus as array_record files",
      description="Prepares a corpus once into the data dir; training and evaluation read it "
                  "from there. Optionally trains the sentencepiece vocabulary too.")
  _add_data_flags(parser)
  parser.add_argument("--tokenizer", default="", metavar="PATH",
                      help="also train a sentencepiece vocabulary on the training split and save "
                           "it here (e.g. runs/NAME/tokenizer.model)")
  parser.add_argument("--vocab-size", type=int, default=DataConfig().vocab_size,
                      help="size of that vocabulary (default: %(default)s)")
  parser.set_defaults(run=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
  from seq2seq_jax.data import builders, tokenizer  # tfds is slow to import: only when needed

  data_config = _data_config(args, vocab_size=args.vocab_size)
  start = time.perf_counter()
  builder = builders.prepare_dataset(data_config)
  print(f"prepared {data_config.dataset} ({data_config.source_lang}-{data_config.target_lang}) "
        f"in {builder.data_dir} ({time.perf_counter() - start:.1f} s)")
  for name, split in sorted(builder.info.splits.items()):
    print(f"  {name}: {split.num_examples} pairs")
  if args.tokenizer:
    start = time.perf_counter()
    vocab = tokenizer.train_tokenizer(data_config)
    vocab.save(args.tokenizer)
    print(f"trained a {vocab.vocab_size}-piece vocabulary on {data_config.train_split}, saved to "
          f"{args.tokenizer} ({time.perf_counter() - start:.1f} s)")
  return 0


def _add_train(subparsers) -> None:
  from seq2seq_jax.presets import PRESETS
  parser = subparsers.add_parser(
      "train", help="train a model; rerunning the same command resumes it",
      description="Trains a preset, changed with --set section.field=value (sections: model, "
                  "data, train, decode). The workdir keeps config.json, metrics.jsonl, the "
                  "tokenizer and checkpoints; rerunning the same command resumes from the latest "
                  "checkpoint. Ctrl-C saves a checkpoint and stops.")
  parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                      help="named config; default: the workdir's saved config.json when it has "
                           "one, else multi30k_transformer")
  parser.add_argument("--workdir", required=True, help="the run's folder")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE", help="change one config field (repeatable)")
  parser.add_argument("--restart", action="store_true",
                      help="start over although the workdir holds a run (its files are moved "
                           "aside, not deleted)")
  parser.add_argument("--quiet", action="store_true", help="no progress lines")
  parser.add_argument("--init-from", default=None, metavar="DIR",
                      help="fine-tune a pretrained checkpoint (a transformers save_pretrained "
                           "directory of MarianMT or M2M100/NLLB): its model, parameters, "
                           "tokenizer and search replace the preset's")
  parser.set_defaults(run=run_train)


def _train_config(args: argparse.Namespace):
  from seq2seq_jax import configs, presets
  saved = pathlib.Path(args.workdir) / "config.json"
  if args.preset is None and saved.is_file():
    try:
      base = configs.ExperimentConfig.from_dict(json.loads(saved.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as error:
      raise ValueError(f"{saved}: {error}; pass --preset to start from a preset instead") from None
  else:
    base = presets.get_preset(args.preset or "multi30k_transformer")
    if getattr(args, "init_from", None):
      from seq2seq_jax import pretrained
      base = pretrained.experiment_config(pretrained.load(args.init_from), data=base.data,
                                          train=base.train)
  return presets.apply_overrides(base, args.overrides)


def run_train(args: argparse.Namespace) -> int:
  from seq2seq_jax.training import loop
  from seq2seq_jax.training.sharding import maybe_initialize_distributed

  maybe_initialize_distributed()  # before anything touches devices; a no-op on one host
  config = _train_config(args)
  start = time.perf_counter()
  result = loop.train(config, args.workdir, restart=args.restart, progress=not args.quiet)
  minutes = (time.perf_counter() - start) / 60
  if result.interrupted:
    print(f"interrupted at step {result.step} after {minutes:.1f} min; checkpoint saved. Rerun "
          "the same command to resume.", file=sys.stderr)
    return 130
  summary = {k: result.metrics[k] for k in ("loss", "val_loss", "bleu") if k in result.metrics}
  print(f"trained {result.step} steps in {minutes:.1f} min: "
        + ", ".join(f"{k} {v:.4g}" for k, v in summary.items())
        + (f"; best validation BLEU {result.best_bleu:.2f} at step {result.best_step}"
           if result.best_bleu is not None else ""))
  return 0


def _add_decode_flags(parser: argparse.ArgumentParser) -> None:
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


def _decode_options(args: argparse.Namespace) -> dict[str, Any]:
  """The ``--set decode.FIELD=VALUE`` flags as DecodeConfig fields and values."""
  import dataclasses
  from seq2seq_jax.configs import DecodeConfig
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


def _translator(args: argparse.Namespace, **kwargs):
  translator = _one_translator(args, **kwargs)
  members = getattr(args, "ensemble", [])
  if not members:
    return translator
  from seq2seq_jax.inference import Translator
  others = []
  for path in members:
    is_run = (pathlib.Path(path) / "checkpoints").is_dir()
    others.append(_one_translator(argparse.Namespace(
        workdir=path if is_run else None, pretrained=None if is_run else path, checkpoint=None,
        batch_size=args.batch_size)))
  return Translator.ensemble([translator, *others])


def _one_translator(args: argparse.Namespace, **kwargs):
  from seq2seq_jax.inference import Translator
  if args.batch_size:
    kwargs["batch_size"] = args.batch_size
  if args.pretrained:
    if args.checkpoint is not None:
      raise ValueError("--checkpoint picks a step of a --workdir run; a --pretrained "
                       "checkpoint has one set of parameters")
    return Translator.from_pretrained(args.pretrained, **kwargs)
  step = args.checkpoint
  if step is not None and step not in ("best", "latest"):
    try:
      step = int(step)
    except ValueError:
      raise ValueError(f"--checkpoint {step!r}: expected best, latest or a step number") from None
  return Translator.from_workdir(args.workdir, step=step, **kwargs)


def _languages(args: argparse.Namespace, translator: Any, source: str | None,
               target: str | None) -> dict[str, str | None]:
  """Language codes for a multilingual checkpoint's tokenizer; none for the others."""
  if getattr(translator.tokenizer, "languages", ()):
    return {"source_lang": source, "target_lang": target}
  return {}


def _add_evaluate(subparsers) -> None:
  parser = subparsers.add_parser(
      "evaluate", help="translate a split and score it with sacreBLEU (BLEU, chrF)",
      description="Translates an evaluation split of the run's corpus (or any --sources / "
                  "--references files) and prints detokenized sacreBLEU BLEU and chrF; for "
                  "Multi30k also BLEU against the official lowercased, tokenized references. "
                  "Writes eval-SPLIT-STEP-METHOD.json and the hypotheses into WORKDIR/eval/.")
  _add_decode_flags(parser)
  parser.add_argument("--split", default=None,
                      help="split of the run's corpus, e.g. val, test_2016_flickr, or several "
                           "separated by commas (one model load for all); default: the run's "
                           "data.eval_split")
  data = parser.add_argument_group(
      "corpus of a --pretrained checkpoint (a --workdir run uses its own); --source-lang and "
      "--target-lang are also the language codes of multilingual checkpoints")
  _add_data_flags(data)
  parser.add_argument("--sources", default=None, metavar="FILE",
                      help="score these source sentences instead of a split (with --references)")
  parser.add_argument("--references", default=None, metavar="FILE",
                      help="reference translations of --sources, line by line")
  parser.add_argument("--max-sentences", type=int, default=0, help="only the first N (0 = all)")
  parser.add_argument("--show", type=int, default=0, metavar="N",
                      help="also print N source / hypothesis / reference triples")
  parser.set_defaults(run=run_evaluate)


def _read_lines(path: str) -> list[str]:
  from seq2seq_jax.data import text_files
  return text_files.decode_lines(text_files.read_bytes(path), path)


def _tokenized_references(data_config, split: str) -> pathlib.Path | None:
  """Multi30k's official ``tok/{split}.lc.norm.tok.{lang}`` beside a local ``raw/`` copy."""
  if data_config.dataset != "multi30k" or not data_config.manual_dir:
    return None
  path = (pathlib.Path(data_config.manual_dir).expanduser().parent / "tok"
          / f"{split}.lc.norm.tok.{data_config.target_lang}")
  return path if path.is_file() else None


def run_evaluate(args: argparse.Namespace) -> int:
  if (args.sources is None) != (args.references is None):
    raise ValueError("--sources and --references go together: give both files, or neither to "
                     "evaluate a split of the run's corpus")
  translator = _translator(args)
  if translator.config is None:  # a pretrained checkpoint: the corpus flags say what to read
    from seq2seq_jax import configs
    translator.config = configs.ExperimentConfig(
        model=translator.model.config, data=_data_config(args),
        decode=translator.decode_config)
  config = translator.config
  if args.sources:
    sources, references = _read_lines(args.sources), _read_lines(args.references)
    if len(sources) != len(references):
      raise ValueError(f"{args.sources} has {len(sources)} lines but {args.references} has "
                       f"{len(references)}: they must be aligned line by line")
    _evaluate_one(args, translator, pathlib.Path(args.sources).name, sources, references)
    return 0
  from seq2seq_jax.data import pipeline
  splits = [s.strip() for s in (args.split or config.data.eval_split).split(",") if s.strip()]
  texts = {split: pipeline.load_eval_text(config.data, split) for split in splits}  # fail early
  for split, text in texts.items():
    _evaluate_one(args, translator, split, text.sources, text.references)
  return 0


def _evaluate_one(args: argparse.Namespace, translator: Any, split: str, sources: list[str],
                  references: list[str]) -> None:
  """Translates, scores, prints and writes eval-SPLIT-STEP-METHOD.{json,txt} for one set."""
  from seq2seq_jax import evaluation

  config = translator.config
  limit = args.max_sentences or len(sources)
  sources, references = sources[:limit], references[:limit]
  decode = translator.decode_config
  beam_size = args.beam_size if args.beam_size is not None else (
      decode.beam_size if decode.method == "beam" else 1)
  alpha = args.alpha if args.alpha is not None else decode.alpha
  start = time.perf_counter()
  hypotheses = translator.translate(
      sources, beam_size=beam_size, alpha=alpha, max_decode_len=args.max_decode_len,
      **_languages(args, translator, config.data.source_lang, config.data.target_lang),
      **_decode_options(args))
  seconds = time.perf_counter() - start
  scores = [evaluation.corpus_bleu(hypotheses, references),
            evaluation.corpus_chrf(hypotheses, references)]
  tokenized = None if args.sources or args.max_sentences else _tokenized_references(config.data,
                                                                                    split)
  if tokenized is not None:
    scores.append(evaluation.moses_tokenized_bleu(hypotheses, _read_lines(str(tokenized)),
                                                  lang=config.data.target_lang))
  method = "greedy" if beam_size == 1 else f"beam{beam_size}-alpha{alpha:g}"
  pair = f"{config.data.source_lang}->{config.data.target_lang}"
  checkpoint = translator.step if translator.step is not None else "pretrained"
  print(f"{split} ({pair}, {len(sources)} sentences, checkpoint {checkpoint}, {method}, "
        f"{seconds:.1f} s):")
  for score in scores:
    print(f"  {score}")
  for i in range(min(args.show, len(sources))):
    print(f"\n  source:     {sources[i]}\n  hypothesis: {hypotheses[i]}\n"
          f"  reference:  {references[i]}")
  out_dir = pathlib.Path(args.workdir or ".") / "eval"
  out_dir.mkdir(parents=True, exist_ok=True)
  name = f"eval-{split}-{checkpoint}-{method}"
  (out_dir / f"{name}.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
  record = {
      "split": split, "pair": pair, "sentences": len(sources), "checkpoint_step": translator.step,
      "pretrained": args.pretrained,
      "decode": {"method": "greedy" if beam_size == 1 else "beam", "beam_size": beam_size,
                 "alpha": alpha, "max_decode_len": args.max_decode_len
                 or translator.max_decode_len(decode), **_decode_options(args),
                 "ensemble": list(getattr(args, "ensemble", []))},
      "scores": {s.name: {"score": s.score, "signature": s.signature, "details": s.details}
                 for s in scores},
      "tokenized_references": str(tokenized) if tokenized else None,
      "seconds": seconds, "hypotheses_file": str(out_dir / f"{name}.txt")}
  (out_dir / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _add_search_flags(parser: argparse.ArgumentParser) -> None:
  """The model, the search and the language codes: ``translate`` and ``export``."""
  _add_decode_flags(parser)
  parser.add_argument("--method", choices=("greedy", "beam", "sample"), default=None,
                      help="the search (default: beam when --beam-size > 1, else the run's)")
  parser.add_argument("--source-lang", default=None, metavar="CODE",
                      help="source language code of a multilingual checkpoint (M2M100: de)")
  parser.add_argument("--target-lang", default=None, metavar="CODE",
                      help="target language code of a multilingual checkpoint, forced as the "
                           "first output token (M2M100: en)")


def _add_translate(subparsers) -> None:
  from seq2seq_jax.configs import TranslateFileConfig
  defaults = TranslateFileConfig()
  parser = subparsers.add_parser(
      "translate", help="translate a file (or stdin) line by line, on every device",
      description="Translates --input (default: standard input) line by line into --output "
                  "(default: standard output) on every visible device, in bounded memory: a "
                  "window of lines is sorted by length and decoded in token-budget batches; "
                  "results are written in input order. File to file, the run is resumable: "
                  "after Ctrl-C or kill -9 the same command continues after the last complete "
                  "line (a side record OUTPUT.progress.json says how far it got). An empty line "
                  "gives an empty line; a line longer than the model allows is truncated with a "
                  "warning naming it; invalid UTF-8 is an error naming the line.")
  _add_search_flags(parser)
  parser.add_argument("--input", default=None, metavar="FILE",
                      help="sentences to translate, one per line, plain or .gz (default: stdin)")
  parser.add_argument("--output", default=None, metavar="FILE",
                      help="where translations go, one line per input line (default: stdout)")
  parser.add_argument("--n-best", type=int, default=0, metavar="K",
                      help="write K lines 'INDEX ||| TEXT ||| SCORE' per input, best first (beam "
                           "search; SCORE is the length-normalised log-probability)")
  parser.add_argument("--scores", action="store_true",
                      help="write 'TEXT ||| LOGPROB': each output's total log-probability")
  parser.add_argument("--score-references", default=None, metavar="FILE",
                      help="translate nothing: write the log-probability of each line of FILE "
                           "given the same line of the input (forced decoding)")
  parser.add_argument("--window", type=int, default=defaults.window_lines, metavar="LINES",
                      help="lines read, sorted and batched together (default: %(default)s)")
  parser.add_argument("--batch-tokens", type=int, default=defaults.batch_tokens, metavar="N",
                      help="padded source tokens in a full batch (default: %(default)s); "
                           f"--batch-size caps its rows (default: {defaults.max_rows})")
  parser.add_argument("--overwrite", action="store_true",
                      help="start --output over although it exists or is unfinished")
  parser.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default="auto",
                      help="a progress bar (on a terminal: auto), plain lines, or nothing")
  parser.add_argument("--prefix-file", default=None, metavar="FILE",
                      help="one target prefix per input line (an empty line for none): each "
                           "translation begins with its line's prefix")
  parser.add_argument("--constraints-file", default=None, metavar="FILE",
                      help="per input line, the phrases its translation must contain, separated "
                           "by tabs (an empty line for none); needs beam search")
  parser.set_defaults(run=run_translate)


def _model_name(args: argparse.Namespace, translator: Any) -> str:
  """How a resumed translation names its model: the checkpoint's folder (and step)."""
  if args.pretrained:
    return f"pretrained {pathlib.Path(args.pretrained).expanduser().absolute()}"
  return f"workdir {pathlib.Path(args.workdir).expanduser().absolute()} step {translator.step}"


def run_translate(args: argparse.Namespace) -> int:
  import jax

  from seq2seq_jax.configs import TranslateFileConfig
  from seq2seq_jax.inference import files
  from seq2seq_jax.training.sharding import make_mesh, maybe_initialize_distributed

  maybe_initialize_distributed()  # before anything touches devices; a no-op on one host
  config = TranslateFileConfig(
      window_lines=args.window, batch_tokens=args.batch_tokens,
      max_rows=args.batch_size or TranslateFileConfig().max_rows, n_best=args.n_best,
      scores=args.scores, references=args.score_references or "", progress=args.progress,
      prefixes=args.prefix_file or "", constraints=args.constraints_file or "")
  translator = _translator(args, mesh=make_mesh())
  try:
    result = files.translate_file(
        translator, args.input, args.output, config=config, beam_size=args.beam_size,
        alpha=args.alpha, method=args.method, max_decode_len=args.max_decode_len,
        source_lang=args.source_lang, target_lang=args.target_lang, overwrite=args.overwrite,
        model_name=_model_name(args, translator), **_decode_options(args))
  except files.TranslationInterrupted as interrupted:
    where = (f"; {interrupted.lines_done} lines of {interrupted.output} are complete. Rerun the "
             "same command to resume" if interrupted.output else "")
    print(f"seq2seq-jax translate: interrupted{where}", file=sys.stderr)
    return 130
  if args.progress != "none" and result.decoded and jax.process_index() == 0:
    rate = result.decoded / max(result.seconds, 1e-9)
    devices = translator.mesh.devices.size
    print(f"seq2seq-jax translate: {result.lines} lines ({result.decoded} decoded"
          + (f", resumed after line {result.resumed_from}" if result.resumed_from else "")
          + f") in {result.seconds:.1f} s on {devices} device{'s' * (devices > 1)} of "
          f"{jax.process_count()} process{'es' * (jax.process_count() > 1)}: {rate:.1f} "
          f"sentences/s, {result.tokens / max(result.seconds, 1e-9):.0f} tokens/s"
          + (f" -> {result.output}" if result.output else ""), file=sys.stderr)
  return 0


def _add_export(subparsers) -> None:
  parser = subparsers.add_parser(
      "export", help="serialize encode + search with jax.export for CPU, CUDA and TPU",
      description="Writes one file holding the model's encode + search as StableHLO "
                  "(jax.export) for a fixed set of batch shapes, its parameters and its "
                  "tokenizer. seq2seq_jax.serving.load_exported(FILE).translate(sentences) runs "
                  "it without the model's Python code, on any of --platforms.")
  _add_search_flags(parser)
  parser.add_argument("--out", required=True, metavar="FILE", help="the artifact to write")
  parser.add_argument("--platforms", default="cpu,cuda,tpu",
                      help="comma-separated jax.export platforms: cpu, cuda, rocm, tpu "
                           "(default: %(default)s)")
  parser.add_argument("--bucket-lengths", default=None, metavar="L1,L2,...",
                      help="padded source lengths to export (default: the run's buckets)")
  parser.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> int:
  from seq2seq_jax.inference import exported
  translator = _translator(args)
  lengths = None
  if args.bucket_lengths:
    try:
      lengths = tuple(int(x) for x in args.bucket_lengths.split(",") if x.strip())
    except ValueError:
      raise ValueError(f"--bucket-lengths {args.bucket_lengths!r}: expected comma-separated "
                       "integers, e.g. 16,32,64") from None
  platforms = tuple(p.strip() for p in args.platforms.split(",") if p.strip())
  info = exported.export_translator(
      translator, args.out, platforms=platforms, bucket_lengths=lengths,
      beam_size=args.beam_size, alpha=args.alpha, method=args.method,
      max_decode_len=args.max_decode_len, source_lang=args.source_lang,
      target_lang=args.target_lang, **_decode_options(args))
  print(f"wrote {args.out} ({info.bytes / 2**20:.1f} MiB): {info.method} for "
        f"{', '.join(info.platforms)}, batch shapes "
        f"{', '.join(f'{r}x{l}' for r, l in info.shapes)}")
  return 0


def _add_save_pretrained(subparsers) -> None:
  parser = subparsers.add_parser(
      "save-pretrained", help="write a fine-tuned run in transformers' layout",
      description="Writes the parameters of a run trained with --init-from, with the config, "
                  "generation config and tokenizer of the checkpoint it started from, as a "
                  "save_pretrained directory that transformers (and --pretrained) load.")
  parser.add_argument("--workdir", required=True, help="a run trained with --init-from")
  parser.add_argument("--checkpoint", default=None, metavar="best|latest|STEP")
  parser.add_argument("--out", required=True, metavar="DIR", help="the directory to write")
  parser.set_defaults(run=run_save_pretrained)


def run_save_pretrained(args: argparse.Namespace) -> int:
  from seq2seq_jax import pretrained
  translator = _translator(argparse.Namespace(pretrained=None, workdir=args.workdir,
                                              checkpoint=args.checkpoint, batch_size=None))
  init_from = translator.config.train.init_from
  if not init_from:
    raise ValueError(f"{args.workdir}: this run did not start from a pretrained checkpoint "
                     "(train.init_from is empty); only fine-tuned checkpoints have a "
                     "transformers layout to write")
  pretrained.save(pretrained.load(init_from), args.out, params=translator.params)
  print(f"wrote step {translator.step} of {args.workdir} to {args.out} (layout of {init_from})")
  return 0


def _add_compile(subparsers) -> None:
  from seq2seq_jax.presets import PRESETS
  parser = subparsers.add_parser(
      "compile", help="compile programs for a TPU slice without one: memory, FLOPs, fit",
      description="Runs the real TPU compiler (libtpu, which needs no TPU: pip install "
                  "'jax[tpu]') on the library's programs for an abstract TPU slice, from "
                  "shapes alone, and prints per chip the bytes of arguments, temporaries and "
                  "outputs, whether they fit the chip's HBM, the compiler's FLOPs and bytes "
                  "accessed, and an estimated step time and MFU (a roofline against the chip's "
                  "published peak and bandwidth). Compiler-derived estimates, not "
                  "measurements. Exit status 1 when a program does not fit.")
  parser.add_argument("--target", required=True, metavar="TPU",
                      help="CHIP:TOPOLOGY (v5e:2x4, v4:2x2x1, v5p:2x2x1, v6e:2x2) or a Cloud "
                           "TPU type (v5e-8, v4-8, v5e-1, v6e-1)")
  model = parser.add_mutually_exclusive_group()
  model.add_argument("--preset", choices=sorted(PRESETS), default=None,
                     help="a named config (default: multi30k_transformer)")
  model.add_argument("--pretrained", metavar="DIR",
                     help="a published checkpoint's directory; only its config.json (and "
                          "generation_config.json) is read")
  model.add_argument("--config", metavar="FILE",
                     help="an experiment config JSON, e.g. a training run's config.json")
  parser.add_argument("--program", default="train", metavar="NAMES",
                      help="train, eval, generate or score; several separated by commas "
                           "(default: %(default)s)")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE",
                      help="change one config field (repeatable), e.g. "
                           "train.parameter_sharding=fsdp, train.model_parallelism=2, "
                           "train.compute_dtype=bfloat16, decode.method=beam")
  parser.add_argument("--batch", type=int, default=None, metavar="ROWS",
                      help="global batch rows (default: the run's own batch)")
  parser.add_argument("--length", type=int, default=None, metavar="TOKENS",
                      help="padded sequence length (default: the longest training bucket; "
                           "generate and score: the source limit)")
  parser.add_argument("--max-batch", action="store_true",
                      help="also find the largest batch that fits, by bisection over compiles")
  parser.add_argument("--json", default=None, metavar="FILE",
                      help="write the reports as JSON: one object, or a list for several")
  parser.set_defaults(run=run_compile)


def _compile_config(args: argparse.Namespace):
  """The experiment ``compile`` reports on, and a model when it is not the config's."""
  from seq2seq_jax import configs, presets
  if args.pretrained:
    from seq2seq_jax import pretrained
    model_config, search = pretrained.load_config(args.pretrained)
    limit = min(model_config.max_len, 256)
    buckets = tuple(b for b in (16, 32, 64, 128) if b < limit) + (limit,)
    base = configs.ExperimentConfig(
        model=model_config,
        data=configs.DataConfig(max_source_len=limit, max_target_len=limit,
                                bucket_lengths=buckets, batch_tokens=max(8192, 8 * limit)),
        decode=dataclasses.replace(search, max_decode_len=0))
  elif args.config:
    path = pathlib.Path(args.config)
    try:
      base = configs.ExperimentConfig.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, ValueError, TypeError) as error:
      raise ValueError(f"{path}: {error}") from None
  else:
    base = presets.get_preset(args.preset or "multi30k_transformer")
  return presets.apply_overrides(base, args.overrides)


def run_compile(args: argparse.Namespace) -> int:
  from seq2seq_jax import aot

  target = aot.parse_target(args.target)  # an unknown target fails before any work
  config = _compile_config(args)
  names = [name.strip() for name in args.program.split(",") if name.strip()]
  unknown = [name for name in names if name not in aot.PROGRAMS]
  if unknown or not names:
    raise ValueError(f"--program {args.program!r}: known programs are "
                     f"{', '.join(aot.PROGRAMS)}")
  reports = []
  for name in names:
    report = aot.compile_report(config, target, name, rows=args.batch, length=args.length)
    reports.append(report)
    if args.max_batch:
      reports.append(aot.find_max_batch(config, target, name, length=args.length,
                                        start_rows=args.batch))
  print(aot.format_table(reports))
  for report in reports:
    if report.max_batch_probes:
      print(f"largest {report.program} batch that fits on {report.target}: {report.rows} rows "
            f"({len(report.max_batch_probes)} compiles)")
  if args.json:
    records = [r.to_dict() for r in reports]
    pathlib.Path(args.json).write_text(
        json.dumps(records[0] if len(records) == 1 else records, indent=2) + "\n",
        encoding="utf-8")
  return 0 if all(r.fits for r in reports if not r.max_batch_probes) else 1


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="seq2seq-jax", description="Sequence-to-sequence models for machine translation.")
  parser.add_argument("--verbose", "-v", action="store_true", help="log at INFO level")
  subparsers = parser.add_subparsers(dest="command", required=True, title="commands")
  _add_prepare(subparsers)
  _add_train(subparsers)
  _add_evaluate(subparsers)
  _add_translate(subparsers)
  _add_export(subparsers)
  _add_save_pretrained(subparsers)
  _add_compile(subparsers)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Runs ``seq2seq-jax`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

  Bad input (a config value, a data file) prints one ``error:`` line that names
  the field or file and the fix, and returns 2, without a traceback.

  Run as a program (``argv`` None), it first restarts itself once with the glibc
  malloc setting that maps XLA's per-step scratch memory in huge pages
  (``seq2seq_jax.allocator``; ``SEQ2SEQ_JAX_TUNE_MALLOC=0`` keeps the defaults).
  """
  if argv is None:
    from seq2seq_jax import allocator
    allocator.reexec_with_tuned_malloc()
  from seq2seq_jax.aot.targets import quiet_libtpu
  quiet_libtpu()  # before jax starts: no TPU warnings where libtpu is installed without a TPU
  parser = build_parser()
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                      format="%(levelname)s %(name)s: %(message)s")
  from seq2seq_jax.data.text_files import DataError
  if args.command != "translate" and not args.verbose:
    import tensorflow_datasets as tfds  # its per-split progress bars drown the training lines
    tfds.disable_progress_bar()
  try:
    return args.run(args)
  except (DataError, ValueError, FileNotFoundError) as e:
    # ValueError covers bad configs, ConfigMismatchError and CheckpointError.
    print(f"seq2seq-jax {args.command}: error: {e}", file=sys.stderr)
    return 2
  except FloatingPointError as e:  # NonFiniteLossError: the message names the step
    print(f"seq2seq-jax {args.command}: error: {e}", file=sys.stderr)
    return 3


if __name__ == "__main__":
  sys.exit(main())
