"""Every ``>>>`` example in the package's docstrings and every Python block of the README and
docs/ runs here, and its printed output is compared with the one written down.

Docstring examples use their module's globals (as ``python -m doctest`` does); each
Markdown file runs top to bottom in one namespace. Both run in a fresh folder (see
``conftest.py``). ``make test`` ends with the number of examples executed.
"""

from __future__ import annotations

import collections
import doctest
import io
import pathlib

import pytest

from tests.docs import examples

DOCSTRING_TESTS = examples.docstring_examples()


def _run_doctest(test: doctest.DocTest) -> tuple[int, str]:
  runner = doctest.DocTestRunner(optionflags=examples.OPTIONFLAGS)
  report = io.StringIO()
  runner.run(test, out=report.write, clear_globs=False)
  failed, attempted = runner.summarize(verbose=False)
  return attempted, report.getvalue() if failed else ""


@pytest.mark.parametrize("test", DOCSTRING_TESTS, ids=lambda test: test.name)
def test_docstring_example(test, workspace, in_workspace, record_property):
  in_workspace(workspace.make(test.docstring or ""))
  attempted, failure = _run_doctest(test)
  assert not failure, f"{test.name} ({test.filename}:{test.lineno}):\n{failure}"
  assert attempted == len(test.examples)
  record_property("examples_docstring", attempted)


@pytest.mark.parametrize("path", examples.MARKDOWN_FILES,
                         ids=lambda path: str(path.relative_to(examples.REPO_ROOT)))
def test_markdown_examples(path, workspace, in_workspace, record_property):
  blocks = examples.python_blocks(path)
  if not blocks:
    return
  in_workspace(workspace.make("".join(block.source for block in blocks)))
  globs: dict = {"__name__": "__main__"}
  for block in blocks:
    if block.is_session:
      test = examples.markdown_doctest(block, globs)
      attempted, failure = _run_doctest(test)
      assert not failure, f"{block.where()}:\n{failure}"
      globs.update(test.globs)  # DocTest ran on a copy; later blocks see its names
    else:
      exec(compile(block.source, block.where(), "exec"), globs)  # noqa: S102
  record_property("examples_markdown", len(blocks))


def test_every_example_in_the_sources_is_collected():
  """A ``>>>`` the finder misses (a module that fails to import, an example outside a
  docstring, a docstring of an object re-exported elsewhere) fails here, not silently."""
  found = collections.Counter()
  for test in DOCSTRING_TESTS:
    found[pathlib.Path(test.filename).resolve()] += len(test.examples)
  written = collections.Counter()
  left_out = {examples.REPO_ROOT.joinpath(*name.split(".")).with_suffix(".py").resolve()
              for name in examples.missing_optional_modules()}
  for path in (examples.REPO_ROOT / examples.PACKAGE).rglob("*.py"):
    if path.resolve() in left_out:
      continue
    count = sum(line.lstrip().startswith(">>>") for line in path.read_text().splitlines())
    if count:
      written[path.resolve()] = count
  assert found == written
  assert sum(found.values()) > 100


def test_markdown_blocks_are_found():
  readme = examples.python_blocks(examples.REPO_ROOT / "README.md")
  assert len(readme) >= 5
  assert "Transformer" in readme[0].source
