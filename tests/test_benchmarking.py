"""Tests of the benchmark helpers: FLOP formulas against hand counts and jaxprs, timing, EOS suppression."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax import DecodeConfig, RNNConfig, TransformerConfig, build_model
from seq2seq_jax import benchmarking as bm
from seq2seq_jax.decoding import generate, generate_uncached
from seq2seq_jax.types import EOS_ID, NEG_INF, PAD_ID

# Pairwise-distinct sizes, so a swapped dimension in the formula cannot pass.
B, S, T = 2, 5, 7


def _tiny_transformer(**overrides):
  fields = dict(vocab_size=37, model_dim=12, num_heads=3, mlp_dim=20, num_encoder_layers=2,
                num_decoder_layers=1, max_len=16, dropout_rate=0.0)
  fields.update(overrides)
  config = TransformerConfig(**fields)
  model = build_model(config)
  params = model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32),
                      jnp.ones((1, 3), jnp.int32))["params"]
  return config, model, params


def test_transformer_flops_match_a_hand_count():
  config = TransformerConfig(vocab_size=10, model_dim=4, num_heads=2, mlp_dim=8,
                             num_encoder_layers=1, num_decoder_layers=1)
  # Per source token: encoder 8*16 + 4*2*4 + 4*4*8 = 288, cross K/V 4*16 = 64 -> 2 * 352.
  # Per target token: 8*16 + 4*3*4 + 4*16 + 4*2*4 + 4*4*8 = 400, output 2*4*10 = 80 -> 3 * 480.
  forward = 2 * 352 + 3 * 480
  assert bm.transformer_flops_per_token(config, source_len=2, target_len=3,
                                        training=False) == pytest.approx(forward / 3)
  assert bm.transformer_flops_per_token(config, source_len=2, target_len=3) == pytest.approx(forward)


@pytest.mark.parametrize("norm, tie_output", [("post", True), ("pre", False)])
def test_transformer_flops_match_the_jaxpr(norm, tie_output):
  config, model, params = _tiny_transformer(norm=norm, tie_output=tie_output)
  inputs = jax.ShapeDtypeStruct((B, S), jnp.int32)
  targets = jax.ShapeDtypeStruct((B, T), jnp.int32)
  forward = bm.matmul_flops(lambda p, i, t: model.apply({"params": p}, i, t), params, inputs,
                            targets)
  assert forward / (B * T) == pytest.approx(
      bm.transformer_flops_per_token(config, source_len=S, target_len=T, training=False))
  # Every matmul has two differentiable operands: the backward pass costs two forwards.
  assert bm.train_flops_per_token(model, params, batch_size=B, source_len=S,
                                  target_len=T) == pytest.approx(
      bm.transformer_flops_per_token(config, source_len=S, target_len=T))


def test_matmul_flops_counts_dots_and_scans():
  assert bm.matmul_flops(jnp.dot, jnp.ones((2, 3)), jnp.ones((3, 5))) == 2 * 2 * 3 * 5
  batched = bm.matmul_flops(lambda a, b: jnp.einsum("BTD,BDK->BTK", a, b),
                            jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5)))
  assert batched == 2 * 2 * 3 * 4 * 5

  def scanned(x):
    return jax.lax.scan(lambda c, _: (c @ jnp.ones((4, 4)), None), x, None, length=6)[0]

  assert bm.matmul_flops(scanned, jnp.ones((3, 4))) == 6 * 2 * 3 * 4 * 4
  with pytest.raises(ValueError, match="while_loop"):
    bm.matmul_flops(lambda x: jax.lax.while_loop(lambda c: c[0, 0] < 9, lambda c: c @ c, x),
                    jnp.ones((2, 2)))


def test_rnn_train_flops_scale_with_the_target():
  config = RNNConfig(vocab_size=37, cell="gru", embed_dim=6, hidden_dim=10, bidirectional=True,
                     attention="additive", max_len=64)
  model = build_model(config)
  params = model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32),
                      jnp.ones((1, 3), jnp.int32))["params"]
  short = bm.train_flops_per_token(model, params, batch_size=B, source_len=S, target_len=T)
  longer = bm.train_flops_per_token(model, params, batch_size=B, source_len=2 * S, target_len=T)
  # The output layer alone costs 3 * 2 * hidden * vocab per target token; attention over a
  # longer source adds work per target token.
  assert short > 3 * 2 * 10 * 37
  assert longer > short


def test_matmul_peak_is_a_positive_rate():
  peak = bm.measure_matmul_peak(size=64, repeats=2)
  assert np.isfinite(peak) and peak > 0


def test_time_fn_keeps_the_first_call_apart():
  calls = []

  def fn():
    calls.append(1)
    return jnp.ones(3) * len(calls)

  timing = bm.time_fn(fn, repeats=4, warmup=2)
  assert len(calls) == 6
  assert len(timing.times_s) == 4
  assert timing.min_s <= timing.median_s
  assert set(timing.to_dict()) == {"first_s", "median_s", "min_s", "times_s"}
  with pytest.raises(ValueError):
    bm.time_fn(fn, repeats=0)


def test_time_interleaved_alternates_systems():
  order = []
  timings = bm.time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                rounds=3)
  assert order[:2] == ["a", "b"]  # warmup, one each
  rounds = [order[2:4], order[4:6], order[6:8]]
  assert rounds == [["a", "b"], ["b", "a"], ["a", "b"]]
  assert all(len(t.times_s) == 3 for t in timings.values())


def test_suppress_eos_forces_the_full_length():
  _, model, params = _tiny_transformer()
  wrapped = bm.SuppressEOS(model)
  sources = bm.synthetic_sources(np.random.default_rng(0), num_sentences=3, source_len=S,
                                 vocab_size=37)
  memory = wrapped.apply({"params": {"model": params}}, sources, method="encode")
  cache = wrapped.apply({"params": {"model": params}}, memory, 4, method="init_cache")
  tokens = jnp.full((3,), 1, jnp.int32)
  logits, _ = wrapped.apply({"params": {"model": params}}, memory, tokens, cache, method="decode_step")
  raw, _ = model.apply({"params": params}, memory, tokens, cache, method="decode_step")
  assert np.all(np.asarray(logits[:, EOS_ID]) == NEG_INF)
  np.testing.assert_array_equal(np.delete(np.asarray(logits), EOS_ID, axis=1),
                                np.delete(np.asarray(raw), EOS_ID, axis=1))
  for method in ("greedy", "beam"):
    decode_config = DecodeConfig(method=method, beam_size=2, max_decode_len=9)
    out, _ = generate(wrapped, {"model": params}, sources, decode_config)
    assert out.shape == (3, 9)
    assert not np.any(np.isin(np.asarray(out), [EOS_ID, PAD_ID]))
    reference, _ = generate_uncached(wrapped, {"model": params}, sources, decode_config)
    np.testing.assert_array_equal(out, reference)


def test_synthetic_batch_has_full_rows_ending_in_eos():
  batch = bm.synthetic_batch(np.random.default_rng(1), batch_size=B, source_len=S, target_len=T,
                             vocab_size=37)
  assert batch["inputs"].shape == (B, S) and batch["targets"].shape == (B, T)
  for rows in batch.values():
    assert np.all(rows[:, -1] == EOS_ID)
    assert np.all(rows[:, :-1] >= 4)


def test_quick_mode_reads_the_environment(monkeypatch):
  monkeypatch.setenv(bm.QUICK_ENV, "1")
  assert bm.quick_mode()
  monkeypatch.setenv(bm.QUICK_ENV, "0")
  assert not bm.quick_mode()


def test_table_and_json(tmp_path):
  rows = [{"model": "a", "tokens/s": 1234.5678}, {"model": "bb", "tokens/s": 2.0}]
  table = bm.format_table(rows)
  assert "1235" in table and "bb" in table
  path = bm.write_json(tmp_path / "out" / "r.json", {"rows": rows})
  payload = json.loads(path.read_text())
  assert payload["rows"] == rows
  assert payload["machine"]["backend"] == jax.default_backend()


def test_a_scripts_flags_and_ending(tmp_path, capsys):
  """``argument_parser`` names the JSON after the script; ``report`` writes it and, only when
  --plot is given, draws the rows there."""
  script = tmp_path / "bench" / "my_bench.py"
  parser = bm.argument_parser(str(script), "Times something.\n\nMore words.")
  assert parser.description == "Times something."
  args = parser.parse_args([])
  assert args.out == script.parent / "results" / "my_bench.json" and args.plot is None
  rows = [{"task": "t", "system": "ours", "tokens/s": 10.0},
          {"task": "t", "system": "theirs", "tokens/s": 5.0}]
  drawn = []
  path = bm.report(args, {"benchmark": "my_bench", "rows": rows},
                   plot=lambda rows, path: drawn.append((rows, path)))
  assert json.loads(path.read_text())["rows"] == rows and drawn == []
  args = parser.parse_args(["--out", str(tmp_path / "o.json"), "--plot", str(tmp_path / "o.png")])
  bm.report(args, {"benchmark": "my_bench", "rows": rows})  # plot_rates_by_task by default
  assert (tmp_path / "o.png").stat().st_size > 0
  assert f"wrote {tmp_path / 'o.png'}" in capsys.readouterr().out
