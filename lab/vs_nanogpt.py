"""
train.py against nanoGPT's own train.py on nanoGPT's README CPU recipe (4 x 128, block 64, batch
12, 2,000 steps, Tiny Shakespeare), on the same bytes, side by side: alternating pairs of whole
runs, the wall-time ratio of each pair, and their median (a 2-core machine's step varies from run
to run, so one pair says little).

    python -m lab.vs_nanogpt --nanogpt=/path/to/nanoGPT --text=input.txt --pairs=5

nanoGPT is not part of this project: clone it anywhere. Both read the same tokens: Tiny
Shakespeare prepared by prepare.py (bytes; its first 90% train, the rest val), written for
nanoGPT as data/shakespeare_char/{train,val}.bin with a meta.pkl of the same vocabulary size (320,
ours padded), so both build the same model. Prints each run's final val loss (nanoGPT's last
20-batch estimate; ours: the same estimate and the whole split) and writes a JSON record.
"""
import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import time

import numpy as np

import data
import prepare
from configurator import defaults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = ["--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12",
          "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
          "--lr_decay_iters=2000", "--dropout=0.0"]  # nanoGPT's README, CPU
# what config/train_shakespeare_char.py sets besides, spelled out for ours
THEIRS = ["--learning_rate=1e-3", "--min_lr=1e-4", "--beta2=0.99", "--warmup_iters=100",
          "--eval_interval=250", "--bias=False"]


def same_bytes(text, work, nanogpt):
    """Our dataset of the text, and nanoGPT's shakespeare_char folder holding the same tokens."""
    out = prepare.prepare(defaults(prepare.SETTINGS, input=text, name="vs_nanogpt",
                                   out_root=os.path.join(work, "data"), quiet=True))
    target = os.path.join(nanogpt, "data", "shakespeare_char")
    os.makedirs(target, exist_ok=True)
    for split in ("train", "val"):
        tokens = np.concatenate([data.read_shard(p) for p in data.list_shards(out, split)])
        tokens.astype(np.uint16).tofile(os.path.join(target, f"{split}.bin"))
    with open(os.path.join(target, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": -(-data.ByteTokenizer.vocab_size // 64) * 64}, f)
    return out


def timed(command, cwd):
    t0 = time.time()
    run = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return time.time() - t0, run.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt", required=True, help="a clone of karpathy/nanoGPT")
    p.add_argument("--text", required=True, help="Tiny Shakespeare's input.txt")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--value_mode", default="vanilla", help="ours: the value mode to time")
    p.add_argument("--work", default="out-vs-nanogpt")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    dataset = same_bytes(args.text, os.path.abspath(args.work), args.nanogpt)
    theirs = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
              "--compile=False", *RECIPE]
    ours = [sys.executable, os.path.join(ROOT, "train.py"), f"--dataset={dataset}",
            f"--value_mode={args.value_mode}", "--device=cpu", "--overwrite",
            f"--out_dir={os.path.join(args.work, 'ours')}", *RECIPE, *THEIRS]
    pairs = []
    for i in range(args.pairs):  # alternate who goes first
        order = [("nanoGPT", theirs, args.nanogpt), ("ours", ours, ROOT)]
        result = {}
        for name, command, cwd in (order if i % 2 == 0 else order[::-1]):
            seconds, out = timed(command, cwd)
            val = re.findall(r"val loss ([0-9.]+)", out)
            full = re.findall(r"whole validation split .*: ([0-9.]+)", out)
            result[name] = {"seconds": seconds, "val_loss": float(val[-1]) if val else None,
                            "val_loss_full": float(full[-1]) if full else None}
        # ours also evaluates the whole validation split at the end, which nanoGPT does not
        with open(os.path.join(args.work, "ours", "log.jsonl")) as f:
            final = [r for r in map(json.loads, f) if r["kind"] == "final"][-1]
        result["ours"]["whole_split_seconds"] = final["seconds"]
        result["ratio"] = result["ours"]["seconds"] / result["nanoGPT"]["seconds"]
        result["ratio_without_whole_split"] = ((result["ours"]["seconds"] - final["seconds"])
                                               / result["nanoGPT"]["seconds"])
        pairs.append(result)
        print(f"pair {i + 1}: nanoGPT {result['nanoGPT']['seconds']:.1f} s "
              f"(val {result['nanoGPT']['val_loss']}), ours {result['ours']['seconds']:.1f} s "
              f"(val {result['ours']['val_loss']}, whole split {result['ours']['val_loss_full']})"
              f": ratio {result['ratio']:.3f} ({result['ratio_without_whole_split']:.3f} without "
              f"the whole-split pass, {final['seconds']:.1f} s)", flush=True)
    for key in ("ratio", "ratio_without_whole_split"):
        ratios = [r[key] for r in pairs]
        print(f"median {key} ours / nanoGPT over {len(pairs)} pairs: "
              f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
    with open(os.path.join(args.work, "vs_nanogpt.json"), "w") as f:
        json.dump({"pairs": pairs, "median_ratio": statistics.median(r["ratio"] for r in pairs),
                   "ours": ours, "theirs": theirs, "threads": os.environ.get("OMP_NUM_THREADS")},
                  f, indent=1)


if __name__ == "__main__":
    main()
