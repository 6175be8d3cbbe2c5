"""Token ids prepared once: what is written, that batches equal the text path's, and what is refused."""

import dataclasses
import json
import logging
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import builders, packing, pipeline, prepared, sources
from seq2seq_jax.data import tokenizer as tokenizer_lib
from seq2seq_jax.data.text_files import DataError
from tests.data.conftest import (age_folder, folder_bytes, kill_a_prepare, partial_folders,
                                 write_lines)

pytestmark = pytest.mark.data  # reads ../shared/data (fails under CI=true when missing)


@pytest.fixture
def ids_config(tiny_config, tmp_path) -> DataConfig:
  """The tiny corpus with its ids in a fresh data dir (the text stays in the session's)."""
  builders.prepare_dataset(tiny_config)
  return tiny_config


def _with_data_dir(config, path) -> DataConfig:
  return dataclasses.replace(config, data_dir=str(path))


def test_ids_are_the_tokenizers_and_lengths_in_the_index(ids_config, tiny_tokenizer, tmp_path):
  config = _with_data_dir(ids_config, tmp_path)
  ids = prepared.prepare_ids(config, tiny_tokenizer, records_per_shard=70)  # 5 shards
  pairs = builders.load_split(config, "train")
  assert len(ids) == len(pairs) == 300 and ids.meta["shard_sizes"] == [70, 70, 70, 70, 20]
  assert ids.meta["tokenizer_key"] == prepared.tokenizer_key(tiny_tokenizer)
  assert ids.dtype == np.dtype("<u2")  # 500 ids fit 16 bits
  order = np.random.default_rng(0).permutation(len(pairs))  # across shards, any order
  sources, targets = ids.read(order)
  for i, source, target in zip(order, sources, targets):
    text_source, text_target = pairs[int(i)]
    assert source.tolist() == tiny_tokenizer.encode_source([text_source])[0]
    assert target.tolist() == tiny_tokenizer.encode_target([text_target])[0]
    assert (len(source), len(target)) == (ids.source_len_N[i], ids.target_len_N[i])
  np.testing.assert_array_equal(ids.line_N, np.arange(300))
  # A second call finds the folder and writes nothing.
  stamp = (ids.directory / "meta.json").stat().st_mtime_ns
  again = prepared.prepare_ids(config, tiny_tokenizer)
  assert again.directory == ids.directory
  assert (ids.directory / "meta.json").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("too_long", ["filter", "truncate"])
@pytest.mark.parametrize("shard", [(0, 1), (1, 2)])
def test_batches_from_ids_equal_batches_from_text(ids_config, tiny_tokenizer, tmp_path, too_long,
                                                  shard):
  config = dataclasses.replace(_with_data_dir(ids_config, tmp_path), too_long=too_long)
  prepared.prepare_ids(config, tiny_tokenizer, records_per_shard=64)
  text_config = dataclasses.replace(config, tokenize_once=False)
  kwargs = dict(seed=5, num_epochs=2, shard_index=shard[0], shard_count=shard[1])
  from_text, text_stats = pipeline.make_train_dataset(text_config, tiny_tokenizer, **kwargs)
  from_ids, ids_stats = pipeline.make_train_dataset(config, tiny_tokenizer, **kwargs)
  assert text_stats == ids_stats and len(from_text) == len(from_ids) > 10
  for i in range(len(from_text)):
    expected, got = from_text[i], from_ids[i]
    assert sorted(expected) == sorted(got)
    for key in expected:
      assert expected[key].dtype == got[key].dtype, key
      np.testing.assert_array_equal(expected[key], got[key], err_msg=f"batch {i} {key}")


