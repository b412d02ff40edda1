"""
Train a GPT in any value mode on token shards, on one GPU, a laptop CPU, or several GPUs.

    python train.py                                   # the CPU quickstart (prepares data if needed)
    python train.py --value_mode=vanilla              # any setting: --key=value (--help lists them)
    python train.py config/gpt2_124m.py               # a preset, then overrides
    python train.py --resume --max_iters=8000         # continue out_dir/ckpt.pt exactly,
                                                      # then further
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py   # 8 GPUs, same step

gradient_accumulation_steps, when given, counts micro-steps over all ranks (nanoGPT's meaning):
under torchrun each rank runs its share, so a step has the same tokens on 1 GPU or 8 (the count
must divide). Left at 0, each rank runs one micro-step, on any number of ranks.

Every log line also goes to out_dir/log.jsonl; checkpoints are written atomically to
out_dir/ckpt.pt.
The settings and their defaults live in configurator.py (TRAIN_SETTINGS).
"""
import contextlib
import dataclasses
import errno
import json
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shards
from configurator import (ACTIONS, TRAIN_SETTINGS, ConfigError, defaults_of, given_keys,
                          parse_args, plural)
from model import GPT, GPTConfig
from runtime import (CHECKPOINT_FORMAT, DiskFull, disk_full, gpu_peak_flops, load_checkpoint,
                     save_checkpoint, setup_device)

DEFAULTS = defaults_of(TRAIN_SETTINGS)
# the settings that shape the weights: a resumed run cannot change them (dropout it can)
MODEL_KEYS = {f.name for f in dataclasses.fields(GPTConfig)} - {"dropout", "vocab_size"}
USAGE = "usage: python train.py [config/preset.py ...] [--key=value ...]"
# how a run ended, for the shell and for compare.py (a diverged run is a result there, not a crash)
EXIT_CODES = {"done": 0, "interrupted": 130, "diverged": 3}


def check_settings(cfg):
    """Impossible values are one-line errors naming the setting."""
    for key in ("batch_size", "block_size", "eval_iters", "eval_interval", "log_interval",
                "n_layer", "n_head", "n_embd"):
        if cfg[key] < 1:
            raise ConfigError(f"--{key}={cfg[key]}: must be at least 1")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "gradient_accumulation_steps"):
        if cfg[key] < 0:
            raise ConfigError(f"--{key}={cfg[key]}: must be 0 or more")
    if not 0 <= cfg["min_lr"] <= cfg["learning_rate"]:
        raise ConfigError(f"--min_lr={cfg['min_lr']}: must be between 0 and "
                          f"learning_rate ({cfg['learning_rate']})")
    GPTConfig.from_dict(cfg)  # a bad model setting fails now, before any data is touched


def warmup_steps(cfg):
    """warmup_iters, unless it would fill the whole schedule: then a tenth of it
    (a short run still decays)."""
    decay_end = cfg["lr_decay_iters"] or cfg["max_iters"]
    return cfg["warmup_iters"] if cfg["warmup_iters"] < decay_end else decay_end // 10


def in_effect(cfg, device, dtype):
    """The settings as the run uses them: derived values filled in (warmup clipped, the decay's
    end, auto device and dtype, key/value heads), the actions (resume, overwrite) left out."""
    return {**{k: v for k, v in cfg.items() if k not in ACTIONS},
            "warmup_iters": warmup_steps(cfg),
            "lr_decay_iters": cfg["lr_decay_iters"] or cfg["max_iters"],
            "n_kv_head": cfg["n_kv_head"] or cfg["n_head"], "device": device, "dtype": dtype}


def get_lr(it, cfg):
    """Linear warmup, then cosine decay from learning_rate to min_lr at lr_decay_iters
    (0 = max_iters)."""
    decay_end = cfg["lr_decay_iters"] or cfg["max_iters"]
    warmup = warmup_steps(cfg)
    if it < warmup:
        return cfg["learning_rate"] * (it + 1) / (warmup + 1)
    if it >= decay_end:
        return cfg["min_lr"]
    progress = (it - warmup) / (decay_end - warmup)
    return cfg["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * progress)) * (
        cfg["learning_rate"] - cfg["min_lr"])


