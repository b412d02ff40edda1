"""Train a GPT in any value mode on token shards: on a laptop CPU, one GPU, or several (torchrun).

    python train.py                                  # the CPU quickstart (prepares data if needed)
    python train.py --value_mode=vanilla             # any setting: --key=value (--help lists them)
    python train.py config/gpt2_124m.py              # a preset, then overrides
    python train.py --resume --max_iters=8000        # continue out_dir/ckpt.pt exactly, further
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py   # 8 GPUs, same step
"""
import bisect
import contextlib
import fcntl  # the lock on a run's folder (POSIX: Linux, macOS; on Windows, use WSL)
import gc
import itertools
import json
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
from configurator import (COUNT, POSITIVE, ConfigError, above, at_least, between, defaults,
    given_keys, gpu_peak_flops, one_of, parse_args, plural, run_main, setup_device)
from model import GPT, VALUE_MODES, GPTConfig

# The settings, name=(default, meaning[, check]); the defaults are config/quickstart.py's.
SETTINGS = dict(
    out_dir=("out", "folder for ckpt.pt and log.jsonl"),
    eval_interval=(500, "evaluate (and save a checkpoint) every this many steps", POSITIVE),
    log_interval=(100, "print and log the training loss every this many steps", POSITIVE),
    eval_iters=(20, "batches per loss estimate during training", POSITIVE),
    resume=(False, "continue out_dir/ckpt.pt: its settings, changed only where given"),
    overwrite=(False, "start afresh even if out_dir already holds a checkpoint"),
    seed=(1337, "seed of the initial weights and of the order of the training batches",
          between(0, 2**63 - 1)),  # (torch's seeds)
    nudge=(0, "nonzero: each initial weight one float32 step up or down (a seeded coin)", COUNT),
    dataset=(data.DEFAULT_DATASET, "data/<dataset>/ from prepare.py, or a path to such a folder"),
    batch_size=(12, "sequences per micro-step", POSITIVE),
    block_size=(64, "tokens per sequence (the model's context length)", POSITIVE),
    gradient_accumulation_steps=(0, "micro-steps per optimizer step, in all, divided over "
                                    "torchrun's processes (0 = one per process)", COUNT),
    # the model (GPTConfig in model.py)
    n_layer=(4, "transformer blocks", POSITIVE),
    n_head=(4, "attention heads", POSITIVE),
    n_kv_head=(0, "key/value heads for grouped-query attention (0 = n_head)", COUNT),
    n_embd=(128, "model width", POSITIVE),
    dropout=(0.0, "dropout rate", between(0.0, 0.99)),
    bias=(False, "biases in Linear and LayerNorm layers"),
    value_mode=("resformer", " | ".join(VALUE_MODES) + " (model.py)", one_of(*VALUE_MODES)),
    lambda_1=(0.5, "resformer: weight of layer 1's value V_1 in every later layer's value"),
    lambda_2=(0.5, "resformer: weight of the layer's own value V_n (the paper's sweep: 1)"),
    learnable_lambda=(False, "resformer: learn (lambda_1, lambda_2) per layer, from the above"),
    lambda_lr_scale=(1.0, "mixing weights (e.g. learned lambdas): their lr as a multiple of the "
                          "weights'", at_least(0.0)),
    # AdamW, and the schedule (get_lr): a linear warmup, then a cosine down to min_lr
    learning_rate=(3e-3, "peak learning rate", above(0.0)),
    max_iters=(6000, "optimizer steps in all", COUNT),
    weight_decay=(0.1, "AdamW weight decay (of the matrices: model.py's parameter_groups)",
                  at_least(0.0)),
    beta1=(0.9, "AdamW beta1", between(0.0, 0.9999)),
    beta2=(0.95, "AdamW beta2", between(0.0, 0.9999)),
    grad_clip=(1.0, "clip the gradient norm to this (0 = off)", at_least(0.0)),
    warmup_iters=(100, "linear warmup steps (clipped to the run)", COUNT),
    lr_decay_iters=(0, "step where the cosine reaches min_lr (0 = max_iters)", COUNT),
    min_lr=(3e-4, "final learning rate (at most learning_rate)", at_least(0.0)),
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (bfloat16 where the GPU has it natively, float16 with loss scaling on "
                   "older CUDA GPUs, else float32), float32, bfloat16, float16"),
    compile=(False, "torch.compile the model (GPU; slow to start)"),
)
ACTIONS = ("resume", "overwrite")  # what a command does, not what a run is
USAGE = "usage: python train.py [config/preset.py ...] [--key=value ...]"


