"""Where activations live on a ``("data", "model")`` mesh: logical axis names and constraints.

Parameters are placed by path (``training.sharding``); activations are placed here.
The models mark their main activations with logical names (``constrain(x_BTD,
BATCH, LENGTH, EMBED)``); inside ``activation_sharding(mesh)`` each mark becomes
``jax.lax.with_sharding_constraint`` with the mesh axes of ``ACTIVATION_RULES``,
and outside it a mark does nothing, so a model called without a mesh (tests,
notebooks, ``generate`` on one device) traces exactly as before.

Why the marks are needed: XLA's SPMD partitioner propagates shardings from the
arguments. Under FSDP a parameter's model width is split over ``data`` as the
batch is; left alone, the partitioner may follow the parameters and keep the
width split, all-gathering the batch instead (every chip then holds the whole
batch's activations). The TPU compiler showed exactly that for a WMT-base train
step on v5e:2x4: 16.6 GB of temporaries per chip against 3.8 GB replicated. With
the batch marked ``data`` throughout, the partitioner all-gathers the (small)
parameters where they are used, which is what FSDP means.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from seq2seq_jax.training.sharding import make_mesh
  >>> mesh = make_mesh()  # the tests' 8 CPU devices: data 8, model 1
  >>> f = jax.jit(lambda x: constrain(x * 2, BATCH, LENGTH, EMBED))
  >>> f(jnp.ones((8, 3, 4))).sharding.is_fully_replicated  # outside a context: no constraint
  True
  >>> def g(x):
  ...   with activation_sharding(mesh):
  ...     return constrain(x * 2, BATCH, LENGTH, EMBED)
  >>> jax.jit(g)(jnp.ones((8, 3, 4))).sharding.spec
  P('data',)
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from seq2seq_jax.types import Array

DATA_AXIS = "data"  # mesh axis of the batch's rows (data parallelism, FSDP)
MODEL_AXIS = "model"  # mesh axis of heads and feed-forward width (tensor parallelism)

# Logical names of activation axes (distinct from the parameters' names in
# training.sharding: under FSDP a parameter's model width goes to "data", an
# activation's never does).
BATCH = "activation_batch"  # rows: B, or N = B * W in a beam search
LENGTH = "activation_length"  # positions: S or T
EMBED = "activation_embed"  # model width D
HEADS = "activation_heads"  # attention heads H
KV = "activation_kv"  # per-head width K
MLP = "activation_mlp"  # feed-forward width F
VOCAB = "activation_vocab"  # vocabulary V

# Logical name -> mesh axis (None: not split). Megatron's layout: the residual
# stream is split only by rows, heads and the feed-forward width by "model".
ACTIVATION_RULES: tuple[tuple[str, str | None], ...] = (
    (BATCH, DATA_AXIS), (HEADS, MODEL_AXIS), (MLP, MODEL_AXIS), (LENGTH, None), (EMBED, None),
    (KV, None), (VOCAB, None))

_ACTIVE: contextvars.ContextVar[tuple[Mesh, dict[str, str | None]] | None] = (
    contextvars.ContextVar("seq2seq_jax_activation_sharding", default=None))


@contextlib.contextmanager
def activation_sharding(mesh: Mesh | None,
                        rules: Sequence[tuple[str, str | None]] = ACTIVATION_RULES
                        ) -> Iterator[None]:
  """Within the block, ``constrain`` places activations on ``mesh`` by ``rules``.

  Enter it inside the function being traced (``jit`` traces lazily), around the
  model's ``apply``; ``mesh=None`` leaves activations unconstrained.
  """
  token = _ACTIVE.set(None if mesh is None else (mesh, dict(rules)))
  try:
    yield
  finally:
    _ACTIVE.reset(token)


def active_mesh() -> Mesh | None:
  """The mesh of the innermost ``activation_sharding`` block, or None."""
  active = _ACTIVE.get()
  return None if active is None else active[0]


def active_rules() -> dict[str, str | None]:
  """The logical-name rules of the innermost ``activation_sharding`` block (the defaults,
  ``ACTIVATION_RULES``, outside one)."""
  active = _ACTIVE.get()
  return dict(ACTIVATION_RULES) if active is None else dict(active[1])


def spec_for(shape: Sequence[int], names: Sequence[str | None], mesh: Mesh,
             rules: dict[str, str | None]) -> P:
  """The ``PartitionSpec`` of an activation: each named axis on its mesh axis when that
  mesh axis has more than one device and divides the axis evenly, else whole."""
  if len(names) != len(shape):
    raise ValueError(f"constrain: {len(names)} axis names {tuple(names)} for an array of "
                     f"rank {len(shape)} {tuple(shape)}")
  entries: list[str | None] = []
  for size, name in zip(shape, names):
    axis = rules.get(name) if name is not None else None
    ways = mesh.shape[axis] if axis is not None else 1
    entries.append(axis if ways > 1 and size % ways == 0 else None)
  while entries and entries[-1] is None:
    entries.pop()
  return P(*entries)


def constrain(x: Array, *names: str | None) -> Array:
  """``x`` constrained to the sharding its logical axis ``names`` give, inside
  ``activation_sharding``; ``x`` itself outside one. One name (or None) per axis."""
  active = _ACTIVE.get()
  if active is None:
    return x
  mesh, rules = active
  if math.prod(mesh.shape.values()) == 1:
    return x
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec_for(x.shape, names, mesh,
                                                                          rules)))
