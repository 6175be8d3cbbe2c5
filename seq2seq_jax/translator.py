"""Text in, text out: tokenize, bucket, generate, restore order, detokenize.

Example:
  >>> translator = Translator.from_workdir("workdirs/multi30k_transformer")
  >>> translator.translate(["Ein Hund läuft.", "Zwei Männer sitzen auf einer Bank."],
  ...                      beam_size=4, alpha=0.6)
  ['A dog is running.', 'Two men are sitting on a bench.']
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from typing import Any, Sequence

import flax.linen as nn
import numpy as np

from seq2seq_jax.configs import DecodeConfig
from seq2seq_jax.decoding import generate
from seq2seq_jax.types import EOS_ID, PAD_ID, PyTree

logger = logging.getLogger("seq2seq_jax")


def _ceil_to(buckets: Sequence[int], n: int) -> int:
  return next(b for b in buckets if b >= n)


class Translator:
  """Translates lists of sentences with a trained model.

  Sources are sorted by length and cut into batches; each batch is padded to one
  of a few bucket lengths and a power-of-two row count, so a whole corpus
  compiles a handful of programs and a single sentence never recompiles. Rows
  decode independently: a sentence's translation does not depend on its
  neighbours in the batch.

  Args:
    model: a model with the encode / init_cache / decode_step contract.
    params: its parameters.
    tokenizer: the run's ``seq2seq_jax.data.tokenizer.Tokenizer``.
    decode_config: default search settings (``translate`` may override them).
    max_source_len: longest source in tokens (EOS included); longer inputs are
      truncated with a warning on the ``seq2seq_jax`` logger.
    bucket_lengths: padded source lengths; ``max_source_len`` is always added.
    batch_size: most rows decoded at once.
  """

  def __init__(self, model: nn.Module, params: PyTree, tokenizer: Any, *,
               decode_config: DecodeConfig = DecodeConfig(), max_source_len: int = 128,
               bucket_lengths: Sequence[int] = (16, 32, 64), batch_size: int = 64):
    model_max = getattr(getattr(model, "config", None), "max_len", max_source_len)
    if max_source_len > model_max:
      raise ValueError(f"max_source_len={max_source_len} exceeds the model's max_len={model_max}")
    if batch_size <= 0:
      raise ValueError(f"batch_size={batch_size} must be positive")
    self.model = model
    self.params = params
    self.tokenizer = tokenizer
    self.decode_config = decode_config
    self.max_source_len = max_source_len
    self.bucket_lengths = tuple(sorted({b for b in bucket_lengths if b < max_source_len}
                                       | {max_source_len}))
    self.batch_size = batch_size
    self.config = None  # the ExperimentConfig, when loaded with from_workdir
    self.step = None  # the checkpoint step, when loaded with from_workdir
    self.row_buckets = tuple(sorted({min(2 ** i, batch_size)
                                     for i in range(batch_size.bit_length() + 1)}))

  @classmethod
  def from_workdir(cls, workdir: str | os.PathLike, *, step: int | str | None = None,
                   **kwargs) -> "Translator":
    """Loads the model, parameters, tokenizer and settings a training run saved.

    Args:
      workdir: the training run's directory (holding ``checkpoints/``).
      step: ``"best"`` (highest validation BLEU), ``"latest"`` or a step number;
        default: the best when a checkpoint has a validation BLEU, else the latest.
      **kwargs: overrides of the constructor's keyword arguments.

    Raises:
      CheckpointError: ``workdir`` holds no checkpoint (the message says where it looked).
    """
    from seq2seq_jax import checkpoints
    from seq2seq_jax.data.tokenizer import Tokenizer
    from seq2seq_jax.models.registry import build_model

    directory = pathlib.Path(workdir).expanduser() / "checkpoints"
    if not directory.is_dir():
      raise checkpoints.CheckpointError(
          f"{directory} does not exist: {workdir} is not a training run's workdir; train first "
          "(seq2seq-jax train --workdir ...) or point to the right folder")
    with checkpoints.Checkpointer(directory, keep=1, async_save=False) as checkpointer:
      if step is None:
        step = "best" if checkpointer.best_step() is not None else "latest"
      step = checkpointer.resolve_step(step)
      proto = checkpointer.load_tokenizer_bytes(step)
    if proto is None:
      raise checkpoints.CheckpointError(f"{directory}/{step} holds no tokenizer")
    params, config = checkpoints.load_params(directory, step=step)
    options = dict(decode_config=config.decode,
                   max_source_len=min(config.model.max_len, config.data.max_source_len),
                   bucket_lengths=config.data.bucket_lengths,
                   batch_size=config.data.eval_batch_size)
    options.update(kwargs)
    translator = cls(build_model(config.model), params, Tokenizer.from_bytes(proto), **options)
    translator.config, translator.step = config, step
    return translator

  def max_decode_len(self, config: DecodeConfig) -> int:
    """The output limit used for every batch: the ratio applied to ``max_source_len``."""
    limit = config.decode_len(self.max_source_len)
    model_max = getattr(getattr(self.model, "config", None), "max_len", None)
    return min(limit, model_max) if model_max else limit

  def encode(self, sentences: Sequence[str]) -> list[list[int]]:
    """Token ids of each sentence with EOS appended, truncated to ``max_source_len``."""
    encoded = []
    for i, ids in enumerate(self.tokenizer.encode_batch(list(sentences))):
      if len(ids) + 1 > self.max_source_len:
        logger.warning("sentence %d has %d tokens; truncated to the model's limit of %d "
                       "(EOS included)", i, len(ids) + 1, self.max_source_len)
        ids = ids[:self.max_source_len - 1]
      encoded.append(list(ids) + [EOS_ID])
    return encoded

  def translate(self, sentences: Sequence[str], *, beam_size: int | None = None,
                alpha: float | None = None, method: str | None = None) -> list[str]:
    """Translations of ``sentences``, in their order; an empty line gives ''.

    ``beam_size`` > 1 implies beam search unless ``method`` says otherwise.
    """
    config = self.decode_config
    changes: dict[str, Any] = {}
    if beam_size is not None:
      changes["beam_size"] = beam_size
      changes["method"] = "beam" if beam_size > 1 else "greedy"
    if alpha is not None:
      changes["alpha"] = alpha
    if method is not None:
      changes["method"] = method
    if not config.max_decode_len:
      # One limit for every batch, whatever its bucket, so a sentence's translation
      # does not depend on the longest sentence it was batched with. Searches stop
      # as soon as every row has finished, so the limit costs nothing when unused.
      changes["max_decode_len"] = self.max_decode_len(config)
    config = dataclasses.replace(config, **changes)
    outputs = [""] * len(sentences)
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    encoded = self.encode([sentences[i] for i in todo])
    order = sorted(range(len(todo)), key=lambda j: -len(encoded[j]))
    for start in range(0, len(order), self.batch_size):
      chunk = order[start:start + self.batch_size]
      length = _ceil_to(self.bucket_lengths, max(len(encoded[j]) for j in chunk))
      rows = _ceil_to(self.row_buckets, len(chunk))
      inputs_BS = np.full((rows, length), PAD_ID, np.int32)
      inputs_BS[:, 0] = EOS_ID  # filler rows: an empty sentence
      for r, j in enumerate(chunk):
        inputs_BS[r, :len(encoded[j])] = encoded[j]
      tokens_BT, _ = generate(self.model, self.params, inputs_BS, config)
      texts = self.tokenizer.decode_batch(np.asarray(tokens_BT)[:len(chunk)])
      for j, text in zip(chunk, texts):
        outputs[todo[j]] = text
    return outputs
