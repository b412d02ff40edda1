"""Train a GPT in any value mode on token shards: on a laptop CPU, one GPU, or several (torchrun).

    python prepare.py && python train.py             # the CPU quickstart: the plays, as bytes
    python train.py --value_mode=vanilla             # any setting: --key=value (--help lists them)
    python train.py config/gpt2_124m.py              # a preset, then overrides
    python train.py --resume --max_iters=8000        # continue out_dir/ckpt.pt exactly, further
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py   # 8 GPUs, same step
"""
import math
import os
import re
import time
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
from configurator import ConfigError, parse_args, plural, read_preset, run_main
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
    gradient_accumulation_steps=(0, "micro-steps per step, over all processes (0: one each)",
                                 (0, None)),
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
    weight_decay=(0.1, "AdamW weight decay of the matrices (model.py)", (0.0, None)),
    beta1=(0.9, "AdamW beta1", (0.0, 0.9999)),
    beta2=(0.95, "AdamW beta2", (0.0, 0.9999)),
    grad_clip=(1.0, "clip the gradient norm to this (0 = off)", (0.0, None)),
    warmup_iters=(100, "linear warmup steps (clipped to the run)", (0, None)),
    lr_decay_iters=(0, "step where the cosine reaches min_lr (0 = max_iters)", (0, None)),
    min_lr=(3e-4, "final learning rate (at most learning_rate)", (0.0, None)),
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (bfloat16 on GPUs that have it, float16 on older ones, else float32)"),
    compile=(False, "torch.compile the model (GPU; slow to start)"),
)
ACTIONS = ("resume", "overwrite")  # settings of a command, not of a run: never saved
USAGE = "python train.py [config/preset.py ...] [--key=value ...]"
EVAL_SEED = 1234  # the loss estimates' windows: the same every time, in every run


def get_lr(it, cfg):
    """A linear warmup, then a cosine down to min_lr (schedule)."""
    warmup, end = schedule(cfg)
    if it < warmup:
        return cfg.learning_rate * (it + 1) / (warmup + 1)
    if it >= end:
        return cfg.min_lr
    cosine = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (end - warmup)))  # from 1 down to 0
    return cfg.min_lr + cosine * (cfg.learning_rate - cfg.min_lr)


