"""Fused attention in compiled programs: splash in a TPU training step, cuDNN's in an H100 one.

The TPU step compiles here with libtpu. The H100 step needs jax's CUDA plugin and
cuDNN's wheel, which ``make test-cuda`` installs beside the project and runs these
tests with (``JAX_PLATFORMS=cpu JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1``); in the main run
they skip and say so.
"""

import importlib.util
import re

import pytest

from seq2seq_jax import aot, presets
from seq2seq_jax.aot import hlo as hlo_lib
from seq2seq_jax.aot import programs as programs_lib
from seq2seq_jax.aot import report as report_lib

ROW = 128  # one splash tile


def _packed(implementation, dtype="bfloat16"):
  """The tiny preset with packed rows of 128 a side, heads of 128, bfloat16."""
  return presets.apply_overrides(presets.get_preset("tiny_transformer"), [
      "model.vocab_size=1024", "data.vocab_size=1024", "model.model_dim=256",
      "model.num_heads=2", "model.mlp_dim=512", f"model.max_len={ROW}",
      f"data.max_source_len={ROW}", f"data.max_target_len={ROW}",
      f"data.bucket_lengths=64,{ROW}", "data.batch_tokens=2048", "data.packing=true",
      f"train.compute_dtype={dtype}", f"model.attention_impl={implementation}"])


def _compiled_text(config, target):
  target = aot.parse_target(target)
  mesh = aot.target_mesh(target, 1)
  program = programs_lib.build_program("train", config, mesh)
  with report_lib._not_in_persistent_cache():  # pylint: disable=protected-access
    return program, program.jitted.lower(*program.args).compile().as_text()


def _custom_calls(text):
  return re.findall(r"%([\w.\-]+) = .*?custom-call\(.*?custom_call_target=\"([^\"]+)\"", text)


def test_a_tpu_training_step_with_auto_calls_splash_for_every_attention_layer():
  config = _packed("auto")
  program, text = _compiled_text(config, "v5e-1")
  names = [name for name, target in _custom_calls(text) if target == "tpu_custom_call"]
  kernels = sorted(re.sub(r"_(segmented|residuals|no_residuals|\d+|\.)+", "", name.split(".")[0])
                   for name in names)
  layers = config.model.num_encoder_layers + 2 * config.model.num_decoder_layers
  assert kernels == sorted(["splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"] * layers), names
  costs = hlo_lib.loop_costs(text)
  assert costs.kernel_calls == {"splash attention": 3 * layers}
  # By hand: rows x heads x T x S x K x 2 FLOPs a product; 2 + 3 + 4 products (forward,
  # dq, dk/dv); each attention of one 128-block (the causal one runs its only block).
  model = config.model
  one = 2.0 * program.rows * model.num_heads * ROW * ROW * (model.model_dim // model.num_heads)
  assert costs.kernel_flops == pytest.approx(layers * 9 * one)


def test_the_einsums_call_no_kernel_and_the_report_costs_splash_by_formula():
  _, text = _compiled_text(_packed("einsum"), "v5e-1")
  assert not any("splash" in name for name, _ in _custom_calls(text))
  assert hlo_lib.loop_costs(text).kernel_calls == {}
  report = aot.compile_report(_packed("splash"), "v5e-1", "train")
  assert report.kernel_flops_per_chip > 0 and "by formula" in report.kernels
  assert report.flops_per_chip > report.kernel_flops_per_chip
  assert "splash attention" in aot.format_table([report])


def _splash_line(kind, blocks, queries, keys, *, causal):
  last = f", s32[{queries},128]{{1,0}}" if causal else ""
  return (f"  %splash_mha_{kind}_segmented_residuals.1 = (f32[4,8,{queries},64]) custom-call("
          f"%a, %b, %q, %k, %v), custom_call_target=\"tpu_custom_call\", "
          f"operand_layout_constraints={{s8[1,{blocks},{blocks}]{{2,1,0}}, "
          f"s8[1,{blocks},{blocks}]{{2,1,0}}, bf16[4,8,{queries},64]{{3,2,1,0}}, "
          f"bf16[4,8,{keys},64]{{3,2,1,0}}, bf16[4,8,{keys},64]{{3,2,1,0}}, "
          f"s32[4,{queries},128]{{2,1,0}}{last}}}, frontend_attributes={{kernel_metadata={{")


@pytest.mark.parametrize("kind, products", [("fwd", 2), ("dq", 3), ("dkv", 4)])
def test_kernel_flops_count_the_products_over_the_blocks_that_run(kind, products):
  full = hlo_lib._parse(_splash_line(kind, 2, 256, 512, causal=False))
  assert hlo_lib.kernel_flops(full) == ("splash attention", products * 2.0 * 4 * 8 * 256 * 512 * 64)
  causal = hlo_lib._parse(_splash_line(kind, 4, 512, 512, causal=True))
  # 4 x 4 blocks, the 10 on and below the diagonal run.
  assert hlo_lib.kernel_flops(causal)[1] == pytest.approx(
      products * 2.0 * 4 * 8 * 512 * 512 * 64 * 10 / 16)


def _has_cudnn_compile() -> bool:
  return (importlib.util.find_spec("jax_plugins") is not None
          and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
          and importlib.util.find_spec("nvidia.cudnn") is not None)


cuda = pytest.mark.skipif(not _has_cudnn_compile(), reason=(
    "needs jax's CUDA plugin and cuDNN's wheel: `make test-cuda` runs it (CI does)"))


@cuda
@pytest.mark.parametrize("implementation", ["cudnn", "auto"])
def test_an_h100_training_step_calls_cudnn_flash_attention_packed_rows_included(implementation):
  config = _packed(implementation)
  _, text = _compiled_text(config, "h100")
  targets = [target for _, target in _custom_calls(text)]
  layers = config.model.num_encoder_layers + 2 * config.model.num_decoder_layers
  forward = [t for t in targets if t.startswith("__cudnn$fmha") and "Backward" not in t]
  backward = [t for t in targets if t.startswith("__cudnn$fmha") and "Backward" in t]
  assert len(forward) == layers and len(backward) == layers, targets


@cuda
def test_an_h100_step_in_float32_falls_back_to_the_einsums():
  _, text = _compiled_text(_packed("auto", dtype="float32"), "h100")
  assert not any(target.startswith("__cudnn") for _, target in _custom_calls(text))
