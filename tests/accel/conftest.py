"""Fixtures of the emulated-accelerator tier: Multi30k's tiny sample in rows of splash's 128.

Every length here is one splash tile (128), so each attention of training,
validation and the translator's encoder reaches the kernel under test rather than
falling back to the einsums.
"""

import dataclasses

import pytest

from seq2seq_jax.configs import (DataConfig, DecodeConfig, ExperimentConfig, T5Config,
                                 TrainConfig, TransformerConfig)

ROW = 128  # splash's tile: every padded length of the tier
VOCAB = 256
# The three meshes of an 8-device slice: (TrainConfig.parameter_sharding, model_parallelism).
MESHES = {"replicated": ("replicated", 1), "fsdp": ("fsdp", 1), "data4_model2": ("replicated", 2)}


@pytest.fixture(scope="session")
def accel_data(request, tmp_path_factory) -> DataConfig:
  # tests/conftest.py's shared_data: skips locally, fails under CI when the data is missing.
  shared_data = next(plugin.shared_data for plugin in request.config.pluginmanager.get_plugins()
                     if callable(getattr(plugin, "shared_data", None)))
  return DataConfig(manual_dir=str(shared_data("multi30k_tiny")),
                    data_dir=str(tmp_path_factory.mktemp("tfds")), vocab_size=VOCAB,
                    max_source_len=ROW, max_target_len=ROW, too_long="truncate",
                    bucket_lengths=(ROW,), batch_tokens=8 * ROW, eval_batch_size=8)


def model_config(kind: str, implementation: str):
  if kind == "t5":
    return T5Config(vocab_size=VOCAB, model_dim=32, num_heads=2, head_dim=16, mlp_dim=64,
                    num_encoder_layers=1, num_decoder_layers=1, relative_buckets=8,
                    relative_max_distance=16, activation="gelu_tanh", gated_ffn=True,
                    tie_output=False, scale_output=False, max_len=ROW, dropout_rate=0.0,
                    pad_id=0, decoder_start_id=1, eos_id=2, attention_impl=implementation)
  return TransformerConfig(vocab_size=VOCAB, model_dim=32, num_heads=2, mlp_dim=64,
                           num_encoder_layers=1, num_decoder_layers=1, max_len=ROW,
                           dropout_rate=0.0, attention_impl=implementation)


def experiment(data: DataConfig, *, kind: str, implementation: str, mesh: str,
               packing: bool) -> ExperimentConfig:
  """4 updates of 8 rows of 128; validation (loss and BLEU) at 2 and 4; checkpoints at 2 and 4."""
  sharding, model_parallelism = MESHES[mesh]
  train = TrainConfig(num_steps=4, learning_rate=1e-2, warmup_steps=2, log_every=1,
                      eval_every=2, checkpoint_every=2, keep_checkpoints=3,
                      eval_bleu_sentences=8, eval_batches=1, parameter_sharding=sharding,
                      model_parallelism=model_parallelism)
  return ExperimentConfig(model=model_config(kind, implementation),
                          data=dataclasses.replace(data, packing=packing), train=train,
                          decode=DecodeConfig(method="beam", beam_size=2, max_decode_len=10))
