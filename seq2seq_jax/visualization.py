"""Pictures of what a model learned: attention heatmaps, quality by source length, training curves.

Every ``plot_*`` function returns a ``matplotlib.figure.Figure`` built without
``pyplot``: no global figure state, no display or GUI backend needed (figures
render with Agg), and a notebook shows the figure when it is the last value of a
cell or passed to ``display``. Save one with ``figure.savefig(path)``.

Example:
  >>> from seq2seq_jax import Translator
  >>> translator = Translator.from_workdir("runs/tiny")  # a run that ``train`` wrote
  >>> alignment = align(translator, "Ein Hund läuft über eine Wiese.")
  >>> alignment.weights["cross"].shape  # a Transformer's: [L, H, T, S]
  (1, 2, 32, 12)
  >>> figure = plot_attention_grid(alignment.weights["cross"], alignment.source_tokens,
  ...                              alignment.target_tokens, title=alignment.translation)
  >>> figure.savefig("alignment.png")
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from seq2seq_jax import evaluation
from seq2seq_jax.types import BOS_ID, EOS_ID, PAD_ID

__all__ = [
    "Alignment",
    "LengthBuckets",
    "LibraryFigure",
    "align",
    "attention_maps",
    "bleu_by_length",
    "plot_attention",
    "plot_attention_grid",
    "plot_decoding_comparison",
    "plot_quality_by_length",
    "plot_training_curves",
    "read_metrics",
    "token_labels",
]

_WORD_START = "\u2581"  # sentencepiece's word-boundary mark


class LibraryFigure(Figure):
  """A ``Figure`` that renders itself as PNG in IPython, Jupyter and Colab.

  The PNG is produced by Agg through ``savefig``, so no interactive backend is
  involved. ``display_dpi`` sets the resolution of that inline picture.
  """

  display_dpi: float = 100.0

  def _repr_png_(self) -> bytes:
    buffer = io.BytesIO()
    self.savefig(buffer, format="png", dpi=self.display_dpi, bbox_inches="tight")
    return buffer.getvalue()


def _new_figure(width: float, height: float) -> LibraryFigure:
  figure = LibraryFigure(figsize=(width, height), layout="constrained")
  FigureCanvasAgg(figure)  # attaches itself: renders without any GUI backend or display
  return figure


# ----------------------------------------------------------------------------- tokens and weights

def token_labels(tokenizer: Any, ids: Sequence[int] | np.ndarray, *,
                 keep_eos: bool = True) -> list[str]:
  """Readable labels of a row of token ids, for heatmap ticks.

  Stops at the first PAD (after EOS when ``keep_eos``), drops BOS, shows EOS as
  ``</s>`` and strips sentencepiece's word mark ``▁`` (a piece that is only the
  mark stays visible as ``▁``).

  Args:
    tokenizer: anything with ``id_to_piece(int) -> str`` (the library's ``Tokenizer``).
    ids: 1-D int ids, e.g. one row of ``inputs_BS``.
    keep_eos: label the EOS position too (models attend to it).
  """
  ids = np.asarray(ids)
  if ids.ndim != 1:
    raise ValueError(f"token_labels takes one row of ids [T]; got shape {ids.shape}")
  labels = []
  for i in ids.tolist():
    if i == PAD_ID:
      break
    if i == BOS_ID:
      continue
    if i == EOS_ID:
      if keep_eos:
        labels.append("</s>")
      break
    piece = tokenizer.id_to_piece(int(i))
    labels.append(piece.replace(_WORD_START, "") or _WORD_START)
  return labels


def attention_maps(model: Any, params: Any, inputs_BS: Any, targets_BT: Any) -> dict[str, np.ndarray]:
  """Teacher-forced attention weights of an encoder-decoder model, as NumPy arrays.

  Runs ``model.apply(..., return_attention=True)`` (the model contract) with
  dropout off.

  Args:
    model: an encoder-decoder following the model contract, with attention.
    params: its parameters.
    inputs_BS: int source ids, PAD after EOS.
    targets_BT: int target ids (the decoder reads them shifted right behind BOS).

  Returns:
    The model's attention dict: ``{"cross": [B, T, S]}`` for an RNN with attention;
    ``{"encoder_self": [L, B, H, S, S], "decoder_self": [L, B, H, T, T], "cross":
    [L, B, H, T, S]}`` for the Transformer.
  """
  inputs_BS, targets_BT = np.asarray(inputs_BS), np.asarray(targets_BT)
  for name, ids in (("inputs_BS", inputs_BS), ("targets_BT", targets_BT)):
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"{name} must be integer ids [B, length]; got {ids.dtype} {ids.shape}")
  if inputs_BS.shape[0] != targets_BT.shape[0]:
    raise ValueError(f"inputs_BS has {inputs_BS.shape[0]} rows but targets_BT has "
                     f"{targets_BT.shape[0]}")
  _, attention = model.apply({"params": params}, inputs_BS.astype(np.int32),
                             targets_BT.astype(np.int32), deterministic=True,
                             return_attention=True)
  return {name: np.asarray(weights, dtype=np.float32) for name, weights in attention.items()}


def _row(weights: np.ndarray, row: int) -> np.ndarray:
  """Batch row ``row`` of an attention array: batch is axis 0 of [B, T, S], axis 1 of [L, B, ...]."""
  return weights[row] if weights.ndim == 3 else weights[:, row]


@dataclasses.dataclass(frozen=True)
class Alignment:
  """One sentence pair and the attention of a model between its tokens.

  Attributes:
    source: the source sentence.
    translation: the target sentence the weights belong to (the model's own
      translation unless a target was given).
    source_tokens: labels of the source positions (pieces, ``</s>`` last).
    target_tokens: labels of the target positions.
    weights: the model's attention for this pair, batch axis removed and cut to
      the real tokens: ``"cross"`` is ``[T, S]`` (RNN) or ``[L, H, T, S]``
      (Transformer); the Transformer adds ``"encoder_self"`` ``[L, H, S, S]`` and
      ``"decoder_self"`` ``[L, H, T, T]``.
  """

  source: str
  translation: str
  source_tokens: list[str]
  target_tokens: list[str]
  weights: dict[str, np.ndarray]


def align(translator: Any, source: str, target: str | None = None, *,
          method: str = "greedy", beam_size: int = 4) -> Alignment:
  """The attention of ``translator``'s model over a sentence and its translation.

  Args:
    translator: a ``seq2seq_jax.translator.Translator`` whose model returns attention.
    source: one source sentence.
    target: a target sentence to force (e.g. the reference); default: the
      model's own translation, decoded by ``method``.
    method: "greedy" or "beam", when the model translates.
    beam_size: beams, for "beam".

  Returns:
    An ``Alignment``.
  """
  from seq2seq_jax.configs import DecodeConfig
  from seq2seq_jax.decoding import generate

  if not isinstance(source, str) or not source.strip():
    raise ValueError(f"source must be a non-empty sentence; got {source!r}")
  tokenizer = translator.tokenizer
  source_ids = translator.encode([source])[0]
  inputs_BS = np.asarray([source_ids], np.int32)
  if target is None:
    config = dataclasses.replace(translator.decode_config, method=method, beam_size=beam_size,
                                 max_decode_len=translator.max_decode_len(translator.decode_config))
    tokens_BT, _ = generate(translator.model, translator.params, inputs_BS, config)
    row = np.asarray(tokens_BT)[0].tolist()
    target_ids = row[:row.index(EOS_ID) + 1] if EOS_ID in row else row
  else:
    target_ids = list(tokenizer.encode(target)) + [EOS_ID]
  targets_BT = np.asarray([target_ids], np.int32)
  attention = attention_maps(translator.model, translator.params, inputs_BS, targets_BT)
  source_len, target_len = len(source_ids), len(target_ids)
  sizes = {"S": source_len, "T": target_len}
  letters = {"cross": "TS", "encoder_self": "SS", "decoder_self": "TT"}
  weights = {}
  for name, value in attention.items():
    value = _row(value, 0)
    rows, cols = (sizes[c] for c in letters.get(name, "TS"))
    weights[name] = value[..., :rows, :cols]
  return Alignment(source=source, translation=tokenizer.decode(target_ids),
                   source_tokens=token_labels(tokenizer, source_ids),
                   target_tokens=token_labels(tokenizer, target_ids), weights=weights)


# ----------------------------------------------------------------------------- heatmaps

def _check_labels(weights: np.ndarray, source_tokens: Sequence[str] | None,
                  target_tokens: Sequence[str] | None, what: str) -> tuple[list[str], list[str]]:
  rows, cols = weights.shape[-2:]
  if source_tokens is None:
    source_tokens = [str(i) for i in range(cols)]
  if target_tokens is None:
    target_tokens = [str(i) for i in range(rows)]
  if len(source_tokens) != cols or len(target_tokens) != rows:
    raise ValueError(
        f"{what} has shape {weights.shape}: its last two axes [T={rows}, S={cols}] must match "
        f"{len(target_tokens)} target tokens (y) and {len(source_tokens)} source tokens (x); "
        "cut the weights to the real tokens or pass matching labels")
  return list(source_tokens), list(target_tokens)


def _as_float(weights: Any, ndims: tuple[int, ...], what: str, shape_name: str) -> np.ndarray:
  weights = np.asarray(weights)
  if weights.ndim not in ndims or not np.issubdtype(weights.dtype, np.number):
    raise ValueError(f"{what} must be a numeric array shaped {shape_name}; got "
                     f"{weights.dtype} with shape {weights.shape}")
  if 0 in weights.shape:
    raise ValueError(f"{what} is empty: shape {weights.shape}")
  return weights.astype(np.float32)


def _heatmap(ax, weights_TS: np.ndarray, source_tokens: list[str], target_tokens: list[str], *,
             cmap: str, vmin: float, vmax: float, x_labels: bool = True, y_labels: bool = True,
             font_size: float = 8):
  image = ax.imshow(weights_TS, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                    interpolation="nearest")
  ax.set_xticks(np.arange(len(source_tokens)))
  ax.set_yticks(np.arange(len(target_tokens)))
  ax.set_xticklabels(source_tokens if x_labels else [], rotation=90, fontsize=font_size)
  ax.set_yticklabels(target_tokens if y_labels else [], fontsize=font_size)
  ax.tick_params(length=0)
  return image


def plot_attention(weights_TS: Any, source_tokens: Sequence[str] | None = None,
                   target_tokens: Sequence[str] | None = None, *, title: str | None = None,
                   xlabel: str = "source", ylabel: str = "target", cmap: str = "Blues",
                   vmin: float = 0.0, vmax: float | None = None,
                   colorbar: bool = True) -> LibraryFigure:
  """One attention (soft-alignment) matrix as a heatmap: source on x, target on y.

  Args:
    weights_TS: ``[T, S]``: row t is how target position t distributes its
      attention over the source positions.
    source_tokens: ``S`` x tick labels (default: positions).
    target_tokens: ``T`` y tick labels (default: positions).
    title: figure title.
    xlabel, ylabel: axis labels (e.g. "premise" / "hypothesis" for a pair model).
    cmap: matplotlib colour map.
    vmin, vmax: colour range; ``vmax`` defaults to the largest weight.
    colorbar: draw a colour bar.

  Returns:
    The figure (one axes with the image, plus the colour bar's).

  Raises:
    ValueError: weights not 2-D, empty, or not matching the token counts.
  """
  weights_TS = _as_float(weights_TS, (2,), "weights_TS", "[T, S]")
  source_tokens, target_tokens = _check_labels(weights_TS, source_tokens, target_tokens,
                                               "weights_TS")
  rows, cols = weights_TS.shape
  figure = _new_figure(min(2.0 + 0.32 * cols, 12.0), min(1.6 + 0.3 * rows, 10.0))
  ax = figure.add_subplot()
  vmax = float(np.max(weights_TS)) if vmax is None else vmax
  image = _heatmap(ax, weights_TS, source_tokens, target_tokens, cmap=cmap, vmin=vmin,
                   vmax=max(vmax, vmin + 1e-6))
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if title:
    ax.set_title(title, fontsize=10)
  if colorbar:
    figure.colorbar(image, ax=ax, shrink=0.8)
  return figure


def plot_attention_grid(weights: Any, source_tokens: Sequence[str] | None = None,
                        target_tokens: Sequence[str] | None = None, *,
                        row_labels: Sequence[str] | None = None,
                        column_labels: Sequence[str] | None = None, title: str | None = None,
                        cmap: str = "Blues", panel_size: float = 2.4,
                        share_scale: bool = False) -> LibraryFigure:
  """A grid of attention heatmaps: layers down, heads across.

  Args:
    weights: ``[H, T, S]`` (one row of heads) or ``[L, H, T, S]`` (layers x heads),
      e.g. ``Alignment.weights["cross"]`` of a Transformer.
    source_tokens: ``S`` x labels (drawn under the bottom row).
    target_tokens: ``T`` y labels (drawn left of the first column).
    row_labels: one per layer (default "layer 1", ...).
    column_labels: one per head (default "head 1", ...).
    title: figure title.
    cmap: colour map.
    panel_size: inches per panel at the smallest; long sentences get more.
    share_scale: one colour range for all panels; by default each panel spans
      0 to its own maximum so that diffuse heads stay visible.

  Returns:
    The figure; ``figure.axes`` holds the panels row by row.

  Raises:
    ValueError: weights not 3-D or 4-D, or labels of the wrong count.
  """
  weights = _as_float(weights, (3, 4), "weights", "[H, T, S] or [L, H, T, S]")
  if weights.ndim == 3:
    weights = weights[None]
  layers, heads = weights.shape[:2]
  source_tokens, target_tokens = _check_labels(weights, source_tokens, target_tokens, "weights")
  row_labels = list(row_labels) if row_labels is not None else [
      f"layer {i + 1}" for i in range(layers)]
  column_labels = list(column_labels) if column_labels is not None else [
      f"head {i + 1}" for i in range(heads)]
  if len(row_labels) != layers or len(column_labels) != heads:
    raise ValueError(f"weights have {layers} layers x {heads} heads but {len(row_labels)} row "
                     f"labels and {len(column_labels)} column labels were given")
  rows, cols = weights.shape[-2:]
  width = max(panel_size, 0.22 * cols + 0.6) * heads + 1.0
  height = max(panel_size, 0.2 * rows + 0.6) * layers + 0.6
  figure = _new_figure(min(width, 22.0), min(height, 24.0))
  axes = figure.subplots(layers, heads, squeeze=False)
  top = float(weights.max())
  font_size = 7 if max(rows, cols) > 12 else 8
  for layer in range(layers):
    for head in range(heads):
      ax = axes[layer, head]
      panel = weights[layer, head]
      vmax = top if share_scale else float(panel.max())
      _heatmap(ax, panel, source_tokens, target_tokens, cmap=cmap, vmin=0.0,
               vmax=max(vmax, 1e-6), x_labels=layer == layers - 1, y_labels=head == 0,
               font_size=font_size)
      if layer == 0:
        ax.set_title(column_labels[head], fontsize=9)
      if head == 0:
        ax.set_ylabel(row_labels[layer])
  if title:
    figure.suptitle(title, fontsize=11)
  return figure


# ----------------------------------------------------------------------------- quality by length

@dataclasses.dataclass(frozen=True)
class LengthBuckets:
  """Corpus BLEU of groups of sentences binned by source length.

  Attributes:
    labels: one per bucket, e.g. ``"1-10"``, ``"11-15"``, ``"26+"``.
    counts: sentences in each bucket.
    bleu: corpus BLEU of each bucket (NaN where the bucket is empty).
    length_unit: what the lengths count (e.g. "source words").
  """

  labels: list[str]
  counts: list[int]
  bleu: list[float]
  length_unit: str = "source words"


def bleu_by_length(sources: Sequence[str], hypotheses: Sequence[str],
                   references: Sequence[str], *, edges: Sequence[int] = (10, 15, 20, 25),
                   length: Callable[[str], int] | None = None,
                   length_unit: str = "source words") -> LengthBuckets:
  """Corpus BLEU (sacrebleu, as in ``seq2seq_jax.evaluation``) per source-length bucket.

  Args:
    sources: source sentences; only their lengths are used.
    hypotheses: system outputs, same order.
    references: one reference each, same order.
    edges: increasing upper bounds of the buckets: ``(10, 15)`` gives ``1-10``,
      ``11-15`` and ``16+``.
    length: a sentence's length; default: whitespace-separated words.
    length_unit: what ``length`` counts, for the plot's axis label.

  Returns:
    ``LengthBuckets``.
  """
  if not (len(sources) == len(hypotheses) == len(references)):
    raise ValueError(f"{len(sources)} sources, {len(hypotheses)} hypotheses and "
                     f"{len(references)} references: they must pair up line by line")
  if not sources:
    raise ValueError("no sentences to score")
  edges = list(edges)
  if not edges or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 1:
    raise ValueError(f"edges={edges} must be positive and strictly increasing")
  length = length or (lambda text: len(text.split()))
  lengths = np.array([length(s) for s in sources])
  bucket_N = np.searchsorted(np.array(edges), lengths, side="left")
  labels, counts, bleu = [], [], []
  lower = 1
  for index in range(len(edges) + 1):
    labels.append(f"{lower}-{edges[index]}" if index < len(edges) else f"{lower}+")
    if index < len(edges):
      lower = edges[index] + 1
    members = np.flatnonzero(bucket_N == index)
    counts.append(int(len(members)))
    if len(members):
      score = evaluation.corpus_bleu([hypotheses[i] for i in members],
                                     [references[i] for i in members])
      bleu.append(float(score.score))
    else:
      bleu.append(math.nan)
  return LengthBuckets(labels=labels, counts=counts, bleu=bleu, length_unit=length_unit)


def plot_quality_by_length(results: LengthBuckets | Mapping[str, LengthBuckets], *,
                           title: str | None = "Translation quality by source length",
                           show_counts: bool = True) -> LibraryFigure:
  """BLEU per source-length bucket, one line per model.

  Args:
    results: a ``LengthBuckets`` (from ``bleu_by_length``) or ``{model name: LengthBuckets}``;
      all must share the same buckets.
    title: axes title.
    show_counts: add each bucket's sentence count (of the first model) to its tick label.

  Returns:
    The figure: one axes, one line per model, x ticks = buckets.
  """
  if isinstance(results, LengthBuckets):
    results = {"": results}
  if not results:
    raise ValueError("results is empty: pass a LengthBuckets or {name: LengthBuckets}")
  first = next(iter(results.values()))
  for name, buckets in results.items():
    if not isinstance(buckets, LengthBuckets):
      raise TypeError(f"results[{name!r}] must be a LengthBuckets (see bleu_by_length); got "
                      f"{type(buckets).__name__}")
    if buckets.labels != first.labels:
      raise ValueError(f"results[{name!r}] has buckets {buckets.labels}, others "
                       f"{first.labels}: score every model with the same edges")
  figure = _new_figure(6.4, 3.8)
  ax = figure.add_subplot()
  positions = np.arange(len(first.labels))
  for name, buckets in results.items():
    ax.plot(positions, buckets.bleu, marker="o", label=name or None)
  labels = first.labels
  if show_counts:
    labels = [f"{label}\n(n={count})" for label, count in zip(first.labels, first.counts)]
  ax.set_xticks(positions)
  ax.set_xticklabels(labels)
  ax.set_xlabel(f"source length ({first.length_unit})")
  ax.set_ylabel("BLEU")
  ax.set_ylim(bottom=0)
  ax.grid(alpha=0.3)
  if any(results):
    ax.legend()
  if title:
    ax.set_title(title)
  return figure


# ----------------------------------------------------------------------------- bars and curves

def plot_decoding_comparison(scores: Mapping[str, float], *, metric: str = "BLEU",
                             title: str | None = None) -> LibraryFigure:
  """A bar per decoding setting (e.g. greedy, beam 4, beam 8) with its score on top.

  Args:
    scores: ``{setting: score}`` in the order to draw.
    metric: the y axis label.
    title: axes title.
  """
  if not scores:
    raise ValueError("scores is empty: pass {setting name: score}")
  values = [float(v) for v in scores.values()]
  if not all(math.isfinite(v) for v in values):
    raise ValueError(f"scores must be finite numbers; got {dict(scores)}")
  figure = _new_figure(max(3.2, 1.1 * len(scores) + 1.5), 3.4)
  ax = figure.add_subplot()
  bars = ax.bar(np.arange(len(values)), values, color="tab:blue")
  ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=2)
  ax.set_xticks(np.arange(len(values)))
  ax.set_xticklabels(list(scores))
  ax.set_ylabel(metric)
  ax.set_ylim(0, max(max(values), 1e-6) * 1.15)
  if title:
    ax.set_title(title)
  return figure


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
  """The records of a run's ``metrics.jsonl`` (or of a workdir holding one), in order."""
  path = pathlib.Path(path)
  if path.is_dir():
    path = path / "metrics.jsonl"
  if not path.exists():
    raise FileNotFoundError(f"{path} not found: pass a training workdir or its metrics.jsonl")
  records = []
  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
    if line.strip():
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{number} is not JSON: {error}") from None
  return records


def _records(run: Any) -> list[dict[str, Any]]:
  if isinstance(run, (str, os.PathLike)):
    return read_metrics(run)
  return list(run)


_METRIC_NAMES = {"loss": "training loss", "val_loss": "validation loss", "bleu": "validation BLEU",
                 "val_ppl": "validation perplexity", "accuracy": "training accuracy"}


def plot_training_curves(runs: Any, *, metrics: Sequence[str] = ("loss", "val_loss", "bleu"),
                         x_key: str = "step", title: str | None = None) -> LibraryFigure:
  """Metrics of one or more runs against steps, one panel per metric.

  Args:
    runs: a workdir or ``metrics.jsonl`` path, a list of records (dicts), or
      ``{run name: path or records}``.
    metrics: record keys to draw; keys that no record has are skipped.
    x_key: the record key of the x axis (``"step"``, or e.g. ``"epoch"``).
    title: figure title.

  Returns:
    The figure: one axes per metric present, one line per run.

  Raises:
    ValueError: no record has any of ``metrics`` or lacks ``x_key``.
  """
  if isinstance(runs, Mapping):
    named = {name: _records(run) for name, run in runs.items()}
  else:
    named = {"": _records(runs)}
  present = [m for m in metrics if any(m in r for records in named.values() for r in records)]
  if not present:
    raise ValueError(f"no record has any of the metrics {list(metrics)}; the records have "
                     f"{sorted({k for rs in named.values() for r in rs for k in r})}")
  figure = _new_figure(3.6 * len(present) + 0.4, 3.2)
  axes = figure.subplots(1, len(present), squeeze=False)[0]
  for ax, metric in zip(axes, present):
    for name, records in named.items():
      points = [(r[x_key], r[metric]) for r in records if metric in r and r[metric] is not None]
      missing_x = [r for r in records if metric in r and x_key not in r]
      if missing_x:
        raise ValueError(f"a record with {metric!r} has no {x_key!r}: {missing_x[0]}")
      if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o" if len(points) <= 20 else None, markersize=3,
                label=name or None)
    ax.set_xlabel(x_key)
    ax.set_ylabel(_METRIC_NAMES.get(metric, metric))
    ax.grid(alpha=0.3)
    if len(named) > 1:
      ax.legend(fontsize=8)
  if title:
    figure.suptitle(title)
  return figure
