"""Compile a program for a TPU target and report what the compiler says: memory, FLOPs, fit.

Every number here is derived from the TPU compiler (libtpu) run on this machine,
not measured on a TPU. Per chip: the bytes of arguments, temporaries, outputs and
generated code (``compiled.memory_analysis()``), whether they fit the chip's HBM
(a program that does not fit fails to compile; its report says ``fits: false``
with the compiler's message), and the FLOPs and bytes accessed of
``compiled.cost_analysis()``. The estimated step time is the larger of FLOPs over
the chip's bfloat16 peak and bytes over its HBM bandwidth (``targets.CHIPS``), and
the implied MFU is FLOPs over that time and the peak: a roofline, an optimistic
bound rather than a prediction.

Beside it, the compiler's own cycle estimate (``cycles_step_seconds``, "cyc. ms"), the
estimate to plan with: the TPU compiler writes an ``estimated_cycles`` on every scheduled
instruction; their sum (loop bodies times their trips) is turned into seconds by the cycles
the same compiler estimates for a large bfloat16 matmul on the chip, taken to run at the
published peak (``cycle_seconds``, ``cycles_per_second``). No measured step enters it. It
charges what the roofline cannot see (matrix shapes that fill the matrix units badly,
vector work such as dropout's random bits), adds up instructions that may overlap, and
leaves out collectives (the compiler writes no cycles on them). Published training steps
of the Transformer big (einsum attention) took, as a multiple of it, TPU v3: 0.57-1.38x (5
runs, 4 programs, 4 upper bounds); TPU v4: 0.39-0.54x (3 runs, 2 programs, 3 upper bounds):
the lowest and highest ratio observed (``STEP_RANGES``, from benchmarks/tpu_anchors.py's
runs), not an interval with a stated coverage. v5e, v5p and v6e have no published run and
no range. A report's ``step_range_seconds`` is its estimate times its generation's range.

A packed training program (``data.packing``) has rows of the largest bucket, every
slot of which the compiler costs; how many slots hold real tokens depends on the
corpus, which a compile never sees. The report assumes ``ASSUMED_PACKING_FILL``
(measured on a WMT-sized stand-in corpus, see there) and says so.

XLA's cost analysis counts the body of a loop once. Every trip is counted here
in one of two ways, and the report says which (``loops``):

- loops of a fixed length (``lax.scan`` over time in the recurrent models, a
  ``fori_loop``): their trip counts are read off the compiled program
  (``hlo.loop_trips``), and what the compiler's single count leaves out, the body
  times (trips - 1), is added (``hlo.loop_costs``);
- a search's loop, which stops when every row is done: one step is compiled without
  loops (``programs.decode_step``, at the last position: the whole cache read) and
  multiplied by the output limit; ``search`` holds the whole search beside the step.

A program with a loop whose trips neither way can count gives no time and no MFU:
``loops_counted_once`` is set and ``loops`` says which loop.

Fused attention kernels (``attention_impl="splash"`` or ``"auto"`` on a TPU) are custom
calls that XLA's cost analysis counts as no FLOPs and the compiler writes no cycle
estimate for. Their FLOPs are counted by formula (``hlo.kernel_flops``: the products
each kernel computes over the blocks it runs) and added to the program's
(``kernel_flops_per_chip``); the cycle estimate adds their time at the chip's peak
(a floor for the kernels' share), and ``kernels`` says so. No time or MFU leaves a
kernel out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

from seq2seq_jax.aot import programs as programs_lib
from seq2seq_jax.aot.hlo import hbm_traffic, loop_costs
from seq2seq_jax.aot.targets import CHIPS, Target, parse_target, target_devices, target_mesh
from seq2seq_jax.configs import ExperimentConfig

GiB = 2 ** 30

# Turns a lowered program into a compiled one (``compile_program``'s ``compiler``).
Compiler = Callable[[Any], Any]

# The share of a packed row's token slots that hold real tokens, assumed by the reports of
# packed training programs (a compile has no data); the one fill figure of the project,
# which the WMT presets and guides refer to. Measured on 2026-11-28 by
# benchmarks/input_pipeline.py (RESULTS.md, "Input pipeline"): the packer
# (``data.pipeline.pack_rows``) on the WMT'14-sized stand-in (4,508,785 pairs with word
# counts drawn to match WMT'14's English side, a 32,000-piece vocabulary, 35.0 + 34.3
# tokens a pair) in the WMT presets' rows of 256 a side left 3.7 % of the slots empty; the
# presets' buckets (16 ... 256) left 19.6 % of theirs. WMT'14 itself is not measured here,
# and another corpus fills otherwise: a run's ``TrainStats.padding_fraction`` is its own.
ASSUMED_PACKING_FILL = 0.963
BUCKETING_FILL_MEASURED = 0.804  # the same corpus bucketed, for the comparison in the table


@dataclasses.dataclass(frozen=True)
class StepRange:
  """What published training steps of one TPU generation took, as a multiple of the
  report's cycle estimate: the lowest and highest ratio of its runs, nothing fitted.

  Attributes:
    low: the smallest ratio (measured step / ``cycles_step_seconds``), rounded down to
      two decimals.
    high: the largest, rounded up to two decimals.
    runs: the published runs it is the range of.
    programs: the distinct programs among them (two runs with the same batch a device on
      slices of different size compile to one device program, but for its collectives).
    upper_bounds: the runs whose measured time is an upper bound (an evaluation inside the
      timed interval), the rest being exact.
  """

  low: float
  high: float
  runs: int
  programs: int
  upper_bounds: int

  def text(self) -> str:
    """``"0.57-1.38x (5 runs, 4 programs, 4 upper bounds)"``, as tables and guides print it."""
    counts = [(self.runs, "run"), (self.programs, "program"), (self.upper_bounds, "upper bound")]
    return f"{self.low:.2f}-{self.high:.2f}x (" + ", ".join(
        f"{n} {word}{'s' * (n != 1)}" for n, word in counts) + ")"


# Published training steps' time over the report's cycle estimate (``cycles_step_seconds``,
# "cyc. ms"), per chip generation: the observed range of the published runs of that
# generation in benchmarks/tpu_anchors.py, which prints these figures from its JSON
# (tests/aot/test_anchors.py checks them against it). All the runs are of einsum-attention
# programs. A generation with no published run has no range: none is borrowed from another.
STEP_RANGES: dict[str, StepRange] = {
    "v3": StepRange(low=0.57, high=1.38, runs=5, programs=4, upper_bounds=4),
    "v4": StepRange(low=0.39, high=0.54, runs=3, programs=2, upper_bounds=3),
}


def step_range(chip: str) -> StepRange | None:
  """``STEP_RANGES``' range for chip generation ``chip`` (``"v3"``), or ``None``: no
  published run."""
  return STEP_RANGES.get(chip)


def range_text(chip: str) -> str:
  """``"0.57-1.38x (5 runs, 4 programs, 4 upper bounds)"``: the range of ``chip`` as the
  tables and guides print it, or ``"not measured (no published run)"``."""
  observed = step_range(chip)
  return "not measured (no published run)" if observed is None else observed.text()


def step_range_seconds(chip: str, cycles_step_seconds: float | None
                       ) -> tuple[float, float] | None:
  """``cycles_step_seconds`` times ``chip``'s ``STEP_RANGES`` range: the step times the
  published runs' ratios would give; ``None`` without an estimate or a range."""
  observed = step_range(chip)
  if observed is None or cycles_step_seconds is None:
    return None
  return observed.low * cycles_step_seconds, observed.high * cycles_step_seconds


