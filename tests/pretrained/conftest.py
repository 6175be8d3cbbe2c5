"""Small Hugging Face checkpoints (OPUS-MT, M2M100, NLLB, mBART-50, T5, mT5, MADLAD layouts),
built once per test session.

Under pytest-xdist the workers share one build directory beside their own temp
directories; a file lock per checkpoint makes one worker build it. tests/docs borrows
them (``_checkpoint``) under the names of the published checkpoints they stand in for.
"""

import functools
import json
import os
import pathlib
import shutil
from collections.abc import Sequence

import filelock
import pytest

from seq2seq_jax.pretrained import fixtures


def _multi30k_raw(request) -> pathlib.Path:
  # tests/conftest.py's shared_data: skips locally, fails under CI when the data is missing.
  shared_data = next(plugin.shared_data for plugin in request.config.pluginmanager.get_plugins()
                     if callable(getattr(plugin, "shared_data", None)))
  return shared_data("multi30k", "raw")


# Small (d 64), a 500-piece vocabulary per sentencepiece model, no dropout, a few hundred
# steps of batch 32: about 20 s a checkpoint on one core, and outputs that end and follow
# their sources (tests/pretrained/test_models.py checks it). The small vocabulary is what
# makes so short a training enough: with 1,000 pieces a side, Marian's greedy outputs were
# a handful of sentences for any source after 400 steps, and needed a model twice as wide
# trained 1,000 steps of batch 64 (8 minutes).
_SMALL = dict(steps=400, model_dim=64, batch_size=32, learning_rate=5e-3, dropout=0.0,
              vocab_size=500)

# name -> build(out_dir, data_dir=...): every checkpoint a test here may ask for.
_CHECKPOINTS = {
    # The two the decoding-control, command-line and docs tests translate with: 600 steps.
    "marian-de-en": functools.partial(fixtures.build_marian, **{**_SMALL, "steps": 600}),
    "m2m100-de-en": functools.partial(fixtures.build_m2m100, **{**_SMALL, "steps": 600}),
    # Only its tokenizer files are read: the weights stay random.
    "marian-separate-de-en": functools.partial(fixtures.build_marian, separate_vocabs=True,
                                               steps=0, vocab_size=500),
    "nllb-de-en": functools.partial(fixtures.build_nllb, **_SMALL),
    # Marian (post-LN) at 5e-3 needs 600 steps to follow its sources (at 400, one output in
    # ten differed from another); at 3e-3, 400 steps suffice.
    "marian-asymmetric-de-en": functools.partial(
        fixtures.build_marian, **{**_SMALL, "learning_rate": 3e-3}, layers=2, decoder_layers=3,
        ffn=128, decoder_ffn=96, heads=4, decoder_heads=2),
    "mbart50-de-en": functools.partial(fixtures.build_mbart50, **_SMALL),
    "t5-de-en": functools.partial(fixtures.build_t5, variant="t5", **_SMALL),
    "t5-v1_1-de-en": functools.partial(fixtures.build_t5, variant="t5_v1_1", **_SMALL),
    "mt5-de-en": functools.partial(fixtures.build_t5, variant="mt5", **_SMALL),
    "madlad-de-en": functools.partial(fixtures.build_t5, variant="madlad",
                                      directions=(("de", "en"), ("en", "de")), **_SMALL),
}


def _build_root(tmp_path_factory) -> pathlib.Path:
  base = tmp_path_factory.getbasetemp()
  # xdist workers have their own basetemp; its parent belongs to this test run.
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _ensure(root: pathlib.Path, name: str, data: pathlib.Path, *, wait: bool) -> bool:
  """Builds ``root/name`` unless built; False when another worker holds it and not ``wait``."""
  lock = filelock.FileLock(str(root / f"{name}.lock"))
  try:
    lock.acquire(timeout=-1 if wait else 0)
  except filelock.Timeout:
    return False
  try:
    if not (root / name / "build_info.json").is_file():
      partial = root / f"{name}.partial"
      shutil.rmtree(partial, ignore_errors=True)
      _CHECKPOINTS[name](partial, data_dir=data)
      partial.rename(root / name)
  finally:
    lock.release()
  return True