def decay_end(cfg):
    return cfg.lr_decay_iters or cfg.max_iters  # 0 means: at the last step


def warmup_steps(cfg):  # a warmup that would fill the schedule is cut to a tenth of it
    return cfg.warmup_iters if cfg.warmup_iters < decay_end(cfg) else decay_end(cfg) // 10


def get_lr(it, cfg):
    warmup, end = warmup_steps(cfg), decay_end(cfg)
    if it < warmup:
        return cfg.learning_rate * (it + 1) / (warmup + 1)
    if it >= end:
        return cfg.min_lr
    cosine = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (end - warmup)))  # 1 -> 0
    return cfg.min_lr + cosine * (cfg.learning_rate - cfg.min_lr)


def training_step(model, optimizer, scaler, batches, grad_accum, grad_clip, autocast):
    """One AdamW step on grad_accum micro-batches (bench.py times this very step); the last loss."""
    for micro_step in range(grad_accum):
        # DDP averages gradients over processes in backward(): only the last micro-step needs it.
        last = micro_step == grad_accum - 1
        with model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext():
            x, y = batches.next()
            with autocast:
                _, loss = model(x, y)
            # .grad sums the micro-steps' gradients: each loss / their number makes that the mean.
            scaler.scale(loss / grad_accum).backward()
    if grad_clip > 0:
        # fp16: gradients carry the scaler's factor; divide it out so clipping sees the true norm.
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)  # AdamW's update (fp16: skipped if a gradient is not finite)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)  # the next step's gradients start from zero
    return loss


