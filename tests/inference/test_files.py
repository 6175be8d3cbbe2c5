"""translate_file against the Translator: same outputs, 1 = 8 devices, n-best, scores, resume, errors."""

import dataclasses
import logging
import re

import jax
import numpy as np
import pytest

from seq2seq_jax.configs import DecodeConfig, TranslateFileConfig
from seq2seq_jax.data.text_files import DataError
from seq2seq_jax.decoding import generate
from seq2seq_jax.inference import ResumeError, TranslationInterrupted, translate_file
from seq2seq_jax.inference.translator import Translator
from seq2seq_jax.training.sharding import make_mesh

from inference.conftest import SOURCE_LIMIT, make_translator

# Small windows and batches: the 43-line file spans 4 windows of several batches each.
SMALL = TranslateFileConfig(window_lines=12, batch_tokens=64, max_rows=8, progress="none")


@pytest.fixture(scope="module")
def one_device(model_and_params, tokenizer) -> Translator:
  return make_translator(model_and_params, tokenizer, mesh=make_mesh(devices=jax.devices()[:1]))


@pytest.fixture(scope="module")
def eight_devices(model_and_params, tokenizer) -> Translator:
  assert len(jax.devices()) == 8  # tests/conftest.py
  return make_translator(model_and_params, tokenizer, mesh=make_mesh())


@pytest.fixture()
def source_file(tmp_path, sentences):
  path = tmp_path / "input.de"
  path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
  return path


def _lines(path):
  return path.read_text(encoding="utf-8").split("\n")[:-1]


def test_file_equals_the_translator_and_keeps_empty_lines(one_device, source_file, sentences,
                                                          tmp_path):
  for method in ("greedy", "beam"):
    out = tmp_path / f"{method}.en"
    result = translate_file(one_device, source_file, out, config=SMALL, method=method)
    assert _lines(out) == one_device.translate(sentences, method=method)
    assert result.lines == result.decoded + 3 == len(sentences)
  assert _lines(out)[10:12] == ["", ""] and all(_lines(out)[:10])


def test_one_and_eight_devices_write_the_same_bytes(one_device, eight_devices, source_file,
                                                    tmp_path):
  for method in ("greedy", "beam", "sample"):
    outputs = []
    for name, translator in (("one", one_device), ("eight", eight_devices)):
      out = tmp_path / f"{name}-{method}.en"
      translate_file(translator, source_file, out, config=SMALL, method=method)
      outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1], method
  # the rows really were split over 8 devices, the parameters copied to each
  assert eight_devices.data_devices == 8 and one_device.data_devices == 1
  leaf = jax.tree.leaves(eight_devices.params)[0]
  assert len(leaf.sharding.device_set) == 8 and leaf.sharding.is_fully_replicated


def test_crlf_bom_and_a_last_line_without_newline(one_device, tmp_path, sentences):
  path = tmp_path / "windows.de"
  path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(sentences[:5]).encode() + b"\r\n"
                   + sentences[5].encode())
  out = tmp_path / "windows.en"
  translate_file(one_device, path, out, config=SMALL)
  assert _lines(out) == one_device.translate(sentences[:6])


def test_n_best_lists_in_moses_form_best_first(one_device, source_file, sentences, tmp_path):
  out = tmp_path / "nbest.txt"
  config = dataclasses.replace(SMALL, n_best=2)
  translate_file(one_device, source_file, out, config=config, beam_size=3)
  lines = _lines(out)
  assert len(lines) == 2 * len(sentences)
  best = one_device.translate(sentences, beam_size=3)
  pattern = re.compile(r"^(\d+) \|\|\| (.*) \|\|\| (-?\d+\.\d{6})$")
  for index, sentence in enumerate(sentences):
    entries = [pattern.match(line) for line in lines[2 * index:2 * index + 2]]
    assert all(entries), lines[2 * index:2 * index + 2]
    assert {int(e.group(1)) for e in entries} == {index}
    assert entries[0].group(2) == best[index]
    scores = [float(e.group(3)) for e in entries]
    assert scores[0] >= scores[1]
  # the scores are generate's n-best scores for the same source ids
  ids = one_device.encode([sentences[0]])[0]
  inputs = np.full((1, SOURCE_LIMIT), one_device.ids.pad_id, np.int32)
  inputs[0, :len(ids)] = ids
  _, scores_BW = generate(one_device.model, one_device.params, inputs,
                          one_device.resolve_decode_config(beam_size=3), n_best=True)
  np.testing.assert_allclose([float(pattern.match(l).group(3)) for l in lines[:2]],
                             np.asarray(scores_BW)[0, :2], atol=2e-6)