def test_another_tokenizer_gets_another_folder_and_a_wrong_key_is_refused(
    ids_config, tiny_tokenizer, tmp_path):
  config = _with_data_dir(ids_config, tmp_path)
  first = prepared.prepare_ids(config, tiny_tokenizer)
  other = tokenizer_lib.train_tokenizer(dataclasses.replace(config, vocab_size=300))
  second = prepared.prepare_ids(config, other)
  assert first.directory != second.directory
  assert first.directory.parent == second.directory.parent  # same corpus, split
  # A folder whose meta names another tokenizer is never read as this one's.
  meta = json.loads((second.directory / "meta.json").read_text())
  meta["tokenizer_key"] = "0" * 16
  (second.directory / "meta.json").write_text(json.dumps(meta))
  with pytest.raises(prepared.PreparedDataError, match="written with tokenizer 0000"):
    prepared.prepare_ids(config, other)


def _damaged(config, tokenizer, tmp_path):
  ids = prepared.prepare_ids(_with_data_dir(config, tmp_path), tokenizer, records_per_shard=100)
  return ids, ids.directory / prepared.shard_name(1)


def test_truncated_shard_is_named(ids_config, tiny_tokenizer, tmp_path):
  ids, shard = _damaged(ids_config, tiny_tokenizer, tmp_path)
  data = shard.read_bytes()
  shard.write_bytes(data[:len(data) // 2])
  reopened = prepared.PreparedIds.open(ids.directory)
  reopened.read([0])  # shard 0 is whole
  with pytest.raises(prepared.PreparedDataError, match=r"ids-00001\.array_record.*prepare it again"):
    reopened.read([150])


def test_shard_with_other_records_is_named(ids_config, tiny_tokenizer, tmp_path):
  ids, shard = _damaged(ids_config, tiny_tokenizer, tmp_path)
  # Same number of records, other contents: each record one id short.
  sources, targets = ids.read(np.arange(100, 200))
  prepared.write_shard(shard, sources, [t[:-1] for t in targets], ids.dtype)
  with pytest.raises(prepared.PreparedDataError, match=r"ids-00001\.array_record: record 7 holds"):
    prepared.PreparedIds.open(ids.directory).read([3, 107])
  shard.unlink()
  with pytest.raises(prepared.PreparedDataError, match=r"ids-00001\.array_record is missing"):
    prepared.PreparedIds.open(ids.directory).read([150])


def test_hosts_that_do_not_write_wait_then_name_the_folder(ids_config, tiny_tokenizer, tmp_path):
  config = _with_data_dir(ids_config, tmp_path)
  with pytest.raises(prepared.PreparedDataError, match=r"waited 0 s .*process 0.*seq2seq-jax "
                                                        r"prepare"):
    prepared.prepare_ids(config, tiny_tokenizer, writer=False, wait_s=0.2)
  written = prepared.prepare_ids(config, tiny_tokenizer)
  assert prepared.prepare_ids(config, tiny_tokenizer, writer=False, wait_s=0).directory == \
      written.directory


# --------------------------------------------------------------------- what picks the folder


def test_every_setting_that_changes_the_ids_picks_another_folder(ids_config, tiny_tokenizer,
                                                                  tmp_path, sharded_files):
  folder, _ = sharded_files
  base = _with_data_dir(ids_config, tmp_path)
  other_tokenizer = tokenizer_lib.train_tokenizer(dataclasses.replace(base, vocab_size=300))

  def where(config=base, tokenizer=tiny_tokenizer, **kwargs):
    return prepared.ids_location(config, tokenizer, **kwargs).directory

  folders = {
      "base": where(),
      "tokenizer": where(tokenizer=other_tokenizer),
      "empty_lines": where(dataclasses.replace(base, empty_lines="drop")),
      "direction": where(dataclasses.replace(base, source_lang="en", target_lang="de")),
      "split": where(split="val"),
      "corpus": where(dataclasses.replace(base, train_files=str(folder / "train-*.{lang}*"))),
  }
  assert len(set(folders.values())) == len(folders), folders
  # Settings that only pick, cut or batch the ids keep the folder.
  for change in (dict(num_workers=2), dict(packing=True, too_long="truncate"),
                 dict(max_source_len=16, max_target_len=16), dict(batch_tokens=2048),
                 dict(shuffle_seed=3), dict(tokenize_once=True)):
    assert where(dataclasses.replace(base, **change)) == folders["base"], change


def test_ids_with_dropped_pairs_never_serve_a_run_that_refuses_them(ids_config, tiny_tokenizer,
                                                                    tmp_path, sharded_files):
  folder, lines = sharded_files
  write_lines(folder / "train-2.en", lines["en"][200:240] + [" "] + lines["en"][241:300])
  drop = dataclasses.replace(_with_data_dir(ids_config, tmp_path), empty_lines="drop",
                             train_files=str(folder / "train-*.{lang}*"))
  refuse = dataclasses.replace(drop, empty_lines="refuse")
  dropped = prepared.prepare_ids(drop, tiny_tokenizer)
  assert len(dropped) == 299 and dropped.meta["settings"] == {"empty_lines": "drop"}
  with pytest.raises(DataError, match=r"train-2\.en: line 41 is empty"):
    prepared.prepare_ids(refuse, tiny_tokenizer)
  # A folder moved by hand to where the other setting looks is refused, naming the field.
  shutil.copytree(dropped.directory, prepared.ids_location(refuse, tiny_tokenizer).directory)
  with pytest.raises(prepared.PreparedDataError,
                     match=r"meta\.json was written with DataConfig\.empty_lines='drop', this run "
                           r"has 'refuse': delete .* and prepare it again"):
    prepared.prepare_ids(refuse, tiny_tokenizer)


# ------------------------------------------------------------------- killed and parallel writers


def test_temporary_names_are_unique_to_host_process_and_call():
  first, second = prepared.writer_tag(), prepared.writer_tag()
  assert first != second
  assert first.startswith(f"{socket.gethostname()}-{os.getpid()}-")


@pytest.mark.slow
def test_a_prepare_killed_while_writing_ids_leaves_nothing_behind(ids_config, tiny_tokenizer,
                                                                  tmp_path, sharded_files, caplog):
  folder, _ = sharded_files
  config = dataclasses.replace(ids_config, train_files=str(folder / "train-*.{lang}*"))
  killed = dataclasses.replace(config, data_dir=str(tmp_path / "killed"))
  kill_a_prepare(killed, tiny_tokenizer, tmp_path, writer="local", records_per_shard=64,
                 kill_at=3)
  (partial,) = partial_folders(tmp_path / "killed")
  assert list(partial.glob("ids-*.array_record")) and not (partial / "meta.json").exists()
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax.data.prepared"):
    again = prepared.prepare_ids(killed, tiny_tokenizer, records_per_shard=64)
  assert f"removed {partial}" in caplog.text
  assert not partial_folders(tmp_path / "killed")
  whole = prepared.prepare_ids(dataclasses.replace(config, data_dir=str(tmp_path / "whole")),
                               tiny_tokenizer, records_per_shard=64)
  assert (again.directory.relative_to(tmp_path / "killed")
          == whole.directory.relative_to(tmp_path / "whole"))
  assert folder_bytes(again.directory) == folder_bytes(whole.directory)


def test_a_partial_folder_whose_writer_still_writes_stays(ids_config, tiny_tokenizer, tmp_path):
  config = _with_data_dir(ids_config, tmp_path)
  directory = prepared.ids_location(config, tiny_tokenizer).directory
  with prepared.ids_lock(directory):  # as the launcher of a Beam pipeline starts
    live, writer_lock = prepared.start_partial(directory, "beam-")
  try:
    assert prepared.prepare_ids(config, tiny_tokenizer).directory == directory
    assert live.is_dir()  # a local writer finished beside it, and left it alone
    prepared.prepare_ids(config, tiny_tokenizer)
    assert live.is_dir()
  finally:
    writer_lock.close()  # the launcher ends without publishing
  prepared.prepare_ids(config, tiny_tokenizer)
  assert live.is_dir()  # a Beam pipeline's workers may still write: kept while files change
  age_folder(live)
  prepared.prepare_ids(config, tiny_tokenizer)
  assert not live.exists() and not partial_folders(tmp_path)


def _partial(directory: pathlib.Path, tag: str, *, age_s: float = 0.0) -> pathlib.Path:
  """An unfinished folder of ``directory`` named for writer ``tag``, a shard begun in it,
  its writer lock free (as another host's lock looks on a FUSE mount)."""
  folder = directory.with_name(f"{directory.name}.partial-{tag}")
  folder.mkdir(parents=True)
  (folder / "ids-00000.array_record").write_bytes(b"\0" * 64)
  (folder / "writer.lock").touch()
  if age_s:
    age_folder(folder, age_s)
  return folder


def _ended_pid() -> int:
  child = subprocess.Popen([sys.executable, "-c", "pass"])
  child.wait()
  return child.pid


def test_a_free_lock_alone_never_removes_a_live_writers_folder(tmp_path, caplog):
  directory = tmp_path / "ids" / "multi30k" / "de-en" / "train" / "0123456789abcdef"
  host, quiet = socket.gethostname(), prepared.ABANDONED_AFTER_S
  other_host = _partial(directory, f"other-{host}-4242-0badcafe")  # writing there right now
  this_process = _partial(directory, f"{host}-{os.getpid()}-0badcafe")
  beam_launcher_gone = _partial(directory, f"beam-{host}-{_ended_pid()}-0badcafe")
  old_but_one_file_new = _partial(directory, f"other-{host}-4243-0badcafe", age_s=quiet + 60)
  (old_but_one_file_new / "ids-00001.array_record").write_bytes(b"\0")
  ended = _partial(directory, f"{host}-{_ended_pid()}-0badcafe")
  other_host_quiet = _partial(directory, f"other-{host}-4244-0badcafe", age_s=quiet + 60)
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax.data.prepared"):
    removed = prepared.remove_abandoned(directory)
  assert removed == sorted([ended, other_host_quiet])
  assert all(folder.is_dir() for folder in (other_host, this_process, beam_launcher_gone,
                                            old_but_one_file_new))
  assert f"removed {ended} " in caplog.text and "of this host, has ended" in caplog.text
  assert (f"removed {other_host_quiet} " in caplog.text
          and "more than ABANDONED_AFTER_S=3600) and its writer lock is free" in caplog.text)


def test_a_writer_touches_its_lock_while_it_writes(tmp_path, monkeypatch):
  monkeypatch.setattr(prepared, "HEARTBEAT_S", 0.02)
  directory = tmp_path / "ids" / "0123456789abcdef"
  directory.parent.mkdir(parents=True)
  temporary, writer_lock = prepared.start_partial(directory)
  try:
    age_folder(temporary)
    deadline = time.monotonic() + 10
    while (time.time() - (temporary / "writer.lock").stat().st_mtime > 60
           and time.monotonic() < deadline):
      time.sleep(0.02)
    assert time.time() - (temporary / "writer.lock").stat().st_mtime < 60  # beat since aged
  finally:
    writer_lock.close()
  # Stopped (this process lives on): kept until nothing changed for ABANDONED_AFTER_S.
  time.sleep(0.1)
  assert not prepared.remove_abandoned(directory)
  age_folder(temporary)
  time.sleep(0.1)  # a beat left running would renew it
  assert prepared.remove_abandoned(directory) == [temporary]


# ------------------------------------------------------------------------------ train_files


def test_train_files_give_the_same_ids_as_the_tfds_corpus(ids_config, tiny_tokenizer, tmp_path,
                                                          sharded_files):
  folder, _ = sharded_files
  from_tfds = prepared.prepare_ids(_with_data_dir(ids_config, tmp_path / "a"), tiny_tokenizer)
  config = dataclasses.replace(ids_config, data_dir=str(tmp_path / "b"),
                               train_files=str(folder / "train-*.{lang}*"))
  from_files = prepared.prepare_ids(config, tiny_tokenizer)
  assert from_files.meta["corpus"].startswith("files/") and len(from_files) == 300
  everything = np.arange(300)
  np.testing.assert_array_equal(from_tfds.flat(everything), from_files.flat(everything))
  np.testing.assert_array_equal(from_tfds.line_N, from_files.line_N)


def test_every_pair_read_is_counted_kept_or_dropped(ids_config, tiny_tokenizer, tmp_path,
                                                     sharded_files, monkeypatch):
  """A pass over the text reports the pairs it dropped in its chunks, those after the last pair
  kept in a last chunk without pairs: the ids' meta.json counts every line read."""
  folder, lines = sharded_files
  monkeypatch.setattr(sources, "_CHUNK", 33)  # chunks end inside the shards
  write_lines(folder / "train-0.en", lines["en"][:60] + [""] + lines["en"][61:120])
  write_lines(folder / "train-2.de", lines["de"][200:299] + [" "])  # the split's last line
  config = dataclasses.replace(_with_data_dir(ids_config, tmp_path), empty_lines="drop",
                               train_files=str(folder / "train-*.{lang}*"))
  chunks = list(sources.resolve(config))
  assert [len(chunk.sources) for chunk in chunks] == [33, 33, 33, 20, 33, 33, 14, 33, 33, 33, 0]
  assert [chunk.dropped for chunk in chunks if chunk.dropped] == [1, 1]
  assert chunks[-1].dropped == 1 and not len(chunks[-1].lines_C)
  ids = prepared.prepare_ids(config, tiny_tokenizer)
  assert len(ids) == 298 and (ids.meta["lines_read"], ids.meta["empty_dropped"]) == (300, 2)
  assert 60 not in ids.line_N and ids.line_N[-1] == 298


def test_train_files_bad_input_is_named(ids_config, tiny_tokenizer, tmp_path, sharded_files):
  folder, lines = sharded_files
  config = dataclasses.replace(_with_data_dir(ids_config, tmp_path),
                               train_files=str(folder / "train-*.{lang}*"))

  def prepare(**changes):
    return prepared.prepare_ids(dataclasses.replace(config, **changes), tiny_tokenizer)

  write_lines(folder / "train-2.en", lines["en"][200:299])  # one line short
  with pytest.raises(DataError, match=r"train-2\.en ends after line 99, .*train-2\.de goes on"):
    prepare()
  write_lines(folder / "train-2.en", lines["en"][200:240] + [" "] + lines["en"][241:300])
  with pytest.raises(DataError, match=r"train-2\.en: line 41 is empty.*empty_lines='drop'"):
    prepare()
  dropped = prepare(empty_lines="drop")
  assert len(dropped) == 299 and dropped.meta["empty_dropped"] == 1
  assert 240 not in dropped.line_N and dropped.line_N[-1] == 299  # lines of the split kept
  write_lines(folder / "train-0.de", [], raw="\n".join(lines["de"][:120]).encode().replace(
      lines["de"][4].encode(), b"Caf\xe9", 1))
  with pytest.raises(DataError, match=r"train-0\.de: line 5, byte \d+: invalid UTF-8"):
    prepare(data_dir=str(tmp_path / "c"))
  (folder / "train-1.de.gz").unlink()
  with pytest.raises(DataError, match=r"train-1\.en\.gz has no partner .*train-1\.de\.gz"):
    prepare(data_dir=str(tmp_path / "d"))
  with pytest.raises(DataError, match="matches no file"):
    prepare(train_files=str(folder / "nothing-*.{lang}"))


def test_a_tokenizer_trains_on_train_files(ids_config, tmp_path, sharded_files):
  folder, _ = sharded_files
  config = dataclasses.replace(ids_config, train_files=str(folder / "train-*.{lang}*"),
                               vocab_size=300)
  from_files = tokenizer_lib.train_tokenizer(config)
  from_tfds = tokenizer_lib.train_tokenizer(dataclasses.replace(config, train_files=""))
  assert from_files == from_tfds  # the same 300 pairs in the same order


# ----------------------------------------------------------------------------------- packing


def test_pack_rows_holds_every_pair_once_within_the_row():
  rng = np.random.default_rng(0)
  source = rng.integers(1, 40, 5000)
  target = np.clip(source + rng.integers(-5, 6, 5000), 1, 40)
  pairs, starts = pipeline.pack_rows(source, target, 64)
  assert sorted(pairs.tolist()) == list(range(5000))
  for r in range(len(starts) - 1):
    row = pairs[starts[r]:starts[r + 1]]
    assert len(row) and source[row].sum() <= 64 and target[row].sum() <= 64
  padding = 1 - (source.sum() + target.sum()) / (2 * 64 * (len(starts) - 1))
  assert padding < 0.05


def test_packed_batches_hold_each_pair_once_with_segments(ids_config, tiny_tokenizer, tmp_path):
  config = dataclasses.replace(_with_data_dir(ids_config, tmp_path), packing=True,
                               too_long="truncate", batch_tokens=512)
  dataset, stats = pipeline.make_train_dataset(config, tiny_tokenizer, seed=1, num_epochs=1)
  ids = prepared.prepare_ids(config, tiny_tokenizer)
  by_source = {}
  sources, targets = ids.read(np.arange(len(ids)))
  for i, (s, t) in enumerate(zip(sources, targets)):
    limit = config.max_source_len
    s = s if len(s) <= limit else np.r_[s[:limit - 1], s[-1:]]
    t = t if len(t) <= limit else np.r_[t[:limit - 1], t[-1:]]
    by_source.setdefault((tuple(s), tuple(t)), []).append(i)
  seen, real = 0, 0
  for i in range(len(dataset)):
    batch = dataset[i]
    assert "index" not in batch and batch["inputs"].shape == (16, 32)
    for row in range(16):
      segments = batch["inputs_segment_ids"][row]
      assert (segments == 0).sum() == (batch["inputs"][row] == 0).sum()
      for k in range(1, segments.max() + 1):
        s_cols = np.flatnonzero(segments == k)
        t_cols = np.flatnonzero(batch["targets_segment_ids"][row] == k)
        assert len(t_cols)  # each segment has both sides
        np.testing.assert_array_equal(batch["inputs_positions"][row, s_cols], np.arange(len(s_cols)))
        np.testing.assert_array_equal(batch["targets_positions"][row, t_cols],
                                      np.arange(len(t_cols)))
        key = (tuple(batch["inputs"][row, s_cols]), tuple(batch["targets"][row, t_cols]))
        assert by_source[key], "a pair appears more often than the corpus holds it"
        by_source[key].pop()
        seen += 1
      real += int(segments.max() > 0)
    assert batch["weights"].sum() == (batch["inputs_segment_ids"].max(axis=1) > 0).sum()
  assert seen == 300 and not any(by_source.values())  # every pair exactly once
  assert stats.padding_fraction == pytest.approx(
      1 - stats.num_tokens / (len(dataset) * 16 * 32 * 2))


def test_packed_rows_split_over_hosts(ids_config, tiny_tokenizer, tmp_path):
  config = dataclasses.replace(_with_data_dir(ids_config, tmp_path), packing=True,
                               too_long="truncate")
  whole, _ = pipeline.make_train_dataset(config, tiny_tokenizer, seed=2, num_epochs=1)
  halves = [pipeline.make_train_dataset(config, tiny_tokenizer, seed=2, num_epochs=1,
                                        shard_index=h, shard_count=2)[0] for h in (0, 1)]
  for i in range(len(whole)):
    for key, value in whole[i].items():
      np.testing.assert_array_equal(value, np.concatenate([halves[0][i][key], halves[1][i][key]]))


# ----------------------------------------------------------------------------------- workers


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True])
def test_workers_give_the_same_batches_and_restore_mid_epoch_with_any_count(ids_config, tiny_tokenizer, tmp_path,
                                                             packing):
  config = dataclasses.replace(_with_data_dir(ids_config, tmp_path), packing=packing,
                               too_long="truncate", batch_tokens=512)
  prepared.prepare_ids(config, tiny_tokenizer)
  reference = pipeline.make_train_iterator(config, tiny_tokenizer, seed=4)
  expected = [next(reference) for _ in range(30)]  # over two epochs
  for workers in (1, 3):
    config_w = dataclasses.replace(config, num_workers=workers)
    iterator = pipeline.make_train_iterator(config_w, tiny_tokenizer, seed=4)
    got = [next(iterator) for _ in range(11)]
    state = iterator.get_state()
    del iterator
    # The state holds the batch number alone: a run may resume with another worker count.
    assert state == {"next_batch": 11}
    other = dataclasses.replace(config, num_workers={1: 2, 3: 0}[workers])
    restored = pipeline.make_train_iterator(other, tiny_tokenizer, seed=4)
    restored.set_state(state)
    got += [next(restored) for _ in range(19)]
    for i, (want, have) in enumerate(zip(expected, got)):
      for key in want:
        np.testing.assert_array_equal(want[key], have[key], err_msg=f"{workers} workers, "
                                                                    f"batch {i}, {key}")


