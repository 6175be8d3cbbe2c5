# Every target creates or reuses the local virtual environment in $(VENV).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.cache/jax
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES ?= 0

.PHONY: setup train test test-fast clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(PY) -m seq2seq_jax.cli train_demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --durations=15 tests

test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -m "not slow" tests

clean:
	rm -rf $(VENV) .cache .pytest_cache
