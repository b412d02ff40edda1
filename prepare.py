"""
Turn text into the token shards that train.py reads.

    # Shakespeare's plays, byte tokens -> data/shakespeare_byte/
    python prepare.py
    # same plays, GPT-2 BPE          -> data/shakespeare_gpt2/
    python prepare.py --tokenizer=gpt2
    # nanoGPT's classic input.txt (downloaded once)
    python prepare.py --dataset=tinyshakespeare
    # your own UTF-8 text: a file, a directory or a glob
    python prepare.py --input=my_texts/ --tokenizer=gpt2
    # FineWeb-Edu sample-10BT (needs `datasets` + network)
    python prepare.py --dataset=fineweb_edu --tokenizer=gpt2
    python prepare.py --help                            # every setting, its default and meaning

It ends by printing the train.py command for what it wrote. Shards use the llm.c layout (a
256 x int32 header, then the tokens), so they interchange with llm.c's and modded-nanogpt's
cached FineWeb shards. The format, its reader and the tokenizers live in shards.py, the texts
in corpora.py; this file is the pipeline (tokenize, split, write, switch) and its CLI.

Validation: whole documents (or pieces of a text file, cut small enough that a single file's val
share comes out close to it), about one in 1/val_fraction. --val_tokens=N instead makes the first
N tokens val. FineWeb-Edu does that by default with N = 100M, like llm.c's first shard: 10% of its
10B tokens would take 1B tokens from training. An explicit --val_fraction overrides that.

Re-preparing is crash-safe: a killed run leaves the old dataset usable (or the new one, complete);
the next run removes its leftovers and says so (how: "the dataset directory" below).
"""
import contextlib
import datetime
import errno
import json
import math
import multiprocessing
import os
import random
import re
import shlex
import sys
import time
from collections import deque

import numpy as np

from configurator import ConfigError, given_keys, parse_args, run_main
from corpora import open_source
from shards import (DATA_ROOT, DATASETS, DEFAULT_DATASET, DataError, OlderDataset, get_tokenizer, hold_lock,
                    load_meta, shard_dtype, write_shard)

BATCH_CHARS = 1 << 18     # text handed to a tokenizer worker at a time
FINEWEB_VAL_TOKENS = 100_000_000  # FineWeb's val: its first 100M tokens, like llm.c's val shard


# -----------------------------------------------------------------------------
# tokenizing in a process pool, in order, with a bounded number of batches in flight

_tok = None  # the tokenizer inside each worker process


def _init_worker(tok):
    global _tok
    _tok = tok


def _encode_pieces(pieces):
    """[(text, starts_document)] -> [(tokens, text bytes, starts_document)], EOTs added."""
    arrays = _tok.encode_arrays([text for text, _ in pieces])
    return [(np.concatenate(([_tok.eot], ids)).astype(np.uint32) if starts else ids,
             len(text.encode("utf-8")), starts)
            for ids, (text, starts) in zip(arrays, pieces)]


def _batches(pieces):
    batch, size = [], 0
    for text, starts in pieces:
        if not text:
            continue
        batch.append((text, starts))
        size += len(text)
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def tokenize(pieces, tok, workers):
    """Yields (tokens, text bytes, starts_document) per piece, in input order."""
    if workers == 1:
        _init_worker(tok)
        for batch in _batches(pieces):
            yield from _encode_pieces(batch)
        return
    # apply_async with a short queue: Pool.imap would read the whole source ahead of the workers
    with multiprocessing.Pool(workers, initializer=_init_worker, initargs=(tok,)) as pool:
        pending = deque()
        for batch in _batches(pieces):
            pending.append(pool.apply_async(_encode_pieces, (batch,)))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


# -----------------------------------------------------------------------------
# writing shards

class ShardWriter:
    """Collects one split's tokens into fixed-size shards <name>.<gen>_<split>_000000.bin, ..."""

    def __init__(self, out_dir, stem, split, shard_size, vocab_size):  # stem: <name>.<gen>
        self.out_dir, self.stem, self.split, self.vocab_size = out_dir, stem, split, vocab_size
        # pages are only touched as it fills
        self.buf = np.empty(shard_size, dtype=shard_dtype(vocab_size))
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
            # <name>.gen-2_train_000000.bin: the generation keeps a new set apart from the old one
            file = f"{self.stem}_{self.split}_{len(self.shards):06d}.bin"
            path = os.path.join(self.out_dir, file)
            sha = write_shard(path, self.buf[:self.n], self.vocab_size)
            self.shards.append({"file": file, "split": self.split, "tokens": self.n,
                                "bytes": os.path.getsize(path), "sha256": sha})
            self.n = 0


