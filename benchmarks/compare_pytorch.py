"""Against PyTorch peers, in one run: T-small training and generation, ratios printed.

Training: the library's T-small step (batch 64 x 24 tokens, dropout 0.1, label
smoothing 0.1, AdamW, clipping) against the same model in eager
``torch.nn.Transformer``, run in three worker processes: one with glibc's default
malloc, one with its mmap / trim thresholds raised (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``), and one with the malloc setting this process runs
with (``seq2seq_jax.allocator.TUNED_MALLOC_ENV``; the script restarts itself with
it unless ``--default-malloc``): one step of each system in turn, every round.

Generation: 256 sources of 20 tokens in batches of 32, 24 output tokens, greedy and
beam 4: ``generate`` (EOS suppressed with ``SuppressEOS``) against Hugging Face
MarianMT ``generate()`` built from a config with random weights
(``min_new_tokens = max_new_tokens``) and the same model converted to CTranslate2
(``min_decoding_length = max_decoding_length``), alternated round by round.

Needs the optional extra: ``pip install -e ".[bench]"`` (install torch==2.13.0 first
so pip takes the CPU wheel). Without torch it prints why and writes a JSON that
says it was skipped.

  python benchmarks/compare_pytorch.py [--out FILE.json] [--plot FILE.png]
  SEQ2SEQ_JAX_QUICK=1 python benchmarks/compare_pytorch.py   # tiny sizes, for CI
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
EOS_TOKEN, UNK_TOKEN, PAD_TOKEN = "</s>", "<unk>", "<pad>"
# glibc caps the mmap threshold at 32 MiB on 64-bit; the trim threshold has no cap.
THRESHOLD_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                    "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def settings(quick: bool) -> dict:
  """Model sizes and workloads; tiny in quick mode."""
  if quick:
    return dict(model=dict(vocab_size=500, model_dim=32, num_heads=2, mlp_dim=64, layers=1),
                train_batch=8, train_len=8, train_rounds=3,
                sentences=16, source_len=8, decode_batch=8, output_len=8, decode_rounds=2)
  return dict(model=dict(vocab_size=8000, model_dim=256, num_heads=4, mlp_dim=1024, layers=3),
              train_batch=64, train_len=24, train_rounds=7,
              sentences=256, source_len=20, decode_batch=32, output_len=24, decode_rounds=3)


# --------------------------------------------------------------------------- torch training


def torch_train_worker(spec: dict) -> None:
  """Worker process: builds the torch T-small and runs one training step per stdin line."""
  import math  # noqa: PLC0415

  import torch  # noqa: PLC0415
  from torch import nn  # noqa: PLC0415

  m = spec["model"]
  vocab, dim = m["vocab_size"], m["model_dim"]
  torch.manual_seed(0)

  class TorchTransformer(nn.Module):
    """Shared scaled embeddings, sinusoidal positions, post-LN nn.Transformer, tied output."""

    def __init__(self):
      super().__init__()
      self.embed = nn.Embedding(vocab, dim)
      nn.init.normal_(self.embed.weight, std=dim ** -0.5)
      position = torch.arange(512)[:, None]
      rate = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
      table = torch.zeros(512, dim)
      table[:, 0::2], table[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
      self.register_buffer("positions", table)
      self.dropout = nn.Dropout(0.1)
      self.transformer = nn.Transformer(
          d_model=dim, nhead=m["num_heads"], num_encoder_layers=m["layers"],
          num_decoder_layers=m["layers"], dim_feedforward=m["mlp_dim"], dropout=0.1,
          batch_first=True)

    def embed_tokens(self, tokens):
      x = self.embed(tokens) * math.sqrt(dim) + self.positions[:tokens.shape[1]]
      return self.dropout(x)

    def forward(self, inputs, decoder_inputs):
      causal = nn.Transformer.generate_square_subsequent_mask(decoder_inputs.shape[1])
      source_pad = inputs == 0
      y = self.transformer(self.embed_tokens(inputs), self.embed_tokens(decoder_inputs),
                           tgt_mask=causal, src_key_padding_mask=source_pad,
                           memory_key_padding_mask=source_pad, tgt_is_causal=True)
      return y @ self.embed.weight.T

  model = TorchTransformer().train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9,
                                weight_decay=0.0)
  generator = torch.Generator().manual_seed(0)
  shape = (spec["train_batch"], spec["train_len"])
  inputs = torch.randint(4, vocab, shape, generator=generator)
  targets = torch.randint(4, vocab, shape, generator=generator)
  inputs[:, -1] = targets[:, -1] = 2
  decoder_inputs = torch.cat([torch.ones_like(targets[:, :1]), targets[:, :-1]], dim=1)

  def step():
    optimizer.zero_grad(set_to_none=True)
    logits = model(inputs, decoder_inputs)
    loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1),
                                       ignore_index=0, label_smoothing=0.1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()

  print("ready", flush=True)
  for line in sys.stdin:
    if line.strip() != "step":
      break
    start = time.perf_counter()
    step()
    print(f"{time.perf_counter() - start:.6f}", flush=True)


class TorchTrainWorker:
  """A worker subprocess; calling it runs one torch training step and waits for it."""

  def __init__(self, spec: dict, extra_env: dict[str, str]):
    from seq2seq_jax import allocator  # noqa: PLC0415

    env = {**allocator.without_malloc_settings(), **extra_env}
    self.process = subprocess.Popen(
        [sys.executable, __file__, "--torch-train-worker", json.dumps(spec)], env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if self.process.stdout.readline().strip() != "ready":
      raise RuntimeError("the torch training worker did not start")

  def __call__(self) -> float:
    self.process.stdin.write("step\n")
    self.process.stdin.flush()
    return float(self.process.stdout.readline())

  def close(self) -> None:
    self.process.stdin.close()
    self.process.wait(timeout=60)


def compare_training(s: dict, benchmarking) -> list[dict]:
  from seq2seq_jax import TransformerConfig  # noqa: PLC0415

  m = s["model"]
  config = TransformerConfig(vocab_size=m["vocab_size"], model_dim=m["model_dim"],
                             num_heads=m["num_heads"], mlp_dim=m["mlp_dim"],
                             num_encoder_layers=m["layers"], num_decoder_layers=m["layers"])
  runner = benchmarking.make_train_step_runner(config, batch_size=s["train_batch"],
                                               source_len=s["train_len"],
                                               target_len=s["train_len"])
  from seq2seq_jax import allocator  # noqa: PLC0415

  workers = {"torch eager": TorchTrainWorker(s, {}),
             "torch eager, malloc thresholds": TorchTrainWorker(s, THRESHOLD_MALLOC),
             "torch eager, malloc as ours": TorchTrainWorker(s, allocator.TUNED_MALLOC_ENV)}
  try:
    timings = benchmarking.time_interleaved({"seq2seq_jax": runner, **workers},
                                            rounds=s["train_rounds"], warmup=2)
  finally:
    for worker in workers.values():
      worker.close()
  flops = benchmarking.transformer_flops_per_token(config, source_len=s["train_len"],
                                                   target_len=s["train_len"])
  ours = runner.tokens / timings["seq2seq_jax"].median_s
  rows = []
  for name, timing in timings.items():
    tokens_per_s = runner.tokens / timing.median_s
    rows.append({"task": "train", "system": name, "tokens/s": tokens_per_s,
                 "step_ms": 1e3 * timing.median_s, "GFLOP/s": flops * tokens_per_s / 1e9,
                 "ours/system": ours / tokens_per_s, "timing": timing.to_dict()})
  return rows


# --------------------------------------------------------------------------- generation


@dataclasses.dataclass
class _FakeTokenizer:
  """What CTranslate2's Marian converter reads from a tokenizer: the vocabulary and specials."""

  vocab: list[str]
  eos_token: str = EOS_TOKEN
  unk_token: str = UNK_TOKEN

  def get_vocab(self) -> dict[str, int]:
    return {token: i for i, token in enumerate(self.vocab)}


