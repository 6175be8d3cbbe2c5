"""An ensemble of models with one vocabulary, itself a model: their predictions averaged.

``Ensemble`` follows the model contract (``encode``, ``decode``, ``init_cache``,
``decode_step``), so ``generate``, the searches, the ``Translator`` and the command
line decode with it as with one model: one step function runs every member and
combines their next-token log-probabilities, inside the same jitted loop. Members
may be of any family (a Transformer and an RNN together) as long as they share the
vocabulary and the special ids; their memories and caches travel side by side as
a tuple, and beam search reorders them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seq2seq_jax.models.base import special_ids
from seq2seq_jax.types import Array, PyTree

AVERAGES = ("log", "probability")


@dataclasses.dataclass(frozen=True)
class EnsembleConfig:
  """What the decoders read of an ensemble: the members' shared ids, the shortest limit."""

  pad_id: int
  decoder_start_id: int
  eos_id: int
  vocab_size: int
  max_len: int | None  # the smallest member max_len (None when no member has one)


def _output_vocab(model: nn.Module) -> int | None:
  config = getattr(model, "config", None)
  return getattr(config, "output_vocab_size", getattr(config, "vocab_size", None))


def ensemble_params(member_params: Sequence[PyTree]) -> dict[str, PyTree]:
  """The ensemble's parameters from each member's, in the order of ``Ensemble.models``.

  Example:
    >>> sorted(ensemble_params([{"w": 1}, {"w": 2}]))
    ['models_0', 'models_1']
  """
  return {f"models_{i}": params for i, params in enumerate(member_params)}


