"""Converted checkpoints against transformers itself: logits, greedy text, scores, beams, files.

The checkpoints are small models of every supported layout (MarianMT, also with
encoder and decoder apart; M2M100; NLLB; mBART-50; T5, T5 v1.1, mT5, MADLAD-400)
trained for a few hundred steps on Multi30k by ``seq2seq_jax.pretrained.fixtures``
(see conftest.py), saved with ``save_pretrained``; the reference is the same
directory loaded by transformers.
"""

import dataclasses
import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax import pretrained
from seq2seq_jax.configs import DecodeConfig
from seq2seq_jax.decoding import generate
from seq2seq_jax.translator import Translator
from tests.conftest import shared_data
from tests.pretrained.conftest import transformers_pair

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one checkpoint layout is asked to translate de -> en, here and in transformers."""

  fixture: str
  source_lang: str | None = None  # Translator's source_lang (and transformers' src_lang)
  target_lang: str | None = None  # Translator's target_lang
  hf_prefix: str = ""  # text transformers' tokenizer is given before each source
  forced_code: str | None = None  # the token transformers forces first (forced_bos_token_id)
  greedy_sentences: int | None = None  # test_2016 sentences decoded greedily (None: all 1,000)
  natural: bool = True  # trained long enough for outputs of natural length


LAYOUTS = {
    "marian": Layout("marian_dir"),
    "m2m100": Layout("m2m100_dir", "de", "en", forced_code="__en__"),
    # The briefly trained NLLB checkpoint only checks files and shapes.
    "nllb": Layout("nllb_dir", "deu_Latn", "eng_Latn", forced_code="eng_Latn", natural=False),
    "marian_asymmetric": Layout("marian_asymmetric_dir", greedy_sentences=300),
    "mbart50": Layout("mbart50_dir", "de_DE", "en_XX", forced_code="en_XX",
                      greedy_sentences=300),
    "t5": Layout("t5_dir", greedy_sentences=300),
    "t5_v1_1": Layout("t5_v1_1_dir", greedy_sentences=300),
    "mt5": Layout("mt5_dir", greedy_sentences=300),
    "madlad": Layout("madlad_dir", target_lang="en", hf_prefix="<2en> ", greedy_sentences=300),
}


def _test_sentences(count=None):
  raw = shared_data("multi30k", "raw")
  sources = (raw / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
  references = (raw / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
  return sources[:count], references[:count]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def family(request):
  """(name, layout, directory, transformers model, transformers tokenizer) of one layout."""
  layout = LAYOUTS[request.param]
  directory = request.getfixturevalue(layout.fixture)
  hf_model, hf_tokenizer = transformers_pair(directory, request.param, layout.source_lang,
                                             layout.target_lang)
  return request.param, layout, directory, hf_model, hf_tokenizer


def _hf_batch(hf_tokenizer, layout, sources, references=None):
  sources = [layout.hf_prefix + text for text in sources]
  if references is None:
    return hf_tokenizer(sources, padding=True, return_tensors="pt")
  return hf_tokenizer(sources, text_target=references, padding=True, return_tensors="pt")


def _hf_decoder_inputs(hf_model, labels):
  config = hf_model.config
  start = torch.full((labels.shape[0], 1), config.decoder_start_token_id, dtype=labels.dtype)
  return torch.cat([start, labels[:, :-1]], dim=1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_equal_transformers_on_padded_batches(family, dtype):
  name, layout, directory, hf_model, hf_tokenizer = family
  checkpoint = pretrained.load(directory, dtype=dtype)
  sources, references = _test_sentences(24)
  batch = _hf_batch(hf_tokenizer, layout, sources, references)
  labels = batch["labels"]
  with torch.no_grad():
    expected = hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        decoder_input_ids=_hf_decoder_inputs(hf_model, labels)).logits.numpy()
  inputs = np.asarray(batch["input_ids"])
  targets = np.asarray(labels)
  assert (inputs == checkpoint.config.pad_id).any(), "the batch must be padded"
  logits = np.asarray(checkpoint.model.apply({"params": checkpoint.params}, jnp.asarray(inputs),
                                             jnp.asarray(targets)), np.float32)
  valid = targets != checkpoint.config.pad_id
  difference = np.abs(logits - expected)[valid]
  if dtype == "float32":
    assert difference.max() < 1e-4, difference.max()
  else:
    # bfloat16 compute (8-bit mantissa) against float32 PyTorch: close, same predictions.
    assert np.median(difference) < 0.05, np.median(difference)
    agree = (logits.argmax(-1) == expected.argmax(-1))[valid].mean()
    assert agree > 0.97, agree


def test_greedy_translations_equal_transformers_generate(family):
  name, layout, directory, hf_model, hf_tokenizer = family
  sources, _ = _test_sentences(layout.greedy_sentences)
  max_length = 64
  translator = Translator.from_pretrained(directory, batch_size=64)
  ours = translator.translate(sources, method="greedy", max_decode_len=max_length - 1,
                              source_lang=layout.source_lang, target_lang=layout.target_lang)
  kwargs = {}
  prefix = translator.tokenizer.target_prefix(layout.target_lang)
  if layout.forced_code:
    kwargs["forced_bos_token_id"] = hf_tokenizer.convert_tokens_to_ids(layout.forced_code)
    assert [kwargs["forced_bos_token_id"]] == prefix
  else:
    assert not prefix
  expected = []
  for start in range(0, len(sources), 100):
    batch = _hf_batch(hf_tokenizer, layout, sources[start:start + 100])
    with torch.no_grad():
      out = hf_model.generate(**batch, num_beams=1, do_sample=False, max_length=max_length,
                              **kwargs)
    expected += hf_tokenizer.batch_decode(out, skip_special_tokens=True)
  mismatches = [(i, a, b) for i, (a, b) in enumerate(zip(ours, expected)) if a != b]
  assert not mismatches, mismatches[:5]
  if layout.natural:
    # Real sentences that follow their sources, not runs to the length limit.
    lengths = [len(t.split()) for t in ours]
    assert 5 < np.mean(lengths) < 30, np.mean(lengths)
    assert len(set(ours)) > 0.1 * len(ours), len(set(ours))
    assert np.mean([len(t.split()) >= max_length // 2 for t in ours]) < 0.1


def _hf_sequence_logprobs(hf_model, input_ids, attention_mask, labels, skip):
  """Sum of log p over each row's label tokens (pad excluded), the first ``skip`` left out."""
  pad = hf_model.config.pad_token_id
  with torch.no_grad():
    logits = hf_model(input_ids=input_ids, attention_mask=attention_mask,
                      decoder_input_ids=_hf_decoder_inputs(hf_model, labels)).logits
  logprobs = torch.log_softmax(logits.double(), -1).gather(-1, labels[..., None])[..., 0]
  mask = labels != pad
  mask[:, :skip] = False
  return (logprobs * mask).sum(-1).numpy()


