"""T5 (Raffel et al. 2020, "Exploring the limits of transfer learning"), the architecture of mT5
and of the MADLAD-400 translation models, on the library's model contract.

Encoder: token vectors (not scaled, no position table), dropout, then N pre-norm
layers ``x + dropout(attention(RMSNorm(x)))`` and ``x + dropout(FFN(RMSNorm(x)))``,
then a final RMSNorm and dropout. Self attention is unscaled and adds a relative
position bias (``layers.relative_position``): one table per stack, computed once
and shared by all its layers, bidirectional in the encoder, causal in the decoder.
The decoder adds cross attention (no position bias) between the two. No layer has
a bias. The output is ``lm_head(y)``, or with a tied table ``E (y * D ** -0.5)``
(``scale_output``, original T5). Decoding starts from the pad id.

Example:
  >>> config = T5Config(vocab_size=100, model_dim=32, num_heads=4, head_dim=6, mlp_dim=64,
  ...                   num_encoder_layers=2, num_decoder_layers=1)
  >>> model = T5(config)
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

from seq2seq_jax.configs import T5Config, compute_dtype
from seq2seq_jax.layers.attention import AttentionMask, KVCache, MultiHeadAttention
from seq2seq_jax.layers.dropout import Dropout
from seq2seq_jax.layers.embeddings import TokenEmbedding, VocabProjection
from seq2seq_jax.layers.feedforward import FeedForward
from seq2seq_jax.layers.normalization import RMSNorm
from seq2seq_jax.layers.partitioning import (BATCH, EMBED, HEADS, KV, LENGTH, VOCAB,
                                             constrain)
from seq2seq_jax.layers.relative_position import RelativePositionBias
from seq2seq_jax.models.base import check_decode_len, check_packing, shift_right, with_weights
from seq2seq_jax.types import Array, PyTree


def _attention(config: T5Config, name: str) -> MultiHeadAttention:
  return MultiHeadAttention(
      num_heads=config.num_heads, head_dim=config.head_dim, out_dim=config.model_dim,
      dropout_rate=config.dropout_rate, dtype=compute_dtype(config.dtype), use_bias=False,
      scale_queries=False, implementation=config.attention_impl, name=name)


def _norm(config: T5Config, name: str | None = None) -> RMSNorm:
  return RMSNorm(epsilon=config.layer_norm_epsilon, dtype=compute_dtype(config.dtype), name=name)


def _feed_forward(config: T5Config) -> FeedForward:
  return FeedForward(config.mlp_dim, config.model_dim, config.dropout_rate,
                     activation=config.activation, dtype=compute_dtype(config.dtype),
                     gated=config.gated_ffn, use_bias=False)


def _rows(x_BTD: Array) -> Array:
  """The residual stream: rows on the mesh's ``data`` axis (inside ``activation_sharding``)."""
  return constrain(x_BTD, BATCH, LENGTH, EMBED)


class T5EncoderLayer(nn.Module):
  """``x + attention(norm(x))`` with the stack's position bias, then ``x + FFN(norm(x))``."""

  config: T5Config

  def setup(self):
    c = self.config
    self.self_attention = _attention(c, "self_attention")
    self.self_norm = _norm(c)
    self.feed_forward = _feed_forward(c)
    self.feed_forward_norm = _norm(c)
    self.dropout = Dropout(c.dropout_rate)

  def __call__(self, x_BSD: Array, mask: AttentionMask, bias_1HSS: Array, *, deterministic: bool,
               return_weights: bool = False):
    """Returns ``(x_BSD, weights_BHSS)``, the weights None unless ``return_weights``."""
    h_BSD = self.self_norm(x_BSD)
    h_BSD, weights_BHSS = with_weights(self.self_attention(
        h_BSD, h_BSD, mask, bias=bias_1HSS, deterministic=deterministic,
        return_weights=return_weights), return_weights)
    x_BSD = x_BSD + self.dropout(h_BSD, deterministic=deterministic)
    h_BSD = self.feed_forward(self.feed_forward_norm(x_BSD), deterministic=deterministic)
    return x_BSD + self.dropout(h_BSD, deterministic=deterministic), weights_BHSS