class Progress:
    """One self-overwriting stderr line, at most a few updates per second."""

    def __init__(self, quiet):
        self.quiet, self.t0, self.last, self.bytes, self.tokens = quiet, time.time(), 0.0, 0, 0

    def update(self, nbytes, ntokens, final=False):
        self.bytes, self.tokens = self.bytes + nbytes, self.tokens + ntokens
        now = time.time()
        if not self.quiet and (final or now - self.last > 0.5):
            self.last, dt = now, max(now - self.t0, 1e-9)
            print(f"\rtokenized {self.bytes / 1e6:.1f} MB -> {self.tokens:,} tokens in {dt:.1f}s "
                  f"({self.bytes / 1e6 / dt:.2f} MB/s)", end="\n" if final else "",
                  file=sys.stderr, flush=True)


# -----------------------------------------------------------------------------
# the dataset directory: one complete set of shards at a time. meta.json names the shards, each
# run's tagged with its generation (<name>.gen-2_train_000000.bin). A run writes its new shards,
# then replaces meta.json, one atomic step: readers find the old set or the new, never a mix or
# nothing. Then the old shards go. What a killed run leaves, no meta.json names: the next run
# removes it.

def lock_dataset(out_dir):
    """Holds out_dir/prepare.lock until released (the OS drops it if the process dies), so two
    runs never write, or clean up, the same dataset at once."""
    return hold_lock(os.path.join(out_dir, "prepare.lock"), DataError(
        f"{out_dir} is being prepared by another prepare.py run: wait for it, or give this one "
        f"another --name"))


def new_folders(path):
    """The folders os.makedirs(path) would create, deepest first."""
    path, made = os.path.abspath(path), []
    while not os.path.isdir(path):
        made.append(path)
        path = os.path.dirname(path)
    return made


def current_meta(out_dir):
    """The meta.json of the dataset in out_dir, or None (none, or unreadable: nothing to keep);
    a dataset an older prepare.py wrote is refused (load_meta's one line)."""
    try:
        return load_meta(out_dir) if os.path.exists(os.path.join(out_dir, "meta.json")) else None
    except OlderDataset:
        raise
    except DataError:
        return None


def source_of(meta):
    """What a dataset was made from, as a dict to compare: the source (files or built-in dataset),
    the tokenizer and the split. The exact files and texts may change (re-preparing is allowed)."""
    split = ({"val_first_tokens": meta["val_first_tokens"]} if meta["val_first_tokens"]
             else {"val_fraction": meta["val_fraction"], "seed": meta["seed"]})
    return {"dataset": meta["dataset"], "input": meta["input"], "tokenizer": meta["tokenizer"],
            **split}


def describe_source(source):
    """'mytexts/*.md, byte tokens, val_fraction 0.1, seed 1337' for the refusal below."""
    split = (f"val = the first {source['val_first_tokens']:,} tokens"
             if "val_first_tokens" in source
             else f"val_fraction {source['val_fraction']}, seed {source['seed']}")
    where = source["input"] and os.path.relpath(source["input"])
    if where and where.startswith(".."):  # outside this folder: the whole path says more
        where = source["input"]
    return f"{where or source['dataset']}, {source['tokenizer']} tokens, {split}"


def check_same_source(out_dir, old, new, overwrite):
    """Re-preparing a dataset from its own source is fine; replacing it with data made from another
    source (other files, tokenizer or split) must be asked for: runs and checkpoints use it."""
    before = old and source_of(old)
    if before and before != new and not overwrite:
        raise DataError(f"{out_dir} holds data prepared from {describe_source(before)}; this run "
                        f"reads {describe_source(new)}: give it another --name, or replace "
                        f"{out_dir} with --overwrite")


