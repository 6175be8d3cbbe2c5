"""Reading and writing the tensors of a ``save_pretrained`` directory, without torch.

``model.safetensors`` (or a sharded ``model.safetensors.index.json``) is read with
the ``safetensors`` package into NumPy; bfloat16 tensors, which NumPy cannot name,
are decoded from their raw bytes through ``ml_dtypes``. A legacy ``pytorch_model.bin``
(torch's zip of a pickle and raw storages) is read by a restricted unpickler that
builds NumPy arrays and accepts nothing but tensors and plain containers.
"""

from __future__ import annotations

import collections
import json
import pathlib
import pickle
import struct
import zipfile
from typing import Any

import ml_dtypes
import numpy as np

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")

_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
                       "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32,
                       "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


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


def _read_safetensors_file(path: pathlib.Path) -> dict[str, np.ndarray]:
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel
  with open(path, "rb") as f:
    (header_len,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(header_len))
  tensors = {}
  with safe_open(str(path), framework="numpy") as f:
    for name in f.keys():
      if header[name]["dtype"] != "BF16":
        tensors[name] = f.get_tensor(name)
  bf16 = [name for name, info in header.items()
          if name != "__metadata__" and info["dtype"] == "BF16"]
  if bf16:
    with open(path, "rb") as f:
      data = f.read()
    for name in bf16:
      begin, end = header[name]["data_offsets"]
      raw = data[8 + header_len + begin: 8 + header_len + end]
      tensors[name] = np.frombuffer(raw, ml_dtypes.bfloat16).reshape(header[name]["shape"])
  return tensors


class _TorchUnpickler(pickle.Unpickler):
  """Unpickles a torch state dict into NumPy arrays; refuses every other global."""

  _STORAGES = {"FloatStorage": np.float32, "DoubleStorage": np.float64,
               "HalfStorage": np.float16, "BFloat16Storage": ml_dtypes.bfloat16,
               "LongStorage": np.int64, "IntStorage": np.int32, "BoolStorage": np.bool_,
               "ByteStorage": np.uint8}

  def __init__(self, file, archive: zipfile.ZipFile, prefix: str):
    super().__init__(file)
    self._archive = archive
    self._prefix = prefix

  def find_class(self, module: str, name: str):
    if module == "collections" and name == "OrderedDict":
      return collections.OrderedDict
    if module == "torch._utils" and name == "_rebuild_tensor_v2":
      return self._rebuild_tensor
    if module == "torch" and name in self._STORAGES:
      return self._STORAGES[name]
    raise pickle.UnpicklingError(f"pytorch_model.bin holds {module}.{name}, which is not a "
                                 "tensor; convert the checkpoint to model.safetensors")

  def persistent_load(self, pid):
    _, dtype, key, _, _ = pid  # ("storage", storage type, key, location, numel)
    raw = self._archive.read(f"{self._prefix}/data/{key}")
    return np.frombuffer(raw, dtype)

  @staticmethod
  def _rebuild_tensor(storage, offset, size, stride, *unused):
    del unused
    itemsize = storage.dtype.itemsize
    return np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride)).copy()


def _read_torch_bin(path: pathlib.Path) -> dict[str, np.ndarray]:
  if not zipfile.is_zipfile(path):
    raise ValueError(f"{path}: not a torch zip archive (a torch.save file of torch >= 1.6); "
                     "convert it to model.safetensors")
  with zipfile.ZipFile(path) as archive:
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
    if len(pickles) != 1:
      raise ValueError(f"{path}: expected one data.pkl in the archive, found {len(pickles)}")
    prefix = pickles[0][:-len("/data.pkl")]
    with archive.open(pickles[0]) as f:
      state = _TorchUnpickler(f, archive, prefix).load()
  if not isinstance(state, dict):
    raise ValueError(f"{path}: holds a {type(state).__name__}, not a state dict")
  return dict(state)


def read_weights(directory: pathlib.Path) -> tuple[dict[str, np.ndarray], pathlib.Path]:
  """All tensors of a checkpoint directory by name, and the file they came from."""
  for name in WEIGHT_FILES:
    path = directory / name
    if not path.is_file():
      continue
    if name == "model.safetensors":
      return _read_safetensors_file(path), path
    if name == "pytorch_model.bin":
      return _read_torch_bin(path), path
    index = read_json(path, "a weight index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
      raise ValueError(f"{path}: field 'weight_map' is missing or not an object")
    tensors = {}
    for shard in sorted(set(weight_map.values())):
      if not (directory / shard).is_file():
        raise ValueError(f"{path}: names shard {shard!r}, which is not in {directory}")
      tensors.update(_read_safetensors_file(directory / shard))
    return tensors, path
  raise ValueError(f"{directory}: no weights found; expected one of {', '.join(WEIGHT_FILES)} "
                   "(as save_pretrained writes them)")


def write_safetensors(tensors: dict[str, np.ndarray], path: pathlib.Path) -> None:
  """Writes float32 NumPy tensors as ``model.safetensors`` with the pt format tag."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path),
            metadata={"format": "pt"})