@dataclasses.dataclass
class CompileReport:
  """What the TPU compiler says about one program on one target (per chip unless named).

  "Per chip" is per JAX device: on v3, whose TensorCores are two devices a chip, per
  TensorCore, against half the chip's HBM, FLOPs and bandwidth.

  ``to_dict`` gives the JSON object ``seq2seq-jax compile --json`` writes.
  """

  target: str
  chip: str
  chips: int
  program: str
  model: str
  rows: int
  source_len: int
  target_len: int
  tokens_per_step: int
  settings: dict[str, Any]
  per_chip_bytes: dict[str, int]
  hbm_bytes_per_chip: int
  fits: bool
  flops_per_chip: float | None
  bytes_accessed_per_chip: float | None
  estimated_step_seconds: float | None
  estimated_mfu: float | None
  compile_seconds: float
  loops_counted_once: bool = False  # some loop's trips unknown: no time, no MFU
  loops: str = ""  # the program's loops, their trips, and how they were counted
  hbm_traffic_per_chip: float | None = None
  hbm_step_seconds: float | None = None
  hbm_mfu: float | None = None
  cycles_step_seconds: float | None = None  # the compiler's cycle estimate (see the module)
  cycles_mfu: float | None = None
  # cycles_step_seconds times the chip generation's STEP_RANGES (step_range_seconds): the
  # step the published runs' ratios would give; None where the generation has none.
  step_range_seconds: tuple[float, float] | None = None
  kernel_flops_per_chip: float | None = None  # fused kernels' FLOPs by formula, in flops_per_chip
  # The model's configured attention_impl (einsum, xla, cudnn, splash, auto); "" for a model
  # without one. STEP_RANGES are of einsum programs; the table says so beside any other.
  attention_impl: str = ""
  kernels: str = ""  # the fused kernels a step calls and how they were costed
  message: str = ""
  decode_step: dict[str, Any] | None = None
  search: dict[str, Any] | None = None  # generate: the whole search for its output limit
  max_batch_probes: list[dict[str, Any]] | None = None
  max_batch_method: str = ""  # how find_max_batch found the batch
  packing: bool = False  # a packed training batch: rows of the largest bucket, several pairs each
  # Packed: tokens_per_step (slots) x ASSUMED_PACKING_FILL, an assumption, not a measurement.
  assumed_fill: float | None = None
  estimated_real_tokens_per_step: float | None = None

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def describe_model(model: nn.Module) -> str:
  """``"Transformer 6+6 d512 h8 f2048 V32000 bfloat16"``-like: what a report is about.

  Encoder and decoder that differ show both, encoder first: ``"Transformer 12+2
  d512 h8/4 f2048/1024 ..."``; T5 adds its per-head width and feed-forward form:
  ``"T5 24+24 d1024 h16 k128 f8192 gated-gelu_tanh V256000 float32"``.
  """
  config = getattr(model, "config", None)
  if config is None:
    return type(model).__name__
  if hasattr(config, "encoder_stack"):
    encoder, decoder = config.encoder_stack, config.decoder_stack
    both = lambda a, b: f"{a}" if a == b else f"{a}/{b}"
    width = f" k{config.head_dim}" if hasattr(config, "gated_ffn") else ""
    form = ""
    if hasattr(config, "gated_ffn"):
      form = f" {'gated-' if config.gated_ffn else ''}{config.activation}"
    return (f"{type(model).__name__} {encoder.num_layers}+{decoder.num_layers} "
            f"d{config.model_dim} h{both(encoder.num_heads, decoder.num_heads)}{width} "
            f"f{both(encoder.mlp_dim, decoder.mlp_dim)}{form} V{config.vocab_size} "
            f"{config.dtype}")
  if hasattr(config, "hidden_dim") and hasattr(config, "cell"):
    return (f"{type(model).__name__} {config.cell} {config.num_encoder_layers}+"
            f"{config.num_decoder_layers} h{config.hidden_dim} {config.attention} "
            f"V{config.vocab_size} {config.dtype}")
  return type(model).__name__


