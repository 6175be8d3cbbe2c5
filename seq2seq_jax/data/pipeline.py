"""The names this module held before the data path was split by stage; they keep working.

The grain pipeline now lives in one module per stage, each importing only those before
it: ``sources`` -> ``prepared`` -> ``packing`` -> ``batches`` -> ``iterators``. This
module re-exports what it used to define, from there.
"""

from seq2seq_jax.data.batches import Batch as Batch
from seq2seq_jax.data.plans import bucket_rows as bucket_rows
from seq2seq_jax.data.iterators import DEFAULT_READ_OPTIONS as DEFAULT_READ_OPTIONS
from seq2seq_jax.data.iterators import TrainIterator as TrainIterator
from seq2seq_jax.data.iterators import TrainStats as TrainStats
from seq2seq_jax.data.iterators import make_eval_batches as make_eval_batches
from seq2seq_jax.data.iterators import make_train_dataset as make_train_dataset
from seq2seq_jax.data.iterators import make_train_iterator as make_train_iterator
from seq2seq_jax.data.packing import pack_rows as pack_rows
from seq2seq_jax.data.prepared import languages as languages
from seq2seq_jax.data.prepared import token_lengths as token_lengths
from seq2seq_jax.data.sources import EvalText as EvalText
from seq2seq_jax.data.sources import load_eval_text as load_eval_text

__all__ = ["Batch", "bucket_rows", "DEFAULT_READ_OPTIONS", "EvalText", "languages",
           "load_eval_text", "make_eval_batches", "make_train_dataset", "make_train_iterator",
           "pack_rows", "token_lengths", "TrainIterator", "TrainStats"]