def vocabulary(size: int) -> list[str]:
  """Token strings by id: ours put EOS at 2 and UNK at 3; Marian wants its PAD last."""
  tokens = [f"t{i}" for i in range(size)]
  tokens[2], tokens[3], tokens[-1] = EOS_TOKEN, UNK_TOKEN, PAD_TOKEN
  return tokens


def build_marian(m: dict):
  """A random-weight MarianMT of our sizes (ReLU FFN, scaled shared embeddings)."""
  import torch  # noqa: PLC0415
  import transformers  # noqa: PLC0415

  vocab = m["vocab_size"]
  config = transformers.MarianConfig(
      vocab_size=vocab, decoder_vocab_size=vocab, d_model=m["model_dim"],
      encoder_layers=m["layers"], decoder_layers=m["layers"],
      encoder_attention_heads=m["num_heads"], decoder_attention_heads=m["num_heads"],
      encoder_ffn_dim=m["mlp_dim"], decoder_ffn_dim=m["mlp_dim"], activation_function="relu",
      max_position_embeddings=256, pad_token_id=vocab - 1, eos_token_id=2,
      decoder_start_token_id=vocab - 1, forced_eos_token_id=None, scale_embedding=True,
      share_encoder_decoder_embeddings=True)
  torch.manual_seed(0)
  return transformers.MarianMTModel(config).eval()