class Ensemble(nn.Module):
  """Several encoder-decoders over one vocabulary decoding as one model.

  Each step every member reads its own memory and cache; their next-token
  distributions are combined with ``weights`` (default: equal):

  - ``average="log"``: the weighted mean of the log-probabilities, renormalized by
    the searches (a normalized weighted geometric mean of the distributions, as
    Marian and OpenNMT combine ensembles);
  - ``average="probability"``: the log of the weighted mean of the probabilities
    (fairseq's ensemble).

  ``decode`` and ``decode_step`` return these combined scores as the logits (for
  ``"log"``, the weighted sum of the members' logits, which differs from the weighted
  mean of their log-probabilities by one constant per row: the same distribution).
  Parameters are ``ensemble_params([params_0, params_1, ...])``.

  Example:
    >>> from seq2seq_jax import DecodeConfig, Transformer, TransformerConfig, generate
    >>> config = TransformerConfig(vocab_size=32, model_dim=16, num_heads=2, mlp_dim=32,
    ...                            num_encoder_layers=1, num_decoder_layers=1)
    >>> model = Transformer(config)
    >>> inputs = jnp.array([[5, 6, 7, 2]])
    >>> params = [model.init(jax.random.key(seed), inputs, inputs)["params"] for seed in (0, 1)]
    >>> ensemble = Ensemble(models=(model, model))
    >>> tokens, scores = generate(ensemble, ensemble_params(params), inputs,
    ...                           DecodeConfig(method="beam", max_decode_len=8))
    >>> tokens.shape
    (1, 8)
  """

  models: tuple[nn.Module, ...]
  weights: tuple[float, ...] | None = None  # one per member, normalized; None = equal
  average: str = "log"  # "log" or "probability", see the class docstring

  def __post_init__(self):
    if not isinstance(self.models, tuple) or not self.models:
      raise ValueError(f"Ensemble.models must be a non-empty tuple of models; got "
                       f"{type(self.models).__name__}")
    ids = [special_ids(m) for m in self.models]
    for i, member in enumerate(ids[1:], start=1):
      if member != ids[0]:
        raise ValueError(f"Ensemble.models[{i}] has special ids {member}, models[0] has "
                         f"{ids[0]}: members must share one vocabulary and its ids")
    vocabs = [_output_vocab(m) for m in self.models]
    if len({v for v in vocabs if v is not None}) > 1:
      raise ValueError(f"Ensemble.models have output vocabularies of sizes {vocabs}: members "
                       "must share one target vocabulary")
    if self.weights is not None and (len(self.weights) != len(self.models)
                                     or not all(w > 0 for w in self.weights)):
      raise ValueError(f"Ensemble.weights={self.weights!r}: give one positive weight per "
                       f"member ({len(self.models)}), or None for equal weights")
    if self.average not in AVERAGES:
      raise ValueError(f"Ensemble.average={self.average!r} must be one of {AVERAGES}")
    super().__post_init__()

  @property
  def config(self) -> EnsembleConfig:
    """The shared ids and vocabulary, and the smallest member ``max_len``."""
    ids = special_ids(self.models[0])
    limits = [getattr(getattr(m, "config", None), "max_len", None) for m in self.models]
    known = [limit for limit in limits if limit is not None]
    return EnsembleConfig(pad_id=ids.pad_id, decoder_start_id=ids.decoder_start_id,
                          eos_id=ids.eos_id, vocab_size=_output_vocab(self.models[0]) or 0,
                          max_len=min(known) if known else None)

  def _combine(self, logits: Sequence[Array]) -> Array:
    """The members' logits ``[..., V]`` -> the ensemble's scores ``[..., V]``, float32."""
    if len(logits) == 1:
      return logits[0].astype(jnp.float32)
    weights = [w / sum(self.weights) for w in self.weights] if self.weights else (
        [1.0 / len(logits)] * len(logits))
    if self.average == "log":
      # sum_i w_i log p_i = sum_i w_i logits_i - sum_i w_i logsumexp(logits_i): a shift per
      # row that the searches' softmax removes, so the log-softmaxes are never computed.
      combined = weights[0] * logits[0].astype(jnp.float32)
      for w, x in zip(weights[1:], logits[1:]):
        combined = combined + w * x.astype(jnp.float32)
      return combined
    logprobs_M = jnp.stack([jax.nn.log_softmax(x.astype(jnp.float32), axis=-1) for x in logits])
    log_weights_M = jnp.log(jnp.asarray(weights, jnp.float32)).reshape(
        (len(logits),) + (1,) * (logprobs_M.ndim - 1))
    return jax.nn.logsumexp(logprobs_M + log_weights_M, axis=0)

  def encode(self, inputs_BS: Array, *, deterministic: bool = True) -> tuple[PyTree, ...]:
    """Every member's memory, as a tuple."""
    return tuple(m.encode(inputs_BS, deterministic=deterministic) for m in self.models)

  def decode(self, memory: tuple[PyTree, ...], targets_BT: Array, *, deterministic: bool = True,
             return_attention: bool = False) -> Array:
    """Teacher-forced decoding: the combined scores ``[B, T, V]``."""
    if return_attention:
      raise ValueError("an Ensemble has no single attention to return; ask a member")
    return self._combine([m.decode(mem, targets_BT, deterministic=deterministic)
                          for m, mem in zip(self.models, memory)])

  def __call__(self, inputs_BS: Array, targets_BT: Array, *, deterministic: bool = True,
               return_attention: bool = False) -> Array:
    return self.decode(self.encode(inputs_BS, deterministic=deterministic), targets_BT,
                       deterministic=deterministic, return_attention=return_attention)

  def init_cache(self, memory: tuple[PyTree, ...], max_decode_len: int) -> tuple[Any, ...]:
    """Every member's cache, as a tuple."""
    return tuple(m.init_cache(mem, max_decode_len) for m, mem in zip(self.models, memory))

  def decode_step(self, memory: tuple[PyTree, ...], tokens_B: Array,
                  cache: tuple[Any, ...]) -> tuple[Array, tuple[Any, ...]]:
    """One step of every member; returns the combined scores ``[B, V]`` and the caches."""
    steps = [m.decode_step(mem, tokens_B, c) for m, mem, c in zip(self.models, memory, cache)]
    return self._combine([logits for logits, _ in steps]), tuple(c for _, c in steps)
