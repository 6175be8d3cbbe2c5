# %% [markdown]
# # 06 · Published checkpoints: OPUS-MT in JAX
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/YOUR-ORG/seq2seq_jax/blob/main/colabs/06_pretrained_opus_mt.ipynb)
#
# About 1,500 OPUS-MT translation models (Helsinki-NLP, MarianMT layout) and the multilingual
# M2M100, NLLB-200, mBART-50 and MADLAD-400 models are published as PyTorch checkpoints;
# transformers no longer runs them in JAX. `seq2seq_jax.pretrained` reads such a checkpoint
# into this library's Transformer (or its T5), with outputs identical to PyTorch's, so the
# same jitted searches translate with it on a CPU, GPU or TPU. This notebook loads `Helsinki-NLP/opus-mt-de-en`, translates
# Multi30k's test set in bulk, translates a file resumably on every core of the machine (all
# eight of a Colab TPU v2-8), scores translations by forced decoding and plots where the
# model looks. A last section loads a second family, MADLAD-400 (the T5 architecture), and
# translates both ways with it.
#
# Where the hub cannot be reached (and in quick mode) it builds a small checkpoint of the
# same layout locally instead: a MarianMT trained for a few minutes on Multi30k with
# transformers and `save_pretrained`, which needs `torch` and `transformers`.
#
# *Committed outputs: a full run on a shared 2-core CPU without network access (so on the
# locally built checkpoint; the time is printed at the end). Set `SEQ2SEQ_JAX_QUICK=1` for a
# tiny run.*

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
# Full-run settings (quick mode ignores them): the local stand-in for OPUS-MT, sized to
# train in minutes on a 2-core CPU where the hub cannot be reached.
FULL_06_BUILD = {"steps": 1200, "model_dim": 128, "ffn": 256, "batch_size": 64,
                 "learning_rate": 3e-3, "max_pairs": 29_000}
# The local stand-in for MADLAD-400 (a T5 v1.1 with <2xx> target tokens), both directions.
FULL_06_MADLAD = {"steps": 1200, "model_dim": 128, "head_dim": 32, "ffn": 256,
                  "vocab_size": 2000, "batch_size": 64, "learning_rate": 3e-3,
                  "max_pairs": 29_000}

# %%
import pathlib
import time

import jax
import numpy as np

import seq2seq_jax as s2s
from seq2seq_jax import pretrained
from seq2seq_jax import visualization as viz
from seq2seq_jax.data import load_eval_text
from seq2seq_jax.evaluation import corpus_bleu
from seq2seq_jax.pretrained import fixtures

checkpoint_dir = "Helsinki-NLP/opus-mt-de-en"
try:
  if QUICK:
    raise ValueError("quick mode builds a tiny local checkpoint")
  checkpoint = pretrained.load(checkpoint_dir)
except ValueError as error:
  print(f"{checkpoint_dir}: not loaded ({str(error)[:120]}...)")
  checkpoint_dir = str(WORKDIRS / "marian-de-en")
  if not pathlib.Path(checkpoint_dir, "config.json").exists():
    info = fixtures.build_marian(checkpoint_dir, data_dir=MULTI30K_DIR,
                                 **({"steps": 60, "vocab_size": 500} if QUICK
                                    else FULL_06_BUILD))
    print(f"built {checkpoint_dir} in {info.seconds / 60:.1f} min "
          f"({info.steps} steps, final loss {info.final_loss:.2f})")
  checkpoint = pretrained.load(checkpoint_dir)
config = checkpoint.config
print(f"{checkpoint.family}: {config.num_encoder_layers}+{config.num_decoder_layers} layers, "
      f"d {config.model_dim}, {config.num_heads} heads, vocabulary {config.vocab_size}, "
      f"{config.activation} FFN, positions {config.positions}, norm {config.norm}")
print(f"ids: pad {config.pad_id}, decoder start {config.decoder_start_id}, "
      f"eos {config.eos_id}; search: {checkpoint.decode_config}")

