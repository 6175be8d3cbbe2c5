"""The host loop on real multi30k_tiny batches: learning, run files, resume, faults."""

import dataclasses
import json
import math
import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from seq2seq_jax.checkpoints import Checkpointer
from seq2seq_jax.training.restore import load_params
from seq2seq_jax.data import pipeline
from seq2seq_jax.training.loop import ConfigMismatchError, NonFiniteLossError, train
from seq2seq_jax.training.optimizer import make_optimizer
from seq2seq_jax.training.schedules import make_schedule
from seq2seq_jax.training.step import (build_model, create_train_state, make_mesh,
                                       make_train_step, shard_batch)
from seq2seq_jax.configs import ExperimentConfig
from seq2seq_jax.inference import Translator
from training.conftest import (replace_train, tiny_deep_shallow, tiny_experiment, tiny_rnn,
                               tiny_t5, tiny_transformer)

HERE = pathlib.Path(__file__).resolve().parent


MODELS = {"transformer": tiny_transformer, "rnn": tiny_rnn, "deep_shallow": tiny_deep_shallow,
          "t5": tiny_t5}


@pytest.mark.parametrize("model", list(MODELS))
def test_loss_falls_on_multi30k_tiny(model, tiny_data, tiny_tokenizer):
  model_config = MODELS[model]()
  config = tiny_experiment(tiny_data, model=model_config, learning_rate=1e-2, warmup_steps=5)
  mesh = make_mesh()
  network = build_model(config.model)
  schedule = make_schedule(config.train)
  optimizer = make_optimizer(config.train, schedule)
  state = create_train_state(network, optimizer, rng=jax.random.key(0), mesh=mesh)
  step = make_train_step(network, optimizer, schedule, mesh=mesh, state=state,
                         label_smoothing=0.1)
  iterator = pipeline.make_train_iterator(tiny_data, tiny_tokenizer)
  losses = []
  for _ in range(30):
    state, metrics = step(state, shard_batch(next(iterator), mesh), jax.random.key(1))
    losses.append(float(metrics["loss"]))
  assert math.log(tiny_tokenizer.vocab_size) - 0.5 < losses[0]  # starts near uniform
  assert np.mean(losses[-5:]) < losses[0] - 1.0, losses


