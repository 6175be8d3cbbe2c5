"""The Beam pipeline (DirectRunner) writes the ids the local writer writes, and names bad input."""

import dataclasses
import importlib
import logging
import os
import pathlib
import sys

import numpy as np
import pytest

import seq2seq_jax.data
from seq2seq_jax import cli
from seq2seq_jax.data import prepared
from seq2seq_jax.data.text_files import DataError
from tests.data.conftest import (age_folder, folder_bytes, kill_a_prepare, partial_folders,
                                 write_lines)

try:
  from seq2seq_jax.data import beam
  _NO_BEAM = ""
except ImportError as error:  # the beam extra is optional (see pyproject.toml)
  beam, _NO_BEAM = None, str(error)

pytestmark = pytest.mark.data  # reads ../shared/data (fails under CI=true when missing)
# Beam's pins (protobuf < 7) cannot share the main environment with sentencepiece 0.2.3's
# protobuf module, so `make test` runs this file a second time in .venv-beam
# (constraints-beam.txt) with SEQ2SEQ_JAX_BEAM_TESTS=1: there a missing Beam fails, never skips.
if os.environ.get("SEQ2SEQ_JAX_BEAM_TESTS") == "1" and _NO_BEAM:
  raise ImportError(f"SEQ2SEQ_JAX_BEAM_TESTS=1 but the beam extra does not import: {_NO_BEAM}")
needs_beam = pytest.mark.skipif(bool(_NO_BEAM), reason=f"{_NO_BEAM} (run by `make test-beam`)")


def _both(config, tokenizer, root: pathlib.Path, *, records_per_shard: int):
  """The split written by Beam into ``root/beam`` and by ``prepare_ids`` into ``root/local``."""
  beam_config = dataclasses.replace(config, data_dir=str(root / "beam"))
  local_config = dataclasses.replace(config, data_dir=str(root / "local"))
  from_beam = beam.run_prepare(beam_config, tokenizer, records_per_shard=records_per_shard)
  from_local = prepared.prepare_ids(local_config, tokenizer, records_per_shard=records_per_shard)
  # The folder training looks in, and prepare_ids finds it finished (writes nothing).
  assert from_beam.directory == prepared.ids_location(beam_config, tokenizer).directory
  assert (from_beam.directory.relative_to(root / "beam")
          == from_local.directory.relative_to(root / "local"))
  assert prepared.prepare_ids(beam_config, tokenizer).meta["writer"] == "beam"
  assert not list((root / "beam").glob("ids/**/*.partial-*"))  # the temporary folder renamed
  return from_beam, from_local


def _assert_same_ids(from_beam, from_local):
  assert len(from_beam) == len(from_local) > 0
  everything = np.arange(len(from_local))
  np.testing.assert_array_equal(from_beam.flat(everything), from_local.flat(everything))
  order = np.random.default_rng(1).permutation(len(from_local))
  for got, want in zip(from_beam.read(order), from_local.read(order)):
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)
  np.testing.assert_array_equal(from_beam.source_len_N, from_local.source_len_N)
  np.testing.assert_array_equal(from_beam.target_len_N, from_local.target_len_N)
  np.testing.assert_array_equal(from_beam.line_N, from_local.line_N)
  ignore = ("writer", "shard_sizes")
  assert ({k: v for k, v in from_beam.meta.items() if k not in ignore}
          == {k: v for k, v in from_local.meta.items() if k not in ignore})
  assert (from_beam.meta["writer"], from_local.meta["writer"]) == ("beam", "local")


@needs_beam
def test_tfds_split_as_the_local_writer_writes_it(tiny_config, tiny_tokenizer, tmp_path):
  from_beam, from_local = _both(tiny_config, tiny_tokenizer, tmp_path, records_per_shard=128)
  _assert_same_ids(from_beam, from_local)
  assert from_beam.meta["shard_sizes"] == [128, 128, 44]  # one range of the split per shard
  np.testing.assert_array_equal(from_beam.line_N, np.arange(300))
  # A second run finds the folder and starts no pipeline.
  stamp = (from_beam.directory / "meta.json").stat().st_mtime_ns
  config = dataclasses.replace(tiny_config, data_dir=str(tmp_path / "beam"))
  assert beam.run_prepare(config, tiny_tokenizer).directory == from_beam.directory
  assert (from_beam.directory / "meta.json").stat().st_mtime_ns == stamp


