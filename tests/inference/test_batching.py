"""plan_batches: every sentence once, in a bucket that holds it, few shapes, rows as asked."""

import numpy as np
import pytest

from seq2seq_jax.inference.batching import (pad_batch, padded_rows, plan_batches,
                                            rows_for_length, truncate_rows)


def test_every_sentence_once_in_the_shortest_bucket_that_holds_it():
  lengths = np.random.default_rng(0).integers(1, 41, size=300).tolist()
  plan = plan_batches(lengths, bucket_lengths=(10, 20, 40), max_rows=16, batch_tokens=200,
                      row_multiple=4)
  seen = sorted(i for batch in plan for i in batch.indices)
  assert seen == list(range(300))
  for batch in plan:
    assert all(lengths[i] <= batch.length for i in batch.indices)
    shorter = [b for b in (10, 20, 40) if b < batch.length]
    assert all(lengths[i] > shorter[-1] for i in batch.indices) if shorter else True
    assert batch.rows % 4 == 0 and len(batch.indices) <= batch.rows
    assert batch.rows * batch.length <= max(200, 4 * batch.length)  # the budget, or one quantum
    # longest first within a batch
    assert [lengths[i] for i in batch.indices] == sorted((lengths[i] for i in batch.indices),
                                                         reverse=True)
  shapes = {(b.rows, b.length) for b in plan}
  assert len(shapes) <= 9, shapes  # full batches plus a few power-of-two tails per bucket


def test_full_batch_rows_follow_the_token_budget():
  assert rows_for_length(16, max_rows=256, batch_tokens=1000, row_multiple=8) == 56
  assert rows_for_length(64, max_rows=256, batch_tokens=1000, row_multiple=8) == 8  # 15 -> 8
  assert rows_for_length(512, max_rows=256, batch_tokens=1000, row_multiple=8) == 8  # floor
  assert rows_for_length(16, max_rows=20, batch_tokens=None, row_multiple=1) == 20
  assert [padded_rows(n, 56, 8) for n in (1, 8, 9, 17, 33, 56)] == [8, 8, 16, 32, 56, 56]


def test_plan_is_deterministic_and_keeps_ties_in_input_order():
  lengths = [5, 3, 5, 5, 3]
  plan = plan_batches(lengths, bucket_lengths=(8,), max_rows=3)
  assert [b.indices for b in plan] == [(0, 2, 3), (1, 4)]
  assert plan == plan_batches(lengths, bucket_lengths=(8,), max_rows=3)
  with pytest.raises(ValueError, match="longer than the longest bucket 8"):
    plan_batches([9], bucket_lengths=(8,), max_rows=3)


def test_padding_rows_are_empty_sentences():
  batch = pad_batch([[5, 6, 2], [7, 2]], length=4, count=3, pad_id=0, eos_id=2)
  np.testing.assert_array_equal(batch, [[5, 6, 2, 0], [7, 2, 0, 0], [2, 0, 0, 0]])


def test_truncation_keeps_eos_and_names_the_number():
  told = []
  rows = truncate_rows([[4, 5, 6, 7, 2], [4, 2]], 3, numbers=[11, 12],
                       on_truncate=lambda *args: told.append(args))
  assert rows == [[4, 5, 2], [4, 2]] and told == [(11, 5, 3)]


def test_full_tails_give_one_shape_per_bucket():
  lengths = np.random.default_rng(1).integers(1, 33, size=500).tolist()
  plan = plan_batches(lengths, bucket_lengths=(16, 32), max_rows=64, batch_tokens=512,
                      row_multiple=8, full_tails=True)
  assert {(b.rows, b.length) for b in plan} == {(32, 16), (16, 32)}
  assert sorted(i for b in plan for i in b.indices) == list(range(500))
  tails = plan_batches(lengths, bucket_lengths=(16, 32), max_rows=64, batch_tokens=512,
                       row_multiple=8)
  assert [b.indices for b in tails] == [b.indices for b in plan]  # same batches, less padding
