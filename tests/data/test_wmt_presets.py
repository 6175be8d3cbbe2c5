"""The WMT'14 presets' data path, on a small local copy: nothing downloads here.

tfds keeps a prepared dataset under ``data_dir/NAME/CONFIG/VERSION``. A builder of
the same name, config and version as tfds's own ``wmt14_translate/de-en``, fed with
multi30k_tiny's lines, writes such a copy; the presets then read it through
``tfds:wmt14_translate/de-en`` exactly as they would read the real corpus after tfds
downloaded it: tfds's own builder finds the prepared files and does not download.
"""

import json

import pytest
import tensorflow_datasets as tfds

from seq2seq_jax import presets
from seq2seq_jax.data import builders, pipeline, text_files, tokenizer
from seq2seq_jax.training import loop


def _lines(directory, split, lang):
  path = text_files.split_files(directory, [lang])[split][lang]
  return text_files.decode_lines(text_files.read_bytes(path), str(path))


def _write_local_wmt14(multi30k_tiny, data_dir) -> None:
  splits = {name: list(zip(_lines(multi30k_tiny, source, "de"), _lines(multi30k_tiny, source, "en")))
            for name, source in (("train", "train"), ("validation", "val"),
                                 ("test", "test_2016_flickr"))}

  with tfds.core.registered.skip_registration():
    class LocalWmt14(tfds.core.GeneratorBasedBuilder):
      """A prepared copy in the place and layout of tfds's wmt14_translate/de-en."""

      name = "wmt14_translate"
      VERSION = tfds.core.Version("1.0.0")
      BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="de-en", version="1.0.0")]

      def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(
            languages=("de", "en")), disable_shuffling=True)

      def _split_generators(self, dl_manager):
        return {name: self._generate_examples(pairs) for name, pairs in splits.items()}

      def _generate_examples(self, pairs):
        for i, (de, en) in enumerate(pairs):
          yield i, {"de": de, "en": en}

  LocalWmt14(config="de-en", data_dir=str(data_dir),
             file_format="array_record").download_and_prepare(file_format="array_record")


@pytest.mark.parametrize("name", ["wmt14_transformer_base", "wmt14_transformer_big"])
def test_the_wmt_presets_follow_the_paper(name):
  config = presets.get_preset(name)
  big = name.endswith("big")
  assert config.data.dataset == "tfds:wmt14_translate/de-en"
  assert (config.data.source_lang, config.data.target_lang) == ("en", "de")
  assert config.data.vocab_size == config.model.vocab_size == 32000 and config.model.share_embeddings
  assert (config.model.model_dim, config.model.num_heads, config.model.mlp_dim) == (
      (1024, 16, 4096) if big else (512, 8, 2048))
  assert config.model.num_encoder_layers == config.model.num_decoder_layers == 6
  assert config.model.dropout_rate == (0.3 if big else 0.1)
  assert config.train.num_steps == (300_000 if big else 100_000)
  assert config.train.warmup_steps == 4000 and config.train.schedule == "rsqrt"
  # The paper's lrate = d**-0.5 * min(step**-0.5, step * 4000**-1.5), peaking at step 4000.
  assert config.train.learning_rate == pytest.approx((config.model.model_dim * 4000) ** -0.5)
  assert (config.train.adam_b1, config.train.adam_b2, config.train.adam_eps) == (0.9, 0.98, 1e-9)
  assert config.train.label_smoothing == 0.1 and config.train.compute_dtype == "bfloat16"
  assert config.decode.method == "beam" and config.decode.beam_size == 4
  assert config.decode.alpha == 0.6
  # About 25,000 target tokens a step: 104 packed rows of 256 slots at the assumed fill
  # (aot.report.ASSUMED_PACKING_FILL).
  assert config.data.packing and config.data.batch_tokens == 26624
  assert pipeline.bucket_rows(config.data, config.data.bucket_lengths[-1]) == 104


@pytest.mark.slow
def test_the_wmt_preset_data_path_on_a_local_copy(multi30k_tiny, tmp_path):
  data_dir = tmp_path / "tfds"
  _write_local_wmt14(multi30k_tiny, data_dir)
  config = presets.apply_overrides(presets.get_preset("wmt14_transformer_base"), [
      f"data.data_dir={data_dir}", "data.vocab_size=400", "data.batch_tokens=4096",
      "data.eval_batch_size=16", "model.vocab_size=400", "model.model_dim=32",
      "model.num_heads=2", "model.mlp_dim=64", "model.num_encoder_layers=1",
      "model.num_decoder_layers=1", "train.num_steps=3", "train.warmup_steps=2",
      "train.compute_dtype=float32", "train.eval_every=0", "train.eval_bleu_sentences=8",
      "train.eval_batches=1", "train.log_every=1", "train.checkpoint_every=3"])
  builder = builders.prepare_dataset(config.data)  # tfds's own builder: no download
  assert type(builder).__module__.startswith("tensorflow_datasets")
  assert builder.info.splits["train"].num_examples == 300
  pairs = builders.load_split(config.data, "validation")
  assert pairs.source_lang == "en" and pairs.target_lang == "de"
  assert pairs[0] == (_lines(multi30k_tiny, "val", "en")[0], _lines(multi30k_tiny, "val", "de")[0])
  vocab = tokenizer.train_tokenizer(config.data)
  _, stats = pipeline.make_train_dataset(config.data, vocab, seed=0)
  assert stats.num_pairs == 300 and set(stats.rows_per_bucket) <= set(config.data.bucket_lengths)
  result = loop.train(config, tmp_path / "run", progress=False)
  assert result.step == 3
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert saved["data"]["dataset"] == "tfds:wmt14_translate/de-en"
