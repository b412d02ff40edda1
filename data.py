"""The files every script shares: token shards, dataset folders, tokenizers and checkpoints.

A dataset is a folder data/<name>/ of shards and meta.json (the tokenizer; each shard's file,
split, token count and sha256), or of llm.c's shards alone. A shard is in llm.c's format (its
dev/data/data_common.py): 256 int32 (magic, version, count), then uint16 or uint32 tokens.
"""
import contextlib
import glob
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

from configurator import UserError

DATA_ROOT = "data"
DEFAULT_DATASET = "shakespeare_byte"  # train.py's default: what `python prepare.py` writes
CHECKPOINT_FORMAT = "value-residual-gpt/2"  # train.py writes it; load_checkpoint checks it
HEADER_INTS = 256  # the header: 256 int32 = 1024 bytes
HEADERS = {(20240520, 1): np.dtype("<u2"), (20240801, 7): np.dtype("<u4")}  # (magic, version)


class DataError(UserError):
    """Missing or bad data: one line naming the file and the fix."""


# ---- tokenizers: bytes (nothing to download), or any of tiktoken's encodings ----

class ByteTokenizer:
    """UTF-8 bytes plus one end-of-text id."""
    name, vocab_size, eot = "byte", 257, 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def encode_batch(self, texts):
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def token_bytes(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        return ids[(ids >= 0) & (ids < 256)].astype(np.uint8).tobytes()  # end-of-text: no bytes

    def decode(self, ids):
        return self.token_bytes(ids).decode("utf-8", "replace")


class TiktokenTokenizer:
    def __init__(self, enc):
        self.enc, self.name, self.vocab_size, self.eot = enc, enc.name, enc.n_vocab, enc.eot_token

    def encode(self, text):  # ordinary: a literal "<|endoftext|>" in web text is just text
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts):  # in threads: tiktoken's Rust core runs without the GIL
        return [np.asarray(ids, dtype=np.uint32)
                for ids in self.enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)]

    def token_bytes(self, ids):
        ids = [int(i) for i in ids if 0 <= i < self.vocab_size]  # not the model's padding rows
        with contextlib.suppress(KeyError):  # all at once in tiktoken's Rust core ...
            return self.enc.decode_bytes(ids)
        parts = []  # ... unless an id falls between the encoding's special tokens: skip it
        for i in ids:
            with contextlib.suppress(KeyError):
                parts.append(self.enc.decode_single_token_bytes(i))
        return b"".join(parts)

    def decode(self, ids):
        return self.token_bytes(ids).decode("utf-8", "replace")


def tiktoken_encoding(name):
    import tiktoken  # the only place that loads BPE files (tests swap it for an offline copy)
    return tiktoken.get_encoding(name)


def get_tokenizer(name):
    if name == "byte":
        return ByteTokenizer()
    try:
        import tiktoken
    except ImportError:
        raise DataError(f"tokenizer {name!r} needs tiktoken: pip install tiktoken, or use "
                        f"--tokenizer=byte") from None
    if name not in tiktoken.list_encoding_names():
        raise DataError(f"unknown tokenizer {name!r}: choose byte or one of "
                        f"{', '.join(tiktoken.list_encoding_names())}")
    try:
        return TiktokenTokenizer(tiktoken_encoding(name))
    except Exception as e:
        raise DataError(f"could not load tiktoken's {name!r} ({type(e).__name__}): tiktoken "
                        f"downloads its BPE files once; connect once, or set TIKTOKEN_CACHE_DIR "
                        f"to a copy of that cache, or use --tokenizer=byte") from None


# ---- a shard: writing and reading ----

def shard_dtype(vocab_size):
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")  # ids < 65536: uint16


def write_shard(path, tokens, vocab_size):
    """Writes tokens as a shard (whole or not at all); returns its sha256."""
    dtype = shard_dtype(vocab_size)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = *next(h for h, d in HEADERS.items() if d == dtype), len(tokens)
    body = np.ascontiguousarray(tokens, dtype=dtype).tobytes()
    with atomic_write(path) as f:
        f.write(header.tobytes() + body)
    return hashlib.sha256(header.tobytes() + body).hexdigest()


def read_shard(path, vocab_size=None):
    """A shard's tokens (ours or llm.c's), memory-mapped, with its header checked."""
    size = os.path.getsize(path)
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if len(header) < HEADER_INTS or (int(header[0]), int(header[1])) not in HEADERS:
        raise DataError(f"{path} is not a token shard (no llm.c header): delete it and run "
                        f"prepare.py again")
    dtype, n = HEADERS[int(header[0]), int(header[1])], int(header[2])
    if n <= 0 or size != HEADER_INTS * 4 + n * dtype.itemsize:
        raise DataError(f"{path}: its header says {n:,} tokens but the file has {size:,} bytes "
                        f"(truncated?): run prepare.py again")
    tokens = np.memmap(path, dtype=dtype, mode="r", offset=HEADER_INTS * 4, shape=(n,))
    # a cheap check that the model can read these ids: the first million tokens
    if vocab_size is not None and int(tokens[:1 << 20].max()) >= vocab_size:
        raise DataError(f"{path}: token id {int(tokens[:1 << 20].max())} >= vocab size "
                        f"{vocab_size}: made with another tokenizer? run prepare.py again")
    return tokens


# ---- a dataset folder ----

def dataset_dir(name):
    """train.py's --dataset: a name means data/<name>; a path (with a /) is itself."""
    return name if os.sep in name or (os.altsep and os.altsep in name) else os.path.join(
        DATA_ROOT, name)