# ------------------------------------------------------------------------------- packing cache


def _packed_config(config, tmp_path):
  return dataclasses.replace(_with_data_dir(config, tmp_path), packing=True, too_long="truncate")


def _one_epoch(config, tokenizer):
  dataset, _ = pipeline.make_train_dataset(config, tokenizer, seed=1, num_epochs=1)
  return [dataset[i] for i in range(len(dataset))]


def _assert_same_batches(got, want):
  assert len(got) == len(want)
  for i, (a, b) in enumerate(zip(got, want)):
    for key in b:
      np.testing.assert_array_equal(a[key], b[key], err_msg=f"batch {i} {key}")


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "foreign", "rows"])
def test_a_damaged_or_foreign_packing_cache_is_packed_again(ids_config, tiny_tokenizer, tmp_path,
                                                           damage, caplog, monkeypatch):
  config = _packed_config(ids_config, tmp_path)
  expected = _one_epoch(config, tiny_tokenizer)
  directory = prepared.prepare_ids(config, tiny_tokenizer).directory
  (cache,) = directory.glob("packing-*.npz")
  data = cache.read_bytes()
  if damage == "truncated":
    cache.write_bytes(data[:len(data) // 2])
  elif damage == "corrupt":  # one byte of the stored rows: the zip's CRC no longer matches
    at = data.index(b"\x93NUMPY") + 200
    cache.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:])
  elif damage == "foreign":  # the rows of other lengths (shorter limits), under this name
    _one_epoch(dataclasses.replace(config, max_source_len=16, max_target_len=16,
                                   bucket_lengths=(16, 32)), tiny_tokenizer)
    (other,) = set(directory.glob("packing-*.npz")) - {cache}
    shutil.copyfile(other, cache)
  else:  # this cache's digest, but a pair in two rows
    with np.load(cache) as cached:
      pairs, row_starts, digest = cached["pairs"], cached["row_starts"], cached["digest"]
    pairs[1] = pairs[0]
    np.savez(cache, pairs=pairs, row_starts=row_starts, digest=digest)
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax.data.packing"):
    again = _one_epoch(config, tiny_tokenizer)
  assert f"packing cache {cache} is" in caplog.text
  assert {"truncated": "unreadable", "corrupt": "unreadable", "foreign": "of other pairs",
          "rows": "damaged"}[damage] in caplog.text
  _assert_same_batches(again, expected)
  # The file was replaced: the next start reads it and packs nothing.
  monkeypatch.setattr(packing, "pack_rows", lambda *a: pytest.fail("packed again"))
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax.data.packing"):
    _assert_same_batches(_one_epoch(config, tiny_tokenizer), expected)
  assert "packing cache" not in caplog.text
  assert sorted(p.name for p in directory.iterdir() if "partial" in p.name) == []


def test_the_packing_cache_is_written_under_a_name_of_its_host_and_process(
    ids_config, tiny_tokenizer, tmp_path, monkeypatch):
  written = []
  savez = np.savez
  monkeypatch.setattr(np, "savez", lambda path, **arrays: written.append(path) or savez(path, **arrays))
  _one_epoch(_packed_config(ids_config, tmp_path), tiny_tokenizer)
  (path,) = written
  assert f".{socket.gethostname()}-{os.getpid()}-" in path.name and path.name.endswith(".partial.npz")
  assert not path.exists()  # renamed into place
