"""The tokenizers of OPUS-MT, M2M100, NLLB, mBART-50, T5 and MADLAD-400 against transformers' own.

Every Multi30k test_2016_flickr sentence (de sources, en targets) plus hand-made
edge cases goes through both; ids and decoded text must be identical.
"""

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from seq2seq_jax.pretrained import fixtures
from seq2seq_jax.pretrained import tokenizers
from tests.pretrained.conftest import add_marian_tokens

transformers = pytest.importorskip("transformers")

# Text that takes the unusual paths: special tokens inside text, whitespace runs,
# empty input, characters sentencepiece normalises or does not know, language codes.
EDGE_CASES = [
    "", " ", "   zwei   Leerzeichen  ", "„Anführungszeichen“ – Gedankenstrich … ½",
    "Ein </s> Hund <pad>x<unk>", "<s>Start</s>", ">>fr<< Ein Hund.", "x>>fr<<y", ">>xx<< hm",
    "__en__ Hund", "eng_Latn Hund", "漢字 und Emoji 🙂", "TAB\tund\nZeilenumbruch",
    "x de_DE y", "en_XX", "a <mask>b", "Ende ", " ", "<extra_id_0> Hund <extra_id_99>",
    "<2en> Hund", "x<2de>y", "<2zz> Hund",
]

# (fixture, model_type, source language, target language) of each checkpoint layout.
LAYOUTS = {
    "marian": ("marian_dir", "marian", None, None),
    "marian_separate": ("marian_separate_dir", "marian", None, None),
    "m2m100": ("m2m100_dir", "m2m_100", "de", "en"),
    "nllb": ("nllb_dir", "m2m_100", "deu_Latn", "eng_Latn"),
    "mbart50": ("mbart50_dir", "mbart", "de_DE", "en_XX"),
    "t5": ("t5_dir", "t5", None, None),
    "madlad": ("madlad_dir", "t5", None, None),
}
# Layouts whose generated rows start with the decoder start EOS (transformers returns it).
STARTS_WITH_EOS = ("m2m100", "nllb", "mbart50")


def _read(raw: pathlib.Path, name: str) -> list[str]:
  return (raw / name).read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def corpus(multi30k_raw):
  sources = _read(multi30k_raw, "test_2016_flickr.de")
  targets = _read(multi30k_raw, "test_2016_flickr.en")
  assert len(sources) == len(targets) == 1000
  return sources + EDGE_CASES, targets + EDGE_CASES


def _reference(directory, source_lang, target_lang):
  kwargs = {} if source_lang is None else {"src_lang": source_lang, "tgt_lang": target_lang}
  return transformers.AutoTokenizer.from_pretrained(directory, **kwargs)


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request):
  fixture, model_type, source_lang, target_lang = LAYOUTS[request.param]
  directory = request.getfixturevalue(fixture)
  return (request.param, directory, tokenizers.load_tokenizer(directory, model_type),
          _reference(directory, source_lang, target_lang), source_lang, target_lang)


def _assert_same_rows(ours, theirs, texts):
  assert len(ours) == len(theirs)
  wrong = [(text, a, b) for text, a, b in zip(texts, ours, theirs) if a != b]
  assert not wrong, f"{len(wrong)} rows differ, first: {wrong[0]}"


def test_load_tokenizer_picks_the_layout(layout):
  name, _, ours, *_ = layout
  expected = {"marian": tokenizers.MarianTokenizer, "marian_separate": tokenizers.MarianTokenizer,
              "m2m100": tokenizers.M2M100Tokenizer, "nllb": tokenizers.NllbTokenizer,
              "mbart50": tokenizers.MBart50Tokenizer, "t5": tokenizers.T5Tokenizer,
              "madlad": tokenizers.T5Tokenizer}[name]
  assert type(ours) is expected


def test_encode_source_equals_transformers(layout, corpus):
  _, _, ours, reference, source_lang, _ = layout
  sources, _ = corpus
  _assert_same_rows(ours.encode_source(sources, lang=source_lang),
                    reference(sources)["input_ids"], sources)


def test_encode_target_equals_transformers(layout, corpus):
  _, _, ours, reference, _, target_lang = layout
  _, targets = corpus
  _assert_same_rows(ours.encode_target(targets, lang=target_lang),
                    reference(text_target=targets)["input_ids"], targets)


