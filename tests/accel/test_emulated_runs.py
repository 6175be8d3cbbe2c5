"""The emulated-accelerator tier: a TPU or GPU user's run, end to end, on 8 CPU devices.

Each fused ``attention_impl`` runs what a user runs: ``train()`` (updates, validation
loss and BLEU with a beam search, checkpoints), then ``Translator.from_workdir`` on
the mesh (greedy translations, forced-decoding scores), and its results equal the
einsums' run of the same config. "splash" is the Pallas kernel a TPU runs (here in
interpret mode: the same kernel, exact and slow), which "auto" picks on a TPU; "xla"
is cuDNN's call with XLA's implementation (``layers.fused_attention``), which "auto"
picks on an NVIDIA GPU as "cudnn". A spy shows each phase reaching the kernel.

``test_a_splash_run_survives_kill_9_and_translates_every_way`` goes on from there:
kill -9 mid-run, resume in a new process, ``translate_file`` over the mesh, the
``evaluate`` command and an exported artifact.

Tolerances: float32 on the CPU; a fused kernel sums in another order than the
einsums (a running softmax over blocks), so losses and scores agree to 1e-4
relative, and the greedy translations token for token.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from accel.conftest import MESHES, experiment
from seq2seq_jax import cli
from seq2seq_jax.checkpoints import Checkpointer
from seq2seq_jax.inference import Translator, translate_file
from seq2seq_jax.inference.exported import ExportedTranslator, export_translator
from seq2seq_jax.layers import fused_attention
from seq2seq_jax.training.loop import train
from seq2seq_jax.training.sharding import make_mesh

TESTS = pathlib.Path(__file__).resolve().parents[1]
RTOL = 1e-4
FUSED = ("xla", "splash")


def _pairs(data, count=6):
  folder = pathlib.Path(data.manual_dir)
  sources = (folder / "val.de").read_text(encoding="utf-8").splitlines()[:count]
  targets = (folder / "val.en").read_text(encoding="utf-8").splitlines()[:count]
  return sources, targets


class _Spy:
  """The resolved kernels reaching ``fused_attention.fused_attention``, per phase of a run."""

  def __init__(self, monkeypatch):
    self.phase, self.reached = "train", {}
    real = fused_attention.fused_attention

    def spied(*args, implementation, **kwargs):
      self.reached.setdefault(self.phase, set()).add(implementation)
      return real(*args, implementation=implementation, **kwargs)

    monkeypatch.setattr(fused_attention, "fused_attention", spied)


def _metrics(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _run(config, workdir, sources, targets, spy=None):
  """Everything the tier compares of one run: per-step losses, validation, translations."""
  result = train(config, workdir, progress=False)
  assert result.step == config.train.num_steps and not result.interrupted
  lines = _metrics(workdir)
  if spy is not None:
    spy.phase = "translator"
  translator = Translator.from_workdir(workdir, mesh=make_mesh(config.train.model_parallelism))
  return {
      "losses": {line["step"]: line["loss"] for line in lines},
      "validation": {line["step"]: (line["val_loss"], line["bleu"])
                     for line in lines if "val_loss" in line},
      "greedy": translator.translate(sources, method="greedy", max_decode_len=10),
      "scores": translator.score(sources, targets),
  }, translator


def _assert_same(got, want):
  assert sorted(got["losses"]) == sorted(want["losses"]) == [1, 2, 3, 4]
  for step, loss in want["losses"].items():
    np.testing.assert_allclose(got["losses"][step], loss, rtol=RTOL, err_msg=f"step {step}")
  assert sorted(got["validation"]) == sorted(want["validation"]) == [2, 4]
  for step, (loss, bleu) in want["validation"].items():
    np.testing.assert_allclose(got["validation"][step][0], loss, rtol=RTOL)
    assert got["validation"][step][1] == pytest.approx(bleu, abs=1e-6)
  assert got["greedy"] == want["greedy"]
  np.testing.assert_allclose(got["scores"], want["scores"], rtol=RTOL)


@pytest.mark.slow
@pytest.mark.parametrize("mesh, kind, packing", [
    ("replicated", "transformer", True), ("fsdp", "transformer", False),
    ("data4_model2", "t5", True)])
def test_each_kernel_trains_validates_and_translates_as_the_einsums(
    monkeypatch, accel_data, tmp_path, mesh, kind, packing):
  sources, targets = _pairs(accel_data)
  config = lambda implementation: experiment(accel_data, kind=kind, implementation=implementation,
                                             mesh=mesh, packing=packing)
  want, _ = _run(config("einsum"), tmp_path / "einsum", sources, targets)
  assert np.isfinite(list(want["losses"].values())).all()
  for implementation in FUSED:
    spy = _Spy(monkeypatch)
    got, _ = _run(config(implementation), tmp_path / implementation, sources, targets, spy)
    # Training and validation trace in one process; the translator's encoder and its
    # forced decoding run at the bucket of 128 too.
    assert spy.reached == {"train": {implementation}, "translator": {implementation}}
    _assert_same(got, want)


def _subprocess(workdir, config_path, *signal_args):
  env = dict(os.environ, PYTHONPATH=f"{TESTS.parent}{os.pathsep}{TESTS / 'training'}")
  env.setdefault("JAX_COMPILATION_CACHE_DIR", jax.config.jax_compilation_cache_dir or "")
  return subprocess.run([sys.executable, str(TESTS / "training" / "_run_train.py"),
                         str(workdir), str(config_path), *signal_args],
                        capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.slow
def test_a_splash_run_survives_kill_9_and_translates_every_way(monkeypatch, accel_data, tmp_path,
                                                               capsys):
  """A TPU user's loop with splash on the data x model 4 x 2 mesh, packed rows of 128."""
  mesh_name = "data4_model2"
  config = experiment(accel_data, kind="transformer", implementation="splash", mesh=mesh_name,
                      packing=True)
  sources, targets = _pairs(accel_data)
  spy = _Spy(monkeypatch)
  reference, translator = _run(config, tmp_path / "reference", sources, targets, spy)
  assert spy.reached == {"train": {"splash"}, "translator": {"splash"}}

  # kill -9 after the checkpoint of step 2 (step 3's update never lands), then resume.
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "tokenizer.model").write_bytes((tmp_path / "reference" / "tokenizer.model")
                                            .read_bytes())
  config_path = tmp_path / "config.json"
  config_path.write_text(json.dumps(config.to_dict()))
  killed = _subprocess(workdir, config_path, "SIGKILL", "3")
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  with Checkpointer(workdir / "checkpoints") as checkpointer:
    assert checkpointer.latest_step() == 2
  resumed = _subprocess(workdir, config_path)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Resumed from checkpoint step 2" in resumed.stdout
  assert "interpret mode" in resumed.stderr  # the kernel ran in the resumed process too
  got = {line["step"]: line for line in _metrics(workdir)}
  for step in (3, 4):
    np.testing.assert_allclose(got[step]["loss"], reference["losses"][step], rtol=RTOL)
  np.testing.assert_allclose(got[4]["val_loss"], reference["validation"][4][0], rtol=RTOL)

  # translate_file over the mesh: the Translator's own translations, line for line (it runs
  # the Translator's compiled search, which reached splash above).
  source_file, output = tmp_path / "sources.de", tmp_path / "out.en"
  source_file.write_text("\n".join(sources) + "\n", encoding="utf-8")
  result = translate_file(translator, source_file, output, method="greedy", max_decode_len=10)
  assert result.lines == len(sources)
  assert output.read_text(encoding="utf-8").splitlines() == reference["greedy"]

  # The evaluate command (beam 2, the run's search) on the validation split.
  spy.phase = "evaluate"
  assert cli.main(["evaluate", "--workdir", str(tmp_path / "reference"), "--split", "val",
                   "--max-sentences", "8"]) == 0
  assert "BLEU" in capsys.readouterr().out
  assert spy.reached["evaluate"] == {"splash"}

  # An exported artifact: one StableHLO for every platform runs the einsums (a Pallas
  # or cuDNN kernel is specific to one); its translations are the Translator's.
  artifact = tmp_path / "model.jaxexport"
  export_translator(translator, artifact, method="greedy", max_decode_len=10)
  assert ExportedTranslator(artifact).translate(sources) == reference["greedy"]
