"""grain pipelines: bucket shapes, token budget, one pass per epoch, checkpoints, eval order, shards."""

import dataclasses

import grain
import numpy as np
import pytest

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import builders, pipeline
from seq2seq_jax.types import EOS_ID, PAD_ID

pytestmark = pytest.mark.data  # reads ../shared/data (fails under CI=true when missing)


def _expected_row(tokenizer, text: str, limit: int, length: int) -> np.ndarray:
  row = np.full(length, PAD_ID, np.int32)
  pieces = tokenizer.encode(text)[:limit - 1] + [EOS_ID]
  row[:len(pieces)] = pieces
  return row


def _one_epoch(config, tokenizer, **kwargs):
  dataset, stats = pipeline.make_train_dataset(config, tokenizer, num_epochs=1, **kwargs)
  return [dataset[i] for i in range(len(dataset))], stats


def test_train_batches_over_one_epoch(tiny_config, tiny_tokenizer):
  batches, stats = _one_epoch(tiny_config, tiny_tokenizer, seed=3)
  pairs = builders.load_split(tiny_config, "train")
  source_len, target_len = pipeline.token_lengths(pairs, tiny_tokenizer)
  too_long = (source_len > tiny_config.max_source_len) | (target_len > tiny_config.max_target_len)
  assert stats.num_pairs == 300 and stats.num_filtered == stats.num_too_long == too_long.sum() > 0
  assert stats.batches_per_epoch == len(batches)
  seen = []
  for batch in batches:
    rows, length = batch["inputs"].shape
    assert batch["targets"].shape == (rows, length)
    assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
    assert length in tiny_config.bucket_lengths  # shapes from the fixed bucket set only
    assert rows % tiny_config.batch_multiple == 0
    assert rows == pipeline.bucket_rows(tiny_config, length)
    assert rows * length <= tiny_config.batch_tokens  # the global token budget
    real = batch["index"] >= 0
    np.testing.assert_array_equal(batch["weights"], real.astype(np.float32))
    assert (batch["inputs"][~real] == PAD_ID).all() and (batch["targets"][~real] == PAD_ID).all()
    for row in np.flatnonzero(real):
      source, target = pairs[int(batch["index"][row])]
      # Pieces, EOS, then only PAD; and the row is the pair its index names.
      np.testing.assert_array_equal(batch["inputs"][row], _expected_row(
          tiny_tokenizer, source, tiny_config.max_source_len, length))
      np.testing.assert_array_equal(batch["targets"][row], _expected_row(
          tiny_tokenizer, target, tiny_config.max_target_len, length))
    # The smallest bucket that holds the longest row: no shape larger than needed.
    longest = max(np.max(np.sum(batch[key][real] != PAD_ID, axis=1)) for key in ("inputs", "targets"))
    assert length == min(b for b in tiny_config.bucket_lengths if b >= longest)
    seen.extend(batch["index"][real].tolist())
  assert sorted(seen) == np.flatnonzero(~too_long).tolist()  # every kept pair exactly once


def test_truncate_keeps_every_pair(tiny_config, tiny_tokenizer):
  config = dataclasses.replace(tiny_config, too_long="truncate", max_source_len=16,
                               max_target_len=16)
  batches, stats = _one_epoch(config, tiny_tokenizer)
  assert stats.num_filtered == 0 and stats.num_truncated > 0
  indices = np.concatenate([b["index"] for b in batches])
  assert sorted(indices[indices >= 0].tolist()) == list(range(300))
  for batch in batches:
    assert batch["inputs"].shape[1] <= 16
    full = batch["inputs"][:, -1] != PAD_ID  # truncated rows still end with EOS
    assert (batch["inputs"][full, -1] == EOS_ID).all()


def test_shuffle_is_deterministic_per_seed_and_epoch(tiny_config, tiny_tokenizer):
  def order(seed, epochs=2):
    dataset, stats = pipeline.make_train_dataset(tiny_config, tiny_tokenizer, seed=seed,
                                                 num_epochs=epochs)
    return [tuple(dataset[i]["index"]) for i in range(len(dataset))], stats.batches_per_epoch
  first, per_epoch = order(0)
  assert order(0)[0] == first
  assert first[:per_epoch] != first[per_epoch:]  # a new order every epoch
  assert sorted(first[:per_epoch]) != sorted(first[per_epoch:])  # and new batch contents
  assert order(1)[0][:per_epoch] != first[:per_epoch]
  dataset, _ = pipeline.make_train_dataset(tiny_config, tiny_tokenizer, seed=0)
  assert len(dataset) > 10**9  # num_epochs=None repeats forever
  np.testing.assert_array_equal(dataset[per_epoch + 1]["index"], first[per_epoch + 1])


