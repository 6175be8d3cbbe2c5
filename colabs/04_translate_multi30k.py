# %% [markdown]
# # 04 · Translate Multi30k end to end
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/YOUR-ORG/seq2seq_jax/blob/main/colabs/04_translate_multi30k.ipynb)
#
# The whole pipeline through the public API, on whatever accelerator the runtime has:
# prepare Multi30k, train a Transformer, evaluate with sacreBLEU, translate new sentences.
# On a Colab TPU runtime `jax.devices()` lists the cores and the training step shards each
# batch over all of them (a mesh with a `data` axis); on a GPU or CPU it uses what is there.
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

# %%
import time

import jax

from seq2seq_jax import evaluation, presets
from seq2seq_jax import visualization as viz
from seq2seq_jax.data import load_eval_text, prepare_dataset
from seq2seq_jax.training import train
from seq2seq_jax.translator import Translator

print(jax.devices())

# %% [markdown]
# ## 1. Prepare the data
#
# `prepare_dataset` reads the official Multi30k files (a local copy, or downloaded and
# checksummed) into tfds `array_record` files once; later calls reuse them.

# %%
preset = "tiny_transformer" if QUICK else "multi30k_transformer_short"
config = presets.apply_overrides(presets.get_preset(preset), [f"data.manual_dir={MULTI30K_DIR}"])
builder = prepare_dataset(config.data)
for name, split in sorted(builder.info.splits.items()):
  print(f"{name:>18}: {split.num_examples} pairs")

# %% [markdown]
# ## 2. Train
#
# The configuration is a frozen dataclass; presets are starting points and
# `section.field=value` overrides adjust them (the command line takes the same strings).

# %%
# %%time
print(config.model)
print(config.train)
result = train(config, WORKDIRS / "colab_transformer")
print(f"{result.step} steps, best validation BLEU {result.best_bleu:.2f} at step "
      f"{result.best_step}")

# %%
viz.plot_training_curves(result.workdir, metrics=("loss", "val_loss", "bleu"),
                         title="Transformer on Multi30k de-en")

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
# ## 3. Evaluate with sacreBLEU
#
# Detokenized, cased output against the untokenized references of `test_2016_flickr` with
# sacreBLEU's defaults: the standard, comparable Multi30k test score (the signature says
# exactly how it was computed).
#
# The committed run is short (800 steps, width 128, on a shared 2-core CPU) and stops while
# the validation BLEU is still climbing steeply, so it trails the attention RNN of notebook
# 02, which converges faster in its first few hundred steps. The preset itself (width 256,
# a cosine schedule over about 7 epochs) is the `make train` recipe: under 30 minutes on a
# quiet 2-core CPU, with the BLEU given in the README.

# %%
translator = Translator.from_workdir(result.workdir)
test = load_eval_text(config.data, "test_2016_flickr")
start = time.time()
greedy = translator.translate(test.sources)
beam = translator.translate(test.sources, beam_size=4, alpha=0.6)
print(f"translated {len(test.sources)} sentences twice in {time.time() - start:.0f} s")
for name, hypotheses in (("greedy", greedy), ("beam 4", beam)):
  print(f"{name:>7}: {evaluation.corpus_bleu(hypotheses, test.references)}")
  print(f"{'':>7}  {evaluation.corpus_chrf(hypotheses, test.references)}")

# %%
viz.plot_quality_by_length(
    {"greedy": viz.bleu_by_length(test.sources, greedy, test.references,
                                  edges=(8, 11, 14, 17, 20)),
     "beam 4": viz.bleu_by_length(test.sources, beam, test.references,
                                  edges=(8, 11, 14, 17, 20))},
    title="Transformer on test_2016_flickr")

# %% [markdown]
# ## 4. Translate your own sentences

# %%
sentences = ["Ein kleines Mädchen spielt im Sand am Strand.",
             "Zwei Männer in roten Jacken fahren Fahrrad auf einer Straße.",
             "Ein Hund springt über einen Zaun."]
for source, target in zip(sentences, translator.translate(sentences, beam_size=4)):
  print(f"{source}\n  -> {target}")

# %%
session.finish()
