"""python -m lab.fineweb [preset.py] [--train_shards=N]: FineWeb-Edu in GPT-2 tokens, as the
GPT-2 speedrun (modded-nanogpt) publishes it in llm.c's format, into data/fineweb_edu_gpt2/: the
val shard's first VAL_TOKENS (as the speedrun measures: lab.evaluate's pass takes a minute, not
ten), the train shards a preset's run reads (100M tokens, about 200 MB a shard, at most 99) or
--train_shards of them, and meta.json. Each file is written whole or not at all and kept, so after
a lost connection the same command goes on. Then: python train.py config/gpt2_124m.py."""
import json
import math
import os
import shutil
import sys
import urllib.request

import numpy as np

import compare
import data
from data import plural
from configurator import ConfigError, parse_args, run_main

URL = "https://huggingface.co/datasets/kjj0/finewebedu10B-gpt2/resolve/main/"
VAL_TOKENS = 10 * 2**20  # the speedrun's 10,485,760
SHARD_TOKENS, SHARDS = 100_000_000, 99
SETTINGS = dict(
    train_shards=(0, "train shards of 100M tokens (0: those the preset's run reads; without a "
                     "preset, 1)", (0, SHARDS)),
    out_dir=(os.path.join(data.DATA_ROOT, "fineweb_edu_gpt2"), "where the shards go"),
)


def shards_needed(preset):
    """(train shards, tokens) a preset's run reads: max_iters x tokens a step, 100M a shard."""
    cfg = parse_args(compare.SETTINGS, [preset], "")
    accumulation = cfg.gradient_accumulation_steps or 1
    tokens = cfg.max_iters * cfg.batch_size * cfg.block_size * accumulation
    return min(SHARDS, max(1, math.ceil(tokens / SHARD_TOKENS))), tokens


def download(out_dir, train_shards):
    """The val shard and train_shards train shards in out_dir (each unless there), meta.json."""
    os.makedirs(out_dir, exist_ok=True)
    names = ["finewebedu_val_000000.bin"] + [f"finewebedu_train_{i:06d}.bin"
                                             for i in range(1, train_shards + 1)]
    shards = []
    for i, name in enumerate(names):
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):
            print(f"[{i + 1}/{len(names)}] {URL}{name}", flush=True)
            try:
                fetch(name, path, VAL_TOKENS if "_val_" in name else None)
            except OSError as e:  # offline, the hub down, a connection lost half way
                raise data.DataError(f"could not download {name} ({e}): the files before it are "
                                     f"kept ({i}); run the same command again") from None
        shards.append({"file": name, "split": "val" if "_val_" in name else "train",
                       "tokens": len(data.read_shard(path))})  # its header and length checked
    meta = {"name": os.path.basename(out_dir), "tokenizer": "gpt2", "vocab_size": 50257,
            "eot": 50256, "shards": shards, **{f"{split}_tokens": sum(
                s["tokens"] for s in shards if s["split"] == split) for split in ("train", "val")}}
    with data.atomic_write(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{out_dir}: {plural(train_shards, 'train shard')} ({meta['train_tokens']:,} tokens) "
          f"and the val shard; next: python train.py --dataset={os.path.basename(out_dir)}")


def fetch(name, path, tokens=None):
    """One shard of the hub into path, whole or not at all; tokens: only its first so many (a
    Range request: the bytes before them), its header saying so."""
    request = urllib.request.Request(URL + name, headers={"Range": f"bytes=0-{1023 + 2 * tokens}"}
                                     if tokens else {})
    with urllib.request.urlopen(request, timeout=60) as response, data.atomic_write(path) as f:
        if not tokens:
            shutil.copyfileobj(response, f, length=1 << 20)
            return
        header = np.frombuffer(response.read(1024), dtype="<i4").copy()  # llm.c's 256 int32
        header[2] = min(int(header[2]), tokens)
        body = response.read(2 * int(header[2]))  # uint16 tokens
        if len(body) != 2 * header[2]:
            raise ConnectionError("the connection ended early")
        f.write(header.tobytes() + body)


def main(argv):
    presets = [a for a in argv if not a.startswith("-")]
    if len(presets) > 1:
        raise ConfigError("python -m lab.fineweb takes one preset at most")
    cfg = parse_args(SETTINGS, [a for a in argv if a.startswith("-")],
                     "python -m lab.fineweb [preset.py] [--train_shards=N]")
    shards = cfg.train_shards
    if presets and not shards:
        shards, tokens = shards_needed(presets[0])
        print(f"{presets[0]}: a run reads {tokens:,} tokens: {plural(shards, 'train shard')} "
              f"(about {0.2 * shards:.1f} GB)" + (
                  f", all there are: the run sees them {tokens / (shards * SHARD_TOKENS):.2f} "
                  f"times" if tokens > shards * SHARD_TOKENS else ""), flush=True)
    download(cfg.out_dir, shards or 1)


if __name__ == "__main__":
    sys.argv[0] = "lab.fineweb"
    run_main(main)