def train(cfg, given=None):
    """One run: returns its numbers and model. given: the settings typed, which --resume changes."""
    # Under torchrun each process runs this file (RANK: which, WORLD_SIZE: how many); rank 0 writes.
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    check(cfg, world)
    device, dtype, autocast = setup_device(cfg.device, cfg.dtype)
    data_dir = data.dataset_dir(cfg.dataset)
    if cfg.dataset == data.DEFAULT_DATASET and not cfg.resume:  # the plays, on first use:
        data.prepare_default(data_dir, wait=rank != 0)  # rank 0 tokenizes, the others wait
    identity = None if cfg.resume else data.data_identity(data_dir)  # missing data fails here
    with contextlib.ExitStack() as held:  # what the run holds, let go however it ends
        held.enter_context(locked(cfg.out_dir, rank))  # out_dir is this run's until it ends
        ckpt, changes = checkpoint_to_resume(cfg), {}
        if ckpt is not None:  # --resume: the checkpoint's settings, changed only where given
            cfg, changes, identity = resumed(cfg, given, ckpt, world)
            data_dir = data.dataset_dir(cfg.dataset)  # the checkpoint's, unless --dataset given
            device, dtype, autocast = setup_device(cfg.device, cfg.dtype)  # and its dtype
        if world > 1:  # each process its own GPU (LOCAL_RANK: its number on this machine)
            if device.startswith("cuda"):
                device = f"cuda:{os.environ['LOCAL_RANK']}"
                torch.cuda.set_device(device)
            dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
            held.callback(end_process_group)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        grad_accum = cfg.gradient_accumulation_steps // world or 1  # micro-steps per process
        tokens_per_step = cfg.batch_size * cfg.block_size * grad_accum * world
        log = Log(cfg.out_dir, rank == 0, resume_at=ckpt and ckpt["iter_num"])

        # The data: random train windows (a stream per process), fixed ones for the loss estimates.
        meta = data.load_meta(data_dir)
        splits = {split: [data.read_shard(p, meta["vocab_size"]) for p in
                          data.list_shards(data_dir, split)] for split in ("train", "val")}
        batches = Batches(splits["train"], cfg, rank_seed(cfg.seed, rank), "train", device)
        fixed = {s: Batches(shards, cfg, 1234, s, device) for s, shards in splits.items()}

        # The model and AdamW, fresh or resumed: the same seed gives every process the same weights.
        torch.manual_seed(cfg.seed)
        vocab = -(-meta["vocab_size"] // 64) * 64  # padded to a multiple of 64: faster matmuls
        raw_model = GPT(GPTConfig.from_dict({**vars(cfg), "vocab_size": vocab}))
        if cfg.nudge:  # the same run rounded differently: each initial weight one float32 step
            coins = torch.Generator().manual_seed(cfg.nudge)  # up or down (compare's noise floor)
            for p in raw_model.parameters():
                up = torch.rand(p.shape, generator=coins) < 0.5
                p.data = torch.nextafter(p.data, torch.where(up, math.inf, -math.inf))
        if ckpt is not None:
            raw_model.load_state_dict(ckpt["model"])
        raw_model.to(device)  # before AdamW: its state lives where the weights do
        optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                                   (cfg.beta1, cfg.beta2), device.split(":")[0],
                                                   cfg.lambda_lr_scale)
        torch.manual_seed(rank_seed(cfg.seed, rank))  # from here on, each process its own stream
        record = {"format": data.CHECKPOINT_FORMAT, "data": identity, "iter_num": 0,
                  "best_val_loss": float("inf"), "val_loss": None,
                  "model_args": vars(raw_model.config), "config": settings_of(cfg),
                  "tokenizer": {k: meta[k] for k in ("tokenizer", "vocab_size", "eot")}}
        if ckpt is not None:
            optimizer.load_state_dict(ckpt["optimizer"])
            record.update({k: ckpt.get(k) for k in ("iter_num", "best_val_loss", "val_loss")})
            restore_rng(ckpt, batches, rank, world, cfg.out_dir)
        ckpt, iter_num, start_iter = None, record["iter_num"], record["iter_num"]  # ckpt: freed
        model = torch.compile(raw_model) if cfg.compile else raw_model
        if world > 1:  # DDP averages the gradients of all processes inside backward()
            model = DDP(model, device_ids=[device] if device.startswith("cuda") else None)
        # fp16 needs the loss scaled up so small gradients do not round to zero (bf16, fp32: off)
        scaler = torch.amp.GradScaler(device.split(":")[0], enabled=dtype == "float16")
        # MFU: the FLOP/s achieved per GPU over its 16-bit peak (none on the CPU or an unknown GPU)
        peak = gpu_peak_flops(torch.cuda.get_device_name(device) if device.startswith("cuda")
                              else device, dtype)
        announce(log, cfg, changes, raw_model, iter_num, (device, dtype),
                 (world, grad_accum, tokens_per_step))

        evals, t_start = [], time.time()
        t0, timed_from = t_start, iter_num  # the clock of the steps since the last log line
        while True:
            # Every eval_interval steps and at the end: the loss, and a checkpoint for exact resume.
            at_end = iter_num >= cfg.max_iters
            if (iter_num % cfg.eval_interval == 0 or at_end) and (iter_num > start_iter
                                                                 or iter_num == 0):
                losses = estimate_loss(raw_model, fixed, cfg.eval_iters, autocast)
                record["best_val_loss"] = min(record["best_val_loss"], losses["val"])
                record["val_loss"] = losses["val"]  # this checkpoint's own (sample.py says it)
                evals.append({"iter": iter_num, "tokens": iter_num * tokens_per_step,
                              "train_loss": losses["train"], "val_loss": losses["val"]})
                mixing = raw_model.mixing_weights()  # what training makes of them, by layer
                evals[-1].update({"mixing": mixing} if mixing else {})
                log({"kind": "eval", **evals[-1]}, f"step {iter_num}: train loss "
                    f"{losses['train']:.4f}, val loss {losses['val']:.4f}{mixing_line(mixing)}")
                stop_if_diverged(losses["val"], log, iter_num, cfg.out_dir)
                if iter_num > start_iter:
                    record["iter_num"] = iter_num
                    save_checkpoint(cfg.out_dir, record, raw_model, optimizer, batches, world)
                t0, timed_from = time.time(), iter_num  # evaluation is not training time
            if at_end:
                break

            # The training step, each parameter group at the scheduled lr x its own lr_scale.
            lr = get_lr(iter_num, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr * group["lr_scale"]
            loss = training_step(model, optimizer, scaler, batches, grad_accum, cfg.grad_clip,
                                 autocast)
            iter_num += 1

            if iter_num % cfg.log_interval == 0 or iter_num == cfg.max_iters:
                lossf = mean_over_processes(loss.detach(), world)  # a GPU sync: here only
                stop_if_diverged(lossf, log, iter_num, cfg.out_dir)  # every process: the same mean
                dt = (time.time() - t0) / (iter_num - timed_from)
                eta = round((time.time() - t_start) / (iter_num - start_iter)
                            * (cfg.max_iters - iter_num))  # whole seconds: never "5m60s"
                mfu = peak and raw_model.estimate_mfu(tokens_per_step / dt / world, peak)
                log({"kind": "train", "iter": iter_num, "loss": lossf, "lr": lr,
                     "ms_per_step": 1000 * dt, "tokens_per_sec": tokens_per_step / dt,
                     **({"mfu": mfu} if mfu else {})},
                    f"iter {iter_num}/{cfg.max_iters}: loss {lossf:.4f}, lr {lr:.2e}, "
                    f"{1000 * dt:.0f} ms/step, {tokens_per_step / dt:,.0f} tok/s, "
                    + (f"mfu {100 * mfu:.1f}%, " if mfu else "") + f"ETA {eta // 60}m{eta % 60:02d}s")
                t0, timed_from = time.time(), iter_num

        # The final number: the loss over every token of the validation split, each once.
        t_final = time.time()
        val_loss_full, n = full_split_loss(raw_model, splits["val"], cfg, autocast, rank, world)
        log({"kind": "final", "iter": iter_num, "val_loss_full": val_loss_full, "val_tokens": n,
             "seconds": time.time() - t_final},
            f"val loss over the whole validation split ({n:,} tokens): {val_loss_full:.4f}")
        log(line=f"{'saved' if iter_num > start_iter else 'kept'} {cfg.out_dir}/ckpt.pt (step "
                 f"{iter_num}); sample from it: python sample.py --out_dir={cfg.out_dir}")
    return {"iter": iter_num, "evals": evals, "val_loss_full": val_loss_full, "model": raw_model,
            "best_val_loss": record["best_val_loss"]}


def main(argv):
    cfg = parse_args(SETTINGS, argv, USAGE, "train.py")
    try:
        train(cfg, given_keys(argv))
    except KeyboardInterrupt:  # Ctrl-C: run_main says what is kept and how to go on, exits 130
        path = os.path.join(cfg.out_dir, "ckpt.pt")  # mmap: reads its step, not its weights
        at = os.path.exists(path) and torch.load(path, mmap=True, weights_only=True)["iter_num"]
        raise KeyboardInterrupt(f"{path} (step {at}) is kept: go on with python train.py "
                                f"--resume --out_dir={cfg.out_dir}" if at else "no checkpoint yet")


# ---- below: what train() uses, which a first reading can skip ----

def check(cfg, world=1):
    """Settings that only make sense together (world: torchrun's processes), and the model's."""
    if cfg.min_lr > cfg.learning_rate:
        raise ConfigError(f"--min_lr={cfg.min_lr}: must be at most learning_rate "
                          f"({cfg.learning_rate})")
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ConfigError(f"--out_dir={cfg.out_dir} is a file: name a folder")
    if cfg.gradient_accumulation_steps % world:  # 0 (one per process) always divides
        raise ConfigError(f"--gradient_accumulation_steps={cfg.gradient_accumulation_steps} is "
                          f"the total over all processes: it must divide by their number "
                          f"({world}); 0 is one micro-step per process")
    try:
        GPTConfig.from_dict(vars(cfg))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def settings_of(cfg):
    """A run's settings as its checkpoint keeps them: without the command's actions."""
    return {k: v for k, v in vars(cfg).items() if k not in ACTIONS}


def rank_seed(seed, rank):
    """Rank 0's seed is the seed (one process is the plain run); another rank's, from SeedSequence
    (seed, rank), is no plain seed's (with seed + rank, rank 1 of seed s would replay s + 1)."""
    return seed if rank == 0 else int(np.random.SeedSequence([seed, rank]).generate_state(
        1, np.uint64)[0] >> 1)


class Batches:
    """(x, y) batches of random windows from a split's shards, by a generator a checkpoint keeps."""

    def __init__(self, shards, cfg, seed, split, device="cpu"):
        self.shards, self.B, self.T, self.device = shards, cfg.batch_size, cfg.block_size, device
        self.seed, self.generator = seed, torch.Generator().manual_seed(seed)
        # The windows that start in each shard, numbered across all (bisect finds one). A shard's
        # last window is never drawn, one short of nanoGPT: a fix would change every record.
        self.windows = [max(len(s) - self.T - 1, 0) for s in shards]
        self.ends = list(itertools.accumulate(self.windows))
        if self.ends[-1] < 1:
            longest = max(len(s) for s in shards)
            fix = f"use --block_size={longest - 2} or less, or " if longest > 2 else ""
            raise data.DataError(f"the {split} split's longest shard has {plural(longest, 'token')}"
                                 f", fewer than one window needs (block_size {self.T} + 2): {fix}"
                                 f"prepare more text")

    def next(self):
        rows = []
        for i in torch.randint(self.ends[-1], (self.B,), generator=self.generator).tolist():
            s = bisect.bisect_right(self.ends, i)  # window i starts in shard s
            start = i - (self.ends[s] - self.windows[s])
            rows.append(torch.from_numpy(self.shards[s][start:start + self.T + 1].astype("int64")))
        rows = torch.stack(rows)
        if self.device.startswith("cuda"):  # as nanoGPT: from pinned memory, the copy to the GPU
            rows = rows.pin_memory().to(self.device, non_blocking=True)  # runs beside its work
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def reset(self):
        self.generator.manual_seed(self.seed)


@torch.no_grad()  # measuring needs no gradients: no graph is kept, which saves memory and time
def estimate_loss(model, fixed, eval_iters, autocast):
    """Mean loss over eval_iters fixed batches per split; eval() turns dropout off for it."""
    model.eval()
    losses, device = {}, model.lm_head.weight.device
    for split, batches in fixed.items():
        batches.reset()
        total = torch.zeros((), device=device)  # summed where it is computed: one sync
        for _ in range(eval_iters):
            with autocast:
                total += model(*batches.next())[1].float()
        losses[split] = total.item() / eval_iters
    model.train()
    return losses


@torch.no_grad()
def full_split_loss(model, shards, cfg, autocast, rank=0, world=1):
    """(mean loss, tokens) over every token of a split once, in consecutive windows per shard."""
    T, B, device = cfg.block_size, cfg.batch_size, model.lm_head.weight.device
    windows = [(tokens, s, min(T, len(tokens) - 1 - s))
               for tokens in shards for s in range(0, len(tokens) - 1, T)]
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, tokens
    model.eval()
    for i in range(rank * B, len(windows), world * B):
        batch = windows[i:i + B]
        for n in sorted({n for _, _, n in batch}):  # rows of one length together
            rows = torch.stack([torch.from_numpy(t[s:s + n + 1].astype("int64"))
                                for t, s, m in batch if m == n]).to(device)
            with autocast:
                logits, _ = model(rows[:, :-1], all_logits=True)
            sums[0] += torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), rows[:, 1:].flatten(), reduction="sum").item()
            sums[1] += rows[:, 1:].numel()
    model.train()
    if world > 1:
        dist.all_reduce(sums)
    return (sums[0] / sums[1]).item(), int(sums[1].item())