def _shard_bytes(tree: Any) -> int:
  """Bytes one device holds of abstract arrays with shardings (the largest shard)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shape) * leaf.dtype.itemsize
  return total


_SIZE = re.compile(r"\(([0-9.]+)([KMGT]?)\)")
_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def _is_out_of_memory(error: Exception) -> bool:
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "exceeds" in text and (
      "HBM" in text or "memory" in text)


def _compiler_message(error: Exception) -> str:
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return lines[0][:500] if lines else type(error).__name__


def _loops(compiled: Any) -> bool:
  try:
    text = compiled.as_text()
  except Exception:  # pragma: no cover - as_text is best effort on some backends
    return False
  return re.search(r"\bwhile\(", text) is not None


def _not_in_persistent_cache() -> contextlib.AbstractContextManager:
  """Keeps compile-only executables out of jax's persistent compilation cache.

  jax 0.10 writes them there when a cache directory is set, then fails to read them
  back ("PjRtCompiler must be constructed with a Client"), warning on every later
  compile of the same program. A minimum compile time no compile reaches stores none.
  """
  try:
    from jax._src import config as jax_config  # pylint: disable=import-outside-toplevel
    return jax_config.persistent_cache_min_compile_time_secs(float("inf"))
  except (ImportError, AttributeError):  # another jax: its own cache behaviour
    return contextlib.nullcontext()


def roofline(flops: float, bytes_accessed: float, target: Target) -> tuple[float, float]:
  """``(seconds, mfu)``: the larger of FLOPs / peak and bytes / bandwidth, and the FLOP
  share of the peak that time implies."""
  chip = target.chip
  seconds = max(flops / chip.device_peak_flops, bytes_accessed / chip.device_hbm_bandwidth)
  mfu = flops / (seconds * chip.device_peak_flops) if seconds > 0 else 0.0
  return seconds, mfu


# The matmul that times a compiler cycle: large enough that every generation's
# matrix units run it at their peak, [8192, 8192] x [8192, 8192] in bfloat16.
_TIMING_MATMUL = 8192


@functools.lru_cache(maxsize=None)
def _cycles_per_second(topology: str) -> float:
  target = parse_target(topology)
  n = _TIMING_MATMUL
  shape = jax.ShapeDtypeStruct((n, n), jnp.bfloat16,
                               sharding=SingleDeviceSharding(target_devices(target)[0]))
  with _not_in_persistent_cache():
    text = jax.jit(jnp.matmul).lower(shape, shape).compile().as_text()
  cycles = loop_costs(text).cycles
  return cycles / (2 * n ** 3 / target.chip.device_peak_flops) if cycles else 0.0


def cycles_per_second(target: Target) -> float:
  """The compiler's cycles a second on ``target``'s chip, timed by a matmul at peak.

  The TPU compiler's cycle estimates for an [8192, 8192] x [8192, 8192] bfloat16
  matmul on one device, over the time its FLOPs take at the published peak
  (``Chip.peak_flops``): the scale that turns a program's summed
  ``estimated_cycles`` into seconds. 0 where the compiler writes no cycles. On
  libtpu 0.0.42.1: v3 969 M, v4 1,131 M, v5e 1,712 M, v5p 1,942 M, v6e 2,486 M a
  second (v3's clock is 940 MHz: by its count the matmul runs at 97 % of peak).
  """
  if target.chip.platform != "tpu":
    return 0.0
  one_chip = f"{target.chip.name}:{'x'.join(['1'] * target.chip.dims)}"
  return _cycles_per_second(one_chip)


def cycle_seconds(cycles: float, target: Target, *, kernel_flops: float = 0.0) -> float | None:
  """The report's step estimate ("cyc. ms"): ``cycles`` of the compiler's estimate, each
  ``1 / cycles_per_second(target)`` long, plus the fused kernels' ``kernel_flops`` at the
  device's peak (their custom calls carry no cycles); ``None`` where the compiler counts
  no cycles."""
  rate = cycles_per_second(target) if cycles else 0.0
  return cycles / rate + kernel_flops / target.chip.device_peak_flops if rate else None


def compile_program(program: programs_lib.Program, target: Target, *,
                    model_name: str = "", compiler: Compiler | None = None) -> CompileReport:
  """Lowers and compiles ``program`` with the TPU compiler; the report of what it says.

  A program too large for the chip gives ``fits=False`` and the compiler's message
  (its argument bytes are still reported); any other failure raises. ``compiler``
  turns the lowered program into the compiled one (default ``lowered.compile()``);
  anything with the compiled program's ``as_text``, ``cost_analysis`` and
  ``memory_analysis`` will do (``benchmarks/tpu_anchors.py`` keeps them on disk).
  """
  start = time.perf_counter()
  arguments = _shard_bytes(program.args)
  packing = bool(program.settings.get("packing", False))
  common = dict(target=target.name, chip=target.chip.name, chips=target.chips,
                program=program.name, model=model_name, rows=program.rows,
                source_len=program.source_len, target_len=program.target_len,
                tokens_per_step=program.tokens_per_step, settings=dict(program.settings),
                hbm_bytes_per_chip=target.chip.device_hbm_bytes, packing=packing,
                assumed_fill=ASSUMED_PACKING_FILL if packing else None,
                estimated_real_tokens_per_step=(program.tokens_per_step * ASSUMED_PACKING_FILL
                                                if packing else None))
  lowered = program.jitted.lower(*program.args)
  try:
    with _not_in_persistent_cache():
      compiled = lowered.compile() if compiler is None else compiler(lowered)
  except Exception as error:  # the compiler reports an over-full program as an error
    if not _is_out_of_memory(error):
      raise
    seconds = time.perf_counter() - start
    sizes = [float(v) * _UNITS[u] for v, u in _SIZE.findall(str(error))]
    needed = int(max(sizes)) if sizes else 0
    return CompileReport(
        **common, per_chip_bytes={"arguments": arguments, "temporaries": needed, "outputs": 0,
                                  "generated_code": 0, "total": arguments + needed},
        fits=False, flops_per_chip=None, bytes_accessed_per_chip=None,
        estimated_step_seconds=None, estimated_mfu=None, compile_seconds=seconds,
        message=_compiler_message(error))
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, (list, tuple)):  # older jax: one dict per device program
    cost = cost[0] if cost else {}
  sizes = {"arguments": int(memory.argument_size_in_bytes),
           "temporaries": int(memory.temp_size_in_bytes),
           "outputs": int(memory.output_size_in_bytes),
           "generated_code": int(memory.generated_code_size_in_bytes)}
  # Donated arguments alias outputs: those bytes are held once.
  sizes["total"] = (sizes["arguments"] + sizes["outputs"] - int(memory.alias_size_in_bytes)
                    + sizes["temporaries"] + sizes["generated_code"])
  fits = sizes["total"] <= target.chip.device_hbm_bytes
  if "flops" not in cost:  # XLA's GPU compiler: no cost analysis of a compile-only executable
    return CompileReport(
        **common, per_chip_bytes=sizes, fits=fits, flops_per_chip=None,
        bytes_accessed_per_chip=None, estimated_step_seconds=None, estimated_mfu=None,
        compile_seconds=seconds, loops_counted_once=_loops(compiled),
        message="" if fits else "the program needs more memory than the chip has")
  text = compiled.as_text()
  loops = loop_costs(text)
  flops = float(cost["flops"]) + loops.extra_flops + loops.kernel_flops
  accessed = float(cost.get("bytes accessed", 0.0)) + loops.extra_bytes
  traffic = hbm_traffic(text, loops=loops.loops)
  step_seconds, mfu = roofline(flops, accessed, target)
  hbm_seconds, hbm_mfu = roofline(flops, traffic.hbm_bytes, target)
  how = ""
  if loops.loops:
    how = (f"every trip counted, trip counts read off the compiled loops: {loops.describe()}"
           if loops.counted else f"not costed in full (some trips unknown): {loops.describe()}")
  report = CompileReport(
      **common, per_chip_bytes=sizes, fits=fits, flops_per_chip=flops,
      bytes_accessed_per_chip=accessed, estimated_step_seconds=step_seconds, estimated_mfu=mfu,
      compile_seconds=seconds, loops_counted_once=not loops.counted, loops=how,
      hbm_traffic_per_chip=traffic.hbm_bytes, hbm_step_seconds=hbm_seconds, hbm_mfu=hbm_mfu,
      message="" if fits else "the program needs more memory than the chip has")
  if loops.kernel_calls:
    report.kernel_flops_per_chip = loops.kernel_flops
    calls = ", ".join(f"{count} calls of {name}" for name, count in loops.kernel_calls.items())
    report.kernels = (f"{calls}: {loops.kernel_flops / 1e9:.4g} GFLOP by formula (XLA counts "
                      "none); in the cycle estimate at the chip's peak")
  cycle_time = cycle_seconds(loops.cycles, target, kernel_flops=loops.kernel_flops)
  if cycle_time:
    report.cycles_step_seconds = cycle_time
    report.cycles_mfu = flops / (report.cycles_step_seconds * target.chip.device_peak_flops)
    report.step_range_seconds = step_range_seconds(target.chip.name, cycle_time)
  if not loops.counted:  # figures of one trip of some loop: no time, no MFU
    report.estimated_step_seconds = report.estimated_mfu = None
    report.hbm_step_seconds = report.hbm_mfu = None
    report.cycles_step_seconds = report.cycles_mfu = report.step_range_seconds = None
  if program.name == "generate":  # what runs once, outside the search's loop
    report.search = {"flops_outside_loop": max(0.0, float(cost["flops"]) - loops.flops_in_loops),
                     "bytes_outside_loop": max(0.0, float(cost.get("bytes accessed", 0.0))
                                               - loops.bytes_in_loops),
                     "hbm_outside_loop": traffic.hbm_bytes - traffic.in_loops}
  return report


def decode_step_bound(program: programs_lib.Program, target: Target) -> float:
  """Seconds to read, at the chip's HBM bandwidth, what one decoding step must read:
  the decoder's parameters and the caches (self-attention keys and values of every
  position, the cross-attention keys and values), per chip."""
  params, memory, _, cache = program.args
  decoder_params = {path: leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                    if not any(str(getattr(k, "key", "")).startswith(("encoder", "source_pos"))
                               for k in path)}
  read_memory = {path: leaf for path, leaf in jax.tree_util.tree_leaves_with_path(memory)
                 if "encoded" not in jax.tree_util.keystr(path)}
  return (_shard_bytes(list(decoder_params.values())) + _shard_bytes(list(read_memory.values()))
          + _shard_bytes(cache)) / target.chip.device_hbm_bandwidth


def _decode_step_summary(config: ExperimentConfig, target: Target, mesh: Any, rows: int,
                         length: int, model: nn.Module | None) -> dict[str, Any]:
  program = programs_lib.decode_step_program(config, mesh, rows=rows, length=length, model=model)
  report = compile_program(program, target)
  bound = decode_step_bound(program, target)
  summary = {"flops_per_chip": report.flops_per_chip,
             "bytes_accessed_per_chip": report.bytes_accessed_per_chip,
             "estimated_seconds": report.estimated_step_seconds,
             "estimated_mfu": report.estimated_mfu,
             "hbm_traffic_per_chip": report.hbm_traffic_per_chip,
             "hbm_step_seconds": report.hbm_step_seconds,
             "hbm_bound_seconds": bound,
             "estimate_over_bound": (report.estimated_step_seconds / bound
                                     if report.estimated_step_seconds and bound else None),
             "hbm_estimate_over_bound": (report.hbm_step_seconds / bound
                                         if report.hbm_step_seconds and bound else None),
             "compile_seconds": report.compile_seconds,
             "loops_counted_once": report.loops_counted_once}
  return summary


def compile_report(config: ExperimentConfig, target: str | Target, program: str = "train", *,
                   rows: int | None = None, length: int | None = None,
                   model: nn.Module | None = None,
                   compiler: Compiler | None = None) -> CompileReport:
  """Compiles ``program`` of ``config`` for ``target`` and reports (see the module docstring).

  Args:
    config: the experiment (model, data sizes, train and decode settings).
    target: a name for ``targets.parse_target`` (``"v5e:2x4"``, ``"v5e-1"``) or a ``Target``.
    program: ``"train"``, ``"eval"``, ``"generate"`` or ``"score"``.
    rows: global batch rows; default: the run's own (``programs.default_rows``).
    length: padded source (and target) length; default: the longest training bucket
      (train, eval), the source limit (generate, score).
    model: the model, when it is not ``config.model``'s (a pretrained checkpoint).
    compiler: see ``compile_program`` (``train``, ``eval`` and ``score``; ``generate``'s
      decoding step is always compiled).

  ``generate`` also compiles one decoding step without loops; its estimate is in
  ``estimated_step_seconds`` (per decoding step) and ``decode_step``.
  """
  if program not in programs_lib.PROGRAMS:
    raise ValueError(f"unknown program {program!r}; known: {', '.join(programs_lib.PROGRAMS)}")
  target = parse_target(target) if isinstance(target, str) else target
  mesh = target_mesh(target, config.train.model_parallelism if program in ("train", "eval")
                     else 1)
  built = programs_lib.build_program(program, config, mesh, rows=rows, length=length,
                                     model=model)
  built_as = built_model(config, program, model)
  report = compile_program(built, target, model_name=describe_model(built_as), compiler=compiler)
  report.attention_impl = attention_impl_of(built_as)
  if program == "generate" and report.fits:
    step = _decode_step_summary(config, target, mesh, built.rows, built.source_len, model)
    report.decode_step = step
    report.flops_per_chip = step["flops_per_chip"]
    report.bytes_accessed_per_chip = step["bytes_accessed_per_chip"]
    report.estimated_step_seconds = step["estimated_seconds"]
    report.estimated_mfu = step["estimated_mfu"]
    report.hbm_traffic_per_chip = step["hbm_traffic_per_chip"]
    report.hbm_step_seconds = step["hbm_step_seconds"]
    report.hbm_mfu = None
    report.loops_counted_once = step["loops_counted_once"]
    report.search = _whole_search(report.search or {}, step, built.target_len, target)
  return report


def _whole_search(outside: dict[str, float], step: dict[str, Any], steps: int,
                  target: Target) -> dict[str, Any]:
  """``generate``'s whole search: what runs once outside its loop (the compiler's count
  less the loop's body, counted here) plus ``steps`` decoding steps, each costed as one
  compiled without loops at the last position (so an upper bound: real searches stop
  early and read shorter caches)."""
  if step["flops_per_chip"] is None or not outside:
    return {"steps": steps, "how": "not costed: the decoding step has no cost analysis"}
  flops = outside["flops_outside_loop"] + steps * step["flops_per_chip"]
  accessed = outside["bytes_outside_loop"] + steps * step["bytes_accessed_per_chip"]
  hbm = outside["hbm_outside_loop"] + steps * step["hbm_traffic_per_chip"]
  seconds, mfu = roofline(flops, accessed, target)
  hbm_seconds, hbm_mfu = roofline(flops, hbm, target)
  return {**outside, "steps": steps, "flops_per_chip": flops, "bytes_accessed_per_chip": accessed,
          "hbm_traffic_per_chip": hbm, "estimated_seconds": seconds, "estimated_mfu": mfu,
          "hbm_seconds": hbm_seconds, "hbm_mfu": hbm_mfu,
          "how": (f"the program outside its loop once, plus {steps} decoding steps (the "
                  "output limit) each compiled without loops at the last position: an upper "
                  "bound, a search that stops early costs less")}


def attention_impl_of(model: nn.Module) -> str:
  """The ``attention_impl`` of ``model``'s config (``"einsum"``, ``"splash"`` ...), or
  ``""`` for a model whose config has none (the recurrent family)."""
  return str(getattr(getattr(model, "config", None), "attention_impl", ""))


def built_model(config: ExperimentConfig, program: str, model: nn.Module | None) -> nn.Module:
  """The model a program of ``config`` runs (train and eval: in ``train.compute_dtype``)."""
  return programs_lib._model(config, model, program)  # pylint: disable=protected-access


def find_max_batch(config: ExperimentConfig, target: str | Target, program: str = "train", *,
                   length: int | None = None, model: nn.Module | None = None,
                   start_rows: int | None = None, max_rows: int = 1 << 20,
                   tolerance: float = 0.0, method: str = "predict",
                   first: CompileReport | None = None,
                   on_probe: Callable[[CompileReport], None] | None = None) -> CompileReport:
  """The report of the largest batch that fits, found with few compiles.

  ``method="predict"`` (at most three compiles): a program's per-chip memory grows
  linearly with its rows (temporaries: activations, logits; arguments and code stay),
  so two compiles, at ``start_rows`` (default: the run's batch; ``first``, a report
  already made there, saves one) and at twice (half, if it does not fit) that, give
  the bytes a row; the largest whole row unit (the mesh's data axis times
  microbatches) the line puts under the chip's HBM is compiled to confirm. If it
  does not fit (the compiler's choices are not exactly linear), the largest batch
  compiled that fits is returned and ``max_batch_method`` says so.

  ``method="bisect"``: rows double from ``start_rows`` until a batch does not fit
  (or ``max_rows`` is reached), then the gap is halved down to one row unit, or to
  ``tolerance`` times the rows that fit (0.125 stops within 12.5 % of the largest).

  Each probe is one compile; ``on_probe`` sees each report. The returned report
  lists the probes in ``max_batch_probes``; if even one row unit does not fit, it is
  that unit's report (``fits=False``).
  """
  if method not in ("predict", "bisect"):
    raise ValueError(f"method={method!r}: 'predict' (a line through two compiles) or 'bisect'")
  target = parse_target(target) if isinstance(target, str) else target
  mesh = target_mesh(target, config.train.model_parallelism if program in ("train", "eval")
                     else 1)
  unit = programs_lib.row_unit(config, mesh, program)
  probes: list[CompileReport] = []

  def probe(rows: int) -> CompileReport:
    report = compile_report(config, target, program, rows=rows, length=length, model=model)
    probes.append(report)
    if on_probe is not None:
      on_probe(report)
    return report

  if start_rows is None and first is not None:
    start_rows = first.rows
  if start_rows is None:
    built_length = length or (programs_lib.train_length(config) if program == "train" else
                              programs_lib.longest_bucket(config) if program == "eval" else None)
    start_rows = (programs_lib.default_rows(config, mesh, program, built_length)
                  if built_length else programs_lib.default_rows(config, mesh, program, 1))
  rows = max(unit, start_rows // unit * unit)
  if first is not None and first.rows == rows:
    probes.append(first)
    report = first
  else:
    report = probe(rows)
  if method == "predict":
    best, how = _predict_max_batch(report, probe, unit, max_rows)
    if best is not None:
      best.max_batch_probes = [_probe_summary(p) for p in probes]
      best.max_batch_method = how
      return best
    # Neither of two compiles fits: no line to draw; bisect downwards from the smaller.
    report = min(probes, key=lambda p: p.rows)
    rows = report.rows
  best: CompileReport | None = None
  if report.fits:
    best, low, high = report, rows, None
    while high is None and rows * 2 <= max_rows:
      rows *= 2
      report = probe(rows)
      if report.fits:
        best, low = report, rows
      else:
        high = rows
    if high is None:
      high = low
  else:
    low, high = 0, rows
    while high > unit:
      rows = max(unit, high // 2 // unit * unit)
      report = probe(rows)
      if report.fits:
        best, low = report, rows
        break
      high = rows
    if best is None:
      report.max_batch_probes = [_probe_summary(p) for p in probes]
      report.max_batch_method = "no batch of one row unit fits"
      return report
  while high - low > max(unit, tolerance * low):
    rows = (low + high) // 2 // unit * unit
    if rows <= low:
      break
    report = probe(rows)
    if report.fits:
      best, low = report, rows
    else:
      high = rows
  assert best is not None
  best.max_batch_probes = [_probe_summary(p) for p in probes]
  best.max_batch_method = f"bisection over {len(probes)} compiles"
  return best


def _predict_max_batch(first: CompileReport, probe: Callable[[int], CompileReport], unit: int,
                       max_rows: int) -> tuple[CompileReport | None, str]:
  """``find_max_batch``'s prediction: a line through two compiles' per-chip bytes, and one
  compile where it meets the chip's HBM. ``(None, why)`` where no line can be drawn."""
  other_rows = first.rows * 2 if first.fits else max(unit, first.rows // 2 // unit * unit)
  if other_rows == first.rows:
    return (first if first.fits else None), "one row unit: nothing to predict"
  second = probe(other_rows)
  fitting = [r for r in (first, second) if r.fits]
  largest_fitting = max(fitting, key=lambda r: r.rows) if fitting else None
  low, high = sorted((first, second), key=lambda r: r.rows)
  # A batch that does not fit still reports what it needed (the compiler's message).
  low_total, high_total = low.per_chip_bytes.get("total", 0), high.per_chip_bytes.get("total", 0)
  per_row = (high_total - low_total) / (high.rows - low.rows)
  if low_total <= 0 or per_row <= 0:
    return largest_fitting, "the compiler's memory did not grow with rows"
  room = low.hbm_bytes_per_chip - low_total
  predicted = min(max_rows, low.rows + math.floor(room / per_row / unit) * unit)
  line = (f"a line through {low.rows} and {high.rows} rows ({per_row / 2**20:.2f} MiB per "
          f"chip a row) meets the chip's HBM at {predicted} rows")
  if predicted < unit:
    return None, line
  compiled = {r.rows: r for r in (first, second)}
  confirmed = compiled[predicted] if predicted in compiled else probe(predicted)
  if confirmed.fits:
    how = line + (", confirmed by its compile" if predicted not in compiled
                  else ", already compiled")
    expected = low_total + (predicted - low.rows) * per_row
    if confirmed.per_chip_bytes.get("total", 0) < 0.9 * expected:
      # The compiler trades recomputation for memory as a batch nears the chip's HBM.
      how += (f"; it needed {confirmed.per_chip_bytes['total'] / GiB:.2f} GiB where the line "
              f"said {expected / GiB:.2f}: the compiler rematerializes near the limit, so "
              "larger batches may fit (method='bisect' finds the largest)")
    return confirmed, how
  if largest_fitting is None:
    return None, line
  return largest_fitting, (line + f"; that compile did NOT fit, so {largest_fitting.rows} rows, "
                           "the largest compiled batch that fits, is reported (the largest may "
                           "lie between)")


def _probe_summary(report: CompileReport) -> dict[str, Any]:
  return {"rows": report.rows, "fits": report.fits,
          "total_bytes": report.per_chip_bytes.get("total"),
          "compile_seconds": round(report.compile_seconds, 1)}


def _gib(value: float | None) -> str:
  return "-" if value is None else f"{value / GiB:.2f}"


def format_table(reports: Sequence[CompileReport]) -> str:
  """A plain-text table of reports, one line each, with a footnote on what the numbers are."""
  header = ("program", "target", "batch", "args GiB", "temp GiB", "total GiB", "HBM GiB",
            "fits", "TFLOP", "GB accessed", "est. ms", "est. MFU", "HBM GB", "HBM ms",
            "cyc. ms", "cyc. MFU", "compile s")
  rows = []
  for r in reports:
    b = r.per_chip_bytes
    batch = f"{r.rows}x({r.source_len}+{r.target_len})"
    step = "" if r.program != "generate" else "/step"
    rows.append((
        r.program, r.target, batch, _gib(b.get("arguments")), _gib(b.get("temporaries")),
        _gib(b.get("total")), _gib(r.hbm_bytes_per_chip), "yes" if r.fits else "NO",
        "-" if r.flops_per_chip is None else f"{r.flops_per_chip / 1e12:.3g}",
        "-" if r.bytes_accessed_per_chip is None else f"{r.bytes_accessed_per_chip / 1e9:.3g}",
        "-" if r.estimated_step_seconds is None else f"{r.estimated_step_seconds * 1e3:.3g}{step}",
        "-" if r.estimated_mfu is None else f"{100 * r.estimated_mfu:.0f}%",
        "-" if r.hbm_traffic_per_chip is None else f"{r.hbm_traffic_per_chip / 1e9:.3g}",
        "-" if r.hbm_step_seconds is None else f"{r.hbm_step_seconds * 1e3:.3g}{step}",
        "-" if r.cycles_step_seconds is None else f"{r.cycles_step_seconds * 1e3:.3g}{step}",
        "-" if r.cycles_mfu is None else f"{100 * r.cycles_mfu:.0f}%",
        f"{r.compile_seconds:.0f}"))
  widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
  line = lambda cells: "  ".join(str(c).rjust(w) if i >= 3 else str(c).ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths)))
  out = [line(header)] + [line(r) for r in rows]
  for r in reports:
    if not r.fits and r.message:
      out.append(f"{r.program} on {r.target}: {r.message}")
    if r.program == "generate" and r.search and "estimated_seconds" in r.search:
      search = r.search
      out.append(f"generate on {r.target}: est. ms and MFU are of one decoding step; the whole "
                 f"search of up to {search['steps']} steps: "
                 f"{search['flops_per_chip'] / 1e12:.3g} TFLOP, est. "
                 f"{search['estimated_seconds'] * 1e3:.3g} ms "
                 f"({100 * search['estimated_mfu']:.0f}% MFU), HBM est. "
                 f"{search['hbm_seconds'] * 1e3:.3g} ms ({search['how']})")
    elif r.loops_counted_once:
      out.append(f"{r.program} on {r.target}: no time and no MFU: {r.loops}")
    elif r.loops:
      out.append(f"{r.program} on {r.target}: {r.loops}")
    if r.packing and r.estimated_real_tokens_per_step is not None:
      out.append(packing_note(r))
    if r.kernels:
      out.append(f"{r.program} on {r.target}: {r.kernels}")
  out.append("Per chip. Compiler-derived estimates (the XLA compiler's memory and cost analysis "
             "against published chip figures), not measurements. est. ms: max(FLOPs / peak, "
             "bytes accessed / bandwidth); HBM GB and HBM ms: the same with the bytes that "
             "cross the HBM bus, read off the compiled program (seq2seq_jax.aot.hlo); cyc. ms: "
             "the compiler's own cycle estimates summed, a cycle timed by a large matmul at "
             "peak: the estimate to plan with. "
             + range_note((r.chip for r in reports), (r.attention_impl for r in reports)))
  return "\n".join(out)


