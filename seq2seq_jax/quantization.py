"""Int8 inference: a trained or published model's weights as int8, its products in int8.

``quantize(model, params, "int8")`` returns a model and parameters that every decoding
path takes as it takes the float ones (``generate``, the ``Translator``, ``score``,
``translate_file``, the command line's ``--quantize int8``):

- Weights: int8, one float32 scale per output channel (absmax / 127, symmetric):
  every attention projection (query, key, value, output), both feed-forward layers
  (T5's gated pair too), the token embeddings (a scale per id) and the output
  projection, tied to the target embedding or not.
- Activations: quantized per row on the fly before each of those products (a row's
  absolute maximum, as CTranslate2's int8), int8 x int8 -> int32, both scales applied
  to the result.
- Float stays: the layer norms, biases, position tables and T5's relative position
  bias; attention over the cache and the source (its scores and weighted sums in the
  model's compute dtype), softmax, the cached keys and values, and the search. With
  ``dtype="bfloat16"`` in the model's config those run in bfloat16 (CTranslate2's
  ``int8_bfloat16``); with float32 in float32 (``int8_float32``).

The ``nn.Dense`` / ``nn.DenseGeneral`` layers reach int8 through qwix's post-training
quantization (``qwix.PtqProvider``), which intercepts their ``dot_general`` calls; the
three products that no ``Dense`` layer owns (the fused query-key-value projection, the
token table's lookup and tied logits, the output projection) are in
``layers.quantized``. The Transformer and T5 (so every pretrained family: Marian /
OPUS-MT, M2M100 / NLLB, mBART, T5 / mT5 / MADLAD-400), and ensembles of them, can be
quantized; the RNN and decomposable-attention models are refused by name.

Example:
  >>> from seq2seq_jax import DecodeConfig, Transformer, TransformerConfig, generate
  >>> model = Transformer(TransformerConfig(vocab_size=64, model_dim=32, num_heads=2,
  ...                                       mlp_dim=64, num_encoder_layers=1,
  ...                                       num_decoder_layers=1))
  >>> inputs = jnp.array([[5, 6, 7, 2]])
  >>> params = model.init(jax.random.key(0), inputs, inputs)["params"]
  >>> int8_model, int8_params = quantize(model, params, "int8")
  >>> int8_params["decoder_layers_0"]["feed_forward"]["wi"]["kernel"].array.qvalue.dtype
  dtype('int8')
  >>> tokens, _ = generate(int8_model, int8_params, inputs, DecodeConfig(max_decode_len=6))
  >>> tokens.shape
  (1, 6)
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seq2seq_jax.layers.quantized import CALIBRATION
from seq2seq_jax.types import PyTree

MODES = ("none", "int8")

# The model methods the decoders and the Translator call through ``model.apply``.
_METHODS = ("__call__", "encode", "decode", "init_cache", "decode_step")

# The Dense layers of the Transformer and T5 blocks, by module name (qwix matches a
# rule to the module that owns the weight): attention projections, feed-forward layers.
_DENSE_LAYERS = r"(.*/)?(query|key|value|out|wi|wi_0|wi_1|wo)"

# Token tables (quantized per id: the rows of a lookup are the output channels of the
# tied logits) and untied output projections ([D, V], per column), by parameter path.
_TABLE = "embedding"
_OUTPUT_PROJECTION = ("output_projection", "kernel")


def check_mode(quantize: str, *, what: str = "quantize") -> str:
  """``quantize`` if it is one of ``MODES``; else a ``ValueError`` naming ``what``."""
  if quantize not in MODES:
    raise ValueError(f"{what}={quantize!r}: must be one of {', '.join(map(repr, MODES))}")
  return quantize


def _check_model(model: nn.Module) -> None:
  from seq2seq_jax.models.ensemble import Ensemble  # pylint: disable=import-outside-toplevel
  from seq2seq_jax.models.t5 import T5  # pylint: disable=import-outside-toplevel
  from seq2seq_jax.models.transformer import Transformer  # pylint: disable=import-outside-toplevel

  if isinstance(model, Ensemble):
    for member in model.models:
      _check_model(member)
    return
  if hasattr(type(model), "_unquantized_type"):
    raise ValueError(f"this {type(model).__name__} is quantized already; quantize the float "
                     "model and its float parameters")
  if not isinstance(model, (Transformer, T5)):
    raise ValueError(
        f"quantize='int8' is not available for {type(model).__name__}: int8 inference covers "
        "the Transformer and T5 (every pretrained family) and ensembles of them; decode "
        f"this model with quantize='none' (its dtype='bfloat16' also halves the bytes read)")


def _provider(qwix: Any) -> Any:
  """qwix's post-training quantization with each result cast back to the layer's dtype."""
  from seq2seq_jax.layers.quantized import is_quantized as is_quantized_leaf  # pylint: disable=import-outside-toplevel

  class Int8Provider(qwix.PtqProvider):
    """``PtqProvider`` whose products come back in the activations' dtype.

    qwix returns a quantized product in the dtype of its scales (float32): a bfloat16
    model would silently carry float32 activations from the first layer on.
    """

    def dot_general(self, lhs, rhs, *args, **kwargs):
      out = super().dot_general(lhs, rhs, *args, **kwargs)
      # Only a product with a quantized weight: any other dot_general (attention, the
      # int8 products of layers.quantized) keeps the dtype it asked for.
      return out.astype(lhs.dtype) if is_quantized_leaf(rhs) else out

  rule = qwix.QuantizationRule(module_path=_DENSE_LAYERS, weight_qtype=jnp.int8,
                               act_qtype=jnp.int8, weight_calibration_method=CALIBRATION,
                               act_calibration_method=CALIBRATION)
  return Int8Provider([rule])


def _table_how(channel_axis: int) -> Any:
  from qwix._src.core import qarray  # pylint: disable=import-outside-toplevel

  return qarray.HowToQuantize(qtype=jnp.int8, channelwise_axes=(channel_axis,),
                              calibration_method=CALIBRATION)


def _with_tables(params: Any) -> Any:
  """An abstract parameter tree (``eval_shape``) whose token tables (per row) and untied
  output projections (per column) are marked for int8, as qwix marks the Dense kernels."""
  import qwix  # pylint: disable=import-outside-toplevel
  from qwix._src.providers import ptq  # pylint: disable=import-outside-toplevel

  def mark(value: Any, channel_axis: int) -> Any:
    shape = jax.ShapeDtypeStruct(value.shape, jnp.float32)
    return ptq.WithAux(jax.eval_shape(lambda x: qwix.quantize(
        x, jnp.int8, channelwise_axes=(channel_axis,), calibration_method=CALIBRATION),
        shape), _table_how(channel_axis))

  if not isinstance(params, dict):
    return params
  out = {}
  for name, value in params.items():
    if name == _TABLE and not isinstance(value, dict) and len(value.shape) == 2:
      out[name] = mark(value, 0)
    elif name == _OUTPUT_PROJECTION[0] and isinstance(value, dict):
      out[name] = {key: mark(leaf, 1) if key == _OUTPUT_PROJECTION[1] else leaf
                   for key, leaf in value.items()}
    else:
      out[name] = _with_tables(value)
  return out


def quantized_model(model: nn.Module, mode: str = "int8") -> nn.Module:
  """``model`` as ``quantize`` returns it, without parameters (see ``abstract_params``)."""
  if check_mode(mode, what="mode") == "none":
    return model
  _check_model(model)
  from seq2seq_jax.models.ensemble import Ensemble  # pylint: disable=import-outside-toplevel

  if isinstance(model, Ensemble):  # member by member: init would share a repeated member
    return model.clone(models=tuple(quantized_model(m, mode) for m in model.models))
  import qwix  # pylint: disable=import-outside-toplevel

  return qwix.quantize_model(model, _provider(qwix), methods=_METHODS)


def abstract_params(model: nn.Module) -> PyTree:
  """The shapes and dtypes (``jax.ShapeDtypeStruct``) of a ``quantized_model``'s parameters.

  What ``quantize`` fills in, and what the TPU compiler is given (``seq2seq_jax.aot``):
  init runs every Dense layer once under qwix's provider, which says how each kernel
  is quantized (its output channels); the token tables and the output projection are
  marked here. Nothing is computed.
  """
  from seq2seq_jax.models.ensemble import Ensemble  # pylint: disable=import-outside-toplevel

  if isinstance(model, Ensemble):
    return {f"models_{i}": abstract_params(m) for i, m in enumerate(model.models)}
  if not hasattr(type(model), "_unquantized_type"):
    raise ValueError(f"abstract_params needs a quantized model (quantized_model); got a float "
                     f"{type(model).__name__}")
  ids = jnp.zeros((1, 1), jnp.int32)
  return _with_tables(jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids))["params"])


def quantize(model: nn.Module, params: PyTree, mode: str = "int8") -> tuple[nn.Module, PyTree]:
  """``(model, params)`` for int8 inference (see the module docstring); ``"none"``: as given.

  Args:
    model: a ``Transformer``, ``T5`` or an ``Ensemble`` of them, float parameters.
    params: its float parameters (the ``"params"`` collection; NumPy or jax arrays).
    mode: ``"int8"`` or ``"none"``.

  Returns:
    A copy of the model whose methods run under qwix's interception
    (``quantized_model``), and the parameters with int8 weights (qwix's
    ``WithAux(QArray)`` leaves: ``.array.qvalue`` int8, ``.array.scale`` float32);
    both go wherever the float ones went.

  Raises:
    ValueError: an unknown mode, a model that cannot be quantized (named), or one that
      is quantized already.
  """
  int8_model = quantized_model(model, mode)
  if int8_model is model:
    return model, params
  import qwix  # pylint: disable=import-outside-toplevel

  as_arrays = jax.tree.map(jnp.asarray, nn.unbox(params))
  return int8_model, qwix.quantize_params(as_arrays, abstract_params(int8_model))


def is_quantized(params: PyTree) -> bool:
  """Whether ``params`` hold int8 weights (``quantize``'s output).

  Example:
    >>> is_quantized({"kernel": jnp.zeros((2, 2))})
    False
  """
  from seq2seq_jax.layers.quantized import is_quantized as leaf_is_quantized  # pylint: disable=import-outside-toplevel

  return any(leaf_is_quantized(leaf) for leaf in jax.tree.leaves(params, is_leaf=leaf_is_quantized))
