"""Named experiment presets and ``section.field=value`` overrides on top of them.

Example:
  >>> config = get_preset("multi30k_transformer")
  >>> config = apply_overrides(config, ["train.num_steps=400", "model.dropout_rate=0"])
  >>> config.train.num_steps, config.model.dropout_rate
  (400, 0.0)
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable, Iterable

from seq2seq_jax.configs import (DataConfig, DecodeConfig, ExperimentConfig, RNNConfig,
                                 TrainConfig, TransformerConfig)

_SECTIONS = ("model", "data", "train", "decode")


def _tiny_transformer() -> ExperimentConfig:
  """Seconds per run: a 1+1-layer d=32 Transformer on the 300-line multi30k_tiny copy."""
  return ExperimentConfig(
      model=TransformerConfig(vocab_size=500, model_dim=32, num_heads=2, mlp_dim=64,
                              num_encoder_layers=1, num_decoder_layers=1, max_len=64,
                              dropout_rate=0.0),
      data=DataConfig(vocab_size=500, max_source_len=48, max_target_len=48,
                      bucket_lengths=(16, 32, 48), batch_tokens=768, eval_batch_size=16),
      train=TrainConfig(num_steps=40, learning_rate=3e-3, warmup_steps=10, log_every=10,
                        eval_every=20, checkpoint_every=20, eval_bleu_sentences=16),
      decode=DecodeConfig(method="greedy", max_decode_len=32))


# Packed rows (data.packing) of 48 pieces a side, 64 rows to a batch: the same 3072 slots
# as the buckets, with about 1.1x the real target tokens a step (2656 of them against the
# buckets' 2396 de->en, 2856 against 2562 en->de) for 1.02-1.03x the step time (alternated
# on the Zen 4: benchmarks/RESULTS.md). 48 rather than 64 keeps the rows' attention short;
# the training pairs longer than 48 pieces are dropped (89 de->en, 0.3 %; 24 en->de), and
# evaluation truncates the few longer sources (de->en one of test_2016's 1000, six of
# validation's; en->de none and one, and scoring that one whole left validation BLEU as it was).
_PACKED_LEN = 48


def _multi30k_data(source_lang: str = "de", target_lang: str = "en", *,
                   vocab_size: int = 3000, packed: bool = False) -> DataConfig:
  # A joint sentencepiece vocabulary of 3000 pieces by default; into German, 6000 (see
  # _EN_DE_VOCAB). A first 8000-piece Transformer run scored far lower (17.7
  # validation BLEU), but it also had FFN 1024 and half the updates, so it said
  # nothing about the vocabulary alone.
  data = DataConfig(dataset="multi30k", source_lang=source_lang, target_lang=target_lang,
                    vocab_size=vocab_size, max_source_len=64, max_target_len=64,
                    bucket_lengths=(12, 16, 20, 24, 32, 48, 64), batch_tokens=3072)
  if not packed:
    return data
  return dataclasses.replace(data, max_source_len=_PACKED_LEN, max_target_len=_PACKED_LEN,
                             bucket_lengths=(12, 16, 20, 24, 32, 48), packing=True)


def _multi30k_transformer(source_lang: str = "de", target_lang: str = "en", *,
                          vocab_size: int = 3000, num_steps: int = 1400,
                          activation: str = "relu", packed: bool = True) -> ExperimentConfig:
  """The default: a 3+3-layer d=256 Transformer on Multi30k, sized to train in 30 CPU minutes.

  1400 updates of 64 packed rows of 48 pieces a side (3072 slots, about 2650 real target
  tokens; under 8 epochs) with a cosine schedule fit in about 30 minutes of a 2-core CPU,
  compilation and the final validation included: packing carries about 1.1x the real
  tokens of the bucketed batches the preset had before in the same updates. No dropout:
  over so few epochs the model does not overfit, and an update without dropout masks is
  about 10 % faster; label smoothing stays. Into German, a larger vocabulary, fewer
  updates and GELU (see ``_EN_DE_VOCAB``).
  """
  return ExperimentConfig(
      model=TransformerConfig(vocab_size=vocab_size, model_dim=256, num_heads=4, mlp_dim=512,
                              num_encoder_layers=3, num_decoder_layers=3, max_len=128,
                              dropout_rate=0.0, attention_dropout_rate=0.0,
                              activation=activation),
      data=_multi30k_data(source_lang, target_lang, vocab_size=vocab_size, packed=packed),
      train=TrainConfig(num_steps=num_steps, learning_rate=1.5e-3, schedule="cosine",
                        warmup_steps=150, label_smoothing=0.1, log_every=50, eval_every=0,
                        checkpoint_every=250, eval_bleu_sentences=512),
      # Greedy for the validation BLEU during training; a beam search asked for later
      # (`evaluate --beam-size 4`) takes alpha 1.0, the length penalty the validation split
      # chose over 0.2, 0.6 and 1.4 in both directions (benchmarks/RESULTS.md).
      decode=DecodeConfig(method="greedy", alpha=1.0))


def _multi30k_transformer_long(source_lang: str = "de", target_lang: str = "en", *,
                               vocab_size: int = 3000,
                               num_steps: int = 5400) -> ExperimentConfig:
  """``multi30k_transformer`` trained for two CPU hours: 5400 updates, about 26 epochs.

  The same model, with bucketed batches: packed rows of 48, tried into German, scored
  0.26 BLEU lower on validation (benchmarks/RESULTS.md). Four times the updates call for
  some regularization, dropout 0.1 (none on the attention weights), and a longer warmup
  (400). Dropout 0.2 with attention dropout 0.1 scored 1.6 BLEU lower on validation
  (benchmarks/RESULTS.md). Validation loss and BLEU every 1000 updates draw the learning
  curve; a checkpoint every 500. Into German, fewer updates of the larger vocabulary's
  slower step, and ReLU rather than the 30-minute run's GELU (see ``_EN_DE_VOCAB``).
  """
  base = _multi30k_transformer(source_lang, target_lang, vocab_size=vocab_size, packed=False)
  return dataclasses.replace(
      base, model=dataclasses.replace(base.model, dropout_rate=0.1),
      train=dataclasses.replace(base.train, num_steps=num_steps, warmup_steps=400,
                                eval_every=1000, checkpoint_every=500))


def _multi30k_transformer_deep_shallow() -> ExperimentConfig:
  """A deep encoder and a one-layer decoder (Kasai et al. 2021): 6 + 1 layers, d=256.

  Decoding time is spent in the decoder, once per generated token; the encoder runs
  once per sentence. Moving depth to the encoder keeps most of the quality at a
  fraction of the decoding cost; the single decoder layer gets a wider feed-forward
  layer (1024 against the encoder's 512). The rest is ``multi30k_transformer``'s.
  """
  base = _multi30k_transformer()
  model = dataclasses.replace(base.model, num_encoder_layers=6, num_decoder_layers=1,
                              decoder_mlp_dim=1024)
  return dataclasses.replace(base, model=model)


def _multi30k_rnn(attention: str, cell: str, bidirectional: bool, *, hidden_dim: int,
                  num_steps: int, source_lang: str = "de",
                  target_lang: str = "en") -> ExperimentConfig:
  """A one-layer recurrent encoder-decoder on Multi30k, sized for one CPU core.

  The numbers in benchmarks/RESULTS.md (Multi30k BLEU) come from training ``multi30k_rnn_attention`` and
  ``multi30k_gru`` side by side, each pinned to one of the two cores: a scan's
  small per-step matmuls gain little from a second thread.
  """
  return ExperimentConfig(
      model=RNNConfig(vocab_size=3000, cell=cell, embed_dim=256, hidden_dim=hidden_dim,
                      bidirectional=bidirectional, attention=attention, dropout_rate=0.3,
                      max_len=128),
      data=_multi30k_data(source_lang, target_lang),
      train=TrainConfig(num_steps=num_steps, learning_rate=2e-3, schedule="cosine",
                        warmup_steps=20, label_smoothing=0.1, log_every=25, eval_every=0,
                        checkpoint_every=250, eval_bleu_sentences=512),
      decode=DecodeConfig(method="greedy"))


def _wmt14_transformer(*, big: bool) -> ExperimentConfig:
  """Vaswani et al. 2017's base or big Transformer on WMT'14 English->German.

  The paper's recipe: a shared 32k-piece vocabulary (sentencepiece here, byte-pair in
  the paper), batches of about 25,000 source and 25,000 target tokens, Adam (0.9,
  0.98, 1e-9) with ``d**-0.5 * min(step**-0.5, step * 4000**-1.5)`` (peak 7.0e-4 for
  d=512, 4.9e-4 for d=1024), label smoothing 0.1, dropout 0.1 (big: 0.3, the
  paper's en-de setting), no gradient clipping, 100k steps (big: 300k), beam 4 with
  length penalty 0.6; bfloat16 compute with float32 parameters, for accelerators.
  Packed rows (``data.packing``): 104 rows of 256 token slots a side, 26,624 slots,
  about the paper's 25k real tokens at the fill the compile report assumes
  (``aot.report.ASSUMED_PACKING_FILL``, measured on a WMT-sized stand-in). Data: tfds
  ``wmt14_translate/de-en`` (downloaded by tfds: newstest2013 as validation,
  newstest2014 as test), tokenized once into ids at the first start.
  """
  dim, heads, mlp = (1024, 16, 4096) if big else (512, 8, 2048)
  return ExperimentConfig(
      model=TransformerConfig(vocab_size=32000, model_dim=dim, num_heads=heads, mlp_dim=mlp,
                              num_encoder_layers=6, num_decoder_layers=6, max_len=256,
                              dropout_rate=0.3 if big else 0.1, attention_dropout_rate=0.0),
      data=DataConfig(dataset="tfds:wmt14_translate/de-en", source_lang="en", target_lang="de",
                      eval_split="validation", vocab_size=32000, max_source_len=256,
                      max_target_len=256, bucket_lengths=(16, 24, 32, 48, 64, 96, 128, 192, 256),
                      batch_tokens=26624, packing=True, eval_batch_size=128),
      train=TrainConfig(num_steps=300_000 if big else 100_000,
                        learning_rate=(dim * 4000) ** -0.5, schedule="rsqrt", warmup_steps=4000,
                        adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9, label_smoothing=0.1,
                        clip_norm=0.0, compute_dtype="bfloat16", log_every=100, eval_every=5000,
                        eval_bleu_sentences=1000, checkpoint_every=5000, keep_checkpoints=5),
      decode=DecodeConfig(method="beam", beam_size=4, alpha=0.6))


_RNN_ATTENTION = dict(attention="additive", cell="gru", bidirectional=True, hidden_dim=256,
                      num_steps=900)
_GRU = dict(attention="none", cell="gru", bidirectional=False, hidden_dim=512, num_steps=1200)


def _tiny_rnn(attention: str, *, bidirectional: bool) -> ExperimentConfig:
  """Seconds per run: ``tiny_transformer``'s data and steps with a d=32 GRU encoder-decoder."""
  return dataclasses.replace(_tiny_transformer(), model=RNNConfig(
      vocab_size=500, cell="gru", embed_dim=16, hidden_dim=32, bidirectional=bidirectional,
      attention=attention, dropout_rate=0.0, max_len=64))


def _short(config: ExperimentConfig, *, model: dict[str, Any],
           train: dict[str, Any]) -> ExperimentConfig:
  """``config`` cut to minutes on a 2-core CPU: the notebooks' full runs (``colabs/``).

  Sentences of at most 40 pieces in 2048-token batches, validation BLEU on 200
  sentences; ``model`` and ``train`` change those sections' fields too.
  """
  replace = dataclasses.replace
  return replace(
      config, model=replace(config.model, vocab_size=3000, **model),
      data=replace(config.data, vocab_size=3000, max_source_len=40, max_target_len=40,
                   bucket_lengths=(16, 24, 32, 40), batch_tokens=2048, packing=False),
      train=replace(config.train, log_every=50, eval_bleu_sentences=200, eval_batches=4,
                    **train))


# A short run of each preset: narrower, 700-800 updates (10-20 minutes on a 2-core CPU).
_SHORT_RNN = dict(model=dict(embed_dim=128, hidden_dim=256, dropout_rate=0.3),
                  train=dict(num_steps=700, learning_rate=2e-3, schedule="constant",
                             warmup_steps=0, eval_every=350, checkpoint_every=350))
_SHORT_TRANSFORMER = dict(model=dict(model_dim=128, mlp_dim=512, dropout_rate=0.1),
                          train=dict(num_steps=800, learning_rate=2e-3, schedule="rsqrt",
                                     warmup_steps=200, eval_every=400, checkpoint_every=400))

# Into German, 6000 pieces instead of 3000: German words split into more pieces (1.60
# per word on the validation split against English's 1.38 with 3000), and the larger
# vocabulary scored 1.3-2.2 BLEU higher on validation (benchmarks/HISTORY.md). Its
# larger softmax makes an update 10.6 % slower (timed on a Zen 5), so the updates are
# cut to keep each run's time: 1400 -> 1250 and 5400 -> 4850. The 30-minute run takes
# GELU in the feed-forward layers: 0.5 BLEU over ReLU on validation with beam 4 (two
# seeds each), at no measurable cost per update; label smoothing 0 or 0.2, 8 heads, and 4+2 or 2+4 layers
# did not beat the preset (benchmarks/HISTORY.md). Over the long run's 4850 updates GELU's
# lead in validation loss closed by update 4000 and it scored 0.45 lower with beam 4, so
# the long run keeps ReLU.
_EN_DE_VOCAB = 6000

PRESETS: dict[str, Callable[[], ExperimentConfig]] = {
    "tiny_transformer": _tiny_transformer,
    "tiny_gru": lambda: _tiny_rnn("none", bidirectional=False),
    "tiny_rnn_attention": lambda: _tiny_rnn("additive", bidirectional=True),
    "multi30k_transformer": _multi30k_transformer,
    "multi30k_transformer_en_de": lambda: _multi30k_transformer(
        "en", "de", vocab_size=_EN_DE_VOCAB, num_steps=1250, activation="gelu"),
    "multi30k_transformer_deep_shallow": _multi30k_transformer_deep_shallow,
    "multi30k_transformer_long": _multi30k_transformer_long,
    "multi30k_transformer_long_en_de": lambda: _multi30k_transformer_long(
        "en", "de", vocab_size=_EN_DE_VOCAB, num_steps=4850),
    "multi30k_rnn_attention": lambda: _multi30k_rnn(**_RNN_ATTENTION),
    "multi30k_rnn_attention_en_de": lambda: _multi30k_rnn(**_RNN_ATTENTION, source_lang="en",
                                                          target_lang="de"),
    "multi30k_gru": lambda: _multi30k_rnn(**_GRU),
    "multi30k_gru_en_de": lambda: _multi30k_rnn(**_GRU, source_lang="en", target_lang="de"),
    "multi30k_transformer_short": lambda: _short(_multi30k_transformer(), **_SHORT_TRANSFORMER),
    "multi30k_rnn_attention_short": lambda: _short(_multi30k_rnn(**_RNN_ATTENTION), **_SHORT_RNN),
    "multi30k_gru_short": lambda: _short(_multi30k_rnn(**_GRU), **_SHORT_RNN),
    "wmt14_transformer_base": lambda: _wmt14_transformer(big=False),
    "wmt14_transformer_big": lambda: _wmt14_transformer(big=True),
}


def get_preset(name: str) -> ExperimentConfig:
  """The named preset; an unknown name raises ``ValueError`` listing the known ones."""
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
  return PRESETS[name]()


def _parse_value(text: str, annotation: Any, where: str) -> Any:
  """Converts ``text`` to the field's declared type (int, float, bool, str, tuple[int, ...])."""
  if isinstance(annotation, str):  # postponed annotations: resolve the simple ones by name
    annotation = {"int": int, "float": float, "bool": bool, "str": str,
                  "tuple[int, ...]": tuple[int, ...]}.get(annotation, str)
  try:
    if annotation is bool:
      lowered = text.strip().lower()
      if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError("expected true or false")
      return lowered in ("true", "1", "yes")
    if annotation is int:
      return int(text)
    if annotation is float:
      return float(text)
    if typing.get_origin(annotation) is tuple:
      return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    if isinstance(annotation, types.UnionType):
      return text
    return annotation(text)
  except ValueError as error:
    raise ValueError(f"--set {where}={text!r}: {error}") from None


def apply_overrides(config: ExperimentConfig, overrides: Iterable[str]) -> ExperimentConfig:
  """Returns ``config`` with each ``section.field=value`` applied, validated as a whole.

  An unknown section or field raises ``ValueError`` listing the valid ones.
  """
  sections = {name: getattr(config, name) for name in _SECTIONS}
  changes: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
  for override in overrides:
    key, sep, text = override.partition("=")
    section, dot, field = key.strip().partition(".")
    if not sep or not dot:
      raise ValueError(f"--set {override!r}: expected section.field=value, e.g. "
                       "train.num_steps=400")
    if section not in sections:
      raise ValueError(f"--set {override!r}: unknown section {section!r}; valid sections: "
                       f"{', '.join(_SECTIONS)}")
    fields = {f.name: f for f in dataclasses.fields(sections[section])}
    if field not in fields:
      raise ValueError(f"--set {override!r}: unknown field {section}.{field} of "
                       f"{type(sections[section]).__name__}; valid fields: "
                       f"{', '.join(sorted(fields))}")
    changes[section][field] = _parse_value(text, fields[field].type, key)
  # One replace per section: checks that tie fields together (a cosine schedule's
  # warmup_steps < num_steps) see the final values, whatever order they were given in.
  sections = {name: dataclasses.replace(section, **changes[name]) if changes[name] else section
              for name, section in sections.items()}
  return ExperimentConfig(**sections)
