"""The colabs: each runs top to bottom in quick mode, shows a library plot, uses only the public API.

Each notebook's source is colabs/NN_name.py (jupytext's percent format), paired with its
.ipynb, which adds the outputs of a full run. The quick-mode runs are marked slow (one to
three minutes each on 2 CPU cores); the checks of the pairing, imports, shared cells, TPU
cell and committed outputs are fast.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import nbformat
import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
COLABS = REPO_ROOT / "colabs"
NAMES = ["01_encoder_decoder_rnn", "02_attention_alignment", "03_transformer",
         "04_translate_multi30k", "05_decomposable_attention", "06_pretrained_opus_mt"]
PLACEHOLDER_OR_URL = re.compile(r'^REPO_URL = "(https://github\.com/[^"]+)"', re.M)
# Model and training logic lives in the library: a notebook that needs these is doing its work.
FORBIDDEN_MODULES = ("matplotlib", "flax", "optax", "orbax", "grain", "tensorflow_datasets",
                     "sentencepiece", "sacrebleu")
MAX_NOTEBOOK_BYTES = 2_000_000


def _read(name: str):
  return nbformat.read(COLABS / f"{name}.ipynb", as_version=4)


def _code(notebook) -> str:
  """The code cells as one Python source; IPython magics and shell lines are dropped."""
  lines = []
  for cell in notebook.cells:
    if cell.cell_type == "code":
      lines += [line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))]
  return "\n".join(lines)


def _is_public_module(module: str) -> bool:
  return module.split(".")[0] == "seq2seq_jax" and not any(
      part.startswith("_") for part in module.split("."))


def _is_submodule(module: str, name: str) -> bool:
  try:
    return importlib.util.find_spec(f"{module}.{name}") is not None
  except ModuleNotFoundError:
    return False


def api_violations(source: str) -> list[str]:
  """What in ``source`` reaches past seq2seq_jax's public API or does the library's work.

  Public: modules of ``seq2seq_jax`` with no ``_``-prefixed part; names taken from a
  module with ``__all__`` must be listed there (or be a public submodule); others
  must exist and not start with ``_``. Class definitions and imports of the
  plotting and training stack (``FORBIDDEN_MODULES``) are violations too: models,
  training and plots belong in the library.
  """
  problems = []
  seq2seq_aliases = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ClassDef):
      problems.append(f"line {node.lineno}: defines class {node.name}; put it in the library")
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] in FORBIDDEN_MODULES:
          problems.append(f"line {node.lineno}: imports {alias.name}")
        elif alias.name.split(".")[0] == "seq2seq_jax":
          if not _is_public_module(alias.name):
            problems.append(f"line {node.lineno}: imports private module {alias.name}")
          seq2seq_aliases.add(alias.asname or alias.name.split(".")[0])
    elif isinstance(node, ast.ImportFrom):
      module = node.module or ""
      if module.split(".")[0] in FORBIDDEN_MODULES:
        problems.append(f"line {node.lineno}: imports from {module}")
        continue
      if module.split(".")[0] != "seq2seq_jax":
        continue
      if not _is_public_module(module):
        problems.append(f"line {node.lineno}: imports from private module {module}")
        continue
      loaded = importlib.import_module(module)
      public = getattr(loaded, "__all__", None)
      for alias in node.names:
        name = alias.name
        if name == "*":
          problems.append(f"line {node.lineno}: star import from {module}")
        elif _is_submodule(module, name) and not name.startswith("_"):
          seq2seq_aliases.add(alias.asname or name)
        elif public is not None and name not in public:
          problems.append(f"line {node.lineno}: {module}.{name} is not in {module}.__all__")
        elif name.startswith("_") or not hasattr(loaded, name):
          problems.append(f"line {node.lineno}: {module}.{name} is private or missing")
    elif (isinstance(node, ast.Attribute) and node.attr.startswith("_")
          and not node.attr.startswith("__")):
      base = node.value
      while isinstance(base, ast.Attribute):
        base = base.value
      if isinstance(base, ast.Name) and base.id in seq2seq_aliases:
        problems.append(f"line {node.lineno}: uses private attribute {node.attr}")
  return problems


def test_all_notebooks_are_there():
  assert sorted(p.stem for p in COLABS.glob("[0-9][0-9]_*.ipynb")) == NAMES


@pytest.mark.parametrize("source, expected", [
    ("from seq2seq_jax.models.rnn_seq2seq import _DecoderStep", "private or missing"),
    ("from seq2seq_jax.data import builders_missing_name", "not in seq2seq_jax.data.__all__"),
    ("from seq2seq_jax.training import train_pair_classifier_nowhere", "__all__"),
    ("import seq2seq_jax._private", "private module"),
    ("from seq2seq_jax import _version", "not in seq2seq_jax.__all__"),
    ("import seq2seq_jax as s2s\ns2s.presets._SECTIONS", "private attribute _SECTIONS"),
    ("import matplotlib.pyplot as plt", "imports matplotlib"),
    ("import flax.linen as nn\nclass Model(nn.Module): pass", "defines class Model"),
])
def test_api_checker_flags_what_it_should(source, expected):
  problems = api_violations(source)
  assert any(expected in problem for problem in problems), problems


def test_api_checker_accepts_the_public_api():
  source = ("import seq2seq_jax as s2s\nfrom seq2seq_jax import presets, build_model\n"
            "from seq2seq_jax.data import load_eval_text, pair_task\n"
            "from seq2seq_jax.training import train\nfrom seq2seq_jax import visualization as viz")
  assert api_violations(source) == []


@pytest.mark.parametrize("name", NAMES)
def test_notebook_uses_only_the_public_api(name):
  assert api_violations(_code(_read(name))) == []


@pytest.fixture(scope="module")
def shared_cells():
  """colabs/shared_cells.py: REPO_URL, the badge and the setup cell every notebook begins with."""
  spec = importlib.util.spec_from_file_location("colabs_shared_cells", COLABS / "shared_cells.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("name", NAMES)
def test_badge_and_setup_cell_come_from_shared_cells(name, shared_cells):
  notebook = _read(name)
  badge, setup = notebook.cells[0], notebook.cells[1]
  assert badge.cell_type == "markdown" and shared_cells.badge(name) in badge.source
  assert setup.cell_type == "code" and setup.source == shared_cells.setup_cell()
  # The address appears nowhere else in the code: the setup cell's variable is the one source.
  assert PLACEHOLDER_OR_URL.findall(setup.source) == [shared_cells.REPO_URL]
  assert _code(notebook).count(shared_cells.REPO_URL) == 1
  assert "session.finish()" in notebook.cells[-1].source


def test_shared_cells_rewrites_badge_and_setup_and_syncs_the_pair(shared_cells, tmp_path,
                                                                  monkeypatch):
  name = NAMES[2]
  for file in (f"{name}.py", f"{name}.ipynb", "jupytext.toml"):
    shutil.copy2(COLABS / file, tmp_path / file)
  monkeypatch.setattr(shared_cells, "REPO_URL", "https://github.com/acme/s2s")
  shared_cells.write(tmp_path / f"{name}.py")
  notebook = nbformat.read(tmp_path / f"{name}.ipynb", as_version=4)
  assert ("colab.research.google.com/github/acme/s2s/blob/main/colabs/03_transformer.ipynb"
          in notebook.cells[0].source)
  assert 'REPO_URL = "https://github.com/acme/s2s"' in notebook.cells[1].source
  committed = _read(name)
  assert [c.source for c in notebook.cells[2:]] == [c.source for c in committed.cells[2:]]
  assert [c.get("outputs") for c in notebook.cells[2:]] == [
      c.get("outputs") for c in committed.cells[2:]]  # outputs stay


# Every notebook that trains or decodes a seq2seq model shows how its programs would sit on
# Colab's single-chip TPUs; 05's sentence-pair classifier has no program that aot builds.
TPU_NOTEBOOKS = [name for name in NAMES if not name.startswith("05")]


def _fit_summary_cell(notebook) -> int:
  found = [i for i, cell in enumerate(notebook.cells)
           if cell.cell_type == "code" and "aot.fit_summary(" in cell.source]
  assert len(found) == 1, found
  return found[0]


@pytest.mark.parametrize("name", TPU_NOTEBOOKS)
def test_a_tpu_fit_cell_with_its_explanation(name):
  notebook = _read(name)
  index = _fit_summary_cell(notebook)
  explanation = notebook.cells[index - 1]
  assert explanation.cell_type == "markdown"
  text = " ".join(explanation.source.split())
  for words in ("libtpu", "no TPU needed", "from their shapes alone", "not measurements",
                "v5e-1", "v6e-1"):
    assert words in text, words
  assert '["v5e-1", "v6e-1"]' in notebook.cells[index].source


def _fit_summary_text(notebook) -> str:
  return "".join(output.get("text", "")
                 for output in notebook.cells[_fit_summary_cell(notebook)].get("outputs", []))


def _check_fit_summary(text: str, programs: tuple[str, ...]) -> None:
  """The report of every program on both chips, as ``aot.fit_summary`` writes it."""
  for program in programs:
    for chip in ("v5e-1", "v6e-1"):
      assert re.search(rf"^{program} on {chip}: fits, [\d.]+ GiB of [\d.]+ per chip, est\. ",
                       text, re.M), (program, chip, text)
  assert "(compiler-derived estimates from libtpu, not measurements)" in text


def _sync(directory: pathlib.Path, name: str) -> None:
  """``jupytext --sync`` of ``name``'s pair in ``directory``, the .py the newer file."""
  source = directory / f"{name}.py"
  os.utime(source, (time.time() + 60, time.time() + 60))  # the .py is the source
  subprocess.run([sys.executable, "-m", "jupytext", "--sync", "--quiet", str(source)],
                 check=True, capture_output=True, text=True)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_paired_with_its_py_source(name, tmp_path):
  """``colabs/NAME.py`` (jupytext's percent format) holds the cells; the .ipynb is those
  cells with the outputs of a run: ``jupytext --sync`` of the pair changes nothing."""
  for file in (f"{name}.py", f"{name}.ipynb", "jupytext.toml"):
    shutil.copy2(COLABS / file, tmp_path / file)
  _sync(tmp_path, name)
  for suffix in (".py", ".ipynb"):
    synced = (tmp_path / f"{name}{suffix}").read_text(encoding="utf-8")
    assert synced == (COLABS / f"{name}{suffix}").read_text(encoding="utf-8"), (
        f"colabs/{name}{suffix} is out of step with its pair: run "
        f"`jupytext --sync colabs/{name}.py` (see colabs/README.md)")


