"""ExperimentConfig: JSON round trip, unknown fields named, cross-section checks."""

import json

import pytest

from seq2seq_jax.configs import DataConfig, ExperimentConfig, TrainConfig
from training.conftest import tiny_rnn, tiny_transformer


@pytest.mark.parametrize("model", [tiny_transformer(), tiny_rnn(bidirectional=True)])
def test_json_round_trip(model):
  config = ExperimentConfig(model=model, data=DataConfig(vocab_size=256, max_source_len=32,
                                                         max_target_len=32,
                                                         bucket_lengths=(8, 32)),
                            train=TrainConfig(num_steps=7))
  values = json.loads(json.dumps(config.to_dict()))
  assert values["model"]["kind"] == config.model_kind
  assert ExperimentConfig.from_dict(values) == config


def test_unknown_fields_and_sections_are_named():
  values = ExperimentConfig(model=tiny_transformer(),
                            data=DataConfig(max_source_len=32, max_target_len=32)).to_dict()
  with pytest.raises(ValueError, match=r"train\.learning_rat\b.*known fields"):
    ExperimentConfig.from_dict({**values, "train": {"learning_rat": 1.0}})
  with pytest.raises(ValueError, match=r"unknown section\(s\) optim"):
    ExperimentConfig.from_dict({**values, "optim": {}})
  with pytest.raises(ValueError, match=r"model\.kind='lstm'"):
    ExperimentConfig.from_dict({**values, "model": {**values["model"], "kind": "lstm"}})
  with pytest.raises(ValueError, match="TrainConfig.warmup_steps=-1"):
    ExperimentConfig.from_dict({**values, "train": {"warmup_steps": -1}})


def test_model_positions_must_cover_the_data_limits():
  with pytest.raises(ValueError, match=r"model\.max_len=32.*max_target_len \(64\)"):
    ExperimentConfig(model=tiny_transformer(), data=DataConfig(max_source_len=32))
