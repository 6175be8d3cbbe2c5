"""Decoding controls given as text: per-sentence target prefixes and constraint phrases.

What the ``Translator`` (and the command line) turn into ``generate``'s
``target_prefix`` and ``constraints``: each text is tokenized as the target side
of the model's tokenizer, without the language code and EOS the tokenizer puts
around a whole target, checked against the output limit with the sentence's
number in the message, and padded per batch to a few bucketed shapes so that
batches with different prefixes and phrases compile a handful of programs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from seq2seq_jax.configs import DecodeConfig
from seq2seq_jax.decoding.constraints import pad_constraints
from seq2seq_jax.decoding.prefix import pad_target_prefix


def encode_target_text(tokenizer: Any, texts: Sequence[str], *, eos_id: int,
                       target_lang: str | None = None) -> list[list[int]]:
  """Token ids of target-side texts as they appear inside an output (a prefix, a phrase).

  ``tokenizer.encode_target`` with the language code and EOS around it removed.
  """
  special = set(tokenizer.target_prefix(target_lang)) | {eos_id}
  out = []
  for ids in tokenizer.encode_target(list(texts), target_lang) if texts else []:
    start, end = 0, len(ids)
    while start < end and ids[start] in special:
      start += 1
    while end > start and ids[end - 1] in special:
      end -= 1
    out.append(list(ids[start:end]))
  return out


@dataclasses.dataclass(frozen=True)
class SentenceControls:
  """Token ids of each sentence's prefix and phrases (None when no sentence has any)."""

  prefixes: list[list[int]] | None
  phrases: list[list[list[int]]] | None

  def batch_arrays(self, indices: Sequence[int], rows: int, *,
                   pad_id: int) -> dict[str, np.ndarray]:
    """``generate``'s ``target_prefix`` / ``constraints`` for the sentences ``indices``
    padded to ``rows`` rows (the extra rows get none), in power-of-two shapes; a
    control no sentence of the batch uses is left out, so the plain search runs."""
    arrays: dict[str, np.ndarray] = {}
    fill: list[list[Any]] = [[] for _ in range(rows - len(indices))]
    if self.prefixes is not None and any(self.prefixes[j] for j in indices):
      width = _power_of_two(max(len(self.prefixes[j]) for j in indices), 4)
      arrays["target_prefix"] = pad_target_prefix([self.prefixes[j] for j in indices] + fill,
                                                  pad_id=pad_id, width=width)
    if self.phrases is not None and any(self.phrases[j] for j in indices):
      count = _power_of_two(max(len(self.phrases[j]) for j in indices), 1)
      longest = _power_of_two(max(len(p) for j in indices for p in self.phrases[j]), 2)
      arrays["constraints"] = pad_constraints([self.phrases[j] for j in indices] + fill,
                                              pad_id=pad_id, num_phrases=count,
                                              phrase_len=longest)
    return arrays


def _power_of_two(n: int, minimum: int) -> int:
  """The smallest power of two >= n and >= minimum."""
  return max(minimum, 1 << max(n - 1, 0).bit_length())


def sentence_controls(tokenizer: Any, config: DecodeConfig, *, eos_id: int,
                      count: int, todo: Sequence[int], target_prefix: Sequence[str] | None,
                      constraints: Sequence[Sequence[str]] | None,
                      target_lang: str | None = None,
                      name: Callable[[str, int], str] | None = None) -> SentenceControls:
  """The prefixes and phrases of the sentences ``todo`` (of ``count``), tokenized and checked.

  Raises ``ValueError`` naming the sentence when its prefix, or its phrases with the
  prefix, leave no room in ``config.max_decode_len`` (the limit of this call), or a
  phrase is empty; and when the lists do not have one entry per sentence. ``name(field,
  i)`` says how a message names sentence ``i``'s entry of ``field`` ("target_prefix" or
  "constraints"); default ``field[i]``.
  """
  name = name or (lambda field, i: f"{field}[{i}]")
  for field, given in (("target_prefix", target_prefix), ("constraints", constraints)):
    if given is not None and len(given) != count:
      raise ValueError(f"{field} needs one entry per sentence; got {len(given)} for {count} "
                       "sentences")
  room = config.max_decode_len - int(config.forced_bos_id is not None)
  prefixes = None
  if target_prefix is not None and any(target_prefix[i].strip() for i in todo):
    prefixes = encode_target_text(tokenizer, [target_prefix[i] for i in todo], eos_id=eos_id,
                                  target_lang=target_lang)
    for j, ids in enumerate(prefixes):
      if len(ids) >= room:
        raise ValueError(f"{name('target_prefix', todo[j])} has {len(ids)} tokens; the output "
                         f"limit of {config.max_decode_len} leaves no room to translate: pass a larger "
                         "max_decode_len")
  phrases = None
  if constraints is not None and any(constraints[i] for i in todo):
    if config.method != "beam":
      raise ValueError(f"constraints need beam search (beam_size > 1 or method='beam'); got "
                       f"method={config.method!r}")
    phrases = [encode_target_text(tokenizer, list(constraints[i]), eos_id=eos_id,
                                  target_lang=target_lang) for i in todo]
    for j, row in enumerate(phrases):
      if any(not phrase for phrase in row):
        raise ValueError(f"{name('constraints', todo[j])} holds an empty phrase")
      used = sum(len(p) for p in row) + (len(prefixes[j]) if prefixes else 0)
      if used > room - int(config.force_eos_at_limit):
        raise ValueError(f"{name('constraints', todo[j])} need {used} tokens with the prefix; the "
                         f"output limit is {config.max_decode_len}: pass a larger "
                         "max_decode_len or fewer phrases")
  return SentenceControls(prefixes, phrases)


def same_vocabulary(a: Any, b: Any) -> bool:
  """Whether two tokenizers map text to the same ids (their serialized forms are equal)."""
  if type(a) is not type(b):
    return False
  if hasattr(a, "to_dict"):
    return a.to_dict() == b.to_dict()
  return a == b


def with_decode_options(config: DecodeConfig, options: dict[str, Any]) -> DecodeConfig:
  """``config`` with some fields replaced; an unknown name raises ``TypeError`` listing them."""
  fields = {f.name for f in dataclasses.fields(DecodeConfig)}
  unknown = sorted(set(options) - fields)
  if unknown:
    raise TypeError(f"unknown decoding options {unknown}; DecodeConfig fields are "
                    f"{', '.join(sorted(fields))}")
  return dataclasses.replace(config, **options) if options else config
