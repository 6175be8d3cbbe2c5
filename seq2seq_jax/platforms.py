"""Choices that pay on one backend and cost on another, taken per platform when a program lowers.

Some of the library's speed-ups were found by timing XLA's CPU backend; the TPU
compiler judges them differently (``benchmarks/tpu_compile.py --sections choices``, the
compiler's cost analysis for a v5e chip; RESULTS.md has the tables). Each such
choice is written twice and picked by ``on_cpu``, a ``jax.lax.platform_dependent``:
the platform is the one a program is lowered for, not the machine that traces it,
so the TPU compiler run on a CPU (``seq2seq_jax.aot``) and a ``jax.export`` artifact
for ``cpu,cuda,tpu`` each get their own branch. The numbers below say why:

=========================== ========================================= =====================================
choice                      XLA CPU, measured (2-core Zen 4)          TPU v5e, compiler's cost analysis
=========================== ========================================= =====================================
vocabulary-major logits of  after the output dot, a greedy step of    a greedy step of 32 rows: +6 % bytes
8 to 32 rows                32 rows x 58,101 ids: 4.7 -> 1.2 ms       accessed (1,130 -> 1,201 MB)
two-stage argmax / top-k    128 rows x 58,101: argmax 33 -> 4 ms,     greedy, 32 rows: +6 % bytes (1,064
                            top-8 of 4 x 58,101: 11-16 -> 4 ms        -> 1,130 MB); beam 4: +5 %
Philox-2x32 dropout masks   16 M values: 28 ms, threefry 188 ms       train step (2+2, d 512): 25.1 GB
                                                                      accessed, threefry 23.4 GB (-7 %)
=========================== ========================================= =====================================

All three are CPU-only: programs lowered for another platform get the plain
``jnp.einsum`` logits, ``jnp.argmax`` / ``lax.top_k`` and ``jax.random.bernoulli``.
So is the fourth, ``as_two_rows``: int8 and bfloat16 products of a single row (a
decoding step of one sentence) computed as two rows, because XLA's CPU dot takes a
slow path for one row in those types.

XLA:CPU's flags: ``--xla_cpu_use_onednn=true`` and YNNPACK's eltwise fusion (off by
default, ``--xla_cpu_experimental_ynn_fusion_type``) were timed on the Zen 4 (AVX-512 with
VNNI and bfloat16, ``cpu_instruction_set() == "avx512_vnni_bf16"``) at the output
projection's shapes, float32, bfloat16 and int8: none paid for every shape (RESULTS.md,
"Int8 and bfloat16 inference"), so the library sets none; ``benchmarks/cpu_flags.py``
times whole decodes per flag set, XNNPACK's graph fusion among them. On an Intel CPU with
AMX (``"amx"``) whole decodes in float32, bfloat16 and int8 at batch 32 and 1 ran 0.91-0.99x
the default's speed with YNNPACK's reduce fusion or XNNPACK's graph fusion, and oneDNN lost
up to 0.77x: none is set there either. AVX2-only CPUs were not reachable and are
unmeasured. XLA reads ``XLA_FLAGS`` when its CPU client starts, at the
first computation or ``jax.devices()``, not at ``import jax``: a user who has imported
jax but computed nothing can still set ``os.environ["XLA_FLAGS"]``; after that, only a
new process reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from seq2seq_jax.types import Array

# Logits of at most VOCAB_MAJOR_MAX_ROWS rows (a decoding step of batch x beams <= 32)
# are laid out vocabulary-major on the CPU: the models compute them as [V, N] and hand
# over the transposed view (see layers.embeddings.vocab_logits). From
# VOCAB_MAJOR_MIN_ROWS rows on, the decoding step's reductions over the vocabulary
# (log-softmax, argmax) are written along that axis, so XLA's CPU backend reads them
# as they lie and never materializes an [N, V] copy; below it a [V, N] array is
# (nearly) an [N, V] one, and the row-wise reductions are faster (58,101 ids,
# log-softmax and argmax, row-wise / vocabulary-major: 0.18 / 1.0 ms for one row,
# 1.05 / 0.93 ms at 8 rows, 3.7 / 1.4 ms at 32).
VOCAB_MAJOR_MIN_ROWS: int = 8
VOCAB_MAJOR_MAX_ROWS: int = 32

# Below this many elements per row the one-stage argmax and top-k are as fast on the
# CPU as the two-stage ones (decoding.selection).
TWO_STAGE_MIN_LENGTH: int = 2048


def as_two_rows(product: Callable[..., Array]) -> Callable[..., Array]:
  """``product(x, w)`` of a one-row ``x [1, D]``, computed as a two-row one, the first kept.

  XLA's CPU dot (YNNPACK) has a slow path for one row in int8 and bfloat16: ``[1, 512] x
  [512, 58,101]`` took 220 ms in int8 where two rows took 14 ms (float32, one row: 35 ms;
  2-core Zen 4, loaded machine). A decoding step of one sentence (greedy) is such a row.
  """
  def two_rows(x_1D: Array, *weights: Array) -> Array:
    return product(jnp.concatenate([x_1D, x_1D], axis=0), *weights)[:1]
  return two_rows


def reads_vocab_major(rows: int) -> bool:
  """Whether, on the CPU, a step's reductions over ``[rows, V]`` logits run vocabulary-major.

  Example:
    >>> reads_vocab_major(1), reads_vocab_major(32), reads_vocab_major(128)
    (False, True, False)
  """
  return VOCAB_MAJOR_MIN_ROWS <= rows <= VOCAB_MAJOR_MAX_ROWS


def on_cpu(cpu: Callable[..., Any], other: Callable[..., Any], *args: Any) -> Any:
  """``cpu(*args)`` in a program lowered for the CPU, ``other(*args)`` for any other platform.

  Both must return the same shapes and dtypes. ``jax.lax.platform_dependent``: a
  program lowered for one platform holds only that platform's branch.

  Example:
    >>> import jax.numpy as jnp
    >>> on_cpu(lambda x: x + 1, lambda x: x - 1, jnp.zeros(()))  # run here, on the CPU
    Array(1., dtype=float32)
  """
  return jax.lax.platform_dependent(*args, cpu=cpu, default=other)


# ---------------------------------------------------------------------------- the CPU itself

# What the x86 CPU can do that XLA's CPU libraries (YNNPACK, oneDNN) have kernels for,
# from the broadest to the plainest; "other" for CPUs without AVX2 or not x86.
INSTRUCTION_SETS = ("amx", "avx512_vnni_bf16", "avx512", "avx2", "other")


def cpu_instruction_set(flags: str | None = None) -> str:
  """The widest of ``INSTRUCTION_SETS`` this CPU has (``/proc/cpuinfo``'s flags, or ``flags``).

  ``"amx"``: AMX tiles (Intel Sapphire Rapids and later); ``"avx512_vnni_bf16"``:
  AVX-512 with the int8 (VNNI) and bfloat16 dot instructions (AMD Zen 4 and 5, Intel
  Cooper Lake and later); ``"avx512"``: AVX-512 without them; ``"avx2"``.

  Example:
    >>> cpu_instruction_set("fpu avx2 avx512f avx512_vnni avx512_bf16")
    'avx512_vnni_bf16'
    >>> cpu_instruction_set("fpu sse4_2")
    'other'
  """
  if flags is None:
    try:
      with open("/proc/cpuinfo", encoding="utf-8") as info:
        flags = next((line.split(":", 1)[1] for line in info if line.startswith("flags")), "")
    except OSError:
      flags = ""
  have = set(flags.split())
  if {"amx_tile", "amx_int8"} <= have:
    return "amx"
  if {"avx512f", "avx512_vnni", "avx512_bf16"} <= have:
    return "avx512_vnni_bf16"
  if "avx512f" in have:
    return "avx512"
  return "avx2" if "avx2" in have else "other"

