"""jax.export artifacts: every model family and search lowered for cpu, cuda and tpu; the CPU
artifact equals the Translator and runs without the model's code; the train step for tpu/cuda.

CI has no GPU or TPU: lowering for them here is the check that the programs
compile for those platforms' StableHLO (no CPU-only custom calls, shardings that
partition), which is what this CPU-only machine can make.
"""

import json
import subprocess
import sys
import zipfile

import jax
import numpy as np
import pytest

from seq2seq_jax import serving
from seq2seq_jax.configs import DecodeConfig, RNNConfig, TrainConfig, TransformerConfig
from seq2seq_jax.decoding import generation
from seq2seq_jax.inference import Translator, export_translator
from seq2seq_jax.models.registry import build_model
from seq2seq_jax.models.rnn_seq2seq import RNNSeq2Seq
from seq2seq_jax.models.transformer import Transformer
from seq2seq_jax.training import sharding, step as step_lib
from seq2seq_jax.training.export import export_train_step, flat_train_state
from seq2seq_jax.training.optimizer import make_optimizer
from seq2seq_jax.training.schedules import make_schedule

from inference.conftest import init_params, tiny_transformer

PLATFORMS = ("cpu", "cuda", "tpu")
SEARCHES = {"greedy": DecodeConfig(method="greedy", max_decode_len=9),
            "beam": DecodeConfig(method="beam", beam_size=3, alpha=0.6, max_decode_len=9),
            "sample": DecodeConfig(method="sample", temperature=0.9, top_k=20, max_decode_len=9,
                                   seed=5)}


def _families(vocab_size: int) -> dict:
  rnn = dict(vocab_size=vocab_size, embed_dim=8, hidden_dim=12, max_len=48, dropout_rate=0.0)
  return {
      "transformer post-LN": tiny_transformer(vocab_size, norm="post"),
      "transformer pre-LN": tiny_transformer(vocab_size, norm="pre", positions="learned"),
      "rnn none": RNNConfig(**rnn, cell="gru", attention="none"),
      "rnn additive": RNNConfig(**rnn, cell="lstm", bidirectional=True, attention="additive"),
      "rnn dot": RNNConfig(**rnn, cell="gru", attention="dot"),
      "rnn general": RNNConfig(**rnn, cell="simple", attention="general", input_feeding=True),
  }


def _translator(model_config, tokenizer, search: DecodeConfig) -> Translator:
  model = build_model(model_config)
  # One length bucket and two rows: the artifact holds 1x12 and 2x12 programs.
  return Translator(model, init_params(model, seed=3), tokenizer, max_source_len=12,
                    bucket_lengths=(12,), batch_size=2, decode_config=search)


def _programs(path):
  with zipfile.ZipFile(path) as archive:
    return {name: jax.export.deserialize(bytearray(archive.read(name)))
            for name in archive.namelist() if name.startswith("programs/")}


@pytest.mark.slow
def test_every_family_and_search_lowers_for_cpu_cuda_tpu_and_equals_the_translator(
    tokenizer, sentences, tmp_path):
  pair = [sentences[0], "", sentences[2]]  # one batch of two rows, and an empty line
  for family, model_config in _families(tokenizer.vocab_size).items():
    for name, search in SEARCHES.items():
      translator = _translator(model_config, tokenizer, search)
      path = tmp_path / f"{family}-{name}.s2sx".replace(" ", "_")
      info = export_translator(translator, path, platforms=PLATFORMS)
      assert info.platforms == PLATFORMS and info.shapes == ((1, 12), (2, 12))
      programs = _programs(path)
      assert sorted(programs) == ["programs/1x12.jaxexport", "programs/2x12.jaxexport"]
      for program in programs.values():
        assert program.platforms == PLATFORMS
        assert "stablehlo.while" in program.mlir_module()  # the search loop, on device
      artifact = serving.load_exported(path)
      assert artifact.translate(pair) == translator.translate(pair), (family, name)


