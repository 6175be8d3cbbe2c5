"""Writes the tutorial notebooks colabs/NN_*.ipynb from the cell sources below (a dev tool).

The notebooks import only seq2seq_jax's public API; this script holds their text,
nothing the library lacks. Each notebook starts with the same two cells: a badge
cell and a setup cell that installs the package when it is missing, both built
from ``REPO_URL`` below: THE ONE PLACE TO SET THE REPOSITORY'S ADDRESS.

  python colabs/build_notebooks.py               # (re)write all notebooks, no outputs
  python colabs/build_notebooks.py 03            # only 03_transformer
  python colabs/build_notebooks.py --relink      # rewrite the markdown (badge included) and
                                                 # REPO_URL cells, keeping the outputs
  python colabs/build_notebooks.py --execute 01  # run it top to bottom in place (nbclient);
                                                 # SEQ2SEQ_JAX_QUICK=1 for the quick mode

Quick mode (``SEQ2SEQ_JAX_QUICK=1``) uses the 300-line multi30k_tiny copy, tiny
models and a few steps; CI runs every notebook that way (tests/test_notebooks.py).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import textwrap
import time

import nbformat

# ---------------------------------------------------------------------------------------------
# THE ONE PLACE TO SET THE REPOSITORY ADDRESS. Its public address is not known yet; replace the
# placeholder, then run `python colabs/build_notebooks.py --relink`.
REPO_URL = "https://github.com/YOUR-ORG/seq2seq_jax"
# ---------------------------------------------------------------------------------------------
BRANCH = "main"
COLABS = pathlib.Path(__file__).resolve().parent


def _clean(text: str) -> str:
  return textwrap.dedent(text).strip("\n")


def badge_cell(name: str, title: str, summary: str) -> nbformat.NotebookNode:
  """The title, with an Open-in-Colab badge built from ``REPO_URL``."""
  path = re.sub(r"^https://github\.com/", "", REPO_URL).rstrip("/")
  link = f"https://colab.research.google.com/github/{path}/blob/{BRANCH}/colabs/{name}.ipynb"
  badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({link})"
  cell = nbformat.v4.new_markdown_cell(f"# {title}\n\n{badge}\n\n{_clean(summary)}")
  cell.id = "badge"
  return cell


SETUP = '''
# The repository address: written by colabs/build_notebooks.py from its REPO_URL,
# the single place to set it (placeholder until the repository is public).
REPO_URL = "{repo_url}"

import importlib.util
import subprocess
import sys

if importlib.util.find_spec("seq2seq_jax") is None:  # e.g. a fresh Colab runtime
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{{REPO_URL}}"], check=True)
'''


def setup_cell() -> nbformat.NotebookNode:
  cell = nbformat.v4.new_code_cell(_clean(SETUP.format(repo_url=REPO_URL)))
  cell.id = "setup"
  return cell


# Where the data and the runs live: ../shared/data beside a checkout (locally and in CI), else
# the official Multi30k files, downloaded by the library's builder (DataConfig.manual_dir="").
PATHS = '''
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
print(f"quick mode: {{QUICK}}; data: {{MULTI30K_DIR or 'download'}}; runs in {{WORKDIRS}}")
'''


def paths_cell() -> nbformat.NotebookNode:
  return nbformat.v4.new_code_cell(_clean(PATHS.format()))


def md(text: str) -> nbformat.NotebookNode:
  return nbformat.v4.new_markdown_cell(_clean(text))


def code(text: str) -> nbformat.NotebookNode:
  return nbformat.v4.new_code_cell(_clean(text))


def elapsed_cell() -> nbformat.NotebookNode:
  return code('''
      print(f"notebook ran in {(time.time() - NOTEBOOK_START) / 60:.1f} minutes "
            f"({'quick' if QUICK else 'full'} mode) on {jax.devices()[0].device_kind}")
      ''')


# ============================================================================================ 01

NB01 = [
    md('''
    The first neural translators (Sutskever et al. 2014, Cho et al. 2014) read the source
    sentence with a recurrent network into one fixed-size vector, the "thought vector", and let
    a second recurrent network write the translation from it. This notebook builds that model
    with `seq2seq_jax`, trains it on Multi30k (German to English), decodes greedily, and
    measures what the fixed-size summary costs: quality falls as sources get longer.

    *Committed outputs: a full run on a shared 2-core CPU (the time is printed at the end).
    Set `SEQ2SEQ_JAX_QUICK=1` for a tiny run of a minute or two.*
    '''),
    md('''
    ## Embeddings and the scan-based encoder

    Token ids become vectors through an embedding table; an `RNNEncoder` then runs a GRU cell
    over them with `flax.linen.scan`, a compiled loop, stopping each row at its real length
    (padding does not change a row's states). `encode` returns the per-position states and
    the final state of each row, `summary_BD`: the only thing the decoder of this model sees.
    '''),
    code('''
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
    '''),
    md('''
    Both sentences end up as 16 numbers. Without attention the decoder conditions every step
    on that summary (Cho et al. feed it to every step, not only the first), so a long sentence
    must squeeze through the same bottleneck as a short one.

    ## Data and configuration

    The library's Multi30k builder prepares the corpus once (from `../shared/data` beside a
    checkout, or downloading the official files on Colab). The preset `multi30k_gru` is a
    one-layer GRU encoder-decoder without attention; here it is shrunk so that it trains in
    minutes on a CPU.
    '''),
    code('''
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
    '''),
    md('''
    ## Training

    `train(config, workdir)` runs the whole loop: the sentencepiece vocabulary, bucketed
    batches, the jitted step, validation BLEU, checkpoints and `metrics.jsonl`. Rerunning the
    cell resumes the run (or, when it has finished, just reports it).
    '''),
    code('''
    workdir = WORKDIRS / "colab_01_gru"
    start = time.time()
    result = train(config, workdir)
    print(f"{result.step} steps, best validation BLEU {result.best_bleu} "
          f"({(time.time() - start) / 60:.1f} min in this session)")
    '''),
    code('''
    viz.plot_training_curves(workdir, title="GRU encoder-decoder (thought vector)")
    '''),
    md('''
    ## Greedy decoding

    `Translator` wraps the checkpoint: it tokenizes, pads sources to a few bucket lengths,
    runs the jitted greedy search (one `lax.while_loop` over a `decode_step` that carries the
    GRU state in an explicit cache) and detokenizes.
    '''),
    code('''
    translator = Translator.from_workdir(workdir)
    test = load_eval_text(config.data, "test_2016_flickr")
    hypotheses = translator.translate(test.sources)
    for i in (0, 1, 2):
      print(f"source:     {test.sources[i]}\\nreference:  {test.references[i]}\\n"
            f"greedy:     {hypotheses[i]}\\n")
    print(evaluation.corpus_bleu(hypotheses, test.references))
    print(evaluation.corpus_chrf(hypotheses, test.references))
    '''),
    md('''
    ## Quality against source length

    Corpus BLEU of the test sentences grouped by the length of their source. With a single
    summary vector the long sentences suffer most; notebook 02 draws the same plot for the
    attention model.
    '''),
    code('''
    by_length = viz.bleu_by_length(test.sources, hypotheses, test.references,
                                   edges=(8, 11, 14, 17, 20))
    viz.plot_quality_by_length({"GRU, thought vector": by_length},
                               title="GRU encoder-decoder on test_2016_flickr")
    '''),
    elapsed_cell(),
]

# ============================================================================================ 02

NB02 = [
    md('''
    Bahdanau et al. (2015) removed the thought-vector bottleneck: at every output step the
    decoder scores each encoder state against its own state, turns the scores into a soft
    alignment with a softmax, and reads their weighted average. Luong et al. (2015) simplified
    the score to a dot product (or a bilinear form) and queried with the new decoder state.
    This notebook shows both scores on toy arrays, trains a bidirectional GRU with additive
    attention on Multi30k, and draws the alignments it learned on real test sentences.

    *Committed outputs: a full run on a shared 2-core CPU (the time is printed at the end).
    Set `SEQ2SEQ_JAX_QUICK=1` for a tiny run.*
    '''),
    md('''
    ## Additive and multiplicative scores

    The scoring functions are pure functions in `seq2seq_jax.layers.attention`; padding is
    masked before the softmax, so padded positions get exactly zero weight.
    '''),
    code('''
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
    '''),
    md('''
    ## Training the attention model

    The preset `multi30k_rnn_attention` is a bidirectional GRU encoder with Bahdanau's
    additive attention (`RNNConfig(attention="additive")`; `"dot"` or `"general"` selects
    Luong's scores, `input_feeding=True` his input feeding). It is shrunk here so that it
    trains in minutes on a CPU.
    '''),
    code('''
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
    '''),
    code('''
    viz.plot_training_curves(workdir, title="bidirectional GRU with additive attention")
    '''),
    md('''
    ## Soft alignments on real sentences

    `viz.align` translates a sentence greedily, runs the decoder once more with
    `return_attention=True` over that translation, and cuts the `[T, S]` weights to the real
    pieces. Each row shows where the decoder looked while writing that target piece: mostly a
    diagonal, bent where German and English order words differently.
    '''),
    code('''
    translator = Translator.from_workdir(workdir)
    test = load_eval_text(config.data, "test_2016_flickr")
    for i in (3, 11):
      alignment = viz.align(translator, test.sources[i])
      display(viz.plot_attention(alignment.weights["cross"], alignment.source_tokens,
                                 alignment.target_tokens, title=alignment.translation))
    '''),
    md('''
    The same model forced to read the human reference shows how it aligns a translation it did
    not choose:
    '''),
    code('''
    i = 3
    alignment = viz.align(translator, test.sources[i], test.references[i])
    viz.plot_attention(alignment.weights["cross"], alignment.source_tokens,
                       alignment.target_tokens, title=f"reference: {test.references[i]}")
    '''),
    md('''
    ## Quality against source length

    BLEU by source length on the test set. When notebook 01 ran in the same place, its
    thought-vector model is drawn beside the attention model.
    '''),
    code('''
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
    '''),
    elapsed_cell(),
]

# ============================================================================================ 03

NB03 = [
    md('''
    The Transformer (Vaswani et al. 2017) keeps attention and drops recurrence: every layer
    lets each position attend to all others at once. This notebook looks at the pieces
    (self-attention with a padding mask, masked self-attention in the decoder, cross-attention,
    heads, positions), then opens a trained Transformer and draws what its heads attend to,
    and compares greedy decoding with beam search on real sentences.

    *Committed outputs: a full run on a shared 2-core CPU (the time is printed at the end).
    The Transformer shares its run with notebook 04: whichever runs first trains it, the other
    reloads it. Set `SEQ2SEQ_JAX_QUICK=1` for a tiny run.*
    '''),
    md('''
    ## Masks: who may attend to whom

    Masks are boolean, `True` = may attend. The encoder hides padding; the decoder also hides
    the future, so that training on a whole target at once matches decoding one token at a time.
    '''),
    code('''
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
    '''),
    md('''
    ## Heads and positions

    `dot_product_attention` splits the width into `H` heads of `K` dimensions, each with its own
    softmax over the keys. Attention alone ignores order, so the model adds a position signal:
    the fixed sinusoids of the paper (`positions="sinusoidal"`) or a learned table.
    '''),
    code('''
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
    '''),
    md('''
    ## A trained Transformer

    The preset `multi30k_transformer` (3+3 layers, 4 heads) at width 128 and 800 steps so that
    it trains in minutes on a CPU: the same configuration and run folder as notebook 04. Such a
    short run is far from converged (validation BLEU is still rising fast when it stops), so
    expect rougher translations and less tidy heads than a full run gives.
    '''),
    code('''
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
    '''),
    md('''
    ### Cross-attention: every head of every decoder layer

    Rows are the target pieces of the model's translation, columns the source pieces. Heads of
    the upper layers tend to align sharply, lower ones spread out or track neighbours.
    '''),
    code('''
    alignment = viz.align(translator, test.sources[3])
    print(alignment.source, "->", alignment.translation)
    viz.plot_attention_grid(alignment.weights["cross"], alignment.source_tokens,
                            alignment.target_tokens, title="cross-attention, layers x heads")
    '''),
    md('''
    ### Encoder self-attention, last layer
    '''),
    code('''
    viz.plot_attention_grid(alignment.weights["encoder_self"][-1:], alignment.source_tokens,
                            alignment.source_tokens, row_labels=["last encoder layer"],
                            title="encoder self-attention")
    '''),
    md('''
    ## Greedy against beam search

    Greedy search commits to the best next piece; beam search keeps the `W` best prefixes and
    ranks finished hypotheses with the GNMT length penalty. Same model, same sentences:
    '''),
    code('''
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
        print(f"\\nsource:    {sentences[i]}\\nreference: {references[i]}")
        for name in settings:
          print(f"{name + ':':<10} {outputs[name][i]}")
        break
    viz.plot_decoding_comparison(scores, title=f"BLEU on {len(sentences)} test sentences")
    '''),
    elapsed_cell(),
]

# ============================================================================================ 04

NB04 = [
    md('''
    The whole pipeline through the public API, on whatever accelerator the runtime has:
    prepare Multi30k, train a Transformer, evaluate with sacreBLEU, translate new sentences.
    On a Colab TPU runtime `jax.devices()` lists the cores and the training step shards each
    batch over all of them (a mesh with a `data` axis); on a GPU or CPU it uses what is there.

    *Committed outputs: a full run on a shared 2-core CPU (the time is printed at the end).
    Set `SEQ2SEQ_JAX_QUICK=1` for a tiny run.*
    '''),
    code('''
    import jax

    from seq2seq_jax import evaluation, presets
    from seq2seq_jax import visualization as viz
    from seq2seq_jax.data import load_eval_text, prepare_dataset
    from seq2seq_jax.training import train
    from seq2seq_jax.translator import Translator

    print(jax.devices())
    '''),
    md('''
    ## 1. Prepare the data

    `prepare_dataset` reads the official Multi30k files (a local copy, or downloaded and
    checksummed) into tfds `array_record` files once; later calls reuse them.
    '''),
    code('''
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
    builder = prepare_dataset(config.data)
    for name, split in sorted(builder.info.splits.items()):
      print(f"{name:>18}: {split.num_examples} pairs")
    '''),
    md('''
    ## 2. Train

    The configuration is a frozen dataclass; presets are starting points and
    `section.field=value` overrides adjust them (the command line takes the same strings).
    '''),
    code('''
    print(config.model)
    print(config.train)
    workdir = WORKDIRS / "colab_transformer"
    start = time.time()
    result = train(config, workdir)
    print(f"{result.step} steps, best validation BLEU {result.best_bleu} at step "
          f"{result.best_step} ({(time.time() - start) / 60:.1f} min in this session)")
    '''),
    code('''
    viz.plot_training_curves(workdir, metrics=("loss", "val_loss", "bleu"),
                             title="Transformer on Multi30k de-en")
    '''),
    md('''
    ## 3. Evaluate with sacreBLEU

    Detokenized, cased output against the untokenized references of `test_2016_flickr` with
    sacreBLEU's defaults: the standard, comparable Multi30k test score (the signature says
    exactly how it was computed).

    The committed run is short (800 steps, width 128, on a shared 2-core CPU) and stops while
    the validation BLEU is still climbing steeply, so it trails the attention RNN of notebook
    02, which converges faster in its first few hundred steps. The preset itself (width 256,
    a cosine schedule over about 7 epochs) is the `make train` recipe: under 30 minutes on a
    quiet 2-core CPU, with the BLEU given in the README.
    '''),
    code('''
    translator = Translator.from_workdir(workdir)
    test = load_eval_text(config.data, "test_2016_flickr")
    start = time.time()
    greedy = translator.translate(test.sources)
    beam = translator.translate(test.sources, beam_size=4, alpha=0.6)
    print(f"translated {len(test.sources)} sentences twice in {time.time() - start:.0f} s")
    for name, hypotheses in (("greedy", greedy), ("beam 4", beam)):
      print(f"{name:>7}: {evaluation.corpus_bleu(hypotheses, test.references)}")
      print(f"{'':>7}  {evaluation.corpus_chrf(hypotheses, test.references)}")
    '''),
    code('''
    viz.plot_quality_by_length(
        {"greedy": viz.bleu_by_length(test.sources, greedy, test.references,
                                      edges=(8, 11, 14, 17, 20)),
         "beam 4": viz.bleu_by_length(test.sources, beam, test.references,
                                      edges=(8, 11, 14, 17, 20))},
        title="Transformer on test_2016_flickr")
    '''),
    md('''
    ## 4. Translate your own sentences
    '''),
    code('''
    sentences = ["Ein kleines Mädchen spielt im Sand am Strand.",
                 "Zwei Männer in roten Jacken fahren Fahrrad auf einer Straße.",
                 "Ein Hund springt über einen Zaun."]
    for source, target in zip(sentences, translator.translate(sentences, beam_size=4)):
      print(f"{source}\\n  -> {target}")
    '''),
    elapsed_cell(),
]

# ============================================================================================ 05

NB05 = [
    md('''
    Parikh et al. (2016) showed that attention without any recurrence can compare two
    sentences: soft-align each word of one sentence with the other (attend), compare each word
    with what it aligned to (compare), sum the comparisons and classify (aggregate). Here the
    pair task is translation detection on Multi30k: does this English sentence translate this
    German one? Each false pair uses a hard negative, an English sentence of nearly the same
    length that shares as many words as possible with the true one.

    *Committed outputs: a full run on a shared 2-core CPU (the time is printed at the end).
    Set `SEQ2SEQ_JAX_QUICK=1` for a tiny run.*
    '''),
    code('''
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
    '''),
    md('''
    ## Training
    '''),
    code('''
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
    '''),
    md('''
    ## The attention matrix

    `return_attention=True` returns both directions of the soft alignment; `a_to_b[i, j]` is
    how much German word `i` attends to English word `j`. The example is the first short test
    sentence for which the model gets both the true pair and its hard negative right (it misses
    about one pair in seven). In this short run most rows stay diffuse and only a few words
    align sharply: the model decides as much in its compare and aggregate steps as in the
    alignment, and a longer run (or `intra_attention=True`) sharpens the matrix.
    '''),
    code('''
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
    '''),
    elapsed_cell(),
]

# ============================================================================================ 06

NB06 = [
    md('''
    About 1,500 OPUS-MT translation models (Helsinki-NLP, MarianMT layout) and the multilingual
    M2M100 / NLLB-200 models are published as PyTorch checkpoints; transformers no longer runs
    them in JAX. `seq2seq_jax.pretrained` reads such a checkpoint into this library's
    Transformer, with outputs identical to PyTorch's, so the same jitted searches translate
    with it on a CPU, GPU or TPU. This notebook loads `Helsinki-NLP/opus-mt-de-en`, translates
    Multi30k's test set in bulk, translates a file resumably on every core of the machine (all
    eight of a Colab TPU v2-8), scores translations by forced decoding and plots where the
    model looks.

    Where the hub cannot be reached (and in quick mode) it builds a small checkpoint of the
    same layout locally instead: a MarianMT trained for a few minutes on Multi30k with
    transformers and `save_pretrained`, which needs `torch` and `transformers`.

    *Committed outputs: a full run on a shared 2-core CPU without network access (so on the
    locally built checkpoint; the time is printed at the end). Set `SEQ2SEQ_JAX_QUICK=1` for a
    tiny run.*
    '''),
    code('''
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
    '''),
    md('''
    ## Translate a corpus in bulk

    `Translator.from_pretrained` sorts sentences by length, pads them to a few bucket shapes
    and decodes each batch with one jitted search, here on one device.
    '''),
    code('''
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
      print(f"{source}\\n  -> {hypothesis}")
    '''),
    md('''
    ## Translate a file with every core of a Colab TPU

    On Colab choose *Runtime > Change runtime type > TPU*; `jax.devices()` then lists the TPU's
    cores (eight on a v2-8), and `s2s.make_mesh()` puts them all on the `data` axis that the
    training code uses. `translate_file` reads the file a window of lines at a time (bounded
    memory for millions of lines), sorts each window by length, splits every token-budget batch
    over the cores and writes the translations in input order, flushed, with a side record
    `corpus.en.progress.json`. If the runtime disconnects, running the cell again continues
    after the last complete line, and the file comes out byte-identical to an uninterrupted
    run. The command line does the same:
    `seq2seq-jax translate --pretrained DIR --input corpus.de --output corpus.en`
    (`--n-best K`, `--scores` and `--score-references FILE` for the other output forms).
    In the committed run, on a CPU, the mesh has one device.
    '''),
    code('''
    from seq2seq_jax.configs import TranslateFileConfig
    from seq2seq_jax.inference import translate_file

    mesh = s2s.make_mesh()  # every device of every host
    print(f"{jax.device_count()} {jax.devices()[0].platform} device(s); mesh {dict(mesh.shape)}")
    file_translator = s2s.Translator.from_pretrained(checkpoint_dir, mesh=mesh)
    corpus = WORKDIRS / "corpus.de"
    corpus.write_text("\\n".join(test.sources * (1 if QUICK else 2)) + "\\n", encoding="utf-8")
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
    '''),
    md('''
    ## Scores by forced decoding

    `Translator.score` feeds a given translation to the decoder and returns the sum of its
    tokens' log-probabilities (EOS included): the reference against the model's own output.
    '''),
    code('''
    own = translator.score(sources[:5], hypotheses[:5])
    given = translator.score(sources[:5], references[:5])
    for s, h, r, sh, sr in zip(sources, hypotheses, references, own, given):
      print(f"{s}\\n  model  {sh:7.2f}  {h}\\n  human  {sr:7.2f}  {r}")
    '''),
    md('''
    ## Where the decoder looks

    The converted model is this library's Transformer, so `return_attention=True` gives its
    cross-attention; the last layer, averaged over heads, for the first test sentence.
    '''),
    code('''
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
    '''),
    elapsed_cell(),
]

# ============================================================================================

# Full-run sizes, what the committed outputs were made with on a shared 2-core CPU. Each
# notebook gets a cell defining those of these names that its code uses.
_FULL_DATA = ["data.vocab_size=3000", "model.vocab_size=3000", "data.max_source_len=40",
              "data.max_target_len=40", "data.bucket_lengths=16,24,32,40",
              "data.batch_tokens=2048"]
# The recipes as they were when the committed outputs were made, pinned here so that the
# notebooks keep running those recipes whatever the presets' defaults become (the outputs
# themselves were drawn with flax's threefry dropout masks, before layers/dropout.py).
_FULL_RNN = _FULL_DATA + [
    "model.dropout_rate=0.3", "train.learning_rate=2e-3", "train.schedule=constant",
    "train.warmup_steps=0",
    "model.embed_dim=128", "model.hidden_dim=256", "train.num_steps=700", "train.log_every=50",
    "train.eval_every=350", "train.checkpoint_every=350", "train.eval_bleu_sentences=200",
    "train.eval_batches=4"]
FULL_01 = _FULL_RNN
FULL_02 = _FULL_RNN
FULL_TRANSFORMER = _FULL_DATA + [
    "train.learning_rate=2e-3", "train.schedule=rsqrt",
    "model.model_dim=128", "model.mlp_dim=512", "train.num_steps=800",
    "train.warmup_steps=200", "train.log_every=50", "train.eval_every=400",
    "train.checkpoint_every=400", "train.eval_bleu_sentences=200", "train.eval_batches=4"]
FULL_05_MODEL = {"embed_dim": 100, "hidden_dim": 128, "dropout_rate": 0.2}
FULL_05_TRAIN = {"epochs": 6, "batch_size": 128, "learning_rate": 2e-3}
FULL_06_BUILD = {"steps": 1200, "model_dim": 128, "ffn": 256, "batch_size": 64,
                 "learning_rate": 3e-3, "max_pairs": 29_000}

NOTEBOOKS = {
    "01_encoder_decoder_rnn": ("01 · The RNN encoder-decoder and its thought vector", NB01),
    "02_attention_alignment": ("02 · Attention: Bahdanau and Luong, soft alignments", NB02),
    "03_transformer": ("03 · The Transformer: self-attention, heads, beam search", NB03),
    "04_translate_multi30k": ("04 · Translate Multi30k end to end", NB04),
    "05_decomposable_attention": ("05 · Decomposable attention for sentence pairs", NB05),
    "06_pretrained_opus_mt": ("06 · Published checkpoints: OPUS-MT in JAX", NB06),
}


def _settings_cell(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
  """Defines the FULL_* settings that the notebook's code uses."""
  settings = {"FULL_01": FULL_01, "FULL_02": FULL_02, "FULL_TRANSFORMER": FULL_TRANSFORMER,
              "FULL_05_MODEL": FULL_05_MODEL, "FULL_05_TRAIN": FULL_05_TRAIN,
              "FULL_06_BUILD": FULL_06_BUILD}
  used = [name for name in settings if any(name in cell.source for cell in cells)]
  lines = ["# Full-run settings (quick mode ignores them): sized to train in minutes on a 2-core",
           "# CPU. On a GPU or TPU raise the steps; the presets' defaults are the full recipes."]
  for name in used:
    value = settings[name]
    if isinstance(value, list):
      lines.append(f"{name} = [")
      lines += [f"    {item!r}," for item in value]
      lines.append("]")
    else:
      lines.append(f"{name} = {value!r}")
  return code("\n".join(lines))