def schedule(cfg):
    """(warmup steps, the step the cosine ends): a warmup that would fill it is cut to a tenth."""
    end = cfg.lr_decay_iters or cfg.max_iters
    return (cfg.warmup_iters if cfg.warmup_iters < end else end // 10), end


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
        total = torch.zeros((), device=model.lm_head.weight.device)  # on the device: one sync
        for _ in range(eval_iters):
            with autocast:
                total += model(*split_batches.next())[1].float()
        losses[split] = total.item() / eval_iters
    model.train()
    return losses


def train(cfg, given=None):
    """One run; its numbers and model. given: the settings a resume changes (None: every one)."""
    # Under torchrun every process runs this file (RANK: which one); rank 0 writes the files.
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    ckpt = data.load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt")) if cfg.resume else None
    cfg = check_settings(resume_settings(cfg, given, ckpt) if ckpt else cfg, world)
    device, dtype, autocast = data.setup_device(cfg.device, cfg.dtype)
    device = join_processes(device, world)
    shards, meta, data_record = load_data(cfg, ckpt)

    # The model and AdamW. The same seed gives every process the same weights.
    config = GPTConfig.from_dict({**vars(cfg), "vocab_size": data.padded_vocab(meta)})
    torch.manual_seed(cfg.seed)
    raw_model = GPT(config)
    if config.value_mode != "vanilla":
        start_like_vanilla(raw_model, cfg.seed)  # so a difference is the mode's, not the draw's
    if ckpt:
        resume_weights(raw_model, ckpt, cfg.out_dir)
    raw_model.to(device)  # before AdamW: its state lives where the weights do
    optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                               (cfg.beta1, cfg.beta2), cfg.lambda_lr_scale)
    # What a step needs in memory, said before it is tried (a resume keeps the batch it had).
    (batch_size, grad_accum, step_bytes), memory = fit_memory(raw_model, cfg, world, device, dtype)
    batch_size, grad_accum = ckpt["fitted"] if ckpt else (batch_size, grad_accum)
    # Each process draws its own windows (and dropout): rank 0 from the seed, another rank from
    # (seed, rank), no plain seed's. The loss estimates use the same fixed windows every time.
    seed = cfg.seed if rank == 0 else int(
        np.random.SeedSequence([cfg.seed, rank]).generate_state(1, np.uint64)[0] >> 1)
    torch.manual_seed(seed)
    batches = data.Batches(shards["train"], batch_size, cfg.block_size, seed, "train", device)
    eval_batches = {s: data.Batches(shards[s], batch_size, cfg.block_size, EVAL_SEED, s, device)
                    for s in shards}
    run = start_run(cfg, ckpt, dict(  # what a checkpoint holds beside the weights
        data=data_record, model_args=vars(config), fitted=[batch_size, grad_accum], world=world,
        tokens_per_step=batch_size * cfg.block_size * grad_accum * world, device=device,
        dtype=dtype, tokenizer={k: meta[k] for k in ("tokenizer", "vocab_size", "eot")}))
    if ckpt:  # AdamW's moments, and this process's random numbers and place in its batches
        optimizer.load_state_dict(ckpt["optimizer"])
        data.restore_rng(ckpt["rank_states"][rank], batches)
    model = torch.compile(raw_model) if cfg.compile else raw_model
    if world > 1:  # DDP averages the gradients of all processes inside backward()
        model = DDP(model, device_ids=[device] if device.startswith("cuda") else None)
    # fp16 needs the loss scaled up so small gradients do not round to zero (bf16, fp32: off)
    amp = autocast, torch.amp.GradScaler(device.split(":")[0], enabled=dtype == "float16")
    log_start(run, raw_model, cfg, memory, step_bytes)

    iter_num = start_iter = run["iter_num"]
    t0, timed_from = time.time(), iter_num  # the clock of the steps since the last log line
    while True:
        # Every eval_interval steps and at the end: the loss, and a checkpoint for exact resume.
        if (iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters) and (
                iter_num > start_iter or iter_num == 0):
            losses = estimate_loss(raw_model, eval_batches, cfg.eval_iters, autocast)
            log_eval(run, iter_num, losses, raw_model.mixing_weights())
            if iter_num > start_iter:
                data.save_checkpoint(run, iter_num, raw_model, optimizer, batches)
            t0, timed_from = time.time(), iter_num  # evaluation is not training time
        if iter_num >= cfg.max_iters:
            break
        # The training step, each parameter group at the scheduled lr x its own lr_scale.
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        loss = training_step(model, optimizer, batches, grad_accum, cfg.grad_clip, amp)
        iter_num += 1
        if iter_num == start_iter + 1 and iter_num % cfg.log_interval and iter_num < cfg.max_iters:
            t0, timed_from = time.time(), iter_num  # the first step (compiling) is not timed
        if iter_num % cfg.log_interval == 0 or iter_num == cfg.max_iters:
            log_step(run, iter_num, loss, lr, (time.time() - t0) / (iter_num - timed_from))
            t0, timed_from = time.time(), iter_num

    # The final number: the loss over every token of the validation split, each once.
    val_loss_full = log_final(run, raw_model, shards["val"], cfg, autocast, iter_num > start_iter)
    if world > 1:  # every process is done talking before any closes its connections
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        data.write_log(cfg.out_dir, run["log"])
    return {"iter": iter_num, "val_loss_full": val_loss_full, "model": raw_model, "evals": [
        r for r in run["log"] if r["kind"] == "eval"], "best_val_loss": run["best_val_loss"]}


def main(argv):
    cfg = parse_args(SETTINGS, argv, USAGE)
    try:
        train(cfg, given_settings(argv))
    except KeyboardInterrupt:  # Ctrl-C: run_main says what is kept and how to go on, exits 130
        path = os.path.join(cfg.out_dir, "ckpt.pt")  # mmap: reads its step, not its weights
        step = os.path.exists(path) and torch.load(path, mmap=True, weights_only=True)["iter_num"]
        raise KeyboardInterrupt(f"{path} (step {step}) is kept: go on with python train.py "
                                f"--resume --out_dir={cfg.out_dir}" if step else
                                "no checkpoint yet")


def given_settings(argv):
    """The settings an argv sets, by presets or --key=value (a resume changes only these)."""
    return {k for a in argv if not a.startswith("-") for k in read_preset(a)} | {
        a[2:].partition("=")[0] for a in argv if a.startswith("--")}


