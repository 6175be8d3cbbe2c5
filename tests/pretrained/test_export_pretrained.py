"""Converted checkpoints through jax.export: the tokenizer travels, the forced language code too."""

import subprocess
import sys

import pytest

from seq2seq_jax import serving
from seq2seq_jax.inference import Translator

SENTENCES = ["Ein Hund rennt über die Wiese.", "", "Zwei Männer sitzen auf einer Bank."]


@pytest.mark.slow
@pytest.mark.parametrize("fixture, languages", [
    ("marian_dir", []),
    ("m2m100_dir", ["--source-lang", "de", "--target-lang", "en"]),
    ("nllb_dir", ["--source-lang", "deu_Latn", "--target-lang", "eng_Latn"]),
], ids=["marian", "m2m100", "nllb"])
def test_exported_pretrained_checkpoint_equals_its_translator(fixture, languages, request,
                                                             tmp_path):
  directory = request.getfixturevalue(fixture)
  out = tmp_path / "checkpoint.s2sx"
  done = subprocess.run([sys.executable, "-m", "seq2seq_jax.cli", "export", "--pretrained",
                         str(directory), "--out", str(out), "--platforms", "cpu,cuda,tpu",
                         "--batch-size", "2", "--bucket-lengths", "16",
                         "--max-decode-len", "20", *languages], capture_output=True, text=True,
                        timeout=900)
  assert done.returncode == 0, done.stderr
  codes = dict(zip(languages[::2], languages[1::2]))
  want = Translator.from_pretrained(directory, batch_size=2).translate(
      SENTENCES, max_decode_len=20, source_lang=codes.get("--source-lang"),
      target_lang=codes.get("--target-lang"))
  artifact = serving.load_exported(out)
  assert type(artifact.tokenizer).__name__ == {"marian_dir": "MarianTokenizer",
                                               "m2m100_dir": "M2M100Tokenizer",
                                               "nllb_dir": "NllbTokenizer"}[fixture]
  assert artifact.translate(SENTENCES) == want and want[0]
