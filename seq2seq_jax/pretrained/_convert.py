"""The name and shape mapping shared by the BART-family checkpoints (Marian, M2M100, mBART).

A ``Rule`` pairs one tensor of the checkpoint with one parameter of this library's
``Transformer`` and converts both ways. PyTorch ``Linear`` weights are
``[out, in]``; the library's attention kernels are ``[D, H, K]`` (query, key,
value) and ``[H, K, D]`` (output), its dense kernels ``[in, out]``.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Container
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.configs import StackShape, TransformerConfig
from seq2seq_jax.pretrained._io import ALIGNMENT, Weights, aligned_copy


# transformers' activation names -> TransformerConfig.activation.
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "swish": "swish", "silu": "swish"}
# The config.json defaults MarianConfig, M2M100Config and MBartConfig share (each family's
# DEFAULTS adds its vocabulary, special ids, activation and scaling).
BART_DEFAULTS = {"d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
                 "encoder_attention_heads": 16, "decoder_attention_heads": 16,
                 "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "dropout": 0.1,
                 "attention_dropout": 0.0, "activation_dropout": 0.0,
                 "max_position_embeddings": 1024, "tie_word_embeddings": True}
# The token table's names in a BART-layout file: copies of one table when tied.
BART_TOKEN_TABLES = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                     "lm_head.weight", "model.shared.weight")


def field(hf: dict[str, Any], name: str, defaults: dict[str, Any]) -> Any:
  value = hf.get(name)
  return defaults[name] if value is None else value


def activation(hf: dict[str, Any], defaults: dict[str, Any], source: pathlib.Path) -> str:
  name = field(hf, "activation_function", defaults)
  if name not in ACTIVATIONS:
    raise ValueError(f"{source}: activation_function={name!r} is not supported; supported: "
                     f"{', '.join(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def bart_config(hf: dict[str, Any], defaults: dict[str, Any], source: pathlib.Path,
                dtype: str, **family: Any) -> TransformerConfig:
  """The ``TransformerConfig`` of a BART-layout config.json: the family's own fields
  (``family``: positions, norms, tables) and those every family gives the same way."""
  return TransformerConfig(**family, dtype=dtype, **_bart_fields(hf, defaults, source))


def _bart_fields(hf: dict[str, Any], defaults: dict[str, Any],
                 source: pathlib.Path) -> dict[str, Any]:
  d = defaults
  encoder_heads, decoder_heads = (field(hf, f"{side}_attention_heads", d)
                                  for side in ("encoder", "decoder"))
  encoder_ffn, decoder_ffn = (field(hf, f"{side}_ffn_dim", d) for side in ("encoder", "decoder"))
  model_dim = field(hf, "d_model", d)
  for name, heads in (("encoder_attention_heads", encoder_heads),
                      ("decoder_attention_heads", decoder_heads)):
    if not isinstance(heads, int) or heads <= 0 or model_dim % heads:
      raise ValueError(f"{source}: {name}={heads!r} must be a positive divisor of "
                       f"d_model={model_dim}")
  return dict(
      model_dim=model_dim,
      num_heads=encoder_heads,
      decoder_num_heads=0 if decoder_heads == encoder_heads else decoder_heads,
      num_encoder_layers=field(hf, "encoder_layers", d),
      num_decoder_layers=field(hf, "decoder_layers", d),
      mlp_dim=encoder_ffn,
      decoder_mlp_dim=0 if decoder_ffn == encoder_ffn else decoder_ffn,
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
  """One checkpoint tensor <-> one parameter (a path into the params tree).

  ``hf_name=None``: a parameter the checkpoint's architecture does not have, fixed
  at zero (an untied output layer's bias in M2M100): loaded as zeros, never written,
  and ``save`` refuses it once it is not zero.
  """

  hf_name: str | None
  path: tuple[str, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _identity(x: np.ndarray) -> np.ndarray:
  return x


def _rules_for_attention(hf: str, ours: tuple[str, ...], c: TransformerConfig,
                         stack: StackShape) -> list[Rule]:
  d, h, k = c.model_dim, stack.num_heads, stack.head_dim
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


def bart_rules(c: TransformerConfig, tensors: Container[str] | None, *, final_norms: bool,
               output_bias: str | None = None) -> list[Rule]:
  """Every tensor of a BART-layout encoder-decoder: its layers (learned positions and
  ``layernorm_embedding`` included when the config has them, the stacks' final norms
  with ``final_norms``), then ``embedding_rules``' tables and output layer."""
  rules = []
  if c.positions == "learned":
    for side, ours in (("encoder", "source"), ("decoder", "target")):
      rules.append(Rule(f"model.{side}.embed_positions.weight",
                        (f"{ours}_positions", "position_embedding"), _identity, _identity))
  if c.embedding_norm:
    for side in ("encoder", "decoder"):
      rules += _rules_for_norm(f"model.{side}.layernorm_embedding", (f"{side}_embedding_norm",))
  for side, count, stack in (("encoder", c.num_encoder_layers, c.encoder_stack),
                             ("decoder", c.num_decoder_layers, c.decoder_stack)):
    for i in range(count):
      hf, ours = f"model.{side}.layers.{i}", (f"{side}_layers_{i}",)
      rules += _rules_for_attention(f"{hf}.self_attn", ours + ("self_attention",), c, stack)
      # The library names the encoder's one residual and the decoder's first apart.
      residual = "attention_residual" if side == "encoder" else "self_residual"
      rules += _rules_for_norm(f"{hf}.self_attn_layer_norm", ours + (residual, "norm"))
      if side == "decoder":
        rules += _rules_for_attention(f"{hf}.encoder_attn", ours + ("cross_attention",), c,
                                      stack)
        rules += _rules_for_norm(f"{hf}.encoder_attn_layer_norm",
                                 ours + ("cross_residual", "norm"))
      rules += _rules_for_dense(f"{hf}.fc1", ours + ("feed_forward", "wi"))
      rules += _rules_for_dense(f"{hf}.fc2", ours + ("feed_forward", "wo"))
      rules += _rules_for_norm(f"{hf}.final_layer_norm", ours + ("feed_forward_residual", "norm"))
  if final_norms:
    for side in ("encoder", "decoder"):
      rules += _rules_for_norm(f"model.{side}.layer_norm", (f"{side}_norm",))
  return rules + embedding_rules(c, tensors, output_bias)


def embedding_rules(c: TransformerConfig, tensors: Container[str] | None,
                    output_bias: str | None = None) -> list[Rule]:
  """Token tables, the output layer when untied, and the bias added to the logits.

  Tied checkpoints store one table as ``model.shared.weight`` (older ones also as
  ``model.encoder.embed_tokens.weight`` ...); when writing, the names
  ``save_pretrained`` itself writes are used. ``output_bias`` names the tensor added
  to the logits (Marian's and mBART's ``final_logits_bias``): an untied output
  layer's bias, or the tied output's ``output_bias`` when ``c.output_bias`` is set;
  without one an untied output layer's bias is fixed at zero.
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
    rules.append(Rule(output_bias, ("output_projection", "bias"), lambda b: b.reshape(-1),
                      lambda b: b.reshape(1, -1)))
  elif output_bias is not None and c.output_bias:
    rules.append(Rule(output_bias, ("output_bias",), lambda b: b.reshape(-1),
                      lambda b: b.reshape(1, -1)))
  return rules


def set_path(tree: dict, path: tuple[str, ...], value: np.ndarray) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def get_path(tree: dict, path: tuple[str, ...]) -> np.ndarray:
  for key in path:
    tree = tree[key]
  return tree


def read_checked(weights: Weights, name: str, *, check_finite: bool = True) -> np.ndarray:
  """Tensor ``name`` as float32; a NaN or an infinity raises naming the tensor and its file."""
  value = weights.read(name)
  if value.dtype != np.float32:  # float16 / bfloat16 weights: widened into an aligned buffer
    value = aligned_copy(value, np.float32)
  # In blocks of 4M values: np.isfinite of a whole 1 GB embedding is a 250 MB temporary.
  flat, block = value.reshape(-1), 1 << 22
  if check_finite and not all(np.isfinite(flat[i:i + block]).all()
                              for i in range(0, flat.size, block)):
    bad = int(np.count_nonzero(~np.isfinite(flat)))
    raise ValueError(f"{weights.file_of(name)}: tensor {name!r} {tuple(value.shape)} holds {bad} "
                     "non-finite values (NaN or infinity); the file is corrupt (overwritten "
                     "or badly converted): download or save it again")
  return value


def place(value: np.ndarray) -> jax.Array:
  """``value`` as a jax array on the default device, without a second host copy.

  On the CPU a C-contiguous buffer aligned for XLA becomes the array's own memory
  (``may_alias``); anything else is first copied into such a buffer (a transpose
  must be copied anyway). ``jnp.asarray`` of an unaligned array held the tensor
  three times at its peak: a 1 GB embedding took 3 GB for a moment.
  """
  if not (value.flags.c_contiguous and value.ctypes.data % ALIGNMENT == 0):
    value = aligned_copy(value)
  return jax.device_put(value, may_alias=True)


def apply_rules(rules: list[Rule], weights: Weights, expected: dict, *,
                check_finite: bool = True) -> dict:
  """Builds the params tree, one tensor at a time, as float32 jax arrays.

  ``expected`` is the parameter tree's shapes (``jax.eval_shape`` of ``init``). Each
  tensor is read, converted and placed before the next is read, so the checkpoint
  is never held twice. A missing tensor or a wrong shape raises naming both sides;
  with ``check_finite`` a NaN or infinity raises naming the tensor.
  """
  params: dict = {}
  for rule in rules:
    want = tuple(get_path(expected, rule.path).shape)
    if rule.hf_name is None:
      set_path(params, rule.path, jnp.zeros(want, jnp.float32))
      continue
    if rule.hf_name not in weights:
      raise ValueError(f"{weights.path}: tensor {rule.hf_name!r} is missing (needed for "
                       f"parameter {'/'.join(rule.path)}); is config.json the one saved with "
                       "these weights?")
    stored = weights.shape(rule.hf_name)
    value = None
    if math.prod(stored) == math.prod(want):
      value = np.asarray(rule.to_ours(read_checked(weights, rule.hf_name,
                                                   check_finite=check_finite)))
      # The way back must give the stored shape too: a transposed tensor of the right
      # size would otherwise pass through a reshape.
      if value.shape != want or np.shape(rule.to_hf(value)) != stored:
        value = None
    if value is None:
      raise ValueError(f"{weights.file_of(rule.hf_name)}: tensor {rule.hf_name!r} has shape "
                       f"{stored}, which does not fit parameter {'/'.join(rule.path)} {want} "
                       "of the model config.json describes")
    set_path(params, rule.path, place(value))
  return params