class T5DecoderLayer(nn.Module):
  """Causal self attention with the position bias, cross attention, then the FFN; pre-norm."""

  config: T5Config

  def setup(self):
    c = self.config
    self.self_attention = _attention(c, "self_attention")
    self.self_norm = _norm(c)
    self.cross_attention = _attention(c, "cross_attention")
    self.cross_norm = _norm(c)
    self.feed_forward = _feed_forward(c)
    self.feed_forward_norm = _norm(c)
    self.dropout = Dropout(c.dropout_rate)

  def cross_kv(self, encoded_BSD: Array) -> tuple[Array, Array]:
    """This layer's cross-attention keys and values ``[B, H, K, S]`` (as the Transformer's)."""
    k_BSHK, v_BSHK = self.cross_attention.project_kv(encoded_BSD)
    to_BHKS = lambda x: constrain(jnp.transpose(x, (0, 2, 3, 1)), BATCH, HEADS, KV, LENGTH)
    return to_BHKS(k_BSHK), to_BHKS(v_BSHK)

  def _feed_forward(self, y_BTD: Array, deterministic: bool) -> Array:
    h_BTD = self.feed_forward(self.feed_forward_norm(y_BTD), deterministic=deterministic)
    return y_BTD + self.dropout(h_BTD, deterministic=deterministic)

  def __call__(self, y_BTD: Array, self_mask: AttentionMask, bias_1HTT: Array,
               cross_k_BHKS: Array, cross_v_BHKS: Array, cross_mask: AttentionMask, *,
               deterministic: bool, return_weights: bool = False):
    """Returns ``(y_BTD, self_weights_BHTT, cross_weights_BHTS)``, the weights None unless
    ``return_weights``."""
    h_BTD = self.self_norm(y_BTD)
    h_BTD, self_BHTT = with_weights(self.self_attention(
        h_BTD, h_BTD, self_mask, bias=bias_1HTT, deterministic=deterministic,
        return_weights=return_weights), return_weights)
    y_BTD = y_BTD + self.dropout(h_BTD, deterministic=deterministic)
    to_BSHK = lambda x: jnp.transpose(x, (0, 3, 1, 2))
    h_BTD, cross_BHTS = with_weights(self.cross_attention.attend(
        self.cross_norm(y_BTD), to_BSHK(cross_k_BHKS), to_BSHK(cross_v_BHKS), cross_mask,
        deterministic=deterministic, return_weights=return_weights), return_weights)
    y_BTD = y_BTD + self.dropout(h_BTD, deterministic=deterministic)
    return self._feed_forward(y_BTD, deterministic), self_BHTT, cross_BHTS

  def step(self, y_B1D: Array, cache: KVCache, index: Array, layer: int, bias_HT: Array,
           cross_k_BHKS: Array, cross_v_BHKS: Array, source_valid_BS: Array
           ) -> tuple[Array, KVCache]:
    """One decoding position; ``bias_HT`` is this position's row of the position bias."""
    h_B1D, cache = self.self_attention.step(self.self_norm(y_B1D), cache, index, layer=layer,
                                            bias_HT=bias_HT)
    y_B1D = y_B1D + h_B1D
    y_B1D = y_B1D + self.cross_attention.attend_one(self.cross_norm(y_B1D), cross_k_BHKS,
                                                    cross_v_BHKS, source_valid_BS)
    return self._feed_forward(y_B1D, True), cache


