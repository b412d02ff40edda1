"""Train a GPT in any value mode on token shards: on a laptop CPU, one GPU, or several (torchrun).

    python prepare.py && python train.py             # the CPU quickstart: the plays, as bytes
    python train.py --value_mode=vanilla             # any setting: --key=value (--help lists them)
    python train.py config/gpt2_124m.py              # a preset, then overrides
    python train.py --resume --max_iters=8000        # continue out_dir/ckpt.pt exactly, further
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py   # 8 GPUs, same step

It ends, as nanoGPT's, on its last estimate and checkpoint (every val token: lab/evaluate.py).
"""
import math
import os
import time
from contextlib import nullcontext
from dataclasses import fields, replace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
from configurator import ConfigError, parse_args, run_main
from model import GPT, GPTConfig

# The settings, name=(default, meaning[, (lowest, highest)]); the defaults are config/quickstart.py.
SETTINGS = dict(
    out_dir=("out", "folder for ckpt.pt and log.jsonl"),
    eval_interval=(500, "evaluate (and save a checkpoint) every this many steps", (1, None)),
    log_interval=(100, "print and log the training loss every this many steps", (1, None)),
    eval_iters=(20, "batches per loss estimate", (1, None)),
    resume=(False, "continue out_dir/ckpt.pt with its settings (only RESUMABLE ones may change)"),
    overwrite=(False, "start afresh where out_dir holds a checkpoint (kept until the new one)"),
    seed=(1337, "seed of the initial weights and of the training batches", (0, 2**63 - 1)),
    dataset=(data.DEFAULT_DATASET, "data/<dataset>/ from prepare.py, or a path to such a folder"),
    batch_size=(12, "sequences per micro-step", (1, None)),
    block_size=(64, "tokens per sequence (the model's context length)", (1, None)),
    gradient_accumulation_steps=(0, "micro-steps a step, all processes' (0: one each)", (0, None)),
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
    warmup_iters=(100, "linear warmup steps (a tenth of the run if it would fill it)", (0, None)),
    lr_decay_iters=(0, "step where the cosine reaches min_lr (0 = max_iters)", (0, None)),
    min_lr=(3e-4, "final learning rate (at most learning_rate)", (0.0, None)),
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (bfloat16 on GPUs that have it, float16 on older ones, else float32)"),
    compile=(False, "torch.compile the model (GPU; slow to start)"),
)
# Every other field of model.py's GPTConfig is a setting too, at its default there: a field you
# add is --your_field here, and a variant in compare.py (vanilla:your_field=...) and bench.py.
SETTINGS.update({f.name: (f.default, "a GPTConfig field (model.py)") for f in fields(GPTConfig)
                 if f.name not in SETTINGS and f.name != "vocab_size"})
ACTIONS = ("resume", "overwrite")  # settings of a command, not of a run: never saved
# What a resume may change: neither the model, nor the data, nor the batches depend on them.
RESUMABLE = ("out_dir", "max_iters", "eval_interval", "log_interval", "eval_iters",
             "lr_decay_iters", "device", "dtype", "compile")
USAGE = "python train.py [config/preset.py ...] [--key=value ...]"
# Under torchrun every process runs this file: RANK says which one (rank 0 writes the files).
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
EVAL_SEED = 1234  # the loss estimates' windows: the same every time, in every run


def get_lr(it, cfg):
    """A linear warmup, then a cosine down to min_lr at lr_decay_iters (0: at max_iters)."""
    end = cfg.lr_decay_iters or cfg.max_iters
    warmup = cfg.warmup_iters if cfg.warmup_iters < end else end // 10  # short runs warm up too
    if it < warmup:
        return cfg.learning_rate * (it + 1) / (warmup + 1)
    if it >= end:
        return cfg.min_lr
    cosine = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (end - warmup)))  # from 1 down to 0
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
        total = torch.zeros((), device=model.lm_head.weight.device)  # on the device: one sync
        for _ in range(eval_iters):
            with autocast:
                total += model(*split_batches.next())[1].float()
        losses[split] = total.item() / eval_iters
    model.train()
    return losses


