"""Figures of seq2seq_jax.visualization: axes, labels, tick counts, plotted values, errors."""

import json
import math

import jax
import numpy as np
import pytest

from seq2seq_jax import RNNConfig, TransformerConfig, build_model
from seq2seq_jax import visualization as viz
from seq2seq_jax.types import BOS_ID, EOS_ID, PAD_ID

SOURCE = ["ein", "Hund", "läuft", ".", "</s>"]  # S = 5
TARGET = ["a", "dog", "runs"]  # T = 3


def _tick_texts(labels):
  return [label.get_text() for label in labels]


def test_plot_attention_axes_ticks_and_values():
  weights_TS = np.random.default_rng(0).random((3, 5)).astype(np.float32)
  figure = viz.plot_attention(weights_TS, SOURCE, TARGET, title="pair")
  assert isinstance(figure, viz.LibraryFigure)
  ax = figure.axes[0]
  assert len(figure.axes) == 2  # the heatmap and its colour bar
  assert _tick_texts(ax.get_xticklabels()) == SOURCE
  assert _tick_texts(ax.get_yticklabels()) == TARGET
  assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("source", "target", "pair")
  np.testing.assert_array_equal(ax.images[0].get_array(), weights_TS)
  assert ax.images[0].get_clim() == pytest.approx((0.0, weights_TS.max()))


def test_plot_attention_renders_png_without_a_display():
  png = viz.plot_attention(np.eye(3, 5), SOURCE, TARGET)._repr_png_()
  assert png.startswith(b"\x89PNG")


@pytest.mark.parametrize("weights, source, target, match", [
    (np.ones((5, 3)), SOURCE, TARGET, r"\[T=5, S=3\].*3 target tokens .* 5 source tokens"),
    (np.ones((3, 5, 1)), SOURCE, TARGET, r"shaped \[T, S\]; got .* \(3, 5, 1\)"),
    (np.ones((0, 5)), SOURCE, [], "empty"),
    (np.array([["a"]]), None, None, "numeric"),
])
def test_plot_attention_rejects_bad_shapes(weights, source, target, match):
  with pytest.raises(ValueError, match=match):
    viz.plot_attention(weights, source, target)


def test_plot_attention_grid_layers_by_heads():
  weights_LHTS = np.random.default_rng(1).random((2, 4, 3, 5))
  figure = viz.plot_attention_grid(weights_LHTS, SOURCE, TARGET, title="cross")
  assert len(figure.axes) == 8
  for index, ax in enumerate(figure.axes):
    layer, head = divmod(index, 4)
    np.testing.assert_allclose(ax.images[0].get_array(), weights_LHTS[layer, head], rtol=1e-6)
    assert len(ax.get_xticks()) == 5 and len(ax.get_yticks()) == 3
    # x labels only under the bottom row, y labels only left of the first column
    assert _tick_texts(ax.get_xticklabels()) == (SOURCE if layer == 1 else [""] * 5)
    assert _tick_texts(ax.get_yticklabels()) == (TARGET if head == 0 else [""] * 3)
  assert [ax.get_title() for ax in figure.axes[:4]] == [f"head {h}" for h in range(1, 5)]
  assert [figure.axes[i].get_ylabel() for i in (0, 4)] == ["layer 1", "layer 2"]


def test_plot_attention_grid_heads_only_and_errors():
  figure = viz.plot_attention_grid(np.ones((3, 3, 5)), SOURCE, TARGET)
  assert len(figure.axes) == 3
  with pytest.raises(ValueError, match=r"\[H, T, S\] or \[L, H, T, S\]"):
    viz.plot_attention_grid(np.ones((3, 5)), SOURCE, TARGET)
  with pytest.raises(ValueError, match="2 layers x 3 heads but 1 row labels"):
    viz.plot_attention_grid(np.ones((2, 3, 3, 5)), SOURCE, TARGET, row_labels=["only one"])