def test_score_equals_transformers_logprobs(family):
  name, layout, directory, hf_model, hf_tokenizer = family
  sources, references = _test_sentences(64)
  translator = Translator.from_pretrained(directory)
  ours = translator.score(sources, references, source_lang=layout.source_lang,
                          target_lang=layout.target_lang)
  batch = _hf_batch(hf_tokenizer, layout, sources, references)
  skip = len(translator.tokenizer.target_prefix(layout.target_lang))
  expected = _hf_sequence_logprobs(hf_model, batch["input_ids"], batch["attention_mask"],
                                   batch["labels"], skip=skip)
  np.testing.assert_allclose(ours, expected, atol=1e-3, rtol=0)
  assert np.all(np.asarray(ours) < 0)


def test_beam4_is_at_least_as_probable_as_transformers_beam(family):
  name, layout, directory, hf_model, hf_tokenizer = family
  sources, _ = _test_sentences(200)
  checkpoint = pretrained.load(directory)
  max_length = 48
  forced = {}
  prefix = checkpoint.tokenizer.target_prefix(layout.target_lang)
  if prefix:
    forced["forced_bos_token_id"] = prefix[0]
  batch = _hf_batch(hf_tokenizer, layout, sources)
  with torch.no_grad():
    theirs = hf_model.generate(**batch, num_beams=4, length_penalty=0.0, early_stopping=True,
                               max_length=max_length, **forced)[:, 1:]
  config = dataclasses.replace(checkpoint.decode_config, method="beam", beam_size=4, alpha=0.0,
                               max_decode_len=max_length - 1,
                               forced_bos_id=prefix[0] if prefix else None)
  ours, _ = generate(checkpoint.model, checkpoint.params, np.asarray(batch["input_ids"]), config)
  ours = torch.tensor(np.asarray(ours))

  def logprobs(labels):
    labels = labels.clone()
    return _hf_sequence_logprobs(hf_model, batch["input_ids"], batch["attention_mask"], labels,
                                 skip=len(prefix))

  ours_lp, theirs_lp = logprobs(ours), logprobs(theirs)
  at_least = np.mean(ours_lp >= theirs_lp - 1e-4)
  assert at_least >= 0.95, (at_least, np.flatnonzero(ours_lp < theirs_lp - 1e-4)[:10])