def train(cfg, ckpt=None):
    """One run, from the start or from its checkpoint ckpt; returns (the model, the run's log)."""
    check_settings(cfg)
    device, dtype, autocast = data.setup_device(cfg.device, cfg.dtype)
    device = data.join_processes(device, WORLD)
    shards, meta = data.load_dataset(cfg.dataset)
    model = build_model(cfg, data.padded_vocab(meta), ckpt).to(device)  # AdamW's state: there too
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                           (cfg.beta1, cfg.beta2), cfg.lambda_lr_scale)
    # Each process draws its own windows (and dropout): rank 0 from the seed, another rank from
    # (seed, rank), no plain seed's. The loss estimates use the same fixed windows every time.
    seed = cfg.seed if RANK == 0 else int(
        np.random.SeedSequence([cfg.seed, RANK]).generate_state(1, np.uint64)[0] >> 1)
    torch.manual_seed(seed)
    batches = data.Batches(shards["train"], cfg.batch_size, cfg.block_size, seed, "train", device)
    eval_batches = {s: data.Batches(shards[s], cfg.batch_size, cfg.block_size, EVAL_SEED, s,
                                    device) for s in shards}
    grad_accum = cfg.gradient_accumulation_steps // WORLD or 1  # each process's micro-steps
    run = start_run(cfg, ckpt, dict(  # what a checkpoint holds beside the weights
        model_args=vars(model.config), world=WORLD, device=device, dtype=dtype,
        tokens_per_step=cfg.batch_size * cfg.block_size * grad_accum * WORLD,
        num_params=model.num_params(), flops_per_token=model.flops_per_token(cfg.block_size),
        peak_flops=data.peak_flops(device, dtype),
        tokenizer={k: meta[k] for k in ("tokenizer", "vocab_size", "eot")}),
        sum(len(s) for s in shards["train"]))
    if ckpt:  # AdamW's moments, and this process's random numbers and place in its batches
        optimizer.load_state_dict(ckpt["optimizer"])
        data.restore_rng(ckpt["rank_states"][RANK], batches)
    trained = torch.compile(model) if cfg.compile else model
    if WORLD > 1:  # DDP averages the gradients of all processes inside backward()
        trained = DDP(trained, device_ids=[device] if device.startswith("cuda") else None)
    # fp16 needs the loss scaled up so small gradients do not round to zero (bf16, fp32: off)
    amp = autocast, torch.amp.GradScaler(device.split(":")[0], enabled=dtype == "float16")

    iter_num = start_iter = run["iter_num"]
    t0, timed_from = time.time(), iter_num  # the clock of the steps since the last log line
    while True:
        # Every eval_interval steps and at the end: the loss, and a checkpoint for exact resume.
        if (iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters) and (
                iter_num > start_iter or iter_num == 0):
            log_eval(run, iter_num, estimate_loss(model, eval_batches, cfg.eval_iters, autocast),
                     model.mixing_weights())
            if iter_num > start_iter:
                data.save_checkpoint(run, iter_num, model, optimizer, batches)
            t0, timed_from = time.time(), iter_num  # evaluation is not training time
        if iter_num >= cfg.max_iters:
            break
        # The training step, each parameter group at the scheduled lr x its own lr_scale.
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        loss = training_step(trained, optimizer, batches, grad_accum, cfg.grad_clip, amp)
        iter_num += 1
        if iter_num == start_iter + 1 and iter_num % cfg.log_interval and iter_num < cfg.max_iters:
            t0, timed_from = time.time(), iter_num  # the first step (compiling) is not timed
        if iter_num % cfg.log_interval == 0 or iter_num == cfg.max_iters:
            log_step(run, iter_num, loss, lr, (time.time() - t0) / (iter_num - timed_from))
            t0, timed_from = time.time(), iter_num
    finish(run, iter_num, iter_num > start_iter)
    return model, run["log"]


def main(argv):
    cfg, ckpt = parse_args(SETTINGS, argv, USAGE), None
    if cfg.resume:
        cfg, ckpt = resume_settings(cfg, argv)
    try:
        train(cfg, ckpt)
    except KeyboardInterrupt:  # Ctrl-C: run_main says what is kept and how to go on, exits 130
        raise KeyboardInterrupt(f"{cfg.out_dir}/ckpt.pt is kept: go on with python train.py "
                                f"--resume --out_dir={cfg.out_dir}" if os.path.exists(
                                    os.path.join(cfg.out_dir, "ckpt.pt")) else "no checkpoint yet")
    except torch.OutOfMemoryError:  # a GPU's: the step tried was too large for it
        raise ConfigError(f"out of GPU memory at batch_size {cfg.batch_size} x block_size "
                          f"{cfg.block_size}: halve --batch_size, double --gradient_accumulation_"
                          f"steps; what fits: python -m lab.memory {' '.join(argv)}") from None


