# Every target creates or reuses the local virtual environment in $(VENV).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.cache/jax
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES ?= 0

.PHONY: setup train test test-beam test-cuda test-fast test-accel typecheck docs bench bench-quick clean

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

# The whole suite: the pinned environment's tests (two xdist workers) beside the checks that
# run in one process each (mypy, the docs build, the Beam, CUDA-compile and newest-jax
# environments), two make jobs at a time, so that the single-process checks and the other
# environments' installs overlap the long run instead of leaving a core idle before it.
# Each target's output is printed whole when it ends; any failure fails the run.
test:
	$(MAKE) -j2 --output-sync=target test-pinned typecheck docs test-beam test-cuda test-latest

.PHONY: test-pinned
# Not --dist worksteal: with it, two fresh-clone runs on a 2-core AMX Xeon (2026-12-02)
# both crashed a worker with a segfault in jax's persistent-cache write during
# tests/training/test_sharding.py (the file passes alone, and with -n 2); the default
# distribution passed in full runs on a Zen 4 (2026-12-02) and in CI.
test-pinned: $(STAMP)
	$(PY) -m pytest -n 2 --durations=40 tests

test-cuda: $(STAMP) $(CUDA_STAMP)
	PYTHONPATH=$(CURDIR)/$(CUDA_DIR) JAX_PLATFORMS=cpu JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 \
	    $(PY) -m pytest -q -p no:cacheprovider tests/aot/test_fused_kernels.py \
	    tests/aot/test_programs_in_order.py tests/aot/test_aot.py -k "h100 or cuda"

# The newest releases, as a new user's `pip install seq2seq-jax` gets them: Python 3.12 (jax
# 0.11 dropped 3.11; Colab runs 3.12) and no constraints, so each new venv takes what the
# registry serves that day, and prints it. Remove $(LATEST_VENV) for newer releases.
# Torch stays out (on 3.12 the registry has only its multi-GB CUDA build): the pretrained
# oracle tests are the pinned suite's. Python 3.12: PYTHON312, else python3.12, else pyenv's.
# --no-compile: imports compile what they use (install 25 CPU-s instead of 59; the tests
# then take 4 CPU-s more).
LATEST_VENV ?= .venv-latest
LATEST_PY := $(LATEST_VENV)/bin/python
LATEST_STAMP := $(LATEST_VENV)/.installed
PYTHON312 ?= python3.12
LATEST_PACKAGES := "jax[tpu]" flax optax orbax-checkpoint grain tensorflow-datasets \
    pytest pytest-xdist mypy filelock
$(LATEST_STAMP): pyproject.toml
	@py=$(PYTHON312); \
	if ! $$py -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then \
	  py=$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*/bin/python 2>/dev/null | \
	        sort -V | tail -1); \
	  if [ -z "$$py" ]; then \
	    echo "test-latest needs Python 3.12: install it (pyenv install 3.12, apt, python.org)" \
	         "and put python3.12 on PATH, or run make with PYTHON312=/path/to/python3.12" >&2; \
	    exit 1; \
	  fi; \
	fi; \
	echo "$$py -m venv $(LATEST_VENV)"; $$py -m venv $(LATEST_VENV)
	$(LATEST_PY) -m pip install -q --upgrade pip
	$(LATEST_PY) -m pip install -q --no-compile --upgrade -e . $(LATEST_PACKAGES)
	touch $(LATEST_STAMP)

# mypy, then about 2 CPU-minutes of tests that reach every package but pretrained: layers,
# models, decoding, training with a checkpoint, data (grain, tfds), aot (libtpu) and cli,
# inference (jax.export for tpu and cuda).
LATEST_TESTS ?= tests/test_compilation_cache.py tests/layers/test_attention.py \
    tests/models/test_transformer.py::test_later_targets_do_not_change_earlier_logits \
    tests/decoding/test_greedy.py tests/decoding/test_beam.py::test_beam_beats_greedy \
    tests/decoding/test_beam.py::test_one_beam_without_length_penalty_is_greedy \
    tests/training/test_step.py::test_eval_step_sums_tokens_and_uses_no_dropout \
    tests/test_checkpoints.py::test_restore_state_iterator_and_params_alone \
    tests/data/test_data_pipeline.py tests/data/test_data_tokenizer.py \
    tests/data/test_data_builders.py::test_tfds_name_feeds_the_tokenizer_and_the_pipeline \
    tests/aot/test_aot.py::test_fsdp_holds_a_quarter_of_the_arguments_and_gathers_a_layer_at_a_time \
    tests/aot/test_aot.py::test_the_command_line_refuses_an_unknown_target \
    tests/inference/test_exported.py::test_train_step_lowers_for_tpu_and_cuda_with_its_mesh_shardings
.PHONY: test-latest
test-latest: $(LATEST_STAMP)
	@$(LATEST_PY) -c 'import sys; print("test-latest: Python", sys.version.split()[0])'
	@$(LATEST_PY) -m pip list --format=freeze 2>/dev/null | grep -iE \
	    '^(jax|jaxlib|libtpu|flax|optax|orbax-checkpoint|grain|tensorflow-datasets|numpy|chex|ml.dtypes|mypy)=='
	$(LATEST_PY) -m mypy --cache-dir .cache/mypy-latest
	JAX_COMPILATION_CACHE_DIR=$(CURDIR)/.cache/jax-latest $(LATEST_PY) -m pytest -n 2 \
	    -p no:cacheprovider --durations=10 $(LATEST_TESTS)

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

# The emulated-accelerator tier alone (part of `make test`): a user's loop through each
# attention_impl on 8 CPU devices (tests/accel).
test-accel: $(STAMP)
	$(PY) -m pytest -n 2 tests/accel

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
	rm -rf $(VENV) $(BEAM_VENV) $(LATEST_VENV) $(CUDA_DIR) .cache .pytest_cache .mypy_cache docs/_build
