"""The name and shape mapping shared by the BART-family checkpoints (Marian, M2M100).

A ``Rule`` pairs one tensor of the checkpoint with one parameter of this library's
``Transformer`` and converts both ways. PyTorch ``Linear`` weights are
``[out, in]``; the library's attention kernels are ``[D, H, K]`` (query, key,
value) and ``[H, K, D]`` (output), its dense kernels ``[in, out]``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable

import numpy as np

from seq2seq_jax.configs import TransformerConfig


# transformers' activation names -> TransformerConfig.activation.
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "swish": "swish", "silu": "swish"}


def field(hf: dict[str, Any], name: str, defaults: dict[str, Any]) -> Any:
  value = hf.get(name)
  return defaults[name] if value is None else value


def same_in_both(hf: dict[str, Any], encoder: str, decoder: str, defaults: dict[str, Any],
                 source: pathlib.Path) -> Any:
  value, other = field(hf, encoder, defaults), field(hf, decoder, defaults)
  if value != other:
    raise ValueError(f"{source}: {encoder}={value} but {decoder}={other}; this library's "
                     "Transformer gives encoder and decoder the same width and heads")
  return value


def activation(hf: dict[str, Any], defaults: dict[str, Any], source: pathlib.Path) -> str:
  name = field(hf, "activation_function", defaults)
  if name not in ACTIVATIONS:
    raise ValueError(f"{source}: activation_function={name!r} is not supported; supported: "
                     f"{', '.join(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def bart_fields(hf: dict[str, Any], defaults: dict[str, Any],
                source: pathlib.Path) -> dict[str, Any]:
  """The ``TransformerConfig`` fields every BART-layout config.json gives the same way."""
  d = defaults
  return dict(
      model_dim=field(hf, "d_model", d),
      num_heads=same_in_both(hf, "encoder_attention_heads", "decoder_attention_heads", d, source),
      num_encoder_layers=field(hf, "encoder_layers", d),
      num_decoder_layers=field(hf, "decoder_layers", d),
      mlp_dim=same_in_both(hf, "encoder_ffn_dim", "decoder_ffn_dim", d, source),
      dropout_rate=float(field(hf, "dropout", d)),
      attention_dropout_rate=float(field(hf, "attention_dropout", d)),
      activation_dropout_rate=float(field(hf, "activation_dropout", d)),
      max_len=field(hf, "max_position_embeddings", d),
      tie_output=bool(field(hf, "tie_word_embeddings", d)),
      activation=activation(hf, d, source),
      scale_embeddings=bool(field(hf, "scale_embedding", d)),
      layer_norm_epsilon=1e-5,  # PyTorch's nn.LayerNorm default, which both families keep
      pad_id=field(hf, "pad_token_id", d),
      decoder_start_id=field(hf, "decoder_start_token_id", d),
      eos_id=field(hf, "eos_token_id", d))


@dataclasses.dataclass(frozen=True)
class Rule:
  """One checkpoint tensor <-> one parameter (a path into the params tree)."""

  hf_name: str
  path: tuple[str, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _identity(x: np.ndarray) -> np.ndarray:
  return x


def _rules_for_attention(hf: str, ours: tuple[str, ...], c: TransformerConfig) -> list[Rule]:
  d, h, k = c.model_dim, c.num_heads, c.head_dim
  rules = []
  for hf_proj, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
    rules += [
        Rule(f"{hf}.{hf_proj}.weight", ours + (name, "kernel"),
             lambda w: w.T.reshape(d, h, k), lambda w: w.reshape(d, h * k).T),
        Rule(f"{hf}.{hf_proj}.bias", ours + (name, "bias"),
             lambda b: b.reshape(h, k), lambda b: b.reshape(h * k)),
    ]
  return rules + [
      Rule(f"{hf}.out_proj.weight", ours + ("out", "kernel"),
           lambda w: w.T.reshape(h, k, d), lambda w: w.reshape(h * k, d).T),
      Rule(f"{hf}.out_proj.bias", ours + ("out", "bias"), _identity, _identity),
  ]


def _rules_for_norm(hf: str, ours: tuple[str, ...]) -> list[Rule]:
  return [Rule(f"{hf}.weight", ours + ("scale",), _identity, _identity),
          Rule(f"{hf}.bias", ours + ("bias",), _identity, _identity)]


def _rules_for_dense(hf: str, ours: tuple[str, ...]) -> list[Rule]:
  return [Rule(f"{hf}.weight", ours + ("kernel",), np.transpose, np.transpose),
          Rule(f"{hf}.bias", ours + ("bias",), _identity, _identity)]


def bart_rules(c: TransformerConfig, *, final_norms: bool) -> list[Rule]:
  """Every layer tensor of a BART-layout encoder-decoder, embeddings and head excluded."""
  rules = []
  for i in range(c.num_encoder_layers):
    hf, ours = f"model.encoder.layers.{i}", (f"encoder_layers_{i}",)
    rules += _rules_for_attention(f"{hf}.self_attn", ours + ("self_attention",), c)
    rules += _rules_for_norm(f"{hf}.self_attn_layer_norm", ours + ("attention_residual", "norm"))
    rules += _rules_for_dense(f"{hf}.fc1", ours + ("feed_forward", "wi"))
    rules += _rules_for_dense(f"{hf}.fc2", ours + ("feed_forward", "wo"))
    rules += _rules_for_norm(f"{hf}.final_layer_norm", ours + ("feed_forward_residual", "norm"))
  for i in range(c.num_decoder_layers):
    hf, ours = f"model.decoder.layers.{i}", (f"decoder_layers_{i}",)
    rules += _rules_for_attention(f"{hf}.self_attn", ours + ("self_attention",), c)
    rules += _rules_for_norm(f"{hf}.self_attn_layer_norm", ours + ("self_residual", "norm"))
    rules += _rules_for_attention(f"{hf}.encoder_attn", ours + ("cross_attention",), c)
    rules += _rules_for_norm(f"{hf}.encoder_attn_layer_norm", ours + ("cross_residual", "norm"))
    rules += _rules_for_dense(f"{hf}.fc1", ours + ("feed_forward", "wi"))
    rules += _rules_for_dense(f"{hf}.fc2", ours + ("feed_forward", "wo"))
    rules += _rules_for_norm(f"{hf}.final_layer_norm", ours + ("feed_forward_residual", "norm"))
  if final_norms:
    rules += _rules_for_norm("model.encoder.layer_norm", ("encoder_norm",))
    rules += _rules_for_norm("model.decoder.layer_norm", ("decoder_norm",))
  return rules


def embedding_rules(c: TransformerConfig, tensors: dict[str, np.ndarray] | None) -> list[Rule]:
  """Token tables and, when untied, the output layer.

  Tied checkpoints store one table as ``model.shared.weight`` (older ones also as
  ``model.encoder.embed_tokens.weight`` ...); when writing, the names
  ``save_pretrained`` itself writes are used.
  """
  def first_present(*names: str) -> str:
    if tensors is not None:
      for name in names:
        if name in tensors:
          return name
    return names[0]

  if c.share_embeddings:
    rules = [Rule(first_present("model.shared.weight", "model.encoder.embed_tokens.weight"),
                  ("source_embedding", "embedding"), _identity, _identity)]
  else:
    rules = [Rule("model.encoder.embed_tokens.weight", ("source_embedding", "embedding"),
                  _identity, _identity),
             Rule("model.decoder.embed_tokens.weight", ("target_embedding", "embedding"),
                  _identity, _identity)]
  if not c.tie_output:
    rules.append(Rule("lm_head.weight", ("output_projection", "kernel"), np.transpose,
                      np.transpose))
  return rules


def set_path(tree: dict, path: tuple[str, ...], value: np.ndarray) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def get_path(tree: dict, path: tuple[str, ...]) -> np.ndarray:
  for key in path:
    tree = tree[key]
  return tree


def apply_rules(rules: list[Rule], tensors: dict[str, np.ndarray], expected: dict,
                source: pathlib.Path) -> dict:
  """Builds the params tree; a missing tensor or a wrong shape raises naming both sides.

  ``expected`` is the parameter tree's shapes (``jax.eval_shape`` of ``init``).
  """
  params: dict = {}
  for rule in rules:
    if rule.hf_name not in tensors:
      raise ValueError(f"{source}: tensor {rule.hf_name!r} is missing (needed for parameter "
                       f"{'/'.join(rule.path)}); is config.json the one saved with these weights?")
    value = np.asarray(rule.to_ours(np.asarray(tensors[rule.hf_name], np.float32)))
    want = tuple(get_path(expected, rule.path).shape)
    if value.shape != want:
      raise ValueError(f"{source}: tensor {rule.hf_name!r} has shape "
                       f"{tuple(tensors[rule.hf_name].shape)}, which does not fit parameter "
                       f"{'/'.join(rule.path)} {want} of the model config.json describes")
    set_path(params, rule.path, value)
  return params