def test_scores_are_the_forced_decoding_logprobs_of_the_outputs(one_device, source_file,
                                                                 sentences, tmp_path):
  """The search's scores (beam: times the length penalty) against teacher forcing."""
  for method in ("greedy", "beam"):
    out = tmp_path / f"scores-{method}.txt"
    translate_file(one_device, source_file, out, config=dataclasses.replace(SMALL, scores=True),
                   method=method)
    texts, scores = zip(*(line.rsplit(" ||| ", 1) for line in _lines(out)))
    assert list(texts) == one_device.translate(sentences, method=method)
    # Forced decoding of the very token ids each search produced (detokenizing and
    # encoding again would not always give them back).
    config = one_device.resolve_decode_config(method=method)
    indices = [i for i, s in enumerate(sentences) if s.strip()]
    encoded = one_device.encode([sentences[i] for i in indices])
    plan = one_device.plan([len(ids) for ids in encoded])
    outputs = [None] * len(indices)
    for decoded in one_device.decode_batches(encoded, plan, config):
      for r, j in enumerate(decoded.batch.indices):
        row = decoded.tokens[r].tolist()
        eos = one_device.ids.eos_id
        outputs[j] = row[:row.index(eos) + 1] if eos in row else row
    forced = one_device.score_ids(encoded, outputs)
    np.testing.assert_allclose([float(scores[i]) for i in indices], forced, atol=2e-4)
    assert all(float(scores[i]) == 0.0 for i in range(len(sentences)) if i not in indices)


def test_score_references_equal_translator_score(one_device, eight_devices, source_file,
                                                 sentences, multi30k_tiny, tmp_path):
  references = (multi30k_tiny / "val.en").read_text(encoding="utf-8").splitlines()[:40]
  references = references[:10] + ["A dog.", ""] + references[10:30] + ["x"] + references[30:]
  reference_file = tmp_path / "references.en"
  reference_file.write_text("\n".join(references) + "\n", encoding="utf-8")
  config = dataclasses.replace(SMALL, references=str(reference_file))
  want = one_device.score(sentences, references)
  for translator in (one_device, eight_devices):
    out = tmp_path / "forced.txt"
    translate_file(translator, source_file, out, config=config, overwrite=True)
    np.testing.assert_allclose([float(x) for x in _lines(out)], want, rtol=1e-5, atol=1e-5)
  reference_file.write_text("\n".join(references[:-3]) + "\n", encoding="utf-8")
  with pytest.raises(DataError, match="references.en ends at line 40 but .*input.de goes on"):
    translate_file(one_device, source_file, tmp_path / "short.txt", config=config)


def test_invalid_utf8_names_the_line(one_device, tmp_path, sentences):
  path = tmp_path / "latin1.de"
  path.write_bytes(("\n".join(sentences[:14]) + "\n").encode() + "Käse\n".encode("latin-1"))
  with pytest.raises(DataError, match=r"latin1.de: line 15, byte 2: invalid UTF-8"):
    translate_file(one_device, path, tmp_path / "out.en", config=SMALL)


def test_long_lines_are_truncated_with_a_warning_naming_the_line(one_device, tmp_path,
                                                                  sentences, caplog):
  long = " ".join(["Ein Hund läuft über die grüne Wiese."] * 6)
  path = tmp_path / "long.de"
  path.write_text("\n".join(sentences[:3] + [long] + sentences[3:5]) + "\n", encoding="utf-8")
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax"):
    result = translate_file(one_device, path, tmp_path / "long.en", config=SMALL)
  assert result.truncated >= 1
  assert re.search(rf"long.de: line 4 has \d+ tokens; truncated to {SOURCE_LIMIT} \(EOS "
                   rf"included\), the max_source_len given", caplog.text)
  assert _lines(tmp_path / "long.en")[3] == one_device.translate([long])[0]


