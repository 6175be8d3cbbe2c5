"""tfds builders: Multi30k from a local copy and from a (file://) download, parallel text, tfds:NAME."""

import gzip
import pathlib

import pytest
import tensorflow_datasets as tfds

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import builders
from seq2seq_jax.data.text_files import DataError

pytestmark = pytest.mark.data  # reads ../shared/data (fails under CI=true when missing)

SPLITS_TINY = {"train": 300, "val": 50, "test_2016_flickr": 50}


def _lines(path: pathlib.Path) -> list[str]:
  return path.read_text(encoding="utf-8").split("\n")[:-1]


def _mirror(source: pathlib.Path, dest: pathlib.Path, names, corrupt: str = "") -> str:
  """Gzips ``names`` of ``source`` into ``dest`` like the upstream repository; a file:// URL."""
  dest.mkdir(parents=True, exist_ok=True)
  for name in names:
    data = (source / name).read_bytes()
    if name == corrupt:
      data = data.replace(b"Hund", b"Hunt", 1)
    (dest / f"{name}.gz").write_bytes(gzip.compress(data, compresslevel=1))
  return dest.as_uri()


def test_tiny_reads_back_in_file_order(tiny_config, multi30k_tiny):
  builder = builders.prepare_dataset(tiny_config)
  assert {name: split.num_examples for name, split in builder.info.splits.items()} == SPLITS_TINY
  assert builder.info.disable_shuffling
  for split in SPLITS_TINY:
    pairs = builders.load_split(tiny_config, split)
    got = pairs.__getitems__(list(range(len(pairs))))
    expected = list(zip(_lines(multi30k_tiny / f"{split}.de"), _lines(multi30k_tiny / f"{split}.en")))
    assert got == expected, split  # line i of X.de pairs with line i of X.en, in file order


def test_iterating_pairs_reads_them_in_file_order(tiny_config, monkeypatch):
  monkeypatch.setattr(builders, "_BLOCK", 7)  # 300 pairs: 42 blocks of 7 and one of 6
  pairs = builders.load_split(tiny_config, "train")
  assert list(pairs) == [pairs[i] for i in range(len(pairs))] and len(list(pairs)) == 300


def test_reversed_direction_shares_the_prepared_copy(tiny_config):
  forward = builders.prepare_dataset(tiny_config)
  backward_config = DataConfig(manual_dir=tiny_config.manual_dir, data_dir=tiny_config.data_dir,
                               source_lang="en", target_lang="de")
  backward = builders.prepare_dataset(backward_config)
  assert backward.data_dir == forward.data_dir
  source, target = builders.load_split(backward_config, "val")[0]
  assert (target, source) == builders.load_split(tiny_config, "val")[0]


def test_unknown_split_and_missing_language_are_named(tiny_config):
  with pytest.raises(DataError, match=r"no split 'test'.*test_2016_flickr, train, val"):
    builders.load_split(tiny_config, "test")
  french = DataConfig(manual_dir=tiny_config.manual_dir, data_dir=tiny_config.data_dir,
                      source_lang="fr", target_lang="en")
  with pytest.raises(DataError, match=r"no split with both en and fr"):
    builders.prepare_dataset(french)


def test_full_copy_prepares_only_splits_with_both_languages(multi30k_raw, data_dir):
  # Planning only (no preparation): cs is missing from the 2017 test sets.
  def splits(source, target):
    config = DataConfig(manual_dir=str(multi30k_raw), data_dir=str(data_dir),
                        source_lang=source, target_lang=target)
    return sorted(builders.get_builder(config).builder_config.files)
  assert splits("de", "en") == ["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco",
                                "test_2018_flickr", "train", "val"]
  assert splits("cs", "en") == ["test_2016_flickr", "test_2018_flickr", "train", "val"]


def test_download_verifies_checksums_and_keys_copies_by_content(multi30k_raw, tiny_config,
                                                                data_dir, tmp_path):
  """Downloads de-en over file:// into the data dir that also holds the tiny copy."""
  names = [f"{split}.{lang}" for split in ("train", "val", "test_2016_flickr", "test_2017_flickr",
                                           "test_2017_mscoco", "test_2018_flickr")
           for lang in ("de", "en")]
  url = _mirror(multi30k_raw, tmp_path / "mirror", names)
  tiny = builders.prepare_dataset(tiny_config)
  official = DataConfig(data_dir=str(data_dir))  # no manual_dir: download
  full = builders.prepare_dataset(official, multi30k_url=url)
  assert full.data_dir != tiny.data_dir  # keyed on the source: the two copies never mix
  assert full.info.splits["train"].num_examples == 29000
  assert builders.load_split(tiny_config, "train").__len__() == 300
  train = builders.load_split(official, "train", multi30k_url=url)
  assert train[28999] == (_lines(multi30k_raw / "train.de")[28999],
                          _lines(multi30k_raw / "train.en")[28999])
  # The local full copy has the official content, so it is the same prepared copy.
  local = DataConfig(manual_dir=str(multi30k_raw), data_dir=str(data_dir))
  assert builders.get_builder(local).data_dir == full.data_dir


def test_download_rejects_a_corrupt_file(multi30k_raw, tmp_path):
  url = _mirror(multi30k_raw, tmp_path / "mirror", ["val.de", "val.en"], corrupt="val.de")
  with pytest.raises(DataError, match=r"val\.de\.gz .*checksum mismatch"):
    builders.download_multi30k(tmp_path / "out", ("de", "en"), url=url, splits=("val",))
  assert not (tmp_path / "out" / "val.de").exists()
  (tmp_path / "mirror" / "val.en.gz").write_bytes(b"not gzip")
  with pytest.raises(DataError, match=r"val\.en\.gz: not a readable gzip file"):
    builders.download_multi30k(tmp_path / "out", ("en",), url=url, splits=("val",))


