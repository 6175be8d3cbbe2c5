"""The sentencepiece vocabulary: reserved ids, exact round trip, save/load, clear size errors."""

import pickle

import numpy as np
import pytest

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import tokenizer as tokenizer_lib
from seq2seq_jax.types import BOS_ID, EOS_ID, PAD_ID, UNK_ID

pytestmark = pytest.mark.data  # reads ../shared/data (fails under CI=true when missing)


def _lines(path) -> list[str]:
  return path.read_text(encoding="utf-8").split("\n")[:-1]


def test_reserved_ids_and_size(tiny_tokenizer, tiny_config):
  assert tiny_tokenizer.vocab_size == tiny_config.vocab_size
  assert [tiny_tokenizer.id_to_piece(i) for i in (PAD_ID, BOS_ID, EOS_ID, UNK_ID)] == [
      "<pad>", "<s>", "</s>", "<unk>"]
  assert tiny_tokenizer.encode("Ein Hund \u4e00")[-1] == UNK_ID  # a character never seen


def test_round_trip_on_the_training_text(tiny_tokenizer, multi30k_tiny):
  text = _lines(multi30k_tiny / "train.de") + _lines(multi30k_tiny / "train.en")
  ids = tiny_tokenizer.encode_batch(text)
  assert all(min(row) > UNK_ID for row in ids)  # training text: no reserved id, no UNK
  assert [tiny_tokenizer.decode(row) for row in ids] == text
  # Decoding stops at EOS and skips PAD / BOS, as model output needs.
  row = [BOS_ID] + ids[0] + [EOS_ID] + ids[1] + [PAD_ID]
  assert tiny_tokenizer.decode(np.asarray(row, np.int32)) == text[0]
  with pytest.raises(ValueError, match=r"id 500 is outside"):
    tiny_tokenizer.decode([5, 500])


def test_save_load_and_pickle(tiny_tokenizer, tmp_path):
  path = tmp_path / "run" / "tokenizer.model"
  tiny_tokenizer.save(path)
  loaded = tokenizer_lib.Tokenizer.load(path)
  assert loaded == tiny_tokenizer
  sentence = "Zwei Hunde spielen im Schnee."
  assert loaded.encode(sentence) == tiny_tokenizer.encode(sentence)
  assert pickle.loads(pickle.dumps(tiny_tokenizer)).encode(sentence) == tiny_tokenizer.encode(sentence)


def test_load_or_train_checks_the_size(tiny_config, tiny_tokenizer, tmp_path):
  path = tmp_path / "tokenizer.model"
  tiny_tokenizer.save(path)
  assert tokenizer_lib.load_or_train_tokenizer(tiny_config, path) == tiny_tokenizer
  other = DataConfig(manual_dir=tiny_config.manual_dir, data_dir=tiny_config.data_dir,
                     vocab_size=400)
  with pytest.raises(ValueError, match=r"500 pieces but DataConfig.vocab_size=400"):
    tokenizer_lib.load_or_train_tokenizer(other, path)


def test_too_large_a_vocabulary_says_what_fits(tiny_config):
  config = DataConfig(manual_dir=tiny_config.manual_dir, data_dir=tiny_config.data_dir,
                      vocab_size=8000)
  with pytest.raises(ValueError, match=r"vocab_size=8000 is more than .* at most \d+"):
    tokenizer_lib.train_tokenizer(config)


def test_a_model_with_other_reserved_ids_is_refused():
  import io
  import sentencepiece as spm
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c d e f g"] * 20), model_writer=model,
                                 vocab_size=12, minloglevel=2)  # sentencepiece's defaults
  with pytest.raises(ValueError, match=r"PAD/BOS/EOS/UNK ids"):
    tokenizer_lib.Tokenizer(model.getvalue())
