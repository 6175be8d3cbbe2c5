"""Translation quality through sacrebleu: corpus BLEU and chrF, with the signature to report.

Scores are of detokenized text against untokenized references (sacrebleu's
defaults: 13a tokenization, mixed case), the comparable way; the signature says
exactly how a number was computed.

Example:
  >>> score = corpus_bleu(["A dog runs ."], ["A dog runs ."])
  >>> round(score.score, 2), score.signature
  (100.0, 'nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:...')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import sacrebleu


@dataclasses.dataclass(frozen=True)
class Score:
  """A corpus-level score and how it was computed."""

  name: str  # "BLEU" or "chrF"
  score: float  # 0-100
  signature: str  # sacrebleu's signature, e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
  details: str  # sacrebleu's one-line summary (n-gram precisions, brevity penalty ...)

  def __str__(self) -> str:
    return f"{self.name} {self.score:.2f} ({self.signature})"


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[list[str], list[str]]:
  if isinstance(hypotheses, str) or isinstance(references, str):
    raise TypeError("hypotheses and references must be sequences of sentences, not one string")
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references: they must "
                     "pair up line by line")
  if not references:
    raise ValueError("no sentences to score")
  return list(hypotheses), list(references)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], *,
                tokenize: str | None = None, lowercase: bool = False) -> Score:
  """Corpus BLEU of detokenized hypotheses against one reference each.

  Args:
    hypotheses: system outputs, one string per sentence.
    references: the references, same order and count.
    tokenize: sacrebleu tokenizer ("13a" default, "intl", "zh", "none" ...).
    lowercase: case-insensitive BLEU.
  """
  hypotheses, references = _check(hypotheses, references)
  metric = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
  result = metric.corpus_score(hypotheses, [references])
  score = 0.0 if math.isnan(result.score) else float(result.score)
  return Score("BLEU", score, str(metric.get_signature()), str(result))


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
  """Corpus chrF (character 6-grams, beta 2) against one reference each."""
  hypotheses, references = _check(hypotheses, references)
  metric = sacrebleu.metrics.CHRF()
  result = metric.corpus_score(hypotheses, [references])
  return Score("chrF", float(result.score), str(metric.get_signature()), str(result))


def perplexity(nll_sum: float, tokens: float) -> float:
  """``exp(nll_sum / tokens)`` from summed token losses (``LossSums.nll``, ``LossSums.tokens``)."""
  if tokens <= 0:
    raise ValueError(f"tokens={tokens}: perplexity needs at least one target token")
  return float(math.exp(min(nll_sum / tokens, 700.0)))


def moses_tokenized_bleu(hypotheses: Sequence[str], tokenized_references: Sequence[str], *,
                         lang: str) -> Score:
  """BLEU the way older Multi30k papers report it: lowercased, Moses-tokenized text.

  The hypotheses are punctuation-normalized, lowercased and Moses-tokenized
  (sacremoses, with ``&apos;``-style escaping, as the official ``*.lc.norm.tok.*``
  files are) and scored against such references without further tokenization.
  Not comparable with the detokenized sacreBLEU figure: report both, and say which.

  Args:
    hypotheses: detokenized system outputs.
    tokenized_references: lines of e.g. ``multi30k/tok/test_2016_flickr.lc.norm.tok.en``.
    lang: the target language code (Moses tokenization rules differ by language).
  """
  from sacremoses import MosesPunctNormalizer, MosesTokenizer

  hypotheses, references = _check(hypotheses, tokenized_references)
  normalizer, tokenizer = MosesPunctNormalizer(lang), MosesTokenizer(lang)
  tokenized = [tokenizer.tokenize(normalizer.normalize(h).lower(), escape=True, return_str=True)
               for h in hypotheses]
  metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)
  result = metric.corpus_score(tokenized, [references])
  score = 0.0 if math.isnan(result.score) else float(result.score)
  return Score("BLEU-lc.norm.tok", score, str(metric.get_signature()) + "|moses-lc", str(result))
