"""Compile targets: TPU chips and slices the library can compile for without owning one.

With libtpu installed (``pip install "jax[tpu]"``, or this project's ``tpu``
extra), ``jax.experimental.topologies`` describes the devices of a TPU slice that
is not there: a ``Mesh`` over them and ``jit(...).lower(...).compile()`` run the
real TPU compiler on this machine, CPU only. ``parse_target`` reads the names
users know (``"v5e:2x4"``, ``"v5e-8"``, Colab's ``"v5e-1"``), ``target_devices``
builds the abstract devices, and ``CHIPS`` holds each chip's published figures,
which turn the compiler's FLOPs and bytes into estimated times.

Example:
  >>> target = parse_target("v5e-8")
  >>> target.topology, target.chips, target.chip.hbm_bytes // 2**30
  ('v5e:2x4', 8, 16)
  >>> parse_target("v7x:2x2")
  Traceback (most recent call last):
  ...
  ValueError: unknown chip 'v7x' in target 'v7x:2x2'; known chips: v3, v4, v5e, v5p, v6e...
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's published figures (per chip, dense bfloat16).

  Attributes:
    name: the short name (``"v5e"``).
    device_kind: what ``jax.Device.device_kind`` reports for it.
    hbm_bytes: high-bandwidth memory per chip.
    peak_flops: dense bfloat16 FLOP/s per chip.
    hbm_bandwidth: HBM bytes/s per chip.
    source: where the three figures are published.
    topology_name: libtpu's name of the chip in a topology (``"v5e"``, ``"v5"`` for v5p).
    chip_config: libtpu's chip configuration (``"megacore"``: both TensorCores of a
      chip as one device).
    cores_per_chip: TensorCores per chip; Cloud TPU names v3, v4 and v5p slices by cores
      (``v4-8`` is 4 chips) and v5e and v6e slices by chips.
    axes: the interconnect's dimensions (3 for v4 and v5p's 3D torus, 2 otherwise).
    host_bounds: chips of one host along each axis (``chips_per_host_bounds``).
  """

  name: str
  device_kind: str
  hbm_bytes: int
  peak_flops: float
  hbm_bandwidth: float
  source: str
  topology_name: str
  chip_config: str = "default"
  cores_per_chip: int = 1
  axes: int = 2
  host_bounds: tuple[int, int, int] = (2, 2, 1)
  platform: str = "tpu"

  @property
  def dims(self) -> int:
    """2 for the 2D-torus chips (v3, v5e, v6e), 3 for the 3D ones (v4, v5p), 1 for GPUs."""
    return self.axes if self.platform == "tpu" else 1

  @property
  def devices_per_chip(self) -> int:
    """JAX devices a chip: its TensorCores, unless megacore joins them into one (v4, v5p);
    on v3 each of the two is a device with half the chip's HBM and FLOPs."""
    return 1 if self.chip_config == "megacore" else self.cores_per_chip

  # What one JAX device has, which is what a compiled program's figures are per.
  @property
  def device_hbm_bytes(self) -> int:
    return self.hbm_bytes // self.devices_per_chip

  @property
  def device_peak_flops(self) -> float:
    return self.peak_flops / self.devices_per_chip

  @property
  def device_hbm_bandwidth(self) -> float:
    return self.hbm_bandwidth / self.devices_per_chip


GiB = 2 ** 30
CHIPS: dict[str, Chip] = {
    "v3": Chip("v3", "TPU v3", 32 * GiB, 123e12, 900e9,
               "https://cloud.google.com/tpu/docs/v3 (123 TFLOPs bf16, 32 GiB HBM2, 900 GBps)",
               topology_name="v3", cores_per_chip=2),
    "v4": Chip("v4", "TPU v4", 32 * GiB, 275e12, 1200e9,
               "https://cloud.google.com/tpu/docs/v4 (275 TFLOPs bf16, 32 GiB HBM2, 1200 GBps)",
               topology_name="v4", chip_config="megacore", cores_per_chip=2, axes=3),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GiB, 197e12, 819e9,
                "https://cloud.google.com/tpu/docs/v5e (197 TFLOPs bf16, 16 GB HBM2, 819 GBps)",
                topology_name="v5e"),
    "v5p": Chip("v5p", "TPU v5", 95 * GiB, 459e12, 2765e9,
                "https://cloud.google.com/tpu/docs/v5p (459 TFLOPs bf16, 95 GB HBM2e, 2765 GBps)",
                topology_name="v5", chip_config="megacore", cores_per_chip=2, axes=3),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GiB, 918e12, 1638e9,
                "https://cloud.google.com/tpu/docs/v6e (918 TFLOPs bf16, 32 GB HBM, 1638 GBps)",
                topology_name="v6e"),
    # XLA's GPU compiler, through jax's CUDA plugin (the stretch: no cost analysis).
    "h100": Chip("h100", "NVIDIA H100 80GB HBM3", 80 * 10**9, 989e12, 3.35e12,
                 "https://www.nvidia.com/en-us/data-center/h100/ (SXM: 989 TFLOPS dense bf16, "
                 "80 GB HBM3, 3.35 TB/s)", topology_name="h100", platform="cuda"),
}

