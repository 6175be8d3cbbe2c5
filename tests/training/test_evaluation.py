"""Corpus BLEU and chrF through sacrebleu, with their signatures."""

import pytest
import sacrebleu

from seq2seq_jax import evaluation
from seq2seq_jax.evaluation import corpus_bleu, corpus_chrf, perplexity


def test_bleu_matches_sacrebleu_and_reports_the_signature():
  hypotheses = ["A dog runs in the park .", "Two men play football"]
  references = ["A dog is running in the park .", "Two men are playing football ."]
  score = corpus_bleu(hypotheses, references)
  assert score.score == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
  assert 0 < score.score < 100
  assert score.signature.startswith("nrefs:1|case:mixed") and "tok:13a" in score.signature
  assert corpus_bleu(references, references).score == pytest.approx(100.0)
  chrf = corpus_chrf(hypotheses, references)
  assert 0 < chrf.score < 100 and "nc:6" in chrf.signature


def test_mismatched_counts_are_refused():
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    corpus_bleu(["a", "b"], ["a"])
  with pytest.raises(TypeError, match="sequences of sentences"):
    corpus_bleu("a b", "a b")


def test_perplexity():
  assert perplexity(0.0, 10) == 1.0
  assert perplexity(20.0, 10) == pytest.approx(7.389056, rel=1e-6)


# ---- BLEU by convention: sacrebleu, tok, mmt ----------------------------------------------

def _multi_bleu(hypotheses: list[str], references: list[str]) -> float:
  """multi-bleu.perl's corpus BLEU-4 of whitespace tokens, in float64: the reference."""
  import collections
  import math

  matches, totals = [0] * 4, [0] * 4
  hyp_len = ref_len = 0
  for hyp, ref in zip(hypotheses, references):
    h, r = hyp.split(), ref.split()
    hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
    for n in range(1, 5):
      h_grams = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
      r_grams = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
      matches[n - 1] += sum(min(c, r_grams[g]) for g, c in h_grams.items())
      totals[n - 1] += max(len(h) - n + 1, 0)
  if min(matches) == 0:
    return 0.0
  log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
  brevity = min(0.0, 1.0 - ref_len / hyp_len)
  return 100.0 * math.exp(log_precision + brevity)


# Raw hypotheses and references, and their lowercased, normalized, Moses-tokenized forms
# written out by hand: apostrophes escaped and split as English splits them, brackets,
# German compounds with hyphens kept whole (tokenizer.perl without -a, as the official
# Multi30k files), an empty output.
FIXTURES = {
    "en": (["A man in a blue shirt holds a boy's hand.", "Women's softball: the catcher rises.",
            "", "Two men (wearing hats) sit on a bench."],
           ["A man in a blue shirt is holding a boy's hand.",
            "In women's softball, the catcher rises to her feet.", "A man sleeps.",
            "Two men wearing hats sit on a bench."],
           ["a man in a blue shirt holds a boy &apos;s hand .",
            "women &apos;s softball : the catcher rises .", "",
            "two men ( wearing hats ) sit on a bench ."],
           ["a man in a blue shirt is holding a boy &apos;s hand .",
            "in women &apos;s softball , the catcher rises to her feet .", "a man sleeps .",
            "two men wearing hats sit on a bench ."]),
    "de": (["Ein Boston Terrier läuft über saftig-grünes Gras vor einem Zaun."],
           ["Ein Boston Terrier rennt über saftig-grünes Gras vor einem weißen Zaun."],
           ["ein boston terrier läuft über saftig-grünes gras vor einem zaun ."],
           ["ein boston terrier rennt über saftig-grünes gras vor einem weißen zaun ."]),
}


@pytest.mark.parametrize("lang", ["en", "de"])
def test_mmt_bleu_equals_multi_bleu_of_hand_tokenized_text(lang):
  hypotheses, references, tokenized_hypotheses, tokenized_references = FIXTURES[lang]
  process = evaluation._moses(lang)
  assert [process(h) for h in hypotheses] == tokenized_hypotheses
  assert [process(r) for r in references] == tokenized_references
  score = evaluation.mmt_bleu(hypotheses, references, lang=lang)
  reference = _multi_bleu(tokenized_hypotheses, tokenized_references)
  assert score.score == pytest.approx(reference, abs=1e-9)
  assert 10 < score.score < 90
  plain = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
  assert score.score == pytest.approx(
      plain.corpus_score(tokenized_hypotheses, [tokenized_references]).score)
  assert "mmt:lc.norm.tok" in score.signature and "smooth:none" in score.signature


def test_tok_bleu_scores_hypotheses_against_official_tokenized_references():
  hypotheses, _, tokenized_hypotheses, tokenized_references = FIXTURES["en"]
  score = evaluation.bleu(hypotheses, ["unused"] * len(hypotheses), scoring="tok", lang="en",
                          tokenized_references=tokenized_references)
  expected = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(
      tokenized_hypotheses, [tokenized_references]).score
  assert score.score == pytest.approx(expected)
  assert score.name == "BLEU-lc.norm.tok"


def test_bleu_by_name_and_its_errors():
  text = ["A dog runs across the green grass."]
  assert evaluation.bleu(text, text).signature.startswith("nrefs:1|case:mixed")
  assert evaluation.bleu(text, ["a dog runs across the green grass ."],
                         scoring="mmt").score == pytest.approx(100.0)
  with pytest.raises(ValueError, match="official lowercased, tokenized references"):
    evaluation.bleu(["a"], ["a"], scoring="tok")
  with pytest.raises(ValueError, match="known: sacrebleu, tok, mmt"):
    evaluation.bleu(["a"], ["a"], scoring="multi-bleu")


@pytest.mark.data
@pytest.mark.parametrize("lang", ["en", "de"])
def test_mmt_preprocessing_reproduces_the_official_multi30k_files(multi30k_raw, lang):
  from seq2seq_jax.data import text_files
  tok = multi30k_raw.parent / "tok"
  same = total = 0
  files = text_files.split_files(multi30k_raw, [lang])
  for split in ("val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"):
    path = files[split][lang]
    raw = text_files.decode_lines(text_files.read_bytes(path), str(path))
    official = (tok / f"{split}.lc.norm.tok.{lang}").read_text(encoding="utf-8").splitlines()
    process = evaluation._moses(lang)
    same += sum(process(line) == line_tok for line, line_tok in zip(raw, official))
    total += len(official)
  assert same >= total - 1, (same, total)  # one German val line differs ('tea .' vs 'tea" .')
