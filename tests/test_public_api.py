"""The curated public API: every name in __all__ resolves; heavy modules load lazily."""

import subprocess
import sys

import seq2seq_jax


def test_every_public_name_resolves():
  missing = []
  for name in seq2seq_jax.__all__:
    try:
      getattr(seq2seq_jax, name)
    except (AttributeError, ImportError) as error:
      missing.append(f"{name}: {error}")
  assert not missing


def test_unknown_attribute_raises_attribute_error():
  try:
    seq2seq_jax.no_such_thing  # noqa: B018
  except AttributeError as error:
    assert "no_such_thing" in str(error)
  else:
    raise AssertionError("expected AttributeError")


def test_plain_import_does_not_load_orbax_grain_tfds_or_qwix():
  code = ("import sys, seq2seq_jax; "
          "print(sorted(m for m in ('orbax', 'grain', 'tensorflow_datasets', 'qwix') "
          "if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
