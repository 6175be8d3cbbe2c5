"""What a fused attention kernel buys, by the compiler: einsums against splash (TPU) and cuDNN (GPU).

Each program compiles twice, with ``model.attention_impl=einsum`` and with ``auto``
(splash attention in a TPU program, cuDNN's flash attention in an H100 one), and
the two reports stand side by side: temporaries per chip, the step estimates
(roofline, and the TPU compiler's cycle estimate, the kernels' FLOPs counted by
formula: ``seq2seq_jax.aot.report``), and the largest batch that fits (three
compiles each, ``find_max_batch``'s "predict": a lower bound).

Programs:

- ``wmt``: WMT'14 base and big training steps at the presets' packed batch (104 rows
  of 256 + 256), FSDP on ``v5e:2x4`` and ``v4:2x2x1``, and on one compile-only
  H100 (needs jax's CUDA plugin and cuDNN's wheel: ``make test-cuda`` installs them
  in ``.cuda-compile``; run with ``PYTHONPATH=.cuda-compile JAX_PLATFORMS=cpu
  JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1``; XLA's GPU compiler gives memory, no cost analysis);
- ``masks``: how a mask reaches cuDNN, on one compile-only H100: a bf16 causal attention
  layer and its gradient (104 rows of 256, 8 heads of 64) with key lengths (padding, what
  the library passes for unpacked rows), the ``[B, 1, T, S]`` bias (what it passes for
  packed rows), and jax's private packed layout (segment lengths and offsets) with 256
  and 32 segment slots a row; temporaries from the compiler;
- ``nllb``: fine-tuning NLLB-200 600M (its config.json figures; no dropout on the
  attention weights, which no kernel takes) on rows of 512 and of 1,024 tokens a side,
  where the ``T x S`` scores weigh most, FSDP on ``v5e:2x4``.

Compiler-derived estimates (libtpu and XLA's GPU compiler on this CPU), not measurements.

Usage:
  python benchmarks/attention_kernels.py [--sections wmt,masks,nllb] [--targets v5e:2x4,h100]
      [--no-max-batch] [--out F] [--plot F.png]
"""

import dataclasses
import json
import pathlib
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tpu_compile import PUBLISHED, Results, _published_dir  # noqa: E402  # pylint: disable=wrong-import-position

IMPLEMENTATIONS = ("einsum", "auto")
WMT_TARGETS = ("v5e:2x4", "v4:2x2x1", "h100")
NLLB_TARGET = "v5e:2x4"
NLLB_LENGTHS = (512, 1024)
NLLB_ROWS = 32


class KernelResults(Results):
  def payload(self) -> dict[str, Any]:
    return dict(super().payload(), benchmark="attention_kernels")


def settings(quick: bool) -> dict[str, Any]:
  if quick:  # the tiny preset with rows of splash's 128-position tile
    return dict(presets=["tiny_transformer"], targets=["v5e-1"], nllb=[], max_batch=False)
  return dict(presets=["wmt14_transformer_base", "wmt14_transformer_big"],
              targets=list(WMT_TARGETS), nllb=list(NLLB_LENGTHS), max_batch=True)


def _overrides(name: str, target: str, implementation: str) -> list[str]:
  values = [f"model.attention_impl={implementation}"]
  if name == "tiny_transformer":
    values += ["model.max_len=128", "data.max_source_len=128", "data.max_target_len=128",
               "data.bucket_lengths=64,128", "data.batch_tokens=2048", "data.packing=true",
               "train.compute_dtype=bfloat16"]
  if ":" in target:  # a slice: FSDP, as the WMT runs train
    values.append("train.parameter_sharding=fsdp")
  return values


def _summary(report) -> dict[str, Any]:
  """The figures the comparison reads, in GiB and milliseconds."""
  gib = 1 << 30
  b = report.per_chip_bytes
  ms = lambda seconds: None if seconds is None else seconds * 1e3
  return dict(fits=report.fits, rows=report.rows, length=report.source_len,
              temporaries_gib=b["temporaries"] / gib,
              total_gib=b["total"] / gib, est_ms=ms(report.estimated_step_seconds),
              est_mfu=report.estimated_mfu, cyc_ms=ms(report.cycles_step_seconds),
              cyc_mfu=report.cycles_mfu, kernel_flops=report.kernel_flops_per_chip,
              kernels=report.kernels, compile_seconds=report.compile_seconds)


