"""CPU-only choices reach only programs lowered for the CPU; other platforms get the plain forms.

The branches' results are compared elsewhere (tests/decoding/test_selection.py,
tests/decoding/test_token_rules.py, tests/layers/test_embeddings.py) on this CPU;
here each choice is lowered for cpu, tpu and cuda and the lowered program is
checked for the choice's own marks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax import platforms
from seq2seq_jax.decoding import selection, step
from seq2seq_jax.layers import dropout, embeddings

ROWS, VOCAB, WIDTH = 16, 5000, 8  # 8 <= ROWS <= 32: the vocabulary-major range


def _lowered(fn, *args, platform: str) -> str:
  return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("platform, reduces", [("cpu", 5), ("tpu", 1), ("cuda", 1)])
def test_two_stage_argmax_is_lowered_for_the_cpu_only(platform, reduces):
  text = _lowered(selection.argmax, jnp.zeros((ROWS, VOCAB)), platform=platform)
  assert text.count("stablehlo.reduce") == reduces


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_two_stage_top_k_is_lowered_for_the_cpu_only(platform):
  text = _lowered(lambda x: selection.top_k(x, 8), jnp.zeros((ROWS, 4 * VOCAB)), platform=platform)
  # One-stage: a single TopK over the rows; two-stage: one over the block maxima, one
  # over the candidates.
  assert text.count("top_k") + text.count("TopK") == (2 if platform == "cpu" else 1)


@pytest.mark.parametrize("platform, transposes", [("cpu", 2), ("tpu", 0), ("cuda", 0)])
def test_vocabulary_major_log_softmax_is_lowered_for_the_cpu_only(platform, transposes):
  text = _lowered(step.log_softmax, jnp.zeros((ROWS, VOCAB)), platform=platform)
  assert text.count("stablehlo.transpose") == transposes


@pytest.mark.parametrize("platform, barriers", [("cpu", 1), ("tpu", 0), ("cuda", 0)])
def test_vocabulary_major_logits_are_lowered_for_the_cpu_only(platform, barriers):
  text = _lowered(lambda x, e: embeddings.vocab_logits(x, e), jnp.zeros((ROWS, WIDTH)),
                  jnp.zeros((VOCAB, WIDTH)), platform=platform)
  assert text.count("optimization_barrier") == barriers


@pytest.mark.parametrize("platform, philox", [("cpu", True), ("tpu", False), ("cuda", False)])
def test_philox_dropout_masks_are_lowered_for_the_cpu_only(platform, philox):
  text = _lowered(lambda key: dropout.keep_mask(key, 0.1, (64, 32)), jax.random.key(0),
                  platform=platform)
  assert (str(0xD256D193) in text) == philox  # Philox-2x32's round multiplier


def test_both_branches_give_the_same_results_here():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(ROWS, VOCAB)), jnp.float32)
  np.testing.assert_array_equal(selection._two_stage_argmax(x), selection._one_stage_argmax(x))
  values, indices = selection.top_k(x, 8)
  expected_values, expected_indices = jax.lax.top_k(x, 8)
  np.testing.assert_array_equal(indices, expected_indices)
  np.testing.assert_array_equal(values, expected_values)


def test_on_cpu_runs_the_cpu_branch_on_this_machine():
  assert float(platforms.on_cpu(lambda x: x + 1, lambda x: x - 1, jnp.zeros(()))) == 1.0
  assert platforms.reads_vocab_major(platforms.VOCAB_MAJOR_MIN_ROWS)
  assert not platforms.reads_vocab_major(platforms.VOCAB_MAJOR_MAX_ROWS + 1)


@pytest.mark.parametrize("platform, concatenates", [("cpu", True), ("tpu", False)])
def test_single_row_bfloat16_logits_run_as_two_rows_on_the_cpu_only(platform, concatenates):
  x = jnp.zeros((1, 1, WIDTH), jnp.bfloat16)
  table = jnp.zeros((VOCAB, WIDTH), jnp.bfloat16)
  text = _lowered(lambda x, e: embeddings.vocab_logits(x, e), x, table, platform=platform)
  assert ("stablehlo.concatenate" in text) == concatenates
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(1, 1, WIDTH)), jnp.bfloat16)
  table = jnp.asarray(rng.normal(size=(VOCAB, WIDTH)), jnp.bfloat16)
  np.testing.assert_allclose(embeddings.vocab_logits(x, table), jnp.einsum(
      "BTD,VD->BTV", x, table, preferred_element_type=jnp.float32), rtol=1e-6, atol=1e-5)
  assert platforms.cpu_instruction_set("flags : avx2 amx_tile amx_int8 avx512f") == "amx"
  assert platforms.cpu_instruction_set("flags : avx2 avx512f") == "avx512"
  assert platforms.cpu_instruction_set("avx2") == "avx2"
