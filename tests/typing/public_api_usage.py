"""A downstream project's use of the public API, type-checked by mypy in `make typecheck`.

Not a test module (pytest does not collect it): mypy reads it against the package's
annotations, as a project that installs the wheel (with its py.typed marker) would.
"""

import jax
import jax.numpy as jnp
import numpy as np

import seq2seq_jax as s2s
from seq2seq_jax.layers.attention import AttentionMask, MultiHeadAttention
from seq2seq_jax.types import Array, PyTree


def build() -> tuple[s2s.Transformer, PyTree, Array]:
  config = s2s.TransformerConfig(vocab_size=32, model_dim=16, num_heads=2, mlp_dim=32)
  model = s2s.Transformer(config)
  inputs_BS = jnp.ones((2, 5), jnp.int32)
  params = model.init(jax.random.key(0), inputs_BS, inputs_BS)["params"]
  return model, params, inputs_BS


def decode() -> tuple[Array, Array]:
  model, params, inputs_BS = build()
  config = s2s.DecodeConfig(method="beam", beam_size=4, alpha=0.6)
  tokens_BT, scores_B = s2s.generate(model, params, inputs_BS, config)
  tokens_BT, scores_B = s2s.generate(model, params, np.ones((2, 5), np.int32), config)
  tokens_BT, scores_B = s2s.generate(model, params, [[5, 6, 2]], config)  # token lists
  return tokens_BT, scores_B


def decode_with_controls() -> tuple[Array, Array]:
  model, params, inputs_BS = build()
  config = s2s.DecodeConfig(method="beam", beam_size=4, alpha=1.0, length_penalty_form="power",
                            early_stopping=True, num_beam_groups=1, no_repeat_ngram_size=3,
                            repetition_penalty=1.2, renormalize_logits=True)
  s2s.generate(model, params, inputs_BS, config, target_prefix=[[7], []],
               constraints=[[[8, 9]], []])
  ensemble = s2s.Ensemble(models=(model, model), weights=(2.0, 1.0), average="probability")
  return s2s.generate(ensemble, s2s.ensemble_params([params, params]), inputs_BS, config,
                      target_prefix=s2s.decoding.pad_target_prefix([[7], []]),
                      constraints=s2s.decoding.pad_constraints([[[8, 9]], []]))


def step_fn(tokens_N: Array, cache: PyTree) -> tuple[Array, PyTree]:
  return jnp.zeros((tokens_N.shape[0], 6)), cache


def search() -> None:
  rules = s2s.TokenRules(suppress_ids=(3,), forced_bos_id=4)
  fn: s2s.StepFn = step_fn
  s2s.greedy_search(fn, {}, batch_size=2, max_decode_len=3, bos_id=1, eos_id=2, rules=rules)
  s2s.beam_search(fn, {}, batch_size=2, beam_size=2, max_decode_len=3, alpha=0.6, bos_id=1,
                  eos_id=2)
  s2s.beam_search(fn, {}, batch_size=2, beam_size=4, max_decode_len=3, alpha=0.6, bos_id=1,
                  eos_id=2, rules=s2s.TokenRules(no_repeat_ngram_size=2), num_beam_groups=2,
                  diversity_penalty=0.5, early_stopping=False, length_penalty_form="power",
                  target_prefix_BP=jnp.array([[4], [0]]))
  s2s.sample(fn, {}, rng=jax.random.key(0), batch_size=2, max_decode_len=3, bos_id=1,
             eos_id=2, temperature=0.8, top_k=4, top_p=0.9)
  memory: PyTree = s2s.expand_to_beams({"x": jnp.ones((2, 3))}, 4)
  del memory
  penalty: Array = s2s.length_penalty(3, 0.6)
  del penalty


def layer() -> Array:
  x_BTD = jnp.ones((1, 4, 8))
  attention = MultiHeadAttention(num_heads=2, head_dim=4, out_dim=8)
  mask = AttentionMask(key_valid=jnp.ones((1, 4), bool), causal=True)
  params = attention.init(jax.random.key(0), x_BTD, x_BTD, mask)
  dense: Array | None = mask.dense(batch=1, queries=4)  # the einsums' form of the same mask
  return jnp.asarray(attention.apply(params, x_BTD, x_BTD, dense))


def configs() -> s2s.ExperimentConfig:
  config = s2s.apply_overrides(s2s.get_preset("tiny_transformer"), ["train.num_steps=10"])
  return s2s.ExperimentConfig.from_dict(config.to_dict())
