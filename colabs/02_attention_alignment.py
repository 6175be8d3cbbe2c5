# %% [markdown]
# # 02 · Attention: Bahdanau and Luong, soft alignments
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/YOUR-ORG/seq2seq_jax/blob/main/colabs/02_attention_alignment.ipynb)
#
# Bahdanau et al. (2015) removed the thought-vector bottleneck: at every output step the
# decoder scores each encoder state against its own state, turns the scores into a soft
# alignment with a softmax, and reads their weighted average. Luong et al. (2015) simplified
# the score to a dot product (or a bilinear form) and queried with the new decoder state.
# This notebook shows both scores on toy arrays, trains a bidirectional GRU with additive
# attention on Multi30k, and draws the alignments it learned on real test sentences.
#
# *Committed outputs: a full run on a shared 2-core CPU (the time is printed at the end).
# Set `SEQ2SEQ_JAX_QUICK=1` for a tiny run.*

# %%
# The repository address: written by colabs/build_notebooks.py from its REPO_URL,
# the single place to set it (placeholder until the repository is public).
REPO_URL = "https://github.com/YOUR-ORG/seq2seq_jax"

import importlib.util
import subprocess
import sys

if importlib.util.find_spec("seq2seq_jax") is None:  # e.g. a fresh Colab runtime
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{REPO_URL}"], check=True)

# %%
import os
import pathlib
import tempfile
import time

QUICK = os.environ.get("SEQ2SEQ_JAX_QUICK", "0") == "1"  # tiny sizes and a few steps (CI)
ROOT = pathlib.Path.cwd().parent if pathlib.Path("../seq2seq_jax").is_dir() else pathlib.Path.cwd()
SHARED = ROOT.parent / "shared" / "data"
if SHARED.is_dir():
  MULTI30K_DIR = str((SHARED / ("multi30k_tiny" if QUICK else "multi30k/raw")).resolve())
else:
  MULTI30K_DIR = ""  # empty: the Multi30k builder downloads the official files
# Quick runs go to a fresh temporary folder; full runs to ROOT/workdirs, where a rerun of the
# notebook finds the finished run and only reloads it.
WORKDIRS = pathlib.Path(tempfile.mkdtemp()) if QUICK else ROOT / "workdirs"
NOTEBOOK_START = time.time()
print(f"quick mode: {QUICK}; data: {MULTI30K_DIR or 'download'}; runs in {WORKDIRS}")

# %%
# Full-run settings (quick mode ignores them): sized to train in minutes on a 2-core
# CPU. On a GPU or TPU raise the steps; the presets' defaults are the full recipes.
FULL_02 = [
    'data.vocab_size=3000',
    'model.vocab_size=3000',
    'data.max_source_len=40',
    'data.max_target_len=40',
    'data.bucket_lengths=16,24,32,40',
    'data.batch_tokens=2048',
    'model.dropout_rate=0.3',
    'train.learning_rate=2e-3',
    'train.schedule=constant',
    'train.warmup_steps=0',
    'model.embed_dim=128',
    'model.hidden_dim=256',
    'train.num_steps=700',
    'train.log_every=50',
    'train.eval_every=350',
    'train.checkpoint_every=350',
    'train.eval_bleu_sentences=200',
    'train.eval_batches=4',
]

# %% [markdown]
# ## Additive and multiplicative scores
#
# The scoring functions are pure functions in `seq2seq_jax.layers.attention`; padding is
# masked before the softmax, so padded positions get exactly zero weight.

# %%
import jax
import jax.numpy as jnp
import numpy as np

from seq2seq_jax import evaluation, presets
from seq2seq_jax import visualization as viz
from seq2seq_jax.data import load_eval_text, prepare_dataset
from seq2seq_jax.layers import attention
from seq2seq_jax.training import train
from seq2seq_jax.translator import Translator

rng = np.random.default_rng(0)
keys_BSA = jnp.asarray(rng.normal(size=(1, 5, 8)), jnp.float32)  # 4 source states + 1 pad
query_BTA = jnp.asarray(rng.normal(size=(1, 3, 8)), jnp.float32)  # 3 decoder states
v_A = jnp.asarray(rng.normal(size=(8,)), jnp.float32)
mask_B11S = jnp.array([[[[True, True, True, True, False]]]])
additive_BTS = attention.masked_alignment(
    attention.additive_scores(query_BTA, keys_BSA, v_A), mask_B11S)  # Bahdanau
