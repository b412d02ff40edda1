"""Train a GPT in any value mode on token shards, on one GPU, a laptop CPU, or several GPUs.

    python train.py                                   # the CPU quickstart (prepares data if needed)
    python train.py --value_mode=vanilla              # any setting: --key=value (--help lists them)
    python train.py config/gpt2_124m.py               # a preset, then overrides
    python train.py --resume --max_iters=8000         # continue out_dir/ckpt.pt exactly, further
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py   # 8 GPUs, same step

Read it top to bottom: the settings, the schedule, the data, the checkpoint, the log, then train()
and run(), the loop with the step inline. Every line it prints also goes to out_dir/log.jsonl.
"""
import dataclasses
import gc
import json
import math
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shards
from configurator import (ConfigError, CtrlC, defaults_of, device_type, given_keys,
                          gpu_peak_flops, parse_args, plural, run_main, setup_device)
from model import GPT, GPTConfig

# The settings, name=(default, meaning). The defaults are the CPU quickstart (config/quickstart.py
# spells them out): a small byte-level ResFormer on Shakespeare's plays, ~5 minutes on 2 cores.
SETTINGS = dict(
    # I/O
    out_dir=("out", "directory for ckpt.pt and log.jsonl"),
    eval_interval=(500, "evaluate (and checkpoint) every this many steps"),
    log_interval=(100, "print and log the training loss every this many steps"),
    eval_iters=(20, "batches per loss estimate during training"),
    resume=(False, "continue out_dir/ckpt.pt: its settings, changed only where given"),
    overwrite=(False, "start afresh even if out_dir already holds a checkpoint"),
    new_data=(False, "with --resume: go on although the dataset changed since the checkpoint"),
    seed=(1337, "seed of the initial weights and the order of the training batches"),
    # data
    dataset=(shards.DEFAULT_DATASET, "data/<dataset>/ from prepare.py, or a path to such a folder"),
    batch_size=(12, "sequences per micro-step"),
    block_size=(64, "tokens per sequence (the model's context length)"),
    gradient_accumulation_steps=(0, "micro-steps per optimizer step, in all, divided over "
                                    "torchrun's ranks (0 = one per rank)"),
    # model (see GPTConfig in model.py)
    n_layer=(4, "transformer blocks"),
    n_head=(4, "attention heads"),
    n_kv_head=(0, "key/value heads for grouped-query attention (0 = n_head)"),
    n_embd=(128, "model width"),
    dropout=(0.0, "dropout rate"),
    bias=(False, "biases in Linear and LayerNorm layers"),
    value_mode=("resformer",
                "vanilla | resformer (value residual) | svformer (single shared value)"),
    lambda_1=(0.5, "resformer: weight of layer 1's value V_1 in every later layer's value"),
    lambda_2=(0.5, "resformer: weight of the layer's own value V_n (the paper's sweep: 1)"),
    learnable_lambda=(False,
                      "resformer: learn (lambda_1, lambda_2) per layer, from the values above"),
    lambda_lr_scale=(1.0, "learned lambdas: their learning rate as a multiple of the weights'"),
    # AdamW and the schedule: linear warmup, cosine decay to min_lr at lr_decay_iters
    learning_rate=(3e-3, "peak learning rate"),
    max_iters=(6000, "optimizer steps in all"),
    weight_decay=(0.1, "AdamW weight decay (2-D weights only)"),
    beta1=(0.9, "AdamW beta1"),
    beta2=(0.95, "AdamW beta2"),
    grad_clip=(1.0, "clip the gradient norm to this (0 = off)"),
    warmup_iters=(100, "linear warmup steps (clipped to the run)"),
    lr_decay_iters=(0, "step where the cosine reaches min_lr (0 = max_iters)"),
    min_lr=(3e-4, "final learning rate"),
    # system
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (bfloat16 on capable GPUs, else float32), float32, bfloat16, float16"),
    compile=(False, "torch.compile the model (GPU; slow to start)"),
)
DEFAULTS = defaults_of(SETTINGS)
# what a command does, not what a run is: never restored from a checkpoint, never compared
ACTIONS = ("resume", "overwrite", "new_data")
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
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "gradient_accumulation_steps",
                "lambda_lr_scale"):
        if cfg[key] < 0:
            raise ConfigError(f"--{key}={cfg[key]}: must be 0 or more")
    if not 0 <= cfg["min_lr"] <= cfg["learning_rate"]:
        raise ConfigError(f"--min_lr={cfg['min_lr']}: must be between 0 and "
                          f"learning_rate ({cfg['learning_rate']})")
    if os.path.exists(cfg["out_dir"]) and not os.path.isdir(cfg["out_dir"]):
        raise ConfigError(f"--out_dir={cfg['out_dir']} is a file: name a folder")
    GPTConfig.from_dict(cfg)  # a bad model setting fails now, before any data is touched