def _lines(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _final(workdir):
  params, _ = load_params(workdir / "checkpoints", step="latest")
  with Checkpointer(workdir / "checkpoints") as checkpointer:
    step = checkpointer.latest_step()
  data_state = (workdir / "checkpoints" / str(step) / "data" / "process_0-of-1.json").read_text()
  return step, params, json.loads(data_state)


def _assert_same_run(workdir, reference):
  step, params, data_state = _final(workdir)
  ref_step, ref_params, ref_data_state = _final(reference)
  assert step == ref_step
  assert data_state == ref_data_state  # the next batches are the same
  jax.tree.map(np.testing.assert_array_equal, params, ref_params)


@pytest.fixture(scope="module")
def reference_run(tiny_data, tiny_tokenizer, tmp_path_factory):
  """An uninterrupted 12-step run: checkpoints at 4, 8, 12; BLEU at 12."""
  config = tiny_experiment(tiny_data)
  workdir = tmp_path_factory.mktemp("reference")
  result = train(config, workdir, tokenizer=tiny_tokenizer, progress=False)
  return config, workdir, result


def test_a_trained_run_translates_sources_longer_than_its_training_limit(
    tiny_data, tiny_tokenizer, tmp_path, caplog, monkeypatch):
  # Trained on sources of at most 16 tokens with a position table of 64: a user's
  # sentence of 40 pieces must reach the encoder whole (before, translate cut it at 16).
  data = dataclasses.replace(tiny_data, max_source_len=16, max_target_len=16,
                             bucket_lengths=(16,))
  config = tiny_experiment(data, model=tiny_transformer(max_len=64), num_steps=4)
  train(config, tmp_path, tokenizer=tiny_tokenizer, progress=False)
  translator = Translator.from_workdir(tmp_path)
  assert translator.max_source_len == 64 and translator.bucket_lengths == (16, 32, 64)
  lines = (pathlib.Path(tiny_data.manual_dir) / "val.de").read_text(encoding="utf-8").splitlines()
  words = " ".join(lines).split()
  count = next(n for n in range(1, len(words)) if len(
      tiny_tokenizer.encode_source([" ".join(words[:n])], None)[0]) > 40)
  sentence = " ".join(words[:count])
  ids = tiny_tokenizer.encode_source([sentence], None)[0]
  assert 40 <= len(ids) - 1 < 48  # pieces (EOS not counted): well over 16, under 64
  placed = []
  place_batch = translator.place_batch

  def spy(encoded, batch):
    inputs_BS = place_batch(encoded, batch)
    placed.append(np.asarray(inputs_BS))
    return inputs_BS
  monkeypatch.setattr(translator, "place_batch", spy)
  caplog.clear()  # training's own notes on its truncated pairs
  with caplog.at_level("WARNING", logger="seq2seq_jax"):
    (out,) = translator.translate([sentence], beam_size=1)
  assert "truncated" not in caplog.text and isinstance(out, str)
  (inputs_BS,) = placed  # one batch, the sentence whole in its first row
  assert inputs_BS.shape[1] == 64 and inputs_BS[0, :len(ids)].tolist() == ids
  assert not inputs_BS[0, len(ids):].any()
  # A limit the user sets is the one applied, and the warning says so.
  short = Translator.from_workdir(tmp_path, max_source_len=24)
  with caplog.at_level("WARNING", logger="seq2seq_jax"):
    assert len(short.encode([sentence])[0]) == 24
  assert (f"sentence 0 has {len(ids)} tokens; truncated to 24 (EOS included), the "
          "max_source_len given (--max-source-len; the model takes 64)") in caplog.text


@pytest.mark.parametrize("model", ["deep_shallow", "t5"])
def test_other_shapes_train_checkpoint_and_translate(model, tiny_data, tiny_tokenizer, tmp_path):
  # A deep-encoder / shallow-decoder Transformer and a T5, through the whole loop: the
  # config saved with the run reads back, the checkpoint loads and beam search decodes.
  config = tiny_experiment(tiny_data, model=MODELS[model](), num_steps=8)
  result = train(config, tmp_path, tokenizer=tiny_tokenizer, progress=False)
  assert result.step == 8
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved["model"]["kind"] == ("t5" if model == "t5" else "transformer")
  assert ExperimentConfig.from_dict(saved) == config
  translator = Translator.from_workdir(tmp_path)
  assert type(translator.model.config) is type(config.model)
  out = translator.translate(["Ein Hund läuft.", "", "Zwei Männer."], beam_size=2)
  assert len(out) == 3 and out[1] == "" and all(isinstance(text, str) for text in out)


def test_a_model_with_foreign_special_ids_is_refused(tiny_data, tiny_tokenizer, tmp_path):
  config = tiny_experiment(tiny_data, model=tiny_t5(decoder_start_id=0, eos_id=1))
  with pytest.raises(ValueError, match=r"model.pad_id=0, model.eos_id=1: the run's own "
                                       r"sentencepiece vocabulary has PAD 0 and EOS 2"):
    train(config, tmp_path, tokenizer=tiny_tokenizer, progress=False)


def test_run_files_and_metrics(reference_run):
  config, workdir, result = reference_run
  assert result.step == 12 and not result.interrupted and result.resumed_from is None
  lines = _lines(workdir)
  assert [line["step"] for line in lines] == [4, 8, 12]
  assert all(line["log_every"] == 4 for line in lines)
  assert lines[-1]["bleu"] >= 0 and "tok:13a" in lines[-1]["bleu_signature"]
  assert np.isfinite(lines[-1]["val_loss"])
  for key in ("loss", "learning_rate", "steps_per_sec", "tokens_per_sec"):
    assert np.isfinite(lines[0][key]) and lines[0][key] > 0
  assert json.loads((workdir / "config.json").read_text()) == config.to_dict()
  info = json.loads((workdir / "run_info.json").read_text())
  assert info["seed"] == config.train.seed
  assert info["sessions"][0]["versions"]["jax"] == jax.__version__
  assert "git" in info["sessions"][0]
  assert (workdir / "tokenizer.model").exists()
  assert result.best_step == 12 and result.best_bleu == lines[-1]["bleu"]


def test_sigint_saves_and_a_rerun_resumes_exactly(reference_run, tmp_path, capsys):
  config, reference, _ = reference_run

  def interrupt_at_7(step, state):
    if step == 7:
      os.kill(os.getpid(), signal.SIGINT)
    return state

  first = train(config, tmp_path, step_hook=interrupt_at_7)
  assert first.interrupted and first.step == 7
  assert "Interrupted: saved checkpoint step 7" in capsys.readouterr().out
  second = train(config, tmp_path)
  assert "Resumed from checkpoint step 7" in capsys.readouterr().out
  assert second.step == 12 and second.resumed_from == 7 and not second.interrupted
  _assert_same_run(tmp_path, reference)
  steps = [line["step"] for line in _lines(tmp_path)]
  assert steps == [4, 7, 8, 12]
  assert [line["log_every"] for line in _lines(tmp_path)] == [4, 3, 1, 4]


def test_changed_config_is_refused_unless_restart(reference_run, tmp_path_factory):
  config, reference, _ = reference_run
  changed = replace_train(config, learning_rate=5e-3, warmup_steps=7)
  with pytest.raises(ConfigMismatchError, match=r"train\.learning_rate: saved 0\.003, now 0\.005"
                     r"(.|\n)*train\.warmup_steps(.|\n)*restart=True"):
    train(changed, reference, progress=False)
  other_model = tiny_experiment(config.data, model=tiny_rnn())
  with pytest.raises(ConfigMismatchError, match=r"model\.kind: saved 'transformer', now 'rnn'"):
    train(other_model, reference, progress=False)
  # restart=True sets the old run aside (nothing deleted) and starts from step 0.
  workdir = tmp_path_factory.mktemp("restart")
  short = replace_train(config, num_steps=4)
  train(short, workdir, progress=False)
  result = train(replace_train(short, learning_rate=5e-3), workdir, restart=True, progress=False)
  assert result.resumed_from is None and result.step == 4
  assert list(workdir.glob("replaced-*/checkpoints/4"))


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(reference_run, tmp_path):
  config, _, _ = reference_run

  def poison_at_6(step, state):
    if step == 6:
      return state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
    return state

  with pytest.raises(NonFiniteLossError, match="at step 6.*last good checkpoint is step 4"):
    train(config, tmp_path, step_hook=poison_at_6, progress=False)
  params, _ = load_params(tmp_path / "checkpoints")
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))
  with Checkpointer(tmp_path / "checkpoints") as checkpointer:
    assert checkpointer.all_steps() == [4]