# What XLA's GPU compiler needs to know of an H100 SXM to compile for one it cannot see
# (a GpuTargetConfigProto, text format): the figures of NVIDIA's published specification.
_H100_TARGET_CONFIG = """gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84978434048 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
device_description_str: "NVIDIA H100 80GB HBM3"
"""

# Cloud TPU accelerator types ("v5e-8") -> the slice's topology (chips along each axis).
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
              256: "16x16"}
_SHAPES_3D = {1: "1x1x1", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
              128: "4x4x8", 256: "4x8x8", 512: "8x8x8"}
EXAMPLES = ("v5e:2x4", "v5e-8", "v5e-1", "v6e-1", "v6e:2x2", "v4:2x2x1", "v4-8", "v5p:2x2x1",
            "v5p-8", "v3-8", "v3:4x4", "h100", "h100-8")


@dataclasses.dataclass(frozen=True)
class Target:
  """A TPU slice to compile for.

  Attributes:
    name: as the user wrote it.
    chip: the chip's figures.
    topology: canonical ``"CHIP:AxB[xC]"`` (``"v5e:2x4"``).
    shape: chips along each axis.
  """

  name: str
  chip: Chip
  topology: str
  shape: tuple[int, ...]

  @property
  def chips(self) -> int:
    return math.prod(self.shape)

  @property
  def devices(self) -> int:
    """JAX devices: the chips, or on v3 their TensorCores (``v3-8``: 4 chips, 8 devices)."""
    return self.chips * self.chip.devices_per_chip


def known_targets() -> str:
  """A line naming the known chips and example targets, for error messages."""
  return (f"known chips: {', '.join(CHIPS)}; write a target as CHIP:TOPOLOGY or as a Cloud TPU "
          f"accelerator type, e.g. {', '.join(EXAMPLES)}")