def _cut_at_eos(row, eos_id, start_is_eos):
  begin = 1 if start_is_eos and row[:1] == [eos_id] else 0
  return row[:row.index(eos_id, begin) + 1] if eos_id in row[begin:] else row


def _batch_decode(reference, rows, start_is_eos=False):
  """transformers' text of each row cut at its first EOS (decode_batch stops there)."""
  return reference.batch_decode([_cut_at_eos(row, reference.eos_token_id, start_is_eos)
                                 for row in rows], skip_special_tokens=True)


def test_decode_batch_equals_batch_decode(layout, corpus):
  name, _, ours, reference, _, target_lang = layout
  _, targets = corpus
  rows = reference(text_target=targets)["input_ids"]
  pad = reference.pad_token_id
  if name in STARTS_WITH_EOS:
    # As generate returns them: the decoder start (EOS) first, padding after EOS.
    rows = [[reference.eos_token_id, *row] for row in rows]
  padded = [row + [pad] * (i % 4) for i, row in enumerate(rows)]
  expected = _batch_decode(reference, padded, start_is_eos=name in STARTS_WITH_EOS)
  _assert_same_rows(ours.decode_batch(padded), expected, targets)
  # Texts without special tokens come back (up to sentencepiece's normalisation).
  assert ours.decode_batch(rows[:3]) == [" ".join(text.split()) for text in targets[:3]]


def test_decode_batch_of_random_ids_equals_batch_decode(layout):
  """Any id, special or not, in any order: what a barely trained model may emit."""
  name, _, ours, reference, *_ = layout
  rng = np.random.default_rng(0)
  # M2M100's vocab_size also counts the 8 made-up words, ids transformers decodes as <unk>.
  rows = [rng.integers(0, ours.vocab_size, size=rng.integers(1, 30)).tolist() for _ in range(300)]
  expected = _batch_decode(reference, rows, start_is_eos=name in STARTS_WITH_EOS)
  _assert_same_rows(ours.decode_batch(rows), expected, rows)


def test_special_ids_and_sizes_match_the_checkpoint(layout):
  _, directory, ours, reference, *_ = layout
  config = json.loads((directory / "config.json").read_text())
  assert (ours.pad_id, ours.eos_id, ours.unk_id) == (
      reference.pad_token_id, reference.eos_token_id, reference.unk_token_id)
  assert ours.pad_id == config["pad_token_id"] and ours.eos_id == config["eos_token_id"]
  # M2M100's vocab_size also counts the made-up words, which transformers' len leaves out.
  assert ours.vocab_size == len(reference) + getattr(reference, "num_madeup_words", 0)
  if config["model_type"] == "t5":  # the embedding may have more rows (t5-small: 32,128)
    assert ours.vocab_size <= config["vocab_size"]
  else:
    assert ours.vocab_size == (config.get("decoder_vocab_size") or config["vocab_size"])
    assert ours.source_vocab_size == config["vocab_size"]


def test_dict_round_trip_behaves_the_same(layout, corpus):
  _, _, ours, _, source_lang, target_lang = layout
  sources, targets = corpus
  restored = tokenizers.tokenizer_from_dict(json.loads(json.dumps(ours.to_dict())))
  assert type(restored) is type(ours)
  assert restored.encode_source(sources, source_lang) == ours.encode_source(sources, source_lang)
  target_ids = ours.encode_target(targets, target_lang)
  assert restored.encode_target(targets, target_lang) == target_ids
  assert restored.decode_batch(target_ids) == ours.decode_batch(target_ids)
  assert (restored.languages, restored.vocab_size) == (ours.languages, ours.vocab_size)


def test_saved_directory_loads_in_transformers_with_the_same_ids(layout, corpus, tmp_path):
  _, _, ours, reference, source_lang, target_lang = layout
  sources, targets = corpus
  ours.save(tmp_path)
  theirs = _reference(tmp_path, source_lang, target_lang)
  assert type(theirs) is type(reference)
  assert theirs(sources)["input_ids"] == reference(sources)["input_ids"]
  assert theirs(text_target=targets)["input_ids"] == reference(text_target=targets)["input_ids"]


# ---------------------------------------------------------------------------------------------
# Languages


def _marian_with_codes(marian_dir, tmp_path, codes) -> pathlib.Path:
  """The test tokenizer with ``>>xx<<`` tokens before <pad>, as multilingual OPUS-MT has them."""
  directory = tmp_path / "marian-multi"
  directory.mkdir()
  for name in ("source.spm", "target.spm", "tokenizer_config.json", "vocab.json"):
    shutil.copy(marian_dir / name, directory / name)
  add_marian_tokens(directory, [f">>{code}<<" for code in codes])
  return directory