def remove_leftovers(out_dir, name, meta):
    """Removes what no reader uses: generation-tagged shards that meta (the meta.json in use, or
    None) does not name, and meta.json.tmp; returns their names. Untagged shards stay: without
    meta.json they may be llm.c's, copied in by hand."""
    keep = {shard["file"] for shard in meta["shards"]} if meta else set()
    # a tagged shard, or one a killed write left under its temporary name
    ours = re.compile(re.escape(name) + r"\.gen-\d+_(train|val)_\d{6}\.bin(\.tmp)?|meta\.json\.tmp")
    removed = [entry for entry in sorted(os.listdir(out_dir))
               if ours.fullmatch(entry) and entry not in keep]
    for entry in removed:
        os.remove(os.path.join(out_dir, entry))
    return removed


def sync_dir(path):
    """fsync a directory, so the renames in it survive a power cut (where the OS allows it)."""
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# -----------------------------------------------------------------------------
# the entry point

def val_flags(val_fraction, seed):
    """Endless True/False per piece: one random piece in each run of ~1/val_fraction goes to val.
    Stratified rather than a coin per piece, so 38 plays give 3-4 val plays, not 0-8."""
    rng, k = random.Random(seed), 0
    while True:
        start, end = (math.ceil(i / val_fraction - 1e-9) for i in (k, k + 1))
        pick = rng.randrange(end - start)
        yield from (j == pick for j in range(end - start))
        k += 1


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool)