class _Interrupt:
  """Raises KeyboardInterrupt at the ``after``-th decoded batch, as Ctrl-C would."""

  def __init__(self, translator, after):
    self.decode_batches, self.after, self.seen = translator.decode_batches, after, 0

  def __call__(self, *args, **kwargs):
    for decoded in self.decode_batches(*args, **kwargs):
      self.seen += 1
      if self.seen == self.after:
        raise KeyboardInterrupt
      yield decoded


@pytest.mark.parametrize("method", ["beam", "sample"])
def test_interrupted_run_resumes_to_the_same_bytes(one_device, source_file, tmp_path,
                                                   monkeypatch, method):
  whole = tmp_path / "whole.en"
  translate_file(one_device, source_file, whole, config=SMALL, method=method)
  out = tmp_path / "resumed.en"
  with monkeypatch.context() as patch:
    patch.setattr(one_device, "decode_batches", _Interrupt(one_device, after=7))
    with pytest.raises(TranslationInterrupted) as interrupted:
      translate_file(one_device, source_file, out, config=SMALL, method=method)
  done = interrupted.value.lines_done
  assert 12 <= done < len(_lines(whole))  # mid-file: past the first window
  assert _lines(out) == _lines(whole)[:done]
  # A kill between writing lines and updating the record leaves bytes past it.
  with open(out, "ab") as stream:
    stream.write(b"half a line")
  result = translate_file(one_device, source_file, out, config=SMALL, method=method)
  assert result.resumed_from == done and result.decoded < 40
  assert out.read_bytes() == whole.read_bytes()
  # finished: a rerun has nothing to do
  assert translate_file(one_device, source_file, out, config=SMALL, method=method).decoded == 0


def test_resume_refuses_other_settings_and_foreign_files(one_device, source_file, tmp_path,
                                                         monkeypatch):
  out = tmp_path / "out.en"
  with monkeypatch.context() as patch:
    patch.setattr(one_device, "decode_batches", _Interrupt(one_device, after=2))
    with pytest.raises(TranslationInterrupted):
      translate_file(one_device, source_file, out, config=SMALL, beam_size=3)
  with pytest.raises(ResumeError, match=r"search.beam_size was 3, now 2.*--overwrite"):
    translate_file(one_device, source_file, out, config=SMALL, beam_size=2)
  with pytest.raises(ResumeError, match=r"batching.window_lines was 12, now 13"):
    translate_file(one_device, source_file, out, beam_size=3,
                   config=dataclasses.replace(SMALL, window_lines=13))
  other = make_translator((one_device.model, jax.tree.map(lambda x: x * 1.5, one_device.params)),
                          one_device.tokenizer)
  with pytest.raises(ResumeError, match=r"model.parameters was"):
    translate_file(other, source_file, out, config=SMALL, beam_size=3)
  with open(source_file, "a", encoding="utf-8") as stream:
    stream.write("Noch ein Satz.\n")
  with pytest.raises(ResumeError, match=r"input.bytes was"):
    translate_file(one_device, source_file, out, config=SMALL, beam_size=3)
  assert translate_file(one_device, source_file, out, config=SMALL, beam_size=3,
                        overwrite=True).resumed_from == 0
  foreign = tmp_path / "foreign.en"
  foreign.write_text("someone's file\n")
  with pytest.raises(ResumeError, match="exists but has no progress record"):
    translate_file(one_device, source_file, foreign, config=SMALL)
  with pytest.raises(ValueError, match="is also the input"):
    translate_file(one_device, source_file, source_file, config=SMALL)
  with pytest.raises(ValueError, match="n_best=2 needs beam search"):
    translate_file(one_device, source_file, tmp_path / "nb.txt",
                   config=dataclasses.replace(SMALL, n_best=2), method="greedy")


def test_plain_progress_lines_report_rates_and_eta(one_device, source_file, tmp_path, capsys):
  config = dataclasses.replace(SMALL, progress="lines", report_every_s=1e-9)
  translate_file(one_device, source_file, tmp_path / "p.en", config=config)
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) >= 4
  done = [int(re.search(r": (\d+)/43 lines", line).group(1)) for line in lines]
  assert done == sorted(done) and any(0 < n < 43 for n in done)  # counts as batches finish
  assert re.fullmatch(r".*input.de: 43/43 lines \(100\.0%\), [\d.,]+ sentences/s, [\d,]+ "
                      r"tokens/s, ETA 0:00:00", lines[-1])


