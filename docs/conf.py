"""Sphinx configuration: the API reference from the package's docstrings, guides in Markdown.

Sphinx rather than mkdocs: autodoc imports the package and documents what it really
exports (signatures with their annotations), napoleon reads the Google-style
``Args:`` / ``Returns:`` sections the docstrings use, MyST lets the guides be Markdown
whose Python blocks the tests run, and ``-W`` turns every warning (an unknown
reference, a malformed docstring) into a failed build. jax, flax, optax and orbax
document themselves the same way.
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import seq2seq_jax  # noqa: E402

project = "seq2seq_jax"
author = "the seq2seq_jax authors"
copyright = "2026, the seq2seq_jax authors"  # noqa: A001
release = seq2seq_jax.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
# Linen modules are dataclasses: their fields are documented in the class docstring.
autodoc_inherit_docstrings = False
# An optional extra (seq2seq-jax[beam]): documented whether or not it is installed here.
autodoc_mock_imports = ["apache_beam"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" as fields: NamedTuple fields are not described twice

html_theme = "alabaster"
html_title = f"seq2seq_jax {release}"