# ---- below: what train() uses, which a first reading can skip ----

def join_processes(device, world):
    """Under torchrun: this process's device (LOCAL_RANK: its GPU), in DDP's process group."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # faster
    if world > 1:
        if device.startswith("cuda"):
            device = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return device


def check_settings(cfg, world):
    """cfg, its settings checked together and by GPTConfig (world: torchrun's processes)."""
    if cfg.min_lr > cfg.learning_rate:
        raise ConfigError(f"--min_lr={cfg.min_lr}: must be at most learning_rate "
                          f"({cfg.learning_rate})")
    if cfg.gradient_accumulation_steps % world:  # 0 (one per process) always divides
        raise ConfigError(f"--gradient_accumulation_steps={cfg.gradient_accumulation_steps} is "
                          f"the total over all processes: it must divide by their number "
                          f"({world}); 0 is one micro-step per process")
    try:
        GPTConfig.from_dict(vars(cfg))  # the model's own checks: value modes, heads, sizes
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg


def resume_settings(cfg, given, ckpt):
    """The checkpoint's settings, changed where given; not its model's shape, nor its number of
    processes (each has its own random numbers)."""
    saved = {**{k: spec[0] for k, spec in SETTINGS.items()}, **ckpt["config"],
             **{k: getattr(cfg, k) for k in ACTIONS}}
    changes = {k: (saved[k], getattr(cfg, k)) for k in (vars(cfg) if given is None else given)
               if k in saved and k not in ACTIONS and saved[k] != getattr(cfg, k)}
    shape = [f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in changes.items()
             if k in ckpt["model_args"] and k != "dropout"]
    if shape:
        raise ConfigError(f"cannot resume {cfg.out_dir}/ckpt.pt: the model differs "
                          f"({', '.join(shape)}); a run keeps its shape: drop those settings, or "
                          f"start a new run in another --out_dir")
    if len(ckpt["rank_states"]) != int(os.environ.get("WORLD_SIZE", 1)):
        raise ConfigError(f"{cfg.out_dir}/ckpt.pt was written by {len(ckpt['rank_states'])} "
                          f"process(es): resume it with as many (torchrun --nproc_per_node)")
    for k, (a, b) in changes.items():
        print(f"resume: {k}: {a!r} -> {b!r}")
    return type(cfg)(**{**saved, **{k: b for k, (_, b) in changes.items()}})


def resume_weights(model, ckpt, out_dir):
    try:
        model.load_weights(ckpt["model"])
    except ValueError as e:  # model.py was edited since: a user's choice, not a bug
        raise ConfigError(f"cannot resume {out_dir}/ckpt.pt: {e}; start anew") from None


def load_data(cfg, ckpt):
    """(the train and val shards, memory-mapped; meta.json; what a checkpoint records of them);
    a resume checks that the data is what it trained on."""
    data_dir = data.dataset_dir(cfg.dataset)
    meta, data_record = data.load_meta(data_dir), data.data_identity(data_dir)
    if ckpt and ckpt["data"]["sha256"] != data_record["sha256"]:
        raise data.DataError(f"cannot resume {cfg.out_dir}/ckpt.pt: {data_dir} now holds other "
                             f"data than it trained on; prepare that data again, or start anew")
    return {s: [data.read_shard(p, meta["vocab_size"]) for p in data.list_shards(data_dir, s)]
            for s in ("train", "val")}, meta, data_record


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


def fit_memory(model, cfg, world, device, dtype, free=None):
    """((batch_size, micro-steps, bytes a step needs), a line saying it). A step needs 16 bytes a
    parameter (weights, gradients, AdamW's moments), and per token what a forward keeps for the
    backward and the logits' gradients. On a GPU batch_size halves (micro-steps double) until a
    step fits; too much is refused. free: bytes free (default: the GPU's, or what Linux has)."""
    T = min(cfg.block_size, 64)

    def saved(batch):  # the bytes a forward of batch x T tokens keeps for the backward
        kept = {}

        def keep(t):  # each storage once; the weights stay in memory anyway
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() * (
                not isinstance(t, torch.nn.Parameter))
            return t
        x = torch.zeros(batch, T, dtype=torch.long, device=device)
        with torch.random.fork_rng(devices=[]), data.setup_device(device, dtype)[2], \
                torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            model(x, x)
        return sum(kept.values())
    # Two batches' difference is per token; what a forward keeps once (under autocast, the
    # weights cast to 16 bits) is counted once, with the weights.
    kept_by_1, kept_by_2 = saved(1), saved(2)
    fixed = 16 * sum(p.numel() for p in model.parameters()) + max(2 * kept_by_1 - kept_by_2, 0)
    per_token = (kept_by_2 - kept_by_1) / T + 8 * model.config.vocab_size
    on_gpu = free is not None or device.startswith("cuda")
    meminfo = open("/proc/meminfo").read() if os.path.exists("/proc/meminfo") else ""
    free = free or (torch.cuda.mem_get_info(device)[0] if on_gpu else 1024 * int(
        (re.findall(r"MemAvailable:\s+(\d+)", meminfo) or [2**40])[0]))
    batch, accum = cfg.batch_size, cfg.gradient_accumulation_steps // world or 1
    while on_gpu and fixed + per_token * batch * cfg.block_size > 0.9 * free and batch % 2 == 0:
        batch, accum = batch // 2, accum * 2
    step_bytes = fixed + per_token * batch * cfg.block_size
    line = (f"memory: about {step_bytes / 2**30:.2f} GiB a step ({fixed / 2**30:.2f} of it the "
            f"weights and AdamW), {free / 2**30:.1f} GiB free on {device}" + (
                f"; batch_size {cfg.batch_size} does not fit: {batch} x {accum} micro-steps "
                f"instead, the same tokens per step" if batch != cfg.batch_size else ""))
    if step_bytes > free:
        raise ConfigError(f"{line}: too much; use a smaller --batch_size or --block_size (with a "
                          f"larger --gradient_accumulation_steps for the same tokens per step)")
    return (batch, accum, step_bytes), line


def start_run(cfg, ckpt, record):
    """The run's record (a resume's from its checkpoint). A checkpoint in out_dir is continued
    only with --resume, replaced only with --overwrite, and then once the new run wrote its own."""
    try:
        os.makedirs(cfg.out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out_dir={cfg.out_dir}: cannot make that folder ({e.strerror})")
    if os.path.exists(os.path.join(cfg.out_dir, "ckpt.pt")) and not (
            cfg.resume or cfg.overwrite):
        raise ConfigError(f"{cfg.out_dir} already holds a checkpoint: continue it with --resume, "
                          f"or train into another --out_dir (--overwrite replaces it)")
    run = {"format": data.CHECKPOINT_FORMAT, "iter_num": 0, "best_val_loss": float("inf"),
           "val_loss": None, "log": [], **record,
           "config": {k: v for k, v in vars(cfg).items() if k not in ACTIONS}}
    return {**run, **{k: ckpt[k] for k in ("iter_num", "best_val_loss", "val_loss", "log")}} \
        if ckpt else run


def log(run, iter_num, entry=None, line=None):
    """A line on stdout (rank 0's), an entry in the run's log (log.jsonl) stamped with its step."""
    if line is not None and int(os.environ.get("RANK", 0)) == 0:
        print(line, flush=True)
    if entry is not None:
        run["log"].append({"iter": iter_num, **entry})


def log_start(run, model, cfg, memory_line, step_bytes):
    """The settings in effect (where they differ from those asked), and where the run trains."""
    it, device, dtype, world = run["iter_num"], run["device"], run["dtype"], run["world"]
    warmup, end = schedule(cfg)
    settings = {**run["config"], "warmup_iters": warmup, "lr_decay_iters": end,
                "n_kv_head": model.config.kv_heads, "device": device, "dtype": dtype}
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.startswith("cuda") else ""
    scaling = " with loss scaling" if dtype == "float16" else ""
    processes = f"{world} process" + ("es" if world > 1 else "")
    log(run, it, {"kind": "config", "settings": settings, "world": world, "num_params":
                  model.num_params(), "tokens_per_step": run["tokens_per_step"], "fitted":
                  run["fitted"], "memory_estimate_bytes": step_bytes},
        f"{'resuming' if cfg.resume else 'training'} {cfg.out_dir} at step {it}\nsettings: "
        + " ".join(f"{k}={v}" for k, v in settings.items()) + f"\n{memory_line}\n"
        f"{cfg.value_mode} on {device}{gpu} in {dtype}{scaling}: {model.num_params() / 1e6:.2f}M "
        f"parameters, {run['tokens_per_step']:,} tokens/step ({run['fitted'][0]} x "
        f"{cfg.block_size} x {plural(run['fitted'][1], 'micro-step')} x {processes}), "
        f"{plural(cfg.max_iters, 'step')}, data {cfg.dataset}")


def log_eval(run, iter_num, losses, mixing):
    """The loss estimates, and the learned mixing weights by layer; a non-finite loss stops."""
    run["best_val_loss"] = min(run["best_val_loss"], losses["val"])
    run["val_loss"] = losses["val"]  # this checkpoint's own (sample.py says it)
    log(run, iter_num, {"kind": "eval", "tokens": iter_num * run["tokens_per_step"],
                        "train_loss": losses["train"], "val_loss": losses["val"],
                        **({"mixing": mixing} if mixing else {})},
        f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}" +
        "".join(f", {label} by layer " + " ".join(f"{layer}: " + "/".join(
            f"{x:.2f}" for x in values) for layer, values in by_layer.items())
            for label, by_layer in mixing_by_layer(mixing).items()))
    stop_if_diverged(run, iter_num, losses["val"])


def log_step(run, iter_num, loss, lr, dt):
    """The training loss (the mean over the processes), the speed and the peak GPU memory."""
    loss, world = loss.detach(), run["world"]
    if world > 1:
        dist.all_reduce(loss)  # the mean over the processes: all stop alike
        loss /= world
    loss = loss.item()  # the one GPU sync of a logged step
    stop_if_diverged(run, iter_num, loss)
    eta = round(dt * (run["config"]["max_iters"] - iter_num))  # whole seconds, so never "5m60s"
    memory = run["device"].startswith("cuda") and torch.cuda.max_memory_allocated() / 2**30
    log(run, iter_num, {"kind": "train", "loss": loss, "lr": lr, "ms_per_step": 1000 * dt,
                        "tokens_per_sec": run["tokens_per_step"] / dt,
                        **({"peak_memory_gib": memory} if memory else {})},
        f"iter {iter_num}/{run['config']['max_iters']}: loss {loss:.4f}, lr {lr:.2e}, "
        f"{1000 * dt:.0f} ms/step, {run['tokens_per_step'] / dt:,.0f} tok/s, "
        + (f"peak memory {memory:.1f} GiB, " if memory else "")
        + f"ETA {eta // 60}m{eta % 60:02d}s")


def stop_if_diverged(run, iter_num, loss):
    if not math.isfinite(loss):  # compare.py reads the log's "diverged" as a result, not a failure
        log(run, iter_num, {"kind": "diverged"})
        if int(os.environ.get("RANK", 0)) == 0:
            data.write_log(run["config"]["out_dir"], run["log"])
        raise ConfigError(f"the loss is not finite at step {iter_num}: stopped; the last good "
                          f"checkpoint is {run['config']['out_dir']}/ckpt.pt (try a lower "
                          f"--learning_rate)")


def log_final(run, model, val_shards, cfg, autocast, trained):
    """The loss over every validation token (each process a share), and where the checkpoint is."""
    t0, it, rank = time.time(), run["iter_num"], int(os.environ.get("RANK", 0))
    loss, n = full_split_loss(model, val_shards, cfg, autocast, rank, run["world"])
    log(run, it, {"kind": "final", "val_loss_full": loss, "val_tokens": n,
                  "seconds": time.time() - t0},
        f"val loss over the whole validation split ({n:,} tokens): {loss:.4f}\n" + (
            f"{'saved' if trained else 'kept'} {cfg.out_dir}/ckpt.pt (step {it}); sample from "
            f"it: python sample.py --out_dir={cfg.out_dir}" if it else
            "no step trained, so no checkpoint"))
    return loss


@torch.no_grad()
def full_split_loss(model, shards, cfg, autocast, rank=0, world=1):
    """(mean loss, tokens) over every token of a split once, in consecutive windows per shard."""
    T, B, device = cfg.block_size, cfg.batch_size, model.lm_head.weight.device
    windows = [(tokens, s, min(T, len(tokens) - 1 - s))
               for tokens in shards for s in range(0, len(tokens) - 1, T)]
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, tokens: on the device
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


if __name__ == "__main__":
    run_main(main)
