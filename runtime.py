"""
What the scripts share besides the model and the data: the device and dtype a run computes in,
the GPU's peak FLOP/s (for MFU), and checkpoints (written atomically, read with a check). The lock
that keeps a second run out of a folder is shards.hold_lock: prepare.py takes it too, and
prepare.py does not import torch.
"""
import contextlib
import errno
import os
from contextlib import nullcontext

import torch

CHECKPOINT_FORMAT = "value-residual-gpt/1"  # train.py writes it; load_checkpoint checks it


def setup_device(device="auto", dtype="auto"):
    """(device, dtype name, autocast context) from the --device/--dtype settings, or a one-line
    error naming the setting. auto: cuda > mps > cpu; bfloat16 on GPUs that have it, else float32.
    Weights stay float32; bf16/fp16 is compute under autocast."""
    if device == "auto":
        device = ("cuda" if torch.cuda.is_available()
                  else "mps" if torch.backends.mps.is_available() else "cpu")
    kind = device.split(":")[0]
    if kind not in ("cpu", "cuda", "mps") or (kind != "cuda" and ":" in device):
        raise ValueError(f"--device={device}: use auto, cpu, cuda, cuda:N or mps")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device={device}: this torch sees no CUDA GPU; "
                             f"use --device=cpu (or auto)")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise ValueError(f"--device={device}: there are {torch.cuda.device_count()} "
                             f"CUDA devices (cuda:0 ...)")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device=mps: Apple's MPS backend is not available here; "
                         "use --device=cpu (or auto)")
    if dtype == "auto":
        dtype = "bfloat16" if kind == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype={dtype}: use auto, float32, bfloat16 or float16")
    if dtype == "bfloat16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype=bfloat16: {torch.cuda.get_device_name(device)} has no bfloat16; "
                         f"use --dtype=float16 or float32")
    if dtype == "float16" and kind == "cpu":
        raise ValueError("--dtype=float16 needs a GPU (CPU autocast supports bfloat16); "
                         "use float32 or bfloat16")
    autocast = (nullcontext() if dtype == "float32"
                else torch.autocast(kind, dtype=getattr(torch, dtype)))
    return device, dtype, autocast


# Dense bf16 tensor-core peak FLOP/s per GPU, matched against torch's device name longest name
# first ("H100 NVL" before "H100"). An unknown GPU gets no MFU rather than a wrong one. Hopper:
# NVIDIA's H100/H200 datasheets give bf16 with sparsity, twice the dense rate: SXM 1,979 (dense
# 989.4 in the Hopper whitepaper), NVL 1,671 per GPU, H100 PCIe 1,513. The SXM parts report as
# e.g. "NVIDIA H100 80GB HBM3" and "NVIDIA H200".
GPU_PEAK_BF16_FLOPS = {
    "H100 NVL": 835e12, "H200 NVL": 835e12, "H100 PCIe": 756e12,
    "H100": 989.4e12, "H200": 989.4e12, "GH200": 989.4e12,
    "A100": 312e12, "A10G": 70e12, "A10": 125e12, "L40S": 362e12, "L4": 121e12,
    "RTX 4090": 165e12, "RTX 3090": 71e12, "RTX A6000": 155e12, "V100": 125e12, "T4": 65e12}


def gpu_peak_flops(device_name):
    """Peak bf16 FLOP/s for a name like 'NVIDIA H200', or None when unknown."""
    for name in sorted(GPU_PEAK_BF16_FLOPS, key=len, reverse=True):
        if name in device_name:
            return GPU_PEAK_BF16_FLOPS[name]
    return None


# ---- checkpoints ----

class DiskFull(OSError):
    """The disk filled up under a checkpoint or the log: train.py prints it as one line."""


def disk_full(error):
    """Whether error, or one it arose from, is the OS saying the disk (or quota) is full."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False


def save_checkpoint(path, checkpoint):
    """Write to a temporary file, then rename: a crash mid-write never leaves
    a truncated ckpt.pt, and a failed write removes its temporary file."""
    tmp = path + ".tmp"
    try:
        # a Python file, not the path: torch's own writer reports a full disk as an iostream error
        with open(tmp, "wb") as f:
            torch.save(checkpoint, f)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if disk_full(e):
            raise DiskFull(errno.ENOSPC, f"no space left on device while saving {path}") from None
        raise


def load_checkpoint(path, map_location="cpu"):
    """train.py's checkpoint dict (weights without torch.compile's prefix), or a one-line error."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}: train one first, "
                                f"e.g. python train.py --out_dir={os.path.dirname(path) or '.'}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} is not a readable torch checkpoint "
                         f"({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a checkpoint of this project "
                         f"(expected format {CHECKPOINT_FORMAT})")
    ckpt["model"] = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    return ckpt
