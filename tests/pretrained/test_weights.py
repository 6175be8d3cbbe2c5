"""Weights files: sharded safetensors, and a named error for every damaged or unreadable file.

A small random MarianMT checkpoint (seconds to build) is damaged in each way the
issue lists: cut short in its header or its data, bytes overwritten in the header,
NaNs written into a tensor, shards missing or mislabelled, pickled shards only,
tokenizer files of another size than config.json. Each load must fail with a
``ValueError`` naming the file (and the tensor or field), never another exception.
"""

import json
import math
import shutil
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest

from seq2seq_jax import pretrained
from seq2seq_jax.pretrained import _io
from seq2seq_jax.pretrained._convert import place
from tests.pretrained.conftest import add_marian_tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
  """A random MarianMT with encoder and decoder apart, no tokenizer files."""
  torch.manual_seed(0)
  config = transformers.MarianConfig(
      vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
      decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=40,
      max_position_embeddings=64, pad_token_id=96, eos_token_id=0, decoder_start_token_id=96)
  directory = tmp_path_factory.mktemp("random") / "marian"
  transformers.MarianMTModel(config).save_pretrained(directory)
  return directory


def _copy(directory, tmp_path, name="copy"):
  copy = tmp_path / name
  shutil.copytree(directory, copy)
  return copy


def _header(path):
  raw = path.read_bytes()
  (length,) = struct.unpack("<Q", raw[:8])
  return length, json.loads(raw[8:8 + length])


def _load_fails(directory, match, *, with_tokenizer=False):
  """``pretrained.load(directory)`` raises a ValueError matching ``match``."""
  with pytest.raises(ValueError, match=match):
    pretrained.load(directory, with_tokenizer=with_tokenizer)