def test_bleu_by_length_buckets_and_scores():
  sources = ["a b", "a b c d e f g h i j k l", "x y z", "one two three four five six"]
  references = ["the cat sat on the mat", "a dog runs in the park", "two men talk loudly here",
                "a red car is parked"]
  hypotheses = [references[0], "a cat sleeps at home", references[2], references[3]]
  buckets = viz.bleu_by_length(sources, hypotheses, references, edges=(3, 6, 8))
  assert buckets.labels == ["1-3", "4-6", "7-8", "9+"]
  assert buckets.counts == [2, 1, 0, 1]
  assert buckets.bleu[0] == pytest.approx(100.0) and buckets.bleu[1] == pytest.approx(100.0)
  assert math.isnan(buckets.bleu[2])
  assert buckets.bleu[3] < 50.0
  with pytest.raises(ValueError, match="pair up"):
    viz.bleu_by_length(sources, hypotheses[:2], references)
  with pytest.raises(ValueError, match="strictly increasing"):
    viz.bleu_by_length(sources, hypotheses, references, edges=(5, 5))


def test_plot_quality_by_length_plots_the_scores():
  gru = viz.LengthBuckets(labels=["1-10", "11+"], counts=[7, 3], bleu=[20.0, 8.5])
  attention = viz.LengthBuckets(labels=["1-10", "11+"], counts=[7, 3], bleu=[25.0, 22.0])
  figure = viz.plot_quality_by_length({"GRU": gru, "attention": attention})
  ax = figure.axes[0]
  assert [line.get_label() for line in ax.lines] == ["GRU", "attention"]
  np.testing.assert_array_equal(ax.lines[0].get_ydata(), [20.0, 8.5])
  np.testing.assert_array_equal(ax.lines[1].get_ydata(), [25.0, 22.0])
  assert _tick_texts(ax.get_xticklabels()) == ["1-10\n(n=7)", "11+\n(n=3)"]
  assert ax.get_ylabel() == "BLEU" and "source length" in ax.get_xlabel()
  other = viz.LengthBuckets(labels=["1-5", "6+"], counts=[1, 1], bleu=[1.0, 2.0])
  with pytest.raises(ValueError, match="same edges"):
    viz.plot_quality_by_length({"GRU": gru, "other": other})


def test_plot_decoding_comparison_bars():
  figure = viz.plot_decoding_comparison({"greedy": 30.0, "beam 4": 31.5}, title="test")
  ax = figure.axes[0]
  assert [patch.get_height() for patch in ax.patches] == [30.0, 31.5]
  assert _tick_texts(ax.get_xticklabels()) == ["greedy", "beam 4"]
  with pytest.raises(ValueError, match="finite"):
    viz.plot_decoding_comparison({"greedy": float("nan")})