def mean_over_processes(value, world):
    """A scalar tensor's mean over the processes, as a float (a GPU sync)."""
    if world > 1:
        dist.all_reduce(value)
        value /= world
    return value.item()


def stop_if_diverged(loss, log, iter_num, out_dir):
    if not math.isfinite(loss):
        log({"kind": "diverged", "iter": iter_num})
        raise ConfigError(f"the loss is not finite at step {iter_num}: stopped; the last good "
                          f"checkpoint is {out_dir}/ckpt.pt (try a lower --learning_rate)")


@contextlib.contextmanager
def locked(out_dir, rank):
    """with locked(out_dir, rank): out_dir is this run's, by a lock the OS drops however it ends."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out_dir={out_dir}: cannot make that folder ({e.strerror})")
    folder = os.open(out_dir, os.O_RDONLY)
    try:
        if rank == 0:
            try:
                fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigError(f"{out_dir} is in use by another training run: wait for it, "
                                  f"stop it, or use another --out_dir") from None
        yield
    finally:
        os.close(folder)


def checkpoint_to_resume(cfg):
    """The checkpoint --resume continues, or None; a fresh run replaces one only if --overwrite."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    if not cfg.resume and os.path.exists(path) and not cfg.overwrite:
        raise ConfigError(f"{cfg.out_dir} already holds a checkpoint: continue it with --resume, "
                          f"or train into another --out_dir (--overwrite replaces it)")
    return data.load_checkpoint(path) if cfg.resume else None


