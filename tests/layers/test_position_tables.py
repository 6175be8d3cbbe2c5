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


@pytest.mark.parametrize("pad_id,dim,length", [(1, 64, 300), (0, 64, 300), (1, 1024, 1024)])
def test_fairseq_table_with_offset_equals_m2m100(pad_id, dim, length):
  torch = pytest.importorskip("torch")
  m2m = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
  full = m2m.M2M100SinusoidalPositionalEmbedding.get_embedding(length + pad_id + 1, dim,
                                                                 pad_id).numpy()[pad_id + 1:]
  ours = position_table("sinusoidal_fairseq", length, dim, offset=pad_id + 1)
  # PyTorch's float32 exp (its inverse frequencies, computed as get_embedding does) is
  # within an ulp of ours, correctly rounded; which frequencies are an ulp off depends on
  # the CPU's vector exp (a few of 512 at NLLB's width). An ulp of a frequency moves
  # position p's angle by p of them, and the float32 angle may then round the other way
  # (one ulp of the angle): the bound, per position and column, plus sin/cos rounding.
  half = dim // 2
  step = np.log(10000.0) / (half - 1)
  theirs_I = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step).numpy()
  ours_I = np.exp((np.arange(half, dtype=np.float32) * np.float32(-step)).astype(np.float64)
                  ).astype(np.float32)
  np.testing.assert_array_max_ulp(theirs_I, ours_I, maxulp=1)
  positions_P1 = np.arange(pad_id + 1, pad_id + 1 + length, dtype=np.float64)[:, None]
  off_I = np.abs(theirs_I - ours_I).astype(np.float64)
  angle_PI = positions_P1.astype(np.float32) * ours_I[None, :]
  bound_PI = np.where(off_I > 0, positions_P1 * off_I + np.spacing(angle_PI), 0.0) + 1e-6
  bound_PD = np.concatenate([bound_PI, bound_PI], axis=1)
  assert np.all(np.abs(ours.astype(np.float64) - full) <= bound_PD), np.max(
      np.abs(ours - full) - bound_PD)
  if dim == 64:  # at this width the frequencies have agreed on every CPU met: float32 rounding
    np.testing.assert_allclose(ours, full, atol=1e-7, rtol=0)


def test_unknown_kind_and_odd_width_raise():
  with pytest.raises(ValueError, match="kind='rotary'"):
    position_table("rotary", 4, 8)
  with pytest.raises(ValueError, match="even width"):
    position_table("sinusoidal_marian", 4, 7)
