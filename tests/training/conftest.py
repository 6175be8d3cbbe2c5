"""Fixtures of the training tests: multi30k_tiny prepared once, one tokenizer, tiny configs."""

import dataclasses

import pytest

from seq2seq_jax.configs import (DataConfig, DecodeConfig, ExperimentConfig, RNNConfig,
                                 T5Config, TrainConfig, TransformerConfig)

VOCAB = 256  # small: multi30k_tiny fills it easily, and the output layer stays cheap


@pytest.fixture(scope="session")
def tiny_data(request, tmp_path_factory) -> DataConfig:
  # tests/conftest.py's shared_data: skips locally, fails under CI when the data is missing.
  shared_data = next(plugin.shared_data for plugin in request.config.pluginmanager.get_plugins()
                     if callable(getattr(plugin, "shared_data", None)))
  return DataConfig(manual_dir=str(shared_data("multi30k_tiny")),
                    data_dir=str(tmp_path_factory.mktemp("tfds")), vocab_size=VOCAB,
                    max_source_len=32, max_target_len=32, too_long="truncate",
                    bucket_lengths=(16, 32), batch_tokens=512, eval_batch_size=16)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_data):
  from seq2seq_jax.data.tokenizer import train_tokenizer
  return train_tokenizer(tiny_data)


def tiny_transformer(**overrides) -> TransformerConfig:
  values = dict(vocab_size=VOCAB, model_dim=32, num_heads=2, mlp_dim=64, num_encoder_layers=1,
                num_decoder_layers=1, max_len=32, dropout_rate=0.0)
  return TransformerConfig(**{**values, **overrides})


def tiny_deep_shallow(**overrides) -> TransformerConfig:
  """A deep encoder and a shallow decoder, each with its own heads and FFN width."""
  return tiny_transformer(**{**dict(num_encoder_layers=3, num_decoder_layers=1, num_heads=4,
                                    decoder_num_heads=2, mlp_dim=48, decoder_mlp_dim=80),
                             **overrides})


def tiny_t5(**overrides) -> T5Config:
  """T5 (v1.1's gated GELU, a separate output layer) with the run vocabulary's ids."""
  values = dict(vocab_size=VOCAB, model_dim=32, num_heads=2, head_dim=12, mlp_dim=64,
                num_encoder_layers=2, num_decoder_layers=1, relative_buckets=8,
                relative_max_distance=16, activation="gelu_tanh", gated_ffn=True,
                tie_output=False, scale_output=False, max_len=32, dropout_rate=0.0,
                pad_id=0, decoder_start_id=1, eos_id=2)
  return T5Config(**{**values, **overrides})


def tiny_rnn(**overrides) -> RNNConfig:
  values = dict(vocab_size=VOCAB, cell="gru", embed_dim=32, hidden_dim=32, attention="dot",
                max_len=32, dropout_rate=0.0)
  return RNNConfig(**{**values, **overrides})


def tiny_experiment(data: DataConfig, *, model=None, **train_overrides) -> ExperimentConfig:
  values = dict(num_steps=12, learning_rate=3e-3, warmup_steps=5, log_every=4, eval_every=0,
                checkpoint_every=4, keep_checkpoints=2, eval_bleu_sentences=16, eval_batches=1)
  train = TrainConfig(**{**values, **train_overrides})
  return ExperimentConfig(model=model or tiny_transformer(), data=data, train=train,
                          decode=DecodeConfig(max_decode_len=12))


def replace_train(config: ExperimentConfig, **changes) -> ExperimentConfig:
  return dataclasses.replace(config, train=dataclasses.replace(config.train, **changes))
