"""Small Hugging Face translation checkpoints built locally, for tests, benchmarks and notebooks.

Each builder trains sentencepiece vocabularies on Multi30k, builds the
transformers tokenizer from those files, trains a small random-initialised model
with torch for a few hundred steps and saves model, tokenizer and generation
config with ``save_pretrained``: a directory laid out like a published OPUS-MT,
M2M100, NLLB-200, mBART-50, T5 / mT5 or MADLAD-400 checkpoint (with the
sentencepiece model the published ones ship, which transformers 5's
``save_pretrained`` no longer writes for mBART-50 and T5). The ``build_random_*``
builders make checkpoints of published sizes with random weights, for speed
benchmarks. torch and transformers are imported inside the builders, so this
module imports without them.

Example (each call trains for minutes on a CPU, so this is not run as a doctest;
``tests/pretrained/conftest.py`` runs these builders)::

  build_marian("/tmp/marian-de-en", data_dir="../shared/data/multi30k/raw")
  build_m2m100("/tmp/m2m100-tiny", data_dir="../shared/data/multi30k/raw")
  build_mbart50("/tmp/mbart50-tiny", data_dir="../shared/data/multi30k/raw")
  build_t5("/tmp/madlad-tiny", data_dir="../shared/data/multi30k/raw", variant="madlad",
           directions=(("de", "en"), ("en", "de")))
  build_random_marian("/tmp/opus-mt-sized")  # 58,101 ids, 6 + 6 layers, random weights
  build_random_t5("/tmp/t5-small-sized")      # 32,128 ids, 6 + 6 layers, random weights
  build_random_mbart50("/tmp/mbart-sized")    # 250,054 ids, 12 + 12 layers, random weights
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import os
import pathlib
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm

# Sentences read per language from Multi30k's 29,000 training pairs (sentencepiece and training).
DEFAULT_MAX_PAIRS = 10_000
# Tokens per side kept for training; Multi30k sentences are far shorter.
_MAX_TRAIN_TOKENS = 64
# NLLB-200 codes of the languages the M2M100 builders take as ISO 639-1.
_NLLB_CODES = {"de": "deu_Latn", "en": "eng_Latn", "fr": "fra_Latn", "cs": "ces_Latn"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildInfo:
  """What a builder made; also written to ``build_info.json`` beside the checkpoint."""
  path: str  # the checkpoint directory
  kind: str  # "marian", "m2m_100" or "nllb"
  seconds: float  # wall time of the build, saving included (imports excluded when warm)
  steps: int  # optimizer steps taken
  final_loss: float  # mean training loss over the last 20 steps (nan for random weights)
  seed: int  # the seed everything was drawn from


# ---------------------------------------------------------------------------------------------
# Data and vocabularies


def _read_lines(data_dir: str | os.PathLike, split: str, lang: str, limit: int) -> list[str]:
  path = pathlib.Path(data_dir).expanduser() / f"{split}.{lang}"
  if not path.is_file():
    raise ValueError(f"{path} is missing: data_dir must hold Multi30k's raw text files "
                     "({train,val,test_2016_flickr}.{de,en,fr,cs}), e.g. "
                     "../shared/data/multi30k/raw")
  with path.open(encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f]
  return lines[:limit]


def _train_spm(lines: Sequence[str], *, vocab_size: int, model_type: str,
               exact_size: bool = True, **options: Any) -> bytes:
  """A sentencepiece model (default ids: <unk> 0, <s> 1, </s> 2), trained in memory.

  ``exact_size=False`` lets a corpus too small for ``vocab_size`` pieces give fewer;
  ``options`` are more of the trainer's (T5's ids, user-defined symbols).
  """
  model = io.BytesIO()
  # One thread over the whole input, unshuffled: the same lines give the same model.
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
      model_type=model_type, character_coverage=1.0, num_threads=1, input_sentence_size=0,
      shuffle_input_sentence=False, hard_vocab_limit=exact_size, minloglevel=2, **options)
  return model.getvalue()


def _pieces(model: bytes) -> list[str]:
  """The model's ordinary pieces, in id order (its <unk>, <s>, </s> left out)."""
  processor = spm.SentencePieceProcessor(model_proto=model)
  return [processor.id_to_piece(i) for i in range(processor.get_piece_size())
          if not (processor.is_unknown(i) or processor.is_control(i))]


def _marian_vocab(piece_lists: Sequence[Sequence[str]], extra: Sequence[str] = (),
                  fillers: int = 0) -> dict[str, int]:
  """OPUS-MT's layout: </s> 0, <unk> 1, the pieces, ``extra`` tokens, <pad> last."""
  vocab = {"</s>": 0, "<unk>": 1}
  for pieces in piece_lists:
    for piece in pieces:
      vocab.setdefault(piece, len(vocab))
  for token in extra:
    vocab.setdefault(token, len(vocab))
  for i in range(fillers):  # never produced by sentencepiece: ids that only a model can emit
    vocab.setdefault(f"\u2581filler{i}", len(vocab))
  vocab["<pad>"] = len(vocab)
  return vocab


def _fairseq_vocab(model: bytes) -> dict[str, int]:
  """fairseq's layout: <s> <pad> </s> <unk>, then the model's pieces shifted by one."""
  vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
  for piece in _pieces(model):
    vocab.setdefault(piece, len(vocab))
  return vocab


def _write_json(path: pathlib.Path, data: Any) -> None:
  path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Training


def _batch_plan(lengths: Sequence[int], *, steps: int, batch_size: int,
                seed: int) -> list[list[int]]:
  """The pair indices of every training batch, drawn up front (only those get tokenized).

  Pairs are drawn at random, then grouped by ``lengths`` (characters) within windows
  of 16 batches so that a batch holds pairs of similar length and pads little.
  """
  rng = np.random.default_rng(seed)
  size = min(batch_size, len(lengths))
  window = 16
  plan = []
  for start in range(0, steps, window):
    count = min(window, steps - start)
    drawn = np.concatenate([rng.choice(len(lengths), size=size, replace=False)
                            for _ in range(count)])
    drawn = drawn[np.argsort(np.asarray(lengths)[drawn], kind="stable")]
    batches = [drawn[i * size:(i + 1) * size].tolist() for i in range(count)]
    plan += [batches[i] for i in rng.permutation(count)]
  return plan


