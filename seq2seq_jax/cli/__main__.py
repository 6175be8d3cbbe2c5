"""``python -m seq2seq_jax.cli``: the ``seq2seq-jax`` command."""

import sys

from seq2seq_jax.cli import main

if __name__ == "__main__":  # importing this module (pkgutil.walk_packages does) runs nothing
  sys.exit(main())
