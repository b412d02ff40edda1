"""Train a GPT in any value mode on token shards: on a laptop CPU, one GPU, or several (torchrun).

    python train.py                                  # the CPU quickstart (prepares data if needed)
    python train.py --value_mode=vanilla             # any setting: --key=value (--help lists them)
    python train.py config/gpt2_124m.py              # a preset, then overrides
    python train.py --resume --max_iters=8000        # continue out_dir/ckpt.pt exactly, further
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py   # 8 GPUs, same step
"""
import fcntl  # the lock on a run's folder (POSIX: Linux, macOS; on Windows, use WSL)
import json
import math
import os
import re
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
from configurator import ConfigError, UserError, parse_args, plural, read_preset, run_main, setup_device
from model import GPT, GPTConfig, mixing_by_layer

# The settings, name=(default, meaning[, (lowest, highest)]); the defaults are config/quickstart.py.
SETTINGS = dict(
    out_dir=("out", "folder for ckpt.pt and log.jsonl"),
    eval_interval=(500, "evaluate (and save a checkpoint) every this many steps", (1, None)),
    log_interval=(100, "print and log the training loss every this many steps", (1, None)),
    eval_iters=(20, "batches per loss estimate during training", (1, None)),
    resume=(False, "continue out_dir/ckpt.pt: its settings, changed only where given"),
    overwrite=(False, "start afresh where out_dir holds a checkpoint (kept until the new one)"),
    seed=(1337, "seed of the initial weights and of the training batches", (0, 2**63 - 1)),
    dataset=(data.DEFAULT_DATASET, "data/<dataset>/ from prepare.py, or a path to such a folder"),
    batch_size=(12, "sequences per micro-step", (1, None)),
    block_size=(64, "tokens per sequence (the model's context length)", (1, None)),
    gradient_accumulation_steps=(0, "micro-steps per optimizer step, in all, divided over "
                                    "torchrun's processes (0 = one per process)", (0, None)),
    n_layer=(4, "transformer blocks (this and below: GPTConfig in model.py)", (1, None)),
    n_head=(4, "attention heads", (1, None)),
    n_kv_head=(0, "key/value heads for grouped-query attention (0 = n_head)", (0, None)),
    n_embd=(128, "model width", (1, None)),
    dropout=(0.0, "dropout rate", (0.0, 0.99)),
    bias=(False, "biases in Linear and LayerNorm layers"),
    value_mode=("resformer", "vanilla, resformer, svformer or value_embed (model.py)"),
    lambda_1=(0.5, "resformer: weight of layer 1's value V_1 in every later layer's value"),
    lambda_2=(0.5, "resformer: weight of the layer's own value V_n (the paper's sweep: 1)"),
    learnable_lambda=(False, "resformer: learn (lambda_1, lambda_2) per layer, from the above"),
    lambda_lr_scale=(1.0, "the learned mixing weights' lr, as a multiple of the lr", (0.0, None)),
    learning_rate=(3e-3, "peak learning rate (AdamW; the schedule: get_lr)", (1e-12, None)),
    max_iters=(6000, "optimizer steps in all", (0, None)),
    weight_decay=(0.1, "AdamW weight decay (of the matrices: model.py's parameter_groups)",
                  (0.0, None)),
    beta1=(0.9, "AdamW beta1", (0.0, 0.9999)),
    beta2=(0.95, "AdamW beta2", (0.0, 0.9999)),
    grad_clip=(1.0, "clip the gradient norm to this (0 = off)", (0.0, None)),
    warmup_iters=(100, "linear warmup steps (clipped to the run)", (0, None)),
    lr_decay_iters=(0, "step where the cosine reaches min_lr (0 = max_iters)", (0, None)),
    min_lr=(3e-4, "final learning rate (at most learning_rate)", (0.0, None)),
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (bfloat16 where the GPU has it natively, float16 with loss scaling on "
                   "older CUDA GPUs, else float32), float32, bfloat16, float16"),
    compile=(False, "torch.compile the model (GPU; slow to start)"),
)
ACTIONS = ("resume", "overwrite")  # what a command does, not what a run is
USAGE = "python train.py [config/preset.py ...] [--key=value ...]"
# Dense 16-bit tensor-core peak FLOP/s per GPU, for MFU: a GPU not listed gets none rather than a
# wrong one. Hopper SXM 989.4 TFLOP/s (datasheets: twice that, with sparsity), NVL 835, PCIe 756.
GPU_PEAK_FLOPS = {
    "H100 NVL": 835e12, "H200 NVL": 835e12, "H100 PCIe": 756e12, "H100": 989.4e12, "H200": 989.4e12,
    "GH200": 989.4e12, "A100": 312e12, "A10G": 70e12, "A10": 125e12, "L40S": 362e12, "L4": 121e12,
    "RTX 4090": 165e12, "RTX 3090": 71e12, "RTX A6000": 155e12, "V100": 125e12, "T4": 65e12}


