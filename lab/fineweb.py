"""python -m lab.fineweb [preset.py] [--train_shards=N]: FineWeb-Edu in GPT-2 tokens, as the GPT-2
speedrun (modded-nanogpt) publishes it in llm.c's format, fetched as its own script does, through
huggingface_hub (pip install huggingface_hub: resumable, each file's size checked, a progress bar),
into data/fineweb_edu_gpt2/: the val shard, and the train shards (100M tokens, 200 MB each, 99 at
most) a preset's run reads. Beside that folder, a dataset per count of train shards names exactly
those (data/fineweb_edu_gpt2_1shard/): a run draws batches from every shard its dataset names, so a
preset names the dataset of its count and reads the same tokens whatever else was downloaded."""
import json
import math
import os
import sys

import numpy as np

import compare
import data
from lab.analysis import plural
from configurator import ConfigError, parse_args, run_main

REPO = "kjj0/finewebedu10B-gpt2"  # a dataset on the Hugging Face hub
VAL = "finewebedu_val_000000.bin"
# The speedrun scores the val shard's first 10,485,760 tokens. The hub sends whole files: the val
# shard is kept whole (the hub then skips it), and its first VAL_TOKENS written as the shard that
# meta.json names, so lab.evaluate's pass scores what the speedrun scores, in a tenth of the time.
VAL_TOKENS = 10 * 2**20
SHARD_TOKENS, SHARDS = 100_000_000, 99
SETTINGS = {"train_shards": (0, "train shards of 100M tokens (0: those the preset's run reads; "
                                "without a preset, 1)", 0, SHARDS),
            "out_dir": (os.path.join(data.DATA_ROOT, "fineweb_edu_gpt2"), "where the shards go")}


def shards_needed(preset):
    """(train shards, tokens) a preset's run reads: max_iters x tokens a step, 100M a shard."""
    cfg = parse_args(compare.SETTINGS, [preset], "")
    accumulation = cfg.gradient_accumulation_steps or 1
    tokens = cfg.max_iters * cfg.batch_size * cfg.block_size * accumulation
    return min(SHARDS, max(1, math.ceil(tokens / SHARD_TOKENS))), tokens


def whole(path):
    """Is path a shard whose header's token count matches its size?"""
    try:
        return os.path.isfile(path) and len(data.read_shard(path)) > 0
    except data.DataError:
        return False


def fetch(name, out_dir):
    """One file of the hub into out_dir, whole: the same command resumes a part the hub kept."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise data.DataError("lab.fineweb downloads through huggingface_hub: pip install "
                             "huggingface_hub") from None
    path = os.path.join(out_dir, name)
    if os.path.exists(path):  # a shard not whole: the hub would keep it as it is
        os.remove(path)
    try:
        hf_hub_download(repo_id=REPO, filename=name, repo_type="dataset", local_dir=out_dir)
    except Exception as e:  # offline, the hub down, a connection lost (several libraries' errors)
        said = (str(e).splitlines() or [""])[0]  # (the hub's messages run to several lines)
        raise data.DataError(f"could not download {name} ({type(e).__name__}: {said}): run the "
                             f"same command again") from None
    if not whole(path):  # a connection that closed cleanly half way
        os.remove(path)
        raise data.DataError(f"{name} came cut short: run the same command again")


def dataset_dir(out_dir, train_shards):
    """The dataset of train_shards shards, beside out_dir: data/fineweb_edu_gpt2_1shard."""
    return f"{out_dir.rstrip(os.sep)}_{plural(train_shards, 'shard').replace(' ', '')}"


def download(out_dir, train_shards):
    """The val shard's first VAL_TOKENS and train_shards train shards in out_dir, each fetched
    unless whole there, and the dataset that names exactly them: its folder's path."""
    os.makedirs(out_dir, exist_ok=True)
    val = os.path.join(out_dir, f"{VAL.removesuffix('.bin')}_first{VAL_TOKENS}.bin")
    names = [VAL] + [f"finewebedu_train_{i:06d}.bin" for i in range(1, train_shards + 1)]
    for i, name in enumerate(names):
        if not whole(val if name == VAL else os.path.join(out_dir, name)):
            print(f"[{i + 1}/{len(names)}] {REPO}: {name}", flush=True)
            if not whole(os.path.join(out_dir, name)):
                fetch(name, out_dir)
            if name == VAL:
                tokens = data.read_shard(os.path.join(out_dir, VAL))
                header = np.fromfile(os.path.join(out_dir, VAL), dtype="<i4", count=256)
                header[2] = min(VAL_TOKENS, len(tokens))
                with data.atomic_write(val) as f:
                    f.write(header.tobytes() + tokens[:header[2]].tobytes())
    dataset = dataset_dir(out_dir, train_shards)
    shards = [{"file": os.path.relpath(path, dataset), "split": split,
               "tokens": len(data.read_shard(path))} for path, split in
              [(val, "val")] + [(os.path.join(out_dir, n), "train") for n in names[1:]]]
    meta = {"name": os.path.basename(dataset), "tokenizer": "gpt2", "vocab_size": 50257,
            "eot": 50256, "shards": shards, **{f"{split}_tokens": sum(
                s["tokens"] for s in shards if s["split"] == split) for split in ("train", "val")}}
    os.makedirs(dataset, exist_ok=True)
    with data.atomic_write(os.path.join(dataset, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{dataset}: {plural(train_shards, 'train shard')} ({meta['train_tokens']:,} tokens) and "
          f"{meta['val_tokens']:,} val tokens; next: python train.py --dataset="
          f"{os.path.basename(dataset)}")
    return dataset


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