def range_note(chips: Iterable[str], attention_impls: Iterable[str] = ()) -> str:
  """The footnote's sentences on how far to trust "cyc. ms" on each TPU generation named
  (``STEP_RANGES``; "not measured", with no range, where no published run exists), and,
  when a range is printed and ``attention_impls`` (the programs') names any attention
  other than the einsums, that the ranges come from einsum programs."""
  names = list(dict.fromkeys(c for c in chips if c in CHIPS and CHIPS[c].platform == "tpu"))
  if not names:
    return "No published run bounds these estimates."
  parts = [f"TPU {c}: {range_text(c)}" for c in names]
  note = ("Published training steps of the Transformer big took, as a multiple of cyc. ms "
          "(the lowest and highest ratio of the runs, RESULTS.md): " + "; ".join(parts) + ".")
  fused = sorted({a for a in attention_impls if a and a != "einsum"})
  if fused and any(step_range(c) is not None for c in names):
    note += (f" Those runs are of einsum-attention programs; attention_impl={'/'.join(fused)} "
             "is not among them.")
  return note


def packing_note(report: CompileReport) -> str:
  """One line on a packed training program: its token slots and the real tokens they
  would hold at the assumed fill, against bucketing's fill on the same corpus."""
  return (f"{report.program} on {report.target}: packed rows (data.packing) of "
          f"{report.source_len}+{report.target_len}: {report.tokens_per_step:,} token slots a "
          f"step; ~{report.estimated_real_tokens_per_step:,.0f} real tokens assuming "
          f"{report.assumed_fill:.1%} of slots filled (ASSUMED_PACKING_FILL: measured on a "
          f"WMT'14-sized stand-in corpus in rows of 256, not on this run's data), where "
          f"length buckets filled {BUCKETING_FILL_MEASURED:.1%} of theirs")