dot_BTS = attention.masked_alignment(
    attention.luong_scores(query_BTA, keys_BSA), mask_B11S)  # Luong "dot"
print("rows sum to", np.asarray(additive_BTS.sum(-1)), "; padding gets", additive_BTS[0, :, -1])
viz.plot_attention(np.asarray(dot_BTS[0]), ["s1", "s2", "s3", "s4", "pad"],
                   ["t1", "t2", "t3"], title="Luong dot-product alignment (random states)")

# %% [markdown]
# ## Training the attention model
#
# The preset `multi30k_rnn_attention` is a bidirectional GRU encoder with Bahdanau's
# additive attention (`RNNConfig(attention="additive")`; `"dot"` or `"general"` selects
# Luong's scores, `input_feeding=True` his input feeding). It is shrunk here so that it
# trains in minutes on a CPU.

# %%
data_overrides = [f"data.manual_dir={MULTI30K_DIR}"]
if QUICK:
  overrides = ["data.vocab_size=400", "model.vocab_size=400", "model.embed_dim=32",
               "model.hidden_dim=64", "data.batch_tokens=1024", "data.max_source_len=32",
               "data.max_target_len=32", "data.bucket_lengths=16,32", "train.num_steps=30",
               "train.log_every=10", "train.eval_every=30", "train.eval_bleu_sentences=16",
               "data.eval_batch_size=16"]
else:
  overrides = FULL_02
config = presets.apply_overrides(presets.get_preset("multi30k_rnn_attention"),
                                 data_overrides + overrides)
prepare_dataset(config.data)
print(config.model)
workdir = WORKDIRS / "colab_02_attention"
start = time.time()
result = train(config, workdir)
print(f"{result.step} steps, best validation BLEU {result.best_bleu} "
      f"({(time.time() - start) / 60:.1f} min in this session)")

# %%
viz.plot_training_curves(workdir, title="bidirectional GRU with additive attention")

# %% [markdown]
# ## Soft alignments on real sentences
#
# `viz.align` translates a sentence greedily, runs the decoder once more with
# `return_attention=True` over that translation, and cuts the `[T, S]` weights to the real
# pieces. Each row shows where the decoder looked while writing that target piece: mostly a
# diagonal, bent where German and English order words differently.

# %%
translator = Translator.from_workdir(workdir)
test = load_eval_text(config.data, "test_2016_flickr")
for i in (3, 11):
  alignment = viz.align(translator, test.sources[i])
  display(viz.plot_attention(alignment.weights["cross"], alignment.source_tokens,
                             alignment.target_tokens, title=alignment.translation))

# %% [markdown]
# The same model forced to read the human reference shows how it aligns a translation it did
# not choose:

# %%
i = 3
alignment = viz.align(translator, test.sources[i], test.references[i])
viz.plot_attention(alignment.weights["cross"], alignment.source_tokens,
                   alignment.target_tokens, title=f"reference: {test.references[i]}")

# %% [markdown]
# ## Quality against source length
#
# BLEU by source length on the test set. When notebook 01 ran in the same place, its
# thought-vector model is drawn beside the attention model.

# %%
hypotheses = translator.translate(test.sources)
print(evaluation.corpus_bleu(hypotheses, test.references))
edges = (8, 11, 14, 17, 20)
curves = {"GRU + additive attention": viz.bleu_by_length(test.sources, hypotheses,
                                                         test.references, edges=edges)}
gru_workdir = WORKDIRS / "colab_01_gru"
if (gru_workdir / "checkpoints").is_dir():
  gru_hypotheses = Translator.from_workdir(gru_workdir).translate(test.sources)
  curves["GRU, thought vector (notebook 01)"] = viz.bleu_by_length(
      test.sources, gru_hypotheses, test.references, edges=edges)
viz.plot_quality_by_length(curves, title="test_2016_flickr, greedy decoding")

# %%
print(f"notebook ran in {(time.time() - NOTEBOOK_START) / 60:.1f} minutes "
      f"({'quick' if QUICK else 'full'} mode) on {jax.devices()[0].device_kind}")