def test_save_round_trip_loads_in_transformers_with_the_same_logits(family, tmp_path):
  name, layout, directory, hf_model, hf_tokenizer = family
  checkpoint = pretrained.load(directory)
  out = tmp_path / "saved"
  pretrained.save(checkpoint, out)
  reloaded = type(hf_model).from_pretrained(out).eval()
  sources, references = _test_sentences(8)
  batch = _hf_batch(hf_tokenizer, layout, sources, references)
  decoder_inputs = _hf_decoder_inputs(hf_model, batch["labels"])
  with torch.no_grad():
    before = hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      decoder_input_ids=decoder_inputs).logits.numpy()
    after = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     decoder_input_ids=decoder_inputs).logits.numpy()
  np.testing.assert_array_equal(before, after)
  again = pretrained.load(out)
  reloaded_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  if layout.source_lang is not None:
    reloaded_tokenizer.src_lang = layout.source_lang
  assert reloaded_tokenizer(sources)["input_ids"] == hf_tokenizer(sources)["input_ids"]
  assert again.decode_config == checkpoint.decode_config
  assert again.config == checkpoint.config


def test_pytorch_model_bin_loads_without_torch_in_the_loader(family, tmp_path):
  name, _, directory, hf_model, _ = family
  copy = tmp_path / "bin"
  shutil.copytree(directory, copy)
  (copy / "model.safetensors").unlink()
  torch.save(hf_model.state_dict(), copy / "pytorch_model.bin")
  a, b = pretrained.load(directory), pretrained.load(copy)
  for x, y in zip(jax_leaves(a.params), jax_leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def jax_leaves(tree):
  import jax
  return jax.tree_util.tree_leaves(tree)


def test_generation_config_is_honoured(marian_dir):
  checkpoint = pretrained.load(marian_dir)
  generation = json.loads((marian_dir / "generation_config.json").read_text())
  config = checkpoint.decode_config
  assert config.method == ("beam" if generation.get("num_beams", 1) > 1 else "greedy")
  assert config.max_decode_len == generation["max_length"] - 1
  assert config.force_eos_at_limit == (generation.get("forced_eos_token_id") is not None)
  assert set(config.suppress_ids) == {ids[0] for ids in generation.get("bad_words_ids", [])}
  # Marian starts decoding with its pad id; M2M100-style ids are the model's, not 0/1/2.
  assert checkpoint.config.decoder_start_id == checkpoint.config.pad_id != 0


def _broken_copy(directory, tmp_path, edit):
  copy = tmp_path / "broken"
  shutil.copytree(directory, copy)
  edit(copy)
  return copy


def test_directory_without_weights_names_the_files(marian_dir, tmp_path):
  copy = _broken_copy(marian_dir, tmp_path, lambda d: (d / "model.safetensors").unlink())
  with pytest.raises(ValueError, match=r"broken: no weights found; expected one of "
                                       r"model.safetensors"):
    pretrained.load(copy)


def test_unsupported_architecture_names_config_and_field(marian_dir, tmp_path):
  def edit(d):
    config = json.loads((d / "config.json").read_text())
    config["model_type"], config["architectures"] = "bart", ["BartForConditionalGeneration"]
    (d / "config.json").write_text(json.dumps(config))
  copy = _broken_copy(marian_dir, tmp_path, edit)
  with pytest.raises(ValueError, match=r"config.json: model_type='bart' is not supported"):
    pretrained.load(copy)


def test_shape_mismatch_names_the_tensor_and_file(m2m100_dir, tmp_path):
  def edit(d):
    config = json.loads((d / "config.json").read_text())
    config["encoder_ffn_dim"] = config["decoder_ffn_dim"] = config["encoder_ffn_dim"] * 2
    (d / "config.json").write_text(json.dumps(config))
  copy = _broken_copy(m2m100_dir, tmp_path, edit)
  with pytest.raises(ValueError, match=r"model.safetensors: tensor "
                                       r"'model.encoder.layers.0.fc1.weight' has shape"):
    pretrained.load(copy)