def convert_to_ctranslate2(model, vocab: list[str], directory: pathlib.Path):
  """The HF model converted to a CTranslate2 float32 translator, or None without ctranslate2."""
  try:
    import ctranslate2  # noqa: PLC0415
    from ctranslate2.converters import TransformersConverter  # noqa: PLC0415
  except ImportError:
    return None

  class InMemoryConverter(TransformersConverter):
    """Converts the model in hand; the tokenizer is only its vocabulary."""

    def load_model(self, model_class, model_name_or_path, **kwargs):
      return model

    def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
      return _FakeTokenizer(vocab)

  hf_dir = directory / "hf"
  model.save_pretrained(hf_dir)
  InMemoryConverter(str(hf_dir)).convert(str(directory / "ct2"), force=True)
  return ctranslate2.Translator(str(directory / "ct2"), device="cpu", inter_threads=1,
                                intra_threads=os.cpu_count() or 1)


def compare_generation(s: dict, benchmarking) -> list[dict]:
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  import torch  # noqa: PLC0415

  from seq2seq_jax import DecodeConfig, TransformerConfig, build_model  # noqa: PLC0415
  from seq2seq_jax.decoding import generate  # noqa: PLC0415

  m, out_len, batch = s["model"], s["output_len"], s["decode_batch"]
  config = TransformerConfig(vocab_size=m["vocab_size"], model_dim=m["model_dim"],
                             num_heads=m["num_heads"], mlp_dim=m["mlp_dim"],
                             num_encoder_layers=m["layers"], num_decoder_layers=m["layers"])
  inner = build_model(config)
  params = {"model": inner.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32),
                                jnp.ones((1, 3), jnp.int32))["params"]}
  ours = benchmarking.SuppressEOS(inner)
  sources = benchmarking.synthetic_sources(np.random.default_rng(0), num_sentences=s["sentences"],
                                           source_len=s["source_len"],
                                           vocab_size=m["vocab_size"] - 1)  # Marian's PAD is last
  batches = [sources[i:i + batch] for i in range(0, len(sources), batch)]
  torch_batches = [torch.from_numpy(b.astype(np.int64)) for b in batches]
  vocab = vocabulary(m["vocab_size"])
  token_batches = [[[vocab[i] for i in row] for row in b] for b in batches]
  torch.set_num_threads(os.cpu_count() or 1)
  marian = build_marian(m)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    translator = convert_to_ctranslate2(marian, vocab, pathlib.Path(tmp))
    for beams in (1, 4):
      decode_config = DecodeConfig(method="greedy" if beams == 1 else "beam", beam_size=beams,
                                   max_decode_len=out_len)

      def run_ours():
        return [generate(ours, params, b, decode_config)[0] for b in batches]

      def run_marian():
        with torch.inference_mode():
          return [marian.generate(b, attention_mask=torch.ones_like(b), num_beams=beams,
                                  do_sample=False, max_new_tokens=out_len,
                                  min_new_tokens=out_len) for b in torch_batches]

      def run_ct2():
        return [translator.translate_batch(b, beam_size=beams, max_decoding_length=out_len,
                                           min_decoding_length=out_len, max_batch_size=batch)
                for b in token_batches]

      systems = {"seq2seq_jax": run_ours, "HF MarianMT": run_marian}
      if translator is not None:
        systems["CTranslate2"] = run_ct2
      # Every system produces exactly out_len tokens per sentence: checked, not assumed.
      lengths = {"seq2seq_jax": run_ours()[0].shape[1],
                 "HF MarianMT": run_marian()[0].shape[1] - 1,  # minus the decoder start token
                 **({"CTranslate2": len(run_ct2()[0][0].hypotheses[0])} if translator else {})}
      timings = benchmarking.time_interleaved(systems, rounds=s["decode_rounds"])
      ours_rate = len(sources) / timings["seq2seq_jax"].median_s
      for name, timing in timings.items():
        rate = len(sources) / timing.median_s
        rows.append({"task": "greedy" if beams == 1 else "beam4", "system": name,
                     "sentences/s": rate, "tokens/s": rate * out_len,
                     "output_len": lengths[name], "ours/system": ours_rate / rate,
                     "timing": timing.to_dict()})
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=HERE / "results" / "compare_pytorch.json")
  parser.add_argument("--plot", type=pathlib.Path, default=None, help="PNG path (optional)")
  parser.add_argument("--skip-train", action="store_true")
  parser.add_argument("--skip-generate", action="store_true")
  parser.add_argument("--default-malloc", action="store_true",
                      help="keep glibc's malloc defaults in this process (seq2seq_jax.allocator)")
  parser.add_argument("--torch-train-worker", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.torch_train_worker:
    torch_train_worker(json.loads(args.torch_train_worker))
    return
  # Not benchmarking.parse_args: the torch workers above must never restart
  # themselves (they run with exactly the environment they were given).
  if not args.default_malloc:
    from seq2seq_jax import allocator  # noqa: PLC0415

    allocator.reexec_with_tuned_malloc()

  from seq2seq_jax import benchmarking  # noqa: PLC0415

  s = settings(benchmarking.quick_mode())
  try:
    import torch  # noqa: PLC0415
    import transformers  # noqa: F401, PLC0415
  except ImportError as error:
    print(f"skipped: {error}; install the bench extra: pip install torch==2.13.0 && "
          "pip install -e '.[bench]'")
    benchmarking.write_json(args.out, {"benchmark": "compare_pytorch", "skipped": str(error)})
    return
  rows = []
  if not args.skip_train:
    rows += compare_training(s, benchmarking)
  if not args.skip_generate:
    rows += compare_generation(s, benchmarking)
  print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; model "
        f"{s['model']}")
  print(benchmarking.format_table(rows, ["task", "system", "tokens/s", "sentences/s",
                                         "step_ms", "output_len", "ours/system"]))
  versions = {"torch": torch.__version__, "transformers": transformers.__version__}
  try:
    import ctranslate2  # noqa: PLC0415
    versions["ctranslate2"] = ctranslate2.__version__
  except ImportError:
    pass
  benchmarking.report(args, {"benchmark": "compare_pytorch", "settings": s, "versions": versions,
                             "threshold_malloc": THRESHOLD_MALLOC, "rows": rows},
                      plot=functools.partial(benchmarking.plot_rates_by_task, xlabel=lambda task:
                                             "target tokens / s" if task == "train"
                                             else "generated tokens / s"))


if __name__ == "__main__":
  main()
