"""``seq2seq-jax translate`` on files: kill -9 and Ctrl-C then resume, two hosts, the output forms.

The subprocess runs use the run folder of conftest.py (an untrained tiny
Transformer) and one host CPU device each, unless a test says otherwise.
"""

import io
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from seq2seq_jax import cli
from seq2seq_jax.inference import Translator
from seq2seq_jax.inference.files import RECORD_SUFFIX

REPO = pathlib.Path(__file__).resolve().parents[2]


def _env(devices: int = 1, **extra) -> dict[str, str]:
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(
      [f for f in env.get("XLA_FLAGS", "").split()
       if not f.startswith("--xla_force_host_platform_device_count")]
      + [f"--xla_force_host_platform_device_count={devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".cache" / "jax"))
  env.update(extra)
  return env


def _command(run_dir, *args) -> list[str]:
  return [sys.executable, "-m", "seq2seq_jax.cli", "translate", "--workdir", str(run_dir),
          "--progress", "lines", *map(str, args)]


def _record(output: pathlib.Path) -> dict:
  try:
    return json.loads(pathlib.Path(str(output) + RECORD_SUFFIX).read_text())
  except (OSError, ValueError):  # not written yet, or being replaced
    return {}


@pytest.fixture(scope="module")
def big_file(tmp_path_factory, multi30k_raw) -> pathlib.Path:
  """The first 20,000 German training sentences of Multi30k, one per line."""
  lines = (multi30k_raw / "train.de").read_text(encoding="utf-8").splitlines()[:20_000]
  assert len(lines) == 20_000
  path = tmp_path_factory.mktemp("big") / "train.de"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


def _start_and_stop(run_dir, big_file, output, stop_signal, after_lines, window):
  """Starts a translation and sends ``stop_signal`` once ``after_lines`` lines are complete."""
  process = subprocess.Popen(_command(run_dir, "--input", big_file, "--output", output,
                                      "--window", window), cwd=REPO, env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 600
  while _record(output).get("lines_done", 0) < after_lines:
    assert process.poll() is None, f"finished before the signal:\n{process.stderr.read()}"
    assert time.time() < deadline, "no progress in 10 minutes"
    time.sleep(0.005)
  process.send_signal(stop_signal)
  _, stderr = process.communicate(timeout=300)
  return process.returncode, stderr


@pytest.mark.slow
def test_kill_9_in_the_middle_of_20k_lines_then_resume_gives_the_same_bytes(run_dir, big_file,
                                                                           tmp_path):
  whole = tmp_path / "whole.en"
  done = subprocess.run(_command(run_dir, "--input", big_file, "--output", whole,
                                 "--window", 1000), cwd=REPO, env=_env(), capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stderr
  assert len(whole.read_text(encoding="utf-8").splitlines()) == 20_000

  resumed = tmp_path / "resumed.en"
  code, stderr = _start_and_stop(run_dir, big_file, resumed, signal.SIGKILL, 4000, 1000)
  assert code == -signal.SIGKILL, stderr
  killed_at = _record(resumed)["lines_done"]
  assert 4000 <= killed_at < 20_000  # killed in the middle, not after the end
  assert whole.read_bytes().startswith(resumed.read_bytes()[:_record(resumed)["output_bytes"]])
  again = subprocess.run(_command(run_dir, "--input", big_file, "--output", resumed,
                                  "--window", 1000), cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr
  assert f"resumed after line {killed_at}" in again.stderr
  assert resumed.read_bytes() == whole.read_bytes()

  # Ctrl-C: a message, status 130, and the same command finishes the file.
  interrupted = tmp_path / "interrupted.en"
  code, stderr = _start_and_stop(run_dir, big_file, interrupted, signal.SIGINT, 2000, 1000)
  assert code == 130, stderr
  assert "Rerun the same command to resume" in stderr
  finish = subprocess.run(_command(run_dir, "--input", big_file, "--output", interrupted,
                                   "--window", 1000), cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=600)
  assert finish.returncode == 0, finish.stderr
  assert interrupted.read_bytes() == whole.read_bytes()
  # other settings are refused, naming them
  refused = subprocess.run(_command(run_dir, "--input", big_file, "--output", interrupted,
                                    "--window", 1000, "--beam-size", 2), cwd=REPO, env=_env(),
                           capture_output=True, text=True, timeout=600)
  assert refused.returncode == 2
  assert "search.beam_size was 4, now 2" in refused.stderr and "--overwrite" in refused.stderr


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


@pytest.mark.slow
def test_two_hosts_write_one_output_equal_to_one_host(run_dir, multi30k_tiny, tmp_path):
  source = tmp_path / "train.de"
  source.write_text((multi30k_tiny / "train.de").read_text(encoding="utf-8"), encoding="utf-8")
  single = tmp_path / "single.en"
  done = subprocess.run(_command(run_dir, "--input", source, "--output", single, "--window",
                                 100, "--beam-size", 2), cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr
  port, processes = _free_port(), []
  for index in range(2):
    log = tempfile.TemporaryFile("w+")
    env = _env(4, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(index), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    processes.append((subprocess.Popen(
        _command(run_dir, "--input", source, "--output", tmp_path / "hosts.en", "--window", 100,
                 "--beam-size", 2), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        text=True), log))
  try:
    outputs = []
    for process, log in processes:
      process.wait(timeout=600)
      log.seek(0)
      outputs.append(log.read())
      assert process.returncode == 0, outputs[-1][-3000:]
  finally:
    for process, log in processes:
      if process.poll() is None:
        process.kill()
        process.wait()
      log.close()
  assert (tmp_path / "hosts.en").read_bytes() == single.read_bytes()
  # One run of 8 devices over two processes; only process 0 reports (and writes).
  assert "on 1 device of 1 process:" in done.stderr
  assert "on 8 devices of 2 processes:" in outputs[0]
  assert "seq2seq-jax translate:" not in outputs[1] and "lines (" not in outputs[1]


def test_stdin_to_stdout_keeps_empty_lines_and_names_long_lines(run_dir, capsys, monkeypatch,
                                                                caplog):
  long = " ".join(["Ein Hund läuft über die grüne Wiese."] * 8)
  # A text stream without a byte buffer, as a notebook's stdin (a real one: test_cli.py).
  monkeypatch.setattr(sys, "stdin", io.StringIO(f"Ein Hund rennt.\n\n{long}\nZwei Männer sitzen.\n"))
  assert cli.main(["translate", "--workdir", str(run_dir), "--progress", "none"]) == 0
  lines = capsys.readouterr().out.split("\n")
  assert len(lines) == 5 and lines[1] == "" and lines[4] == ""
  translator = Translator.from_workdir(run_dir)
  assert lines[:4] == translator.translate(["Ein Hund rennt.", "", long, "Zwei Männer sitzen."])
  # The run trained on sources of 24 tokens; its model takes 48, and so does translate.
  assert "<stdin>: line 3 has" in caplog.text
  assert "truncated to 48 (EOS included), the model's max_len" in caplog.text
  caplog.clear()
  monkeypatch.setattr(sys, "stdin", io.StringIO(f"{long}\n"))
  assert cli.main(["translate", "--workdir", str(run_dir), "--progress", "none",
                   "--max-source-len", "24"]) == 0
  assert capsys.readouterr().out.splitlines() == Translator.from_workdir(
      run_dir, max_source_len=24).translate([long])
  assert ("<stdin>: line 1 has" in caplog.text and "truncated to 24 (EOS included), the "
          "max_source_len given (--max-source-len; the model takes 48)" in caplog.text)


def test_flags_reach_the_file_translation(run_dir, tmp_path, capsys):
  source = tmp_path / "in.de"
  source.write_text("Ein Hund rennt.\nZwei Männer sitzen.\n\n", encoding="utf-8")
  references = tmp_path / "ref.en"
  references.write_text("A dog runs.\nTwo men sit.\n\n", encoding="utf-8")
  base = ["translate", "--workdir", str(run_dir), "--input", str(source), "--progress", "none"]
  assert cli.main(base + ["--output", str(tmp_path / "nbest"), "--n-best", "3",
                          "--beam-size", "4"]) == 0
  nbest = (tmp_path / "nbest").read_text(encoding="utf-8").splitlines()
  assert len(nbest) == 9 and [line.split(" ||| ")[0] for line in nbest] == list("000111222")
  assert cli.main(base + ["--output", str(tmp_path / "scores"), "--scores"]) == 0
  assert all(len(line.split(" ||| ")) == 2 for line in
             (tmp_path / "scores").read_text(encoding="utf-8").splitlines())
  assert cli.main(base + ["--output", str(tmp_path / "forced"), "--score-references",
                          str(references)]) == 0
  forced = [float(x) for x in (tmp_path / "forced").read_text().splitlines()]
  translator = Translator.from_workdir(run_dir)
  np.testing.assert_allclose(forced, translator.score(
      ["Ein Hund rennt.", "Zwei Männer sitzen.", ""], ["A dog runs.", "Two men sit.", ""]),
      rtol=1e-5)
  capsys.readouterr()
  assert cli.main(base + ["--output", str(tmp_path / "forced")]) == 2  # made with references
  assert "references was {" in capsys.readouterr().err
  assert cli.main(base + ["--output", str(tmp_path / "nbest"), "--n-best", "2"]) == 2
  assert "n_best=2 needs beam search" in capsys.readouterr().err


def test_quantize_and_dtype_flags_reach_the_translator_and_the_resume_record(run_dir, tmp_path,
                                                                             capsys):
  source = tmp_path / "in.de"
  source.write_text("Ein Hund rennt.\nZwei Männer sitzen auf einer Bank.\n", encoding="utf-8")
  base = ["translate", "--workdir", str(run_dir), "--input", str(source), "--progress", "none",
          "--beam-size", "1"]
  output = tmp_path / "int8.en"
  assert cli.main(base + ["--output", str(output), "--quantize", "int8", "--dtype",
                          "bfloat16"]) == 0
  translator = Translator.from_workdir(run_dir, quantize="int8", dtype="bfloat16")
  assert translator.quantize == "int8" and translator.model.config.dtype == "bfloat16"
  assert output.read_text(encoding="utf-8").splitlines() == translator.translate(
      ["Ein Hund rennt.", "Zwei Männer sitzen auf einer Bank."], beam_size=1)
  capsys.readouterr()
  # Float outputs must not be appended to an int8 file, nor the other way round.
  assert cli.main(base + ["--output", str(output)]) == 2
  err = capsys.readouterr().err
  assert "model.compute was {'quantize': 'int8', 'dtype': 'bfloat16'}, now None" in err