# ---- below: what train() uses, which a first reading can skip ----

def check_settings(cfg):
    """The settings that must agree with one another (GPTConfig checks the model's)."""
    if cfg.min_lr > cfg.learning_rate:
        raise ConfigError(f"--min_lr={cfg.min_lr}: must be at most --learning_rate")
    if cfg.gradient_accumulation_steps % WORLD:  # 0 (one per process) always divides
        raise ConfigError(f"--gradient_accumulation_steps={cfg.gradient_accumulation_steps}, "
                          f"all processes' micro-steps, must divide by their number ({WORLD})")


def resume_settings(cfg, argv):
    """(settings, checkpoint) of a resume, as nanoGPT's: the checkpoint's settings are the run's.
    The command line may repeat them and change only the RESUMABLE ones (not batch_size)."""
    ckpt = data.load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))
    saved = {k: ckpt["config"].get(k, spec[0]) for k, spec in SETTINGS.items()}
    cfg = parse_args(SETTINGS, argv, USAGE, start=saved)  # its presets and --key=value on top
    changed = [f"{k} {saved[k]!r} there, {getattr(cfg, k)!r} now" for k in SETTINGS
               if k not in RESUMABLE + ACTIONS and getattr(cfg, k) != saved[k]]
    if changed:
        raise ConfigError(f"cannot resume {cfg.out_dir}/ckpt.pt with {', '.join(changed)}: a resume"
                          f" changes only {', '.join(RESUMABLE)} (or train anew, elsewhere)")
    if len(ckpt["rank_states"]) != WORLD:
        raise ConfigError(f"{cfg.out_dir}/ckpt.pt was written by {len(ckpt['rank_states'])} "
                          f"process(es): resume it with as many (torchrun --nproc_per_node)")
    return cfg, ckpt


def build_model(cfg, vocab_size, ckpt=None):
    """The run's GPT: drawn from its seed (the same in every process), or its checkpoint's."""
    try:  # GPTConfig's own checks of the model's settings: value modes, heads, sizes
        config = GPTConfig.from_dict({**vars(cfg), "vocab_size": vocab_size})
    except ValueError as e:
        raise ConfigError(str(e)) from None
    torch.manual_seed(cfg.seed)
    model = GPT(config)
    if model.config.value_mode != "vanilla":
        start_like_vanilla(model, cfg.seed)  # so a difference is the mode's, not the draw's
    if ckpt:
        try:
            model.load_weights(ckpt["model"])
        except ValueError as e:  # model.py was edited since: a user's choice, not a bug
            raise ConfigError(f"cannot resume {cfg.out_dir}/ckpt.pt: {e}; start anew") from None
    return model


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


def start_run(cfg, ckpt, record, train_tokens):
    """The run's record (a resume's from its checkpoint), and a word on what it trains."""
    if os.path.exists(os.path.join(cfg.out_dir, "ckpt.pt")) and not (cfg.resume or cfg.overwrite):
        raise ConfigError(f"{cfg.out_dir} already holds a checkpoint: continue it with --resume, "
                          f"or train into another --out_dir (--overwrite replaces it)")
    try:
        os.makedirs(cfg.out_dir, exist_ok=True)
    except OSError as e:  # a file in the way, no permission: the user's to fix
        raise ConfigError(f"--out_dir={cfg.out_dir}: cannot make that folder ({e.strerror})")
    run = {"format": data.CHECKPOINT_FORMAT, "iter_num": 0, "best_val_loss": float("inf"),
           "val_loss": None, "log": [], **record,
           "config": {k: v for k, v in vars(cfg).items() if k not in ACTIONS}}
    run.update({k: ckpt[k] for k in ("iter_num", "best_val_loss", "val_loss", "log")} if ckpt
               else {})
    step, tokens = run["tokens_per_step"], cfg.max_iters * run["tokens_per_step"]
    if RANK == 0:
        print(f"{'resuming' if ckpt else 'training'} {cfg.out_dir} at step {run['iter_num']}: "
              f"{cfg.value_mode}, {run['num_params'] / 1e6:.2f}M parameters, on {run['device']} "
              f"in {run['dtype']}, {step:,} tokens a step ({cfg.batch_size} x {cfg.block_size} a "
              f"micro-step, {step // (cfg.batch_size * cfg.block_size)} of them)" + (
                  f"\nnote: {data.plural(cfg.max_iters, 'step')} read {tokens / train_tokens:.2f} "
                  f"times the {train_tokens:,} training tokens: it sees its data more than once"
                  if tokens > train_tokens else ""), flush=True)
    return run


