"""seq2seq_jax: sequence-to-sequence models for machine translation in JAX and Flax.

The public API is what ``__all__`` lists. Models, configs and decoding import
eagerly; the names that pull in orbax, grain and tensorflow-datasets (training,
checkpoints, data, the Translator and the rest of ``inference``) load on first use, so ``import seq2seq_jax``
stays quick for programs that only run a model.
"""

import importlib

from seq2seq_jax import decoding as decoding
from seq2seq_jax import types as types
from seq2seq_jax.configs import DataConfig as DataConfig
from seq2seq_jax.configs import DecodeConfig as DecodeConfig
from seq2seq_jax.configs import DecomposableAttentionConfig as DecomposableAttentionConfig
from seq2seq_jax.configs import ExperimentConfig as ExperimentConfig
from seq2seq_jax.configs import RNNConfig as RNNConfig
from seq2seq_jax.configs import T5Config as T5Config
from seq2seq_jax.configs import TrainConfig as TrainConfig
from seq2seq_jax.configs import TransformerConfig as TransformerConfig
from seq2seq_jax.decoding import StepFn as StepFn
from seq2seq_jax.decoding import TokenRules as TokenRules
from seq2seq_jax.decoding import beam_search as beam_search
from seq2seq_jax.decoding import decode_length as decode_length
from seq2seq_jax.decoding import expand_to_beams as expand_to_beams
from seq2seq_jax.decoding import generate as generate
from seq2seq_jax.decoding import generate_uncached as generate_uncached
from seq2seq_jax.decoding import greedy_search as greedy_search
from seq2seq_jax.decoding import length_penalty as length_penalty
from seq2seq_jax.decoding import sample as sample
from seq2seq_jax.models.base import shift_right as shift_right
from seq2seq_jax.models.base import special_ids as special_ids
from seq2seq_jax.models.decomposable import DecomposableAttention as DecomposableAttention
from seq2seq_jax.models.ensemble import Ensemble as Ensemble
from seq2seq_jax.models.ensemble import ensemble_params as ensemble_params
from seq2seq_jax.models.registry import build_model as build_model
from seq2seq_jax.models.rnn_seq2seq import RNNSeq2Seq as RNNSeq2Seq
from seq2seq_jax.models.t5 import T5 as T5
from seq2seq_jax.models.transformer import Transformer as Transformer
from seq2seq_jax.presets import apply_overrides as apply_overrides
from seq2seq_jax.presets import get_preset as get_preset

__version__ = "0.1.0"

# name -> module that defines it; imported on first attribute access (PEP 562).
_LAZY = {
    "allocator": None,
    "benchmarking": None,
    "data": None,
    "evaluation": None,
    "inference": None,
    "pretrained": None,
    "quantization": None,
    "serving": None,
    "visualization": None,
    "Translator": "seq2seq_jax.inference.translator",
    "translate_file": "seq2seq_jax.inference.files",
    "export_translator": "seq2seq_jax.inference.exported",
    "load_exported": "seq2seq_jax.inference.exported",
    "quantize": "seq2seq_jax.quantization",
    "train": "seq2seq_jax.training.loop",
    "TrainResult": "seq2seq_jax.training.loop",
    "ConfigMismatchError": "seq2seq_jax.training.loop",
    "NonFiniteLossError": "seq2seq_jax.training.loop",
    "Checkpointer": "seq2seq_jax.checkpoints",
    "CheckpointError": "seq2seq_jax.checkpoints",
    "load_params": "seq2seq_jax.training.restore",
    "average_checkpoints": "seq2seq_jax.training.restore",
    "corpus_bleu": "seq2seq_jax.evaluation",
    "corpus_chrf": "seq2seq_jax.evaluation",
    "make_mesh": "seq2seq_jax.training.sharding",
    "maybe_initialize_distributed": "seq2seq_jax.training.sharding",
    "state_sharding_fn": "seq2seq_jax.training.sharding",
}


def __getattr__(name: str):
  if name not in _LAZY:
    raise AttributeError(f"module 'seq2seq_jax' has no attribute {name!r}")
  module = _LAZY[name]
  value = (importlib.import_module(f"seq2seq_jax.{name}") if module is None
           else getattr(importlib.import_module(module), name))
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_LAZY))


__all__ = [
    # configs
    "DataConfig",
    "DecodeConfig",
    "DecomposableAttentionConfig",
    "ExperimentConfig",
    "RNNConfig",
    "T5Config",
    "TrainConfig",
    "TransformerConfig",
    "get_preset",
    "apply_overrides",
    # models
    "Transformer",
    "T5",
    "RNNSeq2Seq",
    "DecomposableAttention",
    "Ensemble",
    "ensemble_params",
    "build_model",
    "shift_right",
    "special_ids",
    # decoding
    "StepFn",
    "TokenRules",
    "beam_search",
    "decode_length",
    "expand_to_beams",
    "generate",
    "generate_uncached",
    "greedy_search",
    "length_penalty",
    "sample",
    # training, checkpoints, use
    "train",
    "TrainResult",
    "ConfigMismatchError",
    "NonFiniteLossError",
    "Checkpointer",
    "CheckpointError",
    "load_params",
    "average_checkpoints",
    "Translator",
    "translate_file",
    "export_translator",
    "load_exported",
    "quantize",
    "corpus_bleu",
    "corpus_chrf",
    # many devices and hosts
    "make_mesh",
    "maybe_initialize_distributed",
    "state_sharding_fn",
    # modules
    "allocator",
    "benchmarking",
    "data",
    "decoding",
    "evaluation",
    "inference",
    "pretrained",
    "quantization",
    "serving",
    "types",
    "visualization",
]
