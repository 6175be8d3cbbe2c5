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
# one-layer GRU encoder-decoder without attention; `multi30k_gru_short` is that model made
# smaller, for a run of minutes on a CPU (in quick mode `tiny_gru`, seconds).

# %%
preset = "tiny_gru" if QUICK else "multi30k_gru_short"
config = presets.apply_overrides(presets.get_preset(preset), [f"data.manual_dir={MULTI30K_DIR}"])
builder = prepare_dataset(config.data)
print({name: split.num_examples for name, split in builder.info.splits.items()})
print(config.model)

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
# ## Training
#
# `train(config, workdir)` runs the whole loop: the sentencepiece vocabulary, bucketed
# batches, the jitted step, validation BLEU, checkpoints and `metrics.jsonl`. Rerunning the
# cell resumes the run (or, when it has finished, just reports it).

# %%
# %%time
result = train(config, WORKDIRS / "colab_01_gru")
print(f"{result.step} steps, best validation BLEU {result.best_bleu:.2f}")

# %%
viz.plot_training_curves(result.workdir, title="GRU encoder-decoder (thought vector)")

# %% [markdown]
# ## Greedy decoding
#
# `Translator` wraps the checkpoint: it tokenizes, pads sources to a few bucket lengths,
# runs the jitted greedy search (one `lax.while_loop` over a `decode_step` that carries the
# GRU state in an explicit cache) and detokenizes.

# %%
translator = Translator.from_workdir(result.workdir)
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
session.finish()
