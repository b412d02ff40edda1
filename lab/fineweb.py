"""python -m lab.fineweb [--train_shards=N]: FineWeb-Edu in GPT-2 tokens, ready to train in
minutes. It downloads the shards the GPT-2 speedrun (modded-nanogpt) publishes, already tokenized
in llm.c's format, which data.py reads as they are: the val shard and the first N train shards,
100M tokens each (about 200 MB), into data/fineweb_edu_gpt2/; of the val shard only its first
VAL_TOKENS, as the speedrun measures, so that each run's final loss over the whole val split takes
a minute, not ten. Each file is written whole or not at all, and a finished one is kept: after a
lost connection the same command goes on.
Then: python train.py --dataset=fineweb_edu_gpt2 (config/gpu_class.py, config/gpt2_124m.py)."""
import os
import shutil
import sys
import urllib.request

import numpy as np

import data
from configurator import ConfigError, parse_args, run_main

URL = "https://huggingface.co/datasets/kjj0/finewebedu10B-gpt2/resolve/main/"
VAL_TOKENS = 10 * 2**20  # the speedrun's 10,485,760
SETTINGS = dict(
    train_shards=(1, "train shards of 100M tokens (99 in all: sample-10BT)", (1, 99)),
    out_dir=(os.path.join(data.DATA_ROOT, "fineweb_edu_gpt2"), "where the shards go"),
)


def download(out_dir, train_shards):
    """The val shard and train_shards train shards in out_dir, each fetched unless there."""
    os.makedirs(out_dir, exist_ok=True)
    names = ["finewebedu_val_000000.bin"] + [f"finewebedu_train_{i:06d}.bin"
                                             for i in range(1, train_shards + 1)]
    for i, name in enumerate(names):
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):
            print(f"[{i + 1}/{len(names)}] {URL}{name}", flush=True)
            try:
                fetch(name, path, VAL_TOKENS if "_val_" in name else None)
            except OSError as e:  # offline, the hub down, a connection lost half way
                raise data.DataError(f"could not download {name} ({e}): the {i} files before it "
                                     f"are kept; run the same command again") from None
        data.read_shard(path)  # its header and length: a whole shard
    print(f"{out_dir}: {len(names) - 1} train shards and the val shard (100M tokens each); next: "
          f"python train.py --dataset={os.path.basename(out_dir)}")


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
    if any(not a.startswith("--") for a in argv):
        raise ConfigError("python -m lab.fineweb takes only --train_shards=N and --out_dir=DIR")
    cfg = parse_args(SETTINGS, argv, "python -m lab.fineweb [--train_shards=N]")
    download(cfg.out_dir, cfg.train_shards)


if __name__ == "__main__":
    sys.argv[0] = "lab.fineweb"
    run_main(main)