class Batches:
    """(x, y) batches from memmapped shards, with a state() that checkpoints can hold.

    One shard (small data): random windows from a seeded generator. Several shards (FineWeb):
    each rank reads the token stream in order, rank r taking every world-th chunk; shards too
    short for a whole step of every rank are skipped.
    """

    def __init__(self, token_shards, batch_size, block_size, seed, rank=0, world=1,
                 sequential=None, split="train split"):
        self.shards, self.B, self.T, self.rank, self.world = (
            token_shards, batch_size, block_size, rank, world)
        self.sequential = len(token_shards) > 1 if sequential is None else sequential
        self.generator = torch.Generator().manual_seed(seed + rank)
        need = (world * batch_size * block_size + 1) if self.sequential else block_size + 2
        self.usable = [i for i, s in enumerate(token_shards) if len(s) >= need]
        if not self.usable:
            longest = max(len(s) for s in token_shards)
            if not self.sequential:  # a random window: block_size + 1 tokens, and a choice of start
                fix = (f"use --block_size={longest - 2} or less, or prepare more text"
                       if longest > 2 else "prepare more text")
                raise shards.DataError(f"the {split} has {plural(longest, 'token')}, fewer than "
                                       f"the {need:,} one window needs (block_size {block_size} "
                                       f"+ 2): {fix}")
            raise shards.DataError(f"every shard of the {split} is shorter than the {need:,} "
                                   f"tokens one step needs ({plural(world, 'rank')} x batch_size "
                                   f"{batch_size} x block_size {block_size} + 1; the longest has "
                                   f"{longest:,}): lower --batch_size or --block_size")
        self.shard, self.pos = self.usable[0], rank * batch_size * block_size

    def next(self):
        B, T = self.B, self.T
        if self.sequential:
            # the next usable shard, wrapping around
            if self.pos + B * T + 1 > len(self.shards[self.shard]):
                self.shard = self.usable[(self.usable.index(self.shard) + 1) % len(self.usable)]
                self.pos = self.rank * B * T
            chunk = torch.from_numpy(
                self.shards[self.shard][self.pos:self.pos + B * T + 1].astype("int64"))
            self.pos += self.world * B * T
            return chunk[:-1].view(B, T), chunk[1:].view(B, T)
        tokens = self.shards[self.usable[0]]
        starts = torch.randint(len(tokens) - T - 1, (B,), generator=self.generator).tolist()
        rows = torch.stack([torch.from_numpy(tokens[i:i + T + 1].astype("int64")) for i in starts])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state(self):
        return {"generator": self.generator.get_state(), "shard": self.shard, "pos": self.pos}

    def load_state(self, state):
        self.generator.set_state(state["generator"])
        self.shard, self.pos = state["shard"], state["pos"]
        if self.shard not in self.usable:  # other data (--new_data): start from its beginning
            self.shard, self.pos = self.usable[0], self.rank * self.B * self.T


def resolve_resume(cfg, given, ckpt_path):
    """--resume: the checkpoint's settings, changed only where given (each change announced).
    given: the keys set on the command line or by a preset (None: every key of cfg)."""
    ckpt = load_checkpoint(ckpt_path)
    # the actions (resume, overwrite, new_data) are this command's, never the checkpoint's
    saved = {**DEFAULTS, **{k: v for k, v in ckpt["config"].items() if k not in ACTIONS},
             **{k: cfg[k] for k in ACTIONS}}
    given = set(cfg) if given is None else set(given)
    changes = {k: (saved.get(k), cfg[k])
               for k in given - set(ACTIONS) if saved.get(k) != cfg[k]}
    shape = {k: v for k, v in changes.items() if k in MODEL_KEYS}
    if shape:
        shown = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in shape.items())
        raise ConfigError(f"cannot resume {ckpt_path}: the model differs ({shown}); "
                          f"a run keeps its model shape: "
                          f"drop those settings, or start a new run with another --out_dir")
    return {**saved, **{k: b for k, (_, b) in changes.items()}, "resume": True}, ckpt, changes