def test_marian_language_code_prefix(marian_dir, tmp_path, corpus):
  directory = _marian_with_codes(marian_dir, tmp_path, ["fr", "es"])
  ours = tokenizers.MarianTokenizer.from_directory(directory)
  reference = transformers.MarianTokenizer.from_pretrained(directory)
  assert ours.languages == ("fr", "es")
  sources = corpus[0][:200]
  assert ours.encode_source(sources, lang="es") == reference(
      [f">>es<< {text}" for text in sources])["input_ids"]
  first = ours.encode_source(sources[:1], lang="es")[0][0]
  assert first == reference.convert_tokens_to_ids(">>es<<")
  assert ours.target_prefix("fr") == []
  with pytest.raises(ValueError, match=r"'de'.*fr, es"):
    ours.encode_source(sources, lang="de")


def test_marian_target_lang_is_its_source_code(marian_dir, tmp_path, corpus):
  directory = _marian_with_codes(marian_dir, tmp_path, ["fr", "es"])
  ours = tokenizers.MarianTokenizer.from_directory(directory)
  sources = corpus[0][:50]
  by_target = ours.encode_source(sources, "de", target_lang="es")  # a source lang is ignored
  assert by_target == ours.encode_source(sources, lang="es")


def test_madlad_target_code_goes_in_front_of_the_source(madlad_dir, corpus):
  ours = tokenizers.load_tokenizer(madlad_dir, "t5")
  reference = _reference(madlad_dir, None, None)
  assert ours.languages == ("de", "en")
  sources = corpus[0]
  for lang in ours.languages:
    rows = ours.encode_source(sources, target_lang=lang)
    assert rows == reference([f"<2{lang}> {text}" for text in sources])["input_ids"]
    assert {row[0] for row in rows} == {reference.convert_tokens_to_ids(f"<2{lang}>")}
  assert ours.target_prefix("en") == []
  with pytest.raises(ValueError, match=r"unknown language 'fr'.*knows: de, en"):
    ours.encode_source(sources[:1], target_lang="fr")


@pytest.mark.parametrize("name", ["t5", "madlad", "mbart50"])
def test_without_tokenizer_json_sentencepiece_runs_the_model_file(name, request, corpus,
                                                                  tmp_path):
  """A directory without tokenizer.json (published mBART-50 has none): sentencepiece
  runs the model file. Its ids are transformers' on Multi30k and, for T5, on every edge
  case (special tokens written in the text included); mBART-50's differ only where
  transformers 5 keeps a trailing space or a run of spaces as a piece of its own."""
  fixture, model_type, source_lang, target_lang = LAYOUTS[name]
  copy = tmp_path / "no-json"
  shutil.copytree(request.getfixturevalue(fixture), copy)
  (copy / "tokenizer.json").unlink()
  ours = tokenizers.load_tokenizer(copy, model_type)
  assert "tokenizer_json" not in ours.to_dict()
  reference = _reference(request.getfixturevalue(fixture), source_lang, target_lang)
  sources, targets = corpus
  count = 1000 if name == "mbart50" else len(sources)
  _assert_same_rows(ours.encode_source(sources[:count], lang=source_lang),
                    reference(sources[:count])["input_ids"], sources[:count])
  _assert_same_rows(ours.encode_target(targets[:count], lang=target_lang),
                    reference(text_target=targets[:count])["input_ids"], targets[:count])
  if name == "mbart50":
    assert ours.encode_source(["Ende "], lang=source_lang) != reference(["Ende "])["input_ids"]


def test_t5_without_codes_rejects_a_language(t5_dir):
  ours = tokenizers.load_tokenizer(t5_dir, "t5")
  assert ours.languages == () and ours.target_prefix() == []
  with pytest.raises(ValueError, match="knows: none"):
    ours.encode_source(["Ein Hund."], target_lang="en")


def test_mbart50_codes_and_language_errors(mbart50_dir):
  ours = tokenizers.load_tokenizer(mbart50_dir, "mbart")
  reference = _reference(mbart50_dir, "de_DE", "en_XX")
  assert len(ours.languages) == 52 and ours.languages[:4] == ("ar_AR", "cs_CZ", "de_DE", "en_XX")
  assert [ours.target_prefix(code)[0] for code in ours.languages] == [
      reference.convert_tokens_to_ids(code) for code in ours.languages]
  assert ours.encode_source(["Hund"]) == ours.encode_source(["Hund"], "de_DE")  # config default
  with pytest.raises(ValueError, match=r"unknown language 'de'.*knows: ar_AR"):
    ours.encode_source(["Hund"], "de")


