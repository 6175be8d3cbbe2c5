"""The compile report's step estimates against published, measured TPU training runs.

Each anchor is a run someone published with its hardware, batch and wall time: the
Flax WMT example (google/flax, ``examples/wmt/README.md``: the v3-8 row since commit
5c0b56e4, the v3-32 row since d68c833e; ``configs/default.py``): a Transformer big
(d 1024, 16 heads, FFN 4096, 6 + 6 layers, pre-LayerNorm, 32k shared sentencepiece
vocabulary, output through the embedding, dropout and attention dropout 0.1, bfloat16
compute, Adam) trained on WMT'17 en-de in packed rows of 256 tokens a side, 32 rows a
TensorCore. Its README gives TPU v3-8: 100,000 steps in 13 h 18 min; TPU v3-32: 25,000
steps (the README's own flags, 100k x 8 / 32) in 3 h 1 min. Wall time over steps is an
upper bound on a step: it also holds evaluation every 1,000 steps (20 batches and a
beam-4 BLEU pass of newstest2014), checkpoints and compiles. A third is a measured rate:
fairseq's maintainer reported 72,000 target tokens a second for its
``transformer_vaswani_wmt_en_de_big`` (post-norm, shared embeddings, dropout 0.3) on
TPU v3-8 with PyTorch/XLA in float32, on the ``dummy_mt`` task (rows of 31 tokens a side,
166 rows a TensorCore, a 50,000-type dictionary): 553 ms a step.

The matching config (``wmt14_transformer_big`` with each run's norm, dropout, vocabulary,
precision and packing, replicated parameters) is compiled for the same slice and batch, and
the report's two times are set against the measured one: ``est`` (the roofline) and
``cycles`` (the compiler's own cycle estimate, ``aot.report.cycles_per_second``).
Nothing measured is fitted: the anchors test the estimates, none builds them.

  python benchmarks/tpu_anchors.py [--out FILE.json]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/tpu_anchors.py   # the tiny preset, for CI
"""

from __future__ import annotations

import time

FLAX_WMT = ("google/flax examples/wmt/README.md (v3-8 row: commit 5c0b56e4, run 2021-08-04; "
            "v3-32 row: commit d68c833e, run 2021-11-05) and examples/wmt/configs/default.py")
FLAX_BIG = ("model.norm=pre", "model.dropout_rate=0.1", "model.attention_dropout_rate=0.1",
            "train.parameter_sharding=replicated")
FAIRSEQ = ("https://github.com/facebookresearch/fairseq/issues/2506 (myleott, 2020-08-31): "
           "'v3-8 gives 72k wps' for train.py --task dummy_mt --arch "
           "transformer_vaswani_wmt_en_de_big --share-all-embeddings --dropout 0.3 "
           "--attention-dropout=0.1 --max-tokens 5000 --tpu --distributed-world-size 8 "
           "(no --bf16); fairseq/tasks/dummy_mt.py: rows of 31 tokens a side, "
           "5000 // 30 = 166 rows a device, 30 target tokens counted a row, 50,000 types")
# fairseq's transformer_vaswani_wmt_en_de_big (post-norm, shared embeddings) on dummy_mt,
# float32 tensors (PyTorch/XLA without --bf16), no packing.
FAIRSEQ_BIG = ("data.packing=false", "train.compute_dtype=float32", "model.vocab_size=50000",
               "data.vocab_size=50000", "model.dropout_rate=0.3",
               "model.attention_dropout_rate=0.1", "train.parameter_sharding=replicated")
ANCHORS = (
    dict(name="Flax WMT, Transformer big, TPU v3-8", target="v3-8", rows=256, length=None,
         overrides=FLAX_BIG, steps=100_000, wall_s=13 * 3600 + 18 * 60, evaluations=100,
         upper_bound=True,
         how="13 h 18 min for 100,000 steps", source=FLAX_WMT),
    dict(name="Flax WMT, Transformer big, TPU v3-32", target="v3-32", rows=1024, length=None,
         overrides=FLAX_BIG, steps=25_000, wall_s=3 * 3600 + 1 * 60, evaluations=25,
         upper_bound=True,
         how="3 h 1 min for 25,000 steps", source=FLAX_WMT),
    dict(name="fairseq dummy_mt, Transformer big, TPU v3-8", target="v3-8", rows=8 * 166,
         length=31, overrides=FAIRSEQ_BIG, measured_s=8 * 166 * 30 / 72_000, upper_bound=False,
         how="39,840 target tokens a step at 72,000 a second", source=FAIRSEQ),
)


