# %% [markdown]
# # 03 · The Transformer: self-attention, heads, beam search
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/YOUR-ORG/seq2seq_jax/blob/main/colabs/03_transformer.ipynb)
#
# The Transformer (Vaswani et al. 2017) keeps attention and drops recurrence: every layer
# lets each position attend to all others at once. This notebook looks at the pieces
# (self-attention with a padding mask, masked self-attention in the decoder, cross-attention,
# heads, positions), then opens a trained Transformer and draws what its heads attend to,
# and compares greedy decoding with beam search on real sentences.
#
# *Committed outputs: a full run on a shared 2-core CPU (the time is printed at the end).
# The Transformer shares its run with notebook 04: whichever runs first trains it, the other
# reloads it. Set `SEQ2SEQ_JAX_QUICK=1` for a tiny run.*

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
# ## Masks: who may attend to whom
#
# Masks are boolean, `True` = may attend. The encoder hides padding; the decoder also hides
# the future, so that training on a whole target at once matches decoding one token at a time.
# The models describe a mask as an `AttentionMask` (which keys are padding, causal or not),
# the form a fused attention kernel takes; `.dense` spells it out as the matrix drawn here.
# The padded queries' rows are never read.

# %%
import time

import jax
import jax.numpy as jnp
import numpy as np

import seq2seq_jax as s2s
from seq2seq_jax import evaluation, presets
from seq2seq_jax import visualization as viz
from seq2seq_jax.data import load_eval_text, prepare_dataset
from seq2seq_jax.layers import attention, embeddings
from seq2seq_jax.training import train
from seq2seq_jax.translator import Translator

tokens_BT = jnp.array([[7, 8, 9, 2, 0, 0]])  # 3 pieces, EOS, 2 pads
decoder_mask = attention.AttentionMask(key_valid=tokens_BT != 0, causal=True).dense(
    batch=1, queries=tokens_BT.shape[1])
labels = ["w1", "w2", "w3", "</s>", "pad", "pad"]
viz.plot_attention(np.asarray(decoder_mask[0, 0], np.float32), labels, labels,
                   xlabel="key position", ylabel="query position", colorbar=False,
                   title="decoder self-attention mask (padding and causal)")

# %% [markdown]
# ## Heads and positions
#
# `dot_product_attention` splits the width into `H` heads of `K` dimensions, each with its own
# softmax over the keys. Attention alone ignores order, so the model adds a position signal:
# the fixed sinusoids of the paper (`positions="sinusoidal"`) or a learned table.

# %%
rng = np.random.default_rng(0)
q_BTHK, k_BSHK, v_BSHK = (jnp.asarray(rng.normal(size=shape), jnp.float32)
                          for shape in ((1, 3, 2, 4), (1, 5, 2, 4), (1, 5, 2, 4)))
out_BTHK, weights_BHTS = attention.dot_product_attention(q_BTHK, k_BSHK, v_BSHK,
                                                         return_weights=True)
print("output", out_BTHK.shape, "weights", weights_BHTS.shape)
table = embeddings.sinusoidal_table(16, 16)
viz.plot_attention(table, [str(i) for i in range(16)], [str(i) for i in range(16)], vmin=-1,
                   vmax=1, cmap="RdBu", xlabel="dimension", ylabel="position",
                   title="sinusoidal positions (first 16 of each)")

# %% [markdown]
# ## A trained Transformer
#
# The preset `multi30k_transformer` (3+3 layers, 4 heads) at width 128 and 800 steps so that
# it trains in minutes on a CPU: the same configuration and run folder as notebook 04. Such a
# short run is far from converged (validation BLEU is still rising fast when it stops), so
# expect rougher translations and less tidy heads than a full run gives.

# %%
# %%time
preset = "tiny_transformer" if QUICK else "multi30k_transformer_short"
config = presets.apply_overrides(presets.get_preset(preset), [f"data.manual_dir={MULTI30K_DIR}"])
prepare_dataset(config.data)
result = train(config, WORKDIRS / "colab_transformer")
print(f"{result.step} steps, best validation BLEU {result.best_bleu:.2f}")
translator = Translator.from_workdir(result.workdir)
test = load_eval_text(config.data, "test_2016_flickr")

# %% [markdown]
# ### Would this run fit a Colab TPU?
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
# ### Cross-attention: every head of every decoder layer
#
# Rows are the target pieces of the model's translation, columns the source pieces. Heads of
# the upper layers tend to align sharply, lower ones spread out or track neighbours.

# %%
alignment = viz.align(translator, test.sources[3])
print(alignment.source, "->", alignment.translation)
viz.plot_attention_grid(alignment.weights["cross"], alignment.source_tokens,
                        alignment.target_tokens, title="cross-attention, layers x heads")

# %% [markdown]
# ### Encoder self-attention, last layer

# %%
viz.plot_attention_grid(alignment.weights["encoder_self"][-1:], alignment.source_tokens,
                        alignment.source_tokens, row_labels=["last encoder layer"],
                        title="encoder self-attention")

# %% [markdown]
# ## Greedy against beam search
#
# Greedy search commits to the best next piece; beam search keeps the `W` best prefixes and
# ranks finished hypotheses with the GNMT length penalty. Same model, same sentences:

# %%
settings = {"greedy": dict(method="greedy"), "beam 4": dict(beam_size=4, alpha=0.6),
            "beam 4, no length penalty": dict(beam_size=4, alpha=0.0)}
sentences = test.sources[:32 if QUICK else 400]
references = test.references[:len(sentences)]
outputs, scores = {}, {}
for name, options in settings.items():
  start = time.time()
  outputs[name] = translator.translate(sentences, **options)
  scores[name] = evaluation.corpus_bleu(outputs[name], references).score
  print(f"{name}: BLEU {scores[name]:.2f} ({time.time() - start:.0f} s)")
for i in range(len(sentences)):
  if outputs["greedy"][i] != outputs["beam 4"][i]:
    print(f"\nsource:    {sentences[i]}\nreference: {references[i]}")
    for name in settings:
      print(f"{name + ':':<10} {outputs[name][i]}")
    break
viz.plot_decoding_comparison(scores, title=f"BLEU on {len(sentences)} test sentences")

# %%
session.finish()
