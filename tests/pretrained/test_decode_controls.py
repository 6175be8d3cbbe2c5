"""Decoding controls on converted checkpoints against transformers' ``generate`` with the same
options: repetition control, length-penalty form and stopping rule, target prefixes; and the
controls transformers no longer ships (constraints, diverse groups) by their guarantees.

transformers 5.23 moved constrained and group beam search to Hub repositories
(``custom_generate``) this machine cannot reach; benchmarks/RESULTS.md records a
comparison against transformers 4.46.3, which still has them built in.
"""

import dataclasses

import numpy as np
import pytest

from seq2seq_jax import pretrained
from seq2seq_jax.decoding import generate
from seq2seq_jax.text_controls import encode_target_text
from seq2seq_jax.translator import Translator
from tests.conftest import shared_data
from tests.pretrained.conftest import transformers_pair

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TARGET_LANG = {"marian": None, "m2m100": "en"}
SOURCE_LANG = {"marian": None, "m2m100": "de"}
MAX_LENGTH = 48  # transformers' max_length: the decoder start and 47 tokens


def _sources(count):
  raw = shared_data("multi30k", "raw")
  return (raw / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:count]


@pytest.fixture(scope="module", params=["marian", "m2m100"])
def family(request):
  """(name, checkpoint, transformers model, transformers tokenizer)."""
  directory = request.getfixturevalue(f"{request.param}_dir")
  hf_model, hf_tokenizer = transformers_pair(directory, request.param, "de", "en")
  return request.param, pretrained.load(directory), hf_model, hf_tokenizer


def _forced(checkpoint, name):
  prefix = checkpoint.tokenizer.target_prefix(TARGET_LANG[name])
  return {"forced_bos_token_id": prefix[0]} if prefix else {}


def _rows(tokens, eos_id):
  """Each row's tokens up to and including its first EOS."""
  out = []
  for row in (tokens if isinstance(tokens, list) else np.asarray(tokens).tolist()):
    out.append(row[:row.index(eos_id) + 1] if eos_id in row else row)
  return out