def prepare(dataset="shakespeare", tokenizer="byte", input=None, name=None, val_fraction=0.1,
            val_tokens=None, seed=1337, workers=None, shard_size=100_000_000, out_root=DATA_ROOT,
            documents=None, quiet=False, overwrite=False):
    """Tokenizes a corpus into out_root/name/ (shards + meta.json); returns that directory."""
    if workers is None:  # bytes are a memcpy, not worth a process pool; BPE is
        workers = 1 if tokenizer == "byte" else min(os.cpu_count() or 1, 8)
    if not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction={val_fraction}: must be between 0 and 1 (e.g. 0.1)")
    counts = _is_count(workers) and _is_count(shard_size)
    if not (counts and workers >= 1 and 0 < shard_size < 1 << 31):
        raise DataError(f"--workers={workers} --shard_size={shard_size}: need whole numbers, "
                        f"workers >= 1 and 1 <= shard_size < 2**31")
    tok = get_tokenizer(tokenizer)
    # local text is named after its file/dir, never after a built-in dataset it isn't
    if input is not None and (dataset is None or dataset in DATASETS):
        stem = os.path.splitext(os.path.basename(os.path.normpath(input.split("*")[0] or ".")))[0]
        dataset = stem or "input"
    name = name or f"{dataset}_{tok.name}"
    if name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        raise DataError(f"--name={name}: a name, not a path (--out_root says where it goes)")
    if val_tokens is None:  # FineWeb: a fixed val set like llm.c's first shard (10% = 1B tokens)
        val_tokens = FINEWEB_VAL_TOKENS if dataset == "fineweb_edu" else 0
    if not (_is_count(val_tokens) and val_tokens >= 0):
        raise DataError(f"--val_tokens={val_tokens}: must be a whole number >= 0 (0: val_fraction)")
    pieces, source = open_source(dataset, input, documents, out_root, val_fraction)
    # the input as a path from here: 'texts', './texts/' and its absolute path are one source
    input = os.path.abspath(input) if input is not None else None

    out_dir = os.path.join(out_root, name)
    made = new_folders(out_dir)  # a first preparation that fails removes them again
    os.makedirs(out_dir, exist_ok=True)
    lock = lock_dataset(out_dir)
    try:
        old = current_meta(out_dir)
        check_same_source(out_dir, old, source_of(
            {"dataset": dataset, "input": input, "tokenizer": tok.name, "seed": seed,
             "val_fraction": val_fraction, "val_first_tokens": val_tokens}), overwrite)
        generation = old["generation"] + 1 if old else 1
        removed = remove_leftovers(out_dir, name, old)
        if removed:
            print(f"removed what an interrupted run left in {out_dir}: {', '.join(removed)}",
                  file=sys.stderr)
        tag = f"gen-{generation}"
        meta_tmp = os.path.join(out_dir, "meta.json.tmp")
        try:  # error, Ctrl-C or a full disk before the switch: drop the new files, keep the old set
            meta = {"name": name, "dataset": dataset, "source": source, "input": input,
                    "generation": generation,
                    "val_fraction": val_fraction, "val_first_tokens": val_tokens, "seed": seed}
            meta |= write_shards(pieces, tok, workers, out_dir, tag, name, shard_size,
                                 val_fraction, val_tokens, seed, quiet, source)
            with open(meta_tmp, "w") as f:
                json.dump(meta, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            sync_dir(out_dir)  # the shards on disk before meta.json names them
        except BaseException as e:
            with contextlib.suppress(OSError):
                remove_leftovers(out_dir, name, old)  # this run's shards and meta.json.tmp
                if made:  # nothing was there before: leave nothing (rmdir only takes empty ones)
                    os.remove(os.path.join(out_dir, "prepare.lock"))
                    for folder in made:
                        os.rmdir(folder)
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                kept = ", the dataset there is unchanged" if old else ""
                raise DataError(f"no space left on device while writing {out_dir}: this run's "
                                f"files are removed{kept}; free some space, or prepare under "
                                f"another --out_root") from None
            raise
        os.replace(meta_tmp, os.path.join(out_dir, "meta.json"))  # the switch
        sync_dir(out_dir)
        remove_leftovers(out_dir, name, meta)  # the old set
    finally:
        lock.release()
    return out_dir


def write_shards(pieces, tok, workers, out_dir, tag, name, shard_size, val_fraction, val_tokens,
                 seed, quiet, source):
    """Tokenizes the pieces into out_dir/<name>.<tag>_*.bin (train and val shards); returns
    meta's part."""
    writers = {s: ShardWriter(out_dir, f"{name}.{tag}", s, shard_size, tok.vocab_size)
               for s in ("train", "val")}
    flags = val_flags(val_fraction, seed)  # whole pieces (documents, parts of a file) go to val
    progress, documents_seen, val_seen, held = Progress(quiet), 0, 0, None
    try:
        for ids, nbytes, starts in tokenize(pieces, tok, workers):
            documents_seen += starts
            progress.update(nbytes, len(ids))
            if val_tokens:  # val is the first val_tokens tokens, cutting the document that crosses
                k = max(0, min(len(ids), val_tokens - val_seen))
            else:
                k = len(ids) if next(flags) else 0
            val_seen += k
            for split, part in (("val", ids[:k]), ("train", ids[k:])):
                # hold the latest part back: if a split would end up empty, it gets this one
                if len(part):
                    if held is not None:
                        writers[held[0]].add(held[1])
                    held = (split, part)
    finally:  # end the progress line, also when an error or Ctrl-C follows it
        progress.update(0, 0, final=True)
    if held is None:
        raise DataError(f"no text in {source}: the input is empty")
    split, ids = held
    if writers["train"].tokens and writers["val"].tokens:
        writers[split].add(ids)
    elif writers["train"].tokens or writers["val"].tokens:
        writers["val" if writers["train"].tokens else "train"].add(ids)
    elif len(ids) >= 2:
        # a single short piece: its tail is val (not a whole document, but never empty)
        k = max(1, int(len(ids) * val_fraction))
        writers["train"].add(ids[:-k])
        writers["val"].add(ids[-k:])
    else:
        raise DataError(f"too little text in {source} ({len(ids)} token): "
                        "need at least 2 tokens for train and val")
    for w in writers.values():
        w.flush()
    if val_tokens and writers["val"].tokens > writers["train"].tokens:
        print(f"warning: --val_tokens={val_tokens:,} took most of {source}: "
              f"{writers['train'].tokens:,} train tokens are left", file=sys.stderr)
    return {"tokenizer": tok.name, "vocab_size": tok.vocab_size, "eot": tok.eot,
            "dtype": str(shard_dtype(tok.vocab_size)), "documents": documents_seen,
            "text_bytes": progress.bytes,
            "train_tokens": writers["train"].tokens, "val_tokens": writers["val"].tokens,
            "shards": writers["train"].shards + writers["val"].shards,
            "seconds": round(time.time() - progress.t0, 2),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


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


def train_command(out_root, name):
    """The command that trains on out_root/name (train.py takes a name under data/, or a path)."""
    in_data = os.path.normpath(out_root) == DATA_ROOT
    dataset = name if in_data else os.path.join(out_root or ".", name)
    if dataset == DEFAULT_DATASET:
        return "python train.py"
    return f"python train.py --dataset={shlex.quote(dataset)}"


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
    print(f"next: {train_command(cfg['out_root'], os.path.basename(out_dir))}")
    return 0


if __name__ == "__main__":
    run_main(main)
