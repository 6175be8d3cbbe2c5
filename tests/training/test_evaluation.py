"""Corpus BLEU and chrF through sacrebleu, with their signatures."""

import pytest
import sacrebleu

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