def _edit_json(path, **fields):
  """Sets ``fields`` in the JSON object of file ``path``."""
  path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _params_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _write_shards(directory, names_per_shard):
  """Splits model.safetensors into shards of the given tensor names, with an index."""
  _, header = _header(directory / "model.safetensors")
  from safetensors.numpy import load_file, save_file
  tensors = load_file(str(directory / "model.safetensors"))
  weight_map = {}
  total = len(names_per_shard)
  for i, names in enumerate(names_per_shard, start=1):
    shard = f"model-{i:05d}-of-{total:05d}.safetensors"
    save_file({n: tensors[n] for n in names}, str(directory / shard), metadata={"format": "pt"})
    weight_map.update({n: shard for n in names})
  (directory / "model.safetensors").unlink()
  size = sum(t.nbytes for t in tensors.values())
  (directory / "model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {"total_size": size}, "weight_map": weight_map}))
  return weight_map


def test_sharded_safetensors_load_like_one_file(random_dir, tmp_path):
  whole = pretrained.load(random_dir, with_tokenizer=False)
  copy = _copy(random_dir, tmp_path)
  _, header = _header(copy / "model.safetensors")
  names = sorted(n for n in header if n != "__metadata__")
  weight_map = _write_shards(copy, [names[0::3], names[1::3], names[2::3]])
  assert len(set(weight_map.values())) == 3
  sharded = pretrained.load(copy, with_tokenizer=False)
  assert sharded.config == whole.config
  _params_equal(sharded.params, whole.params)


def test_loaded_tensors_are_not_held_twice_on_the_cpu(random_dir):
  """Tensors are read into buffers that XLA's CPU client adopts without a copy."""
  weights = _io.read_weights(random_dir)
  for name in weights:
    assert weights.read(name).ctypes.data % _io.ALIGNMENT == 0, name
  kept = weights.read("model.shared.weight").astype(np.float32)
  stored = _io.aligned_copy(kept)
  placed = place(stored)
  if jax.default_backend() == "cpu":
    assert placed.unsafe_buffer_pointer() == stored.ctypes.data  # the same memory
  transposed = place(kept.T)  # not contiguous: copied once, into an aligned buffer
  np.testing.assert_array_equal(np.asarray(placed), kept)
  np.testing.assert_array_equal(np.asarray(transposed), kept.T)
  # A load goes through the same path and gives the file's values.
  loaded = pretrained.load(random_dir, with_tokenizer=False)
  np.testing.assert_array_equal(np.asarray(loaded.params["source_embedding"]["embedding"]), kept)


def test_sharded_index_errors_name_the_index_and_shard(random_dir, tmp_path):
  copy = _copy(random_dir, tmp_path)
  _, header = _header(copy / "model.safetensors")
  names = sorted(n for n in header if n != "__metadata__")
  weight_map = _write_shards(copy, [names[:5], names[5:]])
  index = copy / "model.safetensors.index.json"
  first, second = sorted(set(weight_map.values()))
  # The index says a tensor lies in the other shard.
  wrong = {**weight_map, names[0]: second}
  index.write_text(json.dumps({"weight_map": wrong}))
  _load_fails(copy, rf"index.json: weight_map puts tensor '{names[0]}' in "
                    rf"{second}, which does not hold it")
  index.write_text(json.dumps({"weight_map": weight_map}))
  (copy / second).unlink()
  _load_fails(copy, rf"index.json: names shard '{second}', which is not a file")
  index.write_text(json.dumps({"weights": {}}))
  _load_fails(copy, "index.json: field 'weight_map' is missing")


def test_truncated_data_names_the_file(random_dir, tmp_path):
  copy = _copy(random_dir, tmp_path)
  path = copy / "model.safetensors"
  raw = path.read_bytes()
  path.write_bytes(raw[:len(raw) - 1000])
  _load_fails(copy, r"model.safetensors: truncated or corrupt safetensors "
                    r"file \(tensor .* ends at data byte")


@pytest.mark.parametrize("cut", [4, 8 + 40, "header_end"])
def test_truncated_header_names_the_file(random_dir, tmp_path, cut):
  copy = _copy(random_dir, tmp_path)
  path = copy / "model.safetensors"
  raw = path.read_bytes()
  length, _ = _header(path)
  end = 8 + length - 3 if cut == "header_end" else cut
  path.write_bytes(raw[:end])
  _load_fails(copy, r"model.safetensors: truncated or corrupt safetensors")


def test_overwritten_header_names_the_file(random_dir, tmp_path):
  copy = _copy(random_dir, tmp_path)
  path = copy / "model.safetensors"
  raw = bytearray(path.read_bytes())
  raw[8 + 100:8 + 110] = b"\x00" * 10
  path.write_bytes(bytes(raw))
  _load_fails(copy, r"model.safetensors: truncated or corrupt safetensors "
                    r"file \(its \d+-byte header is not JSON")
  raw = bytearray(path.read_bytes())
  raw[:8] = struct.pack("<Q", 1 << 40)  # a length field past the end of the file
  path.write_bytes(bytes(raw))
  _load_fails(copy, "the header length field says 1099511627776 bytes")


def test_nan_in_a_tensor_names_the_tensor(random_dir, tmp_path):
  copy = _copy(random_dir, tmp_path)
  path = copy / "model.safetensors"
  length, header = _header(path)
  name = "model.encoder.layers.1.fc1.weight"
  begin, end = header[name]["data_offsets"]
  raw = bytearray(path.read_bytes())
  middle = 8 + length + (begin + end) // 2 // 4 * 4
  raw[middle:middle + 12] = np.array([np.nan, np.inf, -np.inf], np.float32).tobytes()
  path.write_bytes(bytes(raw))
  _load_fails(copy, rf"model.safetensors: tensor '{name}' \(48, 32\) holds 3 "
                    r"non-finite values \(NaN or infinity\)")
  # The check can be turned off, for a file known to hold infinities on purpose.
  loaded = pretrained.load(copy, with_tokenizer=False, check_finite=False)
  kernel = loaded.params["encoder_layers_1"]["feed_forward"]["wi"]["kernel"]
  assert np.isnan(np.asarray(kernel)).sum() == 1


def test_shape_mismatch_names_tensor_parameter_and_file(random_dir, tmp_path):
  copy = _copy(random_dir, tmp_path)
  _edit_json(copy / "config.json", decoder_ffn_dim=56)
  _load_fails(copy, r"model.safetensors: tensor "
                    r"'model.decoder.layers.0.fc1.weight' has shape \(40, 32\), "
                    r"which does not fit parameter "
                    r"decoder_layers_0/feed_forward/wi/kernel \(32, 56\)")


def test_pickle_shards_only_say_how_to_write_safetensors(random_dir, tmp_path):
  copy = _copy(random_dir, tmp_path)
  (copy / "model.safetensors").unlink()
  (copy / "pytorch_model.bin.index.json").write_text(json.dumps(
      {"weight_map": {"model.shared.weight": "pytorch_model-00001-of-00002.bin"}}))
  _load_fails(copy, r"pytorch_model.bin.index.json: the weights are sharded "
                    r"PyTorch pickles .*save_pretrained\(.*"
                    r"safe_serialization=True\)")


def test_damaged_pytorch_model_bin_says_how_to_write_safetensors(random_dir, tmp_path):
  copy = _copy(random_dir, tmp_path)
  (copy / "model.safetensors").unlink()
  model = transformers.MarianMTModel.from_pretrained(random_dir)
  torch.save(model.state_dict(), copy / "pytorch_model.bin")
  _params_equal(pretrained.load(copy, with_tokenizer=False).params,
                pretrained.load(random_dir, with_tokenizer=False).params)
  raw = (copy / "pytorch_model.bin").read_bytes()
  (copy / "pytorch_model.bin").write_bytes(raw[:len(raw) // 2])
  _load_fails(copy, r"pytorch_model.bin: .*truncated or corrupt.*"
                    r"safe_serialization=True")


def test_tokenizer_larger_than_the_vocabulary_names_both_files(marian_dir, tmp_path):
  copy = _copy(marian_dir, tmp_path)
  add_marian_tokens(copy, [f"▁extra{i}" for i in range(5)])
  _load_fails(copy, r"vocab.json: the tokenizer has \d+ target ids but "
                    r".*config.json gives the model \d+ \(vocab_size\)", with_tokenizer=True)


def test_t5_tokenizer_larger_than_the_vocabulary_names_both_files(t5_dir, tmp_path):
  copy = _copy(t5_dir, tmp_path)
  _edit_json(copy / "tokenizer_config.json", extra_ids=400)
  _load_fails(copy, r"spiece.model: the tokenizer has \d+ target ids but "
                    r".*config.json gives the model \d+", with_tokenizer=True)


def test_the_command_line_prints_one_error_line_not_a_traceback(random_dir, tmp_path):
  copy = _copy(random_dir, tmp_path)
  path = copy / "model.safetensors"
  path.write_bytes(path.read_bytes()[:100])
  result = subprocess.run([sys.executable, "-m", "seq2seq_jax.cli", "translate", "--pretrained",
                           str(copy)], input="Ein Hund.\n", capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  assert f"error: {path}: truncated or corrupt safetensors file" in result.stderr


def test_saving_writes_tensors_one_at_a_time_in_safetensors_layout(random_dir, tmp_path):
  checkpoint = pretrained.load(random_dir, with_tokenizer=False)
  pretrained.save(checkpoint, tmp_path / "saved")
  entries = _io.read_safetensors_header(tmp_path / "saved" / "model.safetensors")
  length, header = _header(tmp_path / "saved" / "model.safetensors")
  assert header["__metadata__"] == {"format": "pt"}
  assert (8 + length) % 8 == 0  # the data starts aligned
  total = sum(math.prod(e.shape) * 4 for e in entries.values())
  assert (tmp_path / "saved" / "model.safetensors").stat().st_size == 8 + length + total
  from safetensors.numpy import load_file
  theirs = load_file(str(tmp_path / "saved" / "model.safetensors"))
  assert set(theirs) == set(entries)