def test_download_keeps_verified_files_and_fails_offline_with_the_fix(multi30k_raw, tmp_path):
  url = _mirror(multi30k_raw, tmp_path / "mirror", ["val.de", "val.en"])
  files = builders.download_multi30k(tmp_path / "out", ("de", "en"), url=url, splits=("val",))
  assert _lines(pathlib.Path(files["val"]["de"])) == _lines(multi30k_raw / "val.de")
  for gz in (tmp_path / "mirror").iterdir():
    gz.unlink()  # verified files on disk are not fetched again
  builders.download_multi30k(tmp_path / "out", ("de", "en"), url=url, splits=("val",))
  with pytest.raises(DataError, match=r"could not download .*val\.de\.gz.*--manual-dir"):
    builders.download_multi30k(tmp_path / "out2", ("de", "en"), url=url, splits=("val",))


def _parallel(tmp_path, files: dict[str, bytes]) -> DataConfig:
  folder = tmp_path / "corpus"
  folder.mkdir(exist_ok=True)
  for name, data in files.items():
    (folder / name).write_bytes(data)
  return DataConfig(dataset="parallel_text", manual_dir=str(folder),
                    data_dir=str(tmp_path / "tfds"), source_lang="en", target_lang="de")


def test_parallel_text_reads_the_users_files(tmp_path):
  config = _parallel(tmp_path, {"train.en": b"a b\nc d\r\n", "train.de": b"A B\nC D\n",
                                "dev2010.en": b"x\n", "dev2010.de.gz": gzip.compress(b"X"),
                                "notes.txt": b"ignored"})
  builder = builders.prepare_dataset(config)
  assert sorted(builder.info.splits) == ["dev2010", "train"]
  assert builders.load_split(config, "train").__getitems__([0, 1]) == [("a b", "A B"), ("c d", "C D")]
  assert builders.load_split(config, "dev2010")[0] == ("x", "X")


@pytest.mark.parametrize("files, message", [
    ({"train.en": b"a\nb\nc\n", "train.de": b"A\nB\n"},
     r"line counts differ: train\.de has 2, train\.en has 3 lines"),
    ({"train.en": b"", "train.de": b"A\n"}, r"train\.en: the file is empty"),
    ({"train.en": b"a\n\nc\n", "train.de": b"A\nB\nC\n"}, r"train\.en: line 2 is empty.*delete"),
    ({"train.en": b"a\nb\n", "train.de": b"A\n\xfcber\n"},
     r"train\.de: line 2, byte 1: invalid UTF-8.*re-encode"),
    ({"train.en": b"a\n", "train.de": b"A\n", "val.en": b"v\n"},
     r"val\.en has no partner file val\.de"),
])
def test_bad_input_names_the_file_the_line_and_the_fix(tmp_path, files, message):
  config = _parallel(tmp_path, files)
  with pytest.raises(DataError, match=message):
    builders.prepare_dataset(config)


class Seq2seqJaxTinyTranslate(tfds.core.GeneratorBasedBuilder):
  """A small translation dataset built here, in the shape of tfds's wmt*/ted* builders."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(
        languages=("de", "en")))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(40), "validation": self._generate_examples(6)}

  def _generate_examples(self, count):
    for i in range(count):
      yield i, {"de": f"Satz Nummer {i} über Hunde.", "en": f"Sentence number {i} about dogs."}


def test_tfds_name_reads_a_registered_tfds_dataset(tmp_path):
  config = DataConfig(dataset="tfds:seq2seq_jax_tiny_translate", data_dir=str(tmp_path),
                      eval_split="validation")
  builder = builders.prepare_dataset(config)
  assert builder.info.splits["train"].num_examples == 40
  pairs = builders.load_split(config, "validation")
  assert sorted(pairs.__getitems__(list(range(6)))) == sorted(
      (f"Satz Nummer {i} über Hunde.", f"Sentence number {i} about dogs.") for i in range(6))
  wrong = DataConfig(dataset="tfds:seq2seq_jax_tiny_translate", data_dir=str(tmp_path),
                     source_lang="fr", target_lang="en")
  with pytest.raises(DataError, match=r"features \['de', 'en'\], not \['fr'\]"):
    builders.prepare_dataset(wrong)
  with pytest.raises(DataError, match=r"tfds has no dataset 'no_such_dataset'"):
    builders.prepare_dataset(DataConfig(dataset="tfds:no_such_dataset", data_dir=str(tmp_path)))


def test_tfds_name_feeds_the_tokenizer_and_the_pipeline(tmp_path):
  from seq2seq_jax.data import pipeline, tokenizer
  config = DataConfig(dataset="tfds:seq2seq_jax_tiny_translate", data_dir=str(tmp_path),
                      eval_split="validation", vocab_size=40, eval_batch_size=8)
  vocab = tokenizer.train_tokenizer(config)
  batches = list(pipeline.make_eval_batches(config, vocab))
  assert len(batches) == 1 and sorted(batches[0]["index"][:6]) == list(range(6))
  pairs = builders.load_split(config, "validation")
  row = int(batches[0]["index"][0])
  assert vocab.decode(batches[0]["targets"][0]) == pairs[row][1]