def test_bilingual_marian_rejects_a_language(marian_dir):
  ours = tokenizers.load_tokenizer(marian_dir, "marian")
  assert ours.languages == () and ours.target_prefix() == []
  with pytest.raises(ValueError, match="knows: none"):
    ours.encode_source(["Ein Hund."], lang="fr")


@pytest.mark.parametrize("name", ["m2m100", "nllb"])
def test_multilingual_prefix_and_language_errors(name, request):
  fixture, model_type, source_lang, target_lang = LAYOUTS[name]
  directory = request.getfixturevalue(fixture)
  ours = tokenizers.load_tokenizer(directory, model_type)
  reference = _reference(directory, source_lang, target_lang)
  assert source_lang in ours.languages and target_lang in ours.languages
  assert len(ours.languages) == {"m2m100": 100, "nllb": 202}[name]
  assert ours.target_prefix(target_lang) == [reference.convert_tokens_to_ids(
      f"__{target_lang}__" if name == "m2m100" else target_lang)]
  with pytest.raises(ValueError, match=r"unknown language 'xx_Yyyy'.*knows: .*" + target_lang):
    ours.target_prefix("xx_Yyyy")
  with pytest.raises(ValueError, match="unknown language 'xx_Yyyy'"):
    ours.encode_source(["Ein Hund."], lang="xx_Yyyy")


def test_m2m100_language_defaults_come_from_tokenizer_config(m2m100_dir, tmp_path):
  with_defaults = tokenizers.load_tokenizer(m2m100_dir, "m2m_100")
  assert with_defaults.encode_source(["Hund"]) == with_defaults.encode_source(["Hund"], "de")
  assert with_defaults.target_prefix() == with_defaults.target_prefix("en")
  directory = _edited_copy(m2m100_dir, tmp_path, "tokenizer_config.json",
                           lambda config: {**config, "src_lang": None, "tgt_lang": None})
  without = tokenizers.load_tokenizer(directory, "m2m_100")
  with pytest.raises(ValueError, match=r"pass the target language.*knows: af, am"):
    without.target_prefix()
  with pytest.raises(ValueError, match="pass the source language"):
    without.encode_source(["Hund"])


def test_m2m100_language_tokens_that_are_not_special(m2m100_dir, tmp_path, corpus):
  """Without extra_special_tokens transformers 5 keeps __en__ in decoded text; so do we."""
  def drop_language_specials(config):
    config = {**config, "extra_special_tokens": []}
    config["added_tokens_decoder"] = {k: v for k, v in config["added_tokens_decoder"].items()
                                      if not v["content"].startswith("__")}
    return config
  directory = _edited_copy(m2m100_dir, tmp_path, "tokenizer_config.json", drop_language_specials)
  assert _m2m100_first_decoded(directory, corpus).startswith("__en__ ")


def test_m2m100_legacy_special_tokens_map(m2m100_dir, tmp_path, corpus):
  """Files from before transformers 4.34: special tokens in special_tokens_map.json."""
  config = json.loads((m2m100_dir / "tokenizer_config.json").read_text())
  languages = config.pop("extra_special_tokens")
  del config["added_tokens_decoder"]
  directory = tmp_path / "legacy"
  directory.mkdir()
  for name in ("vocab.json", "sentencepiece.bpe.model"):
    shutil.copy(m2m100_dir / name, directory / name)
  (directory / "tokenizer_config.json").write_text(json.dumps(config))
  (directory / "special_tokens_map.json").write_text(json.dumps(
      {"eos_token": "</s>", "additional_special_tokens": languages}))
  assert not _m2m100_first_decoded(directory, corpus).startswith("__en__")


def _m2m100_first_decoded(directory, corpus) -> str:
  """Our M2M100 tokenizer of ``directory`` against transformers' (source ids, the text of
  target rows); returns the first target decoded."""
  ours = tokenizers.load_tokenizer(directory, "m2m_100")
  reference = _reference(directory, "de", "en")
  sources, targets = corpus
  assert ours.encode_source(sources, "de") == reference(sources)["input_ids"]
  rows = reference(text_target=targets)["input_ids"]
  _assert_same_rows(ours.decode_batch(rows), _batch_decode(reference, rows), targets)
  return ours.decode_batch(rows[:1])[0]


