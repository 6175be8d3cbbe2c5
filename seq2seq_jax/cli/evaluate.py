"""Translates an evaluation split of the run's corpus (or any --sources / --references files) and
prints BLEU under the convention --scoring names (default: detokenized sacreBLEU) and chrF;
for a local Multi30k copy also BLEU against the official lowercased, tokenized references.
Each BLEU line names its convention, e.g. "BLEU (tok) 33.54". Writes
eval-SPLIT-STEP-METHOD.json and the hypotheses into WORKDIR/eval/.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from typing import Any

from seq2seq_jax.cli import flags

HELP = "translate a split and score it with sacreBLEU (BLEU, chrF)"
# evaluation.SCORINGS, written out so that --help does not import sacrebleu.
SCORINGS = ("sacrebleu", "tok", "mmt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
  flags.add_decode_flags(parser)
  parser.add_argument("--split", default=None,
                      help="split of the run's corpus, e.g. val, test_2016_flickr, or several "
                           "separated by commas (one model load for all); default: the run's "
                           "data.eval_split")
  data = parser.add_argument_group(
      "corpus of a --pretrained checkpoint (a --workdir run uses its own); --source-lang and "
      "--target-lang are also the language codes of multilingual checkpoints")
  flags.add_data_flags(data)
  parser.add_argument("--sources", default=None, metavar="FILE",
                      help="score these source sentences instead of a split (with --references)")
  parser.add_argument("--references", default=None, metavar="FILE",
                      help="reference translations of --sources, line by line")
  parser.add_argument("--max-sentences", type=int, default=0, help="only the first N (0 = all)")
  parser.add_argument("--show", type=int, default=0, metavar="N",
                      help="also print N source / hypothesis / reference triples")
  parser.add_argument("--scoring", choices=SCORINGS, default="sacrebleu",
                      help="BLEU convention: sacrebleu (cased, detokenized, sacreBLEU's "
                           "defaults), tok (against Multi30k's official lowercased, tokenized "
                           "references, tok/ beside a local raw/ copy) or mmt (both sides "
                           "lowercased and Moses-tokenized here, as WMT16's multimodal task "
                           "scored); default %(default)s")


def run(args: argparse.Namespace) -> int:
  if (args.sources is None) != (args.references is None):
    raise ValueError("--sources and --references go together: give both files, or neither to "
                     "evaluate a split of the run's corpus")
  translator = flags.translator(args)
  if translator.config is None:  # a pretrained checkpoint: the corpus flags say what to read
    from seq2seq_jax import configs
    translator.config = configs.ExperimentConfig(
        model=translator.model.config, data=flags.data_config(args),
        decode=translator.decode_config)
  config = translator.config
  if args.sources:
    sources, references = _read_lines(args.sources), _read_lines(args.references)
    if len(sources) != len(references):
      raise ValueError(f"{args.sources} has {len(sources)} lines but {args.references} has "
                       f"{len(references)}: they must be aligned line by line")
    if args.scoring == "tok":
      raise ValueError("--scoring tok compares with Multi30k's official lowercased, tokenized "
                       "references, which exist for its splits only, not for --sources files: "
                       "use --scoring mmt (it tokenizes the references itself) or sacrebleu")
    _evaluate_one(args, translator, pathlib.Path(args.sources).name, sources, references, None)
    return 0
  from seq2seq_jax.data import sources
  splits = [s.strip() for s in (args.split or config.data.eval_split).split(",") if s.strip()]
  texts = {split: sources.load_eval_text(config.data, split) for split in splits}  # fail early
  tokenized = {split: _tokenized_references(config.data, split) for split in splits}
  missing = [split for split, path in tokenized.items() if path is None]
  if args.scoring == "tok" and missing:
    raise ValueError(f"--scoring tok needs the official lowercased, tokenized references of "
                     f"{', '.join(missing)}: Multi30k's tok/SPLIT.lc.norm.tok."
                     f"{config.data.target_lang} beside a local raw/ copy (--manual-dir); "
                     "none was found. Use --scoring mmt (it tokenizes the references itself) "
                     "or sacrebleu")
  for split, text in texts.items():
    _evaluate_one(args, translator, split, text.sources, text.references, tokenized[split])
  return 0


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


def _languages(translator: Any, source: str | None, target: str | None) -> dict[str, str | None]:
  """Language codes for a multilingual checkpoint's tokenizer; none for the others."""
  if getattr(translator.tokenizer, "languages", ()):
    return {"source_lang": source, "target_lang": target}
  return {}