def _checkpoint(request, tmp_path_factory, name: str) -> pathlib.Path:
  """The checkpoint ``name``, built once per test run whichever worker asks first.

  A worker that finds another building it builds a different missing one meanwhile,
  so two workers build two checkpoints at a time instead of one waiting idle.
  """
  data = _multi30k_raw(request)
  root = _build_root(tmp_path_factory)
  if not _ensure(root, name, data, wait=False):
    for other in _CHECKPOINTS:
      if (other != name and not (root / other / "build_info.json").is_file()
          and _ensure(root, other, data, wait=False)):
        break
    _ensure(root, name, data, wait=True)
  return root / name


def _checkpoint_fixture(name: str, doc: str):
  """A session fixture giving the directory of checkpoint ``name`` (``doc`` describes it)."""
  def checkpoint_dir(request, tmp_path_factory) -> pathlib.Path:
    return _checkpoint(request, tmp_path_factory, name)
  checkpoint_dir.__doc__ = doc
  return pytest.fixture(scope="session")(checkpoint_dir)


marian_dir = _checkpoint_fixture(
    "marian-de-en", "OPUS-MT layout, shared vocabulary: de -> en, 2 + 2 layers of width 64, "
    "600 steps.")
marian_separate_dir = _checkpoint_fixture(
    "marian-separate-de-en", "OPUS-MT layout with separate source and target vocabularies "
    "(untied embeddings); random weights (for its tokenizer files).")
m2m100_dir = _checkpoint_fixture(
    "m2m100-de-en", "M2M100 layout: de -> en, language tokens as special tokens, 600 steps.")
nllb_dir = _checkpoint_fixture(
    "nllb-de-en", "NLLB-200 layout (tokenizer.json): deu_Latn -> eng_Latn, 400 steps.")
marian_asymmetric_dir = _checkpoint_fixture(
    "marian-asymmetric-de-en", "OPUS-MT layout with encoder and decoder apart: 2 + 3 layers, "
    "FFN 128 / 96, heads 4 / 2.")
mbart50_dir = _checkpoint_fixture(
    "mbart50-de-en", "mBART-50 layout: de_DE -> en_XX, sentencepiece.bpe.model, 400 steps at "
    "width 64.")
t5_dir = _checkpoint_fixture(
    "t5-de-en", "Original T5 layout: ReLU, tied output with the d_model ** -0.5 rescale, 100 "
    "sentinels.")
t5_v1_1_dir = _checkpoint_fixture(
    "t5-v1_1-de-en", "T5 v1.1 / flan-T5 layout: gated GELU, a separate lm_head.")
mt5_dir = _checkpoint_fixture(
    "mt5-de-en", "mT5 layout (MT5ForConditionalGeneration): gated GELU, a separate lm_head.")
madlad_dir = _checkpoint_fixture(
    "madlad-de-en", "MADLAD-400 layout: v1.1's model, de <-> en with <2xx> target tokens in "
    "the sources.")


def transformers_pair(directory: pathlib.Path, family: str, source_lang: str | None = None,
                      target_lang: str | None = None):
  """transformers' model (eval mode) and tokenizer of a checkpoint directory; a family that
  marks languages in the tokenizer (M2M100, NLLB, mBART-50) set to translate
  ``source_lang`` -> ``target_lang``."""
  import transformers  # noqa: PLC0415
  hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  if source_lang is not None and hasattr(hf_tokenizer, "src_lang"):
    hf_tokenizer.src_lang, hf_tokenizer.tgt_lang = source_lang, target_lang
  return hf_model, hf_tokenizer


def add_marian_tokens(directory: pathlib.Path, tokens: Sequence[str]) -> None:
  """Adds ``tokens`` to the vocab.json of a Marian checkpoint directory, in place, before
  <pad> (which stays the last id, its added_tokens_decoder entry moved along), as
  multilingual OPUS-MT models list their ``>>xx<<`` codes."""
  vocab = json.loads((directory / "vocab.json").read_text())
  pad = vocab.pop("<pad>")
  for token in tokens:
    vocab[token] = len(vocab)
  vocab["<pad>"] = len(vocab)
  (directory / "vocab.json").write_text(json.dumps(vocab))
  config = json.loads((directory / "tokenizer_config.json").read_text())
  config["added_tokens_decoder"][str(len(vocab) - 1)] = config["added_tokens_decoder"].pop(str(pad))
  (directory / "tokenizer_config.json").write_text(json.dumps(config))
