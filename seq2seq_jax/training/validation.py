"""Validation while training: loss over the eval batches and BLEU of the model's translations.

``train`` builds a ``Validator`` at its first evaluation and calls it at every
``TrainConfig.eval_every`` steps; every host decodes its own rows and all hosts
score the same hypotheses.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from seq2seq_jax import evaluation
from seq2seq_jax.configs import ExperimentConfig
from seq2seq_jax.training import sharding as sharding_lib
from seq2seq_jax.training import step as step_lib


class Validator:
  """Validation loss over the eval batches and BLEU of greedy (or configured) translations.

  Args:
    config: the run; ``config.train`` says how many batches and sentences to score,
      ``config.decode`` how to translate.
    tokenizer: the run's tokenizer.
    model, mesh: as the training step has them.
    params: parameters placed as the training state places them (for the eval step's shardings).
  """

  def __init__(self, config: ExperimentConfig, tokenizer, model, mesh, params):
    from seq2seq_jax.data import iterators, sources  # the data stack loads tfds: only to train
    self._config = config
    self._tokenizer = tokenizer
    self._model = model
    self._mesh = mesh
    self._eval_step = step_lib.make_eval_step(model, mesh=mesh, params=params)
    # Decoded rows back where their sources were (generate's own output sharding
    # may differ, e.g. under FSDP), so each host reads exactly its own rows.
    self._to_rows = jax.jit(lambda x: x, out_shardings=step_lib.batch_sharding(mesh))
    self._batches = iterators.make_eval_batches(config.data, tokenizer,
                                               shard_index=jax.process_index(),
                                               shard_count=jax.process_count())
    self._references = sources.load_eval_text(config.data).references

  def __call__(self, params) -> dict[str, Any]:
    """``val_loss``, ``val_nll``, ``val_ppl``, ``val_accuracy``, ``bleu``, ``bleu_signature``
    and ``bleu_sentences`` of ``params``."""
    from seq2seq_jax.decoding import generate
    train = self._config.train
    sums = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
    limit_sentences = train.eval_bleu_sentences or len(self._references)
    hypotheses: dict[int, str] = {}
    for number, batch in enumerate(self._batches):
      sharded = step_lib.shard_batch(batch, self._mesh)
      if not train.eval_batches or number < train.eval_batches:
        for key, value in jax.device_get(self._eval_step(params, sharded)).items():
          sums[key] += float(value)
      if len(hypotheses) < limit_sentences:
        tokens_BT, _ = generate(self._model, params, sharded["inputs"], self._config.decode)
        indices_B, rows_BT = gather_rows(
            np.asarray(batch["index"]), sharding_lib.process_local_rows(self._to_rows(tokens_BT)))
        texts = self._tokenizer.decode_batch(rows_BT)
        for index, text in zip(indices_B.tolist(), texts):
          if index >= 0 and len(hypotheses) < limit_sentences:
            hypotheses[index] = text
      elif train.eval_batches and number >= train.eval_batches:
        break
    tokens = max(sums["tokens"], 1.0)
    out: dict[str, Any] = {"val_loss": sums["loss"] / tokens, "val_nll": sums["nll"] / tokens,
                           "val_ppl": evaluation.perplexity(sums["nll"], tokens),
                           "val_accuracy": sums["correct"] / tokens}
    indices = sorted(hypotheses)
    bleu = evaluation.corpus_bleu([hypotheses[i] for i in indices],
                                  [self._references[i] for i in indices])
    out.update(bleu=bleu.score, bleu_signature=bleu.signature, bleu_sentences=len(indices))
    return out


def gather_rows(indices_B: np.ndarray, tokens_BT: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Every host's (sentence index, tokens) rows, on every host: BLEU sees the whole batch.

  Each host decodes its own rows; all hosts then hold the same hypotheses and so
  take the same decisions (how many batches to decode), which collectives need.
  """
  if jax.process_count() == 1:
    return indices_B, tokens_BT
  from jax.experimental import multihost_utils
  rows = np.concatenate([indices_B[:, None].astype(tokens_BT.dtype), tokens_BT], axis=1)
  rows = np.asarray(multihost_utils.process_allgather(rows, tiled=True))
  return rows[:, 0].astype(np.int64), rows[:, 1:]
