"""Turn text into the token shards that train.py reads (llm.c's format: see data.py).

    python prepare.py                      # Shakespeare's 38 plays as bytes: data/shakespeare_byte/
    python prepare.py --tokenizer=gpt2     # the plays in GPT-2 tokens: data/shakespeare_gpt2/
    python prepare.py --input=input.txt    # your UTF-8 text: data/input_byte/

The dataset is written into a new folder beside data/<name>/ and renamed to it when whole, so a
kill leaves no half dataset. An existing one is replaced only with --overwrite: it is renamed
aside, the new one renamed in, the old one deleted (between the two renames, a moment without
data/<name>/). Web-scale text comes tokenized already: python -m lab.fineweb.
"""
import json
import lzma
import math
import os
import random
import shutil
import sys
import tempfile

import numpy as np

import data
from configurator import ConfigError, parse_args, run_main

SETTINGS = dict(
    dataset=("shakespeare", "shakespeare (the plays in corpus/); with --input, a name for your "
                            "text (nanoGPT's Tiny Shakespeare: --input=input.txt)"),
    input=("", "your own UTF-8 text file (one document: the last val_fraction is val)"),
    tokenizer=("byte", "byte (nothing to download), gpt2, or another tiktoken encoding"),
    val_fraction=(0.1, "share of the documents for validation (of each one's tokens, with fewer "
                       "than 1/val_fraction documents)", (0.001, 0.5)),
    seed=(1337, "seed of the train/val split"),
    out_root=(data.DATA_ROOT, "where data/<dataset>_<tokenizer>/ goes"),
    overwrite=(False, "replace a dataset of that name"),
    quiet=(False, "print nothing but errors"),
)
USAGE = "python prepare.py [--key=value ...]"
PLAYS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus",
                     "shakespeare_plays.txt.xz")
SHARD_SIZE = 100_000_000  # tokens a shard at most, as llm.c's and the GPT-2 speedrun's


def prepare(cfg, documents=None):
    """Tokenizes the documents (texts; default: the plays, or --input) into out_root/<name>/."""
    tok = data.get_tokenizer(cfg.tokenizer)
    if documents is None and cfg.input:
        documents = read_texts(cfg)
    elif documents is None:
        with lzma.open(PLAYS, "rt", encoding="utf-8") as f:
            documents = f.read().split("\f")  # a form feed between two plays
    name = f"{cfg.dataset}_{tok.name}"
    out_dir = os.path.join(cfg.out_root, name)
    if os.path.exists(out_dir) and not cfg.overwrite:  # kept: the README's command runs twice
        print(f"{out_dir} is there already: kept (--overwrite makes it anew)", file=sys.stderr)
        return out_dir
    # Each document gets an end-of-text token in front, so the model sees where one ends. Val
    # is held-out text: with enough documents, whole ones (in each run of 1/val_fraction of them
    # one at random, so 38 plays give 3 or 4); with fewer, each one's last val_fraction.
    texts = [t for t in documents if t]
    by_document, splits = len(texts) >= 1 / cfg.val_fraction, {"train": [], "val": []}
    rng, runs, is_val = random.Random(cfg.seed), 0, []
    for text in texts:
        ids = np.array([tok.eot] + tok.encode(text), dtype=np.uint32)
        if not by_document:
            cut = len(ids) - max(1, int(len(ids) * cfg.val_fraction))
            splits["train"].append(ids[:cut])
            splits["val"].append(ids[cut:])
            continue
        if not is_val:  # the next run of documents: its length, and which one of them is val
            start, end = (math.ceil(k / cfg.val_fraction - 1e-9) for k in (runs, runs + 1))
            pick, runs = rng.randrange(end - start), runs + 1
            is_val = [j == pick for j in range(end - start)]
        splits["val" if is_val.pop(0) else "train"].append(ids)
    return write_dataset(out_dir, splits, tok, cfg, len(texts))