class T5(nn.Module):
  """The T5 encoder-decoder with the model contract of DESIGN.md.

  Memory (from ``encode``) is the Transformer's: ``encoded`` [B, S, D],
  ``source_valid`` [B, S] bool, and ``cross_key`` / ``cross_value``, one [B, H, K, S]
  array per decoder layer. The cache (from ``init_cache``) holds ``index`` and
  ``self_attention``, a ``KVCache`` (one [B, T, H, K] buffer a layer); a decoding step
  adds its row of the decoder's position bias to the scores against every cached position.

  Packed rows (training and evaluation only) as the Transformer's: attention within
  a segment, target segment k reading source segment k, each target segment
  starting from the decoder start id; the memory then holds ``source_segment_ids``.
  The relative position bias stays the one of the row's columns (as t5x's): a
  segment's tokens lie side by side, so the offset of two of its tokens, key minus
  query, is the same counted in columns or in positions that restart at 0, and
  offsets across segments are masked. The positions are checked and otherwise unused.
  """

  config: T5Config

  def setup(self):
    c = self.config
    dtype = compute_dtype(c.dtype)
    self.embedding = TokenEmbedding(c.vocab_size, c.model_dim, dtype=dtype, scale=False)
    bias = lambda bidirectional: RelativePositionBias(
        num_heads=c.num_heads, num_buckets=c.relative_buckets,
        max_distance=c.relative_max_distance, bidirectional=bidirectional)
    self.encoder_position_bias = bias(True)
    self.decoder_position_bias = bias(False)
    self.dropout = Dropout(c.dropout_rate)
    self.encoder_layers = [T5EncoderLayer(c) for _ in range(c.num_encoder_layers)]
    self.decoder_layers = [T5DecoderLayer(c) for _ in range(c.num_decoder_layers)]
    self.encoder_norm = _norm(c)
    self.decoder_norm = _norm(c)
    if not c.tie_output:
      self.output_projection = VocabProjection(c.vocab_size, dtype=dtype, use_bias=False,
                                               name="output_projection")

  def _check_tokens(self, tokens: Array, what: str) -> None:
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"{what} must be integer token ids [batch, length]; got "
                       f"{tokens.dtype} {tokens.shape}")
    if tokens.shape[1] > self.config.max_len:
      raise ValueError(f"{what} has length {tokens.shape[1]} > T5Config.max_len="
                       f"{self.config.max_len}; truncate it or raise max_len")

  def encode(self, inputs_BS: Array, *, segment_ids: Array | None = None,
             positions: Array | None = None, deterministic: bool = True,
             return_attention: bool = False):
    """Encodes source ids (``config.pad_id`` after each row) into the memory dict.

    ``segment_ids`` and ``positions`` (int ``[B, S]``, both or neither): packed
    rows, see the class docstring. With ``return_attention`` returns
    ``(memory, weights_LBHSS)``.
    """
    self._check_tokens(inputs_BS, "inputs")
    check_packing(inputs_BS, segment_ids, positions, "inputs")
    source_valid_BS = inputs_BS != self.config.pad_id
    mask = AttentionMask(key_valid=source_valid_BS, query_segment_ids=segment_ids,
                         key_segment_ids=segment_ids)
    length = inputs_BS.shape[1]
    bias_1HSS = self.encoder_position_bias(length, length)
    x_BSD = _rows(self.dropout(self.embedding(inputs_BS), deterministic=deterministic))
    weights = []
    for layer in self.encoder_layers:
      x_BSD, weights_BHSS = layer(x_BSD, mask, bias_1HSS, deterministic=deterministic,
                                  return_weights=return_attention)
      x_BSD = _rows(x_BSD)
      weights.append(weights_BHSS)
    x_BSD = self.dropout(self.encoder_norm(x_BSD), deterministic=deterministic)
    keys, values = zip(*(layer.cross_kv(x_BSD) for layer in self.decoder_layers))
    memory = {"encoded": x_BSD, "source_valid": source_valid_BS,
              "cross_key": tuple(keys), "cross_value": tuple(values)}
    if segment_ids is not None:
      memory["source_segment_ids"] = segment_ids
    if return_attention:
      return memory, jnp.stack(weights)
    return memory

  def _logits(self, y_BTD: Array, deterministic: bool) -> Array:
    y_BTD = self.dropout(self.decoder_norm(y_BTD), deterministic=deterministic)
    if self.config.scale_output:
      y_BTD = y_BTD * jnp.asarray(self.config.model_dim ** -0.5, y_BTD.dtype)
    if self.config.tie_output:
      return self.embedding.attend(y_BTD)
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
    length = targets_BT.shape[1]
    bias_1HTT = self.decoder_position_bias(length, length)
    y_BTD = self.embedding(decoder_inputs_BT)
    y_BTD = _rows(self.dropout(y_BTD, deterministic=deterministic))
    self_weights, cross_weights = [], []
    for i, layer in enumerate(self.decoder_layers):
      y_BTD, self_BHTT, cross_BHTS = layer(
          y_BTD, self_mask, bias_1HTT, memory["cross_key"][i], memory["cross_value"][i],
          cross_mask, deterministic=deterministic, return_weights=return_attention)
      y_BTD = _rows(y_BTD)
      self_weights.append(self_BHTT)
      cross_weights.append(cross_BHTS)
    logits_BTV = constrain(self._logits(y_BTD, deterministic), BATCH, LENGTH, VOCAB)
    if return_attention:
      return logits_BTV, {"decoder_self": jnp.stack(self_weights),
                          "cross": jnp.stack(cross_weights)}
    return logits_BTV

  def __call__(self, inputs_BS: Array, targets_BT: Array, *,
               inputs_segment_ids: Array | None = None, inputs_positions: Array | None = None,
               targets_segment_ids: Array | None = None, targets_positions: Array | None = None,
               deterministic: bool = True, return_attention: bool = False):
    """``decode(encode(inputs), targets)``: logits [B, T, V], or ``(logits, attention)``.

    The four packing arrays are a packed batch's keys of the same names (all or none;
    see the class docstring and ``Transformer.__call__``).
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
    check_decode_len(max_decode_len, self.config.max_len, "T5Config")
    c = self.config
    kv = KVCache.zeros(rows=memory["encoded"].shape[0], layers=c.num_decoder_layers,
                       length=max_decode_len, heads=c.num_heads, head_dim=c.head_dim,
                       dtype=compute_dtype(c.dtype))
    return {"index": jnp.zeros((), jnp.int32), "self_attention": kv}

  def decode_step(self, memory: PyTree, tokens_B: Array, cache: dict[str, Any]):
    """Decodes one position: ``tokens_B`` is the previous token (the decoder start at first).

    Returns ``(logits_BV, cache)``; a step past the cache's length returns NaN
    logits rather than silently overwriting the last cached position.
    """
    index = cache["index"]
    kv = cache["self_attention"]
    bias_HT = self.decoder_position_bias.row(index, kv.length)
    y_B1D = _rows(self.embedding(tokens_B[:, None]))
    for i, layer in enumerate(self.decoder_layers):
      y_B1D, kv = layer.step(y_B1D, kv, index, i, bias_HT, memory["cross_key"][i],
                             memory["cross_value"][i], memory["source_valid"])
    y_B1D = jnp.where(index < kv.length, y_B1D, jnp.nan)
    logits_BV = self._logits(y_B1D, True)[:, 0]
    return logits_BV, {"index": index + 1, "self_attention": kv}
