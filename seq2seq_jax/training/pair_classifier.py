"""Training and evaluation of the decomposable-attention pair classifier (optax, jit).

Run the full task on Multi30k (train for training, val and test_2016 held out):

  python -m seq2seq_jax.training.pair_classifier --data ../shared/data/multi30k/raw
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from seq2seq_jax.configs import DecomposableAttentionConfig
from seq2seq_jax.data.pair_task import PairSplit, PairTask, build_pair_task
from seq2seq_jax.models.decomposable import DecomposableAttention
from seq2seq_jax.types import PyTree


@dataclasses.dataclass(frozen=True, kw_only=True)
class PairTrainConfig:
  """How the pair classifier is optimised."""

  epochs: int = 10  # passes over the training pairs (fresh negatives each epoch)
  batch_size: int = 128
  learning_rate: float = 1e-3  # Adam, cosine-decayed to 0 over the run
  weight_decay: float = 1e-5
  clip_norm: float = 1.0
  seed: int = 0

  def __post_init__(self):
    for field in ("epochs", "batch_size"):
      if getattr(self, field) <= 0:
        raise ValueError(f"PairTrainConfig.{field}={getattr(self, field)}: must be positive")
    if self.learning_rate <= 0:
      raise ValueError(f"PairTrainConfig.learning_rate={self.learning_rate}: must be > 0")


def make_steps(model: nn.Module, optimizer: optax.GradientTransformation
               ) -> tuple[Callable[..., Any], Callable[..., Any]]:
  """Jitted ``train_step(params, opt_state, batch, rng) -> (params, opt_state, loss)`` and
  ``predict(params, a_ids, b_ids) -> classes``."""

  def loss_fn(params, a_ids, b_ids, labels, rng):
    logits_BC = model.apply({"params": params}, a_ids, b_ids, deterministic=False,
                            rngs={"dropout": rng})
    return optax.softmax_cross_entropy_with_integer_labels(logits_BC, labels).mean()

  @jax.jit
  def train_step(params, opt_state, a_ids, b_ids, labels, rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, a_ids, b_ids, labels, rng)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @jax.jit
  def predict(params, a_ids, b_ids):
    return jnp.argmax(model.apply({"params": params}, a_ids, b_ids), axis=-1)

  return train_step, predict


def _bucket_batches(a_ids: np.ndarray, b_ids: np.ndarray, batch_size: int,
                    bucket_lengths: tuple[int, ...], rng: np.random.Generator | None
                    ) -> list[tuple[np.ndarray, int]]:
  """Groups rows by padded length so short pairs do not pay for long ones.

  Returns ``(rows, length)`` batches: every row fits in ``length`` (one of
  ``bucket_lengths`` or the full width), shuffled when ``rng`` is given. A
  trailing partial batch per bucket is kept only without ``rng`` (evaluation).
  """
  width = a_ids.shape[1]
  lengths = np.maximum((a_ids != 0).sum(1), (b_ids != 0).sum(1))
  edges = sorted({min(b, width) for b in bucket_lengths} | {width})
  bucket = np.searchsorted(np.array(edges), lengths)
  batches = []
  for index, length in enumerate(edges):
    rows = np.flatnonzero(bucket == index)
    if rng is not None:
      rows = rng.permutation(rows)
      stop = len(rows) - len(rows) % batch_size
    else:
      stop = len(rows)
    batches += [(rows[i:i + batch_size], length) for i in range(0, stop, batch_size)]
  if rng is not None:
    batches = [batches[i] for i in rng.permutation(len(batches))]
  return batches


_BUCKETS = (12, 16, 20, 24, 32)


def evaluate(predict: Callable[..., Any], params: PyTree, split: PairSplit, *,
             batch_size: int = 256) -> float:
  """Accuracy on the split's true pairs and their nearest hard negatives (a fixed set)."""
  a_ids, b_ids, labels = split.pairs(None)
  correct = 0
  for rows, length in _bucket_batches(a_ids, b_ids, batch_size, _BUCKETS, None):
    a, b = a_ids[rows, :length], b_ids[rows, :length]
    if len(rows) < batch_size:  # pad the last batch of a bucket so nothing recompiles
      a = np.concatenate([a, np.zeros((batch_size - len(rows), length), a.dtype)])
      b = np.concatenate([b, np.zeros((batch_size - len(rows), length), b.dtype)])
    classes = np.asarray(predict(params, a, b))[:len(rows)]
    correct += int((classes == labels[rows]).sum())
  return correct / len(labels)