def build(name: str) -> nbformat.NotebookNode:
  """The notebook ``name`` without outputs."""
  title, cells = NOTEBOOKS[name]
  summary = cells[0].source
  notebook = nbformat.v4.new_notebook()
  notebook.metadata = {
      "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
      "language_info": {"name": "python"},
      "colab": {"provenance": []},
      "accelerator": "GPU",
  }
  notebook.cells = [badge_cell(name, title, summary), setup_cell(), paths_cell(),
                    _settings_cell(cells)] + [nbformat.from_dict(dict(c)) for c in cells[1:]]
  for index, cell in enumerate(notebook.cells[2:], start=2):
    cell.id = f"cell-{index:02d}"
  nbformat.validate(notebook)
  return notebook


def relink(path: pathlib.Path) -> None:
  """Rewrites the text of an executed notebook from this script, keeping its outputs.

  Markdown cells (the badge included) and the setup cell (``REPO_URL``) take their
  current sources; every other code cell must already match, since its outputs came
  from running it: a notebook whose code changed must be executed again instead.
  """
  notebook = nbformat.read(path, as_version=4)
  fresh = build(path.stem)
  if len(notebook.cells) != len(fresh.cells):
    raise SystemExit(f"{path}: {len(notebook.cells)} cells, the builder writes "
                     f"{len(fresh.cells)}; rebuild and execute it instead")
  for index, (cell, new) in enumerate(zip(notebook.cells, fresh.cells)):
    if cell.cell_type != new.cell_type:
      raise SystemExit(f"{path}: cell {index} changed type; rebuild and execute it instead")
    if cell.cell_type == "markdown" or new.get("id") == "setup":
      cell.source = new.source
    elif cell.source != new.source:
      raise SystemExit(f"{path}: code cell {index} changed; rebuild and execute it instead")
  nbformat.write(notebook, path)


def execute(path: pathlib.Path, timeout: int) -> float:
  """Runs the notebook top to bottom in place with the python3 kernel; returns minutes."""
  import nbclient
  notebook = nbformat.read(path, as_version=4)
  start = time.time()
  nbclient.NotebookClient(notebook, kernel_name="python3", timeout=timeout,
                          resources={"metadata": {"path": str(path.parent)}}).execute()
  nbformat.write(notebook, path)
  return (time.time() - start) / 60


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("only", nargs="*", help="notebook number prefixes (default: all)")
  parser.add_argument("--relink", action="store_true",
                      help="only rewrite the markdown and REPO_URL cells, keeping the outputs")
  parser.add_argument("--execute", action="store_true",
                      help="run the existing notebooks in place (keeps their sources)")
  parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
  args = parser.parse_args(argv)
  names = [n for n in NOTEBOOKS if not args.only or any(n.startswith(p) for p in args.only)]
  for name in names:
    path = COLABS / f"{name}.ipynb"
    if args.relink:
      relink(path)
      print(f"relinked {path}")
    elif args.execute:
      minutes = execute(path, args.timeout)
      print(f"executed {path} in {minutes:.1f} min")
    else:
      nbformat.write(build(name), path)
      print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
