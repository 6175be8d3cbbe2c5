"""The Transformer of Vaswani et al. 2017 ("Attention is all you need").

Encoder: token embedding * sqrt(D) + positions, then N layers of self attention
and a position-wise feed-forward layer, each wrapped in dropout, a residual and
LayerNorm (after the residual for ``norm="post"``, the paper; before the
sublayer for ``norm="pre"``, plus a final LayerNorm). Decoder: the same with
causal self attention and cross attention to the encoder's output. Encoder and
decoder may differ in depth, heads and feed-forward width (``encoder_stack``,
``decoder_stack`` of the config): a deep encoder and a shallow decoder decode fast.

Example:
  >>> config = TransformerConfig(vocab_size=100, model_dim=32, num_heads=4, mlp_dim=64,
  ...                            num_encoder_layers=2, num_decoder_layers=2)
  >>> model = Transformer(config)
  >>> inputs, targets = jnp.ones((2, 7), jnp.int32), jnp.ones((2, 5), jnp.int32)
  >>> params = model.init(jax.random.key(0), inputs, targets)["params"]
  >>> model.apply({"params": params}, inputs, targets).shape
  (2, 5, 100)
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seq2seq_jax.configs import StackShape, TransformerConfig, compute_dtype
from seq2seq_jax.layers.attention import AttentionMask, KVCache, MultiHeadAttention
from seq2seq_jax.layers.dropout import Dropout
from seq2seq_jax.layers.embeddings import PositionEmbedding, TokenEmbedding, VocabProjection
from seq2seq_jax.layers.feedforward import FeedForward
from seq2seq_jax.layers.partitioning import (BATCH, EMBED, HEADS, KV, LENGTH, VOCAB,
                                             constrain)
from seq2seq_jax.models.base import check_decode_len, check_packing, shift_right, with_weights
from seq2seq_jax.types import Array, PyTree


def _attention(config: TransformerConfig, stack: StackShape, name: str) -> MultiHeadAttention:
  return MultiHeadAttention(
      num_heads=stack.num_heads, head_dim=stack.head_dim, out_dim=config.model_dim,
      dropout_rate=config.attention_dropout_rate, dtype=compute_dtype(config.dtype),
      implementation=config.attention_impl, name=name)


def _feed_forward(config: TransformerConfig, stack: StackShape) -> FeedForward:
  return FeedForward(stack.mlp_dim, config.model_dim, config.ffn_dropout_rate,
                     activation=config.activation, dtype=compute_dtype(config.dtype))


class _Residual(nn.Module):
  """``x + dropout(f(x))`` with LayerNorm after (post-LN) or before the sublayer (pre-LN)."""

  config: TransformerConfig

  def setup(self):
    self.norm = nn.LayerNorm(epsilon=self.config.layer_norm_epsilon,
                             dtype=compute_dtype(self.config.dtype))
    self.dropout = Dropout(self.config.dropout_rate)

  def before(self, x_BTD: Array) -> Array:
    """The sublayer's input."""
    return self.norm(x_BTD) if self.config.norm == "pre" else x_BTD

  def after(self, x_BTD: Array, h_BTD: Array, deterministic: bool) -> Array:
    """Adds the sublayer's output back into the residual stream."""
    x_BTD = x_BTD + self.dropout(h_BTD, deterministic=deterministic)
    return self.norm(x_BTD) if self.config.norm == "post" else x_BTD


