"""What every script shares: token shards, datasets, tokenizers, batches, the device, checkpoints,
logs.

A dataset is a folder data/<name>/ holding meta.json (the tokenizer, and each shard's file, split,
token count and sha256) and the shards it names, or llm.c's shards alone. A shard is in llm.c's
format (its dev/data/data_common.py): 256 int32 (magic, version, count), then uint16 or uint32
tokens. meta.json is written last, whole, so a folder always holds one whole dataset.
"""
import bisect
import contextlib
import glob
import hashlib
import itertools
import json
import os

import numpy as np
import torch
import torch.distributed as dist

from configurator import ConfigError, UserError, plural

DATA_ROOT = "data"
DEFAULT_DATASET = "shakespeare_byte"  # train.py's default: what `python prepare.py` writes
CHECKPOINT_FORMAT = "value-residual-gpt/2"  # train.py writes it; load_checkpoint checks it
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


class TiktokenTokenizer(ByteTokenizer):
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
        parts = []  # ... unless an id has no bytes (between the ordinary and special tokens)
        for i in ids:
            with contextlib.suppress(KeyError):
                parts.append(self.enc.decode_single_token_bytes(i))
        return b"".join(parts)


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


def padded_vocab(meta):
    """The model's vocabulary for a dataset: its tokenizer's, rounded up to a multiple of 64 for
    faster matmuls (GPT-2's 50,257 to 50,304; the extra rows are never a target)."""
    return -(-meta["vocab_size"] // 64) * 64


# ---- a shard: writing and reading ----

def shard_dtype(vocab_size):
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")  # ids < 65536: uint16


def write_shard(path, tokens, vocab_size):
    """Writes tokens as a shard (whole or not at all); returns its sha256."""
    dtype = shard_dtype(vocab_size)
    header = np.zeros(256, dtype="<i4")
    header[:3] = *next(h for h, d in HEADERS.items() if d == dtype), len(tokens)
    body = header.tobytes() + np.ascontiguousarray(tokens, dtype=dtype).tobytes()
    with atomic_write(path) as f:
        f.write(body)
    return hashlib.sha256(body).hexdigest()


def read_shard(path, vocab_size=None):
    """A shard's tokens (ours or llm.c's), memory-mapped, with its header checked."""
    size, header = os.path.getsize(path), np.fromfile(path, dtype="<i4", count=256)
    if len(header) < 256 or (int(header[0]), int(header[1])) not in HEADERS:
        raise DataError(f"{path} is not a token shard (no llm.c header): delete it and run "
                        f"prepare.py again")
    dtype, n = HEADERS[int(header[0]), int(header[1])], int(header[2])
    if n <= 0 or size != 1024 + n * dtype.itemsize:
        raise DataError(f"{path}: its header says {n:,} tokens but the file has {size:,} bytes "
                        f"(truncated?): run prepare.py again")
    tokens = np.memmap(path, dtype=dtype, mode="r", offset=1024, shape=(n,))
    # a cheap check that the model can read these ids: the first million tokens
    if vocab_size is not None and int(tokens[:1 << 20].max()) >= vocab_size:
        raise DataError(f"{path}: token id {int(tokens[:1 << 20].max())} >= vocab size "
                        f"{vocab_size}: made with another tokenizer? run prepare.py again")
    return tokens


def window(tokens, start, length):
    """length + 1 tokens from start, as int64: a model's input (all but the last) and targets
    (all but the first). The one place a window of a shard is cut."""
    return torch.from_numpy(tokens[start:start + length + 1].astype(np.int64))


# ---- a dataset folder ----

def dataset_dir(name):
    """train.py's --dataset: a name means data/<name>; a path (with a /) is itself."""
    return name if os.sep in name or (os.altsep and os.altsep in name) else os.path.join(
        DATA_ROOT, name)


def load_meta(data_dir):
    """meta.json of a dataset; for llm.c's shards (no meta.json) what they are: GPT-2 tokens."""
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
        raise DataError(f"no {split} shards in {data_dir}: make them with python prepare.py "
                        f"(its --help says how), or name another --dataset")
    return paths


def data_identity(data_dir):
    """What a checkpoint records of its data, so a resume sees a change: one sha256 of them all."""
    meta = load_meta(data_dir)
    parts = [f"{s['split']}:{s['sha256']}" for s in meta.get("shards", [])] or [
        f"{os.path.basename(p)}:{os.path.getsize(p)}"
        for split in ("train", "val") for p in list_shards(data_dir, split)]
    return {"dir": data_dir, "tokenizer": meta["tokenizer"],
            "train_tokens": meta.get("train_tokens"), "val_tokens": meta.get("val_tokens"),
            "sha256": hashlib.sha256("\n".join(parts).encode()).hexdigest()}


class Batches:
    """(x, y) batches of random windows from a split's shards, by a generator a checkpoint keeps.
    Windows of every shard are numbered as one range; bisect finds the shard of a draw."""

    def __init__(self, shards, batch_size, block_size, seed, split, device="cpu"):
        self.shards, self.B, self.T, self.device = shards, batch_size, block_size, device
        self.seed, self.generator = seed, torch.Generator().manual_seed(seed)
        # A shard's last window is never drawn, one short of nanoGPT: a fix would change every
        # committed record's batches.
        self.windows = [max(len(s) - self.T - 1, 0) for s in shards]
        self.ends = list(itertools.accumulate(self.windows))
        if self.ends[-1] < 1:
            longest = max(len(s) for s in shards)
            fix = f"use --block_size={longest - 2} or less, or " if longest > 2 else ""
            raise DataError(f"the {split} split's longest shard has {plural(longest, 'token')}, "
                            f"fewer than one window needs (block_size {self.T} + 2): {fix}"
                            f"prepare more text")

    def next(self):
        rows = []
        for i in torch.randint(self.ends[-1], (self.B,), generator=self.generator).tolist():
            s = bisect.bisect_right(self.ends, i)  # window i starts in shard s
            rows.append(window(self.shards[s], i - (self.ends[s] - self.windows[s]), self.T))
        rows = torch.stack(rows)
        if self.device.startswith("cuda"):  # as nanoGPT: from pinned memory, the copy to the GPU
            rows = rows.pin_memory().to(self.device, non_blocking=True)  # runs beside its work
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def reset(self):
        self.generator.manual_seed(self.seed)


# ---- the device every script computes on ----

def setup_device(device="auto", dtype="auto"):
    """(device, dtype name, autocast): weights stay float32. auto: cuda > mps > cpu; bfloat16 on
    GPUs that have it natively, float16 on older ones (T4, V100: loss scaling), else float32."""
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    device = ("cuda" if cuda else "mps" if mps else "cpu") if device == "auto" else device
    kind, _, index = device.partition(":")
    if not {"cpu": True, "cuda": cuda, "mps": mps}.get(kind) or (index and (
            kind != "cuda" or not index.isdigit() or int(index) >= torch.cuda.device_count())):
        raise ConfigError(f"--device={device}: not here; use auto, cpu, cuda, cuda:N "
                          f"({torch.cuda.device_count()} CUDA GPUs here) or mps")
    # is_bf16_supported() alone also says yes where bf16 is only emulated (slowly: T4, V100)
    bf16 = kind == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    if dtype == "auto":
        dtype = "bfloat16" if bf16 else "float16" if kind == "cuda" else "float32"
    if dtype == "bfloat16" and kind == "cuda" and not bf16:
        raise ConfigError("--dtype=bfloat16: this GPU has no native bfloat16; use float16 or auto")
    if dtype not in ("float32", "bfloat16", "float16"):  # (float16 on a CPU: slow, but it runs)
        raise ConfigError(f"--dtype={dtype}: use auto (it picks), float32, bfloat16 (CPU, A100, "
                          f"H100) or float16 (T4, V100)")
    return device, dtype, (contextlib.nullcontext() if dtype == "float32"
                           else torch.autocast(kind, dtype=getattr(torch, dtype)))


# ---- files written whole: checkpoints and logs ----

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


def save_checkpoint(run, iter_num, model, optimizer, batches):
    """Called by every process at a step boundary; rank 0 writes all an exact resume needs: the
    run's record, weights, AdamW's moments, each process's random numbers and batch stream."""
    run["iter_num"], out_dir = iter_num, run["config"]["out_dir"]
    this_process = {"data": {"generator": batches.generator.get_state()},
                    "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None}
    states = [this_process] * run["world"]
    if run["world"] > 1:
        dist.all_gather_object(states, this_process)
    if int(os.environ.get("RANK", 0)) == 0:
        with atomic_write(os.path.join(out_dir, "ckpt.pt")) as f:
            torch.save({**run, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "rank_states": states}, f)
        write_log(out_dir, run["log"])  # the log of exactly this checkpoint's steps


def restore_rng(state, batches):
    """This process's random numbers and place in its batch stream, from its checkpoint."""
    batches.generator.set_state(state["data"]["generator"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def load_checkpoint(path):
    """train.py's checkpoint dict, on the CPU (sample.py moves only the model), or one line."""
    if not os.path.isfile(path):
        raise DataError(f"no checkpoint at {path}: train one first, e.g. python train.py "
                        f"--out_dir={os.path.dirname(path) or '.'}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise DataError(f"{path} is not a readable torch checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise DataError(f"{path} is not a checkpoint of this version of train.py (format "
                        f"{CHECKPOINT_FORMAT}): train it again")
    return ckpt


def write_log(out_dir, entries):
    """out_dir/log.jsonl, whole: written with each checkpoint and at the end, so an --overwrite
    keeps the old run's log until its own first checkpoint replaces the old one."""
    with atomic_write(os.path.join(out_dir, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(entry) + "\n" for entry in entries)
