# %% [markdown]
# # 05 · Decomposable attention for sentence pairs
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/YOUR-ORG/seq2seq_jax/blob/main/colabs/05_decomposable_attention.ipynb)
#
# Parikh et al. (2016) showed that attention without any recurrence can compare two
# sentences: soft-align each word of one sentence with the other (attend), compare each word
# with what it aligned to (compare), sum the comparisons and classify (aggregate). Here the
# pair task is translation detection on Multi30k: does this English sentence translate this
# German one? Each false pair uses a hard negative, an English sentence of nearly the same
# length that shares as many words as possible with the true one.
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
# Full-run settings (quick mode ignores them): sized to train in minutes on a 2-core CPU;
# on a GPU or TPU raise the epochs.
FULL_05_MODEL = {"embed_dim": 100, "hidden_dim": 128, "dropout_rate": 0.2}
FULL_05_TRAIN = {"epochs": 6, "batch_size": 128, "learning_rate": 2e-3}

# %%
import time

import jax
import jax.numpy as jnp
import numpy as np

import seq2seq_jax as s2s
from seq2seq_jax import visualization as viz
from seq2seq_jax.data import pair_task
from seq2seq_jax.training import pair_classifier

directory = MULTI30K_DIR
if not directory:  # no local copy: fetch the official files through the library
  from seq2seq_jax.data import download_multi30k
  directory = str(WORKDIRS / "multi30k_raw")
  download_multi30k(directory, ("de", "en"))
task = pair_task.build_pair_task(directory, eval_splits=("val", "test_2016_flickr"),
                                 min_count=1 if QUICK else 2, limit=300 if QUICK else 0)
print(f"vocabulary {task.vocab.size} words;",
      ", ".join(f"{name}: {len(split)} true pairs + {len(split)} hard negatives"
                for name, split in task.splits.items()))
split = task.splits["val"]
words = lambda ids: [task.vocab.words[i - 4] if i >= 4 else "<unk>" for i in ids if i]
print("German:        ", " ".join(words(split.source_ids[0])))
print("English:       ", " ".join(words(split.target_ids[0])))
print("hard negative: ", " ".join(words(split.target_ids[split.neighbours[0, 0]])))

# %% [markdown]
# ## Training

# %%
if QUICK:
  model_config = s2s.DecomposableAttentionConfig(vocab_size=task.vocab.size, embed_dim=16,
                                                 hidden_dim=16, max_len=task.max_len)
  train_config = pair_classifier.PairTrainConfig(epochs=2, batch_size=32)
else:
  model_config = s2s.DecomposableAttentionConfig(vocab_size=task.vocab.size, **FULL_05_MODEL,
                                                 max_len=task.max_len)
  train_config = pair_classifier.PairTrainConfig(**FULL_05_TRAIN)
start = time.time()
params, history = pair_classifier.train_pair_classifier(
    task, model_config, train_config, eval_splits=("val", "test_2016_flickr"))
print(f"trained in {(time.time() - start) / 60:.1f} min")
records = [{"epoch": epoch + 1, "loss": history["loss"][epoch],
            "val accuracy": history["val"][epoch],
            "test_2016 accuracy": history["test_2016_flickr"][epoch]}
           for epoch in range(len(history["loss"]))]
viz.plot_training_curves(records, metrics=("loss", "val accuracy", "test_2016 accuracy"),
                         x_key="epoch", title="decomposable attention, translation detection")

# %% [markdown]
# ## The attention matrix
#
# `return_attention=True` returns both directions of the soft alignment; `a_to_b[i, j]` is
# how much German word `i` attends to English word `j`. The example is the first short test
# sentence for which the model gets both the true pair and its hard negative right (it misses
# about one pair in seven). In this short run most rows stay diffuse and only a few words
# align sharply: the model decides as much in its compare and aggregate steps as in the
# alignment, and a longer run (or `intra_attention=True`) sharpens the matrix.

# %%
model = s2s.build_model(model_config)
test = task.splits["test_2016_flickr"]

def attend(a_ids, b_ids):
  """P(b translates a) and the attention of a over b, for one pair."""
  logits_BC, weights = model.apply({"params": params}, a_ids[None], b_ids[None],
                                   return_attention=True)
  return float(jax.nn.softmax(logits_BC)[0, 1]), np.asarray(weights["a_to_b"][0])

short = [j for j in range(len(test)) if 7 <= (test.source_ids[j] > 0).sum() <= 10]
right = (j for j in short if attend(test.source_ids[j], test.target_ids[j])[0] > 0.5
         and attend(test.source_ids[j], test.target_ids[test.neighbours[j, 0]])[0] < 0.5)
i = next(right, short[0] if short else 0)  # an untrained (quick) model may get none right
for label, target_ids in (("true translation", test.target_ids[i]),
                          ("hard negative", test.target_ids[test.neighbours[i, 0]])):
  probability, a_to_b = attend(test.source_ids[i], target_ids)
  german, english = words(test.source_ids[i]), words(target_ids)
  display(viz.plot_attention(a_to_b[:len(german), :len(english)], english, german,
                             xlabel="English", ylabel="German",
                             title=f"{label}: P(translation) = {probability:.2f}"))

# %%
session.finish()