# %% [markdown]
# ## Would this model fit a Colab TPU?
#
# Colab's TPU runtimes include single chips, a v5e-1 (16 GiB of memory) and a v6e-1 (32 GiB).
# libtpu, the real TPU compiler (`pip install "jax[tpu]"`; no TPU needed), compiles this
# checkpoint's decoding step and its scoring (forced decoding) for those chips from their
# shapes alone, here on whatever machine runs the notebook. It reports whether they fit, the
# memory they need per chip and an estimated time a step: compiler-derived estimates, not
# measurements. Without libtpu (a Colab CPU runtime) the cell says how to install it.

# %%
from seq2seq_jax import aot
experiment = pretrained.experiment_config(checkpoint)  # its model and search; default data sizes
print(aot.fit_summary(experiment, ["generate", "score"], ["v5e-1", "v6e-1"]))

# %% [markdown]
# ## Translate a corpus in bulk
#
# `Translator.from_pretrained` sorts sentences by length, pads them to a few bucket shapes
# and decodes each batch with one jitted search, here on one device.

# %%
translator = s2s.Translator.from_pretrained(checkpoint_dir, batch_size=16 if QUICK else 64)
test = load_eval_text(s2s.DataConfig(manual_dir=MULTI30K_DIR), "test_2016_flickr")
sources = test.sources[:32 if QUICK else 1000]
references = test.references[:len(sources)]
print(f"devices: {jax.devices()}")
for method, beams in (("greedy", 1), ("beam 4", 4)):
  start = time.time()
  hypotheses = translator.translate(sources, beam_size=beams)
  seconds = time.time() - start
  print(f"{method}: {len(sources)} sentences in {seconds:.1f} s "
        f"({len(sources) / seconds:.0f} sentences/s, first call compiles); "
        f"{corpus_bleu(hypotheses, references)}")
for source, hypothesis in list(zip(sources, hypotheses))[:3]:
  print(f"{source}\n  -> {hypothesis}")

# %% [markdown]
# ## Translate a file with every core of a Colab TPU
#
# On Colab choose *Runtime > Change runtime type > TPU*; `jax.devices()` then lists the TPU's
# cores (eight on a v2-8), and `s2s.make_mesh()` puts them all on the `data` axis that the
# training code uses. `translate_file` reads the file a window of lines at a time (bounded
# memory for millions of lines), sorts each window by length, splits every token-budget batch
# over the cores and writes the translations in input order, flushed, with a side record
# `corpus.en.progress.json`. If the runtime disconnects, running the cell again continues
# after the last complete line, and the file comes out byte-identical to an uninterrupted
# run. The command line does the same:
# `seq2seq-jax translate --pretrained DIR --input corpus.de --output corpus.en`
# (`--n-best K`, `--scores` and `--score-references FILE` for the other output forms).
# In the committed run, on a CPU, the mesh has one device.

# %%
from seq2seq_jax.configs import TranslateFileConfig
from seq2seq_jax.inference import translate_file

mesh = s2s.make_mesh()  # every device of every host
print(f"{jax.device_count()} {jax.devices()[0].platform} device(s); mesh {dict(mesh.shape)}")
file_translator = s2s.Translator.from_pretrained(checkpoint_dir, mesh=mesh)
corpus = WORKDIRS / "corpus.de"
corpus.write_text("\n".join(test.sources[:200] if QUICK else test.sources * 2) + "\n",
                  encoding="utf-8")
result = translate_file(file_translator, corpus, WORKDIRS / "corpus.en", beam_size=1,
                        config=TranslateFileConfig(progress="lines", report_every_s=10))
if result.decoded:
  print(f"{result.decoded} lines decoded in {result.seconds:.1f} s: "
        f"{result.decoded / result.seconds:.0f} sentences/s, "
        f"{result.tokens / result.seconds:.0f} tokens/s on {mesh.devices.size} device(s)")
else:
  print(f"{result.output} was already complete ({result.lines} lines)")
for line in (WORKDIRS / "corpus.en").read_text(encoding="utf-8").splitlines()[:3]:
  print(line)