class EncoderLayer(nn.Module):
  """Self attention, then the feed-forward layer."""

  config: TransformerConfig

  def setup(self):
    c = self.config
    self.self_attention = _attention(c, c.encoder_stack, "self_attention")
    self.feed_forward = _feed_forward(c, c.encoder_stack)
    self.attention_residual = _Residual(c)
    self.feed_forward_residual = _Residual(c)

  def __call__(self, x_BSD: Array, mask: AttentionMask, *, deterministic: bool,
               return_weights: bool = False):
    """Returns ``(x_BSD, weights_BHSS)``, the weights None unless ``return_weights``."""
    h_BSD = self.attention_residual.before(x_BSD)
    h_BSD, weights_BHSS = with_weights(self.self_attention(
        h_BSD, h_BSD, mask, deterministic=deterministic, return_weights=return_weights),
                                       return_weights)
    x_BSD = self.attention_residual.after(x_BSD, h_BSD, deterministic)
    h_BSD = self.feed_forward(self.feed_forward_residual.before(x_BSD), deterministic=deterministic)
    return self.feed_forward_residual.after(x_BSD, h_BSD, deterministic), weights_BHSS


class DecoderLayer(nn.Module):
  """Causal self attention, cross attention to the encoder, then the feed-forward layer."""

  config: TransformerConfig

  def setup(self):
    c = self.config
    self.self_attention = _attention(c, c.decoder_stack, "self_attention")
    self.cross_attention = _attention(c, c.decoder_stack, "cross_attention")
    self.feed_forward = _feed_forward(c, c.decoder_stack)
    self.self_residual = _Residual(c)
    self.cross_residual = _Residual(c)
    self.feed_forward_residual = _Residual(c)

  def cross_kv(self, encoded_BSD: Array) -> tuple[Array, Array]:
    """This layer's cross-attention keys and values ``[B, H, K, S]``.

    The layout the dots of a decoding step read directly: stored this way once per
    source, no step copies or transposes the encoder's memory.
    """
    k_BSHK, v_BSHK = self.cross_attention.project_kv(encoded_BSD)
    to_BHKS = lambda x: constrain(jnp.transpose(x, (0, 2, 3, 1)), BATCH, HEADS, KV, LENGTH)
    return to_BHKS(k_BSHK), to_BHKS(v_BSHK)

  def _feed_forward(self, y_BTD: Array, deterministic: bool) -> Array:
    h_BTD = self.feed_forward(self.feed_forward_residual.before(y_BTD), deterministic=deterministic)
    return self.feed_forward_residual.after(y_BTD, h_BTD, deterministic)

  def __call__(self, y_BTD: Array, self_mask: AttentionMask, cross_k_BHKS: Array,
               cross_v_BHKS: Array, cross_mask: AttentionMask, *, deterministic: bool,
               return_weights: bool = False):
    """Returns ``(y_BTD, self_weights_BHTT, cross_weights_BHTS)``, the weights None unless
    ``return_weights``."""
    h_BTD = self.self_residual.before(y_BTD)
    h_BTD, self_BHTT = with_weights(self.self_attention(
        h_BTD, h_BTD, self_mask, deterministic=deterministic, return_weights=return_weights),
                                    return_weights)
    y_BTD = self.self_residual.after(y_BTD, h_BTD, deterministic)
    h_BTD = self.cross_residual.before(y_BTD)
    to_BSHK = lambda x: jnp.transpose(x, (0, 3, 1, 2))
    h_BTD, cross_BHTS = with_weights(self.cross_attention.attend(
        h_BTD, to_BSHK(cross_k_BHKS), to_BSHK(cross_v_BHKS), cross_mask,
        deterministic=deterministic, return_weights=return_weights), return_weights)
    y_BTD = self.cross_residual.after(y_BTD, h_BTD, deterministic)
    return self._feed_forward(y_BTD, deterministic), self_BHTT, cross_BHTS

  def step(self, y_B1D: Array, cache: KVCache, index: Array, layer: int, cross_k_BHKS: Array,
           cross_v_BHKS: Array, source_valid_BS: Array) -> tuple[Array, KVCache]:
    """One decoding position; ``cache`` holds every decoder layer, this one is ``layer``."""
    h_B1D = self.self_residual.before(y_B1D)
    h_B1D, cache = self.self_attention.step(h_B1D, cache, index, layer=layer)
    y_B1D = self.self_residual.after(y_B1D, h_B1D, True)
    h_B1D = self.cross_attention.attend_one(self.cross_residual.before(y_B1D), cross_k_BHKS,
                                            cross_v_BHKS, source_valid_BS)
    y_B1D = self.cross_residual.after(y_B1D, h_B1D, True)
    return self._feed_forward(y_B1D, True), cache