def test_iterator_restores_exactly_after_a_checkpoint(tiny_config, tiny_tokenizer):
  dataset, stats = pipeline.make_train_dataset(tiny_config, tiny_tokenizer, num_epochs=2)
  grain.experimental.assert_equal_output_after_checkpoint(
      dataset.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=1)))
  assert len(dataset) == 2 * stats.batches_per_epoch


def test_orbax_saves_and_restores_the_iterator(tiny_config, tiny_tokenizer, tmp_path):
  import orbax.checkpoint as ocp
  iterator = pipeline.make_train_iterator(tiny_config, tiny_tokenizer, seed=5)
  for _ in range(7):
    next(iterator)
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(7, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(iterator)))
    manager.wait_until_finished()
  expected = [next(iterator) for _ in range(4)]
  restored = pipeline.make_train_iterator(tiny_config, tiny_tokenizer, seed=5)
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.restore(7, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(restored)))
  for want in expected:
    got = next(restored)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])


def test_hosts_split_every_global_batch(tiny_config, tiny_tokenizer):
  whole, _ = pipeline.make_train_dataset(tiny_config, tiny_tokenizer, seed=2)
  shards = [pipeline.make_train_dataset(tiny_config, tiny_tokenizer, seed=2, shard_index=h,
                                        shard_count=4)[0] for h in range(4)]
  for i in range(3):
    for key in ("inputs", "targets", "index", "weights"):
      np.testing.assert_array_equal(np.concatenate([s[i][key] for s in shards]), whole[i][key])
  with pytest.raises(ValueError, match=r"batch_multiple=8 must be a multiple of shard_count=3"):
    pipeline.make_train_dataset(tiny_config, tiny_tokenizer, shard_index=0, shard_count=3)


def test_eval_batches_keep_file_order(tiny_config, tiny_tokenizer, multi30k_tiny):
  batches = list(pipeline.make_eval_batches(tiny_config, tiny_tokenizer, split="val"))
  assert len(batches) == 4  # 50 pairs in rows of 16: the last batch has 14 padding rows
  index = np.concatenate([b["index"] for b in batches])
  weights = np.concatenate([b["weights"] for b in batches])
  np.testing.assert_array_equal(index[weights == 1], np.arange(50))
  assert (index[weights == 0] == -1).all() and (weights == 0).sum() == 14
  text = pipeline.load_eval_text(tiny_config, "val")
  assert text.sources == (multi30k_tiny / "val.de").read_text().split("\n")[:-1]
  assert text.references == (multi30k_tiny / "val.en").read_text().split("\n")[:-1]
  for batch in batches:
    assert batch["inputs"].shape[0] == tiny_config.eval_batch_size
    assert batch["inputs"].shape[1] in tiny_config.bucket_lengths
    padding = batch["weights"] == 0
    assert (batch["inputs"][padding] == PAD_ID).all() and (batch["targets"][padding] == PAD_ID).all()
    for row in np.flatnonzero(~padding):
      decoded = tiny_tokenizer.decode(batch["targets"][row])
      assert decoded == text.references[batch["index"][row]] or len(
          tiny_tokenizer.encode(decoded)) == tiny_config.max_target_len - 1  # truncated
  halves = [list(pipeline.make_eval_batches(tiny_config, tiny_tokenizer, split="val",
                                            shard_index=h, shard_count=2)) for h in range(2)]
  np.testing.assert_array_equal(
      np.concatenate([np.concatenate([a["index"], b["index"]]) for a, b in zip(*halves)]), index)


def test_config_rejects_a_budget_that_cannot_hold_a_batch():
  with pytest.raises(ValueError, match=r"batch_tokens=256: must hold batch_multiple=8 rows .* 512"):
    DataConfig(batch_tokens=256)
  with pytest.raises(ValueError, match=r"dataset='wmt14'"):
    DataConfig(dataset="wmt14")
  with pytest.raises(ValueError, match=r"manual_dir=''"):
    DataConfig(dataset="parallel_text")
