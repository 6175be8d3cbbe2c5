"""Label-smoothed, token-weighted cross-entropy against a NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax.training.losses import cross_entropy_sums
from seq2seq_jax.types import PAD_ID


def _real_tokens(targets_BT, vocab, smoothing):
  """(b, t, target, smoothed target distribution) for every non-PAD position."""
  for b in range(targets_BT.shape[0]):
    for t in range(targets_BT.shape[1]):
      target = targets_BT[b, t]
      if target != PAD_ID:
        soft = np.full(vocab, smoothing / vocab)
        soft[target] += 1.0 - smoothing
        yield b, t, target, soft


def _reference(logits_BTV, targets_BT, smoothing):
  logits = logits_BTV.astype(np.float64)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  loss = nll = tokens = correct = 0.0
  for b, t, target, soft in _real_tokens(targets_BT, logits.shape[-1], smoothing):
    loss += -(soft * log_probs[b, t]).sum()
    nll += -log_probs[b, t, target]
    correct += float(np.argmax(logits[b, t]) == target)
    tokens += 1
  return loss, nll, correct, tokens


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_matches_numpy_reference(smoothing):
  rng = np.random.default_rng(0)
  logits_BTV = rng.normal(size=(2, 5, 11)).astype(np.float32) * 3
  targets_BT = np.array([[4, 7, 2, 0, 0], [5, 1, 9, 10, 2]], np.int32)
  sums = cross_entropy_sums(jnp.asarray(logits_BTV), jnp.asarray(targets_BT),
                            label_smoothing=smoothing)
  loss, nll, correct, tokens = _reference(logits_BTV, targets_BT, smoothing)
  np.testing.assert_allclose(float(sums.loss), loss, rtol=1e-5)
  np.testing.assert_allclose(float(sums.nll), nll, rtol=1e-5)
  assert float(sums.correct) == correct
  assert float(sums.tokens) == tokens == 8


def _reference_grad(logits_BTV, targets_BT, smoothing, loss_scale, nll_scale):
  """d(loss_scale * loss + nll_scale * nll)/dlogits in float64: weight * (p - q) per token."""
  logits = logits_BTV.astype(np.float64)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  vocab = logits.shape[-1]
  grad = np.zeros_like(logits)
  for b, t, target, soft in _real_tokens(targets_BT, vocab, smoothing):
    onehot = np.eye(vocab)[target]
    grad[b, t] = loss_scale * (probs[b, t] - soft) + nll_scale * (probs[b, t] - onehot)
  return grad


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("loss_scale,nll_scale", [(1.0, 0.0), (0.5, 2.0)])
def test_gradient_matches_numpy_reference(smoothing, loss_scale, nll_scale):
  """The custom VJP is p - q per real token, for the loss and the nll alike."""
  rng = np.random.default_rng(3)
  logits_BTV = rng.normal(size=(2, 5, 11)).astype(np.float32) * 3
  targets_BT = np.array([[4, 7, 2, 0, 0], [5, 1, 9, 10, 2]], np.int32)

  def objective(logits):
    sums = cross_entropy_sums(logits, jnp.asarray(targets_BT), label_smoothing=smoothing)
    return loss_scale * sums.loss + nll_scale * sums.nll + 3.0 * sums.correct

  grad = jax.jit(jax.grad(objective))(jnp.asarray(logits_BTV))
  np.testing.assert_allclose(
      np.asarray(grad), _reference_grad(logits_BTV, targets_BT, smoothing, loss_scale, nll_scale),
      atol=2e-6)


def test_correct_counts_the_target_at_the_maximum():
  logits_BTV = jnp.array([[[0.0, 5.0, 1.0], [2.0, 1.0, 3.0]]])
  sums = cross_entropy_sums(logits_BTV, jnp.array([[1, 1]]))
  assert float(sums.correct) == 1.0


def test_pad_positions_carry_no_weight():
  rng = np.random.default_rng(1)
  logits_BTV = jnp.asarray(rng.normal(size=(1, 4, 7)), jnp.float32)
  targets_BT = jnp.array([[3, 2, 0, 0]])
  base = cross_entropy_sums(logits_BTV, targets_BT, label_smoothing=0.1)
  changed = cross_entropy_sums(logits_BTV.at[:, 2:].set(100.0), targets_BT, label_smoothing=0.1)
  assert float(base.loss) == float(changed.loss)
  assert float(base.tokens) == 2


def test_bfloat16_logits_are_computed_in_float32():
  rng = np.random.default_rng(2)
  logits_BTV = rng.normal(size=(2, 3, 5)).astype(np.float32)
  targets_BT = jnp.array([[1, 2, 3], [4, 0, 0]])
  sums = cross_entropy_sums(jnp.asarray(logits_BTV, jnp.bfloat16), targets_BT, label_smoothing=0.1)
  assert sums.loss.dtype == jnp.float32
  reference = _reference(np.asarray(jnp.asarray(logits_BTV, jnp.bfloat16), np.float32),
                         np.asarray(targets_BT), 0.1)[0]
  np.testing.assert_allclose(float(sums.loss), reference, rtol=1e-5)


def test_shape_mismatch_is_named():
  with pytest.raises(ValueError, match="must agree"):
    cross_entropy_sums(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32))