def check_resume_data(ckpt_path, ckpt, data, cfg, changes):
    """A resume goes on with the data the checkpoint trained on, unless the user says otherwise
    (--new_data, or another --dataset); tokens of another tokenizer never fit the model."""
    then = ckpt.get("data")  # checkpoints of older versions record none: nothing to compare
    if then is None or then["sha256"] == data["sha256"]:
        return None
    if then["tokenizer"] != data["tokenizer"]:
        raise ConfigError(f"cannot resume {ckpt_path}: its model reads {then['tokenizer']} "
                          f"tokens, {data['dir']} holds {data['tokenizer']} tokens: resume on "
                          f"data prepared with --tokenizer={then['tokenizer']}")
    if not cfg["new_data"] and "dataset" not in changes:
        raise ConfigError(f"cannot resume {ckpt_path}: it trained on {then['dir']} "
                          f"({shards.describe(then)}), but {data['dir']} now holds other data "
                          f"({shards.describe(data)}): prepare the original data again, "
                          f"or go on with this data with --new_data")
    return (f"resume: the data changed: {then['dir']} ({shards.describe(then)}) -> "
            f"{data['dir']} ({shards.describe(data)})")


def changed_in_effect(ckpt, cfg, settings, changes, iter_num):
    """What a resume changes beyond the settings given: derived values (the decay's end that
    follows max_iters, a clipped warmup, an auto device) and the learning rate where it resumes."""
    saved = {**DEFAULTS, **ckpt["config"]}
    # checkpoints of older versions record only the settings: derive theirs the same way
    before = ckpt.get("settings_in_effect") or in_effect(saved, settings["device"],
                                                         settings["dtype"])
    lines = [f"resume: {k} in effect: {before[k]!r} -> {v!r}" for k, v in settings.items()
             if k in before and before[k] != v and changes.get(k) != (before[k], v)]
    old_lr, new_lr = get_lr(iter_num, saved), get_lr(iter_num, cfg)
    if not math.isclose(old_lr, new_lr, rel_tol=1e-9):
        lines.append(f"resume: learning rate at step {iter_num}: {old_lr:.2e} -> {new_lr:.2e} "
                     f"(the schedule changed)")
    return lines


def open_data(dataset, master, ddp):
    """(directory, meta, train shards, val shards) of --dataset; the default one is prepared on
    first use (by rank 0, the others wait)."""
    data_dir = shards.dataset_dir(dataset)
    if dataset == DEFAULTS["dataset"] and master:
        shards.prepare_default(data_dir)
    if ddp:
        dist.barrier()
    meta = shards.load_meta(data_dir)
    train_shards, val_shards = ([shards.read_shard(p, meta["vocab_size"])
                                 for p in shards.list_shards(data_dir, split)]
                                for split in ("train", "val"))
    return data_dir, meta, train_shards, val_shards


def build(cfg, vocab_size, device, ckpt):
    """Model (on device) and AdamW, fresh or from the checkpoint."""
    model_args = dict(GPTConfig.from_dict({**cfg, "vocab_size": vocab_size}).__dict__)
    model = GPT(GPTConfig(**model_args))
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    model.to(device)
    device_type = device.split(":")[0]
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                           (cfg["beta1"], cfg["beta2"]), device_type,
                                           cfg["lambda_lr_scale"])
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    return model, optimizer, model_args