def train_pair_classifier(task: PairTask, model_config: DecomposableAttentionConfig,
                          train_config: PairTrainConfig, *, train_split: str = "train",
                          eval_splits: tuple[str, ...] = (),
                          log: Callable[[str], None] = print) -> tuple[PyTree, dict[str, Any]]:
  """Trains on ``train_split`` and evaluates ``eval_splits`` after every epoch.

  Returns:
    ``(params, history)``: the final parameters and per-epoch loss and accuracies.
  """
  model = DecomposableAttention(model_config)
  split = task.splits[train_split]
  if 2 * len(split) < 4 * train_config.batch_size:
    raise ValueError(f"{2 * len(split)} training pairs are too few for batches of "
                     f"{train_config.batch_size}; lower PairTrainConfig.batch_size")
  # Buckets drop partial batches, so this slightly overestimates the steps: the
  # schedule then ends a little above zero.
  total = (2 * len(split)) // train_config.batch_size * train_config.epochs
  schedule = optax.cosine_decay_schedule(train_config.learning_rate, total)
  optimizer = optax.chain(optax.clip_by_global_norm(train_config.clip_norm),
                          optax.adamw(schedule, weight_decay=train_config.weight_decay))
  rng = jax.random.key(train_config.seed)
  sample = jnp.zeros((1, task.max_len), jnp.int32)
  params = model.init(rng, sample, sample)["params"]
  opt_state = optimizer.init(params)
  train_step, predict = make_steps(model, optimizer)
  data_rng = np.random.default_rng(train_config.seed)
  history: dict[str, Any] = {"loss": [], **{name: [] for name in eval_splits}}
  for epoch in range(train_config.epochs):
    start_time = time.time()
    a_ids, b_ids, labels = split.pairs(data_rng)
    losses = []
    for rows, length in _bucket_batches(a_ids, b_ids, train_config.batch_size, _BUCKETS,
                                        data_rng):
      rng, step_rng = jax.random.split(rng)
      params, opt_state, loss = train_step(params, opt_state, a_ids[rows, :length],
                                           b_ids[rows, :length], labels[rows], step_rng)
      losses.append(loss)
    history["loss"].append(float(np.mean(jax.device_get(losses))))
    scores = {name: evaluate(predict, params, task.splits[name]) for name in eval_splits}
    for name, accuracy in scores.items():
      history[name].append(accuracy)
    log(f"epoch {epoch + 1}/{train_config.epochs} loss {history['loss'][-1]:.4f} "
        + " ".join(f"{name} {acc:.4f}" for name, acc in scores.items())
        + f" ({time.time() - start_time:.0f} s)")
  return params, history


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", default="../shared/data/multi30k/raw",
                      help="folder of aligned {split}.{lang} files")
  parser.add_argument("--eval-splits", default="val,test_2016_flickr")
  parser.add_argument("--epochs", type=int, default=PairTrainConfig.epochs)
  parser.add_argument("--batch-size", type=int, default=PairTrainConfig.batch_size)
  parser.add_argument("--learning-rate", type=float, default=PairTrainConfig.learning_rate)
  parser.add_argument("--embed-dim", type=int, default=100)
  parser.add_argument("--hidden-dim", type=int, default=128)
  parser.add_argument("--dropout", type=float, default=0.2)
  parser.add_argument("--intra-attention", action="store_true")
  parser.add_argument("--limit", type=int, default=0, help="first N lines of each split")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--report", default="", help="write the history here as JSON")
  args = parser.parse_args(argv)
  eval_splits = tuple(s for s in args.eval_splits.split(",") if s)
  for split in eval_splits:
    if split.startswith(("test_2017", "test_2018")):
      raise ValueError(f"{split} is reserved as the library's final held-out check; "
                       "evaluate on val or test_2016_flickr")
  start = time.time()
  task = build_pair_task(args.data, eval_splits=eval_splits, limit=args.limit)
  print(f"task: vocab {task.vocab.size}, "
        + ", ".join(f"{k} {len(v)} pairs x2 (truncated {v.truncated})"
                    for k, v in task.splits.items())
        + f" ({time.time() - start:.0f} s)", flush=True)
  model_config = DecomposableAttentionConfig(
      vocab_size=task.vocab.size, embed_dim=args.embed_dim, hidden_dim=args.hidden_dim,
      dropout_rate=args.dropout, intra_attention=args.intra_attention, max_len=task.max_len)
  train_config = PairTrainConfig(epochs=args.epochs, batch_size=args.batch_size,
                                 learning_rate=args.learning_rate, seed=args.seed)
  _, history = train_pair_classifier(task, model_config, train_config, eval_splits=eval_splits,
                                     log=lambda line: print(line, flush=True))
  history["minutes"] = (time.time() - start) / 60
  history["args"] = vars(args)
  print(json.dumps({k: v[-1] if isinstance(v, list) else v for k, v in history.items()
                    if k != "args"}), flush=True)
  if args.report:
    with open(args.report, "w", encoding="utf-8") as f:
      json.dump(history, f, indent=1)


if __name__ == "__main__":
  main()
