"""The recurrent encoder-decoder: thought vector (Sutskever 2014, Cho 2014) or attention.

Attention is Bahdanau's additive attention (queried with the previous decoder state,
context fed into the recurrence) or Luong's dot / general attention (queried with the
new state, combined into an attentional vector, optionally fed to the next step).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seq2seq_jax.configs import RNNConfig, compute_dtype
from seq2seq_jax.layers.attention import AdditiveAttention, LuongAttention
from seq2seq_jax.layers.dropout import Dropout
from seq2seq_jax.layers.embeddings import TokenEmbedding
from seq2seq_jax.layers.recurrent import (RNNEncoder, carry_hidden, make_cell, reverse_padded,
                                          sequence_lengths)
from seq2seq_jax.models.base import check_decode_len, shift_right
from seq2seq_jax.types import Array, PyTree


def _stack_layers(carries: list[PyTree]) -> PyTree:
  return jax.tree.map(lambda *cs: jnp.stack(cs, axis=1), *carries)


def _layer(carry_L: PyTree, layer: int) -> PyTree:
  return jax.tree.map(lambda c: c[:, layer], carry_L)


class _DecoderStep(nn.Module):
  """One decoder time step: ``(carry, embedded_BE) -> (carry, (readout_BR, alignment_BS))``.

  Teacher-forced ``decode`` scans this module over the target; ``decode_step``
  calls it once, so both run the same arithmetic.
  """

  config: RNNConfig
  readout_dim: int

  def setup(self):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    self.cells = [make_cell(cfg.cell, cfg.hidden_dim, dtype=dtype, name=f"cell_{layer}")
                  for layer in range(cfg.num_decoder_layers)]
    if cfg.attention == "additive":
      self.attention: AdditiveAttention | LuongAttention = AdditiveAttention(
          cfg.attention_dim or cfg.hidden_dim, dtype=dtype)
    elif cfg.attention in ("dot", "general"):
      self.attention = LuongAttention(cfg.attention, query_dim=cfg.hidden_dim, dtype=dtype)
    self.readout = nn.Dense(self.readout_dim, dtype=dtype, name="readout")
    self.dropout = Dropout(cfg.dropout_rate)

  def project_keys(self, encoded_BSD: Array) -> Array:
    return self.attention.project_keys(encoded_BSD)

  def _attend(self, query_BQ: Array, memory: PyTree) -> tuple[Array, Array]:
    mask_B11S = memory["mask_BS"][:, None, None, :]
    context_B1D, alignment_B1S = self.attention.attend(
        query_BQ[:, None, :], memory["keys_BSA"], memory["encoded_BSD"], mask_B11S)
    return context_B1D[:, 0], alignment_B1S[:, 0]

  def __call__(self, carry: PyTree, embedded_BE: Array, memory: PyTree,
               deterministic: bool) -> tuple[PyTree, tuple[Array, Array | None]]:
    cfg = self.config
    layers = carry["layers"]
    alignment_BS = None
    if cfg.attention == "none":
      # Cho 2014: the summary c conditions every step, not only the initial state.
      context_BD = memory["summary_BD"]
      x_BI = jnp.concatenate([embedded_BE, context_BD.astype(embedded_BE.dtype)], axis=-1)
    elif cfg.attention == "additive":
      # Bahdanau: the previous state s_{t-1} queries; the context enters the recurrence.
      query_BH = carry_hidden(_layer(layers, cfg.num_decoder_layers - 1))
      context_BD, alignment_BS = self._attend(query_BH, memory)
      x_BI = jnp.concatenate([embedded_BE, context_BD.astype(embedded_BE.dtype)], axis=-1)
    elif cfg.input_feeding:
      x_BI = jnp.concatenate([embedded_BE, carry["feed_BR"].astype(embedded_BE.dtype)], axis=-1)
    else:
      x_BI = embedded_BE

    new_layers = []
    for layer, cell in enumerate(self.cells):
      if layer > 0:
        x_BI = self.dropout(x_BI, deterministic=deterministic)
      layer_carry, x_BI = cell(_layer(layers, layer), x_BI)
      new_layers.append(layer_carry)
    top_BH = x_BI
    new_carry = dict(carry, layers=_stack_layers(new_layers))

    if cfg.attention in ("dot", "general"):
      # Luong: the new state h_t queries; h~_t = tanh(W_c [c_t; h_t]).
      context_BD, alignment_BS = self._attend(top_BH, memory)
      features = [context_BD.astype(top_BH.dtype), top_BH]
    else:
      features = [top_BH, context_BD.astype(top_BH.dtype), embedded_BE]
    readout_BR = jnp.tanh(self.readout(jnp.concatenate(features, axis=-1)))
    if cfg.input_feeding:
      new_carry["feed_BR"] = readout_BR
    return new_carry, (readout_BR, alignment_BS)


class RNNSeq2Seq(nn.Module):
  """Recurrent encoder-decoder with the library's model contract (see DESIGN.md).

  ``encode`` -> memory ``{"encoded_BSD", "mask_BS", "final", "summary_BD"[, "keys_BSA"]}``
  (every leaf batch first; ``final`` holds the encoder's per-layer final states
  ``[B, L, D]``). ``decode`` teacher-forces the shifted targets; ``init_cache`` and
  ``decode_step`` decode one token at a time with the cache
  ``{"layers": [B, L, H] states, "feed_BR" (input feeding), "index", "limit"}``.

  The decoder starts from the encoder's final states, copied when layer counts and
  widths agree, otherwise through a learned bridge ``tanh(W s + b)`` from the top
  encoder layer's final state.

  Example:
    >>> cfg = RNNConfig(vocab_size=11, embed_dim=4, hidden_dim=6, attention="general")
    >>> model = RNNSeq2Seq(cfg)
    >>> src, tgt = jnp.array([[5, 6, 2, 0]]), jnp.array([[7, 2, 0]])
    >>> params = model.init(jax.random.key(0), src, tgt)["params"]
    >>> model.apply({"params": params}, src, tgt).shape
    (1, 3, 11)
  """

  config: RNNConfig

  def setup(self):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    self.source_embed = TokenEmbedding(cfg.vocab_size, cfg.embed_dim, dtype=dtype, scale=False,
                                       name="source_embed")
    self.target_embed = (self.source_embed if cfg.share_embeddings else
                         TokenEmbedding(cfg.vocab_size, cfg.embed_dim, dtype=dtype, scale=False,
                                        name="target_embed"))
    self.encoder = RNNEncoder(cell=cfg.cell, hidden_dim=cfg.hidden_dim,
                              num_layers=cfg.num_encoder_layers, bidirectional=cfg.bidirectional,
                              dropout_rate=cfg.dropout_rate, dtype=dtype, name="encoder")
    encoder_dim = cfg.hidden_dim * (2 if cfg.bidirectional else 1)
    if cfg.attention == "dot" and encoder_dim != cfg.hidden_dim:
      # Dot scores need keys as wide as the decoder state: project the states once.
      self.memory_projection = nn.Dense(cfg.hidden_dim, use_bias=False, dtype=dtype,
                                        name="memory_projection")
    self.needs_bridge = (encoder_dim != cfg.hidden_dim
                         or cfg.num_encoder_layers != cfg.num_decoder_layers)
    if self.needs_bridge:
      leaves = 2 if cfg.cell == "lstm" else 1
      self.bridges = [nn.Dense(cfg.num_decoder_layers * cfg.hidden_dim, dtype=dtype,
                               name=f"bridge_{i}") for i in range(leaves)]
    readout_dim = cfg.embed_dim if cfg.tie_output else cfg.hidden_dim
    self.step = _DecoderStep(cfg, readout_dim, name="decoder")
    if not cfg.tie_output:
      self.output = nn.Dense(cfg.vocab_size, dtype=dtype, name="output")
    self.dropout = Dropout(cfg.dropout_rate)

  def __call__(self, inputs_BS: Array, targets_BT: Array, *,
               inputs_segment_ids: Array | None = None, inputs_positions: Array | None = None,
               targets_segment_ids: Array | None = None, targets_positions: Array | None = None,
               deterministic: bool = True, return_attention: bool = False):
    """``decode(encode(inputs_BS), targets_BT)``: float32 logits ``[B, T, V]``
    (and ``{"cross": [B, T, S]}`` with ``return_attention`` and attention on).

    The packing arrays exist so that a packed batch fails here by name: a recurrence
    runs through a whole row, so pairs packed in one row would read each other;
    anything but None raises ``ValueError``.
    """
    given = [name for name, value in (("inputs_segment_ids", inputs_segment_ids),
                                      ("inputs_positions", inputs_positions),
                                      ("targets_segment_ids", targets_segment_ids),
                                      ("targets_positions", targets_positions))
             if value is not None]
    if given:
      raise ValueError(f"RNNSeq2Seq cannot train on packed rows (data.packing; got "
                       f"{', '.join(given)}): its recurrence would carry one pair's state into "
                       "the next; set data.packing=False for RNN models")
    memory = self.encode(inputs_BS, deterministic=deterministic)
    return self.decode(memory, targets_BT, deterministic=deterministic,
                       return_attention=return_attention)

  def encode(self, inputs_BS: Array, *, deterministic: bool = True) -> PyTree:
    """Reads right-padded source ids ``[B, S]`` (pieces then EOS) into the memory pytree."""
    cfg = self.config
    self._check_length(inputs_BS.shape[1], "source")
    lengths_B = sequence_lengths(inputs_BS, pad_id=self.config.pad_id)
    tokens_BS = reverse_padded(inputs_BS, lengths_B) if cfg.reverse_source else inputs_BS
    embedded_BSE = self.dropout(self.source_embed(tokens_BS), deterministic=deterministic)
    encoded_BSD, final = self.encoder(embedded_BSE, lengths_B, deterministic=deterministic)
    mask_BS = inputs_BS != self.config.pad_id
    if cfg.reverse_source:
      # Keep states aligned with the source as given (attention plots, padding).
      encoded_BSD = reverse_padded(encoded_BSD, lengths_B)
    memory = {"encoded_BSD": encoded_BSD, "mask_BS": mask_BS, "final": final,
              "summary_BD": carry_hidden(_layer(final, cfg.num_encoder_layers - 1))}
    if cfg.attention != "none":
      keys_source_BSD = encoded_BSD
      if cfg.attention == "dot" and cfg.bidirectional:
        keys_source_BSD = self.memory_projection(encoded_BSD)
      memory["keys_BSA"] = self.step.project_keys(keys_source_BSD)
    return memory

  def _check_length(self, length: int, what: str) -> None:
    if length > self.config.max_len:
      raise ValueError(f"{what} length {length} exceeds RNNConfig.max_len="
                       f"{self.config.max_len}; truncate it or raise max_len")

  def _initial_layers(self, memory: PyTree) -> PyTree:
    cfg = self.config
    final = memory["final"]
    if not self.needs_bridge:
      return final
    leaves, treedef = jax.tree.flatten(final)
    batch = leaves[0].shape[0]
    bridged = [jnp.tanh(bridge(leaf[:, -1])).reshape(batch, cfg.num_decoder_layers,
                                                     cfg.hidden_dim)
               for bridge, leaf in zip(self.bridges, leaves)]
    return jax.tree.unflatten(treedef, bridged)

  def _initial_carry(self, memory: PyTree) -> PyTree:
    layers = self._initial_layers(memory)
    carry = {"layers": layers}
    if self.config.input_feeding:
      batch = memory["mask_BS"].shape[0]
      readout_dim = self.config.embed_dim if self.config.tie_output else self.config.hidden_dim
      carry["feed_BR"] = jnp.zeros((batch, readout_dim), compute_dtype(self.config.dtype))
    return carry

  def _logits(self, readout_BTR: Array, deterministic: bool) -> Array:
    readout_BTR = self.dropout(readout_BTR, deterministic=deterministic)
    if self.config.tie_output:
      return self.target_embed.attend(readout_BTR)
    return self.output(readout_BTR).astype(jnp.float32)

  def decode(self, memory: PyTree, targets_BT: Array, *, deterministic: bool = True,
             return_attention: bool = False):
    """Teacher-forced decoding of ``targets_BT`` (shifted right behind BOS here).

    Returns:
      float32 ``logits_BTV``, or ``(logits_BTV, {"cross": alignment_BTS})`` with
      ``return_attention`` (attention models only; the alignment is float32).
    """
    cfg = self.config
    self._check_length(targets_BT.shape[1], "target")
    if return_attention and cfg.attention == "none":
      raise ValueError("return_attention=True needs an attention model; "
                       "RNNConfig.attention is 'none'")
    decoder_inputs_BT = shift_right(targets_BT, self.config.decoder_start_id)
    embedded_BTE = self.dropout(self.target_embed(decoder_inputs_BT),
                                deterministic=deterministic)

    def body(step, carry, embedded_BE):
      return step(carry, embedded_BE, memory, deterministic)

    scan = nn.scan(body, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                   in_axes=1, out_axes=1)
    _, (readout_BTR, alignment_BTS) = scan(self.step, self._initial_carry(memory), embedded_BTE)
    logits_BTV = self._logits(readout_BTR, deterministic)
    if return_attention:
      return logits_BTV, {"cross": alignment_BTS}
    return logits_BTV

  def init_cache(self, memory: PyTree, max_decode_len: int) -> PyTree:
    """The decoder state before BOS: ``{"layers", ["feed_BR",] "index", "limit"}``.

    Raises:
      ValueError: if ``max_decode_len`` is not in ``[1, config.max_len]``.
    """
    check_decode_len(max_decode_len, self.config.max_len, type(self).__name__)
    cache = self._initial_carry(memory)
    cache["index"] = jnp.zeros((), jnp.int32)
    cache["limit"] = jnp.asarray(max_decode_len, jnp.int32)
    return cache

  def decode_step(self, memory: PyTree, tokens_B: Array, cache: PyTree) -> tuple[Array, PyTree]:
    """Feeds ``tokens_B`` (BOS first) and returns float32 ``logits_BV`` and the new cache.

    A step past ``max_decode_len`` returns NaN logits rather than decoding silently on.
    """
    embedded_BE = self.target_embed(tokens_B)
    carry = {k: v for k, v in cache.items() if k not in ("index", "limit")}
    carry, (readout_BR, _) = self.step(carry, embedded_BE, memory, True)
    logits_BV = self._logits(readout_BR[:, None, :], True)[:, 0]
    logits_BV = jnp.where(cache["index"] < cache["limit"], logits_BV, jnp.nan)
    return logits_BV, dict(carry, index=cache["index"] + 1, limit=cache["limit"])