def write_dataset(out_dir, splits, tok, cfg, documents):
    """The shards and meta.json into a new folder, renamed to out_dir once whole; a dataset that
    was there is renamed aside first and deleted last."""
    os.makedirs(cfg.out_root, exist_ok=True)
    name, aside, new = os.path.basename(out_dir), None, None
    try:
        new = tempfile.mkdtemp(prefix=f".{name}.new-", dir=cfg.out_root)
        os.chmod(new, 0o755)  # (mkdtemp's folder is its owner's alone)
        meta = {"name": name, "tokenizer": tok.name, "vocab_size": tok.vocab_size,
                "eot": tok.eot, "documents": documents, "val_fraction": cfg.val_fraction,
                "seed": cfg.seed, "shards": []}
        for split, parts in splits.items():
            tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
            if len(tokens) == 0:
                raise data.DataError(f"too little text for a {split} split: give more text")
            meta[f"{split}_tokens"] = len(tokens)
            for i in range(0, len(tokens), SHARD_SIZE):
                meta["shards"].append({"file": f"{name}_{split}_{i // SHARD_SIZE:06d}.bin",
                                       "split": split, "tokens": len(tokens[i:i + SHARD_SIZE])})
                data.write_shard(os.path.join(new, meta["shards"][-1]["file"]),
                                 tokens[i:i + SHARD_SIZE], tok.vocab_size)
        with open(os.path.join(new, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        if os.path.exists(out_dir):  # --overwrite: the old dataset aside, then the new one in
            aside = tempfile.mkdtemp(prefix=f".{name}.old-", dir=cfg.out_root)
            os.replace(out_dir, os.path.join(aside, name))
        os.replace(new, out_dir)
    except BaseException:
        if aside and not os.path.exists(out_dir):  # the old one back where it was
            os.replace(os.path.join(aside, name), out_dir)
        for folder in (new, aside):  # (aside is empty by now)
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
        raise
    if aside:
        shutil.rmtree(aside)
    if not cfg.quiet:
        print(f"{'replaced' if aside else 'wrote'} {out_dir}: {meta['train_tokens']:,} train + "
              f"{meta['val_tokens']:,} val tokens, {data.plural(len(meta['shards']), 'shard')}, "
              f"{tok.name} (vocab {tok.vocab_size})\nnext: python train.py" + (
                  "" if out_dir == os.path.join(data.DATA_ROOT, data.DEFAULT_DATASET) else
                  f" --dataset={name if cfg.out_root == data.DATA_ROOT else out_dir}"))
    return out_dir


def read_texts(cfg):
    """--input's text, one document (as nanoGPT's input.txt). The dataset is named after the file
    unless --dataset names it."""
    if not os.path.isfile(cfg.input):
        raise data.DataError(f"--input={cfg.input}: no such file (a UTF-8 text file)")
    if cfg.dataset == "shakespeare":
        cfg.dataset = os.path.splitext(os.path.basename(cfg.input))[0] or "input"
    try:
        with open(cfg.input, encoding="utf-8") as f:
            return [f.read()]
    except UnicodeDecodeError as e:
        raise data.DataError(f"{cfg.input} is not UTF-8 text (byte {e.start}): convert it first, "
                             f"e.g. iconv -f latin1 -t utf-8") from None


def main(argv):
    for arg in argv:  # the configurator would take a plain argument for a preset file
        if not arg.startswith("-"):
            raise ConfigError(f"{arg}: prepare.py takes only --key=value settings "
                              f"(your text: --input={arg})")
    cfg = parse_args(SETTINGS, argv, USAGE)
    if cfg.dataset == "fineweb_edu" and not cfg.input:
        raise ConfigError("FineWeb-Edu comes tokenized already: python -m lab.fineweb")
    if cfg.dataset != "shakespeare" and not cfg.input:
        raise ConfigError(f"--dataset={cfg.dataset}: use shakespeare, or give your text with "
                          f"--input=PATH (then --dataset names it)")
    prepare(cfg)


if __name__ == "__main__":
    run_main(main)