def no_data(data_dir, problem):
    """The error for a missing dataset: what there is, and the prepare.py command for its name."""
    root = os.path.dirname(os.path.normpath(data_dir)) or "."
    have = sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "meta.json"))
                  ) if os.path.isdir(root) else []
    there = (f"prepared in {root}/: {', '.join(have)}; pick one with --dataset=NAME" if have
             else f"nothing is prepared in {root}/ yet")
    name = os.path.basename(os.path.normpath(data_dir))
    tokenizer = next((t for t in ("byte", "gpt2", "r50k_base", "p50k_base", "cl100k_base",
                                  "o200k_base") if name.endswith("_" + t)), None)
    dataset = name[:-len(tokenizer) - 1] if tokenizer else name
    how = "python prepare.py" + {"shakespeare": "", "tinyshakespeare": " --dataset=tinyshakespeare",
                                 "fineweb_edu": " --dataset=fineweb_edu"}.get(
        dataset, f" --input=<your text> --dataset={dataset}") + (
        "" if tokenizer in ("byte", None) else f" --tokenizer={tokenizer}") + (
        "" if os.path.normpath(root) == DATA_ROOT else f" --out_root={root}")
    return DataError(f"{problem}: run {how} ({there})")


def load_meta(data_dir):
    """meta.json of a dataset; for llm.c's shards (no meta.json) what they are: GPT-2 tokens."""
    put_back(data_dir)
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        return {"tokenizer": "gpt2", "vocab_size": 50257, "eot": 50256}
    try:
        with open(path) as f:
            meta = json.load(f)
        int(meta["vocab_size"]), [(s["file"], s["split"]) for s in meta["shards"]]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path} is unreadable ({type(e).__name__}: {e}): run prepare.py "
                        f"again") from None
    return meta


def list_shards(data_dir, split):
    """One split's shard paths, in order: those meta.json names, or else every *_<split>_*.bin."""
    put_back(data_dir)
    if not os.path.isdir(data_dir):
        raise no_data(data_dir, f"no dataset {data_dir}")
    if not os.path.exists(os.path.join(data_dir, "meta.json")):
        paths = sorted(glob.glob(os.path.join(data_dir, f"*_{split}_*.bin")))
    else:
        paths = [os.path.join(data_dir, s["file"]) for s in load_meta(data_dir)["shards"]
                 if s["split"] == split]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise DataError(f"{missing[0]} is missing, though {data_dir}/meta.json names it: "
                            f"run prepare.py again")
    if not paths:
        raise no_data(data_dir, f"no {split} shards in {data_dir}")
    return paths


def prepare_default(data_dir, wait=False):
    """The default dataset on first use, by `python prepare.py` (wait: torchrun's other ranks)."""
    put_back(data_dir)
    for _ in range(600 if wait else 0):
        if os.path.exists(os.path.join(data_dir, "meta.json")):
            break
        time.sleep(1)
    if wait or os.path.exists(os.path.join(data_dir, "meta.json")):
        return
    print(f"{data_dir} is not prepared yet: running python prepare.py (once, offline)", flush=True)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prepare.py")
    if subprocess.run([sys.executable, script, "--quiet"]).returncode != 0:
        raise DataError("python prepare.py failed (see above); run it yourself to see why")


def put_back(data_dir):
    """A prepare.py killed mid-switch leaves no data_dir, but the old one as <tmp>.old: put back."""
    if not os.path.exists(data_dir):
        for old in dead_runs(data_dir):
            if old.endswith(".old"):
                with contextlib.suppress(OSError):  # another process put it back first
                    os.replace(old, data_dir)


def dead_runs(data_dir):
    """What killed prepare.py runs left beside data_dir: <name>.tmp<pid> (new) and its .old."""
    return [p for p in glob.glob(glob.escape(os.path.normpath(data_dir)) + ".tmp*")
            if not alive(p.rpartition(".tmp")[2].removesuffix(".old"))]


def alive(pid):
    try:
        os.kill(int(pid), 0)
        return True
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # someone else's process
        return True


def data_identity(data_dir):
    """What a checkpoint records of its data, so a resume sees a change: one sha256 of them all."""
    meta = load_meta(data_dir)
    parts = [f"{s['split']}:{s['sha256']}" for s in meta.get("shards", [])] or [
        f"{os.path.basename(p)}:{os.path.getsize(p)}"
        for split in ("train", "val") for p in list_shards(data_dir, split)]
    return {"dir": data_dir, "tokenizer": meta["tokenizer"],
            "train_tokens": meta.get("train_tokens"), "val_tokens": meta.get("val_tokens"),
            "sha256": hashlib.sha256("\n".join(parts).encode()).hexdigest()}


def describe_tokens(data):
    """'8,718 train + 641 val tokens' from data_identity()."""
    if data.get("train_tokens") is None:  # llm.c's shards: no counts recorded
        return f"shards {data['sha256'][:12]}"
    return f"{data['train_tokens']:,} train + {data['val_tokens']:,} val tokens"


# ---- writing a file whole, and reading a checkpoint ----

@contextlib.contextmanager
def atomic_write(path, mode="wb"):
    """with atomic_write(path) as f: write path.tmp, renamed over path: never half a file."""
    try:
        with open(path + ".tmp", mode) as f:
            yield f
        os.replace(path + ".tmp", path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        raise


def load_checkpoint(path, map_location="cpu"):
    """train.py's checkpoint dict, or a one-line error."""
    import torch  # here: prepare.py uses this module without torch
    if not os.path.isfile(path):
        raise DataError(f"no checkpoint at {path}: train one first, e.g. python train.py "
                        f"--out_dir={os.path.dirname(path) or '.'}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise DataError(f"{path} is not a readable torch checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise DataError(f"{path} is not a checkpoint of this version of train.py (format "
                        f"{CHECKPOINT_FORMAT}): train it again")
    return ckpt
