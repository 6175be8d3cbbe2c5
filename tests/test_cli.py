"""The command line end to end on multi30k_tiny: prepare, train, SIGINT, resume, evaluate, translate."""

import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
import sacrebleu

from seq2seq_jax import cli, evaluation, presets
from seq2seq_jax.cli import flags
from seq2seq_jax.data import sources as data_sources
from seq2seq_jax.training.restore import load_params

REPO = pathlib.Path(__file__).resolve().parents[1]


def _env():
  env = dict(os.environ)
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  env["PYTHONUNBUFFERED"] = "1"
  return env


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, multi30k_tiny):
  """Trains tiny_transformer through the CLI, interrupted by SIGINT and resumed."""
  data = multi30k_tiny
  root = tmp_path_factory.mktemp("cli")
  workdir = root / "run"
  command = [sys.executable, "-m", "seq2seq_jax.cli", "train", "--preset", "tiny_transformer",
             "--workdir", str(workdir), "--set", f"data.manual_dir={data}",
             "--set", f"data.data_dir={root / 'tfds'}", "--set", "train.num_steps=300",
             "--set", "train.log_every=5", "--set", "train.eval_every=150",
             "--set", "train.checkpoint_every=100"]
  first = subprocess.Popen(command, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
  seen = []
  for line in first.stdout:
    seen.append(line)
    if line.startswith("step 20/"):
      first.send_signal(signal.SIGINT)
      break
  rest, _ = first.communicate(timeout=300)
  first_output = "".join(seen) + rest
  assert first.returncode == 130, first_output
  assert "checkpoint saved" in first_output
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert saved and 20 <= saved[-1] < 300, (saved, first_output)
  second = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=600)
  assert second.returncode == 0, second.stdout + second.stderr
  return {"workdir": workdir, "data": data, "interrupted_at": saved[-1],
          "first": first_output, "second": second.stdout}


@pytest.mark.slow
def test_interrupted_training_resumes_and_loses_nothing(tiny_run):
  step = tiny_run["interrupted_at"]
  assert f"Resumed from checkpoint step {step}" in tiny_run["second"]
  assert "trained 300 steps" in tiny_run["second"]
  records = [json.loads(l) for l in (tiny_run["workdir"] / "metrics.jsonl").read_text().splitlines()]
  steps = [r["step"] for r in records]
  assert steps == sorted(set(steps)), "a step was logged twice"
  assert steps[-1] == 300
  # every update is counted exactly once across the two sessions
  assert sum(r["log_every"] for r in records) == 300
  assert records[-1]["loss"] < records[0]["loss"]


@pytest.mark.slow
def test_evaluate_writes_scores_and_json(tiny_run, capsys):
  workdir = tiny_run["workdir"]
  assert cli.main(["evaluate", "--workdir", str(workdir), "--split", "test_2016_flickr",
                   "--beam-size", "2", "--show", "1"]) == 0
  out = capsys.readouterr().out
  assert "BLEU" in out and "chrF" in out and "hypothesis:" in out
  record = json.loads(next((workdir / "eval").glob("eval-test_2016_flickr-*-beam2*.json"))
                      .read_text())
  assert record["sentences"] == 50 and record["decode"]["beam_size"] == 2
  assert record["decode"]["max_source_len"] == 64  # the model's max_len, not data's 48
  assert set(record["scores"]) == {"BLEU", "chrF"}
  hypotheses = pathlib.Path(record["hypotheses_file"]).read_text().splitlines()
  references = (tiny_run["data"] / "test_2016_flickr.en").read_text().splitlines()
  want = sacrebleu.corpus_bleu(hypotheses, [references]).score
  assert record["scores"]["BLEU"]["score"] == pytest.approx(want)
  # several splits, one model load: one record each
  assert cli.main(["evaluate", "--workdir", str(workdir), "--split", "val, test_2016_flickr",
                   "--max-sentences", "4", "--max-source-len", "32"]) == 0
  out = capsys.readouterr().out
  assert "val (de->en, 4 sentences" in out and "test_2016_flickr (de->en, 4 sentences" in out
  for split in ("val", "test_2016_flickr"):
    record = json.loads(next((workdir / "eval").glob(f"eval-{split}-*-greedy.json")).read_text())
    assert record["sentences"] == 4 and record["decode"]["max_source_len"] == 32