def end_process_group():
    gc.collect()  # DDP's leftovers first: freed after the group, they abort the process
    dist.destroy_process_group()


def resumed(cfg, given, ckpt, world):
    """(settings: the checkpoint's, changed where given; the changes; the data's identity)."""
    saved = {**vars(defaults(SETTINGS)), **ckpt["config"], **{k: getattr(cfg, k) for k in ACTIONS}}
    given = set(vars(cfg) if given is None else given) - set(ACTIONS)
    changes = {k: (saved[k], getattr(cfg, k)) for k in given if saved[k] != getattr(cfg, k)}
    shape = [f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in changes.items()
             if k in ckpt["model_args"] and k != "dropout"]
    if shape:
        raise ConfigError(f"cannot resume {cfg.out_dir}/ckpt.pt: the model differs "
                          f"({', '.join(shape)}); a run keeps its shape: drop those settings, or "
                          f"start a new run in another --out_dir")
    cfg = type(cfg)(**{**saved, **{k: b for k, (_, b) in changes.items()}})
    check(cfg, world)
    then, identity = ckpt["data"], data.data_identity(data.dataset_dir(cfg.dataset))
    if then["sha256"] != identity["sha256"]:  # (a changed tokenizer changes the shards too)
        raise data.DataError(f"cannot resume {cfg.out_dir}/ckpt.pt: it trained on {then['dir']} "
                             f"({data.describe_tokens(then)}), which now holds other data "
                             f"({data.describe_tokens(identity)}, {identity['tokenizer']} tokens): "
                             f"prepare the original data again, or start a new run")
    return cfg, changes, identity