def _steering_files(tmp_path, count):
  """A prefix on every third line, phrases on some others (a tab between two phrases)."""
  prefixes = ["a man" if i % 3 == 0 else "" for i in range(count)]
  phrases = [["dog"] if i % 4 == 1 else ["in the", "water"] if i % 5 == 2 else []
             for i in range(count)]
  prefix_file, phrase_file = tmp_path / "prefixes.en", tmp_path / "phrases.tsv"
  prefix_file.write_text("".join(p + "\n" for p in prefixes), encoding="utf-8")
  phrase_file.write_text("".join("\t".join(row) + "\n" for row in phrases), encoding="utf-8")
  return prefixes, phrases, prefix_file, phrase_file


def test_prefix_and_constraint_files_steer_each_line_and_resume(one_device, eight_devices,
                                                                source_file, sentences,
                                                                tmp_path, monkeypatch):
  prefixes, phrases, prefix_file, phrase_file = _steering_files(tmp_path, len(sentences))
  config = dataclasses.replace(SMALL, prefixes=str(prefix_file), constraints=str(phrase_file))
  whole = tmp_path / "steered.en"
  translate_file(one_device, source_file, whole, config=config, beam_size=3)
  lines = _lines(whole)
  assert lines == one_device.translate(sentences, beam_size=3, target_prefix=prefixes,
                                       constraints=phrases)
  for line, source, prefix, row in zip(lines, sentences, prefixes, phrases):
    if source.strip():
      assert line.startswith(prefix) and all(phrase in line for phrase in row), (line, row)
  translate_file(one_device, source_file, tmp_path / "plain.en", config=SMALL, beam_size=3)
  assert lines != _lines(tmp_path / "plain.en")  # the files changed the outputs
  # 8 devices, and an interrupted run resumed: the same bytes
  eight = tmp_path / "eight.en"
  translate_file(eight_devices, source_file, eight, config=config, beam_size=3)
  assert eight.read_bytes() == whole.read_bytes()
  out = tmp_path / "resumed.en"
  with monkeypatch.context() as patch:
    patch.setattr(one_device, "decode_batches", _Interrupt(one_device, after=5))
    with pytest.raises(TranslationInterrupted):
      translate_file(one_device, source_file, out, config=config, beam_size=3)
  assert translate_file(one_device, source_file, out, config=config, beam_size=3).resumed_from
  assert out.read_bytes() == whole.read_bytes()


def test_prefix_and_constraint_files_errors_name_the_file_and_line(one_device, source_file,
                                                                   sentences, tmp_path):
  _, _, prefix_file, phrase_file = _steering_files(tmp_path, len(sentences))
  short = tmp_path / "short.en"
  short.write_text("a man\n", encoding="utf-8")
  with pytest.raises(DataError, match=r"short.en ends at line 1 but .*input.de goes on.*prefixes"):
    translate_file(one_device, source_file, tmp_path / "a.en", beam_size=3,
                   config=dataclasses.replace(SMALL, prefixes=str(short)))
  long_prefix = tmp_path / "long.en"
  long_prefix.write_text("\n" * 13 + " ".join(["a man"] * 20) + "\n" * (len(sentences) - 13),
                         encoding="utf-8")
  with pytest.raises(ValueError, match=r"long.en: line 14: has \d+ tokens; the output limit"):
    translate_file(one_device, source_file, tmp_path / "b.en", beam_size=3,
                   config=dataclasses.replace(SMALL, prefixes=str(long_prefix)))
  with pytest.raises(ValueError, match="constraints need beam search"):
    translate_file(one_device, source_file, tmp_path / "c.en", method="greedy",
                   config=dataclasses.replace(SMALL, constraints=str(phrase_file)))
  with pytest.raises(ValueError, match="prefixes and constraints steer a search"):
    TranslateFileConfig(references=str(source_file), prefixes=str(prefix_file))