@needs_beam
def test_train_files_shards_as_the_local_writer_writes_them(tiny_config, tiny_tokenizer, tmp_path,
                                                            sharded_files, monkeypatch):
  folder, lines = sharded_files
  monkeypatch.setattr(beam, "_CHUNK", 24)  # several chunks per shard: their order is restored
  config = dataclasses.replace(tiny_config, train_files=str(folder / "train-*.{lang}*"))
  from_beam, from_local = _both(config, tiny_tokenizer, tmp_path / "all", records_per_shard=64)
  _assert_same_ids(from_beam, from_local)
  assert from_beam.meta["corpus"].startswith("files/")
  assert from_beam.meta["shard_sizes"] == [64, 56, 64, 16, 64, 36]  # file shards of 120, 80, 100
  np.testing.assert_array_equal(from_beam.line_N, np.arange(300))
  # An empty line dropped: counted, and the lines after it keep their numbers in the split.
  write_lines(folder / "train-2.en", lines["en"][200:240] + [" "] + lines["en"][241:300])
  config = dataclasses.replace(config, empty_lines="drop")
  from_beam, from_local = _both(config, tiny_tokenizer, tmp_path / "drop", records_per_shard=64)
  _assert_same_ids(from_beam, from_local)
  assert len(from_beam) == 299 and from_beam.meta["empty_dropped"] == 1
  assert 240 not in from_beam.line_N and from_beam.line_N[-1] == 299


@needs_beam
def test_bad_input_names_the_file_and_line(tiny_config, tiny_tokenizer, tmp_path, sharded_files):
  folder, lines = sharded_files
  config = dataclasses.replace(tiny_config, train_files=str(folder / "train-*.{lang}*"))

  def run(name, **changes):
    changed = dataclasses.replace(config, data_dir=str(tmp_path / name), **changes)
    try:
      return beam.run_prepare(changed, tiny_tokenizer)
    finally:
      assert not list((tmp_path / name).glob("ids/**/meta.json"))  # nothing finished

  write_lines(folder / "train-2.en", lines["en"][200:299])  # one line short
  with pytest.raises(DataError, match=r"train-2\.en ends after line 99, .*train-2\.de goes on"):
    run("short")
  write_lines(folder / "train-2.en", lines["en"][200:240] + [""] + lines["en"][241:300])
  with pytest.raises(DataError, match=r"train-2\.en: line 41 is empty.*empty_lines='drop'"):
    run("empty")
  write_lines(folder / "train-0.de", [], raw="\n".join(lines["de"][:120]).encode().replace(
      lines["de"][4].encode(), b"Caf\xe9", 1))
  with pytest.raises(DataError, match=r"train-0\.de: line 5, byte \d+: invalid UTF-8"):
    run("utf8", empty_lines="drop")


@needs_beam
@pytest.mark.slow
def test_a_beam_prepare_killed_while_writing_ids_leaves_nothing_behind(tiny_config, tiny_tokenizer,
                                                                       tmp_path, caplog):
  killed = dataclasses.replace(tiny_config, data_dir=str(tmp_path / "killed"))
  kill_a_prepare(killed, tiny_tokenizer, tmp_path, writer="beam", records_per_shard=64, kill_at=3)
  (partial,) = partial_folders(tmp_path / "killed")
  assert partial.name.split(".partial-")[1].startswith("beam-")
  assert list(partial.glob("part-*.array_record")) and not (partial / "meta.json").exists()
  again = beam.run_prepare(killed, tiny_tokenizer, records_per_shard=64)
  assert partial.is_dir()  # its launcher has ended, but workers elsewhere may still write
  age_folder(partial)  # an hour later, nothing in it has changed
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax.data.prepared"):
    assert beam.run_prepare(killed, tiny_tokenizer).directory == again.directory
  assert f"removed {partial}" in caplog.text
  assert not partial_folders(tmp_path / "killed")
  whole = beam.run_prepare(dataclasses.replace(tiny_config, data_dir=str(tmp_path / "whole")),
                           tiny_tokenizer, records_per_shard=64)
  assert folder_bytes(again.directory) == folder_bytes(whole.directory)
  # A killed Beam launcher's folder is removed by a local prepare too.
  killed = dataclasses.replace(tiny_config, data_dir=str(tmp_path / "local"))
  kill_a_prepare(killed, tiny_tokenizer, tmp_path, writer="beam", records_per_shard=64, kill_at=3)
  (partial,) = partial_folders(tmp_path / "local")
  age_folder(partial)
  local = prepared.prepare_ids(killed, tiny_tokenizer, records_per_shard=64)
  assert not partial_folders(tmp_path / "local") and local.meta["writer"] == "local"


