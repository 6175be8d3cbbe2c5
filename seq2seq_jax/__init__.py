"""seq2seq_jax: sequence-to-sequence models for machine translation in JAX and Flax.

The public API is what ``__all__`` lists; everything else is private.
"""

from seq2seq_jax import types as types
from seq2seq_jax.configs import DataConfig as DataConfig
from seq2seq_jax.configs import DecodeConfig as DecodeConfig
from seq2seq_jax.configs import DecomposableAttentionConfig as DecomposableAttentionConfig
from seq2seq_jax.configs import RNNConfig as RNNConfig
from seq2seq_jax.configs import TrainConfig as TrainConfig
from seq2seq_jax.configs import TransformerConfig as TransformerConfig
from seq2seq_jax.models.base import shift_right as shift_right
from seq2seq_jax.models.registry import build_model as build_model
from seq2seq_jax.models.transformer import Transformer as Transformer

__version__ = "0.1.0"

__all__ = [
    "types",
    "DataConfig",
    "DecodeConfig",
    "DecomposableAttentionConfig",
    "RNNConfig",
    "TrainConfig",
    "TransformerConfig",
    "Transformer",
    "build_model",
    "shift_right",
]
