"""`seq2seq-jax prepare`: prepares a corpus (and optionally its vocabulary); bad input exits 2."""

import pytest

from seq2seq_jax import cli
from seq2seq_jax.data import tokenizer as tokenizer_lib

pytestmark = pytest.mark.data  # reads ../shared/data (fails under CI=true when missing)


def test_prepare_multi30k_tiny_and_its_vocabulary(multi30k_tiny, tmp_path, capsys):
  status = cli.main(["prepare", "--dataset", "multi30k", "--manual-dir", str(multi30k_tiny),
                     "--data-dir", str(tmp_path / "tfds"), "--tokenizer",
                     str(tmp_path / "run" / "tokenizer.model"), "--vocab-size", "300"])
  out = capsys.readouterr().out
  assert status == 0
  assert "train: 300 pairs" in out and "val: 50 pairs" in out and "test_2016_flickr: 50 pairs" in out
  assert list((tmp_path / "tfds" / "multi30k").glob("de-en_*/1.0.0/dataset_info.json"))
  assert tokenizer_lib.Tokenizer.load(tmp_path / "run" / "tokenizer.model").vocab_size == 300
  # The training split as token ids, then found again (tokenizer loaded, nothing written).
  assert "trained a 300-piece vocabulary" in out and "token ids of train: 300 pairs" in out
  (meta,) = (tmp_path / "tfds" / "ids").glob("multi30k/*/*/de-en/train/*/meta.json")
  stamp = meta.stat().st_mtime_ns
  assert cli.main(["prepare", "--dataset", "multi30k", "--manual-dir", str(multi30k_tiny),
                   "--data-dir", str(tmp_path / "tfds"), "--tokenizer",
                   str(tmp_path / "run" / "tokenizer.model"), "--vocab-size", "300"]) == 0
  assert "loaded a 300-piece vocabulary" in capsys.readouterr().out
  assert meta.stat().st_mtime_ns == stamp


def test_prepare_train_files_names_a_bad_line(multi30k_tiny, tmp_path, capsys):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  (corpus / "part-1.de").write_text("eins\nzwei\n")
  (corpus / "part-1.en").write_text("one\n\n")
  args = ["prepare", "--manual-dir", str(multi30k_tiny), "--data-dir", str(tmp_path / "tfds"),
          "--train-files", str(corpus / "part-*.{lang}"), "--tokenizer",
          str(tmp_path / "tokenizer.model"), "--vocab-size", "300"]
  assert cli.main(args) == 2
  assert "part-1.en: line 2 is empty" in capsys.readouterr().err


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
  (tmp_path / "corpus").mkdir()
  (tmp_path / "corpus" / "train.de").write_text("eins\nzwei\n")
  (tmp_path / "corpus" / "train.en").write_text("one\n")
  status = cli.main(["prepare", "--dataset", "parallel_text", "--manual-dir",
                     str(tmp_path / "corpus"), "--data-dir", str(tmp_path / "tfds")])
  assert status == 2
  assert "error: line counts differ: train.de has 2, train.en has 1" in capsys.readouterr().err


def test_a_command_is_required(capsys):
  with pytest.raises(SystemExit):
    cli.main([])
  assert "prepare" in capsys.readouterr().err
