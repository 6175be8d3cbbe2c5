"""T5-family checkpoints (``T5ForConditionalGeneration``, ``MT5ForConditionalGeneration``):
T5, T5 v1.1, flan-T5, mT5 and the MADLAD-400 translation models.

All are this library's ``T5`` (``models/t5.py``): RMSNorm, no biases, a relative
position bias in the first layer of each stack (shared by its layers),
unscaled attention, ReLU (original T5) or gated-GELU (``feed_forward_proj:
"gated-gelu"``: v1.1, flan-T5, mT5, MADLAD) feed-forward layers. The output layer
is the token table or a separate ``lm_head``. Original T5 multiplies the decoder's
output by ``d_model ** -0.5`` before a tied output layer; v1.1 and after do not
(their configs say ``tie_word_embeddings: false``; transformers 5 writes
``scale_decoder_outputs`` instead), and mT5 never does. Whether ``lm_head`` is
separate is decided as transformers decides it: a ``lm_head.weight`` in the file
that differs from ``shared.weight``. Decoding starts from the pad id (0); EOS is 1.
MADLAD-400 marks the target language with a ``<2xx>`` token at the start of the
source (``tokenizers.T5Tokenizer``).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Container
from typing import Any

import numpy as np

from seq2seq_jax.configs import T5Config
from seq2seq_jax.pretrained._convert import ACTIVATIONS, Rule, field, read_checked
from seq2seq_jax.pretrained._io import Weights

MODEL_TYPE = "t5"
MODEL_TYPES = ("t5", "mt5")
ARCHITECTURES = ("T5ForConditionalGeneration", "MT5ForConditionalGeneration")

# T5Config's defaults (t5-small), for config.json files that leave fields out; mT5's
# differ in vocab_size, the feed-forward layer and the output layer.
DEFAULTS = {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6,
            "num_heads": 8, "relative_attention_num_buckets": 32,
            "relative_attention_max_distance": 128, "dropout_rate": 0.1,
            "layer_norm_epsilon": 1e-6, "feed_forward_proj": "relu", "pad_token_id": 0,
            "eos_token_id": 1}
MT5_DEFAULTS = {**DEFAULTS, "vocab_size": 250112, "d_ff": 1024, "num_layers": 8,
                "num_heads": 6, "feed_forward_proj": "gated-gelu"}


def _feed_forward(hf: dict[str, Any], defaults: dict[str, Any],
                  source: pathlib.Path) -> tuple[str, bool]:
  """``(activation, gated)`` of ``feed_forward_proj`` ("relu", "gated-gelu", ...)."""
  proj = str(field(hf, "feed_forward_proj", defaults))
  parts = proj.split("-")
  gated = parts[0] == "gated" and len(parts) == 2
  name = parts[-1]
  if (len(parts) == 2 and not gated) or len(parts) > 2:
    name = ""
  if proj == "gated-gelu":  # transformers' compatibility rule: T5's gated GELU is the tanh form
    name = "gelu_new"
  if name not in ACTIVATIONS:
    raise ValueError(f"{source}: feed_forward_proj={proj!r} is not supported; use ACT or "
                     f"gated-ACT with ACT one of {', '.join(ACTIVATIONS)}")
  return ACTIVATIONS[name], gated


def model_config(hf: dict[str, Any], source: pathlib.Path, dtype: str) -> T5Config:
  """The ``T5Config`` of a T5 / mT5 ``config.json`` (``source`` names it in errors).

  The output layer is tied unless the config says ``tie_word_embeddings: false``
  (or is an mT5's); ``config_for_weights`` corrects this from the tensors.
  """
  model_type = hf.get("model_type")
  d = MT5_DEFAULTS if model_type == "mt5" else DEFAULTS
  activation, gated = _feed_forward(hf, d, source)
  tied_in_config = hf.get("tie_word_embeddings", model_type != "mt5") is not False
  if model_type == "mt5":
    scale_output = False  # transformers' MT5 never rescales
  elif hf.get("scale_decoder_outputs") is not None:
    scale_output = bool(hf["scale_decoder_outputs"])
  else:
    scale_output = tied_in_config
  layers = field(hf, "num_layers", d)
  pad_id = field(hf, "pad_token_id", d)
  eos_id = field(hf, "eos_token_id", d)
  if isinstance(eos_id, list):
    eos_id = eos_id[0]
  start = hf.get("decoder_start_token_id")
  try:
    return T5Config(
        vocab_size=field(hf, "vocab_size", d),
        model_dim=field(hf, "d_model", d),
        num_heads=field(hf, "num_heads", d),
        head_dim=field(hf, "d_kv", d),
        mlp_dim=field(hf, "d_ff", d),
        num_encoder_layers=layers,
        num_decoder_layers=hf.get("num_decoder_layers") or layers,
        relative_buckets=field(hf, "relative_attention_num_buckets", d),
        relative_max_distance=field(hf, "relative_attention_max_distance", d),
        activation=activation,
        gated_ffn=gated,
        dropout_rate=float(field(hf, "dropout_rate", d)),
        layer_norm_epsilon=float(field(hf, "layer_norm_epsilon", d)),
        tie_output=tied_in_config,
        scale_output=scale_output,
        max_len=max(int(hf.get("n_positions") or 512), 512),
        dtype=dtype,
        pad_id=pad_id,
        decoder_start_id=pad_id if start is None else start,
        eos_id=eos_id)
  except ValueError as error:
    raise ValueError(f"{source}: {error}") from None


def config_for_weights(config: T5Config, weights: Weights, *, check_finite: bool = True
                       ) -> T5Config:
  """The output layer as the tensors have it: separate when ``lm_head.weight`` is stored
  and differs from ``shared.weight``, tied otherwise (transformers' rule)."""
  if "lm_head.weight" not in weights:
    return dataclasses.replace(config, tie_output=True)
  table = "shared.weight" if "shared.weight" in weights else "encoder.embed_tokens.weight"
  if table not in weights or weights.shape(table) != weights.shape("lm_head.weight"):
    return dataclasses.replace(config, tie_output=False)
  same = np.array_equal(read_checked(weights, "lm_head.weight", check_finite=check_finite),
                        read_checked(weights, table, check_finite=check_finite))
  return dataclasses.replace(config, tie_output=same)


def _attention_rules(hf: str, ours: tuple[str, ...], c: T5Config) -> list[Rule]:
  d, h, k = c.model_dim, c.num_heads, c.head_dim
  rules = [Rule(f"{hf}.{name}.weight", ours + (ours_name, "kernel"),
                lambda w: w.T.reshape(d, h, k), lambda w: w.reshape(d, h * k).T)
           for name, ours_name in (("q", "query"), ("k", "key"), ("v", "value"))]
  return rules + [Rule(f"{hf}.o.weight", ours + ("out", "kernel"),
                       lambda w: w.T.reshape(h, k, d), lambda w: w.reshape(h * k, d).T)]


def _norm_rule(hf: str, ours: tuple[str, ...]) -> Rule:
  return Rule(f"{hf}.weight", ours + ("scale",), lambda x: x, lambda x: x)


def _feed_forward_rules(hf: str, ours: tuple[str, ...], c: T5Config) -> list[Rule]:
  inputs = ("wi_0", "wi_1") if c.gated_ffn else ("wi",)
  return [Rule(f"{hf}.DenseReluDense.{name}.weight", ours + ("feed_forward", name, "kernel"),
               np.transpose, np.transpose) for name in inputs + ("wo",)]


def rules(config: T5Config, weights: Container[str] | None) -> list[Rule]:
  """Every checkpoint tensor this library keeps; see ``ignored`` for the rest."""
  c = config
  table = "shared.weight"
  if weights is not None and table not in weights and "encoder.embed_tokens.weight" in weights:
    table = "encoder.embed_tokens.weight"
  out = [Rule(table, ("embedding", "embedding"), lambda x: x, lambda x: x)]
  for side, count in (("encoder", c.num_encoder_layers), ("decoder", c.num_decoder_layers)):
    bias = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    out.append(Rule(bias, (f"{side}_position_bias", "relative_attention_bias"),
                    lambda x: x, lambda x: x))
    for i in range(count):
      hf, ours = f"{side}.block.{i}.layer", (f"{side}_layers_{i}",)
      out += _attention_rules(f"{hf}.0.SelfAttention", ours + ("self_attention",), c)
      out.append(_norm_rule(f"{hf}.0.layer_norm", ours + ("self_norm",)))
      ffn = 1
      if side == "decoder":
        out += _attention_rules(f"{hf}.1.EncDecAttention", ours + ("cross_attention",), c)
        out.append(_norm_rule(f"{hf}.1.layer_norm", ours + ("cross_norm",)))
        ffn = 2
      out += _feed_forward_rules(f"{hf}.{ffn}", ours, c)
      out.append(_norm_rule(f"{hf}.{ffn}.layer_norm", ours + ("feed_forward_norm",)))
    out.append(_norm_rule(f"{side}.final_layer_norm", (f"{side}_norm",)))
  if not c.tie_output:
    out.append(Rule("lm_head.weight", ("output_projection", "kernel"), np.transpose,
                    np.transpose))
  return out


def ignored(name: str) -> bool:
  """Copies of the token table, and the cross-attention bias old files carry unused."""
  return name in ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                  "lm_head.weight",
                  "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")


def check_fixed_tensors(config: T5Config, weights: Weights) -> None:
  """T5 stores no fixed tables to check."""
  del config, weights