def _numerics(translator: Any) -> dict[str, str]:
  """How the model computes: ``{"quantize": "none" or "int8", "dtype": ...}``."""
  return {"quantize": translator.quantize,
          "dtype": getattr(getattr(translator.model, "config", None), "dtype", "float32")}


def _scores(args: argparse.Namespace, lang: str, hypotheses: list[str], references: list[str],
            tokenized_references: list[str] | None) -> dict[str, Any]:
  """The scores to print, each under a label that names its convention: BLEU by
  ``--scoring``, chrF, and BLEU (tok) too where the official tokenized references are."""
  from seq2seq_jax import evaluation

  scores = {f"BLEU ({args.scoring})": evaluation.bleu(
                hypotheses, references, scoring=args.scoring, lang=lang,
                tokenized_references=tokenized_references),
            "chrF": evaluation.corpus_chrf(hypotheses, references)}
  if tokenized_references is not None and args.scoring != "tok":
    scores["BLEU (tok)"] = evaluation.bleu(hypotheses, references, scoring="tok", lang=lang,
                                           tokenized_references=tokenized_references)
  return scores


def _evaluate_one(args: argparse.Namespace, translator: Any, split: str, sources: list[str],
                  references: list[str], tokenized: pathlib.Path | None) -> None:
  """Translates, scores, prints and writes eval-SPLIT-STEP-METHOD.{json,txt} for one set;
  ``tokenized``: the split's official lowercased, tokenized references, if any."""
  config = translator.config
  limit = args.max_sentences or len(sources)
  sources, references = sources[:limit], references[:limit]
  tokenized_references = None if tokenized is None else _read_lines(str(tokenized))[:limit]
  decode = translator.decode_config
  beam_size = args.beam_size if args.beam_size is not None else (
      decode.beam_size if decode.method == "beam" else 1)
  alpha = args.alpha if args.alpha is not None else decode.alpha
  start = time.perf_counter()
  hypotheses = translator.translate(
      sources, beam_size=beam_size, alpha=alpha, max_decode_len=args.max_decode_len,
      **_languages(translator, config.data.source_lang, config.data.target_lang),
      **flags.decode_options(args))
  seconds = time.perf_counter() - start
  scores = _scores(args, config.data.target_lang, hypotheses, references, tokenized_references)
  method = "greedy" if beam_size == 1 else f"beam{beam_size}-alpha{alpha:g}"
  pair = f"{config.data.source_lang}->{config.data.target_lang}"
  checkpoint = translator.step if translator.step is not None else "pretrained"
  numerics = _numerics(translator)
  print(f"{split} ({pair}, {len(sources)} sentences, checkpoint {checkpoint}, {method}, "
        + "".join(f"{value}, " for value in numerics.values() if value not in ("none", "float32"))
        + f"{seconds:.1f} s):")
  for label, score in scores.items():
    print(f"  {label} {score.score:.2f} ({score.signature})")
  for i in range(min(args.show, len(sources))):
    print(f"\n  source:     {sources[i]}\n  hypothesis: {hypotheses[i]}\n"
          f"  reference:  {references[i]}")
  out_dir = pathlib.Path(args.workdir or ".") / "eval"
  out_dir.mkdir(parents=True, exist_ok=True)
  # int8 or bfloat16 runs get their own files beside the float32 ones
  name = "-".join([f"eval-{split}-{checkpoint}-{method}"] + [
      value for value in numerics.values() if value not in ("none", "float32")])
  (out_dir / f"{name}.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
  record = {
      "split": split, "pair": pair, "sentences": len(sources), "checkpoint_step": translator.step,
      "pretrained": args.pretrained,
      "decode": {"method": "greedy" if beam_size == 1 else "beam", "beam_size": beam_size,
                 "alpha": alpha, "max_decode_len": args.max_decode_len
                 or translator.max_decode_len(decode),
                 "max_source_len": translator.max_source_len, **flags.decode_options(args),
                 "ensemble": list(getattr(args, "ensemble", []))},
      **numerics, "scoring": args.scoring,
      "scores": {s.name: {"score": s.score, "signature": s.signature, "details": s.details}
                 for s in scores.values()},
      "tokenized_references": str(tokenized) if tokenized else None,
      "seconds": seconds, "hypotheses_file": str(out_dir / f"{name}.txt")}
  (out_dir / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
