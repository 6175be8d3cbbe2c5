"""Helpers the benchmark scripts share: FLOP counts, the matmul peak, honest timing.

FLOPs count matrix multiplications only (2 per multiply-add), the convention of
model FLOP utilisation: softmax, LayerNorm and the optimizer are left out. A
training step costs three forward passes (the backward pass multiplies twice per
forward matmul). ``matmul_flops`` counts the same thing from a function's jaxpr,
which is how the config formulas are tested.

Timing blocks on every result (JAX dispatches asynchronously) and reports the
first call, which compiles, apart from the steady-state calls.

Example:
  >>> config = TransformerConfig(vocab_size=8000, model_dim=256, num_heads=4, mlp_dim=1024,
  ...                            num_encoder_layers=3, num_decoder_layers=3)
  >>> round(transformer_flops_per_token(config, source_len=24, target_len=24) / 1e6, 1)
  46.0
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax.configs import TransformerConfig
from seq2seq_jax.types import EOS_ID, NEG_INF, PAD_ID, Array, PyTree

QUICK_ENV = "SEQ2SEQ_JAX_QUICK"


def quick_mode(environ: Mapping[str, str] | None = None) -> bool:
  """True when ``SEQ2SEQ_JAX_QUICK`` is set to 1/true/yes in ``environ`` (default:
  ``os.environ``): benchmarks and notebooks shrink to CI size."""
  return (os.environ if environ is None else environ).get(QUICK_ENV, "").lower() in (
      "1", "true", "yes")


def argument_parser(script: str, doc: str | None) -> argparse.ArgumentParser:
  """A benchmark script's flags: ``--out`` (default ``results/NAME.json`` beside the
  script) and ``--plot``; the script adds its own, then calls ``parse_args``.

  Args:
    script: the script's ``__file__``; its name is the benchmark's.
    doc: its ``__doc__``, whose first line describes it in ``--help``.
  """
  path = pathlib.Path(script).resolve()
  parser = argparse.ArgumentParser(description=(doc or path.stem).splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path,
                      default=path.parent / "results" / f"{path.stem}.json")
  parser.add_argument("--plot", type=pathlib.Path, default=None, help="PNG path (optional)")
  return parser


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
  """A benchmark script's ``parser.parse_args()`` plus ``--default-malloc``.

  Unless that flag is given, the process then restarts once with the library's
  malloc setting (``allocator.reexec_with_tuned_malloc``), so the script measures
  what ``seq2seq-jax`` runs with.
  """
  from seq2seq_jax import allocator  # noqa: PLC0415

  parser.add_argument("--default-malloc", action="store_true",
                      help="keep glibc's malloc defaults (else restart with the setting of "
                           "seq2seq_jax.allocator)")
  args = parser.parse_args()
  if not args.default_malloc:
    allocator.reexec_with_tuned_malloc()
  return args


# --------------------------------------------------------------------------- FLOPs


def transformer_flops_per_token(config: TransformerConfig, *, source_len: int, target_len: int,
                                training: bool = True) -> float:
  """Matmul FLOPs per target token of one Transformer pass over a (source, target) pair.

  Counts what the library's Transformer computes (``models/transformer.py``): per
  source token and encoder layer the Q/K/V/O projections (8 D^2), attention scores
  and weighted values over all S keys (4 S D) and the feed-forward layer (4 D F);
  per source token and decoder layer the cross-attention keys and values (4 D^2);
  per target token and decoder layer causal self attention computed over all T
  keys (8 D^2 + 4 T D), the cross-attention query and output (4 D^2) and its
  attention over S keys (4 S D), the feed-forward layer (4 D F, each side its own
  F); and the output projection (2 D V). Embedding lookups are gathers and cost nothing here.

  Args:
    config: the model.
    source_len: S, padded source length (padding costs as much as real tokens).
    target_len: T, padded target length.
    training: forward and backward (3x the forward), else the forward only.

  Returns:
    FLOPs of the whole pass divided by ``target_len``.
  """
  d, v = config.model_dim, config.output_vocab_size
  f_encoder, f_decoder = config.encoder_stack.mlp_dim, config.decoder_stack.mlp_dim
  s, t = source_len, target_len
  encoder_per_source = config.num_encoder_layers * (8 * d * d + 4 * s * d + 4 * d * f_encoder)
  cross_kv_per_source = config.num_decoder_layers * 4 * d * d
  decoder_per_target = config.num_decoder_layers * (
      8 * d * d + 4 * t * d + 4 * d * d + 4 * s * d + 4 * d * f_decoder)
  forward = s * (encoder_per_source + cross_kv_per_source) + t * (decoder_per_target + 2 * d * v)
  return (3.0 if training else 1.0) * forward / t


def _dot_general_flops(eqn) -> int:
  lhs, rhs = (var.aval for var in eqn.invars[:2])
  (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
  rhs_free = [size for axis, size in enumerate(rhs.shape)
              if axis not in rhs_contract and axis not in rhs_batch]
  return 2 * math.prod(lhs.shape) * math.prod(rhs_free)


def _jaxpr_matmul_flops(jaxpr) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      total += _dot_general_flops(eqn)
      continue
    if eqn.primitive.name == "while":
      raise ValueError("matmul_flops cannot count a while_loop (unknown trip count); count "
                       "its body separately")
    if eqn.primitive.name == "cond":
      total += max(_jaxpr_matmul_flops(branch.jaxpr) for branch in eqn.params["branches"])
      continue
    multiplier = eqn.params["length"] if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      inner = getattr(value, "jaxpr", value)  # ClosedJaxpr -> Jaxpr
      if isinstance(inner, jax.extend.core.Jaxpr):
        total += multiplier * _jaxpr_matmul_flops(inner)
  return total


def matmul_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
  """Matmul FLOPs (2 per multiply-add of every ``dot_general``) of ``fn(*args, **kwargs)``.

  Traced, never run: arguments may be ``jax.ShapeDtypeStruct``. Scans count their
  body ``length`` times; a ``cond`` counts its costliest branch; a ``while_loop``
  raises, its trip count being unknown.

  Example:
    >>> matmul_flops(jnp.dot, jnp.ones((2, 3)), jnp.ones((3, 5)))
    60
  """
  return _jaxpr_matmul_flops(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)


def train_flops_per_token(model: nn.Module, params: PyTree, *, batch_size: int, source_len: int,
                          target_len: int) -> float:
  """Matmul FLOPs per target token of a training step's gradient, counted from its jaxpr.

  For models without a closed-form count (the recurrent ones): the gradient of
  the teacher-forced loss of ``model`` on a ``[batch_size, source_len]`` /
  ``[batch_size, target_len]`` batch, divided by the batch's target tokens.
  """
  inputs_BS = jax.ShapeDtypeStruct((batch_size, source_len), jnp.int32)
  targets_BT = jax.ShapeDtypeStruct((batch_size, target_len), jnp.int32)

  def loss(params, inputs_BS, targets_BT):
    logits_BTV = model.apply({"params": params}, inputs_BS, targets_BT)
    return jnp.sum(logits_BTV)

  return matmul_flops(jax.grad(loss), params, inputs_BS, targets_BT) / (batch_size * target_len)


def measure_matmul_peak(*, size: int = 2048, repeats: int = 5,
                        dtype: Any = jnp.float32) -> float:
  """The best matmul rate XLA reaches here, in FLOP/s: the denominator of utilisation.

  Times a jitted chain of eight ``[size, size]`` matmuls (so dispatch is amortised)
  and keeps the fastest of ``repeats`` runs: the attainable peak, not an average.
  """
  chain = 8
  a = jax.random.normal(jax.random.key(0), (size, size), dtype) / math.sqrt(size)

  @jax.jit
  def run(x):
    return jax.lax.fori_loop(0, chain, lambda _, y: y @ a, x)

  timing = time_fn(lambda: run(a), repeats=repeats)
  return chain * 2 * size ** 3 / timing.min_s


# --------------------------------------------------------------------------- timing


@dataclasses.dataclass(frozen=True)
class Timing:
  """Wall-clock seconds of repeated calls; ``first_s`` (which compiles) is kept apart."""

  first_s: float
  times_s: tuple[float, ...]

  @property
  def median_s(self) -> float:
    return statistics.median(self.times_s)

  @property
  def min_s(self) -> float:
    return min(self.times_s)

  def to_dict(self) -> dict[str, Any]:
    return {"first_s": self.first_s, "median_s": self.median_s, "min_s": self.min_s,
            "times_s": list(self.times_s)}


def block(result: Any) -> Any:
  """Waits for every JAX array in ``result`` (other leaves, e.g. torch tensors, pass)."""
  for leaf in jax.tree.leaves(result):
    if isinstance(leaf, jax.Array):
      leaf.block_until_ready()
  return result


def _timed(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  block(fn())
  return time.perf_counter() - start


def time_fn(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1) -> Timing:
  """Times ``fn()`` (no arguments: close over them) ``repeats`` times after ``warmup`` calls.

  Every call is blocked on, so asynchronous dispatch cannot hide work. The first
  warmup call (compilation) is reported as ``first_s``, never in the statistics.
  """
  if repeats <= 0 or warmup <= 0:
    raise ValueError(f"repeats={repeats} and warmup={warmup} must be positive")
  first = _timed(fn)
  for _ in range(warmup - 1):
    _timed(fn)
  return Timing(first_s=first, times_s=tuple(_timed(fn) for _ in range(repeats)))


def time_interleaved(fns: Mapping[str, Callable[[], Any]], *, rounds: int = 5,
                     warmup: int = 1,
                     warmup_fns: Mapping[str, Callable[[], Any]] | None = None
                     ) -> dict[str, Timing]:
  """Times several systems alternately: round r calls each once, in a rotated order.

  On a shared, noisy machine a slow spell then hits every system alike, so the
  ratio of their medians is fairer than timings taken one system after another.
  ``warmup_fns[name]``, when given, replaces ``fns[name]`` for the warm-up calls:
  the same work on a smaller input, which compiles the same programs in less time.
  """
  if rounds <= 0 or warmup <= 0:
    raise ValueError(f"rounds={rounds} and warmup={warmup} must be positive")
  names = list(fns)
  warmups = {**fns, **(warmup_fns or {})}
  first = {}
  for name in names:
    first[name] = _timed(warmups[name])
    for _ in range(warmup - 1):
      _timed(warmups[name])
  times = {name: [] for name in names}
  for r in range(rounds):
    for i in range(len(names)):
      name = names[(r + i) % len(names)]
      times[name].append(_timed(fns[name]))
  return {name: Timing(first_s=first[name], times_s=tuple(times[name])) for name in names}


# --------------------------------------------------------------------------- workloads


def synthetic_batch(rng: np.random.Generator, *, batch_size: int, source_len: int,
                    target_len: int, vocab_size: int) -> dict[str, np.ndarray]:
  """A full-length training batch: random piece ids (never PAD/BOS/EOS/UNK) ending in EOS."""
  def rows(length):
    tokens = rng.integers(4, vocab_size, size=(batch_size, length), dtype=np.int32)
    tokens[:, -1] = EOS_ID
    return tokens
  return {"inputs": rows(source_len), "targets": rows(target_len)}


@dataclasses.dataclass
class TrainStepRunner:
  """A ready training step on fixed synthetic data: ``runner()`` runs one update.

  Built by ``make_train_step_runner``; ``runner.state`` advances with each call
  (the step donates its input state). ``runner.model`` and ``runner.params`` give
  what the FLOP counters need.
  """

  model: nn.Module
  state: Any
  step: Callable[..., Any]
  batch: dict[str, Array]
  rng: Array
  tokens: int  # target tokens per batch, padding included

  @property
  def params(self) -> PyTree:
    return self.state.params

  def __call__(self) -> dict[str, Array]:
    self.state, metrics = self.step(self.state, self.batch, self.rng)
    return metrics


def make_train_step_runner(model_config: Any, *, batch_size: int, source_len: int,
                           target_len: int, train_config: Any = None,
                           device: Any = None) -> TrainStepRunner:
  """The library's jitted, donated train step on one device and a full synthetic batch.

  Args:
    model_config: a ``TransformerConfig`` or ``RNNConfig``.
    batch_size, source_len, target_len: the batch shape (no padding).
    train_config: optimiser settings (default: ``TrainConfig(label_smoothing=0.1)``, clipping on).
    device: the one device to run on (default: the first).
  """
  from seq2seq_jax.configs import TrainConfig  # noqa: PLC0415 (keeps the import graph light)
  from seq2seq_jax.training import step as train_lib  # noqa: PLC0415
  from seq2seq_jax.training.optimizer import make_optimizer  # noqa: PLC0415
  from seq2seq_jax.training.schedules import make_schedule  # noqa: PLC0415

  train_config = train_config or TrainConfig(label_smoothing=0.1, warmup_steps=100)
  mesh = train_lib.make_mesh(devices=[device or jax.devices()[0]])
  model = train_lib.build_model(model_config)
  schedule = make_schedule(train_config)
  optimizer = make_optimizer(train_config, schedule)
  state = train_lib.create_train_state(model, optimizer, rng=jax.random.key(0), mesh=mesh)
  step = train_lib.make_train_step(model, optimizer, schedule, mesh=mesh, state=state,
                                   label_smoothing=train_config.label_smoothing)
  host_batch = synthetic_batch(np.random.default_rng(0), batch_size=batch_size,
                               source_len=source_len, target_len=target_len,
                               vocab_size=model_config.vocab_size)
  return TrainStepRunner(model=model, state=state, step=step,
                         batch=train_lib.shard_batch(host_batch, mesh), rng=jax.random.key(1),
                         tokens=batch_size * target_len)


def model_train_flops_per_token(runner: TrainStepRunner, *, batch_size: int, source_len: int,
                                target_len: int) -> tuple[float, str]:
  """Training FLOPs per target token: the config formula for a Transformer, else the jaxpr.

  Returns ``(flops, "config formula" | "jaxpr count")``.
  """
  config = runner.model.config
  if isinstance(config, TransformerConfig):
    return (transformer_flops_per_token(config, source_len=source_len, target_len=target_len),
            "config formula")
  return (train_flops_per_token(runner.model, runner.params, batch_size=batch_size,
                                source_len=source_len, target_len=target_len), "jaxpr count")


class SuppressEOS(nn.Module):
  """Wraps a model so ``decode_step`` never predicts EOS: every output has the full length.

  For benchmarks with random weights: decoding then runs exactly ``max_decode_len``
  steps, the same work as a peer told ``min_new_tokens = max_new_tokens``. The
  wrapped model's parameters sit under ``"model"``: pass ``{"model": params}`` to
  ``generate`` (``{"params": {"model": params}}`` to ``apply``). Teacher-forced
  ``decode`` is masked the same way, so ``generate_uncached`` agrees with ``generate``.

  Example:
    >>> from seq2seq_jax import DecodeConfig, Transformer, generate
    >>> model = Transformer(TransformerConfig(vocab_size=32, model_dim=16, num_heads=2,
    ...                                       mlp_dim=32))
    >>> inputs_BS = jnp.array([[5, 6, 2]])
    >>> params = model.init(jax.random.key(0), inputs_BS, inputs_BS)["params"]
    >>> tokens, _ = generate(SuppressEOS(model), {"model": params}, inputs_BS,
    ...                      DecodeConfig(max_decode_len=64))
    >>> int((tokens == EOS_ID).sum()), tokens.shape  # no EOS: all 64 tokens
    (0, (1, 64))
  """

  model: nn.Module

  def encode(self, inputs_BS: Array, **kwargs):
    return self.model.encode(inputs_BS, **kwargs)

  def decode(self, memory: PyTree, targets_BT: Array, **kwargs):
    logits_BTV = self.model.decode(memory, targets_BT, **kwargs)
    return logits_BTV.at[..., EOS_ID].set(NEG_INF)

  def __call__(self, inputs_BS: Array, targets_BT: Array, **kwargs):
    return self.decode(self.encode(inputs_BS), targets_BT, **kwargs)

  def init_cache(self, memory: PyTree, max_decode_len: int):
    return self.model.init_cache(memory, max_decode_len)

  def decode_step(self, memory: PyTree, tokens_B: Array, cache: PyTree):
    logits_BV, cache = self.model.decode_step(memory, tokens_B, cache)
    return logits_BV.at[:, EOS_ID].set(NEG_INF), cache

  @property
  def config(self):
    """The wrapped model's config (``generate`` reads its ``max_len``)."""
    return self.model.config