def test_the_pairing_check_finds_an_edit_not_synced(tmp_path):
  name = NAMES[0]
  for file in (f"{name}.py", f"{name}.ipynb", "jupytext.toml"):
    shutil.copy2(COLABS / file, tmp_path / file)
  edited = tmp_path / f"{name}.py"
  edited.write_text(edited.read_text(encoding="utf-8") + "\n# %%\nprint('new')\n",
                    encoding="utf-8")
  before = (tmp_path / f"{name}.ipynb").read_text(encoding="utf-8")
  _sync(tmp_path, name)
  after = nbformat.read(tmp_path / f"{name}.ipynb", as_version=4)
  assert (tmp_path / f"{name}.ipynb").read_text(encoding="utf-8") != before
  assert after.cells[-1].source == "print('new')"


def _library_images(notebook) -> list[int]:
  """Indices of code cells that call a visualization function and displayed a PNG."""
  found = []
  for index, cell in enumerate(notebook.cells):
    if cell.cell_type != "code" or not re.search(r"\bviz\.plot_\w+\(", cell.source):
      continue
    if any("image/png" in output.get("data", {}) for output in cell.get("outputs", [])):
      found.append(index)
  return found


@pytest.mark.parametrize("name", NAMES)
def test_committed_outputs_come_from_a_full_run(name):
  path = COLABS / f"{name}.ipynb"
  assert path.stat().st_size < MAX_NOTEBOOK_BYTES, f"{path} is {path.stat().st_size} bytes"
  notebook = _read(name)
  assert _library_images(notebook), f"{name}: no committed plot from seq2seq_jax.visualization"
  last = "".join(output.get("text", "") for output in notebook.cells[-1].get("outputs", []))
  assert re.search(r"notebook ran in [\d.]+ minutes \(full mode\)", last), last
  for cell in notebook.cells:
    for output in cell.get("outputs", []):
      assert output.output_type != "error", f"{name}: committed with an error"
  if name in TPU_NOTEBOOKS:
    _check_fit_summary(_fit_summary_text(notebook),
                       ("generate", "score") if name.startswith("06") else ("train", "generate"))