def save_checkpoint(out_dir, record, model, optimizer, batches, world):
    """Called by every process at a step boundary; rank 0 writes all an exact resume needs:
    weights, AdamW's moments, and each process's random-number and batch-stream states."""
    mine = {"data": {"generator": batches.generator.get_state()}, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None}
    states = [mine] * world
    if world > 1:
        dist.all_gather_object(states, mine)
    if world == 1 or dist.get_rank() == 0:
        with data.atomic_write(os.path.join(out_dir, "ckpt.pt")) as f:  # whole or not at all
            torch.save({**record, "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(), "rank_states": states}, f)


def restore_rng(ckpt, batches, rank, world, out_dir):
    """This process's random-number and batch-stream states, from a checkpoint of as many."""
    if len(ckpt["rank_states"]) != world:
        raise ConfigError(f"{out_dir}/ckpt.pt was written by {len(ckpt['rank_states'])} "
                          f"process(es): resume it with as many (torchrun --nproc_per_node)")
    state = ckpt["rank_states"][rank]
    batches.generator.set_state(state["data"]["generator"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Log:
    """log(record, line): the line on stdout, the record appended to out_dir/log.jsonl (rank 0)."""

    def __init__(self, out_dir, master, resume_at=None):
        self.path, self.master = os.path.join(out_dir, "log.jsonl"), master
        if master and os.path.exists(self.path):  # a fresh run, a fresh log; a resumed one
            with open(self.path) as f:            # drops what came after its checkpoint
                kept = [line for line in f if resume_at and json.loads(line)["iter"] <= resume_at]
            with data.atomic_write(self.path, "w") as f:
                f.writelines(kept)

    def __call__(self, record=None, line=None):
        if self.master and line is not None:
            print(line, flush=True)
        if self.master and record is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def announce(log, cfg, changes, model, iter_num, where, step):
    """First lines: a resume's changes, the settings in effect, where it runs, what it trains."""
    world, micro, tokens_per_step = step
    settings = {**settings_of(cfg), "warmup_iters": warmup_steps(cfg),
                "lr_decay_iters": decay_end(cfg), "n_kv_head": model.config.kv_heads,
                "device": where[0], "dtype": where[1]}
    for k, (a, b) in changes.items():
        log(line=f"resume: {k}: {a!r} -> {b!r}")
    if cfg.resume:
        log(line=f"resuming {cfg.out_dir}/ckpt.pt at step {iter_num}" + (
            ": at max_iters already, nothing to train (to go further: --resume with a larger "
            "--max_iters)" if iter_num >= cfg.max_iters else ""))
    log(line="settings: " + " ".join(f"{k}={v}" for k, v in settings.items()))
    gpu = f" ({torch.cuda.get_device_name(where[0])})" if where[0].startswith("cuda") else ""
    log(line=f"running on {where[0]}{gpu} in {where[1]}" + " with loss scaling" * (
        where[1] == "float16"))
    log({"kind": "config", "iter": iter_num, "settings": settings, "world": world,
         "num_params": model.num_params(), "tokens_per_step": tokens_per_step},
        f"{cfg.value_mode}: {model.num_params() / 1e6:.2f}M parameters, {tokens_per_step:,} "
        f"tokens/step ({cfg.batch_size} x {cfg.block_size} x {plural(micro, 'micro-step')} x "
        f"{world} process{'' if world == 1 else 'es'}), {plural(cfg.max_iters, 'step')}, "
        f"data {cfg.dataset}")


def mixing_line(mixing):
    """', value_lambdas 0.52/0.48 0.51/0.49 ...': each kind of mixing weight, layer by layer."""
    kinds = {}
    for name, value in mixing.items():
        kinds.setdefault(name.rpartition(".")[2], []).append(value)
    return "".join(f", {kind} " + " ".join("/".join(f"{x:.2f}" for x in v) if isinstance(v, list)
                                           else f"{v:.2f}" for v in values)
                   for kind, values in kinds.items())

if __name__ == "__main__":
    run_main(main)
