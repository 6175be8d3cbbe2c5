"""The fixed position tables of published checkpoints against the formulas' own code."""

import numpy as np
import pytest

from seq2seq_jax.layers.embeddings import position_table, sinusoidal_table


def test_interleaved_table_is_the_2017_formula_in_float64():
  table = position_table("sinusoidal", 50, 16)
  p, i = np.arange(50)[:, None], np.arange(8)[None, :]
  angle = p / 10000.0 ** (2 * i / 16)
  np.testing.assert_allclose(table[:, 0::2], np.sin(angle), atol=1e-7)
  np.testing.assert_allclose(table[:, 1::2], np.cos(angle), atol=1e-7)
  np.testing.assert_array_equal(table, sinusoidal_table(50, 16))


def test_marian_table_equals_transformers():
  torch = pytest.importorskip("torch")
  marian = pytest.importorskip("transformers.models.marian.modeling_marian")
  module = marian.MarianSinusoidalPositionalEmbedding(128, 32)
  expected = module.create_weight().numpy() if hasattr(module, "create_weight") else None
  assert expected is not None, "transformers' Marian position module changed"
  np.testing.assert_allclose(position_table("sinusoidal_marian", 128, 32), expected, atol=1e-6)
  del torch


@pytest.mark.parametrize("pad_id,dim,length,atol", [
    (1, 64, 300, 1e-7), (0, 64, 300, 1e-7),
    # NLLB's width: PyTorch's float32 exp is an ulp off ours for a few frequencies,
    # which position 1000 turns into 1.5e-5.
    (1, 1024, 1024, 2e-5)])
def test_fairseq_table_with_offset_equals_m2m100(pad_id, dim, length, atol):
  pytest.importorskip("torch")
  m2m = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
  full = m2m.M2M100SinusoidalPositionalEmbedding.get_embedding(length + pad_id + 1, dim,
                                                                 pad_id).numpy()
  ours = position_table("sinusoidal_fairseq", length, dim, offset=pad_id + 1)
  np.testing.assert_allclose(ours, full[pad_id + 1:], atol=atol, rtol=0)


def test_unknown_kind_and_odd_width_raise():
  with pytest.raises(ValueError, match="kind='rotary'"):
    position_table("rotary", 4, 8)
  with pytest.raises(ValueError, match="even width"):
    position_table("sinusoidal_marian", 4, 7)
