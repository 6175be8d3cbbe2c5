"""Small Hugging Face checkpoints (OPUS-MT, M2M100, NLLB, mBART-50, T5, mT5, MADLAD layouts),
built once per test session.

Under pytest-xdist the workers share one build directory beside their own temp
directories; a file lock per checkpoint makes one worker build it.
"""

import os
import pathlib
import shutil

import filelock
import pytest

from seq2seq_jax.pretrained import fixtures


def _multi30k_raw(request) -> pathlib.Path:
  # tests/conftest.py's shared_data: skips locally, fails under CI when the data is missing.
  shared_data = next(plugin.shared_data for plugin in request.config.pluginmanager.get_plugins()
                     if callable(getattr(plugin, "shared_data", None)))
  return shared_data("multi30k", "raw")


_TRAINED = dict(steps=700, model_dim=128, ffn=256, batch_size=64, learning_rate=3e-3,
                max_pairs=29_000)
# Without dropout a short training ends its outputs: d 64, 400 steps, about a minute.
_SMALL = dict(steps=400, model_dim=64, batch_size=32, learning_rate=5e-3, dropout=0.0)

# name -> build(out_dir, data_dir): every checkpoint a test here may ask for.
_CHECKPOINTS = {
    # Trained long enough that greedy outputs follow their sources (a few minutes each).
    "marian-de-en": lambda out, data: fixtures.build_marian(out, data_dir=data,
                                                            **{**_TRAINED, "steps": 1000}),
    "m2m100-de-en": lambda out, data: fixtures.build_m2m100(out, data_dir=data, **_TRAINED),
    # Only their files and shapes matter to the tests: a short training suffices.
    "marian-separate-de-en": lambda out, data: fixtures.build_marian(
        out, data_dir=data, separate_vocabs=True, steps=100),
    "nllb-de-en": lambda out, data: fixtures.build_nllb(out, data_dir=data, steps=100),
    # The families of the [zoo] issue: small (d 64) and trained a few hundred steps, enough
    # for outputs of natural lengths (tests/pretrained/test_models.py checks it).
    "marian-asymmetric-de-en": lambda out, data: fixtures.build_marian(
        out, data_dir=data, **_SMALL, layers=2, decoder_layers=3, ffn=128, decoder_ffn=96,
        heads=4, decoder_heads=2),
    "mbart50-de-en": lambda out, data: fixtures.build_mbart50(out, data_dir=data, **_SMALL),
    "t5-de-en": lambda out, data: fixtures.build_t5(out, data_dir=data, variant="t5", **_SMALL),
    "t5-v1_1-de-en": lambda out, data: fixtures.build_t5(out, data_dir=data, variant="t5_v1_1",
                                                         **_SMALL),
    "mt5-de-en": lambda out, data: fixtures.build_t5(out, data_dir=data, variant="mt5",
                                                     **_SMALL),
    "madlad-de-en": lambda out, data: fixtures.build_t5(
        out, data_dir=data, variant="madlad", directions=(("de", "en"), ("en", "de")),
        **_SMALL),
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
      _CHECKPOINTS[name](partial, data)
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


@pytest.fixture(scope="session")
def marian_dir(request, tmp_path_factory) -> pathlib.Path:
  """OPUS-MT layout, shared vocabulary: de -> en, 2 + 2 layers of width 64, 400 steps."""
  return _checkpoint(request, tmp_path_factory, "marian-de-en")


@pytest.fixture(scope="session")
def marian_separate_dir(request, tmp_path_factory) -> pathlib.Path:
  """OPUS-MT layout with separate source and target vocabularies (untied embeddings);
  trained 100 steps only (outputs are not natural)."""
  return _checkpoint(request, tmp_path_factory, "marian-separate-de-en")


@pytest.fixture(scope="session")
def m2m100_dir(request, tmp_path_factory) -> pathlib.Path:
  """M2M100 layout: de -> en, language tokens as special tokens, 400 steps."""
  return _checkpoint(request, tmp_path_factory, "m2m100-de-en")


@pytest.fixture(scope="session")
def nllb_dir(request, tmp_path_factory) -> pathlib.Path:
  """NLLB-200 layout (tokenizer.json): deu_Latn -> eng_Latn; trained 100 steps only."""
  return _checkpoint(request, tmp_path_factory, "nllb-de-en")


@pytest.fixture(scope="session")
def marian_asymmetric_dir(request, tmp_path_factory) -> pathlib.Path:
  """OPUS-MT layout with encoder and decoder apart: 2 + 3 layers, FFN 128 / 96, heads 4 / 2."""
  return _checkpoint(request, tmp_path_factory, "marian-asymmetric-de-en")


@pytest.fixture(scope="session")
def mbart50_dir(request, tmp_path_factory) -> pathlib.Path:
  """mBART-50 layout: de_DE -> en_XX, sentencepiece.bpe.model, 400 steps at width 64."""
  return _checkpoint(request, tmp_path_factory, "mbart50-de-en")


@pytest.fixture(scope="session")
def t5_dir(request, tmp_path_factory) -> pathlib.Path:
  """Original T5 layout: ReLU, tied output with the d_model ** -0.5 rescale, 100 sentinels."""
  return _checkpoint(request, tmp_path_factory, "t5-de-en")


@pytest.fixture(scope="session")
def t5_v1_1_dir(request, tmp_path_factory) -> pathlib.Path:
  """T5 v1.1 / flan-T5 layout: gated GELU, a separate lm_head."""
  return _checkpoint(request, tmp_path_factory, "t5-v1_1-de-en")


@pytest.fixture(scope="session")
def mt5_dir(request, tmp_path_factory) -> pathlib.Path:
  """mT5 layout (MT5ForConditionalGeneration): gated GELU, a separate lm_head."""
  return _checkpoint(request, tmp_path_factory, "mt5-de-en")


@pytest.fixture(scope="session")
def madlad_dir(request, tmp_path_factory) -> pathlib.Path:
  """MADLAD-400 layout: v1.1's model, de <-> en with <2xx> target tokens in the sources."""
  return _checkpoint(request, tmp_path_factory, "madlad-de-en")
