"""Subprocess helper of the prepare tests: prepares token ids and kills itself (SIGKILL) while
it writes them, at the KILL_AT-th batch of records written.

Usage: python _kill_prepare.py DATA_CONFIG_JSON TOKENIZER_PATH local|beam RECORDS_PER_SHARD KILL_AT
"""

import json
import os
import signal
import sys

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import prepared
from seq2seq_jax.data.tokenizer import Tokenizer


def _killing_at(call: int, function):
  calls = 0

  def wrapper(*args, **kwargs):
    nonlocal calls
    calls += 1
    if calls == call:
      os.kill(os.getpid(), signal.SIGKILL)
    return function(*args, **kwargs)
  return wrapper


def main():
  config_json, tokenizer_path, writer, records_per_shard, kill_at = sys.argv[1:]
  values = json.loads(config_json)
  config = DataConfig(**{**values, "bucket_lengths": tuple(values["bucket_lengths"])})
  tokenizer = Tokenizer.load(tokenizer_path)
  if writer == "local":
    prepared.ShardWriter.write = _killing_at(int(kill_at), prepared.ShardWriter.write)
    prepared.prepare_ids(config, tokenizer, records_per_shard=int(records_per_shard))
  else:
    from seq2seq_jax.data import beam
    prepared.write_shard = _killing_at(int(kill_at), prepared.write_shard)
    beam.run_prepare(config, tokenizer, records_per_shard=int(records_per_shard))
  print("finished without being killed", flush=True)


if __name__ == "__main__":
  main()
