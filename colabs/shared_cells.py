"""What every notebook begins with, and REPO_URL: the one place to set the repository's address.

Each notebook's first cell (Markdown) holds its title, an Open-in-Colab badge and its
summary; its second (code) installs seq2seq_jax where it is missing, from REPO_URL, and
starts the notebook's ``seq2seq_jax.tutorial`` session. This script writes the badge link
and the whole second cell into every ``colabs/NN_name.py``, then syncs each paired .ipynb
(its outputs stay):

  python colabs/shared_cells.py

tests/test_notebooks.py checks that every notebook holds exactly these.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

# THE ONE PLACE TO SET THE REPOSITORY'S ADDRESS (a placeholder until it is public); then run
# this script.
REPO_URL = "https://github.com/YOUR-ORG/seq2seq_jax"
BRANCH = "main"
COLABS = pathlib.Path(__file__).resolve().parent

_BADGE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")
_FIRST_CODE_CELL = re.compile(r"^# %%\n.*?(?=\n\n# %%)", re.M | re.S)


def badge(name: str) -> str:
  """The Open-in-Colab badge of ``colabs/{name}.ipynb``, as Markdown."""
  path = REPO_URL.removeprefix("https://github.com/").rstrip("/")
  link = f"https://colab.research.google.com/github/{path}/blob/{BRANCH}/colabs/{name}.ipynb"
  return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({link})"


def setup_cell() -> str:
  """Every notebook's second cell: installs the package from REPO_URL, starts a session."""
  return f'''\
# Installs seq2seq_jax where it is missing (a fresh Colab runtime), then starts the notebook:
# quick mode or not, where the data and the runs are. Every notebook begins with this cell
# (colabs/shared_cells.py writes it).
REPO_URL = "{REPO_URL}"

import importlib.util
import subprocess
import sys

if importlib.util.find_spec("seq2seq_jax") is None:
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{{REPO_URL}}"], check=True)

from seq2seq_jax import tutorial

session = tutorial.start()
QUICK, MULTI30K_DIR, WORKDIRS = session.quick, session.multi30k_dir, session.workdirs'''


def write(source: pathlib.Path) -> None:
  """Writes the badge and the setup cell into ``source`` (a notebook's .py), then syncs."""
  text = source.read_text(encoding="utf-8")
  text = _BADGE.sub(lambda _: badge(source.stem), text, count=1)
  text = _FIRST_CODE_CELL.sub(lambda _: "# %%\n" + setup_cell(), text, count=1)
  source.write_text(text, encoding="utf-8")
  subprocess.run([sys.executable, "-m", "jupytext", "--sync", "--quiet", str(source)], check=True)


if __name__ == "__main__":
  for notebook in sorted(COLABS.glob("[0-9][0-9]_*.py")):
    write(notebook)
    print(f"wrote {notebook} and its .ipynb")
