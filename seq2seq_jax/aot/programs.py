"""The programs the library runs, built from abstract inputs alone: no weights, no data.

Each builder returns a ``Program``: the jitted function the library itself runs
(``training.step.make_train_step`` / ``make_eval_step``,
``inference.translator.search_program`` / ``score_program``) and
``jax.ShapeDtypeStruct`` arguments carrying their shardings on a mesh. Lowering
and compiling it for a mesh of compile-only TPU devices runs the TPU compiler
without a TPU (``seq2seq_jax.aot.report``).

``decode_step`` is one iteration of a search's loop (the model's ``decode_step``
at the cache's last position, the log-softmax, and the choice of the next tokens),
written without loops: XLA's cost analysis counts the body of a loop once, so the
whole ``generate`` program says how much memory decoding needs but not what one of
its steps costs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.experimental.layout import Format, Layout

from seq2seq_jax import quantization
from seq2seq_jax.configs import DecodeConfig, ExperimentConfig
from seq2seq_jax.data.pipeline import bucket_rows
from seq2seq_jax.decoding import selection
from seq2seq_jax.decoding.beam import expand_to_beams, gather_beams
from seq2seq_jax.decoding.generation import decode_length
from seq2seq_jax.decoding.step import log_softmax
from seq2seq_jax.layers.attention import cache_reads_in_one_block
from seq2seq_jax.layers.partitioning import activation_sharding
from seq2seq_jax.models.base import PACKING_KEYS
from seq2seq_jax.training import sharding as sharding_lib
from seq2seq_jax.training import step as step_lib

PROGRAMS = ("train", "eval", "generate", "score")


@dataclasses.dataclass(frozen=True)
class Program:
  """A jitted program and abstract arguments to lower it with.

  Attributes:
    name: ``"train"``, ``"eval"``, ``"generate"``, ``"score"`` or ``"decode_step"``.
    jitted: the ``jax.jit``-wrapped function.
    args: its arguments as ``jax.ShapeDtypeStruct`` trees with shardings.
    rows: global batch rows (sentences; beams not counted).
    source_len: padded source length.
    target_len: padded target length (``generate``: the output limit).
    settings: what else shaped the program (sharding, dtype, search).
  """

  name: str
  jitted: Callable[..., Any]
  args: tuple[Any, ...]
  rows: int
  source_len: int
  target_len: int
  settings: dict[str, Any]

  @property
  def tokens_per_step(self) -> int:
    """Padded source plus target tokens of the global batch."""
    return self.rows * (self.source_len + self.target_len)


def _abstract(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      tree, shardings)


def _rows_spec(mesh: Mesh, rows: int, *shape: int, dtype: Any = jnp.int32) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct((rows, *shape), dtype, sharding=NamedSharding(mesh, P("data")))


def _key(mesh: Mesh) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P()))


def longest_bucket(config: ExperimentConfig) -> int:
  """The padded length of the longest training batches (the bucket the length limits need)."""
  data = config.data
  longest = max(data.max_source_len, data.max_target_len)
  return min(b for b in data.bucket_lengths if b >= longest)


def train_length(config: ExperimentConfig) -> int:
  """The padded length of the longest training rows: with ``data.packing`` every row has
  the largest bucket's length (several pairs a row), else ``longest_bucket``."""
  return config.data.bucket_lengths[-1] if config.data.packing else longest_bucket(config)


def row_unit(config: ExperimentConfig, mesh: Mesh, program: str) -> int:
  """Batch rows come in multiples of this: the data axis, ``batch_multiple``, microbatches."""
  unit = math.lcm(mesh.shape["data"], config.data.batch_multiple)
  if program == "train":
    unit = math.lcm(unit, mesh.shape["data"] * config.train.grad_accum_steps)
  return unit


def _check_rows(rows: int, unit: int, program: str) -> None:
  if rows < unit or rows % unit:
    raise ValueError(f"a {program} batch of {rows} rows: rows must be a positive multiple of "
                     f"{unit} (the mesh's data axis, data.batch_multiple and, for train, "
                     "train.grad_accum_steps microbatches)")


