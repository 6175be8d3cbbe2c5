"""Decomposable attention (Parikh et al. 2016): attend, compare, aggregate over a sentence pair.

No recurrence: each token of one sentence is softly aligned to the other sentence,
compared with what it aligned to, and the comparisons are summed and classified.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from seq2seq_jax.configs import DecomposableAttentionConfig, compute_dtype
from seq2seq_jax.layers.attention import attention_context, luong_scores, masked_alignment
from seq2seq_jax.layers.dropout import Dropout
from seq2seq_jax.layers.embeddings import TokenEmbedding
from seq2seq_jax.types import PAD_ID, Array

_MAX_DISTANCE = 10  # intra-attention distance buckets: |i - j| clipped here (as in the paper)


class _FeedForward(nn.Module):
  """Two ReLU layers with dropout in front of each: the paper's F, G and H."""

  hidden_dim: int
  dropout_rate: float
  dtype: object

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    for layer in range(2):
      x = Dropout(self.dropout_rate)(x, deterministic=deterministic)
      x = nn.relu(nn.Dense(self.hidden_dim, dtype=self.dtype, name=f"dense_{layer}")(x))
    return x


class DecomposableAttention(nn.Module):
  """Sentence-pair classifier of Parikh et al. 2016.

  attend: ``e_ij = F(a_i) . F(b_j)``; ``beta_i`` = softmax over j of b, ``alpha_j``
  = softmax over i of a (padding masked, float32 softmax). compare: ``v1_i =
  G([a_i; beta_i])``, ``v2_j = G([b_j; alpha_j])``. aggregate: sums over real
  positions, then ``H([v1; v2])`` and a linear classifier. With
  ``config.intra_attention`` each sentence first attends to itself with a learned
  distance bias and its tokens become ``[x_i; x'_i]``.

  Example:
    >>> import jax
    >>> model = DecomposableAttention(DecomposableAttentionConfig(vocab_size=20, embed_dim=4,
    ...                                                           hidden_dim=6))
    >>> a, b = jnp.array([[5, 6, 0]]), jnp.array([[7, 8, 9, 0]])
    >>> params = model.init(jax.random.key(0), a, b)["params"]
    >>> model.apply({"params": params}, a, b).shape
    (1, 2)
  """

  config: DecomposableAttentionConfig

  def setup(self):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    self.embed = TokenEmbedding(cfg.vocab_size, cfg.embed_dim, dtype=dtype, scale=False,
                                name="embed")
    self.projection = nn.Dense(cfg.hidden_dim, use_bias=False, dtype=dtype, name="projection")
    ffn = lambda name: _FeedForward(cfg.hidden_dim, cfg.dropout_rate, dtype, name=name)
    self.attend_ffn, self.compare_ffn, self.aggregate_ffn = ffn("attend"), ffn("compare"), ffn(
        "aggregate")
    if cfg.intra_attention:
      self.intra_ffn = ffn("intra")
      self.distance_bias = self.param("distance_bias", nn.initializers.zeros,
                                      (_MAX_DISTANCE + 1,), jnp.float32)
    self.classifier = nn.Dense(cfg.num_classes, dtype=dtype, name="classifier")

  def _encode(self, tokens_BS: Array, deterministic: bool) -> Array:
    x_BSD = self.projection(self.embed(tokens_BS))
    if not self.config.intra_attention:
      return x_BSD
    f_BSD = self.intra_ffn(x_BSD, deterministic=deterministic)
    positions_S = jnp.arange(tokens_BS.shape[1])
    distance_SS = jnp.minimum(jnp.abs(positions_S[:, None] - positions_S[None, :]), _MAX_DISTANCE)
    scores_BSS = luong_scores(f_BSD, f_BSD) + self.distance_bias[distance_SS][None]
    mask_B11S = (tokens_BS != PAD_ID)[:, None, None, :]
    self_BSD = attention_context(masked_alignment(scores_BSS, mask_B11S), x_BSD)
    return jnp.concatenate([x_BSD, self_BSD], axis=-1)

  def __call__(self, a_BS: Array, b_BT: Array, *, deterministic: bool = True,
               return_attention: bool = False):
    """Classifies the pair.

    Args:
      a_BS: int ids of the first sentences, right padded with PAD.
      b_BT: int ids of the second sentences.
      deterministic: no dropout when True (training passes False and a "dropout" rng).
      return_attention: also return ``{"a_to_b": [B, S, T], "b_to_a": [B, T, S]}``.

    Returns:
      float32 ``logits [B, num_classes]`` (and the attention dict when asked).
    """
    for name, tokens in (("a", a_BS), ("b", b_BT)):
      if tokens.shape[1] > self.config.max_len:
        raise ValueError(f"sentence {name} has length {tokens.shape[1]} > "
                         f"DecomposableAttentionConfig.max_len={self.config.max_len}")
    real_a_BS, real_b_BT = a_BS != PAD_ID, b_BT != PAD_ID
    a_BSD = self._encode(a_BS, deterministic)
    b_BTD = self._encode(b_BT, deterministic)

    # attend
    fa_BSD = self.attend_ffn(a_BSD, deterministic=deterministic)
    fb_BTD = self.attend_ffn(b_BTD, deterministic=deterministic)
    scores_BST = luong_scores(fa_BSD, fb_BTD)
    a_to_b_BST = masked_alignment(scores_BST, real_b_BT[:, None, None, :])
    b_to_a_BTS = masked_alignment(jnp.swapaxes(scores_BST, 1, 2), real_a_BS[:, None, None, :])
    beta_BSD = attention_context(a_to_b_BST, b_BTD)  # the part of b aligned to a_i
    alpha_BTD = attention_context(b_to_a_BTS, a_BSD)  # the part of a aligned to b_j

    # compare
    v1_BSH = self.compare_ffn(jnp.concatenate([a_BSD, beta_BSD], axis=-1),
                              deterministic=deterministic)
    v2_BTH = self.compare_ffn(jnp.concatenate([b_BTD, alpha_BTD], axis=-1),
                              deterministic=deterministic)

    # aggregate over real positions only
    v1_BH = jnp.sum(jnp.where(real_a_BS[..., None], v1_BSH, 0), axis=1)
    v2_BH = jnp.sum(jnp.where(real_b_BT[..., None], v2_BTH, 0), axis=1)
    hidden_BH = self.aggregate_ffn(jnp.concatenate([v1_BH, v2_BH], axis=-1),
                                   deterministic=deterministic)
    logits_BC = self.classifier(hidden_BH).astype(jnp.float32)
    if return_attention:
      return logits_BC, {"a_to_b": a_to_b_BST, "b_to_a": b_to_a_BTS}
    return logits_BC