def train(cfg, given=None):
    """Run one training job; returns a summary dict with the trained model (tests use it).
    given: the settings named on the command line (what --resume changes); None = all of cfg."""
    check_settings(cfg)
    ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun?
    rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if ddp else (0, 1)
    device, dtype, autocast = setup_device(cfg["device"], cfg["dtype"])  # a bad one fails now
    os.makedirs(cfg["out_dir"], exist_ok=True)
    lock = None
    if rank == 0:  # one training run per out_dir (the OS drops the lock if this one dies)
        lock = shards.hold_lock(os.path.join(cfg["out_dir"], "train.lock"), ConfigError(
            f"{cfg['out_dir']} is in use by another training run: wait for it, stop it, "
            f"or use another --out_dir"))
    try:
        ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
        ckpt, changes = None, {}
        if cfg["resume"]:
            cfg, ckpt, changes = resolve_resume(cfg, given, ckpt_path)
            check_settings(cfg)
            # the run's own device and dtype (a bfloat16 run goes on in bfloat16)
            device, dtype, autocast = setup_device(cfg["device"], cfg["dtype"])
        elif os.path.exists(ckpt_path) and not cfg["overwrite"]:
            raise ConfigError(f"{cfg['out_dir']} already holds a checkpoint: "
                              f"continue it with --resume, "
                              f"or train into another --out_dir (--overwrite replaces it)")
        if cfg["gradient_accumulation_steps"] % world:  # 0 (one per rank) always divides
            raise ConfigError(f"--gradient_accumulation_steps="
                              f"{cfg['gradient_accumulation_steps']} is the total "
                              f"over all ranks and must divide by the {world} ranks "
                              f"(0: one micro-step per rank)")
        if ddp:
            dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
            if device.startswith("cuda"):
                device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
                torch.cuda.set_device(device)
        log_path = os.path.join(cfg["out_dir"], "log.jsonl")
        if rank == 0 and not cfg["resume"] and os.path.exists(log_path):
            os.remove(log_path)  # a fresh run starts a fresh log
        return run(cfg, ckpt, changes, device, dtype, autocast, rank, world)
    finally:
        if lock:
            lock.release()
        if ddp and dist.is_initialized():
            dist.destroy_process_group()


