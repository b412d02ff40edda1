"""
Turn text into the token shards that train.py reads (llm.c's format: see data.py).

    python prepare.py                    # the 38 plays as bytes: data/shakespeare_byte/
    python prepare.py --tokenizer=gpt2   # in GPT-2 tokens: data/shakespeare_gpt2/
    python prepare.py --input=input.txt  # your UTF-8 text: data/input_byte/

The dataset is written into a new folder beside data/<name>/ and renamed to it once
whole. With --overwrite the old one is first renamed aside, and deleted last. A killed
prepare.py leaves the old dataset or the new one, and the next one tidies up after it.
Web-scale text comes tokenized already: python -m lab.fineweb.
"""
import glob
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
    dataset=("shakespeare", "shakespeare (the plays in corpus/), or a name for --input"),
    input=("", "your own UTF-8 text file (its last val_fraction is val)"),
    tokenizer=("byte", "byte (nothing to download), gpt2 or another of tiktoken's"),
    val_fraction=(0.1, "the share of the text held out for validation", 0.001, 0.5),
    seed=(1337, "seed of the train/val split"),
    out_root=(data.DATA_ROOT, "where data/<dataset>_<tokenizer>/ goes"),
    overwrite=(False, "replace a dataset of that name"),
    quiet=(False, "print nothing but errors"),
)
USAGE = "python prepare.py [--key=value ...]"
PLAYS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus",
                     "shakespeare_plays.txt.xz")


def prepare(cfg, documents=None):
    """Tokenizes the documents (by default the plays, or --input) into a dataset."""
    tok = data.get_tokenizer(cfg.tokenizer)
    if documents is None and cfg.input:
        documents = read_texts(cfg)
    elif documents is None:
        with lzma.open(PLAYS, "rt", encoding="utf-8") as f:
            documents = f.read().split("\f")  # a form feed between two plays
    name = f"{cfg.dataset}_{tok.name}"
    out_dir = os.path.join(cfg.out_root, name)
    tidy(cfg.out_root, name)
    if os.path.exists(out_dir) and not cfg.overwrite:  # the README's command runs twice
        print(f"{out_dir} is there already: kept (--overwrite makes it anew)",
              file=sys.stderr)
        return out_dir
    # Each document starts with an end-of-text token, so the model sees where one
    # ends. With enough documents, val is whole ones: in each run of 1/val_fraction
    # of them, one picked at random (38 plays give 3 or 4). With fewer, it is the
    # last val_fraction of each.
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
        if not is_val:  # the next run of documents: its length, and which one is val
            start, end = (math.ceil(k / cfg.val_fraction - 1e-9) for k in (runs, runs + 1))
            pick, runs = rng.randrange(end - start), runs + 1
            is_val = [j == pick for j in range(end - start)]
        splits["val" if is_val.pop(0) else "train"].append(ids)
    return write_dataset(out_dir, splits, tok, cfg, len(texts))


def write_dataset(out_dir, splits, tok, cfg, documents):
    """The shards and meta.json into a new folder, renamed to out_dir once whole; one
    that was there is renamed aside first, and deleted last."""
    os.makedirs(cfg.out_root, exist_ok=True)
    name, aside = os.path.basename(out_dir), None
    try:
        new = tempfile.mkdtemp(prefix=f".{name}.new-", dir=cfg.out_root)
        os.chmod(new, 0o755)  # (mkdtemp's folder is its owner's alone)
        meta = {"name": name, "tokenizer": tok.name, "vocab_size": tok.vocab_size,
                "eot": tok.eot, "documents": documents, "val_fraction": cfg.val_fraction,
                "seed": cfg.seed, "shards": []}
        for split, parts in splits.items():  # a shard a split (llm.c's hold 100M tokens)
            if not parts:
                raise data.DataError(f"too little text for a {split} split: give more")
            tokens = np.concatenate(parts)
            shard = {"file": f"{name}_{split}_000000.bin", "split": split,
                     "tokens": len(tokens)}
            meta["shards"].append(shard)
            meta[f"{split}_tokens"] = len(tokens)
            write_shard(os.path.join(new, shard["file"]), tokens, tok.vocab_size)
        with open(os.path.join(new, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        if os.path.exists(out_dir):  # --overwrite: the old one aside, the new one in
            aside = tempfile.mkdtemp(prefix=f".{name}.old-", dir=cfg.out_root)
            os.replace(out_dir, os.path.join(aside, name))
        os.replace(new, out_dir)
    except BaseException:
        tidy(cfg.out_root, name)  # the old dataset back if it was aside, no new folder
        raise
    if aside:
        shutil.rmtree(aside)
    if not cfg.quiet:
        here = cfg.out_root == data.DATA_ROOT  # train.py's --dataset: a name, or a path
        dataset = name if here else os.path.abspath(out_dir)
        print(f"{'replaced' if aside else 'wrote'} {out_dir}: {meta['train_tokens']:,} "
              f"train + {meta['val_tokens']:,} val tokens, {tok.name} (vocab "
              f"{tok.vocab_size})\nnext: python train.py" + (
                  "" if here and name == data.DEFAULT_DATASET else f" --dataset={dataset}"))
    return out_dir


def write_shard(path, tokens, vocab_size):
    """tokens as a shard at path, written whole or not at all (data.read_shard's)."""
    dtype = np.dtype("<u2" if vocab_size <= 1 << 16 else "<u4")
    magic, version = next(header for header, d in data.HEADERS.items() if d == dtype)
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens)
    with data.atomic_write(path) as f:
        f.write(header.tobytes() + np.asarray(tokens, dtype=dtype).tobytes())


def tidy(out_root, name):
    # What a killed prepare.py left of this dataset: its half-written folder goes,
    # and a dataset it had renamed aside (killed between the two renames) comes back.
    out_dir = os.path.join(out_root, name)
    pattern = os.path.join(glob.escape(out_root), f".{glob.escape(name)}.*-*")
    for folder in glob.glob(pattern):  # .<name>.new-* and .<name>.old-*
        old = os.path.join(folder, name)
        if os.path.isdir(old) and not os.path.exists(out_dir):
            os.replace(old, out_dir)
            print(f"{out_dir}: put back (a killed prepare.py had set it aside)",
                  file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)


def read_texts(cfg):
    """--input's text, one document (as nanoGPT's input.txt). The dataset is named after the
    file unless --dataset names it."""
    if not os.path.isfile(cfg.input):
        raise data.DataError(f"--input={cfg.input}: no such file (a UTF-8 text file)")
    if cfg.dataset == "shakespeare":
        cfg.dataset = os.path.splitext(os.path.basename(cfg.input))[0] or "input"
    try:
        with open(cfg.input, encoding="utf-8") as f:
            return [f.read()]
    except UnicodeDecodeError as e:
        raise data.DataError(f"{cfg.input} is not UTF-8 text (byte {e.start}): convert it "
                             f"first, e.g. iconv -f latin1 -t utf-8") from None


def main(argv):
    for arg in argv:  # the configurator would take a plain argument for a preset file
        if not arg.startswith("-"):
            raise ConfigError(f"{arg}: prepare.py takes only --key=value settings "
                              f"(your text: --input={arg})")
    cfg = parse_args(SETTINGS, argv, USAGE)
    if cfg.dataset != "shakespeare" and not cfg.input:
        raise ConfigError(f"--dataset={cfg.dataset}: use shakespeare, or give your text with "
                          f"--input=PATH (FineWeb-Edu: python -m lab.fineweb)")
    prepare(cfg)


if __name__ == "__main__":
    run_main(main)
