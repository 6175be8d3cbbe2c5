"""One checkpoint directory in three runtimes, for the speed benchmarks: this library's
``generate``, transformers' ``generate`` (PyTorch) and CTranslate2 (converted by its own
``TransformersConverter``), given the same token ids. This library also runs in bfloat16
(``dtype="bfloat16"``) and int8 (``quantization.quantize``), CTranslate2 in its
``int8`` and ``int8_float32`` compute types (``compute_types``).

Random weights give no natural end, so every runtime generates exactly ``output_len``
tokens (EOS suppressed), and none generates the pad id or a decoder start that is not
EOS (this library never does; the others are told so). The greedy outputs are compared
token by token before the runtimes are timed, alternated round by round.
``benchmarks/pretrained_opus_mt.py`` and ``benchmarks/pretrained_families.py`` run it;
torch, transformers and ctranslate2 (the ``bench`` extra) are what the benchmark script
imports, passed in.

Example (needs the ``bench`` extra and a built checkpoint, so it is not a doctest)::

  runtimes = load_runtimes("/tmp/opus-mt-sized", "/tmp/ct2", ctranslate2=ctranslate2,
                           transformers=transformers, threads=8)
  sources = random_sources(runtimes, np.random.default_rng(0), count=64, lengths=(10, 30))
  rows, agreement = compare(runtimes, sources, batch=32, output_len=32, rounds=3,
                            task="batch 32")
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np


@dataclasses.dataclass
class Runtimes:
  """A checkpoint loaded in the three runtimes.

  Attributes:
    checkpoint: ``pretrained.load`` of the directory.
    hf_model: transformers' model of it (eval mode; no EOS forced at the length limit).
    hf_tokenizer: transformers' tokenizer of it.
    ct2: CTranslate2's ``Translator`` of its conversion.
    never: ids transformers and CTranslate2 are told not to generate (pad, a decoder
      start that is not EOS), unless the generation config bans them already.
  """

  checkpoint: Any
  hf_model: Any
  hf_tokenizer: Any
  ct2: Any
  never: list[int]
  # This library's variants, by system name: (model, params); "seq2seq_jax" is float32.
  ours: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
  # CTranslate2 in other compute types than float32, by system name ("CTranslate2 int8").
  ct2_types: dict[str, Any] = dataclasses.field(default_factory=dict)


# CTranslate2's int8 compute types: int8 products, the rest in its float16 / float32.
CT2_INT8_TYPES = ("int8", "int8_float32")

# This library's variants beside float32 ("seq2seq_jax"): compute dtype and quantization.
VARIANTS = {"seq2seq_jax bf16": ("bfloat16", "none"), "seq2seq_jax int8": ("float32", "int8"),
            "seq2seq_jax int8 bf16": ("bfloat16", "int8")}


def load_runtimes(directory: str | os.PathLike, ct2_dir: str | os.PathLike, *, ctranslate2: Any,
                  transformers: Any, threads: int, compute_types: tuple[str, ...] = (),
                  variants: tuple[str, ...] = ()) -> Runtimes:
  """Loads ``directory`` in the three runtimes, converting it for CTranslate2 into
  ``ct2_dir``; CTranslate2 runs on ``threads`` threads, in float32 and each of
  ``compute_types`` ("int8", "int8_float32": int8 weights quantized at load, as its
  users run it); this library in float32 and each of ``variants`` (keys of ``VARIANTS``)."""
  from seq2seq_jax import pretrained, quantization  # noqa: PLC0415
  from seq2seq_jax.models.registry import build_model  # noqa: PLC0415

  checkpoint = pretrained.load(directory)
  hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
  hf_model.generation_config.forced_eos_token_id = None  # all run to output_len
  ctranslate2.converters.TransformersConverter(str(directory)).convert(str(ct2_dir), force=True)
  ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu", inter_threads=1,
                               intra_threads=threads)
  config = checkpoint.config
  # Ids the checkpoint's generation config already bans (OPUS-MT's bad_words_ids: its pad)
  # need no telling: transformers reads that config, and CTranslate2's conversion drops
  # them from its vocabulary, where naming them is an error.
  never = ({config.pad_id, config.decoder_start_id} - {config.eos_id}
           - set(checkpoint.decode_config.suppress_ids))
  ours = {"seq2seq_jax": (checkpoint.model, checkpoint.params)}
  for name in variants:
    dtype, quantize = VARIANTS[name]
    model = build_model(dataclasses.replace(config, dtype=dtype))
    ours[name] = quantization.quantize(model, checkpoint.params, quantize)
  ct2_types = {f"CTranslate2 {kind}": ctranslate2.Translator(
      str(ct2_dir), device="cpu", compute_type=kind, inter_threads=1, intra_threads=threads)
      for kind in compute_types}
  return Runtimes(checkpoint=checkpoint, hf_model=hf_model,
                  hf_tokenizer=transformers.AutoTokenizer.from_pretrained(directory), ct2=ct2,
                  never=sorted(never), ours=ours, ct2_types=ct2_types)


def random_sources(runtimes: Runtimes, rng: np.random.Generator, *, count: int,
                   lengths: tuple[int, int]) -> list[list[int]]:
  """``count`` rows of random ordinary ids (no special token), of lengths drawn from
  ``lengths`` (low inclusive, high exclusive), EOS last."""
  specials = set(runtimes.hf_tokenizer.all_special_ids)
  ordinary = np.array([i for i in range(len(runtimes.hf_tokenizer)) if i not in specials])
  drawn = rng.integers(*lengths, size=count)
  return [list(rng.choice(ordinary, size=n - 1)) + [runtimes.checkpoint.config.eos_id]
          for n in drawn]


def compare(runtimes: Runtimes, sources: list[list[int]], *, batch: int, output_len: int,
            rounds: int, task: str, with_hf: bool = True
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """Greedy and beam-4 search over ``sources`` in batches of ``batch`` rows, in each runtime
  (transformers only ``with_hf``: at mBART's size its beam search takes minutes a round).

  Returns:
    ``(rows, agreement)``: a timing row per search and runtime (``task`` is
    ``"greedy {task}"`` or ``"beam4 {task}"``; generated tokens/s, its spread, this
    library's float32 rate over the runtime's, and with CTranslate2 int8 types the
    runtime's rate over the faster of them, ``x CT2 int8``), and the share of
    identical greedy rows and tokens between this library in float32 and each of the
    others (this library's bfloat16 and int8 and CTranslate2's int8 round otherwise,
    and with random weights a token that differs changes all after it).
  """
  import torch  # noqa: PLC0415

  from seq2seq_jax import benchmarking  # noqa: PLC0415
  from seq2seq_jax.configs import DecodeConfig  # noqa: PLC0415
  from seq2seq_jax.decoding import generate  # noqa: PLC0415

  checkpoint, hf_model, ct2 = runtimes.checkpoint, runtimes.hf_model, runtimes.ct2
  config = checkpoint.config
  vocab = runtimes.hf_tokenizer.get_vocab()
  token_of = {i: t for t, i in vocab.items()}
  width = max(len(row) for row in sources)
  groups = [sources[i:i + batch] for i in range(0, len(sources), batch)]
  padded = [np.array([row + [config.pad_id] * (width - len(row)) for row in group], np.int32)
            for group in groups]
  torch_batches = [torch.from_numpy(b.astype(np.int64)) for b in padded]
  token_batches = [[[token_of[int(i)] for i in row] for row in group] for group in groups]
  never_tokens = [[token_of[i]] for i in runtimes.never]
  tokens = len(sources) * output_len
  rows, agreement = [], {}
  for beams in (1, 4):
    decode = DecodeConfig(method="greedy" if beams == 1 else "beam", beam_size=beams,
                          alpha=0.0, max_decode_len=output_len, suppress_ids=(config.eos_id,))

    def run_ours(decode=decode, name="seq2seq_jax"):
      model, params = runtimes.ours.get(name, (checkpoint.model, checkpoint.params))
      return [generate(model, params, b, decode)[0] for b in padded]

    def run_hf(beams=beams):
      with torch.inference_mode():
        return [hf_model.generate(b, attention_mask=b != config.pad_id, num_beams=beams,
                                  do_sample=False, min_length=output_len + 1,
                                  max_length=output_len + 1, length_penalty=0.0,
                                  suppress_tokens=runtimes.never)
                for b in torch_batches]

    def run_ct2(beams=beams, translator=ct2):
      return [translator.translate_batch(b, beam_size=beams, max_decoding_length=output_len,
                                         min_decoding_length=output_len, length_penalty=0.0,
                                         max_batch_size=batch, suppress_sequences=never_tokens)
              for b in token_batches]

    if beams == 1:  # the same weights give the same greedy tokens in every runtime
      # Agreement means nothing if the weights give NaN (every runtime then agrees).
      with torch.inference_mode():
        logits = hf_model(input_ids=torch_batches[0],
                          attention_mask=torch_batches[0] != config.pad_id,
                          decoder_input_ids=torch.full((len(groups[0]), 1),
                                                       config.decoder_start_id)).logits
      if not torch.isfinite(logits).all():
        raise RuntimeError("the random checkpoint gives non-finite logits: agreement "
                           "between the runtimes would be vacuous")
      ours = np.concatenate([np.asarray(t) for t in run_ours()])
      ct = np.array([[vocab[t] for t in r.hypotheses[0]] for g in run_ct2() for r in g])
      agreement = {"rows": len(ours), "CTranslate2 identical rows": float((ours == ct).all(1).mean()),
                   "CTranslate2 identical tokens": float((ours == ct).mean())}
      if with_hf:
        hf = np.concatenate([t.numpy()[:, 1:] for t in run_hf()])
        agreement.update({"HF identical rows": float((ours == hf).all(1).mean()),
                          "HF identical tokens": float((ours == hf).mean())})
      for name in [n for n in runtimes.ours if n != "seq2seq_jax"]:
        theirs = np.concatenate([np.asarray(t) for t in run_ours(name=name)])
        agreement[f"{name} identical tokens"] = float((ours == theirs).mean())
      for name, translator in runtimes.ct2_types.items():
        theirs = np.array([[vocab[t] for t in r.hypotheses[0]]
                           for g in run_ct2(translator=translator) for r in g])
        agreement[f"{name} identical tokens"] = float((ours == theirs).mean())
    systems = {name: functools.partial(run_ours, name=name) for name in runtimes.ours}
    systems.update({"HF generate": run_hf} if with_hf else {})
    systems["CTranslate2"] = run_ct2
    systems.update({name: functools.partial(run_ct2, translator=translator)
                    for name, translator in runtimes.ct2_types.items()})
    timings = benchmarking.time_interleaved(systems, rounds=rounds)
    ours_rate = tokens / timings["seq2seq_jax"].median_s
    ct2_int8 = max((tokens / timings[name].median_s for name in runtimes.ct2_types),
                   default=None)
    for name, timing in timings.items():
      rate = tokens / timing.median_s
      spread = [tokens / t for t in timing.times_s]
      rows.append({"task": f"{'greedy' if beams == 1 else 'beam4'} {task}", "system": name,
                   "tokens/s": rate, "tokens/s min": min(spread), "tokens/s max": max(spread),
                   "ours/system": ours_rate / rate,
                   **({"x CT2 int8": rate / ct2_int8} if ct2_int8 else {}),
                   "timing": timing.to_dict()})
  return rows, agreement


def load_all(directory: str | os.PathLike, ct2_dir: str | os.PathLike, *, ctranslate2: Any,
             transformers: Any, threads: int) -> Runtimes:
  """``load_runtimes`` with every variant: CTranslate2's int8 types, this library's bf16 and int8."""
  return load_runtimes(directory, ct2_dir, ctranslate2=ctranslate2, transformers=transformers,
                       threads=threads, compute_types=CT2_INT8_TYPES, variants=tuple(VARIANTS))


def compare_batches(runtimes: Runtimes, sentences: Mapping[int, int], *, lengths: tuple[int, int],
                    output_len: int, rounds: int, with_hf: bool = True
                    ) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
  """``compare`` at each batch size of ``sentences`` (batch -> how many random sources, drawn
  from one generator seeded 0): the rows of all (task ``"... batch B"``), agreement by batch."""
  rng = np.random.default_rng(0)
  rows, agreement = [], {}
  for batch, count in sentences.items():
    sources = random_sources(runtimes, rng, count=count, lengths=lengths)
    batch_rows, agreement[batch] = compare(runtimes, sources, batch=batch, output_len=output_len,
                                           rounds=rounds, task=f"batch {batch}", with_hf=with_hf)
    rows += batch_rows
  return rows, agreement


def describe_cpu() -> str:
  """The CPU, its instruction set (``platforms.cpu_instruction_set``) and the load average,
  as the benchmarks print them beside every figure."""
  from seq2seq_jax import benchmarking  # noqa: PLC0415

  info = benchmarking.machine_info()
  load = info.get("load_average")
  return (f"CPU {info['cpu']} (family {info.get('cpu_family', '?')}, model "
          f"{info.get('cpu_model', '?')}), {info['cpu_count']} cores, "
          f"{info['instruction_set']}; load average "
          + ("/".join(f"{x:.2f}" for x in load) if load else "unknown"))


def start(parser: argparse.ArgumentParser, benchmark: str, settings: Mapping[str, Any], *,
          rounds_flag: bool = True) -> tuple[argparse.Namespace, dict[str, Any], tuple] | None:
  """How these benchmarks start: the script's arguments (``benchmarking.parse_args``; with
  ``rounds_flag``, a ``--rounds`` that replaces ``settings["rounds"]``), its settings, and
  ``(ctranslate2, torch, transformers)``; None when the ``bench`` extra is missing (the
  skip is then written to ``--out``)."""
  from seq2seq_jax import benchmarking  # noqa: PLC0415

  if rounds_flag:
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternated rounds per task (default 3; 2 in quick mode)")
  args = benchmarking.parse_args(parser)
  settings = dict(settings)
  if getattr(args, "rounds", None) is not None:
    if args.rounds < 1:
      parser.error(f"--rounds must be at least 1; got {args.rounds}")
    settings["rounds"] = args.rounds
  peers = benchmarking.import_peers(args.out, benchmark)
  return None if peers is None else (args, settings, peers)


def versions(ctranslate2: Any, torch: Any, transformers: Any) -> dict[str, str]:
  """The peers' versions, as the benchmarks record them."""
  return {"torch": torch.__version__, "transformers": transformers.__version__,
          "ctranslate2": ctranslate2.__version__}


__all__ = ["Runtimes", "load_runtimes", "random_sources", "compare", "start",
           "versions", "describe_cpu", "load_all", "compare_batches", "CT2_INT8_TYPES",
           "VARIANTS"]