def run(cfg, ckpt, changes, device, dtype, autocast, rank, world):
    """The training loop proper, for train(): data, model, steps, evaluations, checkpoints."""
    ddp, master = world > 1, rank == 0
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    # each rank's share of the step's micro-batches (0: one each, however many ranks)
    accumulation = cfg["gradient_accumulation_steps"] // world or 1
    device_type = device.split(":")[0]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    # ---- data ----
    data_dir, meta, train_shards, val_shards = open_data(cfg["dataset"], master, ddp)
    data = shards.data_identity(data_dir, meta)
    data_note = check_resume_data(ckpt_path, ckpt, data, cfg, changes) if ckpt else None
    batches = Batches(train_shards, cfg["batch_size"], cfg["block_size"], cfg["seed"], rank, world,
                      split=f"train split of {data_dir}")
    # Loss estimates use the same fixed windows every time, so curves compare across steps
    # and modes.
    eval_batches = {split: Batches(s, cfg["batch_size"], cfg["block_size"], seed=1234,
                                   sequential=False, split=f"{split} split of {data_dir}")
                    for split, s in (("train", train_shards), ("val", val_shards))}

    # ---- model and optimizer, fresh or from the checkpoint ----
    torch.manual_seed(cfg["seed"])  # the same initial weights on every rank
    vocab_size = -(-meta["vocab_size"] // 64) * 64  # round up to a multiple of 64: faster matmuls
    raw_model, optimizer, model_args = build(cfg, vocab_size, device, ckpt)
    torch.manual_seed(cfg["seed"] + rank)  # then each rank its own dropout stream
    iter_num, best_val_loss = 0, float("inf")
    settings, effects = in_effect(cfg, device, dtype), []
    if ckpt is not None:
        restore_rank_state(ckpt, ckpt_path, batches, rank, world, device_type)
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        effects = changed_in_effect(ckpt, cfg, settings, changes, iter_num)
    start_iter, ckpt = iter_num, None  # free the checkpoint's memory
    done_before = cfg["resume"] and iter_num >= cfg["max_iters"]  # a finished run resumed
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
    model = torch.compile(raw_model) if cfg["compile"] else raw_model
    if ddp:
        model = DDP(model,
                    device_ids=[int(os.environ["LOCAL_RANK"])] if device_type == "cuda" else None)

    # what the run writes: checkpoints (what stays the same all run given here), lines and log.jsonl
    checkpoint = Checkpoint(ckpt_path, iter_num if cfg["resume"] else None, device_type, {
        "model_args": model_args, "config": {k: v for k, v in cfg.items() if k not in ACTIONS},
        "settings_in_effect": settings, "data": data,
        "tokenizer": {k: meta[k] for k in ("tokenizer", "vocab_size", "eot")}})
    tokens_per_step = cfg["batch_size"] * cfg["block_size"] * accumulation * world
    report = Report(cfg, raw_model, checkpoint, tokens_per_step, device, rank, world, start_iter)
    report.start(changes, effects, data_note, settings, data_dir, accumulation, done_before)

    evals, status, val_loss = [], "done", float("nan")
    ctrl_c = CtrlC(master)
    try:
        while not done_before:
            if iter_num % cfg["eval_interval"] == 0 and (iter_num > start_iter or iter_num == 0) \
                    or iter_num == cfg["max_iters"]:
                losses = estimate_loss(raw_model, eval_batches, cfg["eval_iters"], device, autocast,
                                       rank, world)
                val_loss = losses["val"]
                if not math.isfinite(val_loss):
                    status = "diverged"
                    break
                best_val_loss = min(best_val_loss, val_loss)
                evals.append(report.eval(iter_num, losses))
                if iter_num > start_iter:
                    checkpoint.save(iter_num, best_val_loss, raw_model, optimizer, batches, rank,
                                    world)
                report.restart_clock()  # evaluation time is not training time
            if iter_num >= cfg["max_iters"]:
                break
            if ctrl_c.agreed(iter_num, cfg["log_interval"], device, ddp):
                status = "interrupted"
                checkpoint.save(iter_num, best_val_loss, raw_model, optimizer, batches, rank, world)
                report.interrupted(iter_num)
                break

            # the training step: micro-steps (gradients summed), clip, AdamW, clear
            lr = get_lr(iter_num, cfg)
            for group in optimizer.param_groups:  # lr_scale: the learned lambdas' own multiple
                group["lr"] = lr * group.get("lr_scale", 1.0)
            for micro_step in range(accumulation):
                if ddp:  # synchronise gradients on the last micro-step only
                    model.require_backward_grad_sync = micro_step == accumulation - 1
                x, y = batches.next()
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                with autocast:
                    loss = model(x, y)[1] / accumulation
                scaler.scale(loss).backward()
            if cfg["grad_clip"] > 0:
                scaler.unscale_(optimizer)  # fp16: clip the true gradients, not the scaled ones
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1

            if iter_num % cfg["log_interval"] == 0 or iter_num == cfg["max_iters"]:
                # the mean over ranks: every rank checks the same number, so all stop together
                lossf = mean_over_ranks(loss.detach() * accumulation, world)
                if not math.isfinite(lossf):
                    status = "diverged"
                    break
                report.train(iter_num, lossf, lr)
    except KeyboardInterrupt:  # the second Ctrl-C: stop now; the last checkpoint stays as it was
        status = "interrupted"
        report.stopped_at_once()
    finally:
        ctrl_c.restore()

    full_val = None
    if status == "done":  # the final number: every validation token once, not a sample of windows
        full_val, n = full_split_loss(raw_model, val_shards, cfg["block_size"], cfg["batch_size"],
                                      device, autocast, rank, world)
        report.final(iter_num, full_val, n, done_before)
    report.end(status, iter_num)
    return {"status": status, "iter": iter_num, "val_loss": val_loss, "val_loss_full": full_val,
            "best_val_loss": best_val_loss, "evals": evals, "num_params": raw_model.num_params(),
            "tokens_per_sec": report.median_speed(),
            "kv_cache_bytes_per_token": raw_model.kv_cache_bytes(1, 1, getattr(torch, dtype)),
            "out_dir": cfg["out_dir"], "model": raw_model}


# -----------------------------------------------------------------------------
# evaluation

@torch.no_grad()
def estimate_loss(model, eval_batches, eval_iters, device, autocast, rank=0, world=1):
    """Mean loss over eval_iters fixed batches per split; under DDP the ranks share them."""
    model.eval()
    losses = {}
    for split, source in eval_batches.items():
        source.generator.manual_seed(1234)
        total = torch.zeros((), device=device)
        for i in range(eval_iters):
            x, y = source.next()  # every rank draws every batch, so the windows stay the same
            if i % world == rank:
                with autocast:
                    total += model(x.to(device), y.to(device))[1].float()
        if world > 1:
            dist.all_reduce(total)
        losses[split] = total.item() / eval_iters
    model.train()
    return losses


@torch.no_grad()
def full_split_loss(model, token_shards, block_size, batch_size, device, autocast, rank=0, world=1):
    """(mean loss, tokens) over every token of a split exactly once: each shard cut into consecutive
    non-overlapping windows (the last one shorter), each predicting its tokens from those before it
    in the window. Returns the mean over all predicted tokens; under DDP the ranks share the
    windows."""
    windows = [(tokens, s, min(block_size, len(tokens) - 1 - s))
               for tokens in token_shards for s in range(0, len(tokens) - 1, block_size)]
    total, count = 0.0, 0
    model.eval()
    for i in range(rank * batch_size, len(windows), world * batch_size):
        batch = windows[i:i + batch_size]
        # equal lengths together (only the last differs)
        for length in sorted({n for _, _, n in batch}):
            rows = torch.stack([torch.from_numpy(t[s:s + n + 1].astype("int64"))
                                for t, s, n in batch if n == length])
            with autocast:
                logits, _ = model(rows[:, :-1].to(device), all_logits=True)
            total += torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                       rows[:, 1:].flatten().to(device),
                                                       reduction="sum").item()
            count += rows[:, 1:].numel()
    model.train()
    sums = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(sums)
    return (sums[0] / sums[1]).item(), int(sums[1].item())


