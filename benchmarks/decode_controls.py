"""The cost of each decoding control against plain beam search (beam 4), alternated in one run.

T-small with random weights, EOS suppressed (``benchmarking.SuppressEOS``) so every
search runs exactly ``length`` steps and a control's cost is not hidden by earlier
stops: each row is one control on top of beam 4 (the stopping rules, which decide
when to stop, then cost only their bookkeeping). All systems are timed in rotation
(``benchmarking.time_interleaved``), the ratio is their median time over plain beam
4's; a second, identical plain beam 4 shows how far ratios move by noise alone.
Greedy search with and without repetition control is timed the same way. The
ensemble row runs two T-small members.

  python benchmarks/decode_controls.py [--vocab-size N] [--out FILE.json] [--plot FILE.png]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/decode_controls.py   # tiny sizes, for CI
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax import (DecodeConfig, Ensemble, TransformerConfig, benchmarking, build_model,
                         ensemble_params)
from seq2seq_jax.decoding import generate



def settings(quick: bool, vocab_size: int) -> dict:
  """Model, batch and output length; tiny in quick mode."""
  if quick:
    return dict(config=TransformerConfig(vocab_size=500, model_dim=32, num_heads=2, mlp_dim=64,
                                         num_encoder_layers=1, num_decoder_layers=1, max_len=64),
                batch=4, source_len=8, length=12, rounds=2)
  return dict(config=TransformerConfig(vocab_size=vocab_size, model_dim=256, num_heads=4, mlp_dim=1024,
                                       num_encoder_layers=3, num_decoder_layers=3, max_len=128),
              batch=32, source_len=20, length=32, rounds=9)


def systems(length: int, vocab: int, batch: int, rng: np.random.Generator) -> dict:
  """name -> (DecodeConfig changes, generate keyword arguments, use the ensemble)."""
  words = lambda *shape: rng.integers(4, vocab, size=shape).tolist()
  prefixes = [words(4) for _ in range(batch)]
  phrases = [[words(2), words(2)] for _ in range(batch)]
  beam = dict(method="beam", beam_size=4)
  return {
      "beam4": (beam, {}, False),
      "beam4 again (noise yardstick)": (beam, {}, False),
      "early_stopping=True": (dict(beam, early_stopping=True), {}, False),
      "early_stopping=False": (dict(beam, early_stopping=False), {}, False),
      "length_penalty_form=power": (dict(beam, length_penalty_form="power"), {}, False),
      "no_repeat_ngram_size=3": (dict(beam, no_repeat_ngram_size=3), {}, False),
      "repetition_penalty=1.2": (dict(beam, repetition_penalty=1.2), {}, False),
      "renormalize_logits": (dict(beam, renormalize_logits=True), {}, False),
      "target_prefix (4 tokens)": (beam, {"target_prefix": prefixes}, False),
      "constraints (2 x 2 tokens)": (beam, {"constraints": phrases}, False),
      "num_beam_groups=2": (dict(beam, num_beam_groups=2, diversity_penalty=0.5), {}, False),
      "num_beam_groups=4": (dict(beam, num_beam_groups=4, diversity_penalty=0.5), {}, False),
      "ensemble of 2": (beam, {}, True),
      "greedy": (dict(method="greedy"), {}, False),
      "greedy no_repeat_ngram_size=3": (dict(method="greedy", no_repeat_ngram_size=3), {}, False),
      "greedy repetition_penalty=1.2": (dict(method="greedy", repetition_penalty=1.2), {},
                                        False),
  }


def main() -> None:
  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--vocab-size", type=int, default=8000,
                      help="the model's vocabulary (58101: OPUS-MT de-en's); not in quick mode")
  args = benchmarking.parse_args(parser)
  s = settings(benchmarking.quick_mode(), args.vocab_size)
  config, length, batch = s["config"], s["length"], s["batch"]
  model = build_model(config)
  inputs = jnp.ones((1, 4), jnp.int32)
  member_params = [model.init(jax.random.key(seed), inputs, inputs)["params"] for seed in (0, 1)]
  single = benchmarking.SuppressEOS(model)
  pair = Ensemble(models=(single, benchmarking.SuppressEOS(model)))
  params = {"model": member_params[0]}
  pair_params = ensemble_params([{"model": p} for p in member_params])
  sources = benchmarking.synthetic_sources(np.random.default_rng(0), num_sentences=batch,
                                           source_len=s["source_len"],
                                           vocab_size=config.vocab_size)
  plans = systems(length, config.vocab_size, batch, np.random.default_rng(1))
  fns = {}
  for name, (changes, kwargs, ensemble) in plans.items():
    decode_config = dataclasses.replace(DecodeConfig(max_decode_len=length), **changes)
    fns[name] = (lambda c=decode_config, k=kwargs, e=ensemble: generate(
        pair if e else single, pair_params if e else params, sources, c, **k))
    tokens, _ = fns[name]()
    assert tokens.shape == (batch, length), (name, tokens.shape)
  timings = benchmarking.time_interleaved(fns, rounds=s["rounds"])
  rows = []
  for name, timing in timings.items():
    baseline = "greedy" if name.startswith("greedy") else "beam4"
    rows.append({"task": "greedy" if baseline == "greedy" else "beam 4", "system": name,
                 "median_s": timing.median_s, "compile_s": timing.first_s,
                 "ratio": timing.median_s / timings[baseline].median_s,
                 "tokens/s": batch * length / timing.median_s, "timing": timing.to_dict()})
  print(f"T d={config.model_dim} {config.num_encoder_layers}+{config.num_decoder_layers} layers, "
        f"vocab {config.vocab_size}; {batch} sentences of {s['source_len']} tokens, {length} "
        "output tokens each (EOS suppressed)")
  print(benchmarking.format_table(rows, ["task", "system", "median_s", "ratio", "tokens/s",
                                         "compile_s"]))
  benchmarking.report(args, {"benchmark": "decode_controls", "model": config.__dict__,
                             "batch": batch, "length": length, "rows": rows})


if __name__ == "__main__":
  main()
