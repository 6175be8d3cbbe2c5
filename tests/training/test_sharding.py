"""One training run on any mesh: FSDP, tensor parallelism, two hosts, checkpoints across meshes.

The fast tests run in this process (8 host CPU devices, tests/conftest.py). The
slow ones train the ``tiny_transformer`` preset for 20 steps in subprocesses with
their own device counts (fixed at start-up), all on the same global batches:
through ``seq2seq-jax train`` on 1 device, 8 data-parallel, 8 FSDP and a 4 x 2
(data x model) mesh; and through ``_run_sharded.py`` (``loop.train`` after
``maybe_initialize_distributed``) as two processes of 4 devices joined by
``jax.distributed`` over gloo, with FSDP, so parameters are split across processes.
"""

import fcntl
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.configs import RNNConfig, T5Config, TrainConfig, TransformerConfig
from seq2seq_jax.training import optimizer as optimizer_lib
from seq2seq_jax.training import schedules, sharding
from seq2seq_jax.training import step as step_lib

HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
SCRIPT = HERE / "_run_sharded.py"
STEPS = 20
RTOL = 1e-3  # the bound on the step-20 loss across meshes


def _transformer(**overrides) -> TransformerConfig:
  # Pairwise-distinct sizes; every one divisible by 8 so FSDP can split each matrix.
  values = dict(vocab_size=96, model_dim=64, num_heads=4, mlp_dim=128, num_encoder_layers=1,
                num_decoder_layers=1, max_len=16, dropout_rate=0.0)
  return TransformerConfig(**{**values, **overrides})


def _t5(**overrides) -> T5Config:
  values = dict(vocab_size=96, model_dim=64, num_heads=4, head_dim=24, mlp_dim=128,
                num_encoder_layers=1, num_decoder_layers=1, relative_buckets=8,
                relative_max_distance=16, activation="gelu_tanh", gated_ffn=True,
                tie_output=False, scale_output=False, max_len=16, dropout_rate=0.0,
                pad_id=0, decoder_start_id=1, eos_id=2)
  return T5Config(**{**values, **overrides})


# Every encoder-decoder whose parameters the table names (the RNN goes through the fallback).
MODELS = {"transformer": lambda: _transformer(tie_output=False, positions="learned"),
          "deep_shallow": lambda: _transformer(num_encoder_layers=2, num_decoder_layers=1,
                                               decoder_num_heads=2, decoder_mlp_dim=64),
          "t5": _t5}


def _state(model_config, mesh, parameter_sharding="replicated"):
  model = step_lib.build_model(model_config)
  train_config = TrainConfig(num_steps=10, warmup_steps=2, learning_rate=1e-2)
  schedule = schedules.make_schedule(train_config)
  optimizer = optimizer_lib.make_optimizer(train_config, schedule)
  state = step_lib.create_train_state(
      model, optimizer, rng=jax.random.key(0), mesh=mesh,
      state_sharding_fn=sharding.state_sharding_fn(parameter_sharding))
  return model, optimizer, schedule, state


