"""Config variants of every family against transformers, on random weights: logits and saving.

Each case builds a small random model with transformers' own config class, saves it
with ``save_pretrained`` and loads it here without its tokenizer; the logits of a
padded batch must match transformers' within 1e-4 (relative to their scale), and
``pretrained.save`` must write a directory transformers loads into the same
outputs. Cheap (seconds a case): the options the trained checkpoints of
test_models.py do not cover are covered here.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq_jax import pretrained

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

D = 32
BART = dict(d_model=D, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
            decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=40,
            max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0)
T5 = dict(d_model=D, d_kv=6, d_ff=40, num_layers=2, num_decoder_layers=3, num_heads=5,
          relative_attention_num_buckets=8, relative_attention_max_distance=12, dropout_rate=0.0,
          initializer_factor=0.5)


def _marian(**overrides):
  config = dict(vocab_size=97, pad_token_id=96, eos_token_id=0, decoder_start_token_id=96,
                scale_embedding=True, activation_function="swish", **BART)
  config.update(overrides)
  return transformers.MarianMTModel(transformers.MarianConfig(**config))


def _m2m100(**overrides):
  config = dict(vocab_size=97, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                bos_token_id=0, scale_embedding=True, activation_function="relu", **BART)
  config.update(overrides)
  return transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**config))


def _mbart(**overrides):
  config = dict(vocab_size=97, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                bos_token_id=0, scale_embedding=True, activation_function="gelu", **BART)
  config.update(overrides)
  model = transformers.MBartForConditionalGeneration(transformers.MBartConfig(**config))
  with torch.no_grad():  # a final_logits_bias that is not zero, so its place is checked
    model.final_logits_bias.normal_(0, 0.5)
  return model


def _t5(model_class="T5ForConditionalGeneration", config_class="T5Config", untied=False,
        **overrides):
  config = dict(vocab_size=97, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, **T5)
  config.update(overrides)
  model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
  if untied:  # transformers 5 ties at construction; a separate head as v1.1 / mT5 have it
    model.lm_head.weight = torch.nn.Parameter(torch.randn(97, D) * 0.5)
  return model


CASES = {
    "marian_asymmetric": lambda: _marian(),
    "marian_separate_untied": lambda: _marian(share_encoder_decoder_embeddings=False,
                                              decoder_vocab_size=89, pad_token_id=88,
                                              decoder_start_token_id=88,
                                              tie_word_embeddings=False),
    "marian_gelu_new_unscaled": lambda: _marian(activation_function="gelu_new",
                                                scale_embedding=False),
    "m2m100_asymmetric_gelu": lambda: _m2m100(activation_function="gelu"),
    "m2m100_untied": lambda: _m2m100(tie_word_embeddings=False),
    "mbart_asymmetric": lambda: _mbart(),
    "mbart_untied_unscaled": lambda: _mbart(tie_word_embeddings=False, scale_embedding=False),
    "t5_relu_tied": lambda: _t5(feed_forward_proj="relu"),
    "t5_v1_1_gated_untied": lambda: _t5(feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                        untied=True),
    "mt5": lambda: _t5("MT5ForConditionalGeneration", "MT5Config", untied=True),
    "t5_gated_silu_tied_unscaled": lambda: _t5(feed_forward_proj="gated-silu",
                                               tie_word_embeddings=False),
}


def _batch(model):
  config = model.config
  pad = config.pad_token_id
  eos = config.eos_token_id
  rng = np.random.default_rng(0)
  inputs = rng.integers(3, 80, size=(3, 9))
  inputs[:, -1] = eos
  inputs[1, 5:] = pad
  inputs[1, 4] = eos
  inputs[2, 7:] = pad
  inputs[2, 6] = eos
  decoder_inputs = rng.integers(3, 80, size=(3, 7))
  decoder_inputs[:, 0] = config.decoder_start_token_id
  return (torch.tensor(inputs), torch.tensor(inputs != pad).long(), torch.tensor(decoder_inputs))


def _hf_logits(model, batch):
  inputs, mask, decoder_inputs = batch
  with torch.no_grad():
    return model(input_ids=inputs, attention_mask=mask, decoder_input_ids=decoder_inputs
                 ).logits.numpy()


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_transformers_and_save_round_trips(case, tmp_path):
  torch.manual_seed(0)
  model = CASES[case]().eval()
  model.save_pretrained(tmp_path / "hf")
  batch = _batch(model)
  expected = _hf_logits(model, batch)
  checkpoint = pretrained.load(tmp_path / "hf", with_tokenizer=False)
  inputs, _, decoder_inputs = batch
  targets = np.concatenate([decoder_inputs.numpy()[:, 1:], np.full((3, 1), 5)], axis=1)
  logits = np.asarray(checkpoint.model.apply({"params": checkpoint.params},
                                             jnp.asarray(inputs.numpy()), jnp.asarray(targets)))
  scale = max(1.0, float(np.abs(expected).max()))
  np.testing.assert_allclose(logits, expected, atol=1e-4 * scale, rtol=0)

  pretrained.save(checkpoint, tmp_path / "ours")
  reloaded = type(model).from_pretrained(tmp_path / "ours").eval()
  np.testing.assert_array_equal(_hf_logits(reloaded, batch), expected)
  again = pretrained.load(tmp_path / "ours", with_tokenizer=False)
  assert again.config == checkpoint.config


def test_asymmetric_marian_config_keeps_both_sides(tmp_path):
  hf = CASES["marian_asymmetric"]().config.to_dict()
  config = pretrained.marian.model_config(hf, tmp_path / "config.json", "float32")
  assert config.encoder_stack == (2, 4, 8, 48)  # layers, heads, head width, FFN width
  assert config.decoder_stack == (3, 2, 16, 40)
  with pytest.raises(ValueError, match=r"config.json: decoder_attention_heads=3 must be a "
                                       r"positive divisor of d_model=32"):
    pretrained.marian.model_config({**hf, "decoder_attention_heads": 3},
                                   tmp_path / "config.json", "float32")


def test_t5_config_reads_feed_forward_and_scaling(tmp_path):
  hf = json.loads(_t5(feed_forward_proj="gated-gelu").config.to_json_string())
  config = pretrained.t5.model_config(hf, tmp_path / "config.json", "float32")
  assert (config.activation, config.gated_ffn) == ("gelu_tanh", True)
  assert config.head_dim * config.num_heads != config.model_dim
  with pytest.raises(ValueError, match=r"config.json: feed_forward_proj='gated-sigmoid'"):
    pretrained.t5.model_config({**hf, "feed_forward_proj": "gated-sigmoid"},
                               tmp_path / "config.json", "float32")