def _compare(results: Results, config_for, labels: dict[str, Any], target: str,
             max_batch: bool, **kwargs: Any) -> None:
  """Both choices at the given batch, then (``max_batch``) at the largest that fits; each
  record is written as soon as it is compiled."""
  from seq2seq_jax import aot
  for implementation in IMPLEMENTATIONS:
    row = dict(labels, target=target, attention_impl=implementation)
    config = config_for(implementation)
    report = None
    if not results.has(row):
      report = aot.compile_report(config, target, "train", **kwargs)
      record = dict(row, **_summary(report))
      print(json.dumps({k: v for k, v in record.items() if k != "kernels"}), flush=True)
      results.add(record)
    largest_row = dict(row, batch="largest")
    if max_batch and not results.has(largest_row):
      largest = aot.find_max_batch(config, target, "train", length=kwargs.get("length"),
                                   start_rows=kwargs.get("rows"), first=report)
      record = dict(largest_row, **_summary(largest), method=largest.max_batch_method)
      print(json.dumps({k: v for k, v in record.items() if k != "kernels"}), flush=True)
      results.add(record)


def run_wmt(results: Results, s: dict[str, Any]) -> None:
  from seq2seq_jax import presets
  for name in s["presets"]:
    for target in s["targets"]:
      _compare(results, lambda impl, name=name, target=target: presets.apply_overrides(
          presets.get_preset(name), _overrides(name, target, impl)),
               dict(section="wmt", name=name), target, s["max_batch"])


def run_nllb(results: Results, s: dict[str, Any]) -> None:
  from seq2seq_jax import configs, pretrained
  with tempfile.TemporaryDirectory() as tmp:
    model_config, _ = pretrained.load_config(
        _published_dir(pathlib.Path(tmp), "nllb-200-distilled-600M"))
    for length in s["nllb"]:
      def config_for(implementation, length=length):
        # No dropout on the attention weights (NLLB's config has 0.1): no kernel takes it,
        # and both choices then compute the same function.
        model = dataclasses.replace(model_config, attention_impl=implementation,
                                    attention_dropout_rate=0.0)
        return configs.ExperimentConfig(
            model=model,
            data=configs.DataConfig(vocab_size=model.vocab_size, max_source_len=length,
                                    max_target_len=length, bucket_lengths=(length,),
                                    batch_tokens=8 * length),
            train=configs.TrainConfig(compute_dtype="bfloat16", parameter_sharding="fsdp"))
      _compare(results, config_for, dict(section="nllb", name="nllb-200-distilled-600M",
                                         row_length=length), NLLB_TARGET, s["max_batch"],
               rows=NLLB_ROWS, length=length)


MASK_SHAPE = dict(rows=104, length=256, heads=8, head_dim=64)


def _mask_layer(form: str, slots: int):
  """A jitted gradient of one cuDNN attention layer whose mask takes ``form``."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from seq2seq_jax.layers.attention import AttentionMask, dot_product_attention  # pylint: disable=import-outside-toplevel

  def packed_layout(q, k, v, segments):
    from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=import-outside-toplevel
    rows = segments.shape[0]
    counts = jnp.zeros((rows, slots + 1), jnp.int32).at[jnp.arange(rows)[:, None], segments].add(
        1, mode="drop")[:, 1:]
    present = jnp.arange(1, slots + 1)[None] <= jnp.max(segments, axis=1, keepdims=True)
    lengths = jnp.where(present, counts, -1)
    offsets = jnp.where(present, jnp.cumsum(counts, axis=1) - counts, -1)
    offsets = jnp.concatenate([offsets, jnp.full((rows, 1), -1, jnp.int32)], axis=1)
    return cudnn.dot_product_attention(q, k, v, None, None, lengths, lengths, offsets, offsets,
                                       scale=0.125, mask_type=cudnn.MaskType.PADDING_CAUSAL)

  def loss(q, k, v, segments):
    if form == "packed layout":
      out = packed_layout(q, k, v, segments)
    else:
      mask = (AttentionMask(key_valid=segments != 0, causal=True) if form == "key lengths" else
              AttentionMask(key_valid=segments != 0, query_segment_ids=segments,
                            key_segment_ids=segments, causal=True))
      out = dot_product_attention(q, k, v, mask, implementation="cudnn")
    return out.astype(jnp.float32).sum()

  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def run_masks(results: Results, s: dict[str, Any]) -> None:
  """One attention layer on a compile-only H100, the mask in each form cuDNN can take."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel

  from seq2seq_jax import aot  # pylint: disable=import-outside-toplevel
  from seq2seq_jax.layers import partitioning  # pylint: disable=import-outside-toplevel
  if "h100" not in s["targets"]:
    return
  target = aot.parse_target("h100")
  mesh = aot.target_mesh(target)
  # jax's packed layout asks the default backend for Hopper at trace time; a compile-only
  # H100 is no backend, so the answer here is the H100's own.
  cudnn.check_compute_capability = lambda capability: (9, 0) >= tuple(map(int, capability.split(".")))
  shape = MASK_SHAPE
  qkv = (shape["rows"], shape["length"], shape["heads"], shape["head_dim"])
  spec = lambda dims, dtype: jax.ShapeDtypeStruct(dims, dtype, sharding=NamedSharding(mesh, P()))
  for form, slots in (("key lengths", 0), ("bias", 0), ("packed layout", 256),
                      ("packed layout", 32)):
    row = dict(section="masks", form=form, slots=slots, target="h100", **shape)
    if results.has(row):
      continue
    with partitioning.activation_sharding(mesh):
      lowered = _mask_layer(form, slots).lower(spec(qkv, jnp.bfloat16), spec(qkv, jnp.bfloat16),
                                               spec(qkv, jnp.bfloat16),
                                               spec(qkv[:2], jnp.int32))
    memory = lowered.compile().memory_analysis()
    record = dict(row, temporaries_mib=memory.temp_size_in_bytes / 2**20)
    print(json.dumps(record), flush=True)
    results.add(record)


