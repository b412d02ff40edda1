"""
Which code trained a run: a probe of what the code computes, not of its bytes. For a run's
settings, today's model.py and train.py (and the noise floor's nudge) compute a few numbers at
a short length on the CPU: the loss estimate at initialisation, then after eight AdamW steps at
the peak lr the loss estimate and the whole-split loss over a few windows, and the schedule's
mean lr. (Swapping one LayerNorm for RMSNorm moves the second by 4e-3; another thread count
moved nothing at that precision.)
Another CPU rounds their last digits; a comment or a rename changes nothing; an edit to what the
model computes or how it trains moves them far more. A run's folder keeps the probe of the code
that trained it (probe.json, copied into summary.json); compare.py reuses a run, or a
calibration, only where today's probe is the same at the precision the project prints (1e-4).
What it cannot see: an edit inside train.py's loop itself, or on a GPU's code path alone.
"""
import hashlib
import json
import os
from contextlib import nullcontext

import torch

import data
import train
from configurator import defaults
from model import GPT, GPTConfig

from .nudged import nudge

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = ("model.py", "train.py", "data.py", "configurator.py", "lab/nudged.py")
TOLERANCE = 1e-4  # the precision the project prints losses at


def probe(settings):
    """The probe's numbers for a run's settings (a dict of train.py's settings, and nudge)."""
    cfg = defaults(train.SETTINGS, **{k: v for k, v in settings.items() if k in train.SETTINGS})
    cfg.batch_size, cfg.block_size = 4, min(cfg.block_size, 32)  # short: seconds at any size
    data_dir = data.dataset_dir(cfg.dataset)
    meta = data.load_meta(data_dir)
    shards = {s: [data.read_shard(p) for p in data.list_shards(data_dir, s)[:1]]
              for s in ("train", "val")}
    amp = (nullcontext(), torch.amp.GradScaler("cpu", enabled=False))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = GPTConfig.from_dict({**vars(cfg), "vocab_size": data.padded_vocab(meta)})
        model = GPT(config)
        if config.value_mode != "vanilla":
            train.start_like_vanilla(model, 0)
        if settings.get("nudge"):
            nudge(model, settings["nudge"])
        optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                               (cfg.beta1, cfg.beta2), cfg.lambda_lr_scale)
        batches = data.Batches(shards["train"], 4, cfg.block_size, 0, "train")
        fixed = {"val": data.Batches(shards["val"], 4, cfg.block_size, 1234, "val")}
        start = train.estimate_loss(model, fixed, 1, nullcontext())["val"]
        for group in optimizer.param_groups:  # the peak lr: where the code shows what it does
            group["lr"] = cfg.learning_rate * group["lr_scale"]
        for _ in range(8):
            train.training_step(model, optimizer, batches, 1, cfg.grad_clip, amp)
        stepped = train.estimate_loss(model, fixed, 1, nullcontext())["val"]
        few = [shards["val"][0][:8 * cfg.block_size + 1]]
        whole = train.full_split_loss(model, few, cfg, nullcontext())[0]
    steps = max(cfg.max_iters, 1)
    return {"start": start, "stepped": stepped, "whole_split": whole,
            "mean_lr": sum(train.get_lr(it, cfg) for it in range(steps)) / steps}


def same(a, b):
    """Whether two probes are of the same code: every number alike at the printed precision."""
    return a is not None and b is not None and a.keys() == b.keys() and all(
        abs(a[k] - b[k]) <= TOLERANCE * max(1.0, abs(a[k])) for k in a)


def differs(a, b):
    """'the probe differs (stepped 5.4321 there, 5.4389 now)', or 'it has no probe'."""
    if a is None:
        return "it has no probe (trained before runs recorded their code)"
    if b is None:
        return "today's code fails its probe (a bug: its own run shows where)"
    keys = [k for k in b if k not in a or abs(a[k] - b[k]) > TOLERANCE * max(1.0, abs(b[k]))]
    return "the probe differs (" + ", ".join(
        f"{k} {a.get(k, float('nan')):.4f} there, {b[k]:.4f} now" for k in keys[:2]) + ")"


def code_hash():
    """The bytes of the code the probe runs: the cache below is keyed by them."""
    digest = hashlib.sha256()
    for name in CODE:
        with open(os.path.join(ROOT, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def settings_key(settings):
    return json.dumps({k: v for k, v in sorted(settings.items())
                       if k not in ("seed", "out_dir", "device", "dtype", "compile")})


class Probes:
    """Today's probe per run setting, computed once (a few seconds each) and kept in
    root/probes.json for as long as the code's bytes stay the same, so the same command again
    finishes in seconds."""

    def __init__(self, root, force=False):
        self.path, self.code = os.path.join(root, "probes.json"), code_hash()
        self.force = force  # reuse runs of other code all the same (--reuse_other_code)
        try:
            with open(self.path) as f:
                kept = json.load(f)
        except (OSError, ValueError):
            kept = {}
        self.known = kept.get(self.code, {})

    def __call__(self, settings):
        key = settings_key(settings)
        if key not in self.known:
            try:
                self.known[key] = probe(settings)
            except Exception:  # a bug in today's code: its run shows where (run_grid's FAILED)
                return None
            if os.path.isdir(os.path.dirname(self.path) or "."):
                with data.atomic_write(self.path, "w") as f:
                    json.dump({self.code: self.known}, f)
        return self.known[key]