# %% [markdown]
# ## Scores by forced decoding
#
# `Translator.score` feeds a given translation to the decoder and returns the sum of its
# tokens' log-probabilities (EOS included): the reference against the model's own output.

# %%
own = translator.score(sources[:5], hypotheses[:5])
given = translator.score(sources[:5], references[:5])
for s, h, r, sh, sr in zip(sources, hypotheses, references, own, given):
  print(f"{s}\n  model  {sh:7.2f}  {h}\n  human  {sr:7.2f}  {r}")

# %% [markdown]
# ## Where the decoder looks
#
# The converted model is this library's Transformer, so `return_attention=True` gives its
# cross-attention; the last layer, averaged over heads, for the first test sentence.

# %%
tokenizer = checkpoint.tokenizer
source_ids = tokenizer.encode_source([sources[0]])[0]
target_ids = tokenizer.encode_target([hypotheses[0]])[0]
_, attention = checkpoint.model.apply({"params": checkpoint.params},
                                      np.array([source_ids], np.int32),
                                      np.array([target_ids], np.int32), return_attention=True)
weights_TS = np.asarray(attention["cross"][-1, 0].mean(axis=0))
piece = lambda ids: [tokenizer.decode_batch([[i]])[0] or "</s>" for i in ids]
viz.plot_attention(weights_TS, piece(source_ids), piece(target_ids),
                   title="last decoder layer, mean over heads")

# %% [markdown]
# ## A second family: MADLAD-400, a T5
#
# MADLAD-400 (`google/madlad400-3b-mt`, also 7B and 10B) translates between 400+ languages with
# the T5 v1.1 architecture: relative position buckets instead of position tables, RMSNorm
# without bias, gated-GELU feed-forward layers, and the target language written as a token
# such as `<2de>` in front of the source. `pretrained.load` turns it into `s2s.T5`, a model on
# the same contract as the Transformer, so the same `Translator`, searches, controls and
# `translate_file` run it unchanged. Only `target_lang` is new: it writes the `<2xx>` token.
# The 3B model holds 12 GB of float32 weights: on a Colab TPU load it with `dtype="bfloat16"`.
# Where the hub cannot be reached (and in quick mode), a small checkpoint of MADLAD's layout,
# trained here in both directions with transformers, stands in for it.

# %%
madlad_dir = "google/madlad400-3b-mt"
try:
  if QUICK:
    raise ValueError("quick mode builds a tiny local checkpoint")
  madlad = s2s.Translator.from_pretrained(madlad_dir, batch_size=64)
except ValueError as error:
  print(f"{madlad_dir}: not loaded ({str(error)[:120]}...)")
  madlad_dir = str(WORKDIRS / "madlad-de-en")
  if not pathlib.Path(madlad_dir, "config.json").exists():
    info = fixtures.build_t5(madlad_dir, data_dir=MULTI30K_DIR, variant="madlad",
                             directions=(("de", "en"), ("en", "de")),
                             **({"steps": 60, "vocab_size": 500} if QUICK else FULL_06_MADLAD))
    print(f"built {madlad_dir} in {info.seconds / 60:.1f} min "
          f"({info.steps} steps, final loss {info.final_loss:.2f})")
  madlad = s2s.Translator.from_pretrained(madlad_dir, batch_size=16 if QUICK else 64)
t5_config = madlad.pretrained.config
print(f"{madlad.pretrained.family}: {type(madlad.model).__name__}, "
      f"{t5_config.num_encoder_layers}+{t5_config.num_decoder_layers} layers, "
      f"d {t5_config.model_dim}, vocabulary {t5_config.vocab_size}")
for target_lang, inputs, wanted in (("en", sources, references), ("de", references, sources)):
  start = time.time()
  outputs = madlad.translate(inputs, target_lang=target_lang, beam_size=4)
  print(f"-> {target_lang}: {len(inputs)} sentences in {time.time() - start:.1f} s, "
        f"beam 4; {corpus_bleu(outputs, wanted)}")
  print(f"  {inputs[0]}\n  -> {outputs[0]}")

# %%
session.finish()