# -----------------------------------------------------------------------------
# the learning-rate schedule

def decay_end(cfg):
    """The step where the cosine reaches min_lr: lr_decay_iters, 0 meaning max_iters."""
    return cfg["lr_decay_iters"] or cfg["max_iters"]


def warmup_steps(cfg):
    """warmup_iters, or a tenth of the schedule where it would fill it all (a short run decays)."""
    return cfg["warmup_iters"] if cfg["warmup_iters"] < decay_end(cfg) else decay_end(cfg) // 10


def get_lr(it, cfg):
    """Linear warmup, then cosine decay from learning_rate to min_lr at decay_end."""
    warmup, end, lr, min_lr = warmup_steps(cfg), decay_end(cfg), cfg["learning_rate"], cfg["min_lr"]
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it >= end:
        return min_lr
    progress = (it - warmup) / (end - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def in_effect(cfg, device, dtype):
    """The settings as the run uses them (derived values filled in, the actions left out)."""
    return {**{k: v for k, v in cfg.items() if k not in ACTIONS},
            "warmup_iters": warmup_steps(cfg), "lr_decay_iters": decay_end(cfg),
            "n_kv_head": cfg["n_kv_head"] or cfg["n_head"], "device": device, "dtype": dtype}


# -----------------------------------------------------------------------------
# the data: (x, y) batches from memmapped shards

class Batches:
    """One shard (small data): random windows from a seeded generator. Several (FineWeb): rank r
    reads every world-th chunk in order, skipping shards too short for one step of every rank."""

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
            if self.pos + B * T + 1 > len(self.shards[self.shard]):  # the next usable shard
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

    def state(self):  # what a checkpoint holds
        return {"generator": self.generator.get_state(), "shard": self.shard, "pos": self.pos}

    def load_state(self, state):
        self.generator.set_state(state["generator"])
        self.shard, self.pos = state["shard"], state["pos"]
        if self.shard not in self.usable:  # other data (--new_data): start from its beginning
            self.shard, self.pos = self.usable[0], self.rank * self.B * self.T


def open_data(cfg, rank, world):
    """(meta, identity, val shards, training batches, fixed evaluation batches) of --dataset. The
    fixed batches give every estimate the same windows, so curves compare across steps and modes."""
    data_dir = shards.dataset_dir(cfg["dataset"])
    if cfg["dataset"] == shards.DEFAULT_DATASET and rank == 0:  # prepared on first use
        shards.prepare_default(data_dir)
    if world > 1:  # the other ranks wait for it
        dist.barrier()
    meta = shards.load_meta(data_dir)
    train_shards, val_shards = ([shards.read_shard(p, meta["vocab_size"]) for p in
                                 shards.list_shards(data_dir, split)] for split in ("train", "val"))
    batches = Batches(train_shards, cfg["batch_size"], cfg["block_size"], cfg["seed"], rank, world,
                      split=f"train split of {data_dir}")
    eval_batches = {split: Batches(s, cfg["batch_size"], cfg["block_size"], seed=1234,
                                   sequential=False, split=f"{split} split of {data_dir}")
                    for split, s in (("train", train_shards), ("val", val_shards))}
    return meta, shards.data_identity(data_dir, meta), val_shards, batches, eval_batches


# -----------------------------------------------------------------------------
# the checkpoint: what --resume takes from it, and writing it

def resolve_resume(cfg, given, ckpt):
    """(the checkpoint's settings, changed only where given; the changes). given: the keys the
    command line or a preset set (None: all)."""
    saved = {**DEFAULTS, **ckpt["config"], **{k: cfg[k] for k in ACTIONS}}
    given = set(cfg) if given is None else set(given)
    changes = {k: (saved[k], cfg[k]) for k in given - set(ACTIONS) if saved[k] != cfg[k]}
    shape = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}"
                      for k, (a, b) in changes.items() if k in MODEL_KEYS)
    if shape:
        raise ConfigError(f"cannot resume {cfg['out_dir']}/ckpt.pt: the model differs ({shape}); "
                          f"a run keeps its model shape: drop those settings, or start a new run "
                          f"with another --out_dir")
    return {**saved, **{k: b for k, (_, b) in changes.items()}}, changes