def schedule(cfg):
    """(warmup steps, the step the cosine ends): a warmup that would fill it is cut to a tenth."""
    end = cfg.lr_decay_iters or cfg.max_iters
    return (cfg.warmup_iters if cfg.warmup_iters < end else end // 10), end


def get_lr(it, cfg):
    """A linear warmup, then a cosine down to min_lr (schedule)."""
    warmup, end = schedule(cfg)
    if it < warmup:
        return cfg.learning_rate * (it + 1) / (warmup + 1)
    if it >= end:
        return cfg.min_lr
    cosine = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (end - warmup)))  # 1 -> 0
    return cfg.min_lr + cosine * (cfg.learning_rate - cfg.min_lr)


def training_step(model, optimizer, batches, grad_accum, grad_clip, amp):
    """One AdamW step on grad_accum micro-batches (bench.py times this very step); the last loss.
    amp: (autocast, GradScaler), the scaler on only in float16."""
    autocast, scaler = amp
    for micro_step in range(grad_accum):
        # DDP averages gradients over processes in backward(): only the last micro-step needs it.
        last = micro_step == grad_accum - 1
        with model.no_sync() if isinstance(model, DDP) and not last else nullcontext():
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


@torch.no_grad()  # measuring needs no gradients: no graph is kept, which saves memory and time
def estimate_loss(model, batches, eval_iters, autocast):
    """Mean loss over the same eval_iters batches of each split; eval() turns dropout off."""
    model.eval()
    losses = {}
    for split, split_batches in batches.items():
        split_batches.reset()
        total = torch.zeros((), device=model.lm_head.weight.device)  # summed there: one sync
        for _ in range(eval_iters):
            with autocast:
                total += model(*split_batches.next())[1].float()
        losses[split] = total.item() / eval_iters
    model.train()
    return losses


