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
from seq2seq_jax.training.sharding import PARAMETER_AXES as PARAMETER_AXES
from seq2seq_jax.training.sharding import check_model_parallelism as check_model_parallelism
from seq2seq_jax.training.sharding import logical_axes as logical_axes
from seq2seq_jax.training.sharding import logical_axis_rules as logical_axis_rules
from seq2seq_jax.training.sharding import maybe_initialize_distributed as maybe_initialize_distributed
from seq2seq_jax.training.sharding import per_device_bytes as per_device_bytes
from seq2seq_jax.training.sharding import process_local_rows as process_local_rows
from seq2seq_jax.training.sharding import state_sharding_fn as state_sharding_fn
from seq2seq_jax.training.sharding import sync_processes as sync_processes
from seq2seq_jax.training.sharding import tree_shardings as tree_shardings
from seq2seq_jax.training.step import TrainState as TrainState
from seq2seq_jax.training.step import abstract_train_state as abstract_train_state
from seq2seq_jax.training.step import create_train_state as create_train_state
from seq2seq_jax.training.step import eval_step as eval_step
from seq2seq_jax.training.step import make_eval_step as make_eval_step
from seq2seq_jax.training.step import make_mesh as make_mesh
from seq2seq_jax.training.step import make_train_step as make_train_step
from seq2seq_jax.training.step import shard_batch as shard_batch
from seq2seq_jax.training.step import train_step as train_step
from seq2seq_jax.training.pair_classifier import PairTrainConfig as PairTrainConfig
from seq2seq_jax.training.pair_classifier import train_pair_classifier as train_pair_classifier


__all__ = [
    "abstract_train_state",
    "check_model_parallelism",
    "config_diff",
    "ConfigMismatchError",
    "create_train_state",
    "cross_entropy_sums",
    "decay_mask",
    "eval_step",
    "logical_axes",
    "logical_axis_rules",
    "LossSums",
    "make_eval_step",
    "make_mesh",
    "make_optimizer",
    "make_schedule",
    "make_train_step",
    "maybe_initialize_distributed",
    "NonFiniteLossError",
    "PairTrainConfig",
    "PARAMETER_AXES",
    "per_device_bytes",
    "process_local_rows",
    "rsqrt_schedule",
    "shard_batch",
    "state_sharding_fn",
    "sync_processes",
    "train",
    "train_pair_classifier",
    "train_step",
    "TrainResult",
    "TrainState",
    "tree_shardings",
]
