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


def _moses(lang: str):
  """Lowercase, normalize punctuation, Moses-tokenize (escaped): the official Multi30k
  preprocessing that made ``*.lc.norm.tok.*`` (lowercase.perl, normalize-punctuation.perl,
  tokenizer.perl), through sacremoses."""
  from sacremoses import MosesPunctNormalizer, MosesTokenizer

  normalizer, tokenizer = MosesPunctNormalizer(lang), MosesTokenizer(lang)
  return lambda text: tokenizer.tokenize(normalizer.normalize(text.lower()), escape=True,
                                         return_str=True)


def _multi_bleu(tokenized_hypotheses: list[str], tokenized_references: list[str],
                name: str, suffix: str) -> Score:
  """Corpus BLEU-4 of whitespace tokens, unsmoothed, as ``multi-bleu.perl`` computes it."""
  metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
  result = metric.corpus_score(tokenized_hypotheses, [tokenized_references])
  score = 0.0 if math.isnan(result.score) else float(result.score)
  return Score(name, score, str(metric.get_signature()) + suffix, str(result))


def mmt_bleu(hypotheses: Sequence[str], references: Sequence[str], *, lang: str) -> Score:
  """BLEU as the WMT16 multimodal task (and the Multi30k literature after it) reports it.

  Hypotheses and references alike are lowercased, punctuation-normalized and
  Moses-tokenized (sacremoses, the rules of ``lang``), then scored as
  ``multi-bleu.perl`` scores tokens: corpus BLEU-4, no smoothing, the brevity penalty.

  Args:
    hypotheses: detokenized system outputs.
    references: the raw (cased, untokenized) references.
    lang: the target language code.

  Example:
    >>> round(mmt_bleu(["A dog's ball, in the grass."], ["a dog's ball, in the grass."],
    ...                lang="en").score, 2)
    100.0
  """
  hypotheses, references = _check(hypotheses, references)
  process = _moses(lang)
  return _multi_bleu([process(h) for h in hypotheses], [process(r) for r in references],
                     "BLEU-mmt", "|mmt:lc.norm.tok")


SCORINGS = ("sacrebleu", "tok", "mmt")


def bleu(hypotheses: Sequence[str], references: Sequence[str], *, scoring: str = "sacrebleu",
         lang: str = "en", tokenized_references: Sequence[str] | None = None) -> Score:
  """Corpus BLEU under a named convention (``SCORINGS``):

  - ``"sacrebleu"``: cased, detokenized, sacreBLEU's defaults (``corpus_bleu``);
  - ``"tok"``: against the official lowercased, tokenized references
    (``tokenized_references``, e.g. Multi30k's ``tok/*.lc.norm.tok.*``;
    ``moses_tokenized_bleu``);
  - ``"mmt"``: both sides lowercased, normalized and tokenized here (``mmt_bleu``).

  Raises:
    ValueError: an unknown convention, or ``"tok"`` without its references.
  """
  if scoring == "sacrebleu":
    return corpus_bleu(hypotheses, references)
  if scoring == "mmt":
    return mmt_bleu(hypotheses, references, lang=lang)
  if scoring == "tok":
    if tokenized_references is None:
      raise ValueError("scoring 'tok' compares with the official lowercased, tokenized "
                       "references (Multi30k's tok/*.lc.norm.tok.* beside raw/); none were "
                       "found: give them, or use scoring 'mmt', which tokenizes the raw "
                       "references itself")
    return moses_tokenized_bleu(hypotheses, tokenized_references, lang=lang)
  raise ValueError(f"unknown BLEU scoring {scoring!r}; known: {', '.join(SCORINGS)}")


def moses_tokenized_bleu(hypotheses: Sequence[str], tokenized_references: Sequence[str], *,
                         lang: str) -> Score:
  """BLEU the way older Multi30k papers report it: lowercased, Moses-tokenized text.

  The hypotheses are lowercased, punctuation-normalized and Moses-tokenized
  (sacremoses, with ``&apos;``-style escaping: the pipeline that made the official
  ``*.lc.norm.tok.*`` files, which it reproduces for 6,027 of their 6,028 test and
  validation lines) and scored against such references without further tokenization.
  Not comparable with the detokenized sacreBLEU figure: report both, and say which.

  Args:
    hypotheses: detokenized system outputs.
    tokenized_references: lines of e.g. ``multi30k/tok/test_2016_flickr.lc.norm.tok.en``.
    lang: the target language code (Moses tokenization rules differ by language).
  """
  hypotheses, references = _check(hypotheses, tokenized_references)
  process = _moses(lang)
  tokenized = [process(h) for h in hypotheses]
  metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)
  result = metric.corpus_score(tokenized, [references])
  score = 0.0 if math.isnan(result.score) else float(result.score)
  return Score("BLEU-lc.norm.tok", score, str(metric.get_signature()) + "|moses-lc", str(result))