@pytest.mark.slow
def test_average_writes_a_run_folder_evaluate_reads(tiny_run, tmp_path, capsys):
  workdir = tiny_run["workdir"]
  out = tmp_path / "averaged"
  assert cli.main(["average", "--workdir", str(workdir), "--last", "2", "--out", str(out)]) == 0
  assert "the mean of the latest 2 checkpoints" in capsys.readouterr().out
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  averaged, _ = load_params(out / "checkpoints")
  last = [load_params(workdir / "checkpoints", step=s)[0] for s in steps[-2:]]
  jax.tree.map(lambda a, b, c: np.testing.assert_allclose(
      a, (np.float64(b) + np.float64(c)) / 2, rtol=1e-6, atol=1e-7), averaged, *last)
  assert cli.main(["evaluate", "--workdir", str(out), "--split", "val", "--max-sentences",
                   "4"]) == 0
  assert f"checkpoint {steps[-1]}" in capsys.readouterr().out
  assert cli.main(["average", "--workdir", str(workdir), "--last", "99"]) == 2
  assert "num_last=99" in capsys.readouterr().err


@pytest.mark.slow
def test_translate_reads_stdin_keeps_empty_lines(tiny_run, capsys, monkeypatch):
  monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund rennt.\n\nZwei Männer sitzen.\n"))
  assert cli.main(["translate", "--workdir", str(tiny_run["workdir"])]) == 0
  lines = capsys.readouterr().out.split("\n")
  assert len(lines) == 4 and lines[3] == ""  # three translations, then the final newline
  assert lines[1] == "" and lines[0] and lines[2]