def _kernel_env() -> dict[str, str]:
  """The notebook kernel's environment: quick mode, one CPU device as a user would have."""
  flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                 os.environ.get("XLA_FLAGS", "")).strip()
  return {"SEQ2SEQ_JAX_QUICK": "1", "XLA_FLAGS": flags,
          "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR",
                                                      str(REPO_ROOT / ".cache" / "jax"))}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_quick_mode(name, monkeypatch, tmp_path):
  import nbclient  # noqa: PLC0415 (the test extra always installs it, with ipykernel)
  for key, value in _kernel_env().items():
    monkeypatch.setenv(key, value)
  notebook = _read(name)
  for cell in notebook.cells:
    if cell.cell_type == "code":
      cell.outputs, cell.execution_count = [], None
  start = time.time()
  # kernel "python3" with argv "python": jupyter_client runs it with this interpreter.
  client = nbclient.NotebookClient(notebook, kernel_name="python3", timeout=600,
                                   resources={"metadata": {"path": str(COLABS)}})
  client.execute()  # raises CellExecutionError naming the cell on any error
  minutes = (time.time() - start) / 60
  nbformat.write(notebook, tmp_path / f"{name}.ipynb")  # left for inspection on failure
  assert _library_images(notebook), f"{name}: no plot from seq2seq_jax.visualization was shown"
  last = "".join(output.get("text", "") for output in notebook.cells[-1].outputs)
  assert "(quick mode)" in last, last
  if name in TPU_NOTEBOOKS:  # libtpu is in the test extra: the compiler's report, not a hint
    _check_fit_summary(_fit_summary_text(notebook),
                       ("generate", "score") if name.startswith("06") else ("train", "generate"))
  print(f"{name}: {minutes:.1f} min in quick mode")