def resume_notes(ckpt, cfg, changes, settings, data):
    """A resume's other lines: changed data (refused unless asked for), derived values, the lr."""
    then, path, step, notes = ckpt["data"], f"{cfg['out_dir']}/ckpt.pt", ckpt["iter_num"], []
    if then["sha256"] != data["sha256"]:
        if then["tokenizer"] != data["tokenizer"]:
            raise ConfigError(f"cannot resume {path}: its model reads {then['tokenizer']} "
                              f"tokens, {data['dir']} holds {data['tokenizer']} tokens: resume "
                              f"on data prepared with --tokenizer={then['tokenizer']}")
        if not cfg["new_data"] and "dataset" not in changes:
            raise ConfigError(f"cannot resume {path}: it trained on {then['dir']} "
                              f"({shards.describe(then)}), but {data['dir']} now holds other "
                              f"data ({shards.describe(data)}): prepare the original data "
                              f"again, or go on with this data with --new_data")
        notes.append(f"resume: the data changed: {then['dir']} ({shards.describe(then)}) -> "
                     f"{data['dir']} ({shards.describe(data)})")
    before = ckpt["settings_in_effect"]
    notes += [f"resume: {k} in effect: {before[k]!r} -> {v!r}" for k, v in settings.items()
              if k in before and before[k] != v and changes.get(k) != (before[k], v)]
    old_lr, new_lr = get_lr(step, {**DEFAULTS, **ckpt["config"]}), get_lr(step, cfg)
    if not math.isclose(old_lr, new_lr, rel_tol=1e-9):
        notes.append(f"resume: learning rate at step {step}: {old_lr:.2e} -> {new_lr:.2e} "
                     f"(the schedule changed)")
    return notes


def save_checkpoint(path, record, iter_num, best_val_loss, model, optimizer, batches, world):
    """Called by every rank at a step boundary; rank 0 writes all an exact resume needs."""
    mine = {"data": batches.state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None}
    states = [mine] * world  # under DDP, each rank's own: gathered
    if world > 1:
        dist.all_gather_object(states, mine)
    if batches.rank == 0:
        with shards.atomic_write(path) as f:  # torch.save to a file: a full disk is an OSError
            torch.save({**record, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "iter_num": iter_num, "best_val_loss": best_val_loss,
                        "rank_states": states}, f)