def _subprocess(workdir, config_path, *signal_args):
  env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]))
  env.setdefault("JAX_COMPILATION_CACHE_DIR", jax.config.jax_compilation_cache_dir or "")
  return subprocess.run([sys.executable, str(HERE / "_run_train.py"), str(workdir),
                         str(config_path), *signal_args], capture_output=True, text=True,
                        timeout=300, env=env)


@pytest.mark.slow
def test_sigint_and_sigkill_of_real_processes(reference_run, tmp_path):
  config, reference, _ = reference_run
  config_path = tmp_path / "config.json"
  config_path.write_text(json.dumps(config.to_dict()))
  workdir = tmp_path / "run"
  (workdir).mkdir()
  # The tokenizer file makes the run use the reference's vocabulary without training one.
  (workdir / "tokenizer.model").write_bytes((reference / "tokenizer.model").read_bytes())

  interrupted = _subprocess(workdir, config_path, "SIGINT", "6")
  assert interrupted.returncode == 0, interrupted.stderr[-3000:]
  assert "Interrupted: saved checkpoint step 6" in interrupted.stdout

  killed = _subprocess(workdir, config_path, "SIGKILL", "10")
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert "Resumed from checkpoint step 6" in killed.stdout
  with Checkpointer(workdir / "checkpoints") as checkpointer:
    assert checkpointer.latest_step() == 8  # steps 9 and 10 are lost, nothing else

  resumed = _subprocess(workdir, config_path)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Resumed from checkpoint step 8" in resumed.stdout
  _assert_same_run(workdir, reference)
  assert [line["step"] for line in _lines(workdir)] == [4, 6, 8, 12]