def synthetic_sources(rng: np.random.Generator, *, num_sentences: int, source_len: int,
                      vocab_size: int) -> np.ndarray:
  """int32 ``[N, S]`` source rows: random pieces then EOS, no padding."""
  tokens = rng.integers(4, vocab_size, size=(num_sentences, source_len), dtype=np.int32)
  tokens[:, -1] = EOS_ID
  assert not (tokens == PAD_ID).any()
  return tokens


# --------------------------------------------------------------------------- reporting


def machine_info() -> dict[str, Any]:
  """What ran the benchmark: CPU model and count, backend, devices, library versions."""
  cpu = platform.processor()
  generation = {}  # family and model: tell a Zen 4 (25, 17) from a Zen 5 (26, 2)
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      key, _, value = (part.strip() for part in line.partition(":"))
      if key == "model name":
        cpu = value
      elif key in ("cpu family", "model"):
        generation.setdefault({"cpu family": "cpu_family", "model": "cpu_model"}[key], value)
      elif not line.strip() and generation:
        break
  except OSError:
    pass
  import flax  # noqa: PLC0415 (only for its version)

  from seq2seq_jax import allocator  # noqa: PLC0415
  from seq2seq_jax import platforms  # noqa: PLC0415
  return {"cpu": cpu, **generation, "cpu_count": os.cpu_count(),
          "instruction_set": platforms.cpu_instruction_set(),
          "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()], "python": platform.python_version(),
          "jax": jax.__version__, "flax": flax.__version__, "quick": quick_mode(),
          "malloc_tuned": allocator.malloc_is_tuned(),
          "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
  """A plain-text table of ``rows`` (dicts); floats get 4 significant digits."""
  if not rows:
    return "(no rows)"
  columns = list(columns or rows[0].keys())

  def cell(value):
    if isinstance(value, float):
      return f"{value:.4g}"
    return str(value)

  cells = [[cell(row.get(c, "")) for c in columns] for row in rows]
  widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
  lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths)),
           "  ".join("-" * w for w in widths)]
  lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
  return "\n".join(lines)