def mean_over_ranks(value, world):
    """A scalar tensor's mean over the ranks, as a float (a GPU sync: only when logging)."""
    if world > 1:
        dist.all_reduce(value)
        value /= world
    return value.item()


# -----------------------------------------------------------------------------
# checkpointing

class Checkpoint:
    """out_dir/ckpt.pt, written by rank 0 at a step boundary with everything an exact resume needs:
    weights, AdamW, the run's fixed record (settings, data, tokenizer) and every rank's data
    position and RNG states. It remembers which step the file on disk holds, for a full disk."""

    def __init__(self, path, saved_iter, device_type, record):
        self.path, self.saved_iter, self.record = path, saved_iter, record
        self.device_type = device_type

    def save(self, iter_num, best_val_loss, model, optimizer, batches, rank, world):
        """Every rank calls it (the ranks' states are gathered); rank 0 writes."""
        states, mine = [None] * world, rank_state(batches, self.device_type)
        if world > 1:
            dist.all_gather_object(states, mine)
        else:
            states[0] = mine
        if rank != 0:
            return
        try:
            save_checkpoint(self.path, {
                "format": CHECKPOINT_FORMAT, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), **self.record,
                "iter_num": iter_num, "best_val_loss": best_val_loss, "rank_states": states})
        except DiskFull:
            raise self.no_space(f"saving {self.path}") from None
        self.saved_iter = iter_num

    def no_space(self, doing):
        """The one-line error for a full disk: what failed, and which checkpoint is whole."""
        kept = (f"the checkpoint of step {self.saved_iter} is kept (free some space, then add "
                f"--resume)" if self.saved_iter is not None
                else "the ckpt.pt already there is unchanged" if os.path.exists(self.path)
                else "no checkpoint was saved")
        return DiskFull(errno.ENOSPC, f"no space left on device while {doing}; {kept}")


def rank_state(batches, device_type):
    """This rank's data position and RNG states, as of now (a step boundary)."""
    return {"data": batches.state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None}


def restore_rank_state(ckpt, ckpt_path, batches, rank, world, device_type):
    """This rank's data position and RNGs, from the checkpoint (written by as many ranks)."""
    if len(ckpt["rank_states"]) != world:
        raise ConfigError(f"{ckpt_path} was written by {len(ckpt['rank_states'])} process(es); "
                          f"resume it with the same number (torchrun --nproc_per_node)")
    state = ckpt["rank_states"][rank]
    batches.load_state(state["data"])
    torch.set_rng_state(state["torch"])
    if device_type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"])


# -----------------------------------------------------------------------------
# stopping

