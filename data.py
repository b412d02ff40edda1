"""
What the scripts share: tokenizers, shards and batches, the device, checkpoints, logs.

A dataset is a folder data/<name>/ of shards and a meta.json that names them and their
tokenizer. A shard is in llm.c's format: a header of 256 int32 (magic, version, number
of tokens), then the tokens as uint16 (uint32 past 65,536 ids).
"""
import bisect
import contextlib
import itertools
import json
import math
import os
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from configurator import ConfigError, UserError

DATA_ROOT = "data"
DEFAULT_DATASET = "shakespeare_byte"  # what `python prepare.py` writes
CHECKPOINT_FORMAT = "value-residual-gpt/3"  # what load_checkpoint reads
# llm.c's shard headers, (magic, version), and the dtype of their tokens
HEADERS = {(20240520, 1): np.dtype("<u2"), (20240801, 7): np.dtype("<u4")}


class DataError(UserError):
    """Missing or bad data: one line that names the file and the fix."""


def get_tokenizer(name):
    """The tokenizer called name: "byte" (UTF-8 bytes, and 256 for end of text), or
    one of tiktoken's encodings, such as "gpt2"."""
    if name == "byte":
        return SimpleNamespace(name="byte", vocab_size=257, eot=256,
                               encode=lambda text: list(text.encode("utf-8")),
                               decode=lambda ids: bytes(i for i in ids if i < 256).decode(
                                   "utf-8", errors="replace"))
    import tiktoken  # here, as the byte tokenizer needs none
    try:
        enc = tiktoken.get_encoding(name)
    except Exception as e:  # an unknown name, or no network to fetch its file
        raise DataError(f"cannot load the tokenizer {name!r} ({type(e).__name__}): use byte, "
                        f"or gpt2 (tiktoken downloads it once)") from None
    # encode_ordinary reads a literal "<|endoftext|>" in a text as text. decode skips
    # the padding ids of the model's vocabulary (padded_vocab), which have no text.
    return SimpleNamespace(name=enc.name, vocab_size=enc.n_vocab, eot=enc.eot_token,
                           encode=enc.encode_ordinary,
                           decode=lambda ids: enc.decode([i for i in ids if i < enc.n_vocab]))


def padded_vocab(meta):
    # The model's vocabulary for a dataset: its tokenizer's, padded to a multiple of
    # 64 for faster matmuls (GPT-2's 50,257 to 50,304); no target is a padding id.
    return math.ceil(meta["vocab_size"] / 64) * 64


# ---- shards and datasets ----

def read_shard(path):
    """A shard's tokens (ours or llm.c's), memory-mapped, its header checked."""
    size = os.path.getsize(path) if os.path.isfile(path) else 0
    header = np.fromfile(path, dtype="<i4", count=3) if size >= 1024 else [0, 0, 0]
    dtype, n = HEADERS.get((header[0], header[1])), int(header[2])
    if not dtype or n <= 0 or size != 1024 + n * dtype.itemsize:
        raise DataError(f"{path} is missing or not a whole token shard: prepare the data again")
    return np.memmap(path, dtype=dtype, mode="r", offset=1024, shape=(n,))


def window(tokens, start, length):
    # length + 1 tokens from start: a model's input (all but the last) and its
    # targets (all but the first). The one place where a shard is cut.
    return torch.from_numpy(tokens[start:start + length + 1].astype(np.int64))


def dataset_dir(name):  # a name means data/<name>; an absolute path stays itself
    return os.path.join(DATA_ROOT, name)


