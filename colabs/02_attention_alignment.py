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
# Installs seq2seq_jax where it is missing (a fresh Colab runtime), then starts the notebook:
# quick mode or not, where the data and the runs are. Every notebook begins with this cell
# (colabs/shared_cells.py writes it).
REPO_URL = "https://github.com/YOUR-ORG/seq2seq_jax"

import importlib.util
import subprocess
import sys

if importlib.util.find_spec("seq2seq_jax") is None:
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{REPO_URL}"], check=True)

from seq2seq_jax import tutorial

session = tutorial.start()
QUICK, MULTI30K_DIR, WORKDIRS = session.quick, session.multi30k_dir, session.workdirs

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
# Luong's scores, `input_feeding=True` his input feeding). `multi30k_rnn_attention_short`
# makes it smaller, for a run of minutes on a CPU (in quick mode `tiny_rnn_attention`).

# %%
# %%time
preset = "tiny_rnn_attention" if QUICK else "multi30k_rnn_attention_short"
config = presets.apply_overrides(presets.get_preset(preset), [f"data.manual_dir={MULTI30K_DIR}"])
prepare_dataset(config.data)
print(config.model)
result = train(config, WORKDIRS / "colab_02_attention")
print(f"{result.step} steps, best validation BLEU {result.best_bleu:.2f}")

# %%
viz.plot_training_curves(result.workdir, title="bidirectional GRU with additive attention")

# %% [markdown]
# ## Would this run fit a Colab TPU?
#
# Colab's TPU runtimes include single chips, a v5e-1 (16 GiB of memory) and a v6e-1 (32 GiB).
# libtpu, the real TPU compiler (`pip install "jax[tpu]"`; no TPU needed), compiles this
# notebook's own programs, its training step and decoding step (`config`), for those chips from
# their shapes alone, here on whatever machine runs the notebook. It reports whether they fit,
# the memory they need per chip and an estimated time a step: compiler-derived estimates, not
# measurements. Without libtpu (a Colab CPU runtime) the cell says how to install it.

# %%
from seq2seq_jax import aot
print(aot.fit_summary(config, ["train", "generate"], ["v5e-1", "v6e-1"]))

# %% [markdown]
# ## Soft alignments on real sentences
#
# `viz.align` translates a sentence greedily, runs the decoder once more with
# `return_attention=True` over that translation, and cuts the `[T, S]` weights to the real
# pieces. Each row shows where the decoder looked while writing that target piece: mostly a
# diagonal, bent where German and English order words differently.

# %%
translator = Translator.from_workdir(result.workdir)
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
session.finish()