def mask_table(records: list[dict[str, Any]]) -> str:
  """Markdown: one cuDNN attention layer's temporaries for each form of its mask."""
  lines = ["| mask reaches cuDNN as | segment slots a row | temporaries MiB |", "|---|---|---|"]
  for r in records:
    if r["section"] == "masks":
      lines.append(f"| {r['form']} | {r['slots'] or '-'} | {r['temporaries_mib']:.1f} |")
  return "\n".join(lines)


def table(records: list[dict[str, Any]]) -> str:
  """Markdown: each program's einsum and fused rows side by side."""
  lines = ["| program | target | batch | attention | temp GiB | est. ms | cyc. ms | cyc. MFU |",
           "|---|---|---|---|---|---|---|---|"]
  fmt = lambda v, f: "-" if v is None else format(v, f)
  order = lambda r: (r["section"] != "wmt", r["name"], r["target"], r["length"],
                     r.get("batch") == "largest", r["attention_impl"] != "einsum")
  for r in sorted((r for r in records if r["section"] != "masks"), key=order):
    kernel = {"einsum": "einsums", "auto": "fused"}[r["attention_impl"]]
    batch = f"{r['rows']} x {r['length']}" + (" (largest)" if r.get("batch") == "largest" else "")
    lines.append(
        f"| {r['name']} | {r['target']} | {batch} | {kernel} | {r['temporaries_gib']:.2f} | "
        f"{fmt(r['est_ms'], '.1f')} | {fmt(r['cyc_ms'], '.1f')} | "
        f"{fmt(r['cyc_mfu'] and 100 * r['cyc_mfu'], '.0f')} |")
  return "\n".join(lines)


def plot(records: list[dict[str, Any]], path: pathlib.Path) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  pairs = {}
  for r in records:
    if r.get("batch") == "largest" or r["section"] == "masks":
      continue
    pairs.setdefault((r["name"], r["target"], r["length"]), {})[r["attention_impl"]] = r
  labels = [f"{n.replace('wmt14_transformer_', '').replace('nllb-200-distilled-', 'nllb ')}"
            f"\n{t}" + (f" {length}" if length != 256 else "") for n, t, length in pairs]
  fig, ax = plt.subplots(figsize=(max(6, len(labels) * 1.2), 4))
  for offset, impl in ((-0.2, "einsum"), (0.2, "auto")):
    values = [pair.get(impl, {}).get("temporaries_gib") or 0 for pair in pairs.values()]
    ax.bar([i + offset for i in range(len(values))], values, width=0.4,
           label={"einsum": "einsums", "auto": "fused kernel"}[impl])
  ax.set_xticks(range(len(labels)), labels, fontsize=8)
  ax.set_ylabel("temporaries per chip (GiB)")
  ax.set_title("Attention: einsums against the fused kernel (compiler estimates)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main() -> None:
  from seq2seq_jax import benchmarking

  parser = benchmarking.argument_parser(__file__, __doc__)
  parser.add_argument("--sections", default="wmt,masks,nllb")
  parser.add_argument("--targets", default="", help="only these WMT targets (comma-separated)")
  parser.add_argument("--no-max-batch", action="store_true", help="skip the largest batches")
  parser.add_argument("--redo", action="store_true", help="recompile what --out already holds")
  args = benchmarking.parse_args(parser)
  s = settings(benchmarking.quick_mode())
  if args.targets:
    s["targets"] = [t.strip() for t in args.targets.split(",") if t.strip()]
  if args.no_max_batch:
    s["max_batch"] = False
  results = KernelResults(args.out, args.redo)
  start = time.perf_counter()
  for name in [n.strip() for n in args.sections.split(",") if n.strip()]:
    {"wmt": run_wmt, "nllb": run_nllb, "masks": run_masks}[name](results, s)
  print(table(results.records))
  if any(r["section"] == "masks" for r in results.records):
    print(mask_table(results.records))
  print(f"{len(results.records)} records ({time.perf_counter() - start:.0f} s); "
        "compiler-derived estimates, not measurements")
  benchmarking.report(args, results.payload(), plot=plot)


if __name__ == "__main__":
  main()
