"""Token-weighted cross-entropy with label smoothing, returned as sums so batches aggregate exactly.

Every function returns sums over the batch and the number of real (non-PAD)
target tokens; divide at the very end (``mean = sum / tokens``) so that
gradient accumulation, data parallelism and evaluation over many batches all
weight every token equally, whatever the padding of each batch.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from seq2seq_jax.types import PAD_ID, Array


class LossSums(NamedTuple):
  """Sums over the real tokens of a batch (all float32 scalars).

  Attributes:
    loss: label-smoothed cross-entropy, the training objective.
    nll: plain negative log-likelihood (no smoothing): ``exp(nll / tokens)`` is perplexity.
    correct: tokens whose argmax prediction equals the target.
    tokens: real target tokens (PAD excluded).
  """

  loss: Array
  nll: Array
  correct: Array
  tokens: Array


def cross_entropy_sums(logits_BTV: Array, targets_BT: Array, *, label_smoothing: float = 0.0,
                       pad_id: int = PAD_ID) -> LossSums:
  """Label-smoothed cross-entropy summed over the non-PAD tokens of a batch.

  The smoothed target puts ``1 - label_smoothing`` on the true token plus
  ``label_smoothing / V`` on every token (``optax.smooth_labels``). PAD positions
  carry weight 0. The arithmetic is float32 whatever the dtype of the logits.

  Args:
    logits_BTV: unnormalised scores [B, T, V].
    targets_BT: int target ids [B, T]; ``pad_id`` marks padding.
    label_smoothing: probability mass spread uniformly over the vocabulary, in [0, 1).
    pad_id: the id that carries no weight.

  Returns:
    ``LossSums`` of float32 scalars.

  Example:
    >>> sums = cross_entropy_sums(jnp.zeros((1, 2, 5)), jnp.array([[3, 0]]))
    >>> float(sums.loss / sums.tokens)  # log(5): uniform prediction, one real token
    1.609...
  """
  if logits_BTV.shape[:2] != targets_BT.shape:
    raise ValueError(f"logits_BTV {logits_BTV.shape} and targets_BT {targets_BT.shape} must agree "
                     "on [batch, length]")
  if not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1)")
  vocab = logits_BTV.shape[-1]
  logits_BTV = logits_BTV.astype(jnp.float32)
  log_probs_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
  weights_BT = (targets_BT != pad_id).astype(jnp.float32)
  onehot_BTV = jax.nn.one_hot(targets_BT, vocab, dtype=jnp.float32)
  nll_BT = -jnp.sum(onehot_BTV * log_probs_BTV, axis=-1)
  if label_smoothing:
    soft_BTV = optax.smooth_labels(onehot_BTV, label_smoothing)
    loss_BT = -jnp.sum(soft_BTV * log_probs_BTV, axis=-1)
  else:
    loss_BT = nll_BT
  correct_BT = (jnp.argmax(logits_BTV, axis=-1) == targets_BT).astype(jnp.float32)
  return LossSums(loss=jnp.sum(loss_BT * weights_BT), nll=jnp.sum(nll_BT * weights_BT),
                  correct=jnp.sum(correct_BT * weights_BT), tokens=jnp.sum(weights_BT))
