"""Reading and writing the tensors of a ``save_pretrained`` directory, without torch.

``Weights`` names every tensor of a directory and reads them one at a time, so a
load holds the converted parameters and one tensor in flight, never a second copy
of the checkpoint. ``model.safetensors`` and the shards of a
``model.safetensors.index.json`` are read with this module's own header parser,
which checks that every tensor's bytes lie inside the file before any is read (a
file cut short or overwritten is named, with "truncated or corrupt"); bfloat16
tensors, which NumPy cannot name, are read through ``ml_dtypes``. A legacy
``pytorch_model.bin`` (torch's zip of a pickle and raw storages) is read by a
restricted unpickler that accepts nothing but tensors and plain containers, each
tensor's storage read when it is needed. Sharded PyTorch pickles are refused with
the recipe that rewrites them as safetensors.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import pathlib
import pickle
import struct
import zipfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ml_dtypes
import numpy as np

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
PICKLE_INDEX = "pytorch_model.bin.index.json"

_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
                       "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32,
                       "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
# safetensors' own limit on the JSON header (100 MB): a larger length field is damage.
_MAX_HEADER_BYTES = 100_000_000


def to_safetensors_recipe(directory: pathlib.Path) -> str:
  """The command that rewrites a checkpoint's weights as ``model.safetensors``."""
  return (f"write them as safetensors with transformers: python -c \"import transformers; "
          f"transformers.AutoModelForSeq2SeqLM.from_pretrained('{directory}')"
          f".save_pretrained('{directory}', safe_serialization=True)\"")


def read_json(path: pathlib.Path, what: str) -> dict[str, Any]:
  """A JSON object from ``path``; a missing or malformed file raises naming it."""
  if not path.is_file():
    raise ValueError(f"{path}: not found; a save_pretrained directory has {what}")
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as error:
    raise ValueError(f"{path}: not valid JSON ({error})") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
  return value


# ---------------------------------------------------------------------------------------------
# safetensors


@dataclasses.dataclass(frozen=True)
class _Entry:
  """Where one tensor lies: its file, dtype, shape and absolute byte offset."""

  path: pathlib.Path
  dtype: np.dtype
  shape: tuple[int, ...]
  offset: int


def _corrupt(path: pathlib.Path, detail: str) -> ValueError:
  return ValueError(f"{path}: truncated or corrupt safetensors file ({detail}); download or "
                    "save it again")


def read_safetensors_header(path: pathlib.Path) -> dict[str, _Entry]:
  """The tensors of one safetensors file, checked against the file's size.

  The layout: an 8-byte little-endian header length N, N bytes of JSON mapping each
  name to its dtype, shape and ``data_offsets`` (relative to the end of the header),
  then the tensors' bytes, contiguous, covering the rest of the file exactly.

  Raises:
    ValueError: naming the file and "truncated or corrupt", for a file shorter
      than its header or its data, a header that is not JSON, or entries whose
      offsets do not match their shapes or the file.
  """
  size = path.stat().st_size
  with open(path, "rb") as f:
    if size < 8:
      raise _corrupt(path, f"{size} bytes, fewer than the 8 of the header length")
    (header_len,) = struct.unpack("<Q", f.read(8))
    if header_len > min(_MAX_HEADER_BYTES, size - 8):
      raise _corrupt(path, f"the header length field says {header_len} bytes but the file "
                           f"holds {size - 8} after it")
    raw = f.read(header_len)
  try:
    header = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
    raise _corrupt(path, f"its {header_len}-byte header is not JSON: {error}") from None
  if not isinstance(header, dict):
    raise _corrupt(path, "its header is not a JSON object")
  data_start, data_len = 8 + header_len, size - 8 - header_len
  entries, spans = {}, []
  for name, info in header.items():
    if name == "__metadata__":
      continue
    try:
      dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
      shape = tuple(int(n) for n in info["shape"])
      begin, end = (int(n) for n in info["data_offsets"])
    except (KeyError, TypeError, ValueError):
      raise _corrupt(path, f"the header entry of tensor {name!r} is malformed: {info!r}") from None
    if any(n < 0 for n in shape) or not 0 <= begin <= end:
      raise _corrupt(path, f"tensor {name!r} has shape {shape} at bytes [{begin}, {end})")
    if end - begin != math.prod(shape) * dtype.itemsize:
      raise _corrupt(path, f"tensor {name!r}: {end - begin} bytes for {info['dtype']} {shape}")
    if end > data_len:
      raise _corrupt(path, f"tensor {name!r} ends at data byte {end} but the file holds "
                           f"{data_len} bytes of data")
    entries[name] = _Entry(path, dtype, shape, data_start + begin)
    spans.append((begin, end, name))
  spans.sort()
  position = 0
  for begin, end, name in spans:
    if begin != position:
      raise _corrupt(path, f"tensor {name!r} starts at data byte {begin}, expected {position}")
    position = end
  if position != data_len:
    raise _corrupt(path, f"its tensors cover {position} of its {data_len} data bytes")
  return entries