def _per_step_losses(workdir):
  return {line["step"]: line["loss"] for line in _lines(workdir)}


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True])
def test_kill_9_mid_epoch_and_resume_with_two_workers(tiny_data, tiny_tokenizer, tmp_path, packing):
  # A preempted run comes back on a host with another worker count: the resume check lets
  # data.num_workers change, and every later batch (so every loss) is the uninterrupted run's.
  data = dataclasses.replace(tiny_data, packing=packing, num_workers=0)
  config = tiny_experiment(data, num_steps=24, log_every=1, checkpoint_every=4)
  _, stats = pipeline.make_train_dataset(data, tiny_tokenizer)
  assert 12 < stats.batches_per_epoch < 24  # resumed mid-epoch (at 8 or 12), then on
  reference = tmp_path / "reference"
  train(config, reference, tokenizer=tiny_tokenizer, progress=False)

  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "tokenizer.model").write_bytes((reference / "tokenizer.model").read_bytes())
  config_path = tmp_path / "config.json"
  config_path.write_text(json.dumps(config.to_dict()))
  killed = _subprocess(workdir, config_path, "SIGKILL", "14")
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  with Checkpointer(workdir / "checkpoints") as checkpointer:
    # 12, or 8 when the machine is too busy for step 12's asynchronous save to land first.
    resume = checkpointer.latest_step()
  assert resume in (8, 12)

  two_workers = dataclasses.replace(config, data=dataclasses.replace(data, num_workers=2))
  config_path.write_text(json.dumps(two_workers.to_dict()))
  resumed = _subprocess(workdir, config_path)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resumed from checkpoint step {resume}" in resumed.stdout
  assert "Resuming with data.num_workers: saved 0, now 2" in resumed.stdout
  want, got = _per_step_losses(reference), _per_step_losses(workdir)
  assert sorted(got) == list(range(1, 25))
  assert [got[step] for step in range(resume + 1, 25)] == [want[step]
                                                            for step in range(resume + 1, 25)]
  _assert_same_run(workdir, reference)


def test_settings_that_change_a_batch_are_still_refused(reference_run):
  config, reference, _ = reference_run
  for field, value, shown in (("batch_tokens", 1024, "512, now 1024"),
                              ("packing", True, "False, now True"),
                              ("shuffle_seed", 3, "0, now 3")):
    changed = dataclasses.replace(config, data=dataclasses.replace(config.data, **{field: value}))
    with pytest.raises(ConfigMismatchError, match=rf"data\.{field}: saved {shown}"):
      train(changed, reference, progress=False)


def _workers_alive() -> list:
  return [child for child in multiprocessing.active_children() if child.is_alive()]


def test_train_ends_its_worker_processes_on_success_and_on_error(reference_run, tmp_path):
  config, reference, _ = reference_run
  config = dataclasses.replace(config, data=dataclasses.replace(config.data, num_workers=2))
  config = replace_train(config, num_steps=3)
  assert not _workers_alive()
  train(config, tmp_path / "done", progress=False)
  assert not _workers_alive()

  def poison_at_2(step, state):
    if step == 2:
      assert len(_workers_alive()) == 2  # the iterator's workers while the run goes
      return state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
    return state

  with pytest.raises(NonFiniteLossError) as error:
    train(config, tmp_path / "failed", step_hook=poison_at_2, progress=False)
  assert error.traceback  # it holds the run's frames, and with them the iterator
  assert not _workers_alive()


@pytest.mark.slow
def test_a_script_that_fails_in_train_leaks_no_shared_memory(reference_run, tmp_path):
  config, reference, _ = reference_run
  config = dataclasses.replace(config, data=dataclasses.replace(config.data, num_workers=2))
  config_path = tmp_path / "config.json"
  config_path.write_text(json.dumps(replace_train(config, num_steps=4).to_dict()))
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "tokenizer.model").write_bytes((reference / "tokenizer.model").read_bytes())
  failed = _subprocess(workdir, config_path, "NAN", "3")
  assert failed.returncode == 1 and "NonFiniteLossError: non-finite training loss" in failed.stderr
  for sign in ("leaked shared_memory", "SharedMemoryArray.__del__", "Exception ignored"):
    assert sign not in failed.stderr, failed.stderr[-3000:]
