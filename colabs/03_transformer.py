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
FULL_TRANSFORMER = [
    'data.vocab_size=3000',
    'model.vocab_size=3000',
    'data.max_source_len=40',
    'data.max_target_len=40',
    'data.bucket_lengths=16,24,32,40',
    'data.batch_tokens=2048',
    'train.learning_rate=2e-3',
    'train.schedule=rsqrt',
    'model.model_dim=128',
    'model.mlp_dim=512',
    'train.num_steps=800',
    'train.warmup_steps=200',
    'train.log_every=50',
    'train.eval_every=400',
    'train.checkpoint_every=400',
    'train.eval_bleu_sentences=200',
    'train.eval_batches=4',
]

# %% [markdown]
# ## Masks: who may attend to whom
#
# Masks are boolean, `True` = may attend. The encoder hides padding; the decoder also hides
# the future, so that training on a whole target at once matches decoding one token at a time.

# %%
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
decoder_mask = attention.combine_masks(attention.make_padding_mask(tokens_BT, tokens_BT),
                                       attention.make_causal_mask(tokens_BT))
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
data_overrides = [f"data.manual_dir={MULTI30K_DIR}"]
if QUICK:
  overrides = ["data.vocab_size=400", "model.vocab_size=400", "model.model_dim=32",
               "model.mlp_dim=64", "model.num_heads=2", "model.num_encoder_layers=2",
               "model.num_decoder_layers=2", "data.batch_tokens=1024", "data.max_source_len=32",
               "data.max_target_len=32", "data.bucket_lengths=16,32", "train.num_steps=30",
               "train.warmup_steps=10", "train.log_every=10", "train.eval_every=30",
               "train.eval_bleu_sentences=16", "data.eval_batch_size=16"]
else:
  overrides = FULL_TRANSFORMER
config = presets.apply_overrides(presets.get_preset("multi30k_transformer"),
                                 data_overrides + overrides)
prepare_dataset(config.data)
workdir = WORKDIRS / "colab_transformer"
start = time.time()
result = train(config, workdir)
print(f"{result.step} steps, best validation BLEU {result.best_bleu} "
      f"({(time.time() - start) / 60:.1f} min in this session)")
translator = Translator.from_workdir(workdir)
test = load_eval_text(config.data, "test_2016_flickr")

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
print(f"notebook ran in {(time.time() - NOTEBOOK_START) / 60:.1f} minutes "
      f"({'quick' if QUICK else 'full'} mode) on {jax.devices()[0].device_kind}")
