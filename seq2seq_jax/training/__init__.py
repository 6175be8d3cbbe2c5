"""Training: losses, schedules, the optimizer, pure train/eval steps over a mesh, the host loop.

``train(config, workdir)`` is the entry point; the pieces below it are public for
programs that write their own loop.
"""

from seq2seq_jax.training.loop import ConfigMismatchError as ConfigMismatchError
from seq2seq_jax.training.loop import NonFiniteLossError as NonFiniteLossError
from seq2seq_jax.training.loop import TrainResult as TrainResult
from seq2seq_jax.training.loop import config_diff as config_diff
from seq2seq_jax.training.loop import train as train
from seq2seq_jax.training.losses import LossSums as LossSums
from seq2seq_jax.training.losses import cross_entropy_sums as cross_entropy_sums
from seq2seq_jax.training.optimizer import decay_mask as decay_mask
from seq2seq_jax.training.optimizer import make_optimizer as make_optimizer
from seq2seq_jax.training.schedules import make_schedule as make_schedule
from seq2seq_jax.training.schedules import rsqrt_schedule as rsqrt_schedule
from seq2seq_jax.training.step import TrainState as TrainState
from seq2seq_jax.training.step import abstract_train_state as abstract_train_state
from seq2seq_jax.training.step import create_train_state as create_train_state
from seq2seq_jax.training.step import eval_step as eval_step
from seq2seq_jax.training.step import make_eval_step as make_eval_step
from seq2seq_jax.training.step import make_mesh as make_mesh
from seq2seq_jax.training.step import make_train_step as make_train_step
from seq2seq_jax.training.step import shard_batch as shard_batch
from seq2seq_jax.training.step import train_step as train_step

__all__ = [
    "ConfigMismatchError",
    "LossSums",
    "NonFiniteLossError",
    "TrainResult",
    "TrainState",
    "abstract_train_state",
    "config_diff",
    "create_train_state",
    "cross_entropy_sums",
    "decay_mask",
    "eval_step",
    "make_eval_step",
    "make_mesh",
    "make_optimizer",
    "make_schedule",
    "make_train_step",
    "rsqrt_schedule",
    "shard_batch",
    "train",
    "train_step",
]
