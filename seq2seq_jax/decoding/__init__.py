"""Decoding: greedy search, sampling and beam search over one step-function contract.

Nothing here imports a model. The searches take ``step_fn(tokens_N, cache) ->
(logits_NV, cache)`` (``StepFn``); ``generate`` builds it from any model with
``encode``, ``init_cache`` and ``decode_step``.

The controls on the outputs live in the same loops, each off by default: token
rules and repetition control (``TokenRules``, ``repetition``), per-sentence target
prefixes (``prefix``) and lexical constraints (``constraints``), and beam search's
length-penalty forms, stopping rules and diverse groups (``beam_search``).
"""

from seq2seq_jax.decoding.beam import BeamState as BeamState
from seq2seq_jax.decoding.beam import beam_search as beam_search
from seq2seq_jax.decoding.beam import expand_to_beams as expand_to_beams
from seq2seq_jax.decoding.beam import gather_beams as gather_beams
from seq2seq_jax.decoding.beam import length_penalty as length_penalty
from seq2seq_jax.decoding.constraints import pad_constraints as pad_constraints
from seq2seq_jax.decoding.generation import check_controls as check_controls
from seq2seq_jax.decoding.generation import decode_length as decode_length
from seq2seq_jax.decoding.generation import generate as generate
from seq2seq_jax.decoding.generation import generate_uncached as generate_uncached
from seq2seq_jax.decoding.generation import search_fn as search_fn
from seq2seq_jax.decoding.greedy import greedy_search as greedy_search
from seq2seq_jax.decoding.prefix import pad_target_prefix as pad_target_prefix
from seq2seq_jax.decoding.sampling import sample as sample
from seq2seq_jax.decoding.sampling import sample_logprobs as sample_logprobs
from seq2seq_jax.decoding.step import StepFn as StepFn
from seq2seq_jax.decoding.step import TokenRules as TokenRules

__all__ = [
    "BeamState",
    "StepFn",
    "TokenRules",
    "beam_search",
    "check_controls",
    "decode_length",
    "expand_to_beams",
    "gather_beams",
    "generate",
    "generate_uncached",
    "greedy_search",
    "length_penalty",
    "pad_constraints",
    "pad_target_prefix",
    "sample",
    "sample_logprobs",
    "search_fn",
]
