"""Fixtures of the inference tests: one small vocabulary, tiny models, a run folder to load.

The models are untrained (random parameters): the tests compare paths that must
agree token for token, which needs a model, not a good one. Random weights rarely
emit EOS, so outputs run to the length limit: the longest work per sentence.
"""

import pathlib

import jax
import jax.numpy as jnp
import pytest

from seq2seq_jax.configs import DataConfig, DecodeConfig, ExperimentConfig, TransformerConfig
from seq2seq_jax.inference import Translator

SOURCE_LIMIT = 24  # tokens a source may have, EOS included: longer lines are truncated
BUCKETS = (8, 16)


@pytest.fixture(scope="session")
def tokenizer(multi30k_tiny):
  from seq2seq_jax.data.tokenizer import train_tokenizer_from_text
  lines = [line for name in ("train.de", "train.en")
           for line in (multi30k_tiny / name).read_text(encoding="utf-8").splitlines()]
  return train_tokenizer_from_text(lines, 300)


def tiny_transformer(vocab_size: int, **overrides) -> TransformerConfig:
  values = dict(vocab_size=vocab_size, model_dim=16, num_heads=2, mlp_dim=24,
                num_encoder_layers=1, num_decoder_layers=1, max_len=48, dropout_rate=0.0)
  return TransformerConfig(**{**values, **overrides})


def init_params(model, seed: int = 0):
  ids = jnp.ones((1, 4), jnp.int32)
  return model.init(jax.random.key(seed), ids, ids)["params"]


@pytest.fixture(scope="session")
def model_and_params(tokenizer):
  from seq2seq_jax.models.registry import build_model
  model = build_model(tiny_transformer(tokenizer.vocab_size))
  return model, init_params(model)


def make_translator(model_and_params, tokenizer, *, mesh=None, **overrides) -> Translator:
  model, params = model_and_params
  options = dict(max_source_len=SOURCE_LIMIT, bucket_lengths=BUCKETS, batch_size=8,
                 decode_config=DecodeConfig(max_decode_len=12, beam_size=3, alpha=0.6))
  return Translator(model, params, tokenizer, mesh=mesh, **{**options, **overrides})


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory, tokenizer, model_and_params) -> pathlib.Path:
  """A training run's folder holding one checkpoint of the tiny model (never trained)."""
  from seq2seq_jax.checkpoints import Checkpointer
  from seq2seq_jax.configs import TrainConfig
  from seq2seq_jax.training.optimizer import make_optimizer
  from seq2seq_jax.training.schedules import make_schedule
  from seq2seq_jax.training.step import create_train_state, make_mesh

  model, params = model_and_params
  config = ExperimentConfig(
      model=model.config,
      data=DataConfig(vocab_size=tokenizer.vocab_size, max_source_len=SOURCE_LIMIT,
                      max_target_len=SOURCE_LIMIT, bucket_lengths=BUCKETS + (SOURCE_LIMIT,),
                      eval_batch_size=8),
      train=TrainConfig(), decode=DecodeConfig(max_decode_len=12))
  optimizer = make_optimizer(config.train, make_schedule(config.train))
  state = create_train_state(model, optimizer, rng=jax.random.key(0), mesh=make_mesh(),
                             params=params)
  workdir = tmp_path_factory.mktemp("run")
  with Checkpointer(workdir / "checkpoints", async_save=False) as checkpointer:
    checkpointer.save(state.replace(step=state.step + 1), config=config, tokenizer=tokenizer)
  return workdir


@pytest.fixture(scope="session")
def sentences(multi30k_tiny) -> list[str]:
  """Real German lines of many lengths, some longer than SOURCE_LIMIT, a few blank."""
  lines = (multi30k_tiny / "val.de").read_text(encoding="utf-8").splitlines()[:40]
  return lines[:10] + ["", "   "] + lines[10:30] + [""] + lines[30:]
