"""One checkpoint directory in three runtimes, for the speed benchmarks: this library's
``generate``, transformers' ``generate`` (PyTorch) and CTranslate2 (converted by its own
``TransformersConverter``), given the same token ids.

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


def load_runtimes(directory: str | os.PathLike, ct2_dir: str | os.PathLike, *, ctranslate2: Any,
                  transformers: Any, threads: int) -> Runtimes:
  """Loads ``directory`` in the three runtimes, converting it for CTranslate2 into
  ``ct2_dir``; CTranslate2 runs on ``threads`` threads."""
  from seq2seq_jax import pretrained  # noqa: PLC0415

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
  return Runtimes(checkpoint=checkpoint, hf_model=hf_model,
                  hf_tokenizer=transformers.AutoTokenizer.from_pretrained(directory), ct2=ct2,
                  never=sorted(never))


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
            rounds: int, task: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """Greedy and beam-4 search over ``sources`` in batches of ``batch`` rows, in each runtime.

  Returns:
    ``(rows, agreement)``: a timing row per search and runtime (``task`` is
    ``"greedy {task}"`` or ``"beam4 {task}"``; generated tokens/s, its spread, and
    this library's rate over the runtime's), and the share of identical greedy rows
    and tokens between this library and each of the others.
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

    def run_ours(decode=decode):
      return [generate(checkpoint.model, checkpoint.params, b, decode)[0] for b in padded]

    def run_hf(beams=beams):
      with torch.inference_mode():
        return [hf_model.generate(b, attention_mask=b != config.pad_id, num_beams=beams,
                                  do_sample=False, min_length=output_len + 1,
                                  max_length=output_len + 1, length_penalty=0.0,
                                  suppress_tokens=runtimes.never)
                for b in torch_batches]

    def run_ct2(beams=beams):
      return [ct2.translate_batch(b, beam_size=beams, max_decoding_length=output_len,
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
      hf = np.concatenate([t.numpy()[:, 1:] for t in run_hf()])
      ct = np.array([[vocab[t] for t in r.hypotheses[0]] for g in run_ct2() for r in g])
      agreement = {
          "rows": len(ours), "HF identical rows": float((ours == hf).all(1).mean()),
          "CTranslate2 identical rows": float((ours == ct).all(1).mean()),
          "HF identical tokens": float((ours == hf).mean()),
          "CTranslate2 identical tokens": float((ours == ct).mean())}
    systems = {"seq2seq_jax": run_ours, "HF generate": run_hf, "CTranslate2": run_ct2}
    timings = benchmarking.time_interleaved(systems, rounds=rounds)
    ours_rate = tokens / timings["seq2seq_jax"].median_s
    for name, timing in timings.items():
      rate = tokens / timing.median_s
      spread = [tokens / t for t in timing.times_s]
      rows.append({"task": f"{'greedy' if beams == 1 else 'beam4'} {task}", "system": name,
                   "tokens/s": rate, "tokens/s min": min(spread), "tokens/s max": max(spread),
                   "ours/system": ours_rate / rate, "timing": timing.to_dict()})
  return rows, agreement


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
           "versions"]