def _rows(x_BTD: Array) -> Array:
  """The residual stream: rows on the mesh's ``data`` axis (inside ``activation_sharding``)."""
  return constrain(x_BTD, BATCH, LENGTH, EMBED)


class Transformer(nn.Module):
  """Encoder-decoder Transformer with the model contract of DESIGN.md.

  Memory (from ``encode``) is a dict of arrays with a leading batch axis:
  ``encoded`` [B, S, D], ``source_valid`` [B, S] bool, and the cross-attention keys
  and values ``cross_key`` / ``cross_value``: a tuple with one [B, H, K, S] array per
  decoder layer, computed once per source rather than once per decoding step. The cache (from
  ``init_cache``) holds ``index`` (int32 scalar, the next position) and
  ``self_attention``, a ``KVCache`` of the decoder's self-attention keys and values
  (one [B, T, H, K] buffer a layer) that beam search reorders by its slot table, not by copying.

  Packed rows (training and evaluation only; ``DataConfig.packing``): each row holds
  several pairs, numbered by segment ids (1, 2, ...; 0 on padding) with positions
  restarting at 0 in each. Given them, attention stays within a segment (the
  decoder's also causal), target segment k reads only source segment k, position
  vectors are looked up from the positions, and each target segment starts from
  the decoder start id; the memory then also holds ``source_segment_ids`` [B, S].
  A pair's logits are those of the pair alone, up to float rounding.

  Attention (``config.attention_impl``, see ``layers.fused_attention``): the masks
  go to every layer as ``AttentionMask`` (padding, segments, causality), which the
  einsums read as a dense mask and a fused kernel (splash, cuDNN) as segment ids
  or a bias, packed rows included. Weights are computed only for
  ``return_attention=True``, which runs the einsums; decoding steps read the
  ``KVCache`` with the library's blocked einsums whatever the choice.
  """

  config: TransformerConfig

  def setup(self):
    c = self.config
    dtype = compute_dtype(c.dtype)
    self.source_embedding = TokenEmbedding(c.vocab_size, c.model_dim, dtype=dtype,
                                           scale=c.scale_embeddings)
    self.target_embedding = (self.source_embedding if c.share_embeddings else
                             TokenEmbedding(c.output_vocab_size, c.model_dim, dtype=dtype,
                                            scale=c.scale_embeddings))
    positions = lambda: PositionEmbedding(c.max_len, c.model_dim, c.positions, dtype=dtype,
                                          table_offset=c.position_offset)
    self.source_positions = positions()
    self.target_positions = positions()
    self.dropout = Dropout(c.dropout_rate)
    if c.embedding_norm:
      self.encoder_embedding_norm = nn.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=dtype)
      self.decoder_embedding_norm = nn.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=dtype)
    self.encoder_layers = [EncoderLayer(c) for _ in range(c.num_encoder_layers)]
    self.decoder_layers = [DecoderLayer(c) for _ in range(c.num_decoder_layers)]
    if c.norm == "pre":
      self.encoder_norm = nn.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=dtype)
      self.decoder_norm = nn.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=dtype)
    if not c.tie_output:
      self.output_projection = VocabProjection(c.output_vocab_size, dtype=dtype,
                                               name="output_projection")
    elif c.output_bias:
      self.output_bias = self.param("output_bias", nn.initializers.zeros,
                                    (c.output_vocab_size,), jnp.float32)

  def _check_tokens(self, tokens: Array, what: str) -> None:
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"{what} must be integer token ids [batch, length]; got "
                       f"{tokens.dtype} {tokens.shape}")
    if tokens.shape[1] > self.config.max_len:
      raise ValueError(f"{what} has length {tokens.shape[1]} > TransformerConfig.max_len="
                       f"{self.config.max_len}; truncate it or raise max_len")

  def encode(self, inputs_BS: Array, *, segment_ids: Array | None = None,
             positions: Array | None = None, deterministic: bool = True,
             return_attention: bool = False):
    """Encodes source ids (``config.pad_id`` after each row) into the memory dict (see the class docstring).

    ``segment_ids`` and ``positions`` (int ``[B, S]``, both or neither): packed
    rows, see the class docstring. With ``return_attention`` returns
    ``(memory, weights_LBHSS)``.
    """
    self._check_tokens(inputs_BS, "inputs")
    check_packing(inputs_BS, segment_ids, positions, "inputs")
    source_valid_BS = inputs_BS != self.config.pad_id
    mask = AttentionMask(key_valid=source_valid_BS, query_segment_ids=segment_ids,
                         key_segment_ids=segment_ids)
    x_BSD = self.source_positions(self.source_embedding(inputs_BS), positions_BT=positions)
    if self.config.embedding_norm:
      x_BSD = self.encoder_embedding_norm(x_BSD)
    x_BSD = _rows(self.dropout(x_BSD, deterministic=deterministic))
    weights = []
    for layer in self.encoder_layers:
      x_BSD, weights_BHSS = layer(x_BSD, mask, deterministic=deterministic,
                                  return_weights=return_attention)
      x_BSD = _rows(x_BSD)
      weights.append(weights_BHSS)
    if self.config.norm == "pre":
      x_BSD = self.encoder_norm(x_BSD)
    keys, values = zip(*(layer.cross_kv(x_BSD) for layer in self.decoder_layers))
    memory = {"encoded": x_BSD, "source_valid": source_valid_BS,
              "cross_key": tuple(keys), "cross_value": tuple(values)}
    if segment_ids is not None:
      memory["source_segment_ids"] = segment_ids
    if return_attention:
      return memory, jnp.stack(weights)
    return memory

  def _logits(self, y_BTD: Array) -> Array:
    if self.config.norm == "pre":
      y_BTD = self.decoder_norm(y_BTD)
    if self.config.tie_output:
      return self.target_embedding.attend(y_BTD,
                                          self.output_bias if self.config.output_bias else None)
    return self.output_projection(y_BTD)

  def decode(self, memory: PyTree, targets_BT: Array, *, segment_ids: Array | None = None,
             positions: Array | None = None, deterministic: bool = True,
             return_attention: bool = False):
    """Teacher-forced decoding: float32 logits ``[B, T, V]`` predicting ``targets_BT``.

    The decoder reads ``shift_right(targets_BT, config.decoder_start_id)``.
    ``segment_ids`` and ``positions`` (int ``[B, T]``, both or neither): packed
    rows, with a memory encoded from packed inputs (see the class docstring). With
    ``return_attention`` returns ``(logits, {"decoder_self": [L, B, H, T, T],
    "cross": [L, B, H, T, S]})``.
    """
    self._check_tokens(targets_BT, "targets")
    packed = check_packing(targets_BT, segment_ids, positions, "targets")
    if packed != ("source_segment_ids" in memory):
      raise ValueError("packed targets need a memory encoded from packed inputs, and packed "
                       "inputs packed targets: pass segment ids and positions to both or neither")
    decoder_inputs_BT = shift_right(targets_BT, self.config.decoder_start_id,
                                    segment_ids_BT=segment_ids)
    self_mask = AttentionMask(query_segment_ids=segment_ids, key_segment_ids=segment_ids,
                              causal=True)
    cross_mask = AttentionMask(key_valid=memory["source_valid"], query_segment_ids=segment_ids,
                               key_segment_ids=memory.get("source_segment_ids"))
    y_BTD = self.target_positions(self.target_embedding(decoder_inputs_BT),
                                  positions_BT=positions)
    if self.config.embedding_norm:
      y_BTD = self.decoder_embedding_norm(y_BTD)
    y_BTD = _rows(self.dropout(y_BTD, deterministic=deterministic))
    self_weights, cross_weights = [], []
    for i, layer in enumerate(self.decoder_layers):
      y_BTD, self_BHTT, cross_BHTS = layer(
          y_BTD, self_mask, memory["cross_key"][i], memory["cross_value"][i], cross_mask,
          deterministic=deterministic, return_weights=return_attention)
      y_BTD = _rows(y_BTD)
      self_weights.append(self_BHTT)
      cross_weights.append(cross_BHTS)
    logits_BTV = constrain(self._logits(y_BTD), BATCH, LENGTH, VOCAB)
    if return_attention:
      return logits_BTV, {"decoder_self": jnp.stack(self_weights),
                          "cross": jnp.stack(cross_weights)}
    return logits_BTV

  def __call__(self, inputs_BS: Array, targets_BT: Array, *,
               inputs_segment_ids: Array | None = None, inputs_positions: Array | None = None,
               targets_segment_ids: Array | None = None, targets_positions: Array | None = None,
               deterministic: bool = True, return_attention: bool = False):
    """``decode(encode(inputs), targets)``: logits [B, T, V], or ``(logits, attention)``.

    The four packing arrays (int ``[B, S]`` for inputs, ``[B, T]`` for targets; all
    or none) are a packed batch's keys of the same names (see the class docstring).
    ``attention`` is ``{"encoder_self": [L, B, H, S, S], "decoder_self": [L, B, H, T, T],
    "cross": [L, B, H, T, S]}``.
    """
    memory = self.encode(inputs_BS, segment_ids=inputs_segment_ids, positions=inputs_positions,
                         deterministic=deterministic, return_attention=return_attention)
    if return_attention:
      memory, encoder_self = memory
    result = self.decode(memory, targets_BT, segment_ids=targets_segment_ids,
                         positions=targets_positions, deterministic=deterministic,
                         return_attention=return_attention)
    if not return_attention:
      return result
    logits_BTV, attention = result
    return logits_BTV, {"encoder_self": encoder_self, **attention}

  def init_cache(self, memory: PyTree, max_decode_len: int) -> dict[str, Any]:
    """An empty self-attention cache for up to ``max_decode_len`` decoding steps."""
    check_decode_len(max_decode_len, self.config.max_len, "TransformerConfig")
    decoder = self.config.decoder_stack
    kv = KVCache.zeros(rows=memory["encoded"].shape[0], layers=decoder.num_layers,
                       length=max_decode_len, heads=decoder.num_heads, head_dim=decoder.head_dim,
                       dtype=compute_dtype(self.config.dtype))
    return {"index": jnp.zeros((), jnp.int32), "self_attention": kv}

  def decode_step(self, memory: PyTree, tokens_B: Array, cache: dict[str, Any]):
    """Decodes one position: ``tokens_B`` is the previous token (the decoder start at first).

    Returns ``(logits_BV, cache)`` with the cache advanced by one position. A
    step past the cache's length returns NaN logits rather than silently
    overwriting the last cached position.
    """
    index = cache["index"]
    kv = cache["self_attention"]
    y_B1D = self.target_embedding(tokens_B[:, None])
    y_B1D = self.target_positions(y_B1D, offset=index)
    if self.config.embedding_norm:
      y_B1D = self.decoder_embedding_norm(y_B1D)
    y_B1D = _rows(y_B1D)
    for i, layer in enumerate(self.decoder_layers):
      y_B1D, kv = layer.step(y_B1D, kv, index, i, memory["cross_key"][i],
                             memory["cross_value"][i], memory["source_valid"])
    # Poisoned before the output projection, which spreads the NaN to every logit:
    # a select over [B, V] here would be one more pass over the step's largest array.
    y_B1D = jnp.where(index < kv.length, y_B1D, jnp.nan)
    logits_BV = self._logits(y_B1D)[:, 0]
    return logits_BV, {"index": index + 1, "self_attention": kv}
