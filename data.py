"""What every script shares: tokenizers, token shards, batches, the device, checkpoints, logs.

A dataset is a folder data/<name>/ holding the shards and meta.json, which names them and their
tokenizer. A shard is in llm.c's format (its dev/data/data_common.py): 256 int32 of header
(magic, version, token count), then the tokens as uint16 (uint32 past 65,536 ids).
"""
import bisect
import contextlib
import itertools
import json
import os
import re
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from configurator import ConfigError, UserError

DATA_ROOT = "data"
DEFAULT_DATASET = "shakespeare_byte"  # train.py's default: what `python prepare.py` writes
CHECKPOINT_FORMAT = "value-residual-gpt/2"  # train.py writes it; load_checkpoint checks it
HEADERS = {(20240520, 1): np.dtype("<u2"), (20240801, 7): np.dtype("<u4")}  # (magic, version)


def plural(n, noun):  # '1 step', '1,200 steps'
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


class DataError(UserError):
    """Missing or bad data: one line naming the file and the fix."""


def get_tokenizer(name):
    """(name, vocab_size, eot, encode, decode): "byte" is UTF-8 bytes and one end-of-text id,
    with nothing to download; another name is one of tiktoken's encodings ("gpt2")."""
    if name == "byte":
        return SimpleNamespace(name="byte", vocab_size=257, eot=256,
                               encode=lambda text: list(text.encode("utf-8")),
                               decode=lambda ids: bytes(i for i in ids if i < 256).decode(
                                   "utf-8", errors="replace"))
    import tiktoken
    if name not in tiktoken.list_encoding_names():
        raise DataError(f"unknown tokenizer {name!r}: choose byte or one of "
                        f"{', '.join(tiktoken.list_encoding_names())}")
    try:
        enc = tiktoken_encoding(name)
    except Exception as e:  # no network for its BPE file
        raise DataError(f"could not load tiktoken's {name!r} ({type(e).__name__}): it downloads "
                        f"its BPE file once (or finds it in TIKTOKEN_CACHE_DIR); or use "
                        f"--tokenizer=byte") from None
    # encode_ordinary: a literal "<|endoftext|>" in a text is just text; decode skips the ids of
    # the model's padding rows (padded_vocab), which have no text
    return SimpleNamespace(name=enc.name, vocab_size=enc.n_vocab, eot=enc.eot_token,
                           encode=enc.encode_ordinary,
                           decode=lambda ids: enc.decode([i for i in ids if i < enc.n_vocab]))


def tiktoken_encoding(name):
    import tiktoken  # the only place that loads BPE files (tests swap it for an offline copy)
    return tiktoken.get_encoding(name)


def padded_vocab(meta):
    """The model's vocabulary for a dataset: its tokenizer's, rounded up to a multiple of 64 for
    faster matmuls (GPT-2's 50,257 to 50,304; the extra rows are never a target)."""
    return -(-meta["vocab_size"] // 64) * 64


# ---- shards and datasets ----

def write_shard(path, tokens, vocab_size):
    """tokens as a shard, written whole or not at all."""
    dtype = np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")
    header = np.zeros(256, dtype="<i4")
    header[:3] = *next(h for h, d in HEADERS.items() if d == dtype), len(tokens)
    with atomic_write(path) as f:
        f.write(header.tobytes() + np.ascontiguousarray(tokens, dtype=dtype).tobytes())


def read_shard(path, vocab_size=None):
    """A shard's tokens (ours or llm.c's), memory-mapped, with its header checked."""
    size, header = os.path.getsize(path), np.fromfile(path, dtype="<i4", count=256)
    if len(header) < 256 or (int(header[0]), int(header[1])) not in HEADERS:
        raise DataError(f"{path} is not a token shard (no llm.c header): prepare the data again")
    dtype, n = HEADERS[int(header[0]), int(header[1])], int(header[2])
    if n <= 0 or size != 1024 + n * dtype.itemsize:
        raise DataError(f"{path}: its header says {n:,} tokens but the file has {size:,} bytes "
                        f"(truncated?): prepare the data again")
    tokens = np.memmap(path, dtype=dtype, mode="r", offset=1024, shape=(n,))
    # a cheap check that the model can read these ids: the first million tokens
    if vocab_size is not None and int(tokens[:1 << 20].max()) >= vocab_size:
        raise DataError(f"{path}: token id {int(tokens[:1 << 20].max())} >= vocab size "
                        f"{vocab_size}: made with another tokenizer? prepare the data again")
    return tokens


def window(tokens, start, length):
    """length + 1 tokens from start, as int64: a model's input (all but the last) and targets
    (all but the first). The one place a window of a shard is cut."""
    return torch.from_numpy(tokens[start:start + length + 1].astype(np.int64))


def dataset_dir(name):
    """train.py's --dataset: a name means data/<name>; a path (with a /) is itself."""
    return name if os.sep in name or (os.altsep and os.altsep in name) else os.path.join(
        DATA_ROOT, name)


def load_meta(data_dir):
    """A dataset's meta.json (its tokenizer, vocab_size, eot and shards), checked."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        raise DataError(f"no dataset in {data_dir} (no meta.json): make it with python "
                        f"prepare.py, or FineWeb-Edu with python -m lab.fineweb")
    try:
        with open(path) as f:
            meta = json.load(f)
        int(meta["vocab_size"]), [(s["file"], s["split"]) for s in meta["shards"]]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path} is unreadable ({type(e).__name__}: {e}): prepare the data "
                        f"again") from None
    return meta


def list_shards(data_dir, split):
    """One split's shard paths, in the order meta.json names them."""
    paths = [os.path.join(data_dir, s["file"]) for s in load_meta(data_dir)["shards"]
             if s["split"] == split]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing or not paths:
        why = (f"{missing[0]} is missing, though {data_dir}/meta.json names it" if missing
               else f"no {split} shards in {data_dir}")
        raise DataError(f"{why}: prepare the data again")
    return paths


def load_dataset(name):
    """({"train": shards, "val": shards}, memory-mapped, and the dataset's meta.json)."""
    data_dir = dataset_dir(name)
    meta = load_meta(data_dir)
    return {s: [read_shard(p, meta["vocab_size"]) for p in list_shards(data_dir, s)]
            for s in ("train", "val")}, meta


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
            raise DataError(f"the {split} split's longest shard has "
                            f"{plural(max(map(len, shards)), 'token')}, fewer than a window needs "
                            f"(block_size {self.T} + 2): use a smaller --block_size, or more text")

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

# Dense 16-bit peak FLOP/s by card name, for MFU; longer names first ("H100 NVL" is no "H100").
PEAK_FLOPS = {"H100 NVL": 835e12, "H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12,
              "A100": 312e12, "A10G": 70e12, "A10": 125e12, "L40S": 362e12, "L4": 121e12,
              "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12}

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


def peak_flops(device, dtype):
    """A GPU's 16-bit peak FLOP/s, by its name; None on a CPU, in float32 or for another card."""
    card = torch.cuda.get_device_name(device) if device.startswith("cuda") else ""
    return next((f for name, f in PEAK_FLOPS.items() if dtype != "float32" and re.search(
        rf"(?<!\w){re.escape(name)}(?!\w)", card)), None)  # whole words: an "L40" is no "L4"


def join_processes(device, world):
    """Under torchrun: this process's device (LOCAL_RANK: its GPU), in DDP's process group."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # faster
    if world > 1:
        if device.startswith("cuda"):
            device = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return device


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