def test_training_curves_from_metrics_jsonl(tmp_path):
  records = [{"step": 10, "loss": 5.0}, {"step": 20, "loss": 4.0, "val_loss": 4.5, "bleu": 3.0},
             {"step": 30, "loss": 3.5}, {"step": 40, "loss": 3.0, "val_loss": 3.9, "bleu": 9.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert viz.read_metrics(tmp_path) == records
  figure = viz.plot_training_curves(tmp_path, metrics=("loss", "bleu", "absent"))
  assert len(figure.axes) == 2
  loss_ax, bleu_ax = figure.axes
  np.testing.assert_array_equal(loss_ax.lines[0].get_xdata(), [10, 20, 30, 40])
  np.testing.assert_array_equal(loss_ax.lines[0].get_ydata(), [5.0, 4.0, 3.5, 3.0])
  np.testing.assert_array_equal(bleu_ax.lines[0].get_ydata(), [3.0, 9.0])
  assert (loss_ax.get_ylabel(), bleu_ax.get_ylabel()) == ("training loss", "validation BLEU")
  two = viz.plot_training_curves({"a": records, "b": records[:2]}, metrics=("loss",))
  assert [line.get_label() for line in two.axes[0].lines] == ["a", "b"]
  with pytest.raises(ValueError, match="no record has any of the metrics"):
    viz.plot_training_curves(records, metrics=("accuracy",))
  with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
    viz.read_metrics(tmp_path / "nowhere")


class _PieceTokenizer:
  """id_to_piece and encode/decode over a fixed table; enough for token_labels and align."""

  pieces = ["<pad>", "<s>", "</s>", "<unk>", "\u2581ein", "\u2581Hund", "s", "\u2581", "."]

  def id_to_piece(self, i):
    return self.pieces[i]

  def encode(self, text):
    return [self.pieces.index(p) for p in text.split()]

  def decode(self, ids):
    return " ".join(self.pieces[i] for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID))


def test_token_labels_strip_word_marks_and_stop_at_eos():
  ids = np.array([4, 5, 6, 7, 8, EOS_ID, PAD_ID, PAD_ID])
  assert viz.token_labels(_PieceTokenizer(), ids) == ["ein", "Hund", "s", "\u2581", ".", "</s>"]
  assert viz.token_labels(_PieceTokenizer(), ids, keep_eos=False)[-1] == "."
  with pytest.raises(ValueError, match=r"one row of ids \[T\]"):
    viz.token_labels(_PieceTokenizer(), ids[None])


class _Translator:
  """The attributes of Translator that align reads, around a real model."""

  def __init__(self, model, params):
    from seq2seq_jax import DecodeConfig
    self.model, self.params, self.tokenizer = model, params, _PieceTokenizer()
    self.decode_config = DecodeConfig(max_decode_len=6)

  def encode(self, sentences):
    return [self.tokenizer.encode(s) + [EOS_ID] for s in sentences]

  def max_decode_len(self, config):
    return config.max_decode_len


@pytest.mark.parametrize("config", [
    RNNConfig(vocab_size=9, cell="gru", embed_dim=4, hidden_dim=6, attention="additive"),
    TransformerConfig(vocab_size=9, model_dim=8, num_heads=2, mlp_dim=12, num_encoder_layers=1,
                      num_decoder_layers=3, max_len=16),
], ids=["rnn", "transformer"])
def test_align_cuts_weights_to_the_real_tokens(config):
  model = build_model(config)
  ids = np.array([[4, 5, 2]], np.int32)
  params = model.init(jax.random.key(0), ids, ids)["params"]
  translator = _Translator(model, params)
  forced = viz.align(translator, "\u2581ein \u2581Hund .", "\u2581Hund s")
  assert forced.source_tokens == ["ein", "Hund", ".", "</s>"]
  assert forced.target_tokens == ["Hund", "s", "</s>"]
  cross = forced.weights["cross"]
  expected = (3, 4) if isinstance(config, RNNConfig) else (3, 2, 3, 4)
  assert cross.shape == expected
  np.testing.assert_allclose(cross.sum(-1), 1.0, rtol=1e-5)  # each target row is a distribution
  # the same weights as a teacher-forced pass over the pair, batch axis removed
  expected_cross = viz.attention_maps(model, params, np.array([[4, 5, 8, 2]]),
                                      np.array([[5, 6, 2]]))["cross"]
  expected_cross = expected_cross[0] if cross.ndim == 2 else expected_cross[:, 0]
  np.testing.assert_allclose(cross, expected_cross, rtol=1e-6)
  translated = viz.align(translator, "\u2581ein \u2581Hund .")  # the model's own output
  assert len(translated.target_tokens) == translated.weights["cross"].shape[-2]
  if "encoder_self" in translated.weights:
    assert translated.weights["encoder_self"].shape == (1, 2, 4, 4)
    T = len(translated.target_tokens)
    assert translated.weights["decoder_self"].shape == (3, 2, T, T)
  with pytest.raises(ValueError, match="non-empty sentence"):
    viz.align(translator, "  ")