@needs_beam
def test_a_shard_lost_while_the_pipeline_runs_fails_by_name_and_publishes_nothing(
    tiny_config, tiny_tokenizer, tmp_path, monkeypatch):
  config = dataclasses.replace(tiny_config, data_dir=str(tmp_path))
  write_shard = prepared.write_shard

  def losing_one(path, *args):  # as another prepare removing the folder's files would
    lengths = write_shard(path, *args)
    if pathlib.Path(path).name == "part-000001-00000.array_record":
      os.remove(path)
    return lengths
  monkeypatch.setattr(prepared, "write_shard", losing_one)
  with pytest.raises(prepared.PreparedDataError,
                     match=r"1 of 3 shards .* missing \(part-000001-00000\.array_record\); "
                           r"nothing was published"):
    beam.run_prepare(config, tiny_tokenizer, records_per_shard=128)
  assert not list(tmp_path.glob("ids/**/meta.json"))
  assert not prepared.ids_location(config, tiny_tokenizer).directory.exists()
  # A worker never makes the launcher's folder again once it is gone.
  with pytest.raises(prepared.PreparedDataError, match=r"gone\.partial-beam-x.*is gone"):
    beam._check_folder(tmp_path / "gone.partial-beam-x")  # pylint: disable=protected-access
  assert not (tmp_path / "gone.partial-beam-x").exists()


@needs_beam
def test_prepare_cli_writes_ids_with_beam(multi30k_tiny, tmp_path, capsys):
  args = ["prepare", "--dataset", "multi30k", "--manual-dir", str(multi30k_tiny), "--data-dir",
          str(tmp_path / "tfds"), "--tokenizer", str(tmp_path / "tokenizer.model"),
          "--vocab-size", "300", "--beam", "--beam-options", "--runner=DirectRunner "
          "--direct_num_workers=1"]
  assert cli.main(args) == 0
  assert "token ids of train: 300 pairs" in capsys.readouterr().out
  (meta,) = (tmp_path / "tfds" / "ids").glob("multi30k/*/*/de-en/train/*/meta.json")
  assert prepared.PreparedIds.open(meta.parent).meta["writer"] == "beam"
  stamp = meta.stat().st_mtime_ns
  assert cli.main(args[:-3]) == 0  # the local path finds Beam's folder and writes nothing
  assert meta.stat().st_mtime_ns == stamp
  assert cli.main(["prepare", "--manual-dir", str(multi30k_tiny), "--data-dir",
                   str(tmp_path / "tfds"), "--beam"]) == 2
  assert "--beam writes token ids: give --tokenizer PATH" in capsys.readouterr().err


def test_without_apache_beam_the_import_names_the_extra(monkeypatch, multi30k_tiny, tmp_path,
                                                        capsys):
  monkeypatch.setitem(sys.modules, "apache_beam", None)  # `import apache_beam` now fails
  monkeypatch.delitem(sys.modules, "seq2seq_jax.data.beam", raising=False)
  monkeypatch.delattr(seq2seq_jax.data, "beam", raising=False)
  with pytest.raises(ImportError, match=r'pip install "seq2seq-jax\[beam\]"'):
    importlib.import_module("seq2seq_jax.data.beam")
  # The command says so in one line (exit 2), not with a traceback.
  assert cli.main(["prepare", "--manual-dir", str(multi30k_tiny), "--data-dir",
                   str(tmp_path / "tfds"), "--tokenizer", str(tmp_path / "tokenizer.model"),
                   "--vocab-size", "300", "--beam"]) == 2
  assert 'error: seq2seq_jax.data.beam needs Apache Beam' in capsys.readouterr().err