def plot_rates_by_task(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, *,
                       rate_key: str = "tokens/s",
                       xlabel: Callable[[str], str] = lambda task: "generated tokens / s") -> None:
  """One horizontal bar chart per ``row["task"]``: ``row[rate_key]`` of each ``row["system"]``."""
  tasks = list(dict.fromkeys(r["task"] for r in rows))
  with saved_figure(path, columns=len(tasks), size=(3.8 * len(tasks), 3.4)) as axes:
    for ax, task in zip(axes, tasks):
      points = [r for r in rows if r["task"] == task]
      ax.barh([r["system"] for r in points], [r[rate_key] for r in points])
      ax.set_title(task)
      ax.set_xlabel(xlabel(task))


@contextlib.contextmanager
def saved_figure(path: str | os.PathLike, *, columns: int = 1,
                 size: tuple[float, float] = (6, 4)) -> Iterator[Sequence[Any]]:
  """Yields a row of ``columns`` matplotlib axes; on leaving, saves the figure to ``path``
  (PNG, 120 dpi) and closes it. matplotlib is imported only here: plots are optional."""
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, axes = plt.subplots(1, columns, figsize=size, squeeze=False)
  try:
    yield list(axes[0])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
  finally:
    plt.close(fig)


def report(args: argparse.Namespace, payload: Mapping[str, Any], *,
           plot: Callable[[Sequence[Mapping[str, Any]], pathlib.Path], None] | None = None
           ) -> pathlib.Path:
  """The ending every benchmark script shares: ``payload`` as JSON at ``args.out``
  (``write_json``) and, when ``--plot`` was given, ``plot(payload["rows"], args.plot)``
  (default ``plot_rates_by_task``); prints where each went. Returns the JSON's path."""
  path = write_json(args.out, payload)
  print(f"wrote {path}")
  if getattr(args, "plot", None):
    (plot or plot_rates_by_task)(payload["rows"], args.plot)
    print(f"wrote {args.plot}")
  return path


def import_peers(out: str | os.PathLike, benchmark: str) -> tuple[Any, Any, Any] | None:
  """``(ctranslate2, torch, transformers)`` with torch on all cores, or None when the
  ``bench`` extra is missing (then a JSON saying so is written to ``out``)."""
  try:
    import ctranslate2  # noqa: PLC0415
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
  except ImportError as error:
    print(f"skipped: {error}; `make setup` installs torch, transformers and ctranslate2")
    write_json(out, {"benchmark": benchmark, "skipped": str(error)})
    return None
  torch.set_num_threads(os.cpu_count() or 1)
  return ctranslate2, torch, transformers


def write_json(path: str | os.PathLike, payload: Mapping[str, Any]) -> pathlib.Path:
  """Writes ``payload`` plus ``machine_info()`` as indented JSON; returns the path."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"machine": machine_info(), **payload}, indent=2) + "\n")
  return path
