"""Every config of the library: frozen, keyword-only dataclasses validated on construction.

Library code takes these dataclasses; only the command line parses flags or files,
converting at one boundary. A bad value raises ``ValueError`` naming the field,
the value and what would work.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _fail(config: object, field: str, value: Any, fix: str) -> None:
  raise ValueError(f"{type(config).__name__}.{field}={value!r}: {fix}")


def _check_positive(config: object, *fields: str) -> None:
  for field in fields:
    value = getattr(config, field)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      _fail(config, field, value, "must be a positive integer")


def _check_rate(config: object, *fields: str) -> None:
  for field in fields:
    value = getattr(config, field)
    if not 0.0 <= value < 1.0:
      _fail(config, field, value, "must be a probability in [0, 1)")


def _check_choice(config: object, field: str, choices: tuple[str, ...]) -> None:
  value = getattr(config, field)
  if value not in choices:
    _fail(config, field, value, f"must be one of {', '.join(map(repr, choices))}")


def compute_dtype(name: str) -> Any:
  """Maps a config's dtype name ('float32', 'bfloat16', 'float16') to a jnp dtype."""
  return _DTYPES[name]


def _check_special_ids(config: TransformerConfig | T5Config | RNNConfig,
                       vocab_sizes: dict[str, int]) -> None:
  """pad / decoder start / eos ids must lie in the vocabularies; pad and eos must differ."""
  for field in ("pad_id", "decoder_start_id", "eos_id"):
    value = getattr(config, field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
      _fail(config, field, value, "must be a token id >= 0")
    limit = min(vocab_sizes.values()) if field == "pad_id" else vocab_sizes["target"]
    if value >= limit:
      _fail(config, field, value, f"must be a token id below the vocabulary size {limit}")
  if config.pad_id == config.eos_id:
    _fail(config, "eos_id", config.eos_id,
          f"must differ from pad_id={config.pad_id}: PAD after an output marks its end")


POSITIONS = ("sinusoidal", "learned", "sinusoidal_marian", "sinusoidal_fairseq")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swish")
# How attention is computed: the einsums, or a fused kernel (layers.fused_attention).
ATTENTION_IMPLS = ("einsum", "xla", "cudnn", "splash", "auto")


class StackShape(NamedTuple):
  """The sizes of one side (encoder or decoder) of an encoder-decoder model."""

  num_layers: int  # L
  num_heads: int  # H of its self attention (and, for a decoder, its cross attention)
  head_dim: int  # K
  mlp_dim: int  # F of its feed-forward layers


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
  """The Transformer of Vaswani et al. 2017; the defaults are the paper's base model.

  The fields after ``attention_impl`` describe published checkpoints that differ in
  details (see ``seq2seq_jax.pretrained``); their defaults are this library's own.
  """

  vocab_size: int  # joint source/target vocabulary (the source one if target_vocab_size is set)
  model_dim: int = 512  # D, width of every residual stream
  num_heads: int = 8  # H (the decoder's too unless decoder_num_heads); divides model_dim
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  mlp_dim: int = 2048  # F, feed-forward hidden width (the decoder's too unless decoder_mlp_dim)
  dropout_rate: float = 0.1  # on embeddings, sublayer outputs and the FFN hidden layer
  attention_dropout_rate: float = 0.0  # on attention weights
  max_len: int = 256  # rows of the position table: longest source or target the model accepts
  positions: str = "sinusoidal"  # see POSITIONS and layers.embeddings.position_table
  norm: str = "post"  # "post": x = LN(x + f(x)) as in the paper; "pre": x = x + f(LN(x))
  share_embeddings: bool = True  # one token table for encoder and decoder (joint vocabulary)
  tie_output: bool = True  # output projection reuses the decoder's token table
  dtype: str = "float32"  # compute dtype; parameters stay float32
  attention_impl: str = "einsum"  # einsum, xla, cudnn, splash or auto: layers.fused_attention
  activation: str = "relu"  # feed-forward nonlinearity: relu, gelu (erf), gelu_tanh, swish (SiLU)
  activation_dropout_rate: float | None = None  # on the FFN hidden layer; None = dropout_rate
  scale_embeddings: bool = True  # multiply looked-up token vectors by sqrt(model_dim)
  position_offset: int = 0  # position p: row p + offset (fairseq: pad_id + 1; mBART's learned: 2)
  layer_norm_epsilon: float = 1e-6
  output_bias: bool = False  # a learned bias on the tied output logits (Marian's final_logits_bias)
  target_vocab_size: int = 0  # decoder vocabulary when it differs from the source's; 0 = same
  pad_id: int = 0  # the token that fills rows after their end; masked everywhere
  decoder_start_id: int = 1  # the decoder's first input (BOS here; pad for Marian, eos for M2M100)
  eos_id: int = 2  # the token that ends an output
  # Encoder and decoder apart (transformers declares each side on its own): 0 = as above.
  decoder_num_heads: int = 0  # the decoder's H (self and cross attention); 0 = num_heads
  decoder_mlp_dim: int = 0  # the decoder's F; 0 = mlp_dim
  embedding_norm: bool = False  # LayerNorm on embeddings + positions (mBART: layernorm_embedding)

  def __post_init__(self):
    _check_positive(self, "vocab_size", "model_dim", "num_heads", "num_encoder_layers",
                    "num_decoder_layers", "mlp_dim", "max_len")
    for field in ("decoder_num_heads", "decoder_mlp_dim"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        _fail(self, field, value, "must be an integer >= 0 (0 means the encoder's value)")
    for field, heads in (("num_heads", self.num_heads),
                         ("decoder_num_heads", self.decoder_stack.num_heads)):
      if self.model_dim % heads:
        _fail(self, "model_dim", self.model_dim,
              f"must be divisible by {field}={heads} "
              f"({self.model_dim} % {heads} = {self.model_dim % heads})")
    _check_rate(self, "dropout_rate", "attention_dropout_rate")
    if self.activation_dropout_rate is not None:
      _check_rate(self, "activation_dropout_rate")
    _check_choice(self, "positions", POSITIONS)
    _check_choice(self, "norm", ("post", "pre"))
    _check_choice(self, "dtype", tuple(_DTYPES))
    _check_choice(self, "attention_impl", ATTENTION_IMPLS)
    _check_choice(self, "activation", ACTIVATIONS)
    if self.positions.startswith("sinusoidal") and self.model_dim % 2:
      _fail(self, "model_dim", self.model_dim, "sinusoidal positions need an even model_dim")
    if self.position_offset < 0:
      _fail(self, "position_offset", self.position_offset, "must be >= 0")
    if not self.layer_norm_epsilon > 0:
      _fail(self, "layer_norm_epsilon", self.layer_norm_epsilon, "must be > 0")
    if self.target_vocab_size < 0:
      _fail(self, "target_vocab_size", self.target_vocab_size,
            "must be >= 0 (0 means the decoder shares vocab_size)")
    if self.target_vocab_size and self.share_embeddings:
      _fail(self, "target_vocab_size", self.target_vocab_size,
            "a separate target vocabulary needs share_embeddings=False")
    if self.output_bias and not self.tie_output:
      _fail(self, "output_bias", self.output_bias,
            "is for tied outputs; an untied output_projection has its own bias")
    _check_special_ids(self, {"source": self.vocab_size, "target": self.output_vocab_size})

  @property
  def head_dim(self) -> int:
    """K of the encoder (``encoder_stack.head_dim``)."""
    return self.model_dim // self.num_heads

  @property
  def encoder_stack(self) -> StackShape:
    """Layers, heads, per-head width and feed-forward width of the encoder."""
    return StackShape(self.num_encoder_layers, self.num_heads, self.model_dim // self.num_heads,
                      self.mlp_dim)

  @property
  def decoder_stack(self) -> StackShape:
    """Layers, heads, per-head width and feed-forward width of the decoder."""
    heads = self.decoder_num_heads or self.num_heads
    return StackShape(self.num_decoder_layers, heads, self.model_dim // heads,
                      self.decoder_mlp_dim or self.mlp_dim)

  @property
  def output_vocab_size(self) -> int:
    """Rows of the decoder's token table and columns of the logits."""
    return self.target_vocab_size or self.vocab_size

  @property
  def ffn_dropout_rate(self) -> float:
    """Dropout on the feed-forward hidden layer."""
    return self.dropout_rate if self.activation_dropout_rate is None else self.activation_dropout_rate


@dataclasses.dataclass(frozen=True, kw_only=True)
class T5Config:
  """The T5 encoder-decoder (Raffel et al. 2020) and its translation models (mT5, MADLAD-400).

  Pre-norm layers with RMSNorm and no biases anywhere; no position table: each
  stack's self attention adds a learned relative position bias (bidirectional in
  the encoder, causal in the decoder); unscaled dot-product attention; ReLU or
  gated-GELU feed-forward layers; token vectors not scaled. The defaults are
  t5-small's; ``seq2seq_jax.pretrained`` reads the published configs.

  Example:
    >>> config = T5Config(vocab_size=100, model_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
    ...                   activation="gelu_tanh", gated_ffn=True)
    >>> config.decoder_start_id == config.pad_id  # T5 starts decoding from its pad id
    True
  """

  vocab_size: int  # one table for encoder, decoder and (when tied) the output
  model_dim: int = 512  # D (d_model)
  num_heads: int = 8  # H of every attention layer
  head_dim: int = 64  # K (d_kv); num_heads * head_dim need not equal model_dim (mT5-small: 384)
  mlp_dim: int = 2048  # F (d_ff)
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  relative_buckets: int = 32  # relative_attention_num_buckets, both directions together
  relative_max_distance: int = 128  # offsets beyond share the last bucket
  activation: str = "relu"  # relu (T5), gelu_tanh (gelu_new: v1.1, mT5, MADLAD), gelu, swish
  gated_ffn: bool = False  # act(x W0) * (x W1), then W2: the "gated-gelu" of v1.1 and after
  dropout_rate: float = 0.1  # on embeddings, sublayer outputs, FFN hidden layer, attention weights
  layer_norm_epsilon: float = 1e-6
  tie_output: bool = True  # logits from the token table; False: a separate lm_head
  scale_output: bool = True  # the decoder's output times model_dim ** -0.5 before the logits
  max_len: int = 512  # longest source or target accepted (no position table: a limit only)
  dtype: str = "float32"  # compute dtype; parameters stay float32
  attention_impl: str = "einsum"  # as TransformerConfig's; the bias-carrying self attention
  # runs the einsums under every choice (no fused kernel takes T5's bias), cross attention not
  pad_id: int = 0
  decoder_start_id: int = 0  # T5 starts decoding from pad
  eos_id: int = 1

  def __post_init__(self):
    _check_positive(self, "vocab_size", "model_dim", "num_heads", "head_dim", "mlp_dim",
                    "num_encoder_layers", "num_decoder_layers", "relative_buckets",
                    "relative_max_distance", "max_len")
    if self.relative_buckets < 4:
      _fail(self, "relative_buckets", self.relative_buckets,
            "must be >= 4 (half per direction, half of those exact)")
    if self.relative_max_distance < self.relative_buckets // 4:
      _fail(self, "relative_max_distance", self.relative_max_distance,
            f"must be >= relative_buckets / 4 = {self.relative_buckets // 4}")
    _check_rate(self, "dropout_rate")
    _check_choice(self, "activation", ACTIVATIONS)
    _check_choice(self, "dtype", tuple(_DTYPES))
    _check_choice(self, "attention_impl", ATTENTION_IMPLS)
    if not self.layer_norm_epsilon > 0:
      _fail(self, "layer_norm_epsilon", self.layer_norm_epsilon, "must be > 0")
    _check_special_ids(self, {"source": self.vocab_size, "target": self.vocab_size})

  @property
  def output_vocab_size(self) -> int:
    """Columns of the logits (the one vocabulary)."""
    return self.vocab_size

  @property
  def encoder_stack(self) -> StackShape:
    return StackShape(self.num_encoder_layers, self.num_heads, self.head_dim, self.mlp_dim)

  @property
  def decoder_stack(self) -> StackShape:
    return StackShape(self.num_decoder_layers, self.num_heads, self.head_dim, self.mlp_dim)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RNNConfig:
  """Recurrent encoder-decoder (Sutskever 2014, Cho 2014), optionally with attention."""

  vocab_size: int  # joint source/target vocabulary
  cell: str = "lstm"  # "lstm", "gru" or "simple" (Elman tanh RNN)
  embed_dim: int = 256
  hidden_dim: int = 512  # state width of each direction of each layer
  num_encoder_layers: int = 1
  num_decoder_layers: int = 1
  bidirectional: bool = False  # encoder reads both ways; states concatenated (2 * hidden_dim)
  reverse_source: bool = False  # read the real tokens of each source row reversed (Sutskever)
  attention: str = "none"  # "none" (thought vector), "additive" (Bahdanau), "dot", "general" (Luong)
  attention_dim: int = 0  # additive attention's hidden width; 0 means hidden_dim
  input_feeding: bool = False  # Luong: feed the previous attentional vector to the next step
  dropout_rate: float = 0.1
  share_embeddings: bool = True  # one token table for encoder and decoder
  tie_output: bool = False  # output projection reuses the decoder's token table
  max_len: int = 512  # longest source or target the model accepts
  dtype: str = "float32"
  pad_id: int = 0  # fills rows after their end; masked everywhere
  decoder_start_id: int = 1  # the decoder's first input
  eos_id: int = 2  # ends an output

  def __post_init__(self):
    _check_positive(self, "vocab_size", "embed_dim", "hidden_dim", "num_encoder_layers",
                    "num_decoder_layers", "max_len")
    _check_special_ids(self, {"source": self.vocab_size, "target": self.vocab_size})
    _check_choice(self, "cell", ("lstm", "gru", "simple"))
    _check_choice(self, "attention", ("none", "additive", "dot", "general"))
    _check_choice(self, "dtype", tuple(_DTYPES))
    _check_rate(self, "dropout_rate")
    if self.attention_dim < 0:
      _fail(self, "attention_dim", self.attention_dim, "must be >= 0 (0 means hidden_dim)")
    if self.input_feeding and self.attention == "none":
      _fail(self, "input_feeding", self.input_feeding,
            "input feeding needs attention; set attention to 'additive', 'dot' or 'general'")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecomposableAttentionConfig:
  """Decomposable attention for sentence pairs (Parikh et al. 2016)."""

  vocab_size: int
  embed_dim: int = 128
  hidden_dim: int = 200  # width of the attend / compare / aggregate feed-forward networks
  num_classes: int = 2
  intra_attention: bool = False  # the paper's optional intra-sentence attention
  dropout_rate: float = 0.2
  max_len: int = 256
  dtype: str = "float32"

  def __post_init__(self):
    _check_positive(self, "vocab_size", "embed_dim", "hidden_dim", "num_classes", "max_len")
    _check_rate(self, "dropout_rate")
    _check_choice(self, "dtype", tuple(_DTYPES))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeConfig:
  """How ``generate`` searches: greedy, beam or sampling, and the controls on its outputs.

  Every control is off by default and then costs nothing. The fields named as in
  transformers' ``GenerationConfig`` (``early_stopping``, ``num_beam_groups``,
  ``diversity_penalty``, ``no_repeat_ngram_size``, ``repetition_penalty``,
  ``renormalize_logits``) mean what they mean there; ``alpha`` with ``length_penalty_form="power"`` is its
  ``length_penalty``. Per-sentence target prefixes and lexical constraints are
  arguments of ``generate`` and ``Translator.translate``, not settings.

  Example:
    >>> DecodeConfig(method="beam", beam_size=4, num_beam_groups=2, diversity_penalty=0.5)
    ... # doctest: +ELLIPSIS
    DecodeConfig(method='beam', beam_size=4, ...)
    >>> DecodeConfig(method="beam", beam_size=4, num_beam_groups=3)
    Traceback (most recent call last):
    ...
    ValueError: DecodeConfig.num_beam_groups=3: must divide beam_size=4 ...
  """

  method: str = "greedy"  # "greedy", "beam" or "sample"
  beam_size: int = 4
  alpha: float = 0.6  # length penalty exponent: ((5 + len) / 6) ** alpha, see length_penalty_form
  max_decode_len: int = 0  # fixed output length limit; 0 means use the ratio below
  max_decode_len_ratio: float = 1.5  # limit = ceil(ratio * padded source length) + 10
  temperature: float = 1.0  # sampling only
  top_k: int = 0  # sampling only; 0 = off
  top_p: float = 1.0  # sampling only; 1.0 = off
  seed: int = 0  # sampling rng seed
  # Token rules of published checkpoints (their generation_config.json); the model's
  # pad and decoder start ids (unless one is its eos) are never generated anyway.
  forced_bos_id: int | None = None  # the first output token, e.g. a target language code
  force_eos_at_limit: bool = False  # an output reaching the length limit ends with EOS
  suppress_ids: tuple[int, ...] = ()  # more tokens never generated (single-token bad_words_ids)
  # Beam search: the length penalty's form, the stopping rule, diverse groups.
  length_penalty_form: str = "gnmt"  # "gnmt" ((5 + len) / 6) ** alpha; "power" len ** alpha
  early_stopping: bool | str = "never"  # "never": stop when no live beam can win; True/False: HF's
  num_beam_groups: int = 1  # > 1: diverse beam search, beam_size / num_beam_groups beams a group
  diversity_penalty: float = 0.0  # per beam of an earlier group that chose the token this step
  # Repetition control, every method; 0 and 1.0 are off.
  no_repeat_ngram_size: int = 0  # never repeat an n-gram of this many tokens
  repetition_penalty: float = 1.0  # > 1 makes tokens already generated less likely
  renormalize_logits: bool = False  # log-softmax again after the rules (masks, penalties)

  def __post_init__(self):
    _check_choice(self, "method", ("greedy", "beam", "sample"))
    if isinstance(self.early_stopping, str) and self.early_stopping.lower() in ("true", "false"):
      # From a flag or a file (--set decode.early_stopping=false).
      object.__setattr__(self, "early_stopping", self.early_stopping.lower() == "true")
    if not (self.early_stopping is True or self.early_stopping is False
            or self.early_stopping == "never"):
      _fail(self, "early_stopping", self.early_stopping,
            "must be 'never' (stop when no live beam can win), True (stop at beam_size finished "
            "hypotheses) or False (transformers' heuristic)")
    _check_choice(self, "length_penalty_form", ("gnmt", "power"))
    _check_positive(self, "beam_size", "num_beam_groups")
    if self.beam_size % self.num_beam_groups:
      _fail(self, "num_beam_groups", self.num_beam_groups,
            f"must divide beam_size={self.beam_size} (each group gets beam_size / "
            "num_beam_groups beams)")
    if self.diversity_penalty < 0:
      _fail(self, "diversity_penalty", self.diversity_penalty, "must be >= 0 (0 means off)")
    if self.diversity_penalty and self.num_beam_groups == 1:
      _fail(self, "diversity_penalty", self.diversity_penalty,
            "acts between beam groups: set num_beam_groups > 1 too")
    ngram = self.no_repeat_ngram_size
    if not isinstance(ngram, int) or isinstance(ngram, bool) or ngram < 0:
      _fail(self, "no_repeat_ngram_size", self.no_repeat_ngram_size,
            "must be an integer >= 0 (0 means off)")
    if not self.repetition_penalty > 0:
      _fail(self, "repetition_penalty", self.repetition_penalty,
            "must be > 0 (1.0 means off; above 1 discourages repeats)")
    if self.forced_bos_id is not None and (not isinstance(self.forced_bos_id, int)
                                           or self.forced_bos_id < 0):
      _fail(self, "forced_bos_id", self.forced_bos_id, "must be a token id >= 0 or None")
    if not isinstance(self.suppress_ids, tuple) or not all(
        isinstance(i, int) and i >= 0 for i in self.suppress_ids):
      _fail(self, "suppress_ids", self.suppress_ids, "must be a tuple of token ids >= 0")
    if self.alpha < 0:
      _fail(self, "alpha", self.alpha, "must be >= 0")
    if self.max_decode_len < 0:
      _fail(self, "max_decode_len", self.max_decode_len, "must be >= 0 (0 means use the ratio)")
    if self.max_decode_len_ratio <= 0:
      _fail(self, "max_decode_len_ratio", self.max_decode_len_ratio, "must be > 0")
    if self.temperature < 0:
      _fail(self, "temperature", self.temperature, "must be >= 0 (0 means greedy)")
    if self.top_k < 0:
      _fail(self, "top_k", self.top_k, "must be >= 0 (0 means off)")
    if not 0.0 < self.top_p <= 1.0:
      _fail(self, "top_p", self.top_p, "must be in (0, 1]")

  def decode_len(self, source_len: int) -> int:
    """The output length limit for sources padded to ``source_len``."""
    if self.max_decode_len:
      return self.max_decode_len
    return int(-(-self.max_decode_len_ratio * source_len // 1)) + 10


@dataclasses.dataclass(frozen=True, kw_only=True)
class TranslateFileConfig:
  """How ``inference.translate_file`` reads, batches and writes a file (the search is a
  ``DecodeConfig``'s)."""

  window_lines: int = 20_000  # lines read, sorted by length and batched together: bounds memory
  batch_tokens: int = 8192  # padded source tokens (rows x bucket length) of a full batch
  max_rows: int = 256  # most sentences in one batch
  row_multiple: int = 8  # batch rows are a multiple of this (and of the mesh's data axis)
  n_best: int = 0  # K > 0: K lines "INDEX ||| TEXT ||| SCORE" per input, best first (beam search)
  scores: bool = False  # "TEXT ||| LOGPROB" per input: the output's total log-probability
  references: str = ""  # a file of translations: write their forced-decoding log-probs instead
  prefixes: str = ""  # a file of target prefixes, one per input line ("" on a line: none)
  constraints: str = ""  # per input line, tab-separated phrases its translation must contain
  progress: str = "auto"  # "bar" (tqdm), "lines" (plain), "none"; "auto": a bar on a terminal
  report_every_s: float = 30.0  # seconds between plain progress lines

  def __post_init__(self):
    _check_positive(self, "window_lines", "batch_tokens", "max_rows", "row_multiple")
    if not isinstance(self.n_best, int) or self.n_best < 0:
      _fail(self, "n_best", self.n_best, "must be >= 0 (0: one translation per line)")
    if self.references and (self.n_best or self.scores):
      _fail(self, "references", self.references,
            "scores given translations; it cannot be combined with n_best or scores")
    if self.references and (self.prefixes or self.constraints):
      _fail(self, "references", self.references,
            "scores given translations; prefixes and constraints steer a search it does not run")
    _check_choice(self, "progress", ("auto", "bar", "lines", "none"))
    if self.report_every_s <= 0:
      _fail(self, "report_every_s", self.report_every_s, "must be > 0 seconds")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """Which corpus, how it is tokenized, filtered, bucketed and batched."""

  dataset: str = "multi30k"  # "multi30k", "parallel_text" or "tfds:NAME"
  manual_dir: str = ""  # local copy of the corpus (multi30k raw files, or the user's own files)
  data_dir: str = ""  # where prepared tfds data lives; "" = ~/.cache/seq2seq_jax/tfds
  source_lang: str = "de"
  target_lang: str = "en"
  train_split: str = "train"
  eval_split: str = "val"
  vocab_size: int = 8000  # sentencepiece joint vocabulary size (ids 0-3 are PAD/BOS/EOS/UNK)
  max_source_len: int = 64  # tokens, EOS included
  max_target_len: int = 64  # tokens, EOS included
  too_long: str = "filter"  # training pairs over the limits: "filter" (drop, counted) or "truncate"
  batch_tokens: int = 4096  # global token budget of a training batch (padded rows * length)
  batch_multiple: int = 8  # every batch's row count is a multiple of this (device count)
  bucket_lengths: tuple[int, ...] = (8, 16, 24, 32, 48, 64)  # padded lengths that batches take
  eval_batch_size: int = 64  # rows of an evaluation batch; a multiple of batch_multiple
  shuffle_seed: int = 0
  # Training text becomes token ids once (ArrayRecord shards and a lengths index, keyed by the
  # tokenizer's hash) and every start reads those; False tokenizes every batch from text.
  tokenize_once: bool = True
  num_workers: int = 0  # grain worker processes building batches; 0 = threads in this process
  # Several pairs per row of the largest bucket length, with segment ids and positions
  # (Transformer and T5 only); off = one pair per row, padded to its bucket.
  packing: bool = False
  # Training text read straight from your own files, not through tfds: a glob with "{lang}"
  # for the language code, e.g. "corpus/train-*.{lang}.gz" (plain or gzip, sorted shards).
  train_files: str = ""
  empty_lines: str = "refuse"  # a training pair with an empty side: "refuse" (error) or "drop"

  def __post_init__(self):
    _check_positive(self, "vocab_size", "max_source_len", "max_target_len", "batch_tokens",
                    "batch_multiple", "eval_batch_size")
    if self.vocab_size <= 4:
      _fail(self, "vocab_size", self.vocab_size, "must exceed the 4 reserved ids PAD/BOS/EOS/UNK")
    _check_choice(self, "too_long", ("filter", "truncate"))
    _check_choice(self, "empty_lines", ("refuse", "drop"))
    if self.num_workers < 0:
      _fail(self, "num_workers", self.num_workers, "must be >= 0 (0 builds batches on threads)")
    if self.train_files and "{lang}" not in self.train_files:
      _fail(self, "train_files", self.train_files,
            "must hold '{lang}' where the language code goes, e.g. 'train-*.{lang}.gz'")
    for field in ("packing", "train_files"):
      if getattr(self, field) and not self.tokenize_once:
        _fail(self, field, getattr(self, field), "needs tokenize_once=True (it reads prepared ids)")
    if self.source_lang == self.target_lang:
      _fail(self, "target_lang", self.target_lang, "must differ from source_lang")
    if not self.bucket_lengths or list(self.bucket_lengths) != sorted(set(self.bucket_lengths)):
      _fail(self, "bucket_lengths", self.bucket_lengths, "must be strictly increasing and non-empty")
    if self.bucket_lengths[-1] < max(self.max_source_len, self.max_target_len):
      _fail(self, "bucket_lengths", self.bucket_lengths,
            f"the largest bucket must be >= max_source_len={self.max_source_len} "
            f"and max_target_len={self.max_target_len}")
    if self.eval_batch_size % self.batch_multiple:
      _fail(self, "eval_batch_size", self.eval_batch_size,
            f"must be a multiple of batch_multiple={self.batch_multiple}")
    if not (self.dataset in ("multi30k", "parallel_text")
            or (self.dataset.startswith("tfds:") and len(self.dataset) > len("tfds:"))):
      _fail(self, "dataset", self.dataset,
            "must be 'multi30k', 'parallel_text' or 'tfds:NAME' (e.g. 'tfds:wmt14_translate/de-en')")
    if self.dataset == "parallel_text" and not self.manual_dir:
      _fail(self, "manual_dir", self.manual_dir,
            "parallel_text reads your own files: set it to the folder of {split}.{lang} files")
    # The longest batches (the bucket holding the length limits) need batch_multiple rows.
    longest = min(b for b in self.bucket_lengths if b >= max(self.max_source_len, self.max_target_len))
    if self.batch_tokens < self.batch_multiple * longest:
      _fail(self, "batch_tokens", self.batch_tokens,
            f"must hold batch_multiple={self.batch_multiple} rows of the bucket length {longest} "
            f"that the length limits need: at least {self.batch_multiple * longest}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """Optimisation, evaluation cadence, checkpoints and parallelism of a training run."""

  num_steps: int = 10_000  # optimizer updates
  learning_rate: float = 1e-3  # peak learning rate
  schedule: str = "rsqrt"  # "rsqrt" (inverse square root), "cosine", "linear", "constant"
  warmup_steps: int = 1000
  label_smoothing: float = 0.1
  weight_decay: float = 0.0  # AdamW decoupled decay, never on biases, norms or embeddings
  adam_b1: float = 0.9
  adam_b2: float = 0.98
  adam_eps: float = 1e-9
  clip_norm: float = 1.0  # global-norm gradient clipping; 0 = off
  grad_accum_steps: int = 1  # microbatches per update
  compute_dtype: str = "float32"  # "bfloat16" computes in bf16 with float32 parameters
  seed: int = 0
  log_every: int = 50
  eval_every: int = 1000  # validation loss and BLEU every N steps; 0 = only at the end
  eval_bleu_sentences: int = 0  # validation sentences decoded for BLEU; 0 = all
  eval_batches: int = 0  # validation batches for the validation loss; 0 = all
  checkpoint_every: int = 1000
  keep_checkpoints: int = 2  # latest N kept beside the best by validation BLEU
  parameter_sharding: str = "replicated"  # "replicated" or "fsdp" (shard along the data axis)
  model_parallelism: int = 1  # size of the mesh's "model" axis (tensor parallelism)
  init_from: str = ""  # a pretrained checkpoint directory a new run starts from (fine-tuning)

  def __post_init__(self):
    _check_positive(self, "num_steps", "grad_accum_steps", "log_every", "checkpoint_every",
                    "keep_checkpoints", "model_parallelism")
    if self.learning_rate <= 0:
      _fail(self, "learning_rate", self.learning_rate, "must be > 0")
    _check_choice(self, "schedule", ("rsqrt", "cosine", "linear", "constant"))
    if self.warmup_steps < 0:
      _fail(self, "warmup_steps", self.warmup_steps, "must be >= 0")
    _check_rate(self, "label_smoothing")
    if self.clip_norm < 0:
      _fail(self, "clip_norm", self.clip_norm, "must be >= 0 (0 means off)")
    _check_choice(self, "compute_dtype", tuple(_DTYPES))
    _check_choice(self, "parameter_sharding", ("replicated", "fsdp"))
    if self.eval_every < 0:
      _fail(self, "eval_every", self.eval_every, "must be >= 0 (0 means only at the end)")
    for field in ("eval_bleu_sentences", "eval_batches"):
      if getattr(self, field) < 0:
        _fail(self, field, getattr(self, field), "must be >= 0 (0 means all)")
    if self.schedule in ("cosine", "linear") and self.warmup_steps >= self.num_steps:
      _fail(self, "warmup_steps", self.warmup_steps,
            f"the {self.schedule} schedule needs warmup_steps < num_steps={self.num_steps}")


# ExperimentConfig.to_dict writes the model's kind under this key; from_dict reads it back.
_MODEL_KINDS = {"transformer": TransformerConfig, "rnn": RNNConfig, "t5": T5Config}
_PACKING_KINDS = ("transformer", "t5")  # the model kinds that take packed rows (data.packing)


def _section_from_dict(cls: type, values: Any, where: str):
  """Builds config ``cls`` from a JSON-like dict; unknown keys raise naming ``where.key``."""
  if not isinstance(values, dict):
    raise ValueError(f"{where} must be a dict of {cls.__name__} fields; got {type(values).__name__}")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ValueError(f"unknown field(s) {', '.join(f'{where}.{k}' for k in unknown)} for "
                     f"{cls.__name__}; known fields: {', '.join(sorted(fields))}")
  kwargs = {}
  for name, value in values.items():
    # JSON has no tuples: a list comes back where the field holds a tuple.
    if isinstance(value, list) and str(fields[name].type).startswith("tuple"):
      value = tuple(value)
    kwargs[name] = value
  try:
    return cls(**kwargs)
  except TypeError as error:  # a required field is missing
    raise ValueError(f"{where}: {error}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
  """The whole configuration of a training run: model, data, optimisation, decoding.

  Saved with every run and checkpoint (``to_dict``, JSON-serialisable) and read
  back with ``from_dict``, which names any unknown field. The model section
  carries its kind (``"transformer"``, ``"t5"`` or ``"rnn"``) under the key ``"kind"``;
  a model section without one is a Transformer's (configs written before the key).
  ``data.packing`` needs a Transformer or a T5 whose ``max_len`` holds the packed rows (the largest bucket); an RNN refuses it.

  Example:
    >>> config = ExperimentConfig(model=TransformerConfig(vocab_size=500, model_dim=32,
    ...                                                   num_heads=2, mlp_dim=64),
    ...                           data=DataConfig(vocab_size=500))
    >>> ExperimentConfig.from_dict(config.to_dict()) == config
    True
  """

  model: TransformerConfig | T5Config | RNNConfig  # the encoder-decoder to train
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)  # validation BLEU decoding

  def __post_init__(self):
    if not isinstance(self.model, tuple(_MODEL_KINDS.values())):
      _fail(self, "model", type(self.model).__name__,
            "must be a TransformerConfig, a T5Config or an RNNConfig")
    for field, cls in (("data", DataConfig), ("train", TrainConfig), ("decode", DecodeConfig)):
      if not isinstance(getattr(self, field), cls):
        _fail(self, field, type(getattr(self, field)).__name__, f"must be a {cls.__name__}")
    longest = max(self.data.max_source_len, self.data.max_target_len)
    if self.model.max_len < longest:
      _fail(self, "model.max_len", self.model.max_len,
            f"must be >= data.max_source_len / max_target_len ({longest}); raise model.max_len "
            "or lower the data limits")
    if self.data.packing:
      self._check_packing()

  def _check_packing(self) -> None:
    """Packed rows need a model that keeps pairs apart by segment ids, and rows it accepts."""
    kind = self.model_kind
    if kind not in _PACKING_KINDS:
      _fail(self, "data.packing", True,
            f"the {kind!r} model ({type(self.model).__name__}) cannot train on packed rows: a "
            "recurrence carries one pair's state into the next; packing is for "
            f"{' and '.join(map(repr, _PACKING_KINDS))} models; set data.packing=False")
    row = self.data.bucket_lengths[-1]
    if self.model.max_len < row:
      _fail(self, "model.max_len", self.model.max_len,
            f"must be >= the packed row length, the largest of data.bucket_lengths ({row}); "
            "raise model.max_len or lower the largest bucket")

  @property
  def model_kind(self) -> str:
    """``"transformer"``, ``"t5"`` or ``"rnn"``."""
    return next(k for k, cls in _MODEL_KINDS.items() if isinstance(self.model, cls))

  def to_dict(self) -> dict[str, Any]:
    """A JSON-serialisable dict: ``{"model": {"kind": ..., ...}, "data": ..., ...}``."""
    out = {}
    for field in ("model", "data", "train", "decode"):
      section = dataclasses.asdict(getattr(self, field))
      out[field] = {k: list(v) if isinstance(v, tuple) else v for k, v in section.items()}
    out["model"] = {"kind": self.model_kind, **out["model"]}
    return out

  @classmethod
  def from_dict(cls, values: dict[str, Any]) -> "ExperimentConfig":
    """Inverse of ``to_dict``; raises ``ValueError`` naming unknown sections or fields."""
    if not isinstance(values, dict):
      raise ValueError(f"an ExperimentConfig dict is needed; got {type(values).__name__}")
    unknown = sorted(set(values) - {"model", "data", "train", "decode"})
    if unknown:
      raise ValueError(f"unknown section(s) {', '.join(unknown)}; known: model, data, train, "
                       "decode")
    if "model" not in values:
      raise ValueError("the 'model' section is missing")
    model = dict(values["model"])
    kind = model.pop("kind", "transformer")
    if kind not in _MODEL_KINDS:
      raise ValueError(f"model.kind={kind!r} must be one of {', '.join(map(repr, _MODEL_KINDS))}")
    sections = {"model": _section_from_dict(_MODEL_KINDS[kind], model, "model")}
    for field, section_cls in (("data", DataConfig), ("train", TrainConfig),
                               ("decode", DecodeConfig)):
      if field in values:
        sections[field] = _section_from_dict(section_cls, values[field], field)
    return cls(**sections)