# XLA's CPU client takes a host buffer without copying it only at this alignment.
ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
  """An uninitialized C-contiguous array whose data starts at a multiple of ``ALIGNMENT``.

  ``jax.device_put(array, may_alias=True)`` then shares its memory on the CPU instead
  of copying it: a load holds each tensor once, not twice.
  """
  nbytes = math.prod(shape) * np.dtype(dtype).itemsize
  raw = np.empty(nbytes + ALIGNMENT, np.uint8)
  start = -raw.ctypes.data % ALIGNMENT
  return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned_copy(value: np.ndarray, dtype: Any = None) -> np.ndarray:
  """``value`` (cast to ``dtype``) copied into an ``aligned_empty`` array."""
  copy = aligned_empty(value.shape, value.dtype if dtype is None else dtype)
  copy[...] = value
  return copy


def _read_entry(entry: _Entry) -> np.ndarray:
  count = math.prod(entry.shape)
  with open(entry.path, "rb") as f:
    f.seek(entry.offset)
    array = aligned_empty((count,), entry.dtype)
    if f.readinto(memoryview(array.view(np.uint8))) != array.nbytes:
      raise _corrupt(entry.path, "it became shorter while being read")
  return array.reshape(entry.shape)


# ---------------------------------------------------------------------------------------------
# pytorch_model.bin


@dataclasses.dataclass(frozen=True)
class _LazyStorage:
  key: str
  dtype: Any


@dataclasses.dataclass(frozen=True)
class _LazyTensor:
  storage: _LazyStorage
  offset: int
  shape: tuple[int, ...]
  stride: tuple[int, ...]


class _TorchUnpickler(pickle.Unpickler):
  """Unpickles a torch state dict into ``_LazyTensor`` handles; refuses every other global."""

  _STORAGES = {"FloatStorage": np.float32, "DoubleStorage": np.float64,
               "HalfStorage": np.float16, "BFloat16Storage": ml_dtypes.bfloat16,
               "LongStorage": np.int64, "IntStorage": np.int32, "BoolStorage": np.bool_,
               "ByteStorage": np.uint8}

  def __init__(self, file, path: pathlib.Path):
    super().__init__(file)
    self._path = path

  def find_class(self, module: str, name: str):
    if module == "collections" and name == "OrderedDict":
      return collections.OrderedDict
    if module == "torch._utils" and name == "_rebuild_tensor_v2":
      return self._rebuild_tensor
    if module == "torch" and name in self._STORAGES:
      return self._STORAGES[name]
    raise pickle.UnpicklingError(
        f"{self._path}: holds {module}.{name}, which is not a tensor; "
        f"{to_safetensors_recipe(self._path.parent)}")

  def persistent_load(self, pid):
    _, dtype, key, _, _ = pid  # ("storage", storage type, key, location, numel)
    return _LazyStorage(str(key), dtype)

  @staticmethod
  def _rebuild_tensor(storage, offset, size, stride, *unused):
    del unused
    return _LazyTensor(storage, int(offset), tuple(size), tuple(stride))


def _read_torch_index(path: pathlib.Path) -> tuple[dict[str, _LazyTensor], str]:
  recipe = to_safetensors_recipe(path.parent)
  if not zipfile.is_zipfile(path):
    raise ValueError(f"{path}: not a torch zip archive (a torch.save file of torch >= 1.6), "
                     f"or truncated or corrupt; {recipe}")
  try:
    with zipfile.ZipFile(path) as archive:
      pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
      if len(pickles) != 1:
        raise ValueError(f"{path}: expected one data.pkl in the archive, found "
                         f"{len(pickles)}; {recipe}")
      prefix = pickles[0][:-len("/data.pkl")]
      with archive.open(pickles[0]) as f:
        state = _TorchUnpickler(f, path).load()
  except (zipfile.BadZipFile, EOFError, pickle.UnpicklingError, OSError) as error:
    if isinstance(error, pickle.UnpicklingError) and str(error).startswith(str(path)):
      raise ValueError(str(error)) from None
    raise ValueError(f"{path}: truncated or corrupt ({type(error).__name__}: {error}); "
                     f"{recipe}") from None
  if not isinstance(state, dict):
    raise ValueError(f"{path}: holds a {type(state).__name__}, not a state dict; {recipe}")
  tensors = {name: value for name, value in state.items() if isinstance(value, _LazyTensor)}
  return tensors, prefix


def _read_torch_tensor(path: pathlib.Path, prefix: str, tensor: _LazyTensor) -> np.ndarray:
  try:
    with zipfile.ZipFile(path) as archive:
      raw = archive.read(f"{prefix}/data/{tensor.storage.key}")
  except (zipfile.BadZipFile, KeyError, OSError) as error:
    raise ValueError(f"{path}: truncated or corrupt ({type(error).__name__}: {error}); "
                     f"{to_safetensors_recipe(path.parent)}") from None
  storage = np.frombuffer(raw, tensor.storage.dtype)
  itemsize = storage.dtype.itemsize
  last = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride))
  if math.prod(tensor.shape) and last >= storage.size:
    raise ValueError(f"{path}: truncated or corrupt (a tensor reads past its storage "
                     f"{tensor.storage.key}); {to_safetensors_recipe(path.parent)}")
  return np.lib.stride_tricks.as_strided(
      storage[tensor.offset:], shape=tensor.shape,
      strides=tuple(s * itemsize for s in tensor.stride)).copy()