def fit_summary(config: ExperimentConfig, programs: Sequence[str] = ("train",),
                targets: Sequence[str] = ("v5e-1", "v6e-1"), *, rows: int | None = None,
                length: int | None = None, model: nn.Module | None = None) -> str:
  """One line per program and target: fits or not, GiB of HBM, estimated step time.

  For notebooks: how a run would sit on Colab's single-chip TPUs, from this machine.
  Without libtpu it says how to install it instead of failing.

  Example:
    >>> from seq2seq_jax import presets
    >>> print(fit_summary(presets.get_preset("tiny_transformer"), ["train"], ["v5e-1"]))
    ... # doctest: +ELLIPSIS
    train on v5e-1: fits, ... GiB of 16.0 per chip, est. ... ms a step (16 rows x 48+48 tokens)
    (compiler-derived estimates from libtpu, not measurements)
  """
  from seq2seq_jax.aot.targets import libtpu_installed  # pylint: disable=import-outside-toplevel
  if not libtpu_installed():
    return ("the TPU compiler is not installed here: pip install 'jax[tpu]' (libtpu, about "
            "200 MB; no TPU needed) to see whether this run fits a TPU")
  lines = []
  for program in programs:
    for name in targets:
      r = compile_report(config, name, program, rows=rows, length=length, model=model)
      shape = f"{r.rows} rows x {r.source_len}+{r.target_len} tokens"
      if not r.fits:
        lines.append(f"{program} on {name}: does NOT fit ({shape}): {r.message}")
        continue
      per = "a decoding step" if program == "generate" else "a step"
      lines.append(f"{program} on {name}: fits, {r.per_chip_bytes['total'] / GiB:.2f} GiB of "
                   f"{r.hbm_bytes_per_chip / GiB:.1f} per chip, est. "
                   f"{(r.estimated_step_seconds or 0.0) * 1e3:.3g} ms {per} ({shape})")
  lines.append("(compiler-derived estimates from libtpu, not measurements)")
  return "\n".join(lines)