def _leaves(tree) -> dict[str, jax.Array]:
  return {"/".join(sharding._key_name(k) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


# ---- the axis table and the rules ------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_every_transformer_parameter_is_in_the_table(name):
  model = step_lib.build_model(MODELS[name]())
  shapes = jax.eval_shape(lambda: step_lib.init_params(model, jax.random.key(0)))
  for name, leaf in _leaves(shapes).items():
    axes = sharding.logical_axes(name.split("/"), leaf.shape)
    assert sharding.FSDP not in axes, f"{name} {leaf.shape} fell through to the fallback"
    if name.endswith(("kernel", "embedding")):  # every matrix has an axis FSDP splits
      assert sharding.EMBED in axes, (name, axes)


def test_t5_splits_its_heads_and_gated_layers_like_the_transformer():
  mesh = sharding.make_mesh(model_parallelism=2)
  _, _, _, state = _state(_t5(), mesh)
  specs = {name: leaf.sharding.spec for name, leaf in _leaves(state.params).items()}
  assert specs["encoder_layers_0/self_attention/query/kernel"] == jax.P(None, "model", None)
  assert specs["decoder_layers_0/cross_attention/out/kernel"] == jax.P("model", None, None)
  for gate in ("wi_0", "wi_1"):
    assert specs[f"decoder_layers_0/feed_forward/{gate}/kernel"] == jax.P(None, "model")
  assert specs["decoder_layers_0/feed_forward/wo/kernel"] == jax.P("model", None)
  assert specs["encoder_position_bias/relative_attention_bias"] == jax.P(None, "model")
  assert specs["encoder_norm/scale"] == jax.P(None)


def test_tensor_parallelism_splits_like_megatron():
  mesh = sharding.make_mesh(model_parallelism=2)
  assert dict(mesh.shape) == {"data": 4, "model": 2}
  _, _, _, state = _state(_transformer(), mesh)
  specs = {name: leaf.sharding.spec for name, leaf in _leaves(state.params).items()}
  layer = "encoder_layers_0/self_attention"
  for projection in ("query", "key", "value"):  # column split: heads over "model"
    assert specs[f"{layer}/{projection}/kernel"] == jax.P(None, "model", None)
    assert specs[f"{layer}/{projection}/bias"] == jax.P("model", None)
  assert specs[f"{layer}/out/kernel"] == jax.P("model", None, None)  # row split
  assert specs[f"{layer}/out/bias"] == jax.P(None)  # added after the all-reduce
  assert specs["decoder_layers_0/feed_forward/wi/kernel"] == jax.P(None, "model")
  assert specs["decoder_layers_0/feed_forward/wo/kernel"] == jax.P("model", None)
  assert specs["source_embedding/embedding"] == jax.P(None, None)
  wi = _leaves(state.params)["decoder_layers_0/feed_forward/wi/kernel"]
  assert sharding.per_device_bytes(wi) * 2 == wi.nbytes


def test_fsdp_shards_parameters_and_optimizer_state():
  mesh = sharding.make_mesh()
  _, _, _, replicated = _state(_transformer(), mesh)
  _, _, _, fsdp = _state(_transformer(), mesh, "fsdp")
  params, moments = _leaves(fsdp.params), _leaves(fsdp.opt_state)
  embedding = params["source_embedding/embedding"]  # [96, 64], the largest matrix
  assert embedding.sharding.spec == jax.P(None, "data")
  assert sharding.per_device_bytes(embedding) * 8 == embedding.nbytes
  adam_mu = next(v for k, v in moments.items() if k.endswith("mu/source_embedding/embedding"))
  assert sharding.per_device_bytes(adam_mu) * 8 == adam_mu.nbytes
  assert sharding.per_device_bytes(_leaves(replicated.params)["source_embedding/embedding"]) \
      == embedding.nbytes
  total = sum(leaf.nbytes for leaf in _leaves(fsdp).values())
  per_device = sum(sharding.per_device_bytes(leaf) for leaf in _leaves(fsdp).values())
  assert per_device < total / 8 * 1.3, (per_device, total)  # vectors stay whole; they are few


def test_an_axis_the_mesh_does_not_divide_stays_whole():
  mesh = sharding.make_mesh()
  rules = sharding.logical_axis_rules("fsdp")
  assert sharding.partition_spec(["embedding"], (500, 36), mesh, rules) == jax.P(None, None)
  assert sharding.partition_spec(["embedding"], (500, 32), mesh, rules) == jax.P(None, "data")
  assert sharding.partition_spec(["step"], (), mesh, rules) == jax.P()


def test_fsdp_reaches_rnn_matrices_through_the_fallback():
  model_config = RNNConfig(vocab_size=96, cell="gru", embed_dim=32, hidden_dim=48,
                           attention="dot", max_len=16)
  _, _, _, state = _state(model_config, sharding.make_mesh(), "fsdp")
  sharded = [name for name, leaf in _leaves(state.params).items()
             if leaf.ndim >= 2 and "data" in leaf.sharding.spec]
  matrices = [name for name, leaf in _leaves(state.params).items() if leaf.ndim >= 2]
  assert sharded == matrices  # every dimension here is a multiple of 8


@pytest.mark.parametrize("model_name", list(MODELS))
def test_sharded_steps_equal_the_single_device_step(model_name):
  # Losses and gradient norms, not parameters: Adam turns float noise in near-zero
  # gradients into whole learning-rate steps, in one run as in another.
  batch = {"inputs": np.asarray(jax.random.randint(jax.random.key(1), (16, 7), 3, 96)),
           "targets": np.asarray(jax.random.randint(jax.random.key(2), (16, 5), 3, 96))}
  results = {}
  for name, (devices, model_parallelism, parameter_sharding) in {
      "1": (1, 1, "replicated"), "8 fsdp": (8, 1, "fsdp"),
      "4x2 tp+fsdp": (8, 2, "fsdp")}.items():
    mesh = sharding.make_mesh(model_parallelism, jax.devices()[:devices])
    model, optimizer, schedule, state = _state(MODELS[model_name](), mesh, parameter_sharding)
    train_step = step_lib.make_train_step(model, optimizer, schedule, mesh=mesh, state=state)
    for _ in range(2):
      state, metrics = train_step(state, step_lib.shard_batch(batch, mesh), jax.random.key(3))
    results[name] = [float(metrics["loss"]), float(metrics["grad_norm"])]
  reference = results.pop("1")
  for name, values in results.items():
    np.testing.assert_allclose(values, reference, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("parameter_sharding", ["fsdp", "replicated"])
def test_the_batch_stays_split_over_data(parameter_sharding):
  """No program gathers the batch's rows: under FSDP, before the activations were marked
  (layers.partitioning), XLA split the model width instead and all-gathered the tokens,
  the masks and the attention activations (on a TPU: 4x the temporaries)."""
  rows = 40  # a multiple of the 8 devices that no parameter axis equals
  mesh = sharding.make_mesh()
  model, optimizer, schedule, state = _state(_transformer(), mesh, parameter_sharding)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          state)
  rows_sharding = step_lib.batch_sharding(mesh)
  batch = {"inputs": jax.ShapeDtypeStruct((rows, 12), jnp.int32, sharding=rows_sharding),
           "targets": jax.ShapeDtypeStruct((rows, 10), jnp.int32, sharding=rows_sharding)}
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                             sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  train_step = step_lib.make_train_step(model, optimizer, schedule, mesh=mesh, state=abstract)
  text = train_step.lower(abstract, batch, key).compile().as_text()
  gathered = re.findall(r"= (\w+\[[0-9,]*\])\S* all-gather\(", text)
  if parameter_sharding == "fsdp":
    assert gathered  # its parameters, where they are used
  assert not [shape for shape in gathered if re.search(rf"\[{rows}\b", shape)], gathered


def test_configs_that_cannot_be_split_raise_naming_the_field():
  with pytest.raises(ValueError, match="model_parallelism=3 must be >= 1 and divide"):
    sharding.make_mesh(3)
  with pytest.raises(ValueError, match=r"TransformerConfig.num_heads=4 .*model_parallelism=8"):
    sharding.check_model_parallelism(_transformer(), 8)
  with pytest.raises(ValueError, match="RNNConfig has neither"):
    sharding.check_model_parallelism(RNNConfig(vocab_size=96), 2)
  with pytest.raises(ValueError, match="parameter_sharding='zero3'"):
    sharding.state_sharding_fn("zero3")
  sharding.check_model_parallelism(_transformer(), 4)
  with pytest.raises(ValueError, match=r"TransformerConfig.decoder_mlp_dim=100 .*"
                                       r"model_parallelism=8"):
    sharding.check_model_parallelism(_transformer(num_heads=8, decoder_mlp_dim=100), 8)
  with pytest.raises(ValueError, match=r"T5Config.num_heads=4 .*model_parallelism=8"):
    sharding.check_model_parallelism(_t5(), 8)
  sharding.check_model_parallelism(_t5(), 2)


def test_cluster_detection_from_the_environment():
  describes = sharding._describes_cluster
  assert not describes({})
  assert not describes({"TPU_WORKER_HOSTNAMES": "localhost"})  # one host: nothing to join
  assert not describes({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"})
  assert describes({"JAX_COORDINATOR_ADDRESS": "10.0.0.2:1234"})
  assert describes({"TPU_WORKER_HOSTNAMES": "t1k-0,t1k-1"})
  assert describes({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "16"})
  assert describes({"SEQ2SEQ_JAX_DISTRIBUTED": "1"})
  assert sharding.maybe_initialize_distributed({}) is False
  assert sharding.maybe_initialize_distributed(
      {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1", "JAX_NUM_PROCESSES": "1"}) is False
  with pytest.raises(ValueError, match="JAX_PROCESS_ID='first' must be an integer"):
    sharding.maybe_initialize_distributed(
        {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1", "JAX_NUM_PROCESSES": "2",
         "JAX_PROCESS_ID": "first"})


def test_process_local_rows_returns_what_was_fed():
  mesh = sharding.make_mesh()
  rows = np.arange(32, dtype=np.int32).reshape(16, 2)
  array = step_lib.shard_batch({"inputs": rows}, mesh)["inputs"]
  np.testing.assert_array_equal(sharding.process_local_rows(array), rows)
  np.testing.assert_array_equal(sharding.process_local_rows(jnp.asarray(rows)), rows)


# ---- whole runs in subprocesses ---------------------------------------------------------------
def _environment() -> dict[str, str]:
  env = dict(os.environ)
  # Each subprocess sets its own device count; drop the one this process forced.
  env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split()
                              if not flag.startswith("--xla_force_host_platform_device_count"))
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO_ROOT / ".cache" / "jax"))
  env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
  return env


def _popen(command: list, env: dict) -> subprocess.Popen:
  # Output goes to a file, not a pipe: side-by-side runs never block on a full pipe.
  log = tempfile.TemporaryFile("w+")
  process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
  process.log = log
  return process


def _start(devices: int, *args, env=None) -> subprocess.Popen:
  return _popen([sys.executable, str(SCRIPT), str(devices), *map(str, args)],
                env or _environment())


def _start_cli(devices: int, *args) -> subprocess.Popen:
  """``seq2seq-jax ARGS`` (as ``python -m seq2seq_jax.cli``) on ``devices`` host CPU devices."""
  env = _environment()
  env["XLA_FLAGS"] = f"{env['XLA_FLAGS']} --xla_force_host_platform_device_count={devices}".strip()
  env["JAX_PLATFORMS"] = "cpu"
  return _popen([sys.executable, "-m", "seq2seq_jax.cli", *map(str, args)], env)


def _stop(process: subprocess.Popen) -> None:
  if process.poll() is None:
    process.kill()
    process.wait()


def _finish(process: subprocess.Popen, what: str, timeout: float = 600) -> dict:
  try:
    process.wait(timeout=timeout)
    timed_out = False
  except subprocess.TimeoutExpired:
    _stop(process)
    timed_out = True
  process.log.seek(0)
  output = process.log.read()
  process.log.close()
  if timed_out:
    raise AssertionError(f"{what} timed out after {timeout} s:\n{output[-4000:]}")
  assert process.returncode == 0, f"{what} failed:\n{output[-4000:]}"
  results = [line for line in output.splitlines() if line.startswith("RESULT ")]
  return json.loads(results[-1][len("RESULT "):]) if results else {}


def _finish_all(started: list, what: str) -> list[dict]:
  """``_finish`` for the processes of one run; a failed one's partners are stopped, not left."""
  try:
    return [_finish(p, f"{what} (process {i})") for i, p in enumerate(started)]
  finally:
    for process in started:
      _stop(process)
      process.log.close()


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


RUNS = {  # name: (devices per process, processes, extra --set overrides)
    "1 device": (1, 1, []),
    "8 data-parallel": (8, 1, []),
    "8 fsdp": (8, 1, ["train.parameter_sharding=fsdp"]),
    "4x2 tensor-parallel": (8, 1, ["train.model_parallelism=2"]),
    "2 processes x 4 fsdp": (4, 2, ["train.parameter_sharding=fsdp"]),
}


def _train_all(root: pathlib.Path, data_dir: pathlib.Path) -> dict:
  from seq2seq_jax import presets
  from seq2seq_jax.data.tokenizer import train_tokenizer

  common = [f"data.manual_dir={data_dir}", f"data.data_dir={root / 'tfds'}",
            f"train.num_steps={STEPS}", "train.log_every=1", "train.eval_every=0",
            "train.eval_batches=1", "train.eval_bleu_sentences=8",
            f"train.checkpoint_every={STEPS}", "model.dropout_rate=0"]
  config = presets.apply_overrides(presets.get_preset("tiny_transformer"), common)
  # Prepares the tfds data once, and gives every run the same vocabulary.
  tokenizer = train_tokenizer(config.data)

  def start(name):
    devices, count, extra = RUNS[name]
    workdir = root / name.replace(" ", "_")
    workdir.mkdir()
    tokenizer.save(workdir / "tokenizer.model")
    overrides = [arg for override in common + extra for arg in ("--set", override)]
    if count == 1:
      return [_start_cli(devices, "train", "--preset", "tiny_transformer", "--workdir", workdir,
                         "--quiet", *overrides)]
    port, started = _free_port(), []
    for index in range(count):
      env = _environment()
      env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(count),
                 JAX_PROCESS_ID=str(index), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
      started.append(_start(devices, "train", workdir, "tiny_transformer", *overrides, env=env))
    return started

  def finish(name, started):
    results = _finish_all(started, name)
    workdir = root / name.replace(" ", "_")
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {"workdir": str(workdir), "results": results, "metrics": lines,
            "run_info": json.loads((workdir / "run_info.json").read_text())}

  # The two-process run first and alone: its hosts should not wait on each other
  # for long. Then the single-process runs side by side.
  multi = [name for name, (_, count, _) in RUNS.items() if count > 1]
  single = [name for name in RUNS if name not in multi]
  runs, processes = {}, {}
  try:
    for name in multi:
      processes[name] = start(name)
      runs[name] = finish(name, processes[name])
    for name in single:
      processes[name] = start(name)
    for name in single:
      runs[name] = finish(name, processes[name])
  finally:
    for started in processes.values():
      for process in started:
        if process.poll() is None:
          process.kill()
          process.wait()
  return runs


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict:
  """The five runs of ``RUNS``, trained once per test session (shared by xdist workers)."""
  # tests/conftest.py's shared_data: skips locally, fails under CI when the data is missing.
  shared_data = next(plugin.shared_data for plugin in request.config.pluginmanager.get_plugins()
                     if callable(getattr(plugin, "shared_data", None)))
  multi30k_tiny = shared_data("multi30k_tiny")
  uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
  base = (tmp_path_factory.getbasetemp().parent / f"sharding-{uid}" if uid
          else tmp_path_factory.mktemp("sharding"))
  base.mkdir(exist_ok=True)
  with open(base / "lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be training them right now
    done = base / "runs.json"
    if not done.exists():
      (base / "runs").mkdir(exist_ok=True)
      runs = _train_all(base / "runs", multi30k_tiny)
      done.write_text(json.dumps(runs))
    return json.loads(done.read_text())


def _loss_at(run: dict, step: int) -> float:
  line = next(line for line in run["metrics"] if line["step"] == step)
  assert line["log_every"] == 1  # the loss of that step alone, not a window mean
  return line["loss"]


@pytest.mark.slow
def test_same_loss_at_step_20_on_every_mesh(runs):
  losses = {name: _loss_at(run, STEPS) for name, run in runs.items()}
  reference = losses["1 device"]
  report = ", ".join(f"{name}: {loss:.7f} ({abs(loss / reference - 1):.1e})"
                     for name, loss in losses.items())
  print(f"loss at step {STEPS}: {report}")
  for name, loss in losses.items():
    assert abs(loss / reference - 1) < RTOL, report
  # It is a run that learns, so the agreement is not that of untrained models.
  first = _loss_at(runs["1 device"], 1)
  assert reference < first - 0.3, (first, reference)
  meshes = {name: run["run_info"]["sessions"][-1]["mesh"] for name, run in runs.items()}
  assert meshes == {"1 device": {"data": 1, "model": 1},
                    "8 data-parallel": {"data": 8, "model": 1},
                    "8 fsdp": {"data": 8, "model": 1},
                    "4x2 tensor-parallel": {"data": 4, "model": 2},
                    "2 processes x 4 fsdp": {"data": 8, "model": 1}}


@pytest.mark.slow
def test_two_processes_form_one_8_device_run(runs):
  run = runs["2 processes x 4 fsdp"]
  assert [(r["process_index"], r["process_count"], r["device_count"]) for r in run["results"]] \
      == [(0, 2, 8), (1, 2, 8)]
  assert run["run_info"]["sessions"][-1]["process_count"] == 2
  assert len(run["metrics"]) == STEPS  # process 0 alone writes metrics.jsonl
  single = runs["8 data-parallel"]["metrics"][-1]
  for result in run["results"]:  # both processes see the same global metrics
    final = result["metrics"]
    np.testing.assert_allclose(final["loss"], single["loss"], rtol=RTOL)
    np.testing.assert_allclose(final["val_loss"], single["val_loss"], rtol=1e-4)
    assert final["bleu_sentences"] == 8  # each host decoded its rows; BLEU saw them all
  first, second = (result["metrics"] for result in run["results"])
  assert first["bleu"] == second["bleu"] and first["val_loss"] == second["val_loss"]
  data_files = sorted(p.name for p in (pathlib.Path(run["workdir"]) / "checkpoints" / str(STEPS)
                                       / "data").glob("process_*.json"))
  assert data_files == ["process_0-of-2.json", "process_1-of-2.json"]


@pytest.mark.slow
def test_fsdp_splits_the_state_across_processes(runs):
  # train() built the state from config.train.parameter_sharding=fsdp (no hook chose it).
  for result in runs["2 processes x 4 fsdp"]["results"]:
    placement = result["placement"]
    assert placement["largest"].startswith("params/")  # an embedding or the output layer
    assert "'data'" in placement["spec"], placement
    assert placement["device_bytes"] * 8 == placement["bytes"], placement
    assert placement["state_device_bytes"] < placement["state_bytes"] / 8 * 1.5, placement
    print(f"fsdp on 2 x 4 devices: {placement}")


@pytest.mark.slow
def test_checkpoints_restore_onto_other_device_counts_and_meshes(runs):
  # Written sharded over 8 devices (FSDP), read on 1; written on 1, read on 8 as FSDP and 4 x 2.
  eight, one = runs["8 fsdp"], runs["1 device"]
  to_one = _start(1, "evaluate", eight["workdir"], "1x1:replicated")
  to_one = _finish(to_one, "restore 8 -> 1")
  to_eight = _finish(_start(8, "evaluate", one["workdir"], "8x1:fsdp", "4x2:replicated"),
                     "restore 1 -> 8")
  restored = to_one["1x1:replicated"]
  assert restored["devices"] == 1 and restored["step"] == STEPS
  np.testing.assert_allclose(restored["val_loss"], eight["metrics"][-1]["val_loss"], rtol=1e-5)
  for mesh, key, spec in (("8x1:fsdp", "params/source_embedding/embedding", "P(None, 'data')"),
                          ("4x2:replicated", "params/decoder_layers_0/feed_forward/wi/kernel",
                           "P(None, 'model')")):
    restored = to_eight[mesh]
    assert restored["devices"] == 8 and restored["step"] == STEPS
    assert restored["specs"][key] == spec
    np.testing.assert_allclose(restored["val_loss"], one["metrics"][-1]["val_loss"], rtol=1e-5)
