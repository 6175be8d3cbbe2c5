"""Translator: order restored, empty lines kept, truncation warned, batch-independent output."""

import logging

import jax
import jax.numpy as jnp
import pytest

from seq2seq_jax.configs import DecodeConfig, TransformerConfig
from seq2seq_jax.data.tokenizer import train_tokenizer_from_text
from seq2seq_jax.decoding import generate
from seq2seq_jax.models.transformer import Transformer
from seq2seq_jax.translator import Translator


@pytest.fixture(scope="module")
def translator(multi30k_tiny):
  tiny = multi30k_tiny
  lines = [l for name in ("train.de", "train.en")
           for l in (tiny / name).read_text(encoding="utf-8").splitlines()]
  tokenizer = train_tokenizer_from_text(lines, 300)
  config = TransformerConfig(vocab_size=tokenizer.vocab_size, model_dim=16, num_heads=2,
                             mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1, max_len=48,
                             dropout_rate=0.0)
  model = Transformer(config)
  dummy = jnp.ones((1, 4), jnp.int32)
  params = model.init(jax.random.key(0), dummy, dummy)["params"]
  return Translator(model, params, tokenizer, max_source_len=24, bucket_lengths=(8, 16),
                    batch_size=4, decode_config=DecodeConfig(max_decode_len=12))


SENTENCES = ["Ein Hund.", "Zwei Männer sitzen auf einer Bank vor einem roten Haus.",
             "Eine Frau mit einem Hut spielt Gitarre.", "Kinder.",
             "Ein Mann fährt Fahrrad auf der Straße neben einem Bus und einem Auto."]


def test_sentence_alone_equals_sentence_in_a_batch(translator):
  together = translator.translate(SENTENCES)
  alone = [translator.translate([s])[0] for s in SENTENCES]
  assert together == alone
  assert together == translator.translate(SENTENCES[::-1])[::-1]


def test_matches_generate_on_the_same_ids(translator):
  ids = translator.encode([SENTENCES[1]])[0]
  inputs = jnp.array([ids + [0] * (16 - len(ids))], jnp.int32)
  tokens, _ = generate(translator.model, translator.params, inputs,
                       DecodeConfig(max_decode_len=12))
  assert translator.translate([SENTENCES[1]]) == translator.tokenizer.decode_batch(tokens)


def test_empty_lines_stay_empty_and_order_is_kept(translator):
  out = translator.translate(["", SENTENCES[0], "   ", SENTENCES[2]])
  assert out[0] == "" and out[2] == ""
  assert out[1] == translator.translate([SENTENCES[0]])[0]
  assert out[3] == translator.translate([SENTENCES[2]])[0]


def test_long_sentence_is_truncated_with_a_warning(translator, caplog):
  long = " ".join(["Ein Hund läuft über die grüne Wiese."] * 10)
  with caplog.at_level(logging.WARNING, logger="seq2seq_jax"):
    out = translator.translate([long])
  assert len(out) == 1
  assert ("truncated to 24 (EOS included), the max_source_len given (--max-source-len; the "
          "model takes 48)") in caplog.text


def test_beam_search_and_overrides(translator):
  greedy = translator.translate(SENTENCES[:2])
  assert translator.translate(SENTENCES[:2], beam_size=1) == greedy
  beam = translator.translate(SENTENCES[:2], beam_size=3, alpha=0.6)
  assert len(beam) == 2 and all(isinstance(t, str) for t in beam)


def test_bad_settings_are_rejected(translator):
  with pytest.raises(ValueError, match="exceeds the model's max_len=48"):
    Translator(translator.model, translator.params, translator.tokenizer, max_source_len=64)


def test_score_is_the_float64_sum_of_target_logprobs(translator):
  """Forced decoding against a NumPy float64 log-softmax of the teacher-forced logits."""
  import numpy as np
  targets = ["A dog.", "Two men are sitting on a bench in front of a red house.", "Kids."]
  scores = translator.score(SENTENCES[:3], targets)
  for source, target, score in zip(SENTENCES[:3], targets, scores):
    source_ids = translator.tokenizer.encode_source([source])[0]
    target_ids = translator.tokenizer.encode_target([target])[0]
    logits = np.asarray(translator.model.apply(
        {"params": translator.params}, jnp.array([source_ids], jnp.int32),
        jnp.array([target_ids], jnp.int32))[0], np.float64)
    logprobs = logits - logits.max(-1, keepdims=True)
    logprobs -= np.log(np.exp(logprobs).sum(-1, keepdims=True))
    expected = logprobs[np.arange(len(target_ids)), target_ids].sum()
    np.testing.assert_allclose(score, expected, rtol=1e-5, atol=1e-4)
  # Padding and batching do not change a pair's score.
  assert translator.score(SENTENCES[1:2], targets[1:2])[0] == pytest.approx(scores[1], abs=1e-4)


def test_greedy_score_equals_the_score_of_its_own_output(translator):
  """generate's greedy total log-probability is forced decoding of the same ids."""
  import numpy as np
  ids = translator.encode([SENTENCES[2]])[0]
  inputs = jnp.array([ids + [0] * (16 - len(ids))], jnp.int32)
  tokens, scores = generate(translator.model, translator.params, inputs,
                            DecodeConfig(max_decode_len=12))
  row = [int(t) for t in np.asarray(tokens)[0] if t != 0]
  logits = translator.model.apply({"params": translator.params}, inputs,
                                  jnp.array([row], jnp.int32))
  logprobs = np.asarray(jax.nn.log_softmax(logits[0]), np.float64)
  np.testing.assert_allclose(float(scores[0]), logprobs[np.arange(len(row)), row].sum(),
                             atol=1e-4)


def test_score_needs_one_target_per_source(translator):
  with pytest.raises(ValueError, match="one target per source"):
    translator.score(SENTENCES[:2], ["A dog."])