def parse_target(name: str) -> Target:
  """The ``Target`` a name describes: ``"v5e:2x4"`` or ``"v5e-8"`` (Cloud TPU's type).

  Raises:
    ValueError: an unknown chip or a malformed topology; the message lists the known ones.
  """
  text = name.strip().lower()
  match = re.fullmatch(r"([a-z0-9]+)(?::([0-9x]+)|-([0-9]+))", text)
  if text in CHIPS and CHIPS[text].platform != "tpu":  # "h100": one GPU
    text, match = f"{text}-1", re.fullmatch(r"([a-z0-9]+)-([0-9]+)", f"{text}-1")
  if not match:
    raise ValueError(f"target {name!r} is neither CHIP:TOPOLOGY nor CHIP-COUNT; "
                     + known_targets())
  chip_name, topology, count = (match.groups() if match.re.groups == 3
                                else (match.group(1), None, match.group(2)))
  if chip_name not in CHIPS:
    raise ValueError(f"unknown chip {chip_name!r} in target {name!r}; " + known_targets())
  chip = CHIPS[chip_name]
  if chip.platform != "tpu":
    if count is None or int(count) < 1:
      raise ValueError(f"target {name!r}: write GPUs as {chip_name} or {chip_name}-N (N GPUs)")
    return Target(name=name, chip=chip, topology=f"{chip_name}-{int(count)}",
                  shape=(int(count),))
  if count is not None:
    shapes = _SHAPES_3D if chip.dims == 3 else _SHAPES_2D
    cores = int(count)
    chips = max(cores // chip.cores_per_chip, 1) if cores > 1 else 1
    if cores % chip.cores_per_chip and cores != 1 or chips not in shapes:
      unit = "TensorCores (2 a chip)" if chip.cores_per_chip == 2 else "chips"
      raise ValueError(f"target {name!r}: {chip_name} slices are named by their {unit}; "
                       f"known sizes: {', '.join(f'{chip_name}-{n * chip.cores_per_chip}' for n in shapes if n > 1)}"
                       f"; or write the topology, e.g. {chip_name}:{shapes[4]}")
    topology = shapes[chips]
  shape = tuple(int(x) for x in topology.split("x") if x)
  if len(shape) != chip.dims or min(shape) < 1 or "x" not in topology:
    raise ValueError(f"target {name!r}: a {chip_name} topology has {chip.dims} axes "
                     f"(e.g. {chip_name}:{_SHAPES_3D[4] if chip.dims == 3 else _SHAPES_2D[8]}); "
                     + known_targets())
  return Target(name=name, chip=chip, topology=f"{chip_name}:{'x'.join(map(str, shape))}",
                shape=shape)


def quiet_libtpu() -> None:
  """Prepares libtpu for compiling only, on a machine without TPU chips (else does nothing).

  libtpu looks for the TPU it runs on in the environment (or a metadata server)
  and prints several lines when it finds none, although a compile-only topology
  needs none; and it lets one process at a time load it (``/tmp/libtpu_lockfile``),
  which would serialize compiles that share no device. Sets, where unset,
  ``TPU_ACCELERATOR_TYPE``, ``TPU_WORKER_HOSTNAMES``, ``TPU_SKIP_MDS_QUERY`` and
  ``ALLOW_MULTIPLE_LIBTPU_LOAD`` before libtpu loads.
  """
  from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
  if hardware_utils.num_available_tpu_chips_and_device_id()[0]:
    return
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def libtpu_installed() -> bool:
  """Whether libtpu (the TPU compiler) can be loaded here."""
  from jax._src.cloud_tpu_init import get_tpu_library_path  # pylint: disable=import-outside-toplevel
  return get_tpu_library_path() is not None


@functools.lru_cache(maxsize=None)
def _devices(topology: str, chip_config: str, host_bounds: tuple[int, ...]) -> tuple[Any, ...]:
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  quiet_libtpu()
  description = topologies.get_topology_desc(
      topology_name=topology, platform="tpu", chip_config_name=chip_config,
      chips_per_host_bounds=host_bounds, wrap=(False,) * len(host_bounds))
  return tuple(description.devices)


def _gpu_devices(target: Target) -> list[Any]:
  """Compile-only H100s from jax's CUDA plugin, which needs no GPU and no CUDA here."""
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:
    import jax_plugins.xla_cuda12  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise ValueError(f"compiling for {target.name} needs jax's CUDA plugin: pip install "
                     f"jax-cuda12-plugin=={jax.__version__} jax-cuda12-pjrt=={jax.__version__} "
                     "(no GPU needed; without CUDA libraries set "
                     "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1)") from None
  try:
    description = topologies.get_topology_desc(
        topology_name=target.topology, platform="cuda", target_config=_H100_TARGET_CONFIG,
        topology=f"1x1x{target.chips}")
  except (NotImplementedError, RuntimeError) as error:
    raise ValueError(f"jax's CUDA plugin could not describe {target.name}: {error}. Without a "
                     "GPU, run with JAX_PLATFORMS=cpu and JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 "
                     "so that the plugin registers without CUDA") from None
  return list(description.devices)


def target_devices(target: Target) -> list[Any]:
  """The compile-only devices of ``target`` (one per chip, per TensorCore on v3), in order.

  Raises:
    ValueError: libtpu (or for a GPU, jax's CUDA plugin) is not installed; the message
      says how to install it.
  """
  if target.chip.platform == "cuda":
    return _gpu_devices(target)
  if not libtpu_installed():
    raise ValueError(
        f"compiling for {target.name} needs the TPU compiler, libtpu: pip install "
        f"'jax[tpu]=={jax.__version__}' (or this project's 'tpu' extra); no TPU is needed")
  chip = target.chip
  shape3 = tuple(target.shape) + (1,) * (3 - len(target.shape))
  bounds = tuple(min(s, b) for s, b in zip(shape3, chip.host_bounds))
  libtpu_name = f"{chip.topology_name}:{'x'.join(map(str, target.shape))}"
  return list(_devices(libtpu_name, chip.chip_config, bounds))


def target_mesh(target: Target, model_parallelism: int = 1) -> Mesh:
  """The library's ``("data", "model")`` mesh over ``target``'s chips.

  Laid out by ``mesh_utils`` as on the real slice, so that the ``model`` axis (tensor
  parallelism, whose all-reduces run every layer) takes neighbouring chips.
  """
  from jax.experimental import mesh_utils  # pylint: disable=import-outside-toplevel

  from seq2seq_jax.training.sharding import MESH_AXES  # pylint: disable=import-outside-toplevel
  devices = target_devices(target)
  if model_parallelism < 1 or len(devices) % model_parallelism:
    raise ValueError(f"TrainConfig.model_parallelism={model_parallelism} must divide the "
                     f"{len(devices)} chips of {target.name}")
  shape = (len(devices) // model_parallelism, model_parallelism)
  try:
    grid = mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices).reshape(shape)
  axis_types = (jax.sharding.AxisType.Auto,) * 2
  return Mesh(grid, MESH_AXES, axis_types=axis_types)
