# %% [markdown]
# # 01 · The RNN encoder-decoder and its thought vector
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/YOUR-ORG/seq2seq_jax/blob/main/colabs/01_encoder_decoder_rnn.ipynb)
#
# The first neural translators (Sutskever et al. 2014, Cho et al. 2014) read the source
# sentence with a recurrent network into one fixed-size vector, the "thought vector", and let
# a second recurrent network write the translation from it. This notebook builds that model
# with `seq2seq_jax`, trains it on Multi30k (German to English), decodes greedily, and
# measures what the fixed-size summary costs: quality falls as sources get longer.
#
# *Committed outputs: a full run on a shared 2-core CPU (the time is printed at the end).
# Set `SEQ2SEQ_JAX_QUICK=1` for a tiny run of a minute or two.*

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
FULL_01 = [
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
# ## Embeddings and the scan-based encoder
#
# Token ids become vectors through an embedding table; an `RNNEncoder` then runs a GRU cell
# over them with `flax.linen.scan`, a compiled loop, stopping each row at its real length
# (padding does not change a row's states). `encode` returns the per-position states and
# the final state of each row, `summary_BD`: the only thing the decoder of this model sees.

# %%
import jax
import jax.numpy as jnp
import numpy as np

import seq2seq_jax as s2s
from seq2seq_jax import evaluation, presets
from seq2seq_jax import visualization as viz
from seq2seq_jax.data import load_eval_text, prepare_dataset
from seq2seq_jax.training import train
from seq2seq_jax.translator import Translator

toy = s2s.build_model(s2s.RNNConfig(vocab_size=50, cell="gru", embed_dim=8, hidden_dim=16))
short_BS = jnp.array([[5, 6, 7, 2, 0, 0, 0, 0, 0, 0]])  # three pieces, EOS, padding
long_BS = jnp.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 2]])  # nine pieces, EOS
toy_params = toy.init(jax.random.key(0), long_BS, long_BS)["params"]
for name, inputs_BS in (("short", short_BS), ("long", long_BS)):
  memory = toy.apply({"params": toy_params}, inputs_BS, method="encode")
  print(f"{name}: encoder states {memory['encoded_BSD'].shape}, "
        f"thought vector {memory['summary_BD'].shape}")

# %% [markdown]
# Both sentences end up as 16 numbers. Without attention the decoder conditions every step
# on that summary (Cho et al. feed it to every step, not only the first), so a long sentence
# must squeeze through the same bottleneck as a short one.
#
# ## Data and configuration
#
# The library's Multi30k builder prepares the corpus once (from `../shared/data` beside a
# checkout, or downloading the official files on Colab). The preset `multi30k_gru` is a
# one-layer GRU encoder-decoder without attention; here it is shrunk so that it trains in
# minutes on a CPU.

# %%
data_overrides = [f"data.manual_dir={MULTI30K_DIR}"]
if QUICK:
  overrides = ["data.vocab_size=400", "model.vocab_size=400", "model.embed_dim=32",
               "model.hidden_dim=64", "data.batch_tokens=1024", "train.num_steps=30",
               "train.log_every=10", "train.eval_every=30", "train.eval_bleu_sentences=16",
               "data.eval_batch_size=16"]
else:
  overrides = FULL_01
config = presets.apply_overrides(presets.get_preset("multi30k_gru"), data_overrides + overrides)
builder = prepare_dataset(config.data)
print({name: split.num_examples for name, split in builder.info.splits.items()})
print(config.model)

# %% [markdown]
# ## Training
#
# `train(config, workdir)` runs the whole loop: the sentencepiece vocabulary, bucketed
# batches, the jitted step, validation BLEU, checkpoints and `metrics.jsonl`. Rerunning the
# cell resumes the run (or, when it has finished, just reports it).

# %%
workdir = WORKDIRS / "colab_01_gru"
start = time.time()
result = train(config, workdir)
print(f"{result.step} steps, best validation BLEU {result.best_bleu} "
      f"({(time.time() - start) / 60:.1f} min in this session)")

# %%
viz.plot_training_curves(workdir, title="GRU encoder-decoder (thought vector)")

# %% [markdown]
# ## Greedy decoding
#
# `Translator` wraps the checkpoint: it tokenizes, pads sources to a few bucket lengths,
# runs the jitted greedy search (one `lax.while_loop` over a `decode_step` that carries the
# GRU state in an explicit cache) and detokenizes.

# %%
translator = Translator.from_workdir(workdir)
test = load_eval_text(config.data, "test_2016_flickr")
hypotheses = translator.translate(test.sources)
for i in (0, 1, 2):
  print(f"source:     {test.sources[i]}\nreference:  {test.references[i]}\n"
        f"greedy:     {hypotheses[i]}\n")
print(evaluation.corpus_bleu(hypotheses, test.references))
print(evaluation.corpus_chrf(hypotheses, test.references))

# %% [markdown]
# ## Quality against source length
#
# Corpus BLEU of the test sentences grouped by the length of their source. With a single
# summary vector the long sentences suffer most; notebook 02 draws the same plot for the
# attention model.

# %%
by_length = viz.bleu_by_length(test.sources, hypotheses, test.references,
                               edges=(8, 11, 14, 17, 20))
viz.plot_quality_by_length({"GRU, thought vector": by_length},
                           title="GRU encoder-decoder on test_2016_flickr")

# %%
print(f"notebook ran in {(time.time() - NOTEBOOK_START) / 60:.1f} minutes "
      f"({'quick' if QUICK else 'full'} mode) on {jax.devices()[0].device_kind}")