class CtrlC:
    """Ctrl-C sets a flag; the loop stops at the next step boundary (all ranks at the same one) and
    saves there. A second Ctrl-C stops at once, keeping the last checkpoint. (Under torchrun a rank
    gets one Ctrl-C twice, from the terminal and from torchrun: within a second, it is one.)"""

    def __init__(self, master):
        self.master, self.requested, self.at = master, False, 0.0
        self.previous = signal.signal(signal.SIGINT, self.on_sigint)

    def on_sigint(self, signum, frame):
        if self.requested:
            if time.time() - self.at < 1.0:
                return
            raise KeyboardInterrupt
        self.requested, self.at = True, time.time()
        if self.master:
            print("\nCtrl-C: stopping after this step (Ctrl-C again to stop at once)", flush=True)

    def agreed(self, iter_num, every, device, ddp):
        """One process: the flag. Under DDP all ranks must agree on the step, so they compare
        flags, but only every log_interval steps (already a sync point), not every step."""
        if not ddp:
            return self.requested
        if iter_num % every:
            return False
        flag = torch.tensor(float(self.requested), device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    def restore(self):
        signal.signal(signal.SIGINT, self.previous)


# -----------------------------------------------------------------------------
# logging

class Report:
    """What a run says: lines on stdout and the same records in out_dir/log.jsonl (rank 0 only),
    and the speed of each log window: tokens/s, MFU against the GPU's peak, the ETA."""

    def __init__(self, cfg, model, checkpoint, tokens_per_step, device, rank, world, start_iter):
        self.cfg, self.model, self.checkpoint = cfg, model, checkpoint
        self.tokens_per_step, self.master, self.world = tokens_per_step, rank == 0, world
        self.peak = (gpu_peak_flops(torch.cuda.get_device_name(device))
                     if device.startswith("cuda") else None)
        self.file = open(os.path.join(cfg["out_dir"], "log.jsonl"), "a") if self.master else None
        self.speeds, self.start_iter, self.last_iter = [], start_iter, start_iter
        self.t0 = self.t_run = time.time()

    def log(self, record):
        """One line of log.jsonl (rank 0)."""
        if self.file is None:
            return
        try:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        except OSError as e:
            if disk_full(e):
                with contextlib.suppress(OSError):
                    self.file.close()  # drops what did not fit, so exiting does not retry it
                raise self.checkpoint.no_space(f"writing {self.file.name}") from None
            raise

    def start(self, changes, effects, data_note, settings, data_dir, accumulation, done_before):
        """What the run is: the resume's changes, the settings in effect, the model and the step."""
        cfg, iter_num, ckpt_path = self.cfg, self.start_iter, self.checkpoint.path
        if not self.master:
            return
        for key, (old, new) in changes.items():
            print(f"resume: {key}: {old!r} -> {new!r}")
        for line in effects + ([data_note] if data_note else []):
            print(line)
        if cfg["resume"]:
            print(f"resuming {ckpt_path} at step {iter_num}")
        if done_before:
            print(f"{ckpt_path} is already at step {iter_num} of max_iters {cfg['max_iters']}: "
                  f"nothing to train; to go further, --resume with a larger --max_iters")
        if warmup_steps(cfg) != cfg["warmup_iters"]:
            print(f"note: warmup_iters {cfg['warmup_iters']} would fill the whole schedule: "
                  f"warming up for {plural(warmup_steps(cfg), 'step')}")
        print("settings: " + " ".join(f"{k}={v}" for k, v in settings.items()))
        device, dtype, world = settings["device"], settings["dtype"], self.world
        print(f"{cfg['value_mode']}: {self.model.num_params() / 1e6:.2f}M parameters, "
              f"{device} {dtype}, "
              f"{self.tokens_per_step:,} tokens/step ({cfg['batch_size']} x {cfg['block_size']} x "
              f"{plural(accumulation, 'micro-step')} x {plural(world, 'rank')}), "
              f"{plural(cfg['max_iters'], 'step')}, data {data_dir}")
        self.log({"kind": "config", "iter": iter_num, "settings": settings,
                  "changes": {k: list(v) for k, v in changes.items()},
                  "changes_in_effect": effects, "num_params": self.model.num_params(),
                  "device": device, "dtype": dtype, "world": world,
                  "tokens_per_step": self.tokens_per_step})

    def eval(self, iter_num, losses):
        """The evaluation's record (with learned lambdas, per layer 2..n), printed and logged."""
        record = {"iter": iter_num, "tokens": iter_num * self.tokens_per_step,
                  "train_loss": losses["train"], "val_loss": losses["val"]}
        if self.cfg["learnable_lambda"]:
            record["lambdas"] = [block.attn.value_lambdas.tolist()
                                 for block in self.model.transformer.h[1:]]
        if self.master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, "
                  f"val loss {losses['val']:.4f}")
            self.log({"kind": "eval", **record})
        return record

    def restart_clock(self):
        self.t0 = time.time()

    def train(self, iter_num, lossf, lr):
        """The log window that ends at iter_num: loss, lr, speed, MFU and ETA."""
        cfg = self.cfg
        dt = (time.time() - self.t0) / (iter_num - self.last_iter)
        record = {"kind": "train", "iter": iter_num, "loss": lossf, "lr": lr,
                  "ms_per_step": 1000 * dt, "tokens_per_sec": self.tokens_per_step / dt}
        # the first window includes compilation
        warm = iter_num > self.start_iter + cfg["log_interval"]
        if self.peak and warm:
            record["mfu"] = self.model.estimate_mfu(record["tokens_per_sec"] / self.world,
                                                    self.peak, cfg["block_size"])
        if warm:
            self.speeds.append(record["tokens_per_sec"])
        if self.master:
            mfu = f", mfu {100 * record['mfu']:.1f}%" if "mfu" in record else ""
            eta = ((time.time() - self.t_run) / (iter_num - self.start_iter)
                   * (cfg["max_iters"] - iter_num))
            print(f"iter {iter_num}/{cfg['max_iters']}: loss {lossf:.4f}, lr {lr:.2e}, "
                  f"{record['ms_per_step']:.0f} ms/step, "
                  f"{record['tokens_per_sec']:,.0f} tok/s{mfu}, "
                  f"ETA {eta // 60:.0f}m{eta % 60:02.0f}s")
            self.log(record)
        self.t0, self.last_iter = time.time(), iter_num

    def median_speed(self):
        """tokens/s, the median over the warm log windows."""
        speeds = sorted(self.speeds)
        return speeds[len(speeds) // 2] if speeds else float("nan")

    def interrupted(self, iter_num):
        if self.master:
            again = f"torchrun --nproc_per_node={self.world}" if self.world > 1 else "python"
            print(f"interrupted at step {iter_num}: saved {self.checkpoint.path}; continue with "
                  f"{again} train.py --out_dir={self.cfg['out_dir']} --resume")

    def stopped_at_once(self):
        if self.master:
            print(f"\nstopped at once: kept the last checkpoint in {self.checkpoint.path}")

    def final(self, iter_num, full_val, n, done_before):
        if self.master:
            self.log({"kind": "final", "iter": iter_num, "val_loss_full": full_val,
                      "val_tokens": n})
            print(f"val loss over the whole validation split ({n:,} tokens): {full_val:.4f}")
            print(f"{'kept' if done_before else 'saved'} {self.checkpoint.path} (step {iter_num}); "
                  f"sample from it: "
                  f"python sample.py --out_dir={self.cfg['out_dir']}")

    def end(self, status, iter_num):
        """A diverged run's record and advice; then log.jsonl is closed."""
        if status == "diverged" and self.master:
            self.log({"kind": "diverged", "iter": iter_num})
            print(f"loss is not finite at step {iter_num}: stopped; "
                  f"the last good checkpoint is {self.checkpoint.path} "
                  f"(try a lower --learning_rate or --grad_clip=1.0)")
        if self.file:
            self.file.close()


def main(argv):
    summary = train(parse_args(TRAIN_SETTINGS, argv, USAGE), given_keys(argv))
    return EXIT_CODES[summary["status"]]


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, FileNotFoundError) as e:  # user mistakes: one line, no traceback
        sys.exit(f"error: {e}")
    except DiskFull as e:  # the last checkpoint is whole; say which one
        sys.exit(f"error: {e.strerror}")
