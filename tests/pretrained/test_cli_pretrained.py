"""The command line with converted checkpoints: translate, evaluate, fine-tune, save back."""

import io
import json
import sys

import numpy as np
import pytest

from seq2seq_jax import cli, pretrained
from seq2seq_jax.translator import Translator

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_translate_pretrained_reads_stdin(m2m100_dir, capsys, monkeypatch):
  lines = ["Ein Hund rennt.", "", "Zwei Männer sitzen auf einer Bank."]
  monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
  assert cli.main(["translate", "--pretrained", str(m2m100_dir), "--source-lang", "de",
                   "--target-lang", "en", "--max-decode-len", "40"]) == 0
  printed = capsys.readouterr().out.splitlines()
  expected = Translator.from_pretrained(m2m100_dir).translate(
      lines, max_decode_len=40, source_lang="de", target_lang="en")
  assert printed == expected and printed[1] == "" and printed[0]


def test_unknown_target_language_is_a_clear_error(m2m100_dir, capsys, monkeypatch):
  monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund rennt.\n"))
  assert cli.main(["translate", "--pretrained", str(m2m100_dir), "--target-lang", "xx"]) == 2
  err = capsys.readouterr().err
  assert "error:" in err and "'xx'" in err and "en" in err


def test_evaluate_pretrained_on_a_split(marian_dir, multi30k_raw, tmp_path, capsys,
                                        monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert cli.main(["evaluate", "--pretrained", str(marian_dir), "--manual-dir",
                   str(multi30k_raw), "--split", "test_2016_flickr", "--max-sentences", "40",
                   "--beam-size", "1"]) == 0
  out = capsys.readouterr().out
  assert "BLEU" in out and "checkpoint pretrained" in out
  record = json.loads(next((tmp_path / "eval").glob("eval-test_2016_flickr-*.json")).read_text())
  assert record["sentences"] == 40 and record["pretrained"] == str(marian_dir)


def test_fine_tune_then_save_back_for_transformers(marian_dir, multi30k_tiny, tmp_path, capsys):
  workdir, out = tmp_path / "ft", tmp_path / "saved"
  overrides = ["data.manual_dir=" + str(multi30k_tiny), "train.num_steps=6",
               "train.log_every=3", "train.eval_every=6", "train.checkpoint_every=3",
               "train.eval_bleu_sentences=8", "train.eval_batches=1", "train.warmup_steps=2",
               "train.learning_rate=1e-3", "data.batch_tokens=1024",
               "data.bucket_lengths=16,32,64"]
  argv = ["train", "--init-from", str(marian_dir), "--workdir", str(workdir), "--quiet"]
  for item in overrides:
    argv += ["--set", item]
  assert cli.main(argv) == 0, capsys.readouterr().err
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["train"]["init_from"] == str(marian_dir)
  assert saved["model"]["positions"] == "sinusoidal_marian"
  assert cli.main(["save-pretrained", "--workdir", str(workdir), "--out", str(out)]) == 0
  # transformers loads the fine-tuned weights; they moved away from the start, and this
  # library reads them back identically.
  tuned = transformers.MarianMTModel.from_pretrained(out).eval()
  start = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
  a = tuned.model.encoder.layers[0].fc1.weight.detach().numpy()
  b = start.model.encoder.layers[0].fc1.weight.detach().numpy()
  assert 0 < np.abs(a - b).max() < 0.1
  ours = pretrained.load(out).params["encoder_layers_0"]["feed_forward"]["wi"]["kernel"]
  np.testing.assert_array_equal(np.asarray(ours), a.T)
  # The run's checkpoint holds the pretrained tokenizer: the Translator needs nothing else.
  translator = Translator.from_workdir(workdir)
  assert translator.tokenizer.encode_source(["Ein Hund."]) == \
      pretrained.load(marian_dir).tokenizer.encode_source(["Ein Hund."])