# (our DecodeConfig changes, transformers' generate arguments)
OPTIONS = {
    "greedy-ngram2": (dict(method="greedy", no_repeat_ngram_size=2),
                      dict(num_beams=1, no_repeat_ngram_size=2)),
    "greedy-penalty1.5": (dict(method="greedy", repetition_penalty=1.5),
                          dict(num_beams=1, repetition_penalty=1.5)),
    "beam4-power1-early-ngram3": (
        dict(method="beam", beam_size=4, alpha=1.0, length_penalty_form="power",
             early_stopping=True, no_repeat_ngram_size=3),
        dict(num_beams=4, length_penalty=1.0, early_stopping=True, no_repeat_ngram_size=3)),
    "beam4-power0.6-heuristic-penalty1.2": (
        dict(method="beam", beam_size=4, alpha=0.6, length_penalty_form="power",
             early_stopping=False, repetition_penalty=1.2),
        dict(num_beams=4, length_penalty=0.6, early_stopping=False, repetition_penalty=1.2)),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_options_equal_transformers_generate(family, option):
  name, checkpoint, hf_model, hf_tokenizer = family
  ours_changes, theirs_kwargs = OPTIONS[option]
  sources = _sources(32)
  batch = hf_tokenizer(sources, padding=True, return_tensors="pt")
  forced = _forced(checkpoint, name)
  with torch.no_grad():
    theirs = hf_model.generate(**batch, max_length=MAX_LENGTH, **forced, **theirs_kwargs)
    plain = hf_model.generate(**batch, max_length=MAX_LENGTH, **forced,
                              num_beams=theirs_kwargs["num_beams"])
  # The checkpoint's own search settings (suppressed pad, renormalized scores...), as
  # transformers reads them from generation_config.json, with the option on top.
  config = dataclasses.replace(checkpoint.decode_config, max_decode_len=MAX_LENGTH - 1,
                               forced_bos_id=forced.get("forced_bos_token_id"), **ours_changes)
  ours, _ = generate(checkpoint.model, checkpoint.params, np.asarray(batch["input_ids"]), config)
  eos = checkpoint.config.eos_id
  ours_rows, theirs_rows = _rows(ours, eos), _rows(theirs[:, 1:], eos)
  mismatches = [i for i, (a, b) in enumerate(zip(ours_rows, theirs_rows)) if a != b]
  assert not mismatches, [(i, ours_rows[i], theirs_rows[i]) for i in mismatches[:3]]
  # The options change outputs, so equal outputs are not those of the plain search.
  assert _rows(plain[:, 1:], eos) != theirs_rows


PREFIXES = ["A dog", "", "Two men are", "The", "A little girl in a", ""]


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_prefixes_equal_transformers_decoder_input_ids(family, method):
  # transformers continues decoder_input_ids = [start, (language code,) prefix]; each
  # sentence alone, since its prompts cannot have different lengths in one batch.
  name, checkpoint, hf_model, hf_tokenizer = family
  sources = _sources(len(PREFIXES))
  prefix_ids = encode_target_text(checkpoint.tokenizer, PREFIXES, eos_id=checkpoint.config.eos_id,
                                  target_lang=TARGET_LANG[name])
  assert [bool(ids) for ids in prefix_ids] == [bool(p) for p in PREFIXES]
  forced = _forced(checkpoint, name)
  # The language code counts in our length penalty but not in transformers' prompt:
  # compare M2M100 without one.
  alpha = 1.0 if name == "marian" else 0.0
  search = (dict(num_beams=1) if method == "greedy" else
            dict(num_beams=4, length_penalty=alpha, early_stopping=True))
  start = [checkpoint.config.decoder_start_id] + list(forced.values())
  theirs = []
  for source, ids in zip(sources, prefix_ids):
    batch = hf_tokenizer([source], return_tensors="pt")
    prompt = torch.tensor([start + ids])
    with torch.no_grad():
      out = hf_model.generate(**batch, decoder_input_ids=prompt, max_length=MAX_LENGTH,
                              **search)
    theirs.append(out[0, 1:].tolist())
  config = dataclasses.replace(
      checkpoint.decode_config, method=method, beam_size=4, alpha=alpha,
      length_penalty_form="power", early_stopping=True, max_decode_len=MAX_LENGTH - 1,
      forced_bos_id=forced.get("forced_bos_token_id"))
  inputs = hf_tokenizer(sources, padding=True, return_tensors="pt")["input_ids"]
  ours, _ = generate(checkpoint.model, checkpoint.params, np.asarray(inputs), config,
                     target_prefix=prefix_ids)
  eos = checkpoint.config.eos_id
  for i, (a, b) in enumerate(zip(_rows(ours, eos), _rows(theirs, eos))):
    assert a == b, (i, PREFIXES[i], a, b)
    head = list(forced.values()) + prefix_ids[i]
    assert a[:len(head)] == head


def test_constraints_and_diverse_groups_on_a_checkpoint(family):
  name, checkpoint, hf_model, hf_tokenizer = family
  sources = _sources(16)
  translator = Translator.from_pretrained(checkpoint.path)
  langs = dict(source_lang=SOURCE_LANG[name], target_lang=TARGET_LANG[name])
  plain = translator.translate(sources, beam_size=4, **langs)
  phrases = [["outside"], ["two people", "red"]] * 8
  constrained = translator.translate(sources, beam_size=4, constraints=phrases, **langs)
  assert all(all(p in text for p in row) for text, row in zip(constrained, phrases))
  assert sum(a != b for a, b in zip(plain, constrained)) >= 8
  # Diverse groups: the 4 returned hypotheses of a sentence differ more than plain beam's.
  config = dataclasses.replace(checkpoint.decode_config, method="beam", beam_size=4,
                               max_decode_len=MAX_LENGTH - 1,
                               forced_bos_id=_forced(checkpoint, name).get("forced_bos_token_id"))
  inputs = np.asarray(hf_tokenizer(sources, padding=True, return_tensors="pt")["input_ids"])
  distinct = {}
  for groups, diversity in ((1, 0.0), (4, 3.0)):
    tokens, _ = generate(checkpoint.model, checkpoint.params, inputs, dataclasses.replace(
        config, num_beam_groups=groups, diversity_penalty=diversity), n_best=True)
    first_words = [{tuple(hyp[:3]) for hyp in np.asarray(row).tolist()} for row in tokens]
    distinct[groups] = np.mean([len(words) for words in first_words])
  assert distinct[4] > distinct[1], distinct
