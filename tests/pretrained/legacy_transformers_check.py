"""Diverse beam search and lexical constraints against transformers 4.46.3, run by hand.

transformers 5.x moved group beam search (``num_beam_groups``) and constrained beam
search (``force_words_ids``) to Hub repositories that ``generate`` downloads; 4.46.3
still has both built in. This script is not collected by pytest: it needs that
version beside the project's environment, e.g.

  pip install --no-deps --target /tmp/hf446 transformers==4.46.3 tokenizers==0.20.3 \\
      huggingface_hub==0.26.5
  PYTHONPATH=/tmp/hf446:. python tests/pretrained/legacy_transformers_check.py \\
      --marian DIR --m2m100 DIR [--sources FILE] [--count 100]

with DIR the checkpoints ``seq2seq_jax.pretrained.fixtures`` builds for the tests.
It prints, per family and setting, how many sentences' n-best lists (tokens and
scores) equal transformers' (diverse groups), and for constraints how often each
search satisfies them and how their model scores compare.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import numpy as np
import torch
import transformers

from seq2seq_jax import pretrained
from seq2seq_jax.decoding import generate
from seq2seq_jax.text_controls import encode_target_text


def _rows(tokens, eos_id):
  out = []
  for row in np.asarray(tokens).tolist():
    out.append(tuple(row[:row.index(eos_id) + 1] if eos_id in row else row))
  return out


def _load(kind: str, directory: str):
  hf_class = (transformers.MarianMTModel if kind == "marian"
              else transformers.M2M100ForConditionalGeneration)
  model = hf_class.from_pretrained(directory).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  if kind == "m2m100":
    tokenizer.src_lang, tokenizer.tgt_lang = "de", "en"
  return model, tokenizer, pretrained.load(directory)


def diverse(kind, hf_model, hf_tokenizer, checkpoint, sources, *, max_length=48):
  forced = checkpoint.tokenizer.target_prefix("en" if kind == "m2m100" else None)
  hf_forced = {"forced_bos_token_id": forced[0]} if forced else {}
  eos = checkpoint.config.eos_id
  for beams, groups, penalty, early in ((4, 2, 0.5, True), (4, 4, 1.0, True), (6, 3, 2.0, True),
                                        (4, 2, 0.5, False), (4, 2, 0.5, "never")):
    same = same_scores = 0
    for start in range(0, len(sources), 16):
      batch = hf_tokenizer(sources[start:start + 16], padding=True, return_tensors="pt")
      with torch.no_grad():
        out = hf_model.generate(**batch, num_beams=beams, num_beam_groups=groups,
                                diversity_penalty=penalty, early_stopping=early,
                                length_penalty=1.0, num_return_sequences=beams,
                                max_length=max_length, output_scores=True,
                                return_dict_in_generate=True, **hf_forced)
      theirs = _rows(out.sequences[:, 1:], eos)
      theirs_scores = out.sequences_scores.numpy()
      config = dataclasses.replace(
          checkpoint.decode_config, method="beam", beam_size=beams, alpha=1.0,
          length_penalty_form="power", early_stopping=early, num_beam_groups=groups,
          diversity_penalty=penalty, max_decode_len=max_length - 1,
          forced_bos_id=forced[0] if forced else None)
      tokens, scores = generate(checkpoint.model, checkpoint.params,
                                np.asarray(batch["input_ids"]), config, n_best=True)
      ours = _rows(np.asarray(tokens).reshape(-1, tokens.shape[-1]), eos)
      ours_scores = np.asarray(scores).reshape(-1)
      for i in range(0, len(ours), beams):
        same += ours[i:i + beams] == theirs[i:i + beams]
        same_scores += np.allclose(ours_scores[i:i + beams], theirs_scores[i:i + beams],
                                   atol=1e-4)
    print(f"{kind} beams={beams} groups={groups} diversity={penalty} early_stopping={early}: "
          f"n-best tokens equal for {same}/{len(sources)} sentences, scores for "
          f"{same_scores}/{len(sources)}")


def constraints(kind, hf_model, hf_tokenizer, checkpoint, sources, *, max_length=48):
  forced = checkpoint.tokenizer.target_prefix("en" if kind == "m2m100" else None)
  hf_forced = {"forced_bos_token_id": forced[0]} if forced else {}
  eos = checkpoint.config.eos_id
  phrase_sets = [["outside"], ["two people", "red"], ["a large dog"]]
  config = dataclasses.replace(checkpoint.decode_config, method="beam", beam_size=4, alpha=1.0,
                               length_penalty_form="power", early_stopping=True,
                               max_decode_len=max_length - 1,
                               forced_bos_id=forced[0] if forced else None)
  for phrases in phrase_sets:
    ids = encode_target_text(checkpoint.tokenizer, phrases, eos_id=eos,
                             target_lang="en" if forced else None)
    satisfied = {"ours": 0, "transformers": 0}
    better = worse = 0
    for start in range(0, len(sources), 16):
      chunk = sources[start:start + 16]
      batch = hf_tokenizer(chunk, padding=True, return_tensors="pt")
      with torch.no_grad():
        theirs = hf_model.generate(**batch, num_beams=4, force_words_ids=ids,
                                   early_stopping=True, length_penalty=1.0,
                                   max_length=max_length, **hf_forced)
      ours, _ = generate(checkpoint.model, checkpoint.params, np.asarray(batch["input_ids"]),
                         config, constraints=[ids] * len(chunk))
      rows = {"ours": _rows(ours, eos), "transformers": _rows(theirs[:, 1:], eos)}
      for name, outputs in rows.items():
        satisfied[name] += sum(all(_contains(o, p) for p in ids) for o in outputs)
      logp = {name: _logprobs(hf_model, batch, outputs, skip=len(forced))
              for name, outputs in rows.items()}
      better += int(np.sum(logp["ours"] > logp["transformers"] + 1e-4))
      worse += int(np.sum(logp["ours"] < logp["transformers"] - 1e-4))
    print(f"{kind} constraints {phrases}: satisfied ours {satisfied['ours']}/{len(sources)}, "
          f"transformers {satisfied['transformers']}/{len(sources)}; log p ours higher on "
          f"{better}, lower on {worse}, equal on {len(sources) - better - worse}")


def _contains(tokens, phrase):
  return any(list(tokens[i:i + len(phrase)]) == phrase for i in range(len(tokens)))


def _logprobs(hf_model, batch, outputs, skip):
  """Total log p of each output (its first ``skip`` tokens, a forced code, left out)."""
  pad = hf_model.config.pad_token_id
  width = max(map(len, outputs))
  labels = torch.tensor([list(o) + [pad] * (width - len(o)) for o in outputs])
  start = torch.full((len(outputs), 1), hf_model.config.decoder_start_token_id)
  with torch.no_grad():
    logits = hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      decoder_input_ids=torch.cat([start, labels[:, :-1]], 1)).logits
  logp = torch.log_softmax(logits.double(), -1).gather(-1, labels[..., None])[..., 0]
  mask = labels != pad
  mask[:, :skip] = False
  return (logp * mask).sum(-1).numpy()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--marian", required=True)
  parser.add_argument("--m2m100", required=True)
  parser.add_argument("--sources", default=str(pathlib.Path(__file__).resolve().parents[3]
                                               / "shared/data/multi30k/raw/test_2016_flickr.de"))
  parser.add_argument("--count", type=int, default=96)
  args = parser.parse_args()
  print(f"transformers {transformers.__version__}")
  sources = pathlib.Path(args.sources).read_text(encoding="utf-8").splitlines()[:args.count]
  for kind in ("marian", "m2m100"):
    hf_model, hf_tokenizer, checkpoint = _load(kind, getattr(args, kind))
    diverse(kind, hf_model, hf_tokenizer, checkpoint, sources)
    constraints(kind, hf_model, hf_tokenizer, checkpoint, sources)


if __name__ == "__main__":
  main()