@pytest.mark.slow
def test_translate_truncates_long_lines_with_a_warning_on_stderr(tiny_run):
  long = " ".join(["Ein Hund läuft über die grüne Wiese."] * 12)
  run = subprocess.run([sys.executable, "-m", "seq2seq_jax.cli", "translate", "--workdir",
                        str(tiny_run["workdir"]), "--beam-size", "2"], input=long + "\nKinder.\n",
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr
  assert len(run.stdout.splitlines()) == 2
  assert "<stdin>: line 1 has" in run.stderr
  assert "truncated to 64 (EOS included), the model's max_len" in run.stderr


def test_unknown_set_field_lists_valid_ones(tmp_path, capsys):
  assert cli.main(["train", "--preset", "tiny_transformer", "--workdir", str(tmp_path),
                   "--set", "train.numsteps=3"]) == 2
  err = capsys.readouterr().err
  assert "unknown field train.numsteps" in err and "num_steps" in err


def test_workdir_without_checkpoint_is_a_clear_error(tmp_path, capsys):
  assert cli.main(["evaluate", "--workdir", str(tmp_path), "--split", "val"]) == 2
  assert "is not a training run's workdir" in capsys.readouterr().err
  (tmp_path / "checkpoints").mkdir()
  assert cli.main(["translate", "--workdir", str(tmp_path)]) == 2
  assert "no checkpoint found" in capsys.readouterr().err


def test_mismatched_line_counts_name_the_file(tmp_path, capsys):
  for name, lines in (("train.de", 3), ("train.en", 2), ("val.de", 1), ("val.en", 1)):
    (tmp_path / name).write_text("".join(f"Satz {i}\n" for i in range(lines)), encoding="utf-8")
  assert cli.main(["prepare", "--dataset", "parallel_text", "--manual-dir", str(tmp_path),
                   "--data-dir", str(tmp_path / "tfds")]) == 2
  err = capsys.readouterr().err
  assert "train.de has 3" in err and "train.en has 2" in err


def test_evaluate_needs_sources_and_references_together(tmp_path, capsys):
  assert cli.main(["evaluate", "--workdir", str(tmp_path), "--sources", "x.de"]) == 2
  assert "--sources and --references go together" in capsys.readouterr().err


# Lowercased "translations": cased sacreBLEU is below 100, the lowercasing conventions are 100.
REFERENCES = ["A dog's ball, in the grass.", "Two men sit on a bench."]
TOKENIZED_REFERENCES = "a dog &apos;s ball , in the grass .\ntwo men sit on a bench .\n"


@pytest.fixture
def echo_evaluate(tmp_path, monkeypatch):
  """``evaluate`` on a local Multi30k copy of one split (raw/ and tok/), with a stand-in
  model whose translation of a sentence is the sentence lowercased."""
  raw, tok = tmp_path / "multi30k" / "raw", tmp_path / "multi30k" / "tok"
  raw.mkdir(parents=True)
  tok.mkdir()
  (tok / "test_2016_flickr.lc.norm.tok.en").write_text(TOKENIZED_REFERENCES, encoding="utf-8")
  config = presets.apply_overrides(presets.get_preset("tiny_transformer"),
                                   [f"data.manual_dir={raw}"])
  translated = []

  def translate(sources, **kwargs):
    translated.extend(sources)
    return [s.lower() for s in sources]

  echo = types.SimpleNamespace(config=config, decode_config=config.decode, step=7,
                               tokenizer=None, translate=translate,
                               max_decode_len=lambda decode: 16, max_source_len=24,
                               quantize="none", model=None)
  monkeypatch.setattr(flags, "translator", lambda args: echo)
  monkeypatch.setattr(data_sources, "load_eval_text", lambda data, split: data_sources.EvalText(
      sources=list(REFERENCES), references=list(REFERENCES)))

  def run(*extra):
    return cli.main(["evaluate", "--workdir", str(tmp_path / "run"), "--split",
                     "test_2016_flickr", *extra])
  return types.SimpleNamespace(run=run, tok=tok, workdir=tmp_path / "run",
                               translated=translated)


def _bleu_lines(out: str) -> dict[str, float]:
  lines = [line.split() for line in out.splitlines() if line.startswith("  BLEU")]
  assert all(words[1].startswith("(") for words in lines), out  # every BLEU names its convention
  return {words[1]: float(words[2]) for words in lines}


@pytest.mark.parametrize("scoring", ["sacrebleu", "tok", "mmt"])
def test_evaluate_scoring_names_each_bleu_convention(echo_evaluate, capsys, scoring):
  extra = [] if scoring == "sacrebleu" else ["--scoring", scoring]
  assert echo_evaluate.run(*extra) == 0
  bleu = _bleu_lines(capsys.readouterr().out)
  assert bleu["(tok)"] == 100.0  # the official tokenized references: printed whenever found
  assert set(bleu) == {f"({scoring})", "(tok)"}
  if scoring == "sacrebleu":
    assert 0 < bleu["(sacrebleu)"] < 100  # cased: "a dog" is not "A dog"
  else:
    assert bleu[f"({scoring})"] == 100.0
  record = json.loads(next((echo_evaluate.workdir / "eval").glob("eval-*.json")).read_text())
  assert record["scoring"] == scoring
  want = {"sacrebleu": "BLEU", "tok": "BLEU-lc.norm.tok", "mmt": "BLEU-mmt"}[scoring]
  assert set(record["scores"]) == {want, "BLEU-lc.norm.tok", "chrF"}


def test_evaluate_scoring_tok_without_its_references_is_an_error(echo_evaluate, capsys):
  (echo_evaluate.tok / "test_2016_flickr.lc.norm.tok.en").unlink()
  assert echo_evaluate.run("--scoring", "tok") == 2
  err = capsys.readouterr().err
  assert "--scoring tok needs the official lowercased, tokenized references" in err
  assert "test_2016_flickr" in err and "--scoring mmt" in err
  assert echo_evaluate.translated == []  # refused before translating anything
  assert echo_evaluate.run("--scoring", "mmt") == 0  # mmt tokenizes the references itself
  assert set(_bleu_lines(capsys.readouterr().out)) == {"(mmt)"}


def test_evaluate_scoring_tok_refuses_sources_files(echo_evaluate, tmp_path, capsys):
  for name in ("x.de", "x.en"):
    (tmp_path / name).write_text("Ein Hund.\n", encoding="utf-8")
  assert echo_evaluate.run("--sources", str(tmp_path / "x.de"), "--references",
                           str(tmp_path / "x.en"), "--scoring", "tok") == 2
  assert "not for --sources files" in capsys.readouterr().err


def test_bleu_of_references_against_themselves_is_100(multi30k_raw):
  references = (multi30k_raw / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
  assert evaluation.corpus_bleu(references, references).score == pytest.approx(100.0)
  tokenized = (multi30k_raw.parent / "tok" / "test_2016_flickr.lc.norm.tok.en").read_text(
      encoding="utf-8").splitlines()
  # The raw references, normalized, lowercased and Moses-tokenized, are the official tok files.
  assert evaluation.moses_tokenized_bleu(references, tokenized, lang="en").score == pytest.approx(100.0)


def test_bleu_equals_sacrebleu_command_line(multi30k_raw, tmp_path):
  references = multi30k_raw / "test_2016_flickr.en"
  lines = references.read_text(encoding="utf-8").splitlines()
  # A real, imperfect hypothesis file: the references with words dropped and swapped.
  hypotheses = [" ".join(l.split()[1:]) if i % 3 == 0 else
                " ".join(reversed(l.split())) if i % 3 == 1 else l for i, l in enumerate(lines)]
  hyp_file = tmp_path / "hyp.en"
  hyp_file.write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
  run = subprocess.run([sys.executable, "-m", "sacrebleu", str(references), "-i", str(hyp_file),
                        "-m", "bleu", "-b"], capture_output=True, text=True, check=True)
  ours = evaluation.corpus_bleu(hypotheses, lines).score
  assert 0 < ours < 100
  assert round(ours, 1) == float(run.stdout.strip())
