"""Test setup: 8 host CPU devices, strict rank promotion, a persistent compilation cache."""

import os
import pathlib

# Must happen before jax is imported anywhere: the device count is fixed at start-up.
# The suite's programs are tiny, so XLA:CPU's compile time is most of its time: LLVM's
# cheapest optimization level compiles them faster (the HLO after XLA's passes is the
# same; only LLVM's code generation does less; 160 s -> 117 s for
# tests/models/test_packing.py and tests/training/test_step.py on a 2-core Zen 4, and
# test_rnn_mask_decays_kernels_only ran in 4.3 s against 5.8). Only the tests get these
# flags, and the subprocesses they start inherit them; SEQ2SEQ_JAX_TEST_LLVM_OPT=1 keeps
# LLVM's default.
_FAST_COMPILE = ("" if os.environ.get("SEQ2SEQ_JAX_TEST_LLVM_OPT") == "1" else
                 " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8" + _FAST_COMPILE).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_compilation_cache_dir",
                  os.environ.get("JAX_COMPILATION_CACHE_DIR", str(REPO_ROOT / ".cache" / "jax")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_configure(config):
  """A torn persistent-cache entry is a cache miss, not a failure.

  jax writes an entry in place (no temporary file and rename), so a process may read one
  half written: another xdist worker's, sharing the Makefile's .cache/jax, or one left by a
  subprocess a test kills with SIGKILL. jax then warns and compiles again; under
  ``filterwarnings = error`` that warning would fail an unrelated test (seen with jax 0.10.2
  and 0.12). Other cache warnings, writes included, stay errors.
  """
  config.addinivalue_line(
      "filterwarnings", "ignore:Error reading persistent compilation cache entry:UserWarning")


def shared_data(*parts: str) -> pathlib.Path:
  """A path under ../shared/data; skips locally when absent, fails loudly under CI=true."""
  path = SHARED_DATA.joinpath(*parts)
  if not path.exists():
    message = (f"{path} is missing: the tests expect the shared corpora beside the checkout "
               "(../shared/data, see its README)")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
      pytest.fail(message)
    pytest.skip(message)
  return path


@pytest.fixture(scope="session")
def multi30k_tiny() -> pathlib.Path:
  return shared_data("multi30k_tiny")


@pytest.fixture(scope="session")
def multi30k_raw() -> pathlib.Path:
  return shared_data("multi30k", "raw")


def pytest_terminal_summary(terminalreporter):
  """Prints how many docstring and Markdown examples ran (tests/docs/test_examples.py)."""
  counts: dict[str, int] = {}
  for report in terminalreporter.stats.get("passed", []):
    for key, value in getattr(report, "user_properties", []):
      if key.startswith("examples_"):
        counts[key] = counts.get(key, 0) + value
  if counts:
    terminalreporter.write_line(
        "examples executed and compared: "
        + ", ".join(f"{counts[key]} {key.removeprefix('examples_')}" for key in sorted(counts)))
