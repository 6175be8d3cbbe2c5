"""Every program of a run, compiled in the order the run traces them, in one process.

A kernel's state carried from one trace into the next (the splash kernel's mask
info once was: an ``UnexpectedTracerError`` at the first validation) shows only when
programs are traced one after another. So: the train step, the evaluation step, the
translator's search (encode, then beam search) and its forced decoding, for a
TPU slice (``v5e:2x4``, "auto" is splash) here, and for the compile-only H100 ("auto"
is cuDNN) under ``make test-cuda``. Each compiled program holds the kernel where it
should, and its ``main`` takes as many arguments as the same program lowered in a
fresh process: leaked arrays would become extra arguments (the leak's fingerprint).
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from seq2seq_jax import aot, presets
from seq2seq_jax.aot import programs as programs_lib
from seq2seq_jax.aot import report as report_lib

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _lower_one import main_arguments  # noqa: E402  pylint: disable=wrong-import-position
from test_fused_kernels import _custom_calls, cuda  # noqa: E402  pylint: disable=wrong-import-position

ROW = 128
ORDER = ("train", "eval", "generate", "score")  # as a run meets them: update, validate, translate


def _config(compute_dtype):
  """A tiny Transformer with packed rows of 128, "auto" attention and beam 2."""
  return presets.apply_overrides(presets.get_preset("tiny_transformer"), [
      "model.vocab_size=512", "data.vocab_size=512", "model.model_dim=128", "model.num_heads=2",
      "model.mlp_dim=256", f"model.max_len={ROW}", f"data.max_source_len={ROW}",
      f"data.max_target_len={ROW}", f"data.bucket_lengths={ROW}", "data.batch_tokens=2048",
      "data.eval_batch_size=16", "data.packing=true", f"train.compute_dtype={compute_dtype}",
      "model.attention_impl=auto", "decode.method=beam", "decode.beam_size=2",
      "decode.max_decode_len=8"])


def _kernels(text, platform):
  """Names of the fused-attention custom calls in compiled HLO text."""
  if platform == "tpu":
    names = [name for name, target in _custom_calls(text) if target == "tpu_custom_call"]
    return sorted(re.sub(r"_(segmented|residuals|no_residuals|\d+|\.)+", "", n.split(".")[0])
                  for n in names)
  return sorted(target for _, target in _custom_calls(text) if target.startswith("__cudnn$fmha"))


def _in_order_then_fresh(target_name, config, tmp_path):
  target = aot.parse_target(target_name)
  mesh = aot.target_mesh(target, config.train.model_parallelism)
  texts, arguments = {}, {}
  for name in ORDER:
    program = programs_lib.build_program(name, config, mesh)
    lowered = program.jitted.lower(*program.args)
    arguments[name] = main_arguments(lowered)
    with report_lib._not_in_persistent_cache():  # pylint: disable=protected-access
      texts[name] = lowered.compile().as_text()
  config_path = tmp_path / "config.json"
  config_path.write_text(json.dumps(config.to_dict()))
  for name in ORDER:
    fresh = subprocess.run([sys.executable, str(HERE / "_lower_one.py"), target_name, name,
                            str(config_path)], capture_output=True, text=True, timeout=600)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    count = int(re.search(r"ARGUMENTS (\d+)", fresh.stdout).group(1))
    assert arguments[name] == count, (name, arguments[name], count)
  return texts


@pytest.mark.slow
def test_a_tpu_run_s_programs_compile_in_order_with_splash_where_it_belongs(tmp_path):
  config = _config("bfloat16")
  texts = _in_order_then_fresh("v5e:2x4", config, tmp_path)
  model = config.model
  forward, backward = ["splash_mha_fwd"], ["splash_mha_dq", "splash_mha_dkv"]
  every = model.num_encoder_layers + 2 * model.num_decoder_layers  # self, self, cross
  assert _kernels(texts["train"], "tpu") == sorted((forward + backward) * every)
  assert _kernels(texts["eval"], "tpu") == forward * every
  # The search encodes with splash; its decoding steps read the KV cache (einsums).
  assert _kernels(texts["generate"], "tpu") == forward * model.num_encoder_layers
  assert _kernels(texts["score"], "tpu") == forward * every


@cuda
def test_an_h100_run_s_programs_compile_in_order_with_cudnn_where_it_belongs(tmp_path):
  config = _config("bfloat16")
  texts = _in_order_then_fresh("h100", config, tmp_path)
  model = config.model
  every = model.num_encoder_layers + 2 * model.num_decoder_layers
  # Packed rows (train) reach cuDNN as a bias; the bucketed evaluation rows as key lengths,
  # with no bias.
  forward = lambda text: [t for t in _kernels(text, "gpu") if "Backward" not in t]
  backward = lambda text: [t for t in _kernels(text, "gpu") if "Backward" in t]
  assert len(forward(texts["train"])) == len(backward(texts["train"])) == every
  assert all("Bias" in t for t in _kernels(texts["train"], "gpu"))
  assert forward(texts["eval"]) == ["__cudnn$fmhaSoftmax"] * every and not backward(texts["eval"])
  # The translator computes in the checkpoint's float32, which cuDNN's flash attention
  # does not take: its programs run the einsums (and the log says so).
  assert _kernels(texts["generate"], "gpu") == [] and _kernels(texts["score"], "gpu") == []
