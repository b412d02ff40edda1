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
The settings and their defaults live in configurator.py (TRAIN_SETTINGS); the checkpoint and
--resume's rules in resume.py; the log lines and Ctrl-C in trainlog.py.
"""
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shards
from configurator import (ACTIONS, TRAIN_SETTINGS, ConfigError, defaults_of, given_keys,
                          parse_args, plural)
from model import GPT, GPTConfig
from resume import Checkpoint, check_resume_data, resolve_resume, restore_rank_state
from runtime import DiskFull, setup_device
from trainlog import CtrlC, Report

DEFAULTS = defaults_of(TRAIN_SETTINGS)
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
