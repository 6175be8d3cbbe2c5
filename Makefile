# Every target creates or reuses the local virtual environment in $(VENV).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.cache/jax
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES ?= 0

.PHONY: setup train test test-beam test-cuda test-fast typecheck docs bench bench-quick clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: pip then takes the CPU build, never a CUDA one (bench extra).
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[test,bench]"
	touch $(STAMP)

setup: $(STAMP)

# Apache Beam (the beam extra) pins protobuf < 7, which sentencepiece 0.2.3's protobuf module
# refuses: the Beam tests run in an environment of their own (constraints-beam.txt).
BEAM_VENV ?= .venv-beam
BEAM_STAMP := $(BEAM_VENV)/.installed
$(BEAM_STAMP): pyproject.toml constraints-beam.txt
	$(PYTHON) -m venv $(BEAM_VENV)
	$(BEAM_VENV)/bin/python -m pip install -q --upgrade pip
	$(BEAM_VENV)/bin/python -m pip install -q -c constraints-beam.txt -e ".[beam]" pytest
	touch $(BEAM_STAMP)

# The main job: prepare Multi30k (downloaded, or MULTI30K_DIR=path/to/multi30k/raw; the
# shared copy beside this checkout is used when present), train the default preset, then
# print test BLEU with beam 4 (the preset's length penalty) and a few translations.
# Rerunning resumes the run.
MULTI30K_DIR ?= $(wildcard $(CURDIR)/../shared/data/multi30k/raw)
PRESET ?= multi30k_transformer
WORKDIR ?= workdirs/$(PRESET)
TRAIN_FLAGS ?=
DATA_FLAGS := $(if $(MULTI30K_DIR),--set data.manual_dir=$(MULTI30K_DIR))

train: $(STAMP)
	$(PY) -m seq2seq_jax.cli prepare --dataset multi30k $(if $(MULTI30K_DIR),--manual-dir $(MULTI30K_DIR))
	$(PY) -m seq2seq_jax.cli train --preset $(PRESET) --workdir $(WORKDIR) $(DATA_FLAGS) $(TRAIN_FLAGS)
	$(PY) -m seq2seq_jax.cli evaluate --workdir $(WORKDIR) --split test_2016_flickr --beam-size 4 --show 3

# cuDNN's fused attention lowers for a compile-only H100 (seq2seq_jax.aot) given jax's
# CUDA plugin and cuDNN's wheel; no GPU and no CUDA driver needed. They go in a folder of
# their own, put on the path only by test-cuda: with them importable jax would look for
# a GPU at every start.
CUDA_DIR ?= .cuda-compile
CUDA_STAMP := $(CUDA_DIR)/.installed
$(CUDA_STAMP): constraints.txt
	$(PY) -m pip install -q --no-deps --target $(CUDA_DIR) -c constraints.txt \
	    jax-cuda12-plugin jax-cuda12-pjrt nvidia-cudnn-cu12
	touch $(CUDA_STAMP)

# The type check and the docs build come first: each takes seconds and fails the run.
test: $(STAMP) typecheck docs test-beam test-cuda
	$(PY) -m pytest -n 2 --durations=15 tests

test-cuda: $(STAMP) $(CUDA_STAMP)
	PYTHONPATH=$(CURDIR)/$(CUDA_DIR) JAX_PLATFORMS=cpu JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 \
	    $(PY) -m pytest -q -p no:cacheprovider tests/aot/test_fused_kernels.py \
	    tests/aot/test_aot.py -k "h100 or cuda"

test-beam: $(BEAM_STAMP)
	SEQ2SEQ_JAX_BEAM_TESTS=1 $(BEAM_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	    tests/data/test_beam_pipeline.py tests/docs/test_examples.py -k "test_beam_pipeline or (docstring and data and beam)"

# mypy over the public API and a downstream use of it ([tool.mypy] in pyproject.toml).
typecheck: $(STAMP)
	$(PY) -m mypy

# The API reference (docs/, Sphinx) with every warning an error; HTML in docs/_build/html.
docs: $(STAMP)
	$(PY) -m sphinx -E -W --keep-going -q -b html docs docs/_build/html

test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -m "not slow" tests

# Benchmarks (see benchmarks/RESULTS.md). compare_pytorch.py needs the bench extra:
# `$(PY) -m pip install torch==2.13.0` first (the CPU wheel), then `-e ".[bench]"`.
BENCH_SCRIPTS := train_throughput decode_throughput rnn_vs_transformer pretrained_opus_mt pretrained_families translate_file decode_controls tpu_compile tpu_anchors input_pipeline attention_kernels cpu_flags
# tpu_anchors.py also writes its tables into RESULTS.md (tests/aot/test_anchors.py checks them).
bench: $(STAMP)
	for s in $(BENCH_SCRIPTS); do \
	  extra=; [ $$s = tpu_anchors ] && extra="--results-md benchmarks/RESULTS.md"; \
	  $(PY) benchmarks/$$s.py --plot benchmarks/results/$$s.png $$extra || exit 1; done

bench-quick: $(STAMP)
	for s in $(BENCH_SCRIPTS); do SEQ2SEQ_JAX_QUICK=1 $(PY) benchmarks/$$s.py --out /tmp/seq2seq_jax_bench_$$s.json || exit 1; done

clean:
	rm -rf $(VENV) $(BEAM_VENV) $(CUDA_DIR) .cache .pytest_cache .mypy_cache docs/_build
