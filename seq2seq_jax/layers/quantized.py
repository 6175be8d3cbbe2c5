"""Int8 weights inside the layers: the products ``seq2seq_jax.quantization`` cannot leave to qwix.

``quantization.quantize`` stores a weight as qwix's ``WithAux(QArray)``: int8 values and
a float32 scale per output channel. The ``nn.Dense`` / ``nn.DenseGeneral`` layers reach
qwix through its interception of ``dot_general``; three places compute with a weight
that no ``Dense`` layer owns, and call these functions instead:

- ``MultiHeadAttention._project`` stacks the query, key and value kernels of its
  sub-layers into one product (a parent module's einsum, which qwix's rules, matched by
  the module that owns the weight, do not see): ``project``.
- a token table used for lookup and as the tied output layer (``TokenEmbedding``): one
  int8 table with a scale per id serves both, ``lookup`` and ``logits``.
- ``vocab_logits``, the output projection, whose operand order is chosen per platform
  and row count: ``logits``.

Activations are quantized per row on the fly (the absolute maximum of each row over
the contracted axis), the product is int8 x int8 -> int32, and both scales are applied
to the int32 result: CTranslate2's int8. Nothing here imports qwix until a quantized
weight is met.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax import platforms
from seq2seq_jax.types import Array


def is_quantized(value: Any) -> bool:
  """Whether ``value`` is a quantized weight (qwix's ``WithAux`` around a ``QArray``)."""
  return not isinstance(value, (jax.Array, np.ndarray)) and hasattr(value, "array") \
      and hasattr(value.array, "qvalue")


def _parts(weight: Any) -> tuple[Array, Array]:
  """The int8 values and the float scale (broadcastable to them) of a quantized weight."""
  return weight.array.qvalue, weight.array.scale


# qwix's symmetric int8 range is [-127.5, 127.5] before rounding: a row's largest value
# then lands on a rounding tie (127.5 -> 128, clipped to 127; -127.5 -> -128), and a
# float difference of one ulp moves it by one step. Calibrating to 127 (CTranslate2's
# range) puts it on an integer: the teacher-forced decoder and a decoding step, whose
# floats differ in the last bits, quantize a row alike.
CALIBRATION = f"absmax,{127.5 / 127}"


def _int8_rows(x_ND: Array) -> tuple[Array, Array]:
  """``x`` [N, D] as int8 with one float32 scale a row: ``(x_int8_ND, scale_N1)``."""
  import qwix  # pylint: disable=import-outside-toplevel

  q = qwix.quantize(x_ND.astype(jnp.float32), jnp.int8, channelwise_axes=(0,),
                    calibration_method=CALIBRATION)
  return q.qvalue, q.scale


def _matmul(x_ND: Array, w_qvalue: Array, w_scale_1M: Array, *, weight_contracts: int = 0
            ) -> Array:
  """Float32 ``x [N, D]`` times a dequantized ``[D, M]`` weight (``weight_contracts=0``)
  or ``[M, D]`` one (``1``), computed in int8 -> int32."""
  x_int8_ND, x_scale_N1 = _int8_rows(x_ND)
  dims = (((1,), (weight_contracts,)), ((), ()))

  def product(x_int8_ND, w_qvalue):
    return jax.lax.dot_general(x_int8_ND, w_qvalue, dims, preferred_element_type=jnp.int32)

  if x_ND.shape[0] == 1:  # a decoding step of one sentence (platforms.pad_single_rows)
    acc_NM = platforms.on_cpu(platforms.as_two_rows(product), product, x_int8_ND, w_qvalue)
  else:
    acc_NM = product(x_int8_ND, w_qvalue)
  return acc_NM.astype(jnp.float32) * x_scale_N1 * w_scale_1M


def project(x_BSD: Array, kernels: Sequence[Any], dtype: Any) -> Array:
  """``x`` through C stacked ``[D, H, K]`` int8 kernels at once: ``y [..., C, H, K]``."""
  values, scales = zip(*(_parts(k) for k in kernels))
  qvalue_DCHK = jnp.stack(values, axis=1)
  scale_1CHK = jnp.stack(scales, axis=1)
  d, c, h, k = qvalue_DCHK.shape
  y_NM = _matmul(x_BSD.reshape(-1, d), qvalue_DCHK.reshape(d, c * h * k),
                 scale_1CHK.reshape(1, c * h * k))
  return y_NM.reshape(*x_BSD.shape[:-1], c, h, k).astype(dtype)


def lookup(table: Any, tokens: Array, dtype: Any) -> Array:
  """Rows ``tokens`` of an int8 token table ``[V, D]`` (a scale per id), in ``dtype``."""
  qvalue_VD, scale_V1 = _parts(table)
  rows = jnp.take(qvalue_VD, tokens, axis=0).astype(jnp.float32)
  return (rows * jnp.take(scale_V1, tokens, axis=0)).astype(dtype)


def logits(x_BTD: Array, weight: Any, weight_axes: str, bias: Array | None) -> Array:
  """Float32 logits ``[..., V]`` of ``x`` against an int8 ``[V, D]`` table (a scale per
  id) or ``[D, V]`` kernel (a scale per column), plus ``bias [V]``.

  On the CPU, for 2 to ``platforms.VOCAB_MAJOR_MAX_ROWS`` rows, the int32 product, the
  dequantizing multiply and the bias are computed vocabulary-major (``[V, N]``) and the
  transposed view is handed over, as ``embeddings.vocab_logits`` does in float: the
  decoding step then reads them as they lie (``platforms.reads_vocab_major``). Written
  row-major, the step made two transposing copies of the ``[N, V]`` logits after the
  product: a greedy step at batch 32 of an OPUS-MT-sized model spent 7.8 ms on them and
  the dequantizing multiply (a loaded 2-core Zen 4), 1.9 ms on the copies alone (a 2-core
  AMX Xeon, where the whole generate ran 1.13x faster without them).
  """
  qvalue, scale = _parts(weight)
  contracts = weight_axes.index("D")
  d, v = qvalue.shape[contracts], qvalue.shape[1 - contracts]
  x_ND = x_BTD.reshape(-1, d)
  rows = x_ND.shape[0]
  out_shape = (*x_BTD.shape[:-1], v)

  def row_major(x_ND, qvalue, scale, *bias):
    logits_NV = _matmul(x_ND, qvalue, scale.reshape(1, v), weight_contracts=contracts)
    if bias:
      logits_NV = logits_NV + bias[0].astype(jnp.float32)[None, :]
    return logits_NV

  def vocab_major(x_ND, qvalue, scale, *bias):
    x_int8_ND, x_scale_N1 = _int8_rows(x_ND)
    acc_VN = jax.lax.dot_general(qvalue, x_int8_ND, (((contracts,), (1,)), ((), ())),
                                 preferred_element_type=jnp.int32)
    # The row-major path's order of multiplication: the same float32 values.
    logits_VN = acc_VN.astype(jnp.float32) * x_scale_N1.reshape(1, -1) * scale.reshape(v, 1)
    if bias:
      logits_VN = logits_VN + bias[0].astype(jnp.float32)[:, None]
    # Without the barrier XLA folds the transpose back into the product.
    return jax.lax.optimization_barrier(logits_VN).T

  operands = (x_ND, qvalue, scale) + (() if bias is None else (bias,))
  if 1 < rows <= platforms.VOCAB_MAJOR_MAX_ROWS:
    return platforms.on_cpu(vocab_major, row_major, *operands).reshape(out_shape)
  return row_major(*operands).reshape(out_shape)