# ---------------------------------------------------------------------------------------------
# Bad input


def _edited_copy(source: pathlib.Path, tmp_path, name: str, edit) -> pathlib.Path:
  directory = tmp_path / f"edited-{source.name}"
  shutil.copytree(source, directory)
  path = directory / name
  path.write_text(json.dumps(edit(json.loads(path.read_text()))))
  return directory


@pytest.mark.parametrize("layout_name, missing", [
    ("marian", "vocab.json"), ("marian", "source.spm"), ("marian", "target.spm"),
    ("marian", "tokenizer_config.json"), ("marian_separate", "target_vocab.json"),
    ("m2m100", "sentencepiece.bpe.model"), ("m2m100", "vocab.json"), ("nllb", "tokenizer.json"),
    ("mbart50", "sentencepiece.bpe.model"), ("t5", "spiece.model"),
])
def test_missing_file_is_named(layout_name, missing, request, tmp_path):
  fixture, model_type, *_ = LAYOUTS[layout_name]
  directory = tmp_path / "copy"
  shutil.copytree(request.getfixturevalue(fixture), directory)
  (directory / missing).unlink()
  with pytest.raises(ValueError, match=rf"{missing} is missing: .*(save|ship)"):
    tokenizers.load_tokenizer(directory, model_type)


def _broken(source: pathlib.Path, tmp_path, name: str, content) -> pathlib.Path:
  directory = tmp_path / f"broken-{name}-{len(list(tmp_path.iterdir()))}"
  shutil.copytree(source, directory)
  path = directory / name
  path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
  return directory


def test_malformed_files_are_named(marian_dir, m2m100_dir, tmp_path):
  vocab = json.loads((marian_dir / "vocab.json").read_text())
  del vocab["<unk>"]
  cases = [
      ("vocab.json", "{not json", "vocab.json is not valid JSON"),
      ("vocab.json", json.dumps(["a", "list"]), "vocab.json must map each piece"),
      ("vocab.json", json.dumps(vocab), "vocab.json lacks the unknown token '<unk>'"),
      ("source.spm", b"not a model", "source.spm is not a sentencepiece model"),
      ("tokenizer_config.json", "[]", "tokenizer_config.json must hold a JSON object"),
  ]
  for name, content, message in cases:
    with pytest.raises(ValueError, match=message):
      tokenizers.load_tokenizer(_broken(marian_dir, tmp_path, name, content), "marian")
  config = json.loads((m2m100_dir / "tokenizer_config.json").read_text())
  copy = _broken(m2m100_dir, tmp_path, "tokenizer_config.json",
                 json.dumps({**config, "language_codes": "m2m999"}))
  with pytest.raises(ValueError, match="language_codes='m2m999' is unknown"):
    tokenizers.load_tokenizer(copy, "m2m_100")


def test_bad_dicts_and_model_types():
  with pytest.raises(ValueError, match="kind None; expected one of"):
    tokenizers.tokenizer_from_dict({"vocab": {}})
  with pytest.raises(ValueError, match="lacks 'vocab'"):
    tokenizers.tokenizer_from_dict({"kind": "m2m_100", "spm_model": "", "config": {}})
  with pytest.raises(ValueError, match="model_type='bart' has no tokenizer"):
    tokenizers.load_tokenizer(".", "bart")


# ---------------------------------------------------------------------------------------------
# The modules themselves


def test_modules_import_without_torch_and_transformers():
  code = ("import sys\n"
          "for name in ('torch', 'transformers', 'tokenizers'): sys.modules[name] = None\n"
          "import seq2seq_jax.pretrained.tokenizers, seq2seq_jax.pretrained.fixtures\n")
  subprocess.run([sys.executable, "-W", "error", "-c", code], check=True, timeout=120)


def test_builds_are_deterministic(multi30k_raw, tmp_path):
  infos = [fixtures.build_marian(tmp_path / name, data_dir=multi30k_raw, steps=3, max_pairs=500,
                                 vocab_size=200)
           for name in ("first", "second")]
  assert all(info.steps == 3 and np.isfinite(info.final_loss) for info in infos)
  for name in ("model.safetensors", "vocab.json", "source.spm", "target.spm", "config.json",
               "generation_config.json"):
    assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name).read_bytes()