def test_the_artifact_runs_without_the_model_code(model_and_params, tokenizer, sentences,
                                                  tmp_path, monkeypatch):
  model, params = model_and_params
  translator = Translator(model, params, tokenizer, max_source_len=16, bucket_lengths=(8,),
                          batch_size=4, decode_config=SEARCHES["beam"])
  path = tmp_path / "beam.s2sx"
  export_translator(translator, path, platforms=("cpu", "tpu"))
  want = translator.translate(sentences[:6])
  scores_want = [translator.translate([s], beam_size=3) for s in sentences[:1]]

  def unavailable(*args, **kwargs):
    raise AssertionError("model code ran")

  for cls in (Transformer, RNNSeq2Seq):
    for method in ("encode", "decode", "init_cache", "decode_step", "__call__"):
      monkeypatch.setattr(cls, method, unavailable)
  monkeypatch.setattr(generation, "_search", unavailable)
  with pytest.raises(AssertionError, match="model code ran"):  # the patch bites
    Translator(model, params, tokenizer, max_source_len=16, bucket_lengths=(8,),
               batch_size=4, decode_config=SEARCHES["greedy"]).translate(sentences[:1])
  artifact = serving.load_exported(path)
  assert artifact.translate(sentences[:6]) == want
  (text, score), = artifact.translate(sentences[:1], return_scores=True)
  assert text == scores_want[0][0] and score < 0
  manifest = json.loads(zipfile.ZipFile(path).read("manifest.json"))
  assert manifest["search"]["method"] == "beam" and manifest["platforms"] == ["cpu", "tpu"]


def test_bad_platforms_and_files_are_refused(model_and_params, tokenizer, tmp_path):
  model, params = model_and_params
  translator = Translator(model, params, tokenizer, max_source_len=8, bucket_lengths=(8,),
                          batch_size=1, decode_config=SEARCHES["greedy"])
  path = tmp_path / "accelerators.s2sx"
  export_translator(translator, path, platforms=("cuda", "tpu"))
  with pytest.raises(ValueError, match=r"exported for cuda, tpu; this machine runs cpu: "
                                       r"export again with --platforms including cpu"):
    serving.load_exported(path)
  with pytest.raises(ValueError, match=r"platforms=\('gpu',\): each must be one of cpu, cuda"):
    export_translator(translator, tmp_path / "x.s2sx", platforms=("gpu",))
  (tmp_path / "text.s2sx").write_text("not an artifact")
  with pytest.raises(ValueError, match="not an exported translator"):
    serving.load_exported(tmp_path / "text.s2sx")