def load_meta(data_dir):
    """A dataset's meta.json: its tokenizer, vocab_size, eot and shards."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        raise DataError(f"no dataset in {data_dir}: make one with python prepare.py")
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError:  # cut short, or not JSON
        raise DataError(f"{path} is unreadable: prepare the data again") from None


def list_shards(data_dir, split):  # one split's shard files, in meta.json's order
    return [os.path.join(data_dir, s["file"]) for s in load_meta(data_dir)["shards"]
            if s["split"] == split]


def load_dataset(name):
    """The train and val shards of a dataset, memory-mapped, and its meta.json."""
    meta = load_meta(dataset_dir(name))
    return {split: [read_shard(path) for path in
                    list_shards(dataset_dir(name), split)] for split in ("train", "val")}, meta


class Batches:
    """Batches (x, y) of random windows of a split's shards, drawn by a generator of
    their own, which a checkpoint keeps. All the shards' windows are numbered as one."""

    def __init__(self, shards, batch_size, block_size, seed, device="cpu"):
        self.shards, self.B, self.T, self.device = shards, batch_size, block_size, device
        self.seed, self.generator = seed, torch.Generator().manual_seed(seed)
        # A shard's last window is never drawn (nanoGPT draws it): the recorded runs were
        # trained so, and drawing it would change every batch.
        self.windows = [max(len(s) - block_size - 1, 0) for s in shards]
        self.ends = list(itertools.accumulate(self.windows))
        if sum(self.windows) < 1:
            raise DataError(f"no shard holds a window of block_size {block_size} + 2 tokens: "
                            f"use a smaller --block_size, or more text")

    def next(self):
        rows = []
        for i in torch.randint(self.ends[-1], (self.B,), generator=self.generator).tolist():
            s = bisect.bisect_right(self.ends, i)  # window i starts in shard s
            start = i - (self.ends[s] - self.windows[s])  # and there at start
            rows.append(window(self.shards[s], start, self.T))
        rows = torch.stack(rows)
        if self.device.startswith("cuda"):  # from pinned memory, the copy runs alongside
            rows = rows.pin_memory()
        rows = rows.to(self.device, non_blocking=True)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def reset(self):
        self.generator.manual_seed(self.seed)


# ---- the device ----

def setup_device(device="auto", dtype="auto"):
    """The device, the dtype and its autocast (the weights stay float32). auto: cuda,
    else mps, else cpu; bfloat16 on GPUs that have it, else float16 (T4, V100)."""
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if device == "auto":
        device = "cuda" if cuda else "mps" if mps else "cpu"
    here = (["cpu"] + ["cuda"] * cuda + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
            + ["mps"] * mps)
    if device not in here:
        raise ConfigError(f"--device={device}: not here; use auto or {', '.join(here)}")
    kind = device.split(":")[0]
    # is_bf16_supported() alone also says yes where bfloat16 is emulated (T4, V100).
    bf16 = kind == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    if dtype == "auto":
        dtype = "bfloat16" if bf16 else "float16" if kind == "cuda" else "float32"
    if dtype not in ("float32", "bfloat16", "float16") or (
            dtype == "bfloat16" and kind == "cuda" and not bf16):
        raise ConfigError(f"--dtype={dtype}: use auto, float32, float16 or (not on a T4 or "
                          f"V100) bfloat16")
    if dtype == "float32":
        return device, dtype, contextlib.nullcontext()
    return device, dtype, torch.autocast(kind, dtype=getattr(torch, dtype))


def join_processes(device, world):
    # Under torchrun: this process's GPU (LOCAL_RANK), in DDP's process group.
    # TF32: float32 matmuls on a GPU's tensor cores, much faster at a little precision
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if world > 1:
        if device.startswith("cuda"):
            device = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return device


# ---- files written whole: checkpoints and logs ----

@contextlib.contextmanager
def atomic_write(path, mode="wb"):
    """with atomic_write(path) as f: f is path.tmp, renamed to path once whole."""
    try:
        with open(path + ".tmp", mode) as f:
            yield f
        os.replace(path + ".tmp", path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        raise


def save_checkpoint(run, model, optimizer, scaler, batches):
    """Called by every process; rank 0 writes what an exact resume needs: the run's
    record and log, the weights, AdamW's moments, the loss scale, and each process's
    random numbers and place in its batches."""
    this_process = {"batches": batches.generator.get_state(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None}
    states = [this_process] * run["world"]
    if run["world"] > 1:
        dist.all_gather_object(states, this_process)
    if int(os.environ.get("RANK", 0)) == 0:
        out_dir = run["config"]["out_dir"]
        with atomic_write(os.path.join(out_dir, "ckpt.pt")) as f:
            torch.save({**run, "format": CHECKPOINT_FORMAT, "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                        "rank_states": states}, f)
        write_log(out_dir, run["log"])


def restore_rng(state, batches):
    # This process's random numbers and place in its batches, from its checkpoint.
    batches.generator.set_state(state["batches"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def load_checkpoint(path):
    """train.py's checkpoint, on the CPU (sample.py moves the model alone to a GPU)."""
    if not os.path.isfile(path):
        raise DataError(f"no checkpoint at {path}: train one first, e.g. python train.py "
                        f"--out_dir={os.path.dirname(path) or '.'}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise DataError(f"{path} is not a readable checkpoint ({type(e).__name__})") from None
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise DataError(f"{path} was written by another version of train.py: train it again")
    return ckpt


def write_log(out_dir, entries):
    # out_dir/log.jsonl, written whole beside each checkpoint: a log always goes with
    # the checkpoint of the same steps.
    with atomic_write(os.path.join(out_dir, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(entry) + "\n" for entry in entries)
