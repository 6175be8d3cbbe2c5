"""Data: tfds builders (Multi30k, parallel_text, tfds:NAME), the sentencepiece vocabulary, token
ids prepared once, grain pipelines.

The path runs one way, a module a stage, each importing only those before it:
``sources`` (where a corpus's text comes from, on ``text_files`` and the tfds
``builders``; it hands the text on in chunks) -> ``prepared`` (token ids written once
from those chunks; ``beam`` writes the same from an Apache Beam pipeline) ->
``packing`` (the packer, its cache, the packed plan) -> ``batches`` (the bucket plan, a
batch's rows built from ids or text) -> ``iterators`` (training and evaluation).
``tokenizer`` trains the vocabulary on a source; ``plans`` holds what packing's and the
bucket plans share (``bucket_rows``, the epoch plan); the old ``pipeline`` module
re-exports its names from their new homes.

Prepared data lives under ``DataConfig.data_dir`` (``""`` means
``~/.cache/seq2seq_jax/tfds``): the text as tfds prepared it, and under ``ids/``
the training split as token ids.
"""

from seq2seq_jax.data.builders import DEFAULT_DATA_DIR as DEFAULT_DATA_DIR
from seq2seq_jax.data.builders import MULTI30K_URL as MULTI30K_URL
from seq2seq_jax.data.builders import TextPairs as TextPairs
from seq2seq_jax.data.builders import download_multi30k as download_multi30k
from seq2seq_jax.data.builders import load_split as load_split
from seq2seq_jax.data.builders import prepare_dataset as prepare_dataset
from seq2seq_jax.data.builders import resolve_data_dir as resolve_data_dir
from seq2seq_jax.data.sources import EvalText as EvalText
from seq2seq_jax.data.sources import load_eval_text as load_eval_text
from seq2seq_jax.data.iterators import TrainStats as TrainStats
from seq2seq_jax.data.plans import bucket_rows as bucket_rows
from seq2seq_jax.data.iterators import make_eval_batches as make_eval_batches
from seq2seq_jax.data.iterators import make_train_dataset as make_train_dataset
from seq2seq_jax.data.iterators import make_train_iterator as make_train_iterator
from seq2seq_jax.data.packing import pack_rows as pack_rows
from seq2seq_jax.data.prepared import PreparedDataError as PreparedDataError
from seq2seq_jax.data.prepared import PreparedIds as PreparedIds
from seq2seq_jax.data.prepared import prepare_ids as prepare_ids
from seq2seq_jax.data.text_files import DataError as DataError
from seq2seq_jax.data.tokenizer import Tokenizer as Tokenizer
from seq2seq_jax.data.tokenizer import load_or_train_tokenizer as load_or_train_tokenizer
from seq2seq_jax.data.tokenizer import train_tokenizer as train_tokenizer
from seq2seq_jax.data.tokenizer import train_tokenizer_from_text as train_tokenizer_from_text
from seq2seq_jax.data.pair_task import PairSplit as PairSplit
from seq2seq_jax.data.pair_task import PairTask as PairTask
from seq2seq_jax.data.pair_task import WordVocab as WordVocab
from seq2seq_jax.data.pair_task import build_pair_task as build_pair_task
from seq2seq_jax.data.pair_task import hard_negatives as hard_negatives
from seq2seq_jax.data.pair_task import tokenize as tokenize


__all__ = [
    "bucket_rows",
    "build_pair_task",
    "DataError",
    "DEFAULT_DATA_DIR",
    "download_multi30k",
    "EvalText",
    "hard_negatives",
    "load_eval_text",
    "load_or_train_tokenizer",
    "load_split",
    "make_eval_batches",
    "make_train_dataset",
    "make_train_iterator",
    "MULTI30K_URL",
    "pack_rows",
    "PairSplit",
    "PairTask",
    "prepare_dataset",
    "prepare_ids",
    "PreparedDataError",
    "PreparedIds",
    "resolve_data_dir",
    "TextPairs",
    "tokenize",
    "Tokenizer",
    "train_tokenizer",
    "train_tokenizer_from_text",
    "TrainStats",
    "WordVocab",
]