@pytest.mark.slow
def test_cli_export_of_a_run_equals_its_translator(run_dir, sentences, tmp_path):
  out = tmp_path / "run.s2sx"
  done = subprocess.run([sys.executable, "-m", "seq2seq_jax.cli", "export", "--workdir",
                         str(run_dir), "--out", str(out), "--platforms", "cpu,cuda,tpu",
                         "--batch-size", "4", "--beam-size", "2"], capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stderr
  assert "beam for cpu, cuda, tpu" in done.stdout
  translator = Translator.from_workdir(run_dir, batch_size=4)
  assert serving.load_exported(out).translate(sentences) == translator.translate(sentences,
                                                                                 beam_size=2)


# ---- the training step --------------------------------------------------------------------


def _split(shardings, avals) -> list[str]:
  """The arguments or results whose sharding splits them over devices."""
  return [f"{s} {a.shape}" for s, a in zip(shardings, avals, strict=True)
          if s is not None and s.shard_shape(a.shape) != a.shape]


@pytest.mark.parametrize("model_config, train_config, mesh_shape", [
    (TransformerConfig(vocab_size=64, model_dim=16, num_heads=2, mlp_dim=32,
                       num_encoder_layers=1, num_decoder_layers=1, max_len=16),
     TrainConfig(parameter_sharding="fsdp"), (8, 1)),
    (TransformerConfig(vocab_size=64, model_dim=16, num_heads=2, mlp_dim=32,
                       num_encoder_layers=1, num_decoder_layers=1, max_len=16),
     TrainConfig(model_parallelism=2, grad_accum_steps=2), (4, 2)),
    (RNNConfig(vocab_size=64, embed_dim=16, hidden_dim=24, attention="additive", max_len=16),
     TrainConfig(parameter_sharding="fsdp", compute_dtype="bfloat16"), (8, 1)),
], ids=["transformer-fsdp", "transformer-tensor-parallel", "rnn-fsdp-bf16"])
def test_train_step_lowers_for_tpu_and_cuda_with_its_mesh_shardings(model_config, train_config,
                                                                     mesh_shape):
  mesh = sharding.make_mesh(train_config.model_parallelism)
  assert tuple(mesh.shape.values()) == mesh_shape
  exported = export_train_step(model_config, train_config, batch_rows=8, source_len=6,
                               target_len=5, platforms=("tpu", "cuda"), mesh=mesh)
  assert exported.platforms == ("tpu", "cuda") and exported.nr_devices == 8
  exported = jax.export.deserialize(exported.serialize())  # it survives serialization
  # batch rows over the data axis; parameters and Adam moments split (FSDP / tensor parallel).
  # The shardings as jax's (in_shardings_hlo is left unset from jax 0.12 on).
  in_shardings = exported.in_shardings_jax(mesh)
  batch = list(zip(in_shardings, exported.in_avals))[-3:-1]
  assert all(s.shard_shape(a.shape) == (a.shape[0] // mesh_shape[0], *a.shape[1:])
             for s, a in batch), batch
  state = _split(in_shardings[:-3], exported.in_avals[:-3])
  assert len(state) >= 3, state
  assert len(_split(exported.out_shardings_jax(mesh), exported.out_avals)) >= 3


def test_cpu_export_of_the_train_step_is_the_train_step():
  """Run on the 8 CPU devices, the exported FSDP step updates the state as the jitted one."""
  model_config = TransformerConfig(vocab_size=64, model_dim=16, num_heads=2, mlp_dim=32,
                                   num_encoder_layers=1, num_decoder_layers=1, max_len=16)
  train_config = TrainConfig(parameter_sharding="fsdp", learning_rate=1e-2, warmup_steps=1)
  mesh = sharding.make_mesh()
  exported = export_train_step(model_config, train_config, batch_rows=8, source_len=6,
                               target_len=5, platforms=("cpu",), mesh=mesh)
  model = step_lib.build_model(model_config)
  schedule = make_schedule(train_config)
  optimizer = make_optimizer(train_config, schedule)

  def fresh_state():
    return step_lib.create_train_state(
        model, optimizer, rng=jax.random.key(0), mesh=mesh,
        state_sharding_fn=sharding.state_sharding_fn("fsdp"))

  rng = np.random.default_rng(0)
  batch = step_lib.shard_batch({"inputs": rng.integers(4, 64, (8, 6)).astype(np.int32),
                                "targets": rng.integers(4, 64, (8, 5)).astype(np.int32)}, mesh)
  key = jax.random.key(0)
  step = step_lib.make_train_step(model, optimizer, schedule, mesh=mesh, state=fresh_state(),
                                  label_smoothing=train_config.label_smoothing)
  want_state, want_metrics = step(fresh_state(), batch, key)
  leaves, metrics = exported.call(flat_train_state(fresh_state()), batch,
                                  jax.random.key_data(key))
  np.testing.assert_allclose(metrics["loss"], want_metrics["loss"], rtol=1e-6)
  for got, want in zip(leaves, flat_train_state(want_state)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)
  changed = [not np.allclose(a, b) for a, b in zip(leaves, flat_train_state(fresh_state()))]
  assert sum(changed) > len(changed) // 2  # an update happened: parameters and moments moved


def test_an_int8_translator_exports_for_cpu_and_tpu_and_equals_the_translator(
    model_and_params, tokenizer, sentences, tmp_path):
  model, params = model_and_params
  translator = Translator(model, params, tokenizer, max_source_len=16, bucket_lengths=(8,),
                          batch_size=2, decode_config=SEARCHES["greedy"], quantize="int8")
  path = tmp_path / "int8.s2sx"
  export_translator(translator, path, platforms=("cpu", "tpu"))
  manifest = json.loads(zipfile.ZipFile(path).read("manifest.json"))
  assert "int8" in {spec["dtype"] for spec in manifest["params"]}
  assert serving.load_exported(path).translate(sentences[:3]) == translator.translate(
      sentences[:3])
