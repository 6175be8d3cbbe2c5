"""Model-level decoding: encode, build the step function, search; and an uncached reference."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.configs import DecodeConfig
from seq2seq_jax.decoding import constraints as constraints_lib
from seq2seq_jax.decoding import prefix as prefix_lib
from seq2seq_jax.decoding.beam import beam_search, expand_to_beams
from seq2seq_jax.decoding.greedy import greedy_search
from seq2seq_jax.decoding.sampling import sample
from seq2seq_jax.decoding.step import StepFn, TokenRules, check_cache, never_emitted
from seq2seq_jax.models.base import special_ids
from seq2seq_jax.types import Array, ArrayLike, PRNGKey, PyTree


def decode_length(model: nn.Module, source_len: int, decode_config: DecodeConfig) -> int:
  """The output length limit for sources padded to ``source_len``.

  ``DecodeConfig.decode_len``; a limit derived from the ratio is capped at the
  model's ``config.max_len`` when it has one (an explicit ``max_decode_len`` is not,
  so a model that cannot decode that far says so).
  """
  length = decode_config.decode_len(source_len)
  max_len = getattr(getattr(model, "config", None), "max_len", None)
  if not decode_config.max_decode_len and max_len is not None:
    length = min(length, max_len)
  return length


def _cached_step_fn(model: nn.Module, params: PyTree, memory: PyTree) -> StepFn:
  def step_fn(tokens_N: Array, cache: PyTree) -> tuple[Array, PyTree]:
    return model.apply({"params": params}, memory, tokens_N, cache, method="decode_step")
  return step_fn


def _uncached_step_fn(model: nn.Module, params: PyTree, memory: PyTree) -> StepFn:
  """Re-runs ``decode`` on the whole prefix; its cache is the prefix itself.

  Cache: ``{"targets_NT": int32 [N, T + 1], "index": int32 scalar}``. Column
  ``index`` receives the token fed at step ``index`` (the decoder start at step 0),
  so columns 1.. hold the generated tokens, which ``decode`` shifts right behind the
  start itself. Causal attention keeps the unwritten PAD columns from reaching
  position ``index``.
  """
  def step_fn(tokens_N: Array, cache: PyTree) -> tuple[Array, PyTree]:
    index = cache["index"]
    targets_NT = cache["targets_NT"].at[:, index].set(tokens_N.astype(jnp.int32))
    logits_NTV = model.apply({"params": params}, memory, targets_NT[:, 1:], method="decode")
    logits_NV = jax.lax.dynamic_index_in_dim(logits_NTV, index, axis=1, keepdims=False)
    return logits_NV, {"targets_NT": targets_NT, "index": index + 1}
  return step_fn


def _search(model: nn.Module, params: PyTree, inputs_BS: Array, rng: PRNGKey,
            target_prefix_BP: Array | None = None, constraints_BCL: Array | None = None, *,
            decode_config: DecodeConfig, max_decode_len: int, cached: bool, n_best: bool):
  batch = inputs_BS.shape[0]
  ids = special_ids(model)
  memory = model.apply({"params": params}, inputs_BS, method="encode")
  check_cache(memory, batch, "memory")
  if cached:
    cache = model.apply({"params": params}, memory, max_decode_len, method="init_cache")
    make_step_fn = _cached_step_fn
  else:
    cache = {"targets_NT": jnp.full((batch, max_decode_len + 1), ids.pad_id, jnp.int32),
             "index": jnp.zeros((), jnp.int32)}
    make_step_fn = _uncached_step_fn
  config = decode_config
  common: dict[str, Any] = dict(
      batch_size=batch, max_decode_len=max_decode_len, bos_id=ids.decoder_start_id,
      eos_id=ids.eos_id, pad_id=ids.pad_id, rules=token_rules(config))
  if target_prefix_BP is not None:
    common["target_prefix_BP"] = target_prefix_BP
  if config.method == "beam":
    step_fn = make_step_fn(model, params, expand_to_beams(memory, config.beam_size))
    beam_options: dict[str, Any] = {}
    if constraints_BCL is not None:
      beam_options["constraints_BCL"] = constraints_BCL
    tokens_BWT, scores_BW = beam_search(
        step_fn, cache, beam_size=config.beam_size, alpha=config.alpha,
        length_penalty_form=config.length_penalty_form, early_stopping=config.early_stopping,
        num_beam_groups=config.num_beam_groups, diversity_penalty=config.diversity_penalty,
        **beam_options, **common)
    return (tokens_BWT, scores_BW) if n_best else (tokens_BWT[:, 0], scores_BW[:, 0])
  step_fn = make_step_fn(model, params, memory)
  if config.method == "sample":
    return sample(step_fn, cache, rng=rng, temperature=config.temperature, top_k=config.top_k,
                  top_p=config.top_p, **common)
  return greedy_search(step_fn, cache, **common)


_generate = jax.jit(_search, static_argnames=("model", "decode_config", "max_decode_len",
                                              "cached", "n_best"))


def _check_config(decode_config: DecodeConfig, n_best: bool) -> None:
  if n_best and decode_config.method != "beam":
    raise ValueError(f"n_best=True needs method='beam'; got method={decode_config.method!r}")
  if decode_config.num_beam_groups > 1 and decode_config.method != "beam":
    raise ValueError(f"num_beam_groups={decode_config.num_beam_groups} needs method='beam'; "
                     f"got method={decode_config.method!r}")


def search_fn(model: nn.Module, decode_config: DecodeConfig, *, max_decode_len: int,
              n_best: bool = False) -> Callable[..., tuple[Array, Array]]:
  """The pure function ``generate`` jits: ``(params, inputs_BS, rng) -> (tokens, scores)``.

  For callers that jit it themselves, with shardings over a device mesh
  (``seq2seq_jax.inference.Translator``), or serialize it with ``jax.export``.
  The search is the cached one, with a fixed output limit ``max_decode_len``.
  Two optional positional arguments follow ``rng``: the ``[B, P]`` target prefixes
  and ``[B, C, L]`` constraints, as ``check_controls`` returns them.
  """
  _check_config(decode_config, n_best)
  return functools.partial(_search, model, decode_config=decode_config,
                           max_decode_len=max_decode_len, cached=True, n_best=n_best)


def token_rules(config: DecodeConfig) -> TokenRules:
  """The ``TokenRules`` a ``DecodeConfig`` asks for."""
  return TokenRules(suppress_ids=config.suppress_ids, forced_bos_id=config.forced_bos_id,
                    force_eos_at_limit=config.force_eos_at_limit,
                    no_repeat_ngram_size=config.no_repeat_ngram_size,
                    repetition_penalty=config.repetition_penalty,
                    renormalize_logits=config.renormalize_logits)


def _is_ragged(value: Any) -> bool:
  return isinstance(value, (list, tuple))


def check_controls(model: nn.Module, config: DecodeConfig, batch: int, max_decode_len: int,
                   target_prefix: Any, constraints: Any) -> tuple[Any, Any]:
  """The prefix and constraint arrays, padded from lists and checked on the host.

  ``generate`` calls it; a caller of ``search_fn`` passes what it returns. Raises
  ``ValueError`` naming the sentence for a prefix or phrase the search cannot keep.
  """
  ids = special_ids(model)
  rules = token_rules(config)
  never = never_emitted(bos_id=ids.decoder_start_id, eos_id=ids.eos_id, pad_id=ids.pad_id,
                        rules=rules)
  offset = int(config.forced_bos_id is not None)
  forced_before: Any = offset
  if target_prefix is not None:
    if _is_ragged(target_prefix):
      target_prefix = prefix_lib.pad_target_prefix(target_prefix, pad_id=ids.pad_id)
    target_prefix = prefix_lib.check_target_prefix(
        target_prefix, batch_size=batch, pad_id=ids.pad_id, max_decode_len=max_decode_len,
        offset=offset, never=never, eos_id=ids.eos_id)
    forced_before = offset + np.sum(target_prefix != ids.pad_id, axis=1)
  if constraints is not None:
    if config.method != "beam":
      raise ValueError(f"constraints need method='beam' (dynamic beam allocation); got "
                       f"method={config.method!r}")
    if config.num_beam_groups > 1:
      raise ValueError("constraints cannot be combined with num_beam_groups > 1; set "
                       "num_beam_groups=1")
    if _is_ragged(constraints):
      constraints = constraints_lib.pad_constraints(constraints, pad_id=ids.pad_id)
    constraints = constraints_lib.check_constraints(
        constraints, batch_size=batch, pad_id=ids.pad_id, max_decode_len=max_decode_len,
        forced_before=forced_before, never=never, eos_id=ids.eos_id,
        eos_at_limit=config.force_eos_at_limit)
  return target_prefix, constraints


def _run(model, params, inputs_BS, decode_config, rng, cached, n_best, target_prefix,
         constraints):
  if not isinstance(decode_config, DecodeConfig):
    raise TypeError(f"decode_config must be a DecodeConfig; got {type(decode_config).__name__}")
  _check_config(decode_config, n_best)
  inputs_BS = jnp.asarray(inputs_BS)
  if inputs_BS.ndim != 2 or not jnp.issubdtype(inputs_BS.dtype, jnp.integer):
    raise ValueError(f"inputs_BS must be integer token ids [B, S]; got {inputs_BS.dtype} "
                     f"{inputs_BS.shape}")
  if rng is None:
    rng = jax.random.key(decode_config.seed)
  max_decode_len = decode_length(model, inputs_BS.shape[1], decode_config)
  target_prefix, constraints = check_controls(model, decode_config, inputs_BS.shape[0],
                                              max_decode_len, target_prefix, constraints)
  return _generate(model, params, inputs_BS.astype(jnp.int32), rng, target_prefix, constraints,
                   decode_config=decode_config, max_decode_len=max_decode_len, cached=cached,
                   n_best=n_best)


def generate(model: nn.Module, params: PyTree, inputs_BS: ArrayLike | Sequence[Sequence[int]],
             decode_config: DecodeConfig, *, rng: PRNGKey | None = None, n_best: bool = False,
             target_prefix: ArrayLike | Sequence[Sequence[int]] | None = None,
             constraints: ArrayLike | Sequence[Sequence[Sequence[int]]] | None = None
             ) -> tuple[Array, Array]:
  """Translates a batch of source ids with a model that follows the model contract.

  Encodes, builds the cache (``init_cache``) and a step function closed over the
  parameters and memory (``decode_step``), then runs the search that
  ``decode_config.method`` names; memory is tiled for beams with
  ``expand_to_beams``. Jitted: a second call with the same shapes, model and config
  does not recompile, so pad sources to a few bucket lengths.

  Args:
    model: a Linen module with ``encode``, ``init_cache`` and ``decode_step``.
    params: its parameters (the ``"params"`` collection).
    inputs_BS: int source ids (an array or lists of equal length), the model's pad id
      after each row's EOS.
    decode_config: method, beam size, length penalty, length limit, sampling knobs
      and token rules (forced first token, EOS at the limit, suppressed ids). The
      length limit is ``decode_config.decode_len(S)`` (see ``decode_length``).
      The pad, decoder start and eos ids are the model's (``special_ids``).
    rng: sampling key; defaults to ``jax.random.key(decode_config.seed)``.
    n_best: beam search only: return all W hypotheses.
    target_prefix: per sentence, token ids every output must begin with (after a
      forced language code), as lists (``[]`` for none) or an int array ``[B, P]``
      padded with the model's pad id; given, not scored (see ``decoding.prefix``).
    constraints: beam search only: per sentence, phrases (lists of token ids) every
      output must contain, or an int array ``[B, C, L]`` padded with the pad id
      (see ``decoding.constraints``).

  Returns:
    ``(tokens_BT, scores_B)``, the best output per row (tokens exclude the decoder
    start, include EOS, the model's pad id after it; scores are total log-probabilities, divided by the length
    penalty for beam search), or ``(tokens_BWT, scores_BW)`` best first with ``n_best``.

  Example:
    >>> from seq2seq_jax import Transformer, TransformerConfig
    >>> model = Transformer(TransformerConfig(vocab_size=32, model_dim=16, num_heads=2,
    ...                                       mlp_dim=32, num_encoder_layers=1,
    ...                                       num_decoder_layers=1))
    >>> inputs = jnp.array([[5, 6, 7, 2]])
    >>> params = model.init(jax.random.key(0), inputs, inputs)["params"]
    >>> tokens, scores = generate(model, params, inputs, DecodeConfig(method="beam"))
    >>> tokens.shape, scores.shape  # the length limit: DecodeConfig's ratio rule for S = 4
    ((1, 16), (1,))

    Every output begins with ``[9, 10]`` and contains ``[11, 12]`` and ``[13]``:

    >>> tokens, _ = generate(model, params, inputs, DecodeConfig(method="beam"),
    ...                      target_prefix=[[9, 10]], constraints=[[[11, 12], [13]]])
    >>> tokens[0, :2].tolist(), {11, 12, 13} <= set(tokens[0].tolist())
    ([9, 10], True)
  """
  return _run(model, params, inputs_BS, decode_config, rng, cached=True, n_best=n_best,
              target_prefix=target_prefix, constraints=constraints)


def generate_uncached(model: nn.Module, params: PyTree,
                      inputs_BS: ArrayLike | Sequence[Sequence[int]],
                      decode_config: DecodeConfig, *, rng: PRNGKey | None = None,
                      n_best: bool = False,
                      target_prefix: ArrayLike | Sequence[Sequence[int]] | None = None,
                      constraints: ArrayLike | Sequence[Sequence[Sequence[int]]] | None = None
                      ) -> tuple[Array, Array]:
  """``generate`` without a cache: every step re-runs ``decode`` on the whole prefix.

  The reference that cached decoding must match (tests) and the baseline it must
  beat (benchmarks): same arguments, same searches, same output conventions. Each
  step costs a full teacher-forced decoder pass over ``T`` positions.
  """
  return _run(model, params, inputs_BS, decode_config, rng, cached=False, n_best=n_best,
              target_prefix=target_prefix, constraints=constraints)