def split_evaluation(anchors: list[dict]) -> dict | None:
  """The step and the evaluation apart, from two runs of one model at one batch a core.

  If both slices take the same step (same work a core) and an evaluation takes time in
  inverse proportion to the cores, ``wall / steps = step + evaluation * (evaluations /
  steps)`` for each gives two equations in two unknowns. An assumption, stated; the
  upper bounds above need none.
  """
  if len(anchors) != 2:
    return None
  (a, b) = anchors
  cores_a, cores_b = a["devices"], b["devices"]
  # wall/steps = s + e_a * n/steps, with e_b = e_a * cores_a / cores_b.
  ka = a["evaluations"] / a["steps"]
  kb = b["evaluations"] / b["steps"] * cores_a / cores_b
  per_a, per_b = a["wall_s"] / a["steps"], b["wall_s"] / b["steps"]
  if ka == kb:
    return None
  evaluation = (per_a - per_b) / (ka - kb)
  step = per_a - evaluation * ka
  return {"step_s": step, "evaluation_s_on_" + a["target"]: evaluation,
          "evaluation_s_on_" + b["target"]: evaluation * cores_a / cores_b}


def main() -> None:
  from seq2seq_jax import aot, benchmarking, presets

  parser = benchmarking.argument_parser(__file__, __doc__)
  args = benchmarking.parse_args(parser)
  quick = benchmarking.quick_mode()
  rows = []
  for anchor in ANCHORS:
    start = time.perf_counter()
    overrides = [o for o in anchor["overrides"]
                 if not quick or not o.startswith(("model.", "data."))]
    config = presets.apply_overrides(
        presets.get_preset("tiny_transformer" if quick else "wmt14_transformer_big"), overrides)
    target = aot.parse_target(anchor["target"])
    report = aot.compile_report(config, target, "train", rows=None if quick else anchor["rows"],
                                length=None if quick else anchor["length"])
    # A published rate's step, or a published run's wall time over its steps.
    measured = anchor.get("measured_s") or anchor["wall_s"] / anchor["steps"]
    row = dict(anchor, measured_s=measured, devices=target.devices, chips=target.chips, model=report.model,
               compiled_rows=report.rows, source_len=report.source_len,
               target_len=report.target_len, tokens_per_step=report.tokens_per_step,
               estimated_step_s=report.estimated_step_seconds, hbm_step_s=report.hbm_step_seconds,
               cycles_step_s=report.cycles_step_seconds, estimated_mfu=report.estimated_mfu,
               cycles_mfu=report.cycles_mfu, fits=report.fits,
               compile_s=time.perf_counter() - start)
    row["measured_over_estimate"] = measured / report.estimated_step_seconds
    row["measured_over_cycles"] = measured / report.cycles_step_seconds
    rows.append(row)
    at_most = "<= " if anchor["upper_bound"] else ""
    print(f"{anchor['name']}: {report.rows} rows x {report.source_len}+{report.target_len}, "
          f"measured {at_most}{measured * 1e3:.0f} ms a step; est. "
          f"{report.estimated_step_seconds * 1e3:.0f} ms (measured/est {at_most}"
          f"{row['measured_over_estimate']:.2f}x), cycles "
          f"{report.cycles_step_seconds * 1e3:.0f} ms (measured/cycles {at_most}"
          f"{row['measured_over_cycles']:.2f}x) ({row['compile_s']:.0f} s)", flush=True)
  split = split_evaluation([r for r in rows if r.get("evaluations")])
  if split:
    step = split["step_s"]
    split["step_over_estimate"] = step / rows[0]["estimated_step_s"]
    split["step_over_cycles"] = step / rows[0]["cycles_step_s"]
    print(f"Evaluation apart (same step on both slices, evaluation time ~ 1/cores): step "
          f"{step * 1e3:.0f} ms, {split['step_over_estimate']:.2f}x est., "
          f"{split['step_over_cycles']:.2f}x cycles")
  payload = {"benchmark": "tpu_anchors",
             "note": "published wall times against compiler-derived estimates (libtpu on this "
                     "CPU); no TPU used here",
             "settings": {"quick": quick}, "rows": rows,
             "evaluation_apart": split}
  benchmarking.report(args, payload, plot=_plot)


def _plot(rows, path) -> None:
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, ax = plt.subplots(figsize=(6, 3))
  names = [r["target"] for r in rows]
  for offset, (key, label) in enumerate((("estimated_step_s", "est. (roofline)"),
                                         ("cycles_step_s", "compiler cycles"),
                                         ("measured_s", "published"))):
    ax.bar([i + 0.27 * (offset - 1) for i in range(len(rows))], [r[key] * 1e3 for r in rows],
           width=0.27, label=label)
  ax.set_xticks(range(len(rows)), names)
  ax.set_ylabel("ms a train step")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