def log(run, iter_num, entry, line):
    """An entry in log.jsonl and a line on stdout. A loss that is not finite stops the run."""
    run["log"].append({"iter": iter_num, **entry})
    if RANK == 0:
        print(line, flush=True)
    if not math.isfinite(entry.get("loss", entry.get("val_loss"))):
        run["log"].append({"iter": iter_num, "kind": "diverged"})  # compare.py: a result
        if RANK == 0:
            data.write_log(run["config"]["out_dir"], run["log"])
        raise ConfigError(f"the loss is not finite at step {iter_num}: stopped (try a lower "
                          f"--learning_rate); {run['config']['out_dir']}/ckpt.pt is the last good")


def log_eval(run, iter_num, losses, mixing):
    """The loss estimates, and each kind of learned mixing weight's mean."""
    run["best_val_loss"], run["val_loss"] = min(run["best_val_loss"], losses["val"]), losses["val"]
    kinds = {}  # 'transformer.h.3.attn.value_lambdas' is one of the kind value_lambdas
    for name, value in mixing.items():
        kinds.setdefault(name.rpartition(".")[2].removesuffix(":mean"), []).append(value)
    log(run, iter_num, {"kind": "eval", "tokens": iter_num * run["tokens_per_step"],
                        "train_loss": losses["train"], "val_loss": losses["val"],
                        **({"mixing": mixing} if mixing else {})},
        f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}" +
        "".join(f", {kind} " + "/".join(f"{x:.2f}" for x in np.mean(values, axis=0).flat)
                for kind, values in kinds.items()))


def log_step(run, iter_num, loss, lr, dt):
    """The training loss (the mean over the processes), the speed, and on a GPU its MFU."""
    loss = loss.detach()
    if WORLD > 1:
        dist.all_reduce(loss)  # the mean over the processes: all stop alike
        loss /= WORLD
    loss = loss.item()  # the one GPU sync of a logged step
    mfu = run["peak_flops"] and (  # the FLOP/s each GPU reaches, over its peak
        run["flops_per_token"] * run["tokens_per_step"] / WORLD / dt / run["peak_flops"])
    log(run, iter_num, {"kind": "train", "loss": loss, "lr": lr, "ms_per_step": 1000 * dt,
                        "tokens_per_sec": run["tokens_per_step"] / dt, "mfu": mfu or None},
        f"iter {iter_num}/{run['config']['max_iters']}: loss {loss:.4f}, lr {lr:.2e}, "
        f"{1000 * dt:.0f} ms/step, {run['tokens_per_step'] / dt:,.0f} tok/s"
        + (f", MFU {100 * mfu:.1f}%" if mfu else ""))


def finish(run, iter_num, trained):
    """The peak GPU memory into the log, the log written, and where the checkpoint is."""
    out_dir = run["config"]["out_dir"]
    if run["device"].startswith("cuda"):  # once: lab.memory's estimates are checked against it
        peak = torch.cuda.max_memory_allocated(run["device"])
        run["log"].append({"iter": iter_num, "kind": "memory", "peak_gib": peak / 2**30})
    if WORLD > 1:  # every process is done talking before any closes its connections
        dist.barrier()
        dist.destroy_process_group()
    if RANK == 0:
        data.write_log(out_dir, run["log"])
        print(f"{'saved' if trained else 'kept'} {out_dir}/ckpt.pt (step {iter_num}): python "
              f"sample.py --out_dir={out_dir} samples from it" if iter_num else "no checkpoint")


if __name__ == "__main__":
    run_main(main)
