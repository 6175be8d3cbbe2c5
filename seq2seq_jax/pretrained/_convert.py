"""The name and shape mapping shared by the BART-family checkpoints (Marian, M2M100).

A ``Rule`` pairs one tensor of the checkpoint with one parameter of this library's
``Transformer`` and converts both ways. PyTorch ``Linear`` weights are
``[out, in]``; the library's attention kernels are ``[D, H, K]`` (query, key,
value) and ``[H, K, D]`` (output), its dense kernels ``[in, out]``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Callable

import numpy as np

from seq2seq_jax.configs import TransformerConfig


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
