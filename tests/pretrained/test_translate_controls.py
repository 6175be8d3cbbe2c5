"""Controls through the Translator and the command line on a converted checkpoint: prefixes and
constraints given as text, decoding options, ensembles of checkpoints."""

import io
import sys

import jax
import numpy as np
import pytest

from seq2seq_jax import cli, pretrained
from seq2seq_jax.translator import Translator

SENTENCES = ["Ein Hund läuft im Park.", "Zwei Männer sitzen auf einer Bank.", "",
             "Eine Frau spielt Gitarre.", "Kinder spielen im Wasser."]
PREFIXES = ["The dog", "", "", "", "Some children"]
PHRASES = [["park"], ["bench", "old"], [], [], []]


@pytest.fixture(scope="module")
def translator(marian_dir):
  return Translator.from_pretrained(marian_dir, batch_size=4)


def test_prefixes_and_phrases_hold_and_other_sentences_are_unchanged(translator):
  plain = translator.translate(SENTENCES, beam_size=4)
  out = translator.translate(SENTENCES, beam_size=4, target_prefix=PREFIXES,
                             constraints=PHRASES)
  for text, prefix, phrases, before in zip(out, PREFIXES, PHRASES, plain):
    assert text.startswith(prefix)
    assert all(p in text for p in phrases), (text, phrases)
    if not prefix and not phrases:
      assert text == before
  assert out[2] == ""
  assert out[0] != plain[0] and out[1] != plain[1]
  # Batching does not change a sentence's translation (5 sentences, batches of 4).
  for i in (1, 3):
    assert translator.translate([SENTENCES[i]], beam_size=4, target_prefix=[PREFIXES[i]],
                                constraints=[PHRASES[i]]) == [out[i]]


def test_decode_options_and_their_errors(translator):
  out = translator.translate(SENTENCES, beam_size=4, no_repeat_ngram_size=1)
  for text in out:
    ids = translator.tokenizer.encode_target([text])[0]
    assert len(set(ids)) == len(ids), text
  with pytest.raises(TypeError, match="unknown decoding options \\['beams'\\]"):
    translator.translate(SENTENCES, beams=4)
  with pytest.raises(ValueError, match="target_prefix needs one entry per sentence"):
    translator.translate(SENTENCES, target_prefix=["A"])
  with pytest.raises(ValueError, match=r"target_prefix\[1\] has .* no room"):
    translator.translate(SENTENCES, max_decode_len=3, target_prefix=["", "a b c d e f g", "",
                                                                      "", ""])
  with pytest.raises(ValueError, match="constraints need beam search"):
    translator.translate(SENTENCES, method="greedy", constraints=PHRASES)


def test_ensembles_of_translators_and_on_the_command_line(translator, marian_dir, m2m100_dir,
                                                          tmp_path, capsys, monkeypatch):
  checkpoint = pretrained.load(marian_dir)
  noise = jax.tree.map(lambda p: np.asarray(p) * 0.9, checkpoint.params)
  other_dir = tmp_path / "marian-other"
  pretrained.save(checkpoint, other_dir, params=noise)
  other = Translator.from_pretrained(other_dir, batch_size=4)
  sentences = [s for s in SENTENCES if s]
  assert Translator.ensemble([translator, translator]).translate(sentences, beam_size=4) == (
      translator.translate(sentences, beam_size=4))
  both = Translator.ensemble([translator, other]).translate(sentences, beam_size=4)
  assert both != translator.translate(sentences, beam_size=4) or both != other.translate(
      sentences, beam_size=4)
  with pytest.raises(ValueError, match="member 1 has another vocabulary"):
    Translator.ensemble([translator, Translator.from_pretrained(m2m100_dir)])
  # The command line: the same ensemble, prefixes and phrases from files, an option.
  (tmp_path / "prefixes.txt").write_text("\n".join(PREFIXES) + "\n", encoding="utf-8")
  (tmp_path / "phrases.tsv").write_text("\n".join("\t".join(p) for p in PHRASES) + "\n",
                                        encoding="utf-8")
  monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(SENTENCES) + "\n"))
  assert cli.main(["translate", "--pretrained", str(marian_dir), "--ensemble", str(other_dir),
                   "--beam-size", "4", "--batch-size", "4", "--prefix-file",
                   str(tmp_path / "prefixes.txt"), "--constraints-file",
                   str(tmp_path / "phrases.tsv"), "--set", "decode.no_repeat_ngram_size=3"]) == 0
  printed = capsys.readouterr().out.splitlines()
  expected = Translator.ensemble([translator, other]).translate(
      SENTENCES, beam_size=4, target_prefix=PREFIXES, constraints=PHRASES,
      no_repeat_ngram_size=3)
  assert printed == expected
  monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund.\n"))
  assert cli.main(["translate", "--pretrained", str(marian_dir), "--prefix-file",
                   str(tmp_path / "prefixes.txt")]) == 2
  assert "ends at line 1 but" in capsys.readouterr().err  # prefixes.txt has 5 lines