def restore_rank_state(ckpt, path, batches, world):
    """This rank's data position and RNGs, from a checkpoint written by as many ranks."""
    if len(ckpt["rank_states"]) != world:
        raise ConfigError(f"{path} was written by {len(ckpt['rank_states'])} process(es); "
                          f"resume it with the same number (torchrun --nproc_per_node)")
    state = ckpt["rank_states"][batches.rank]
    batches.load_state(state["data"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# -----------------------------------------------------------------------------
# what a run says: lines on stdout, the same records in out_dir/log.jsonl (rank 0)

class Log:
    def __init__(self, out_dir, master, fresh):
        self.path, self.master = os.path.join(out_dir, "log.jsonl"), master
        if master and fresh and os.path.exists(self.path):
            os.remove(self.path)  # a fresh run starts a fresh log

    def __call__(self, record=None, line=None):
        if not self.master:
            return
        if line is not None:
            print(line, flush=True)
        if record is not None:
            with open(self.path, "a") as f:  # a full disk is an OSError: train() says what is kept
                f.write(json.dumps(record) + "\n")


def announce(log, cfg, changes, notes, settings, num_params, tokens_per_step, accumulation,
             world, data_dir, done_before, iter_num):
    """What the run is: a resume's changes, the settings in effect, the model and the step."""
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    for line in [f"resume: {k}: {a!r} -> {b!r}" for k, (a, b) in changes.items()] + notes:
        log(line=line)
    if cfg["resume"]:
        log(line=f"resuming {ckpt_path} at step {iter_num}")
    if done_before:
        log(line=f"{ckpt_path} is already at step {iter_num} of max_iters {cfg['max_iters']}: "
                 f"nothing to train; to go further, --resume with a larger --max_iters")
    if settings["warmup_iters"] != cfg["warmup_iters"]:
        log(line=f"note: warmup_iters {cfg['warmup_iters']} would fill the whole schedule: "
                 f"warming up for {plural(settings['warmup_iters'], 'step')}")
    log(line="settings: " + " ".join(f"{k}={v}" for k, v in settings.items()))
    log({"kind": "config", "iter": iter_num, "settings": settings,
         "changes": {k: list(v) for k, v in changes.items()}, "changes_in_effect": notes,
         "num_params": num_params, "device": settings["device"], "dtype": settings["dtype"],
         "world": world, "tokens_per_step": tokens_per_step},
        f"{cfg['value_mode']}: {num_params / 1e6:.2f}M parameters, {settings['device']} "
        f"{settings['dtype']}, {tokens_per_step:,} tokens/step ({cfg['batch_size']} x "
        f"{cfg['block_size']} x {plural(accumulation, 'micro-step')} x {plural(world, 'rank')}), "
        f"{plural(cfg['max_iters'], 'step')}, data {data_dir}")


# -----------------------------------------------------------------------------
# training

def train(cfg, given=None):
    """One training job; returns a summary dict with the trained model (tests use it). given: the
    settings named on the command line (what --resume changes); None = all of cfg."""
    check_settings(cfg)
    ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun?
    rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if ddp else (0, 1)
    setup_device(cfg["device"], cfg["dtype"])  # a bad one fails now
    os.makedirs(cfg["out_dir"], exist_ok=True)
    lock = None
    if rank == 0:  # one training run per out_dir (the OS drops the lock if this one dies)
        lock = shards.hold_lock(os.path.join(cfg["out_dir"], "train.lock"), ConfigError(
            f"{cfg['out_dir']} is in use by another training run: wait for it, stop it, "
            f"or use another --out_dir"))
    try:
        ckpt_path, ckpt, changes = os.path.join(cfg["out_dir"], "ckpt.pt"), None, {}
        if cfg["resume"]:
            ckpt = shards.load_checkpoint(ckpt_path)
            cfg, changes = resolve_resume(cfg, given, ckpt)
            check_settings(cfg)
        elif os.path.exists(ckpt_path) and not cfg["overwrite"]:
            raise ConfigError(f"{cfg['out_dir']} already holds a checkpoint: continue it with "
                              f"--resume, or train into another --out_dir (--overwrite "
                              f"replaces it)")
        if cfg["gradient_accumulation_steps"] % world:  # 0 (one per rank) always divides
            raise ConfigError(f"--gradient_accumulation_steps={cfg['gradient_accumulation_steps']}"
                              f" is the total over all ranks and must divide by the {world} ranks "
                              f"(0: one micro-step per rank)")
        device, dtype, autocast = setup_device(cfg["device"], cfg["dtype"])  # the run's own
        if ddp:
            dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
            if device.startswith("cuda"):
                device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
                torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        return run(cfg, ckpt, changes, device, dtype, autocast, rank, world)
    finally:
        if lock:
            lock.release()
        if ddp and dist.is_initialized():
            gc.collect()  # DDP's gloo work first: freed after the group, it aborts the process
            dist.destroy_process_group()


def build(cfg, meta, device, ckpt, settings, data):
    """(model on device, AdamW, what each checkpoint holds besides them), fresh or from ckpt."""
    torch.manual_seed(cfg["seed"])  # the same initial weights on every rank
    vocab_size = -(-meta["vocab_size"] // 64) * 64  # a multiple of 64: faster matmuls
    model_args = dict(GPTConfig.from_dict({**cfg, "vocab_size": vocab_size}).__dict__)
    model = GPT(GPTConfig(**model_args))
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    model.to(device)  # before AdamW: its state lives where the weights do
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                           (cfg["beta1"], cfg["beta2"]), device_type(device),
                                           cfg["lambda_lr_scale"])
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    return model, optimizer, {
        "format": shards.CHECKPOINT_FORMAT, "model_args": model_args, "data": data,
        "config": {k: cfg[k] for k in cfg if k not in ACTIONS}, "settings_in_effect": settings,
        "tokenizer": {k: meta[k] for k in ("tokenizer", "vocab_size", "eot")}}


def run(cfg, ckpt, changes, device, dtype, autocast, rank, world):
    """The training loop proper, for train(): data, model, steps, evaluations, checkpoints."""
    ddp, ckpt_path = world > 1, os.path.join(cfg["out_dir"], "ckpt.pt")
    accumulation = cfg["gradient_accumulation_steps"] // world or 1  # this rank's micro-steps
    log = Log(cfg["out_dir"], rank == 0, fresh=not cfg["resume"])
    meta, data, val_shards, batches, eval_batches = open_data(cfg, rank, world)

    settings = in_effect(cfg, device, dtype)
    raw_model, optimizer, record = build(cfg, meta, device, ckpt, settings, data)
    iter_num, best_val_loss, saved_iter, notes = 0, float("inf"), None, []
    torch.manual_seed(cfg["seed"] + rank)  # then each rank its own dropout stream
    if ckpt is not None:
        notes = resume_notes(ckpt, cfg, changes, settings, data)
        restore_rank_state(ckpt, ckpt_path, batches, world)
        iter_num = saved_iter = ckpt["iter_num"]
        best_val_loss = ckpt["best_val_loss"]
    start_iter, ckpt = iter_num, None  # free the checkpoint's memory
    scaler = torch.amp.GradScaler(device_type(device), enabled=dtype == "float16")
    model = torch.compile(raw_model) if cfg["compile"] else raw_model
    if ddp:
        model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])] if device.startswith("cuda")
                    else None)
    tokens_per_step = cfg["batch_size"] * cfg["block_size"] * accumulation * world
    done_before = cfg["resume"] and iter_num >= cfg["max_iters"]  # a finished run, resumed
    announce(log, cfg, changes, notes, settings, raw_model.num_params(), tokens_per_step,
             accumulation, world, data["dir"], done_before, iter_num)
    peak = gpu_peak_flops(torch.cuda.get_device_name(device)) if device.startswith("cuda") else None

    evals, speeds, status, val_loss, full_val = [], [], "done", float("nan"), None
    ctrl_c, t_run, t0, last_iter = CtrlC(log), time.time(), time.time(), iter_num
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
                evals.append({"iter": iter_num, "tokens": iter_num * tokens_per_step,
                              "train_loss": losses["train"], "val_loss": val_loss})
                line = f"step {iter_num}: train loss {losses['train']:.4f}, val loss {val_loss:.4f}"
                mixing = raw_model.mixing_weights()  # what training makes of them, layer by layer
                if mixing:
                    evals[-1]["mixing"] = mixing
                    line += ", " + describe_mixing(mixing)
                log({"kind": "eval", **evals[-1]}, line)
                if iter_num > start_iter:
                    save_checkpoint(ckpt_path, record, iter_num, best_val_loss, raw_model,
                                    optimizer, batches, world)
                    saved_iter = iter_num
                t0 = time.time()  # evaluation time is not training time
            if iter_num >= cfg["max_iters"]:
                break
            if (not ddp or iter_num % cfg["log_interval"] == 0) and ctrl_c.agreed(device, ddp):
                status = "interrupted"
                save_checkpoint(ckpt_path, record, iter_num, best_val_loss, raw_model, optimizer,
                                batches, world)
                again = f"torchrun --nproc_per_node={world}" if ddp else "python"
                log(line=f"interrupted at step {iter_num}: saved {ckpt_path}; continue with "
                         f"{again} train.py --out_dir={cfg['out_dir']} --resume")
                break

            # the training step: micro-steps (gradients summed), clip, AdamW, clear
            lr = get_lr(iter_num, cfg)
            for group in optimizer.param_groups:  # lr_scale: the learned lambdas' own multiple
                group["lr"] = lr * group["lr_scale"]
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
                lossf = mean_over_ranks(loss.detach() * accumulation, world)
                if not math.isfinite(lossf):  # every rank checks the same mean: all stop together
                    status = "diverged"
                    break
                dt = (time.time() - t0) / (iter_num - last_iter)
                rec = {"kind": "train", "iter": iter_num, "loss": lossf, "lr": lr,
                       "ms_per_step": 1000 * dt, "tokens_per_sec": tokens_per_step / dt}
                if peak:  # a GPU of known peak FLOP/s
                    rec["mfu"] = raw_model.estimate_mfu(rec["tokens_per_sec"] / world, peak,
                                                        cfg["block_size"])
                if last_iter > start_iter:  # the first window includes start-up, compilation
                    speeds.append(rec["tokens_per_sec"])
                eta = ((time.time() - t_run) / (iter_num - start_iter)
                       * (cfg["max_iters"] - iter_num))
                log(rec, f"iter {iter_num}/{cfg['max_iters']}: loss {lossf:.4f}, lr {lr:.2e}, "
                         f"{rec['ms_per_step']:.0f} ms/step, {rec['tokens_per_sec']:,.0f} tok/s"
                         + (f", mfu {100 * rec['mfu']:.1f}%" if "mfu" in rec else "")
                         + f", ETA {eta // 60:.0f}m{eta % 60:02.0f}s")
                t0, last_iter = time.time(), iter_num
    except KeyboardInterrupt:  # the second Ctrl-C: stop now; the last checkpoint stays as it was
        status = "interrupted"
        log(line=f"\nstopped at once: kept the last checkpoint in {ckpt_path}")
    except OSError as e:  # a full disk: one line that says which checkpoint is whole
        raise shards.no_space(e, saved_iter, ckpt_path, log.path) from None
    finally:
        ctrl_c.restore()

    if status == "done":  # the final number: every validation token once, not a sample of windows
        full_val, n = full_split_loss(raw_model, val_shards, cfg["block_size"], cfg["batch_size"],
                                      device, autocast, rank, world)
        log({"kind": "final", "iter": iter_num, "val_loss_full": full_val, "val_tokens": n},
            f"val loss over the whole validation split ({n:,} tokens): {full_val:.4f}")
        log(line=f"{'kept' if done_before else 'saved'} {ckpt_path} (step {iter_num}); sample "
                 f"from it: python sample.py --out_dir={cfg['out_dir']}")
    if status == "diverged":
        log({"kind": "diverged", "iter": iter_num},
            f"loss is not finite at step {iter_num}: stopped; the last good checkpoint is "
            f"{ckpt_path} (try a lower --learning_rate or --grad_clip=1.0)")
    return {"status": status, "iter": iter_num, "val_loss": val_loss, "val_loss_full": full_val,
            "best_val_loss": best_val_loss, "evals": evals, "num_params": raw_model.num_params(),
            "tokens_per_sec": sorted(speeds)[len(speeds) // 2] if speeds else float("nan"),
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
    """(mean loss, tokens) over every token of a split once: consecutive windows of each shard (the
    last one shorter), each token predicted from those before it in its window; DDP ranks share."""
    windows = [(tokens, s, min(block_size, len(tokens) - 1 - s))
               for tokens in token_shards for s in range(0, len(tokens) - 1, block_size)]
    total, count = 0.0, 0
    model.eval()
    for i in range(rank * batch_size, len(windows), world * batch_size):
        batch = windows[i:i + batch_size]
        for length in sorted({n for _, _, n in batch}):  # equal lengths together (the last differs)
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


def describe_mixing(mixing):
    """'value_lambdas (V_1/V_n) 0.52/0.48 0.51/0.49 ...': each kind of mixing weight, by layer."""
    kinds = {}
    for name, value in mixing.items():
        kinds.setdefault(name.rpartition(".")[2], []).append(value)
    return ", ".join(f"{kind} " + " ".join("/".join(f"{x:.2f}" for x in v) if isinstance(v, list)
                                           else f"{v:.2f}" for v in values)
                     for kind, values in kinds.items())


def mean_over_ranks(value, world):
    """A scalar tensor's mean over the ranks, as a float (a GPU sync: only when logging)."""
    if world > 1:
        dist.all_reduce(value)
        value /= world
    return value.item()


def main(argv):
    return EXIT_CODES[train(parse_args(SETTINGS, argv, USAGE), given_keys(argv))["status"]]


if __name__ == "__main__":
    run_main(main)