def _tokenize_used(plan: list[list[int]], encode: Callable[[list[int]], tuple[list, list]],
                   eos_id: int) -> dict[int, tuple[list[int], list[int]]]:
  """Source and target ids of each pair the plan uses, cut to ``_MAX_TRAIN_TOKENS``."""
  used = sorted({i for batch in plan for i in batch})
  if not used:
    return {}
  source_ids, target_ids = encode(used)
  return {i: (_truncate(source, eos_id), _truncate(target, eos_id))
          for i, source, target in zip(used, source_ids, target_ids)}


def _truncate(ids: list[int], eos_id: int) -> list[int]:
  return ids if len(ids) <= _MAX_TRAIN_TOKENS else ids[:_MAX_TRAIN_TOKENS - 1] + [eos_id]


def _padded(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> dict:
  """``input_ids``, ``attention_mask`` and ``labels`` (-100 where padded) of a batch."""
  import torch  # noqa: PLC0415

  source_len = max(len(source) for source, _ in pairs)
  target_len = max(len(target) for _, target in pairs)
  inputs = torch.full((len(pairs), source_len), pad_id, dtype=torch.long)
  labels = torch.full((len(pairs), target_len), -100, dtype=torch.long)
  for row, (source, target) in enumerate(pairs):
    inputs[row, :len(source)] = torch.tensor(source)
    labels[row, :len(target)] = torch.tensor(target)
  return {"input_ids": inputs, "attention_mask": (inputs != pad_id).long(), "labels": labels}


def _train(model, plan: list[list[int]], ids: dict[int, tuple[list[int], list[int]]], *,
           pad_id: int, learning_rate: float) -> float:
  """AdamW, linear warm-up over the first tenth then linear decay to zero; returns the mean
  loss of the last 20 steps."""
  import torch  # noqa: PLC0415

  optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
  steps = len(plan)
  warmup = max(1, steps // 10)
  schedule = torch.optim.lr_scheduler.LambdaLR(
      optimizer, lambda step: min((step + 1) / warmup, (steps - step) / max(1, steps - warmup)))
  # One thread: these models are too small to gain from more, and test workers build side by side.
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  model.train()
  losses = []
  try:
    for batch in plan:
      loss = model(**_padded([ids[i] for i in batch], pad_id)).loss
      optimizer.zero_grad(set_to_none=True)
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      optimizer.step()
      schedule.step()
      losses.append(loss.item())
  finally:
    torch.set_num_threads(threads)
    model.eval()
  tail = losses[-20:]
  return float(sum(tail) / len(tail)) if tail else float("nan")


def _output_dir(out_dir: str | os.PathLike) -> pathlib.Path:
  out = pathlib.Path(out_dir).expanduser()
  out.mkdir(parents=True, exist_ok=True)
  return out


def _save(model, tokenizer, generation_config, out: pathlib.Path, *, kind: str, started: float,
          steps: int, loss: float, seed: int) -> BuildInfo:
  """Writes the checkpoint, then ``build_info.json`` (last: its presence marks a whole build)."""
  model.generation_config = generation_config
  model.save_pretrained(out)
  tokenizer.save_pretrained(out)
  info = BuildInfo(path=str(out), kind=kind, seconds=time.perf_counter() - started, steps=steps,
                   final_loss=loss, seed=seed)
  _write_json(out / "build_info.json", dataclasses.asdict(info))
  return info


# ---------------------------------------------------------------------------------------------
# Marian


def _marian_tokenizer(workdir: pathlib.Path, source_model: bytes, target_model: bytes, *,
                      separate_vocabs: bool, language_codes: Sequence[str], fillers: int,
                      source_lang: str, target_lang: str):
  """transformers' MarianTokenizer over freshly written source.spm, target.spm and vocabularies."""
  from transformers import MarianTokenizer  # noqa: PLC0415

  (workdir / "source.spm").write_bytes(source_model)
  (workdir / "target.spm").write_bytes(target_model)
  codes = [f">>{code}<<" for code in language_codes]
  kwargs = {}
  if separate_vocabs:
    if codes:
      raise ValueError("language_codes needs the shared vocabulary: OPUS-MT keeps >>xx<< codes "
                       "in vocab.json; set separate_vocabs=False")
    _write_json(workdir / "vocab.json", _marian_vocab([_pieces(source_model)], fillers=fillers))
    _write_json(workdir / "target_vocab.json",
                _marian_vocab([_pieces(target_model)], fillers=fillers))
    kwargs = {"target_vocab_file": str(workdir / "target_vocab.json"), "separate_vocabs": True}
  else:
    _write_json(workdir / "vocab.json",
                _marian_vocab([_pieces(source_model), _pieces(target_model)], codes, fillers))
  return MarianTokenizer(source_spm=str(workdir / "source.spm"),
                         target_spm=str(workdir / "target.spm"), vocab=str(workdir / "vocab.json"),
                         source_lang=source_lang, target_lang=target_lang, **kwargs)


def _marian_model(tokenizer, *, separate_vocabs: bool, model_dim: int, layers: int, heads: int,
                  ffn: int, max_positions: int, decoder_layers: int | None = None,
                  decoder_heads: int | None = None, decoder_ffn: int | None = None,
                  dropout: float = 0.1):
  from transformers import MarianConfig, MarianMTModel  # noqa: PLC0415

  pad_id = tokenizer.pad_token_id
  source_size = len(tokenizer.encoder)
  target_size = len(tokenizer.target_encoder) if separate_vocabs else source_size
  if pad_id != source_size - 1 or pad_id != target_size - 1:
    raise AssertionError(f"<pad> must be the last id of both vocabularies, got {pad_id} of "
                         f"{source_size} and {target_size}")
  # As OPUS-MT's converted configs: swish, scaled embeddings, sinusoidal positions,
  # <pad> (the last id) starts decoding, </s> is id 0.
  config = MarianConfig(
      vocab_size=source_size, decoder_vocab_size=target_size,
      share_encoder_decoder_embeddings=not separate_vocabs, d_model=model_dim,
      encoder_layers=layers, decoder_layers=decoder_layers or layers,
      encoder_attention_heads=heads, decoder_attention_heads=decoder_heads or heads,
      encoder_ffn_dim=ffn, decoder_ffn_dim=decoder_ffn or ffn,
      max_position_embeddings=max_positions, activation_function="swish", scale_embedding=True,
      dropout=dropout, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=pad_id,
      decoder_start_token_id=pad_id, eos_token_id=0, bos_token_id=0, forced_eos_token_id=0)
  return MarianMTModel(config)


def _marian_generation_config(pad_id: int, max_length: int):
  from transformers import GenerationConfig  # noqa: PLC0415

  return GenerationConfig(bad_words_ids=[[pad_id]], bos_token_id=0, decoder_start_token_id=pad_id,
                          eos_token_id=0, forced_eos_token_id=0, max_length=max_length,
                          num_beams=4, pad_token_id=pad_id, renormalize_logits=True)


def build_marian(out_dir: str | os.PathLike, *, data_dir: str | os.PathLike, steps: int = 400,
                 model_dim: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128,
                 vocab_size: int = 1000, separate_vocabs: bool = False,
                 language_codes: Sequence[str] = (), source_lang: str = "de",
                 target_lang: str = "en", batch_size: int = 32, learning_rate: float = 5e-3,
                 max_length: int = 128, seed: int = 0,
                 max_pairs: int = DEFAULT_MAX_PAIRS, decoder_layers: int | None = None,
                 decoder_heads: int | None = None, decoder_ffn: int | None = None,
                 dropout: float = 0.1) -> BuildInfo:
  """An OPUS-MT-style MarianMTModel checkpoint trained briefly on Multi30k.

  Args:
    out_dir: where ``save_pretrained`` writes (created).
    data_dir: Multi30k raw text (``train.de``, ``train.en`` ...).
    steps: AdamW steps on random batches of ``batch_size`` pairs (0: random weights).
    model_dim, layers, heads, ffn: width, encoder and decoder depth, heads, FFN width.
    decoder_layers, decoder_heads, decoder_ffn: the decoder's own, when they differ
      from the encoder's (None: the same).
    dropout: the config's ``dropout`` while training (saved in config.json).
    vocab_size: pieces of each sentencepiece model (source and target). The shared
      vocabulary is their union (about 1.8x), each separate one exactly this size.
    separate_vocabs: write ``vocab.json`` and ``target_vocab.json`` and untie the
      encoder and decoder embeddings, as transformers' ``separate_vocabs`` models do.
    language_codes: ``>>xx<<`` tokens added to the shared vocabulary (untrained).
    source_lang, target_lang: the Multi30k languages to translate between.
    max_length: the generation config's ``max_length``.
    seed: seeds the initialisation and the batches (sentencepiece is deterministic).
    max_pairs: training pairs read from the start of the split.

  Returns:
    ``BuildInfo`` (also in ``out_dir/build_info.json``).
  """
  import torch  # noqa: PLC0415

  started = time.perf_counter()
  out = _output_dir(out_dir)
  sources = _read_lines(data_dir, "train", source_lang, max_pairs)
  targets = _read_lines(data_dir, "train", target_lang, max_pairs)
  source_model = _train_spm(sources, vocab_size=vocab_size, model_type="unigram")
  target_model = _train_spm(targets, vocab_size=vocab_size, model_type="unigram")
  with tempfile.TemporaryDirectory() as workdir:
    tokenizer = _marian_tokenizer(pathlib.Path(workdir), source_model, target_model,
                                  separate_vocabs=separate_vocabs, language_codes=language_codes,
                                  fillers=0, source_lang=source_lang, target_lang=target_lang)
  plan = _batch_plan([len(source) + len(target) for source, target in zip(sources, targets)],
                     steps=steps, batch_size=batch_size, seed=seed)

  def encode(used: list[int]) -> tuple[list, list]:
    return (tokenizer([sources[i] for i in used])["input_ids"],
            tokenizer(text_target=[targets[i] for i in used])["input_ids"])

  ids = _tokenize_used(plan, encode, tokenizer.eos_token_id)
  torch.manual_seed(seed)
  model = _marian_model(tokenizer, separate_vocabs=separate_vocabs, model_dim=model_dim,
                        layers=layers, heads=heads, ffn=ffn, max_positions=512,
                        decoder_layers=decoder_layers, decoder_heads=decoder_heads,
                        decoder_ffn=decoder_ffn, dropout=dropout)
  loss = _train(model, plan, ids, pad_id=tokenizer.pad_token_id, learning_rate=learning_rate)
  return _save(model, tokenizer, _marian_generation_config(tokenizer.pad_token_id, max_length),
               out, kind="marian", started=started, steps=steps, loss=loss, seed=seed)


def build_random_marian(out_dir: str | os.PathLike, *, vocab_size: int = 58101,
                        model_dim: int = 512, layers: int = 6, heads: int = 8, ffn: int = 2048,
                        data_dir: str | os.PathLike | None = None, spm_vocab_size: int = 8000,
                        max_length: int = 512, seed: int = 0) -> BuildInfo:
  """An OPUS-MT-sized MarianMTModel with random weights, for speed benchmarks.

  The tokenizer is real (sentencepiece models trained on Multi30k when
  ``data_dir`` is given, else on generated sentences) and ``vocab.json``
  has exactly ``vocab_size`` entries: the pieces, then filler tokens up to that
  size, ``<pad>`` last. Outputs are not meaningful.

  Args:
    out_dir: where ``save_pretrained`` writes (created).
    vocab_size: entries of vocab.json and rows of the (shared) embedding.
    model_dim, layers, heads, ffn: the architecture (defaults: opus-mt-de-en's).
    data_dir: Multi30k raw text (all 29,000 training sentences), or None for a
      synthetic corpus of random syllables.
    spm_vocab_size: at most this many pieces per sentencepiece model.
    max_length: the generation config's ``max_length`` (OPUS-MT: 512).
    seed: seeds the initialisation (and the synthetic corpus).
  """
  import torch  # noqa: PLC0415

  started = time.perf_counter()
  out = _output_dir(out_dir)
  if data_dir is not None:
    sources = _read_lines(data_dir, "train", "de", 29_000)
    targets = _read_lines(data_dir, "train", "en", 29_000)
  else:
    sources = targets = _synthetic_sentences(seed)
  # At most spm_vocab_size pieces: Multi30k's English fills only about 7,000.
  source_model = _train_spm(sources, vocab_size=spm_vocab_size, model_type="unigram",
                            exact_size=False)
  target_model = _train_spm(targets, vocab_size=spm_vocab_size, model_type="unigram",
                            exact_size=False)
  shared = len(_marian_vocab([_pieces(source_model), _pieces(target_model)]))
  if vocab_size < shared:
    raise ValueError(f"vocab_size={vocab_size} is below the {shared} pieces of the two "
                     f"sentencepiece models; raise it or lower spm_vocab_size={spm_vocab_size}")
  with tempfile.TemporaryDirectory() as workdir:
    tokenizer = _marian_tokenizer(pathlib.Path(workdir), source_model, target_model,
                                  separate_vocabs=False, language_codes=(),
                                  fillers=vocab_size - shared, source_lang="de", target_lang="en")
  torch.manual_seed(seed)
  model = _marian_model(tokenizer, separate_vocabs=False, model_dim=model_dim, layers=layers,
                        heads=heads, ffn=ffn, max_positions=512).eval()
  return _save(model, tokenizer, _marian_generation_config(tokenizer.pad_token_id, max_length),
               out, kind="marian", started=started, steps=0, loss=float("nan"), seed=seed)


def _synthetic_sentences(seed: int, count: int = 20_000) -> list[str]:
  """Sentences of random syllables, enough for sentencepiece to fill a few thousand pieces."""
  rng = np.random.default_rng(seed)
  syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"]
  words = ["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(3000)]
  return [" ".join(rng.choice(words, size=rng.integers(3, 15))).capitalize() + "."
          for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# Multilingual corpora: the pairs of several directions, tokenized as their families lay them out


def _read_corpus(data_dir, languages: Sequence[str], directions: Sequence[tuple[str, str]],
                 max_pairs: int) -> dict[str, list[str]]:
  for source, target in directions:
    if source not in languages or target not in languages:
      raise ValueError(f"direction {source}->{target} uses a language outside "
                       f"languages={tuple(languages)}")
  return {lang: _read_lines(data_dir, "train", lang, max_pairs) for lang in languages}


def _direction_pairs(corpus: dict[str, list[str]], directions: Sequence[tuple[str, str]], *,
                     steps: int, batch_size: int, seed: int):
  """Every (source lang, target lang, line) pair of ``directions``, and the batch plan."""
  pairs = [(source, target, i) for source, target in directions
           for i in range(min(len(corpus[source]), len(corpus[target])))]
  lengths = [len(corpus[source][i]) + len(corpus[target][i]) for source, target, i in pairs]
  return pairs, _batch_plan(lengths, steps=steps, batch_size=batch_size, seed=seed)


def _coded_ids(tokenizer, corpus: dict[str, list[str]], directions: Sequence[tuple[str, str]],
               *, steps: int, batch_size: int, seed: int, code: Callable[[str], str]):
  """The batch plan and the ids of the pairs it trains on, each direction tokenized as
  transformers lays it out for a tokenizer that marks languages (``src_lang`` and
  ``tgt_lang``: ``[code] pieces </s>`` on both sides); the tokenizer is left set to the
  first direction, which it saves as its defaults."""
  pairs, plan = _direction_pairs(corpus, directions, steps=steps, batch_size=batch_size,
                                 seed=seed)

  def encode(used: list[int]) -> tuple[list, list]:
    source_ids, target_ids = {}, {}
    for source, target in directions:
      chosen = [k for k in used if pairs[k][:2] == (source, target)]
      tokenizer.src_lang, tokenizer.tgt_lang = code(source), code(target)
      lines = [pairs[k][2] for k in chosen]
      source_ids.update(zip(chosen, tokenizer([corpus[source][i] for i in lines])["input_ids"]))
      target_ids.update(zip(chosen, tokenizer(
          text_target=[corpus[target][i] for i in lines])["input_ids"]))
    return [source_ids[k] for k in used], [target_ids[k] for k in used]

  ids = _tokenize_used(plan, encode, tokenizer.eos_token_id)
  tokenizer.src_lang, tokenizer.tgt_lang = code(directions[0][0]), code(directions[0][1])
  return plan, ids


# ---------------------------------------------------------------------------------------------
# M2M100 and NLLB-200


def _m2m100_tokenizer(workdir: pathlib.Path, model: bytes):
  """transformers' M2M100Tokenizer with fairseq's vocabulary layout and, as the published
  checkpoints list them, the language tokens as special tokens."""
  from transformers import M2M100Tokenizer  # noqa: PLC0415
  from transformers.models.m2m_100 import tokenization_m2m_100  # noqa: PLC0415

  (workdir / "sentencepiece.bpe.model").write_bytes(model)
  _write_json(workdir / "vocab.json", _fairseq_vocab(model))
  codes = tokenization_m2m_100.FAIRSEQ_LANGUAGE_CODES["m2m100"]
  language_tokens = [f"__{code}__" for code in codes]
  return M2M100Tokenizer(vocab_file=str(workdir / "vocab.json"),
                         spm_file=str(workdir / "sentencepiece.bpe.model"),
                         additional_special_tokens=language_tokens)


def _nllb_tokenizer(workdir: pathlib.Path, model: bytes):
  """transformers' NllbTokenizer (a tokenizers-library BPE) made from the sentencepiece model."""
  from tokenizers.models import BPE  # noqa: PLC0415
  from transformers import NllbTokenizer  # noqa: PLC0415
  from transformers.convert_slow_tokenizer import SentencePieceExtractor  # noqa: PLC0415

  path = workdir / "sentencepiece.bpe.model"
  path.write_bytes(model)
  extracted = SentencePieceExtractor(str(path)).extract(BPE)
  # Left out, the extractor's own special-token list would replace the 202 language codes.
  return NllbTokenizer(vocab=_fairseq_vocab(model), merges=extracted["merges"],
                       _spm_precompiled_charsmap=extracted["_spm_precompiled_charsmap"])


def _build_m2m100_family(out_dir, *, kind: str, data_dir, languages: Sequence[str],
                         directions: Sequence[tuple[str, str]], steps: int, model_dim: int,
                         layers: int, heads: int, ffn: int, vocab_size: int, batch_size: int,
                         learning_rate: float, dropout: float, max_length: int, seed: int,
                         max_pairs: int) -> BuildInfo:
  import torch  # noqa: PLC0415
  from transformers import (GenerationConfig, M2M100Config,  # noqa: PLC0415
                            M2M100ForConditionalGeneration)

  unknown = [lang for lang in languages if kind == "nllb" and lang not in _NLLB_CODES]
  if unknown:
    raise ValueError(f"languages {unknown} have no NLLB code here; use some of "
                     f"{sorted(_NLLB_CODES)}")
  started = time.perf_counter()
  out = _output_dir(out_dir)
  corpus = _read_corpus(data_dir, languages, directions, max_pairs)
  model_proto = _train_spm([line for lines in corpus.values() for line in lines],
                           vocab_size=vocab_size, model_type="bpe")
  with tempfile.TemporaryDirectory() as workdir:
    if kind == "nllb":
      tokenizer = _nllb_tokenizer(pathlib.Path(workdir), model_proto)
      code = _NLLB_CODES.__getitem__
    else:
      tokenizer = _m2m100_tokenizer(pathlib.Path(workdir), model_proto)
      code = str
  plan, ids = _coded_ids(tokenizer, corpus, directions, steps=steps, batch_size=batch_size,
                         seed=seed, code=code)
  eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
  # M2M100's embedding: vocab.json, 100 language codes, 8 made-up words (128,112 in
  # the release). NLLB's: every id of its tokenizer.
  embedding_size = len(tokenizer) + (8 if kind == "m2m_100" else 0)
  torch.manual_seed(seed)
  config = M2M100Config(
      vocab_size=embedding_size, d_model=model_dim, encoder_layers=layers, decoder_layers=layers,
      encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
      decoder_ffn_dim=ffn, max_position_embeddings=1024, activation_function="relu",
      scale_embedding=True, dropout=dropout, attention_dropout=dropout, activation_dropout=0.0,
      encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=pad_id, bos_token_id=0,
      eos_token_id=eos_id, decoder_start_token_id=eos_id)
  model = M2M100ForConditionalGeneration(config)
  loss = _train(model, plan, ids, pad_id=pad_id, learning_rate=learning_rate)
  generation_config = GenerationConfig(bos_token_id=0, decoder_start_token_id=eos_id,
                                       eos_token_id=eos_id, pad_token_id=pad_id,
                                       max_length=max_length)
  return _save(model, tokenizer, generation_config, out, kind=kind, started=started, steps=steps,
               loss=loss, seed=seed)


def build_m2m100(out_dir: str | os.PathLike, *, data_dir: str | os.PathLike,
                 languages: Sequence[str] = ("de", "en", "fr"),
                 directions: Sequence[tuple[str, str]] = (("de", "en"),), steps: int = 400,
                 model_dim: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128,
                 vocab_size: int = 2000, batch_size: int = 32, learning_rate: float = 5e-3,
                 dropout: float = 0.1, max_length: int = 200, seed: int = 0,
                 max_pairs: int = DEFAULT_MAX_PAIRS) -> BuildInfo:
  """An M2M100ForConditionalGeneration checkpoint with M2M100's tokenizer, trained briefly.

  One BPE sentencepiece model over the Multi30k text of ``languages``; fairseq's
  vocabulary layout (``<s> <pad> </s> <unk>`` then the pieces); the 100 language
  tokens as special tokens after it. Training pairs are laid out as transformers
  lays them (``[__src__] pieces </s>`` -> ``[__tgt__] pieces </s>``), so generation
  with ``forced_bos_token_id`` = the target code reproduces them.

  Args:
    out_dir: where ``save_pretrained`` writes (created).
    data_dir: Multi30k raw text.
    languages: languages whose text trains the sentencepiece model.
    directions: (source, target) pairs to train on.
    steps, batch_size, learning_rate: AdamW training.
    model_dim, layers, heads, ffn: the architecture.
    dropout: the config's ``dropout`` and ``attention_dropout`` while training (saved in
      config.json).
    vocab_size: pieces of the sentencepiece model.
    max_length: the generation config's ``max_length`` (M2M100: 200).
    seed: seeds the initialisation and the batches (sentencepiece is deterministic).
    max_pairs: sentences read per language.
  """
  return _build_m2m100_family(kind="m2m_100", **locals())  # every argument, by name


def build_nllb(out_dir: str | os.PathLike, *, data_dir: str | os.PathLike,
               **options: Any) -> BuildInfo:
  """As ``build_m2m100`` (its arguments and defaults), with NLLB-200's tokenizer
  (``tokenizer.json``, codes like ``eng_Latn``): the layout of the NLLB-200
  checkpoints, also M2M100 models."""
  arguments = inspect.signature(build_m2m100).bind(out_dir, data_dir=data_dir, **options)
  arguments.apply_defaults()
  return _build_m2m100_family(kind="nllb", **arguments.arguments)


# ---------------------------------------------------------------------------------------------
# mBART-50 and the T5 family


# Fields the published mBART-50 config.json files carry from fairseq (transformers 5 ignores
# them; CTranslate2's converter reads normalize_before).
_MBART_LEGACY_FIELDS = {"normalize_before": True, "add_final_layer_norm": True,
                        "normalize_embedding": True}
# mBART-50 codes of the languages the builders take as ISO 639-1.
_MBART50_CODES = {"de": "de_DE", "en": "en_XX", "fr": "fr_XX", "cs": "cs_CZ"}


def _mbart50_tokenizer(model_proto: bytes, *, src_lang: str, tgt_lang: str):
  from transformers import MBart50Tokenizer  # noqa: PLC0415

  with tempfile.TemporaryDirectory() as workdir:
    (pathlib.Path(workdir) / "sentencepiece.bpe.model").write_bytes(model_proto)
    # bos_token as the published tokenizer_config.json has it (CTranslate2 reads it).
    return MBart50Tokenizer.from_pretrained(workdir, bos_token="<s>", src_lang=src_lang,
                                            tgt_lang=tgt_lang)


def _mbart50_model(tokenizer, *, model_dim: int, layers: int, heads: int, ffn: int,
                   max_positions: int, dropout: float):
  """mBART-large-50's layout (pre-LN, GELU, scaled embeddings, learned positions,
  ``layernorm_embedding``) at the given size, random weights."""
  from transformers import MBartConfig, MBartForConditionalGeneration  # noqa: PLC0415

  eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
  config = MBartConfig(
      vocab_size=len(tokenizer), d_model=model_dim, encoder_layers=layers, decoder_layers=layers,
      encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
      decoder_ffn_dim=ffn, max_position_embeddings=max_positions, activation_function="gelu",
      scale_embedding=True, dropout=dropout, attention_dropout=0.0, activation_dropout=0.0,
      pad_token_id=pad_id, bos_token_id=0, eos_token_id=eos_id,
      decoder_start_token_id=eos_id, forced_eos_token_id=eos_id,
      tokenizer_class="MBart50Tokenizer", **_MBART_LEGACY_FIELDS)
  return MBartForConditionalGeneration(config)


def _save_mbart50(model, tokenizer, model_proto: bytes, out: pathlib.Path, *, max_length: int,
                  **info: Any) -> BuildInfo:
  """Saves an mBART-50 checkpoint with the sentencepiece model the published ones ship."""
  from transformers import GenerationConfig  # noqa: PLC0415

  eos_id = tokenizer.eos_token_id
  generation_config = GenerationConfig(bos_token_id=0, decoder_start_token_id=eos_id,
                                       eos_token_id=eos_id, forced_eos_token_id=eos_id,
                                       pad_token_id=tokenizer.pad_token_id, max_length=max_length)
  result = _save(model, tokenizer, generation_config, out, kind="mbart", **info)
  (out / "sentencepiece.bpe.model").write_bytes(model_proto)
  return result


def build_mbart50(out_dir: str | os.PathLike, *, data_dir: str | os.PathLike,
                  languages: Sequence[str] = ("de", "en", "fr"),
                  directions: Sequence[tuple[str, str]] = (("de", "en"),), steps: int = 400,
                  model_dim: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128,
                  vocab_size: int = 2000, batch_size: int = 32, learning_rate: float = 5e-3,
                  dropout: float = 0.1, max_length: int = 200, max_positions: int = 256,
                  seed: int = 0, max_pairs: int = DEFAULT_MAX_PAIRS) -> BuildInfo:
  """An mBART-50-layout ``MBartForConditionalGeneration`` with its tokenizer, trained briefly.

  One unigram sentencepiece model over the Multi30k text of ``languages``, written
  as ``sentencepiece.bpe.model`` beside the checkpoint (as the published mBART-50
  models ship it); transformers' ``MBart50Tokenizer`` in fairseq's layout with the
  52 language codes; pairs laid out as transformers lays them (``[de_DE] pieces
  </s>`` -> ``[en_XX] pieces </s>``), decoding from EOS with the target code forced.
  The model: pre-LN, GELU, scaled embeddings, learned positions (offset 2),
  ``layernorm_embedding`` and final norms, as mBART-large-50 has them.

  Args as ``build_m2m100``; ``max_positions``: rows of the learned position table;
  ``dropout``: the config's ``dropout`` while training.
  """
  import torch  # noqa: PLC0415

  started = time.perf_counter()
  out = _output_dir(out_dir)
  unknown = [lang for lang in languages if lang not in _MBART50_CODES]
  if unknown:
    raise ValueError(f"languages {unknown} have no mBART-50 code here; use some of "
                     f"{sorted(_MBART50_CODES)}")
  code = _MBART50_CODES.__getitem__
  corpus = _read_corpus(data_dir, languages, directions, max_pairs)
  model_proto = _train_spm([line for lines in corpus.values() for line in lines],
                           vocab_size=vocab_size, model_type="unigram")
  tokenizer = _mbart50_tokenizer(model_proto, src_lang=code(directions[0][0]),
                                 tgt_lang=code(directions[0][1]))
  plan, ids = _coded_ids(tokenizer, corpus, directions, steps=steps, batch_size=batch_size,
                         seed=seed, code=code)
  torch.manual_seed(seed)
  model = _mbart50_model(tokenizer, model_dim=model_dim, layers=layers, heads=heads, ffn=ffn,
                         max_positions=max_positions, dropout=dropout)
  with torch.no_grad():  # learned positions, started from the sinusoids M2M100 keeps fixed
    from seq2seq_jax.layers.embeddings import position_table  # noqa: PLC0415
    table = torch.from_numpy(position_table("sinusoidal_marian", max_positions + 2, model_dim))
    for embed in (model.model.encoder.embed_positions, model.model.decoder.embed_positions):
      embed.weight.copy_(table)
  loss = _train(model, plan, ids, pad_id=tokenizer.pad_token_id, learning_rate=learning_rate)
  return _save_mbart50(model, tokenizer, model_proto, out, max_length=max_length,
                       started=started, steps=steps, loss=loss, seed=seed)


# variant -> (transformers model class, feed_forward_proj, separate lm_head, <2xx> codes)
T5_VARIANTS = {
    "t5": ("T5ForConditionalGeneration", "relu", False, False),
    "t5_v1_1": ("T5ForConditionalGeneration", "gated-gelu", True, False),
    "mt5": ("MT5ForConditionalGeneration", "gated-gelu", True, False),
    "madlad": ("T5ForConditionalGeneration", "gated-gelu", True, True),
}
# T5's sentencepiece ids: no BOS.
_T5_IDS = {"pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": -1}


def _t5_tokenizer(model_proto: bytes, extra_ids: int):
  from transformers import T5Tokenizer  # noqa: PLC0415

  with tempfile.TemporaryDirectory() as workdir:
    (pathlib.Path(workdir) / "spiece.model").write_bytes(model_proto)
    return T5Tokenizer.from_pretrained(workdir, extra_ids=extra_ids)


def _t5_model(variant: str, *, rows: int, model_dim: int, head_dim: int, ffn: int, layers: int,
              heads: int, decoder_layers: int | None = None, **config: Any):
  """A random T5-family model of ``variant``'s layout with ``rows`` embedding rows;
  ``config`` adds to (or overrides) the T5Config / MT5Config fields."""
  import torch  # noqa: PLC0415
  import transformers  # noqa: PLC0415

  model_class, feed_forward, separate_head, _ = T5_VARIANTS[variant]
  config_class = transformers.MT5Config if variant == "mt5" else transformers.T5Config
  model = getattr(transformers, model_class)(config_class(
      vocab_size=rows, d_model=model_dim, d_kv=head_dim, d_ff=ffn, num_layers=layers,
      num_decoder_layers=decoder_layers or layers, num_heads=heads,
      feed_forward_proj=feed_forward, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
      tie_word_embeddings=not separate_head, **config))
  if separate_head:  # transformers 5 ties at construction; v1.1, mT5 and MADLAD do not
    # Drawn at d_model ** -0.5 rather than transformers' 1.0: unscaled logits of unit
    # vectors would start sqrt(d_model) wide and a short training would not recover.
    model.lm_head.weight = torch.nn.Parameter(torch.randn(rows, model_dim) * model_dim ** -0.5)
  return model


def _save_t5(model, tokenizer, model_proto: bytes, out: pathlib.Path, *, max_length: int,
             **info: Any) -> BuildInfo:
  """Saves a T5-family checkpoint with the ``spiece.model`` the published ones ship."""
  from transformers import GenerationConfig  # noqa: PLC0415

  generation_config = GenerationConfig(decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
                                       max_length=max_length)
  result = _save(model, tokenizer, generation_config, out, **info)
  (out / "spiece.model").write_bytes(model_proto)
  return result


def build_t5(out_dir: str | os.PathLike, *, data_dir: str | os.PathLike, variant: str = "t5",
             languages: Sequence[str] = ("de", "en"),
             directions: Sequence[tuple[str, str]] = (("de", "en"),), steps: int = 400,
             model_dim: int = 64, layers: int = 2, decoder_layers: int | None = None,
             heads: int = 4, head_dim: int = 12, ffn: int = 128, vocab_size: int = 1000,
             extra_ids: int | None = None, batch_size: int = 32, learning_rate: float = 5e-3,
             dropout: float = 0.1, max_length: int = 128, seed: int = 0,
             max_pairs: int = DEFAULT_MAX_PAIRS) -> BuildInfo:
  """A T5-family checkpoint (``T5ForConditionalGeneration`` / ``MT5...``) trained briefly.

  Variants (``T5_VARIANTS``): ``"t5"`` (ReLU, tied output with the ``d_model ** -0.5``
  rescale), ``"t5_v1_1"`` and ``"mt5"`` (gated-GELU, a separate ``lm_head``, no
  rescale), ``"madlad"`` (v1.1's layout, several directions, and MADLAD-400's
  ``<2xx>`` target-language pieces, user-defined in the sentencepiece model, in
  front of each source). One unigram sentencepiece model in T5's id layout (pad 0,
  eos 1, unk 2), written as ``spiece.model`` beside the checkpoint (as the published
  models ship it), ``extra_ids`` sentinels after it (default 100; MADLAD: none) and,
  for ``"t5"``, an embedding padded to a multiple of 128 rows as t5-small's.

  ``out_dir``, ``data_dir``, ``languages``, ``directions``, ``steps``, ``batch_size``,
  ``learning_rate``, ``max_length``, ``seed`` and ``max_pairs`` are as ``build_m2m100``'s.

  Args:
    variant: a key of ``T5_VARIANTS``.
    model_dim: ``d_model``.
    layers: ``num_layers``.
    decoder_layers: ``num_decoder_layers`` (None: the same as ``layers``).
    heads: ``num_heads``.
    head_dim: ``d_kv`` (heads x head_dim need not be model_dim).
    ffn: ``d_ff``.
    vocab_size: pieces of the sentencepiece model.
    dropout: ``dropout_rate`` while training (saved in config.json).
  """
  import torch  # noqa: PLC0415

  if variant not in T5_VARIANTS:
    raise ValueError(f"variant={variant!r}: must be one of {', '.join(T5_VARIANTS)}")
  marked = T5_VARIANTS[variant][3]
  started = time.perf_counter()
  out = _output_dir(out_dir)
  corpus = _read_corpus(data_dir, languages, directions, max_pairs)
  model_proto = _train_spm([line for lines in corpus.values() for line in lines],
                           vocab_size=vocab_size, model_type="unigram", **_T5_IDS,
                           user_defined_symbols=[f"<2{lang}>" for lang in languages] if marked
                           else [])
  tokenizer = _t5_tokenizer(model_proto, (0 if marked else 100) if extra_ids is None
                            else extra_ids)
  pairs, plan = _direction_pairs(corpus, directions, steps=steps, batch_size=batch_size,
                                 seed=seed)

  def encode(used: list[int]) -> tuple[list, list]:
    sources = [("<2%s> " % pairs[k][1] if marked else "") + corpus[pairs[k][0]][pairs[k][2]]
               for k in used]
    targets = [corpus[pairs[k][1]][pairs[k][2]] for k in used]
    return tokenizer(sources)["input_ids"], tokenizer(text_target=targets)["input_ids"]

  ids = _tokenize_used(plan, encode, tokenizer.eos_token_id)
  rows = len(tokenizer)
  if variant == "t5":  # t5-small: 32,100 ids, an embedding of 32,128 rows
    rows = -(-rows // 128) * 128
  torch.manual_seed(seed)
  model = _t5_model(variant, rows=rows, model_dim=model_dim, head_dim=head_dim, ffn=ffn,
                    layers=layers, decoder_layers=decoder_layers, heads=heads,
                    dropout_rate=dropout, initializer_factor=1.0)
  loss = _train(model, plan, ids, pad_id=0, learning_rate=learning_rate)
  return _save_t5(model, tokenizer, model_proto, out, max_length=max_length, kind=variant,
                  started=started, steps=steps, loss=loss, seed=seed)


def _padded_spm(model: bytes, pieces: int) -> bytes:
  """The sentencepiece model with filler pieces (``▁fillerN``, scored below every real
  piece, so text never segments into them) appended up to ``pieces``: a published
  model's vocabulary size without training one that large."""
  from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415

  proto = sentencepiece_model_pb2.ModelProto.FromString(model)
  if pieces < len(proto.pieces):
    raise ValueError(f"{pieces} pieces requested, but the trained model already has "
                     f"{len(proto.pieces)}; lower spm_vocab_size")
  lowest = min(piece.score for piece in proto.pieces)
  for i in range(pieces - len(proto.pieces)):
    piece = proto.pieces.add()
    piece.piece, piece.score = f"\u2581filler{i}", lowest - 1.0 - i * 1e-4
    piece.type = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
  return proto.SerializeToString()


def _benchmark_corpus(data_dir: str | os.PathLike | None, seed: int) -> list[str]:
  if data_dir is None:
    return _synthetic_sentences(seed)
  return (_read_lines(data_dir, "train", "de", 29_000) + _read_lines(data_dir, "train", "en",
                                                                     29_000))


def build_random_t5(out_dir: str | os.PathLike, *, vocab_size: int = 32128, model_dim: int = 512,
                    layers: int = 6, heads: int = 8, head_dim: int = 64, ffn: int = 2048,
                    variant: str = "t5", spm_pieces: int = 32000, spm_vocab_size: int = 8000,
                    extra_ids: int = 100, data_dir: str | os.PathLike | None = None,
                    max_length: int = 512, seed: int = 0) -> BuildInfo:
  """A T5-family checkpoint of a published size with random weights, for speed benchmarks.

  The defaults are t5-small's (6 + 6 layers, d 512, 8 heads of 64, FFN 2048, ReLU,
  tied output, 32,000 pieces + 100 sentinels in an embedding of 32,128 rows). The
  sentencepiece model is trained (at most ``spm_vocab_size`` pieces, on Multi30k
  when ``data_dir`` is given, else on generated sentences) and padded with filler
  pieces to ``spm_pieces``. ``variant`` as ``build_t5``. Outputs are not meaningful.
  """
  import torch  # noqa: PLC0415

  started = time.perf_counter()
  out = _output_dir(out_dir)
  model_proto = _padded_spm(_train_spm(_benchmark_corpus(data_dir, seed),
                                       vocab_size=spm_vocab_size, model_type="unigram",
                                       exact_size=False, **_T5_IDS), spm_pieces)
  tokenizer = _t5_tokenizer(model_proto, extra_ids)
  if vocab_size < len(tokenizer):
    raise ValueError(f"vocab_size={vocab_size} is below the tokenizer's {len(tokenizer)} ids")
  torch.manual_seed(seed)
  model = _t5_model(variant, rows=vocab_size, model_dim=model_dim, head_dim=head_dim, ffn=ffn,
                    layers=layers, heads=heads).eval()
  return _save_t5(model, tokenizer, model_proto, out, max_length=max_length, kind=variant,
                  started=started, steps=0, loss=float("nan"), seed=seed)


def build_random_mbart50(out_dir: str | os.PathLike, *, model_dim: int = 1024, layers: int = 12,
                         heads: int = 16, ffn: int = 4096, spm_pieces: int = 250000,
                         spm_vocab_size: int = 8000, data_dir: str | os.PathLike | None = None,
                         max_positions: int = 1024, max_length: int = 200,
                         seed: int = 0) -> BuildInfo:
  """An mBART-50-sized checkpoint with random weights, for speed benchmarks.

  The defaults are mbart-large-50's (12 + 12 layers, d 1024, 16 heads, FFN 4096,
  GELU, 250,054 ids: 250,000 pieces, the 52 language codes and the fairseq
  specials), the sentencepiece model trained small and padded with filler pieces
  to ``spm_pieces``. Outputs are not meaningful.
  """
  import torch  # noqa: PLC0415

  started = time.perf_counter()
  out = _output_dir(out_dir)
  model_proto = _padded_spm(_train_spm(_benchmark_corpus(data_dir, seed),
                                       vocab_size=spm_vocab_size, model_type="unigram",
                                       exact_size=False), spm_pieces)
  tokenizer = _mbart50_tokenizer(model_proto, src_lang="de_DE", tgt_lang="en_XX")
  torch.manual_seed(seed)
  model = _mbart50_model(tokenizer, model_dim=model_dim, layers=layers, heads=heads, ffn=ffn,
                         max_positions=max_positions, dropout=0.1).eval()
  return _save_mbart50(model, tokenizer, model_proto, out, max_length=max_length,
                       started=started, steps=0, loss=float("nan"), seed=seed)


__all__ = ["BuildInfo", "build_marian", "build_m2m100", "build_mbart50", "build_nllb",
           "build_random_marian", "build_t5", "build_random_t5", "build_random_mbart50"]