def train(cfg, typed=None):
    """One run; returns its numbers and model. typed: the settings given, which a resume changes
    (None: all of cfg's)."""
    # Where it runs. Under torchrun each process runs this file (RANK: which, WORLD_SIZE: how
    # many, LOCAL_RANK: its GPU on this machine); rank 0 writes the files.
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    check(cfg, world)
    ckpt = None
    if cfg.resume:  # the checkpoint's settings, changed only where given
        ckpt = data.load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))
        cfg = resumed(cfg, typed, ckpt)
        check(cfg, world)
    device, dtype, autocast = setup_device(cfg.device, cfg.dtype)
    if world > 1:
        if device.startswith("cuda"):
            device = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    # The data: the plays are prepared on first use (by rank 0; the others wait at the barrier).
    data_dir = data.dataset_dir(cfg.dataset)
    if rank == 0 and cfg.dataset == data.DEFAULT_DATASET and not os.path.exists(
            os.path.join(data_dir, "meta.json")):
        print(f"{data_dir} is not prepared yet: running python prepare.py (once, offline)")
        prepare_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prepare.py")
        if subprocess.run([sys.executable, prepare_py, "--quiet"]).returncode != 0:
            raise data.DataError("python prepare.py failed (see above); run it to see why")
    if world > 1:
        dist.barrier()
    meta, identity = data.load_meta(data_dir), data.data_identity(data_dir)
    if ckpt is not None and ckpt["data"]["sha256"] != identity["sha256"]:
        raise data.DataError(f"cannot resume {cfg.out_dir}/ckpt.pt: {data_dir} now holds other "
                             f"data than it trained on; prepare that data again, or start anew")
    shards = {s: [data.read_shard(p, meta["vocab_size"]) for p in data.list_shards(data_dir, s)]
              for s in ("train", "val")}

    # The model and AdamW, fresh or resumed: the same seed gives every process the same weights.
    vocab = -(-meta["vocab_size"] // 64) * 64  # padded to a multiple of 64: faster matmuls
    config = GPTConfig.from_dict({**vars(cfg), "vocab_size": vocab})
    torch.manual_seed(cfg.seed)
    raw_model = GPT(config)
    if config.value_mode != "vanilla":
        start_like_vanilla(raw_model, cfg.seed)  # paired: every shared tensor starts as vanilla's
    if ckpt is not None:
        raw_model.load_state_dict(ckpt["model"])
    raw_model.to(device)  # before AdamW: its state lives where the weights do
    optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                               (cfg.beta1, cfg.beta2), cfg.lambda_lr_scale)
    # What a step needs in memory, said before it is tried: on a GPU a batch_size that does not
    # fit is halved (its micro-steps doubled) until it does; elsewhere too much is refused.
    fitted, memory_line = fit_memory(raw_model, cfg, world, device, dtype)
    batch_size, grad_accum = (ckpt or {}).get("fitted") or fitted[:2]  # a resume keeps its own
    # From here on each process draws its own numbers (dropout, and its stream of random train
    # windows): rank 0's seed is the seed; another rank's is drawn from (seed, rank), so that it
    # is no plain seed's. The loss estimates use the same fixed windows every time.
    seed = cfg.seed if rank == 0 else int(
        np.random.SeedSequence([cfg.seed, rank]).generate_state(1, np.uint64)[0] >> 1)
    torch.manual_seed(seed)
    batches = data.Batches(shards["train"], batch_size, cfg.block_size, seed, "train", device)
    fixed = {s: data.Batches(shards[s], batch_size, cfg.block_size, 1234, s, device)
             for s in shards}
    tokens_per_step = batch_size * cfg.block_size * grad_accum * world
    if rank == 0:
        lock(cfg.out_dir)  # out_dir is this run's until it ends
    if not cfg.resume and os.path.exists(os.path.join(cfg.out_dir, "ckpt.pt")) and not cfg.overwrite:
        raise ConfigError(f"{cfg.out_dir} already holds a checkpoint: continue it with --resume, "
                          f"or train into another --out_dir (--overwrite replaces it)")
    record = {"format": data.CHECKPOINT_FORMAT, "data": identity, "iter_num": 0,
              "best_val_loss": float("inf"), "val_loss": None, "model_args": vars(config),
              "config": {k: v for k, v in vars(cfg).items() if k not in ACTIONS},
              "fitted": (batch_size, grad_accum), "log": [],
              "tokenizer": {k: meta[k] for k in ("tokenizer", "vocab_size", "eot")}}
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        record.update({k: ckpt.get(k) for k in ("iter_num", "best_val_loss", "val_loss")})
        record["log"] = ckpt.get("log") or [  # (a checkpoint of 12-03 carries no log)
            e for e in map(json.loads, open(os.path.join(cfg.out_dir, "log.jsonl")))
            if e["iter"] <= ckpt["iter_num"]]
        restore_rng(ckpt, batches, rank, world, cfg.out_dir)
    iter_num = start_iter = record["iter_num"]
    model = torch.compile(raw_model) if cfg.compile else raw_model
    if world > 1:  # DDP averages the gradients of all processes inside backward()
        model = DDP(model, device_ids=[device] if device.startswith("cuda") else None)
    # fp16 needs the loss scaled up so small gradients do not round to zero (bf16, fp32: off)
    amp = autocast, torch.amp.GradScaler(device.split(":")[0], enabled=dtype == "float16")
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else None
    peak = gpu_peak_flops(gpu, dtype)  # for MFU: the FLOP/s achieved per GPU over its peak

    def log(entry=None, line=None):  # the line on stdout; the entry goes into log.jsonl
        if rank == 0 and line is not None:
            print(line, flush=True)
        if entry is not None:
            record["log"].append({"iter": iter_num, **entry})

    warmup, end = schedule(cfg)  # the settings in effect, where they differ from those asked
    settings = {**record["config"], "warmup_iters": warmup, "lr_decay_iters": end,
                "n_kv_head": config.kv_heads, "device": device, "dtype": dtype}
    log(line=f"{'resuming' if ckpt else 'training'} {cfg.out_dir} at step {iter_num}\nsettings: "
             + " ".join(f"{k}={v}" for k, v in settings.items()))
    log({"kind": "config", "settings": settings,
         "world": world, "num_params": raw_model.num_params(), "tokens_per_step":
         tokens_per_step, "fitted": record["fitted"], "memory_estimate_bytes": fitted[2]},
        f"{memory_line}\n{cfg.value_mode} on {device}{f' ({gpu})' if gpu else ''} in {dtype}"
        f"{' with loss scaling' * (dtype == 'float16')}: {raw_model.num_params() / 1e6:.2f}M "
        f"parameters, {tokens_per_step:,} tokens/step ({batch_size} x {cfg.block_size} x "
        f"{plural(grad_accum, 'micro-step')} x {world} process{'es' * (world > 1)}), "
        f"{plural(cfg.max_iters, 'step')}, data {cfg.dataset}")

    t0, timed_from = time.time(), iter_num  # the clock of the steps since the last log line
    while True:
        # Every eval_interval steps and at the end: the loss, and a checkpoint for exact resume.
        at_end = iter_num >= cfg.max_iters
        if (iter_num % cfg.eval_interval == 0 or at_end) and (iter_num > start_iter or
                                                               iter_num == 0):
            losses = estimate_loss(raw_model, fixed, cfg.eval_iters, autocast)
            record["best_val_loss"] = min(record["best_val_loss"], losses["val"])
            record["val_loss"] = losses["val"]  # this checkpoint's own (sample.py says it)
            mixing = raw_model.mixing_weights()  # what training makes of them, by layer
            log({"kind": "eval", "tokens": iter_num * tokens_per_step, "train_loss":
                 losses["train"], "val_loss": losses["val"], **({"mixing": mixing} if mixing else {})},
                f"step {iter_num}: train loss {losses['train']:.4f}, val loss "
                f"{losses['val']:.4f}{mixing_line(mixing)}")
            stop_if_diverged(losses["val"], iter_num, cfg, record)
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
        try:
            loss = training_step(model, optimizer, batches, grad_accum, cfg.grad_clip, amp)
        except torch.OutOfMemoryError:
            raise UserError(f"out of GPU memory at step {iter_num}: use --batch_size="
                            f"{max(batch_size // 2, 1)} --gradient_accumulation_steps="
                            f"{2 * grad_accum * world} (the same tokens per step)") from None
        iter_num += 1
        if iter_num == start_iter + 1 and iter_num % cfg.log_interval and iter_num < cfg.max_iters:
            t0, timed_from = time.time(), iter_num  # the first step (compiling) is not timed

        if iter_num % cfg.log_interval == 0 or iter_num == cfg.max_iters:
            lossf = loss.detach()
            if world > 1:
                dist.all_reduce(lossf)  # the mean over the processes: all stop alike
                lossf /= world
            lossf = lossf.item()  # a GPU sync: here only
            stop_if_diverged(lossf, iter_num, cfg, record)
            dt = (time.time() - t0) / (iter_num - timed_from)
            eta = round(dt * (cfg.max_iters - iter_num))  # whole seconds: never "5m60s"
            mfu = peak and raw_model.estimate_mfu(tokens_per_step / dt / world, peak)
            memory = gpu and torch.cuda.max_memory_allocated(device) / 2**30
            log({"kind": "train", "loss": lossf, "lr": lr, "ms_per_step": 1000 * dt,
                 "tokens_per_sec": tokens_per_step / dt, **({"mfu": mfu} if mfu else {}),
                 **({"peak_memory_gib": memory} if memory else {})},
                f"iter {iter_num}/{cfg.max_iters}: loss {lossf:.4f}, lr {lr:.2e}, "
                f"{1000 * dt:.0f} ms/step, {tokens_per_step / dt:,.0f} tok/s, "
                + (f"mfu {100 * mfu:.1f}%, " if mfu else "")
                + (f"peak memory {memory:.1f} GiB, " if memory else "")
                + f"ETA {eta // 60}m{eta % 60:02d}s")
            t0, timed_from = time.time(), iter_num

    # The final number: the loss over every token of the validation split, each once.
    t_final = time.time()
    val_loss_full, n = full_split_loss(raw_model, shards["val"], cfg, autocast, rank, world)
    log({"kind": "final", "val_loss_full": val_loss_full, "val_tokens": n,
         "seconds": time.time() - t_final},
        f"val loss over the whole validation split ({n:,} tokens): {val_loss_full:.4f}\n" + (
            f"{'saved' if iter_num > start_iter else 'kept'} {cfg.out_dir}/ckpt.pt (step "
            f"{iter_num}); sample from it: python sample.py --out_dir={cfg.out_dir}"
            if iter_num else "no step trained, so no checkpoint"))
    if world > 1:
        dist.destroy_process_group()
    if rank == 0:
        write_log(cfg.out_dir, record["log"])
        LOCKS.pop(os.path.realpath(cfg.out_dir)).close()  # the folder is free again
    return {"iter": iter_num, "val_loss_full": val_loss_full, "model": raw_model,
            "evals": [r for r in record["log"] if r["kind"] == "eval"],
            "best_val_loss": record["best_val_loss"]}


