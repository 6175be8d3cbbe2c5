"""Finds the runnable examples: ``>>>`` in the package's docstrings, Python blocks in Markdown.

The runner (``test_examples.py``) executes what this module finds. Docstring examples
run with their module's globals, as ``python -m doctest`` runs them; Markdown files run
top to bottom in one namespace per file, as a reader pastes them into one session.
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import importlib.util
import pathlib
import pkgutil
import re

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "seq2seq_jax"
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# The Markdown files whose Python blocks must run: the README and every page of docs/.
MARKDOWN_FILES = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


# Modules of an optional extra -> the package it needs; where that is not installed, the
# module (and its examples) is left out.
OPTIONAL_MODULES = {f"{PACKAGE}.data.beam": "apache_beam"}


def missing_optional_modules() -> list[str]:
  """The modules of ``OPTIONAL_MODULES`` whose extra is not installed here."""
  return sorted(name for name, needs in OPTIONAL_MODULES.items()
                if importlib.util.find_spec(needs) is None)


def package_modules() -> list[str]:
  """Every module of the package, in name order (importing each one), less those of an
  optional extra that is not installed."""
  package = importlib.import_module(PACKAGE)
  names = [PACKAGE] + [info.name for info in pkgutil.walk_packages(package.__path__, f"{PACKAGE}.")]
  return sorted(set(names) - set(missing_optional_modules()))


def docstring_examples() -> list[doctest.DocTest]:
  """One ``DocTest`` per docstring holding ``>>>`` examples, defined in the package itself."""
  finder = doctest.DocTestFinder(exclude_empty=True)
  tests = []
  for name in package_modules():
    module = importlib.import_module(name)
    for test in finder.find(module, name):
      # Objects re-exported from another module are found there, not here.
      if test.examples and test.filename and pathlib.Path(test.filename).resolve() == pathlib.Path(
          module.__file__).resolve():
        tests.append(test)
  return sorted(tests, key=lambda test: test.name)


@dataclasses.dataclass(frozen=True)
class CodeBlock:
  """One fenced Python block of a Markdown file."""

  path: pathlib.Path
  line: int  # 1-based line of the opening fence
  source: str

  @property
  def is_session(self) -> bool:
    """A ``>>>`` session (output compared) rather than a script (run for its effects)."""
    return self.source.lstrip().startswith(">>>")

  def where(self) -> str:
    return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def python_blocks(path: pathlib.Path) -> list[CodeBlock]:
  """The ```python and ```pycon blocks of ``path``, in order."""
  text = path.read_text(encoding="utf-8")
  blocks = []
  for match in _FENCE.finditer(text):
    if match.group("lang").strip() in ("python", "pycon", "py"):
      line = text.count("\n", 0, match.start()) + 1
      blocks.append(CodeBlock(path, line, match.group("body")))
  return blocks


def markdown_doctest(block: CodeBlock, globs: dict) -> doctest.DocTest:
  """A ``>>>`` block as a DocTest sharing ``globs`` with the file's other blocks."""
  return doctest.DocTestParser().get_doctest(block.source, globs, block.where(),
                                             str(block.path), block.line)