def default_rows(config: ExperimentConfig, mesh: Mesh, program: str, length: int) -> int:
  """The batch the run itself would use: a training batch of ``length`` tokens (the token
  budget's rows), an evaluation batch, or a translation batch of ``data.eval_batch_size``;
  rounded up to the row unit."""
  rows = bucket_rows(config.data, length) if program == "train" else config.data.eval_batch_size
  unit = row_unit(config, mesh, program)
  return max(unit, -(-rows // unit) * unit)


def _model(config: ExperimentConfig, model: nn.Module | None, program: str) -> nn.Module:
  if model is not None:
    return model
  if program in ("train", "eval"):  # the training loop computes in train.compute_dtype
    return step_lib.build_model(config.model, compute_dtype=config.train.compute_dtype)
  return step_lib.build_model(config.model)


def train_program(config: ExperimentConfig, mesh: Mesh, *, rows: int | None = None,
                  length: int | None = None, model: nn.Module | None = None) -> Program:
  """One optimizer update (``make_train_step``), the state sharded as ``config.train`` says.

  With ``data.packing`` the batch is packed as the input pipeline builds it: rows of
  the largest bucket (``train_length``) with the four packing keys
  (``models.base.PACKING_KEYS``) beside inputs and targets, and ``settings`` says
  ``packing: True``.
  """
  train = config.train
  sharding_lib.check_model_parallelism(config.model, train.model_parallelism)
  length = length or train_length(config)
  rows = rows or default_rows(config, mesh, "train", length)
  _check_rows(rows, row_unit(config, mesh, "train"), "train")
  model = _model(config, model, "train")
  state, jitted = step_lib.abstract_train_program(model, train, mesh=mesh)
  batch = {"inputs": _rows_spec(mesh, rows, length), "targets": _rows_spec(mesh, rows, length)}
  if config.data.packing:
    batch.update({key: _rows_spec(mesh, rows, length) for key in PACKING_KEYS})
  return Program("train", jitted, (state, batch, _key(mesh)), rows, length, length, {
      "parameter_sharding": train.parameter_sharding,
      "model_parallelism": train.model_parallelism,
      "grad_accum_steps": train.grad_accum_steps, "compute_dtype": train.compute_dtype,
      "packing": config.data.packing})


def eval_program(config: ExperimentConfig, mesh: Mesh, *, rows: int | None = None,
                 length: int | None = None, model: nn.Module | None = None) -> Program:
  """The validation loss of one batch (``make_eval_step``), parameters as in training."""
  train = config.train
  length = length or longest_bucket(config)
  rows = rows or default_rows(config, mesh, "eval", length)
  _check_rows(rows, row_unit(config, mesh, "eval"), "eval")
  model = _model(config, model, "eval")
  state, _ = step_lib.abstract_train_program(model, train, mesh=mesh)  # for its shardings
  jitted = step_lib.make_eval_step(model, mesh=mesh, params=state.params,
                                   label_smoothing=train.label_smoothing)
  batch = {"inputs": _rows_spec(mesh, rows, length), "targets": _rows_spec(mesh, rows, length)}
  return Program("eval", jitted, (state.params, batch), rows, length, length, {
      "parameter_sharding": train.parameter_sharding,
      "model_parallelism": train.model_parallelism, "compute_dtype": train.compute_dtype})


def _replicated_params(model: nn.Module, mesh: Mesh) -> Any:
  if hasattr(type(model), "_unquantized_type"):  # int8 weights (quantization.quantized_model)
    shapes = quantization.abstract_params(model)
  else:
    shapes = jax.eval_shape(lambda: step_lib.init_params(model, jax.random.key(0)))
  return _abstract(shapes, jax.tree.map(lambda _: NamedSharding(mesh, P()), shapes))


def _decode_settings(model: nn.Module, decode: DecodeConfig, length: int) -> tuple[DecodeConfig,
                                                                                   int]:
  max_decode_len = decode_length(model, length, decode)
  return dataclasses.replace(decode, max_decode_len=max_decode_len), max_decode_len


def _source_len(config: ExperimentConfig, model: nn.Module, length: int | None) -> int:
  if length:
    return length
  model_max = getattr(getattr(model, "config", None), "max_len", None) or 1 << 30
  return min(config.data.max_source_len, model_max)


def generate_program(config: ExperimentConfig, mesh: Mesh, *, rows: int | None = None,
                     length: int | None = None, model: nn.Module | None = None) -> Program:
  """A batch's translation as ``Translator`` runs it (``search_program``): encode, then
  ``config.decode``'s search with its output limit for sources of ``length`` tokens."""
  from seq2seq_jax.inference.translator import search_program  # pylint: disable=import-outside-toplevel
  model = _model(config, model, "generate")
  length = _source_len(config, model, length)
  rows = rows or default_rows(config, mesh, "generate", length)
  _check_rows(rows, row_unit(config, mesh, "generate"), "generate")
  decode, max_decode_len = _decode_settings(model, config.decode, length)
  jitted = search_program(model, decode, mesh)
  args = (_replicated_params(model, mesh), _rows_spec(mesh, rows, length), _key(mesh))
  return Program("generate", jitted, args, rows, length, max_decode_len, _search_settings(decode))


def _search_settings(decode: DecodeConfig) -> dict[str, Any]:
  beams = decode.beam_size if decode.method == "beam" else 1
  return {"method": decode.method, "beam_size": beams, "max_decode_len": decode.max_decode_len}


def score_program(config: ExperimentConfig, mesh: Mesh, *, rows: int | None = None,
                  length: int | None = None, model: nn.Module | None = None) -> Program:
  """Forced decoding (``Translator.score``, ``translate --score-references``):
  the log-probability of every target token of a batch of pairs."""
  from seq2seq_jax.inference.translator import score_program as build  # pylint: disable=import-outside-toplevel
  model = _model(config, model, "score")
  length = _source_len(config, model, length)
  rows = rows or default_rows(config, mesh, "score", length)
  _check_rows(rows, row_unit(config, mesh, "score"), "score")
  args = (_replicated_params(model, mesh), _rows_spec(mesh, rows, length),
          _rows_spec(mesh, rows, length))
  return Program("score", build(model, mesh), args, rows, length, length, {})


def decode_step_program(config: ExperimentConfig, mesh: Mesh, *, rows: int | None = None,
                        length: int | None = None, model: nn.Module | None = None) -> Program:
  """One iteration of ``config.decode``'s search at its last position, without loops.

  The model's ``decode_step`` over a full cache (read as one block,
  ``attention.cache_reads_in_one_block``), the log-softmax, and the choice: argmax
  (greedy), or the best 2W of each sentence's W x V continuations and the cache's
  reordering (beam search). Every step of a search costs at most this much.
  """
  model = _model(config, model, "generate")
  length = _source_len(config, model, length)
  rows = rows or default_rows(config, mesh, "generate", length)
  _check_rows(rows, row_unit(config, mesh, "generate"), "generate")
  decode, max_decode_len = _decode_settings(model, config.decode, length)
  beams = decode.beam_size if decode.method == "beam" else 1
  params = _replicated_params(model, mesh)

  def memory_and_cache(params, inputs_BS):
    memory = model.apply({"params": params}, inputs_BS, method="encode")
    cache = model.apply({"params": params}, memory, max_decode_len, method="init_cache")
    return expand_to_beams(memory, beams), expand_to_beams(cache, beams)

  rows_sharding = NamedSharding(mesh, P("data"))
  with activation_sharding(mesh):
    memory, cache = jax.eval_shape(memory_and_cache, params,
                                   jax.ShapeDtypeStruct((rows, length), jnp.int32))
  shard = lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=rows_sharding if x.ndim else NamedSharding(mesh, P()))
  # Inside the search's loop the cache is loop state, laid out as the step needs it:
  # its layout here is the compiler's choice too, not the row-major one of an argument.
  memory, cache = jax.tree.map(shard, memory), jax.tree.map(shard, cache)
  free_cache = jax.tree.map(lambda x: Format(Layout.AUTO, x.sharding), cache)

  def step(params, memory, tokens_N, cache):
    with activation_sharding(mesh), cache_reads_in_one_block():
      if isinstance(cache, dict) and "index" in cache:  # the last position: the whole cache
        cache = dict(cache, index=jnp.asarray(max_decode_len - 1, jnp.int32))
      logits_NV, cache = model.apply({"params": params}, memory, tokens_N, cache,
                                     method="decode_step")
      logprobs_NV = log_softmax(logits_NV.astype(jnp.float32))
      if beams == 1:
        return selection.argmax(logprobs_NV), cache
      vocab = logprobs_NV.shape[-1]
      scores_BK, flat_BK = selection.top_k_of_rows(logprobs_NV.reshape(rows, beams, vocab),
                                                   2 * beams)
      # The live beams continue the best W candidates' parents (the KVCache moves its slots).
      cache = gather_beams(cache, flat_BK[:, :beams] // vocab, flat=True)
      return (flat_BK % vocab, scores_BK), cache

  tokens = _rows_spec(mesh, rows * beams)
  fixed = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
  jitted = jax.jit(step, donate_argnums=3, out_shardings=(None, free_cache),
                   in_shardings=(fixed(params), fixed(memory), fixed(tokens), free_cache))
  return Program("decode_step", jitted, (params, memory, tokens, cache), rows, length,
                 max_decode_len, _search_settings(decode))


BUILDERS: dict[str, Callable[..., Program]] = {
    "train": train_program, "eval": eval_program, "generate": generate_program,
    "score": score_program, "decode_step": decode_step_program}


def build_program(name: str, config: ExperimentConfig, mesh: Mesh, **kwargs: Any) -> Program:
  """The program ``name`` (``PROGRAMS``, or ``"decode_step"``) of ``config`` on ``mesh``."""
  if name not in BUILDERS:
    raise ValueError(f"unknown program {name!r}; known: {', '.join(BUILDERS)}")
  return BUILDERS[name](config, mesh, **kwargs)
