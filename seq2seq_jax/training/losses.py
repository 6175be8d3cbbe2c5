"""Token-weighted cross-entropy with label smoothing, returned as sums so batches aggregate exactly.

Every function returns sums over the batch and the number of real (non-PAD)
target tokens; divide at the very end (``mean = sum / tokens``) so that
gradient accumulation, data parallelism and evaluation over many batches all
weight every token equally, whatever the padding of each batch.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

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
  Neither the forward pass nor the gradient materialises a one-hot or smoothed
  target distribution (see ``_token_losses``).

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
  weights_BT = (targets_BT != pad_id).astype(jnp.float32)
  loss_BT, nll_BT, correct_BT = _token_losses(logits_BTV.astype(jnp.float32),
                                              targets_BT.astype(jnp.int32), float(label_smoothing))
  return LossSums(loss=jnp.sum(loss_BT * weights_BT), nll=jnp.sum(nll_BT * weights_BT),
                  correct=jnp.sum(correct_BT * weights_BT), tokens=jnp.sum(weights_BT))


def _token_losses_fwd(logits_BTV: Array, targets_BT: Array,
                      label_smoothing: float) -> tuple[tuple[Array, Array, Array], tuple]:
  """Per-token (smoothed loss, nll, correct) from one max, one sum of exponentials, one gather.

  With ``lse = log sum_v exp(z_v)`` and ``eps = label_smoothing``:
  ``nll = lse - z_target`` and ``loss = (1 - eps) nll + eps (lse - mean_v z_v)``, which
  is ``-sum_v q_v log p_v`` for the smoothed target ``q``. ``correct`` is 1 where the
  target's logit is the largest (a tie with another token also counts).
  """
  max_BT = jnp.max(logits_BTV, axis=-1)
  sum_exp_BT = jnp.sum(jnp.exp(logits_BTV - max_BT[..., None]), axis=-1)
  lse_BT = max_BT + jnp.log(sum_exp_BT)
  target_logit_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
  nll_BT = lse_BT - target_logit_BT
  if label_smoothing:
    uniform_BT = lse_BT - jnp.mean(logits_BTV, axis=-1)  # cross-entropy against 1/V everywhere
    loss_BT = (1.0 - label_smoothing) * nll_BT + label_smoothing * uniform_BT
  else:
    loss_BT = nll_BT
  correct_BT = (target_logit_BT >= max_BT).astype(jnp.float32)
  return (loss_BT, nll_BT, correct_BT), (logits_BTV, targets_BT, lse_BT)


def _token_losses_bwd(label_smoothing: float, residuals: tuple,
                      cotangents: tuple[Array, Array, Array]) -> tuple[Array, None]:
  """d/dz of ``ct_loss * loss + ct_nll * nll`` in one elementwise pass over [B, T, V].

  ``d nll / dz = p - onehot`` and ``d loss / dz = p - (1 - eps) onehot - eps / V``.
  ``correct`` is piecewise constant: its cotangent is ignored.
  """
  logits_BTV, targets_BT, lse_BT = residuals
  ct_loss_BT, ct_nll_BT, _ = cotangents
  vocab = logits_BTV.shape[-1]
  probs_BTV = jnp.exp(logits_BTV - lse_BT[..., None])
  is_target_BTV = jax.lax.broadcasted_iota(jnp.int32, logits_BTV.shape, 2) == targets_BT[..., None]
  on_target_BT = (1.0 - label_smoothing) * ct_loss_BT + ct_nll_BT
  grad_BTV = ((ct_loss_BT + ct_nll_BT)[..., None] * probs_BTV
              - jnp.where(is_target_BTV, on_target_BT[..., None], 0.0)
              - (label_smoothing / vocab * ct_loss_BT)[..., None])
  return grad_BTV, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _token_losses(logits_BTV: Array, targets_BT: Array,
                  label_smoothing: float) -> tuple[Array, Array, Array]:
  """Float32 per-token ``(loss, nll, correct)`` [B, T] each; see ``_token_losses_fwd``.

  A custom VJP so that the gradient is one fused ``p - q`` pass: autodiff of the
  gather would build a zero [B, T, V] buffer and scatter into it.
  """
  return _token_losses_fwd(logits_BTV, targets_BT, label_smoothing)[0]


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)