def given(argv):
    """The settings an argv sets, by presets or --key=value (a resume changes only these)."""
    return {k for a in argv if not a.startswith("-") for k in read_preset(a)} | {
        a[2:].partition("=")[0] for a in argv if a.startswith("--")}


def main(argv):
    cfg = parse_args(SETTINGS, argv, USAGE)
    try:
        train(cfg, given(argv))
    except KeyboardInterrupt:  # Ctrl-C: run_main says what is kept and how to go on, exits 130
        path = os.path.join(cfg.out_dir, "ckpt.pt")  # mmap: reads its step, not its weights
        at = os.path.exists(path) and torch.load(path, mmap=True, weights_only=True)["iter_num"]
        raise KeyboardInterrupt(f"{path} (step {at}) is kept: go on with python train.py "
                                f"--resume --out_dir={cfg.out_dir}" if at else "no checkpoint yet")


# ---- below: what train() uses, which a first reading can skip ----

def check(cfg, world):
    """Settings that only make sense together (world: torchrun's processes), and the model's."""
    if cfg.min_lr > cfg.learning_rate:
        raise ConfigError(f"--min_lr={cfg.min_lr}: must be at most learning_rate "
                          f"({cfg.learning_rate})")
    if cfg.gradient_accumulation_steps % world:  # 0 (one per process) always divides
        raise ConfigError(f"--gradient_accumulation_steps={cfg.gradient_accumulation_steps} is "
                          f"the total over all processes: it must divide by their number "
                          f"({world}); 0 is one micro-step per process")
    try:
        GPTConfig.from_dict(vars(cfg))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def start_like_vanilla(model, seed):
    """Pairing: each parameter a mode shares with vanilla starts at vanilla's draw for the seed
    (SVFormer's c_attn: vanilla's query and key rows), so a one-seed difference is the mode's,
    not that of draws shifted by the mode's extra or missing tensors."""
    torch.manual_seed(seed)
    vanilla = dict(GPT(replace(model.config, value_mode="vanilla", lambda_1=0.5, lambda_2=0.5,
                               learnable_lambda=False)).named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in vanilla and p.dim() and p.shape[1:] == vanilla[name].shape[1:]:
                p.copy_(vanilla[name][:len(p)])


LOCKS = {}  # out_dir: the open lock file of this process's run there


def lock(out_dir):
    """Locks out_dir/.lock while its file stays open: until train() ends, or (when a run fails)
    this process does, however it does: the OS drops the lock. A second run into the folder is
    refused. Where the file system has no locks (NFS mounted without them): a warning."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        held = LOCKS.pop(os.path.realpath(out_dir), None)  # this process's earlier run: done
        held = held or open(os.path.join(out_dir, ".lock"), "w")
    except OSError as e:
        raise ConfigError(f"--out_dir={out_dir}: cannot make that folder ({e.strerror})")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(f"{out_dir} is in use by another training run: wait for it, stop it, "
                          f"or use another --out_dir") from None
    except OSError as e:
        print(f"warning: {out_dir} cannot be locked here ({e.strerror}): do not train two runs "
              f"into it at once", file=sys.stderr)
    LOCKS[os.path.realpath(out_dir)] = held


def resumed(cfg, typed, ckpt):
    """The checkpoint's settings, changed where given (typed); the model's shape cannot change."""
    saved = {**{k: spec[0] for k, spec in SETTINGS.items()}, **ckpt["config"],
             **{k: getattr(cfg, k) for k in ACTIONS}}
    changes = {k: (saved[k], getattr(cfg, k)) for k in set(vars(cfg) if typed is None else typed)
               - set(ACTIONS)
               if k in saved and saved[k] != getattr(cfg, k)}
    shape = [f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in changes.items()
             if k in ckpt["model_args"] and k != "dropout"]
    if shape:
        raise ConfigError(f"cannot resume {cfg.out_dir}/ckpt.pt: the model differs "
                          f"({', '.join(shape)}); a run keeps its shape: drop those settings, or "
                          f"start a new run in another --out_dir")
    for k, (a, b) in changes.items():
        print(f"resume: {k}: {a!r} -> {b!r}")
    return type(cfg)(**{**saved, **{k: b for k, (_, b) in changes.items()}})


def memory_need(model, block_size, device, dtype):
    """(bytes a step needs whatever its batch, bytes per token of the batch). Fixed: 16 bytes a
    parameter (the weights, their gradients, AdamW's two moments). Per token: what a forward
    keeps for the backward (measured on two short sequences: a part per sequence, a part per
    token) and the logits' gradients."""
    kept = []
    for T in (min(block_size, 32), min(block_size, 64)):
        saved, x = {}, torch.zeros(1, T, dtype=torch.long, device=device)

        def pack(t):  # each storage once; the weights stay in memory anyway
            saved[t.untyped_storage().data_ptr()] = (not isinstance(t, torch.nn.Parameter)
                                                    ) * t.untyped_storage().nbytes()
            return t
        with torch.random.fork_rng(devices=[]), setup_device(device, dtype)[2], \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x, x)
        kept.append((T, sum(saved.values())))
    (t1, b1), (t2, b2) = kept
    per_token = (b2 - b1) / max(t2 - t1, 1) + 8 * model.config.vocab_size
    return 16 * sum(p.numel() for p in model.parameters()) + max(b1 - per_token * t1, 0), per_token


def fit_memory(model, cfg, world, device, dtype, gpu_free=None):
    """((batch_size, micro-steps, bytes a step needs), a line saying it): on a GPU, batch_size
    halved (micro-steps doubled: the same tokens per step) until a step fits; too much anywhere is
    refused, naming the settings to change. gpu_free: a GPU's free bytes (lab.memory's GPUs)."""
    fixed, per_token = memory_need(model, cfg.block_size, device, dtype)
    on_gpu = gpu_free is not None or device.startswith("cuda")
    if on_gpu:
        free = torch.cuda.mem_get_info(device)[0] if gpu_free is None else gpu_free
    else:  # what Linux can hand out; elsewhere, all of the memory there is
        found = re.search(r"MemAvailable:\s+(\d+) kB", open("/proc/meminfo").read()
                          if os.path.exists("/proc/meminfo") else "")
        free = int(found[1]) * 1024 if found else os.sysconf("SC_PHYS_PAGES") * os.sysconf(
            "SC_PAGE_SIZE")
    batch, accum = cfg.batch_size, cfg.gradient_accumulation_steps // world or 1
    need = lambda b: fixed + per_token * b * cfg.block_size  # noqa: E731
    while on_gpu and need(batch) > 0.9 * free and batch % 2 == 0:
        batch, accum = batch // 2, accum * 2
    line = (f"memory: about {need(batch) / 2**30:.2f} GiB a step ({fixed / 2**30:.2f} of it "
            f"the weights and AdamW), {free / 2**30:.1f} GiB free on {device}" + (
                f"; batch_size {cfg.batch_size} does not fit: {batch} x {accum} micro-steps "
                f"instead, the same tokens per step" if batch != cfg.batch_size else ""))
    if need(batch) > free:
        raise ConfigError(f"{line}: too much; use a smaller --batch_size or --block_size (with a "
                          f"larger --gradient_accumulation_steps for the same tokens per step)")
    return (batch, accum, need(batch)), line


def stop_if_diverged(loss, iter_num, cfg, record):
    if not math.isfinite(loss):  # compare.py reads the log's "diverged" as a result, not a failure
        record["log"].append({"kind": "diverged", "iter": iter_num})
        if int(os.environ.get("RANK", 0)) == 0:
            write_log(cfg.out_dir, record["log"])
        raise ConfigError(f"the loss is not finite at step {iter_num}: stopped; the last good "
                          f"checkpoint is {cfg.out_dir}/ckpt.pt (try a lower --learning_rate)")


def save_checkpoint(out_dir, record, model, optimizer, batches, world):
    """Called by every process at a step boundary; rank 0 writes all an exact resume needs:
    weights, AdamW's moments, each process's random-number and batch-stream states, the log."""
    mine = {"data": {"generator": batches.generator.get_state()}, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None}
    states = [mine] * world
    if world > 1:
        dist.all_gather_object(states, mine)
    if world == 1 or dist.get_rank() == 0:
        with data.atomic_write(os.path.join(out_dir, "ckpt.pt")) as f:  # whole or not at all
            torch.save({**record, "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(), "rank_states": states}, f)
        write_log(out_dir, record["log"])  # the log of exactly this checkpoint's steps


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


def write_log(out_dir, entries):
    """out_dir/log.jsonl, whole: written with each checkpoint and at the end, so an --overwrite
    keeps the old run's log until its own first checkpoint replaces the old one."""
    with data.atomic_write(os.path.join(out_dir, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(entry) + "\n" for entry in entries)


@torch.no_grad()
def full_split_loss(model, shards, cfg, autocast, rank=0, world=1):
    """(mean loss, tokens) over every token of a split once, in consecutive windows per shard."""
    T, B, device = cfg.block_size, cfg.batch_size, model.lm_head.weight.device
    windows = [(tokens, s, min(T, len(tokens) - 1 - s))
               for tokens in shards for s in range(0, len(tokens) - 1, T)]
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, tokens: summed there
    model.eval()
    for i in range(rank * B, len(windows), world * B):
        batch = windows[i:i + B]
        for n in sorted({n for _, _, n in batch}):  # rows of one length together
            rows = torch.stack([torch.from_numpy(t[s:s + n + 1].astype("int64"))
                                for t, s, m in batch if m == n]).to(device)
            with autocast:
                logits, _ = model(rows[:, :-1], all_logits=True)
            sums[0] += torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), rows[:, 1:].flatten(), reduction="sum")
            sums[1] += rows[:, 1:].numel()
    model.train()
    if world > 1:
        dist.all_reduce(sums)
    return (sums[0] / sums[1]).item(), int(sums[1].item())


def gpu_peak_flops(gpu, dtype):
    """The 16-bit peak of 'NVIDIA H100 80GB HBM3' (its longest key, a whole word), else None."""
    return next((GPU_PEAK_FLOPS[n] for n in sorted(GPU_PEAK_FLOPS, key=len, reverse=True)
                 if gpu and dtype != "float32" and re.search(rf"(?<!\w){re.escape(n)}(?!\w)",
                                                             gpu)), None)


def mixing_line(mixing):
    """', lambda_1/lambda_2 by layer 2: 0.52/0.48 3: 0.51/0.49 ...': each learned mix, labelled."""
    return "".join(f", {label} by layer " + " ".join(
        f"{layer}: " + "/".join(f"{x:.2f}" for x in values) for layer, values in by_layer.items())
        for label, by_layer in mixing_by_layer(mixing).items())


if __name__ == "__main__":
    run_main(main)
