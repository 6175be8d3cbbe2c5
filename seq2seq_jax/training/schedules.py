"""Learning-rate schedules: the Transformer paper's inverse square root, and optax's own.

All schedules take optax's ``count`` (updates already done, 0 for the first
update) and return the learning rate of that update.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from seq2seq_jax.configs import TrainConfig


def rsqrt_schedule(peak_value: float, warmup_steps: int) -> optax.Schedule:
  """Linear warmup to ``peak_value``, then decay with the inverse square root of the step.

  With ``s = count + 1`` (the 1-based update number) and ``w = warmup_steps``:
  ``lr = peak_value * min(s / w, sqrt(w / s))``, which peaks at ``s = w``. This is
  the schedule of Vaswani et al. 2017 (``d**-0.5 * min(s**-0.5, s * w**-1.5)``)
  with the peak written explicitly. ``warmup_steps=0`` gives ``peak_value / sqrt(s)``.

  Example:
    >>> schedule = rsqrt_schedule(1e-3, warmup_steps=4)
    >>> [round(float(schedule(c)), 6) for c in (0, 3, 15)]
    [0.00025, 0.001, 0.0005]
  """
  if warmup_steps < 0:
    raise ValueError(f"warmup_steps={warmup_steps} must be >= 0")

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    if warmup_steps == 0:
      return peak_value * jnp.sqrt(1.0 / step)
    return peak_value * jnp.minimum(step / warmup_steps, jnp.sqrt(warmup_steps / step))

  return schedule


def make_schedule(config: TrainConfig) -> optax.Schedule:
  """The schedule that ``config.schedule`` names: ``"rsqrt"``, ``"cosine"``, ``"linear"``
  or ``"constant"``.

  Each but ``rsqrt`` warms up linearly from 0 over ``warmup_steps``. ``cosine`` is
  optax's warmup-cosine decay to 0 at ``num_steps``; ``linear`` falls in a straight line
  to 0 at ``num_steps`` (fairseq's ``polynomial_decay`` with power 1); ``constant`` holds
  ``learning_rate``.
  """
  peak, warmup = config.learning_rate, config.warmup_steps
  if config.schedule == "rsqrt":
    return rsqrt_schedule(peak, warmup)
  if config.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=peak,
                                              warmup_steps=warmup, decay_steps=config.num_steps)
  if config.schedule in ("linear", "constant"):
    after_warmup = (optax.linear_schedule(peak, 0.0, config.num_steps - warmup)
                    if config.schedule == "linear" else optax.constant_schedule(peak))
    # With warmup 0 the boundary is 0 and the second schedule runs from the first update.
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after_warmup],
                                [warmup])
  raise ValueError(f"TrainConfig.schedule={config.schedule!r} must be 'rsqrt', 'cosine', "
                   "'linear' or 'constant'")