# ---------------------------------------------------------------------------------------------
# A directory's weights


class Weights:
  """Every tensor of a checkpoint directory by name, read one at a time.

  Attributes:
    path: the file errors name: ``model.safetensors``, the shard index, or
      ``pytorch_model.bin``.
  """

  def __init__(self, path: pathlib.Path, shapes: dict[str, tuple[int, ...]],
               files: dict[str, pathlib.Path], reader: Callable[[str], np.ndarray]):
    self.path = path
    self._shapes = shapes
    self._files = files
    self._reader = reader

  def __contains__(self, name: object) -> bool:
    return name in self._shapes

  def __iter__(self) -> Iterator[str]:
    return iter(self._shapes)

  def __len__(self) -> int:
    return len(self._shapes)

  def shape(self, name: str) -> tuple[int, ...]:
    return self._shapes[name]

  def file_of(self, name: str) -> pathlib.Path:
    """The file holding tensor ``name`` (its shard, for a sharded checkpoint)."""
    return self._files[name]

  def read(self, name: str) -> np.ndarray:
    """Tensor ``name`` as a fresh NumPy array in its stored dtype."""
    return self._reader(name)


def _safetensors_weights(path: pathlib.Path, shards: Sequence[pathlib.Path]) -> Weights:
  entries: dict[str, _Entry] = {}
  for shard in shards:
    entries.update(read_safetensors_header(shard))
  return Weights(path, {n: e.shape for n, e in entries.items()},
                 {n: e.path for n, e in entries.items()}, lambda name: _read_entry(entries[name]))


def read_weights(directory: pathlib.Path) -> Weights:
  """The tensors of a checkpoint directory, checked but not yet read.

  ``model.safetensors``, else the shards a ``model.safetensors.index.json`` names
  (every name of its ``weight_map`` must be in the shard it names), else a
  ``pytorch_model.bin``.

  Raises:
    ValueError: naming the file: no weights, sharded PyTorch pickles (with the
      command that rewrites them as safetensors), a damaged file or index.
  """
  for name in WEIGHT_FILES:
    path = directory / name
    if not path.is_file():
      continue
    if name == "model.safetensors":
      return _safetensors_weights(path, [path])
    if name == "pytorch_model.bin":
      tensors, prefix = _read_torch_index(path)
      return Weights(path, {n: t.shape for n, t in tensors.items()},
                     {n: path for n in tensors},
                     lambda n: _read_torch_tensor(path, prefix, tensors[n]))
    index = read_json(path, "a weight index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(v, str) for v in weight_map.values()):
      raise ValueError(f"{path}: field 'weight_map' is missing or does not map tensor names "
                       "to shard files")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
      if pathlib.PurePath(shard).name != shard or not (directory / shard).is_file():
        raise ValueError(f"{path}: names shard {shard!r}, which is not a file in {directory}")
    weights = _safetensors_weights(path, [directory / shard for shard in shards])
    for tensor, shard in weight_map.items():
      if tensor not in weights or weights.file_of(tensor).name != shard:
        raise ValueError(f"{path}: weight_map puts tensor {tensor!r} in {shard}, which does "
                         "not hold it; the index and the shards come from different saves")
    return weights
  if (directory / PICKLE_INDEX).is_file():
    raise ValueError(f"{directory / PICKLE_INDEX}: the weights are sharded PyTorch pickles "
                     f"(pytorch_model-*.bin), which this library does not read; "
                     f"{to_safetensors_recipe(directory)}")
  raise ValueError(f"{directory}: no weights found; expected one of {', '.join(WEIGHT_FILES)} "
                   "(as save_pretrained writes them)")


def write_safetensors(tensors: Sequence[tuple[str, tuple[int, ...], Callable[[], np.ndarray]]],
                      path: pathlib.Path) -> None:
  """Writes float32 tensors as a safetensors file with the pt format tag, one at a time.

  ``tensors``: ``(name, shape, produce)`` triples; ``produce()`` returns the tensor
  when its bytes are written, so only one is held in memory beyond the caller's.
  """
  header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
  offset = 0
  for name, shape, _ in tensors:
    size = math.prod(shape) * 4
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
    offset += size
  raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
  raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
  partial = path.with_name(path.name + ".partial")
  with open(partial, "wb") as f:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for name, shape, produce in tensors:
      value = np.ascontiguousarray(produce(), dtype=np.float32)
      if value.shape != tuple(shape):
        raise ValueError(f"{path}: tensor {name!r} has shape {value.shape}, expected {shape}")
      f.write(memoryview(value.reshape(-1).view(np.uint8)))
  partial.replace(path)
