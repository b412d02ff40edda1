"""
Train a GPT in any value mode on token shards, on a laptop CPU, one GPU or several.

    python prepare.py && python train.py       # the quickstart: the plays, as bytes
    python train.py --value_mode=vanilla       # any setting: --key=value (--help lists them)
    python train.py config/gpt2_124m.py        # a preset, then overrides
    python train.py --resume --max_iters=8000  # go on from out_dir/ckpt.pt, further
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py
"""
import math
import os
import sys
import time
from dataclasses import fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
from configurator import ConfigError, parse_args, run_main
from model import GPT, MIXING_WEIGHTS, VALUE_MODES, GPTConfig

# The settings, name=(default, meaning[, lowest[, highest]]). The defaults are the
# CPU quickstart's (config/quickstart.py says so).
SETTINGS = dict(
    out_dir=("out", "folder for ckpt.pt and log.jsonl"),
    eval_interval=(500, "evaluate and save a checkpoint every this many steps", 1),
    log_interval=(100, "print the training loss every this many steps", 1),
    eval_iters=(20, "batches per loss estimate", 1),
    resume=(False, "go on from out_dir/ckpt.pt, with its settings"),
    overwrite=(False, "start afresh where out_dir holds a checkpoint"),
    seed=(1337, "seed of the initial weights and of the batches", 0, 2**63 - 1),
    dataset=(data.DEFAULT_DATASET, "data/<dataset>/ from prepare.py, or an absolute path"),
    batch_size=(12, "sequences per micro-step", 1),
    block_size=(64, "tokens per sequence (the context)", 1),
    gradient_accumulation_steps=(0, "micro-steps a step, of all processes (0: one each)", 0),
    n_layer=(4, "transformer blocks", 1),
    n_head=(4, "attention heads", 1),
    n_kv_head=(0, "key/value heads (0: n_head)", 0),
    n_embd=(128, "model width", 1),
    dropout=(0.0, "dropout rate", 0.0, 0.99),
    bias=(False, "biases in Linear and LayerNorm layers"),
    value_mode=("resformer", "one of " + ", ".join(VALUE_MODES)),
    lambda_1=(0.5, "resformer: the weight of V_1"),
    lambda_2=(0.5, "resformer: the weight of V_n"),
    learnable_lambda=(False, "resformer: learn both weights, per layer"),
    lambda_lr_scale=(1.0, "the learned mixing weights' lr, times the lr", 0.0),
    learning_rate=(3e-3, "peak learning rate", 1e-12),
    max_iters=(6000, "optimizer steps", 0),
    weight_decay=(0.1, "AdamW weight decay", 0.0),
    beta1=(0.9, "AdamW beta1", 0.0, 0.9999),
    beta2=(0.95, "AdamW beta2", 0.0, 0.9999),
    grad_clip=(1.0, "clip the gradients' norm to this (0: off)", 0.0),
    warmup_iters=(100, "steps of linear warmup", 0),
    lr_decay_iters=(0, "step where the cosine reaches min_lr (0: max_iters)", 0),
    min_lr=(3e-4, "final learning rate", 0.0),
    device=("auto", "auto, cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto, float32, bfloat16 or float16"),
    compile=(False, "torch.compile the model"),
)
# Every other field of model.py's GPTConfig is a setting too: a field you add there
# is --your_field here, and a variant of compare.py (vanilla:your_field=...).
for f in fields(GPTConfig):
    if f.name != "vocab_size":  # which the dataset decides
        SETTINGS.setdefault(f.name, (f.default, "a field of GPTConfig"))
ACTIONS = ("resume", "overwrite")  # what to do with out_dir: not saved with the run
# What a resume may change: nothing the model, the data or the batches depend on.
RESUMABLE = ("out_dir", "max_iters", "eval_interval", "log_interval", "eval_iters",
             "lr_decay_iters", "device", "dtype", "compile")
USAGE = "python train.py [config/preset.py ...] [--key=value ...]"
# Under torchrun every process runs this file; RANK says which (rank 0 writes files).
RANK = int(os.environ.get("RANK", 0))
WORLD = int(os.environ.get("WORLD_SIZE", 1))
EVAL_SEED = 1234  # the loss estimates draw the same windows every time, in every run


def get_lr(it, cfg):
    # nanoGPT's schedule: a linear warmup, then a cosine down to min_lr at
    # lr_decay_iters. A run too short for its warmup warms up for a tenth of it.
    end = cfg.lr_decay_iters or cfg.max_iters
    warmup = cfg.warmup_iters if cfg.warmup_iters < end else end // 10
    if it < warmup:
        return cfg.learning_rate * (it + 1) / (warmup + 1)
    if it >= end:
        return cfg.min_lr
    coeff = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (end - warmup)))  # 1 down to 0
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


def training_step(model, optimizer, batches, grad_accum, grad_clip, amp):
    """One AdamW step over grad_accum micro-batches; returns the last one's loss. amp is
    (autocast, GradScaler). bench.py times this very function."""
    autocast, scaler = amp
    for micro_step in range(grad_accum):
        if WORLD > 1:
            # DDP averages the gradients of all processes in backward(): only the
            # last micro-step needs that (nanoGPT's way to say so).
            model.require_backward_grad_sync = micro_step == grad_accum - 1
        x, y = batches.next()
        with autocast:
            _, loss = model(x, y)
        # The gradients of the micro-steps add up: dividing makes them their mean.
        scaler.scale(loss / grad_accum).backward()
    if grad_clip > 0:
        scaler.unscale_(optimizer)  # so that clipping sees the true gradients in float16
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)  # in float16 the scaler skips a step whose gradients overflowed
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@torch.no_grad()
def estimate_loss(model, batches, eval_iters, autocast):
    """The mean loss over the same eval_iters batches of each split."""
    model.eval()  # no dropout
    losses = {}
    for split, split_batches in batches.items():
        split_batches.reset()
        total = 0.0  # the losses add up on the device: one wait for the GPU, at .item()
        for _ in range(eval_iters):
            x, y = split_batches.next()
            with autocast:
                _, loss = model(x, y)
            total += loss.float()
        losses[split] = total.item() / eval_iters
    model.train()
    return losses


def train(cfg, ckpt=None):
    """One run, from the start or from its checkpoint ckpt: returns the model and its log."""
    if cfg.gradient_accumulation_steps % WORLD:  # (GPTConfig checks the model's settings)
        raise ConfigError(f"--gradient_accumulation_steps={cfg.gradient_accumulation_steps}:"
                          f" must divide among the {WORLD} processes")
    device, dtype, autocast = data.setup_device(cfg.device, cfg.dtype)
    device = data.join_processes(device, WORLD)
    shards, meta = data.load_dataset(cfg.dataset)
    # raw_model is the model itself, which evaluates and is saved; model, further down, is
    # what trains (compiled, and under torchrun in DDP).
    raw_model = build_model(cfg, data.padded_vocab(meta), ckpt).to(device)
    optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                               (cfg.beta1, cfg.beta2), cfg.lambda_lr_scale)
    # float16 needs the loss scaled up, so that small gradients do not round to zero.
    scaler = torch.amp.GradScaler(device.split(":")[0], enabled=dtype == "float16")
    # Each process draws its own windows and dropout, from the seed plus its rank as
    # in nanoGPT. The loss estimates draw their own fixed windows.
    torch.manual_seed(cfg.seed + RANK)
    batches = data.Batches(shards["train"], cfg.batch_size, cfg.block_size, cfg.seed + RANK,
                           device)
    eval_batches = {split: data.Batches(shards[split], cfg.batch_size, cfg.block_size,
                                        EVAL_SEED, device) for split in shards}
    # gradient_accumulation_steps counts the micro-steps of all processes together.
    grad_accum = max(1, cfg.gradient_accumulation_steps // WORLD)
    run = start_run(cfg, ckpt, dict(  # what a checkpoint holds beside the weights
        model_args=vars(raw_model.config), world=WORLD, device=device, dtype=dtype,
        tokens_per_step=cfg.batch_size * cfg.block_size * grad_accum * WORLD,
        num_params=raw_model.num_params(),
        flops_per_token=raw_model.flops_per_token(cfg.block_size),
        train_tokens=sum(map(len, shards["train"])),
        tokenizer=meta["tokenizer"]))
    if ckpt:  # AdamW's moments, the loss scale, the random numbers and the batches' place
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        data.restore_rng(ckpt["rank_states"][RANK], batches)
    model = torch.compile(raw_model) if cfg.compile else raw_model
    if WORLD > 1:
        model = DDP(model, device_ids=[device] if device.startswith("cuda") else None)

    iter_num = run["iter_num"]
    # The untrained model's loss, where every curve starts (a resume's step was evaluated
    # before its checkpoint was saved).
    if iter_num == 0:
        log_eval(run, 0, estimate_loss(raw_model, eval_batches, cfg.eval_iters, autocast),
                 raw_model.mixing_weights())
    t0 = time.time()
    while iter_num < cfg.max_iters:
        # Each parameter group steps at the scheduled lr times its own lr_scale.
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        loss = training_step(model, optimizer, batches, grad_accum, cfg.grad_clip,
                             (autocast, scaler))
        iter_num += 1
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % cfg.log_interval == 0 or iter_num == cfg.max_iters:
            log_step(run, iter_num, loss, lr, dt)
        # Every eval_interval steps and at the end: the loss, and a checkpoint.
        if iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters:
            losses = estimate_loss(raw_model, eval_batches, cfg.eval_iters, autocast)
            log_eval(run, iter_num, losses, raw_model.mixing_weights())
            run["iter_num"] = iter_num
            data.save_checkpoint(run, raw_model, optimizer, scaler, batches)
            t0 = time.time()  # evaluating is not training time
    finish(run, iter_num)
    return raw_model, run["log"]


def main(argv):
    cfg, ckpt = parse_args(SETTINGS, argv, USAGE), None
    if cfg.resume:
        cfg, ckpt = resume_settings(cfg, argv)
    try:
        train(cfg, ckpt)
    except KeyboardInterrupt:  # under torchrun every process stops; rank 0 says so
        if RANK == 0 and os.path.exists(os.path.join(cfg.out_dir, "ckpt.pt")):
            print(f"Ctrl-C: stopped; {cfg.out_dir}/ckpt.pt is kept: go on with python train.py "
                  f"--resume --out_dir={cfg.out_dir}", file=sys.stderr)
        raise
    except torch.OutOfMemoryError:
        raise ConfigError(f"out of GPU memory: halve --batch_size and double "
                          f"--gradient_accumulation_steps (python -m lab.memory "
                          f"{' '.join(argv)} says what fits)") from None


# ---- what train() uses, which a first reading may skip ----

def resume_settings(cfg, argv):
    """The settings and checkpoint of a resume. As in nanoGPT, the run's settings are the
    checkpoint's; the command line may repeat them, and change only the RESUMABLE ones."""
    ckpt = data.load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))
    saved = {k: ckpt["config"].get(k, spec[0]) for k, spec in SETTINGS.items()}
    cfg = parse_args(SETTINGS, argv, USAGE, start=saved)
    changed = [f"{k} {saved[k]!r} there, {getattr(cfg, k)!r} now" for k in SETTINGS
               if k not in RESUMABLE + ACTIONS and getattr(cfg, k) != saved[k]]
    if changed:
        raise ConfigError(f"cannot resume {cfg.out_dir}/ckpt.pt with {', '.join(changed)}: "
                          f"a resume changes only {', '.join(RESUMABLE)}")
    if len(ckpt["rank_states"]) != WORLD:
        raise ConfigError(f"{cfg.out_dir}/ckpt.pt was written by {len(ckpt['rank_states'])} "
                          f"processes: resume it with as many")
    return cfg, ckpt


def build_model(cfg, vocab_size, ckpt=None):
    # The run's GPT, drawn from its seed (the same in every process), or its checkpoint's.
    try:
        config = GPTConfig.from_dict({**vars(cfg), "vocab_size": vocab_size})
    except ValueError as e:  # a mistake in the model's settings, which GPTConfig checks
        raise ConfigError(str(e)) from None
    torch.manual_seed(cfg.seed)
    model = GPT(config)
    if ckpt:
        try:
            model.load_weights(ckpt["model"])
        except ValueError as e:  # model.py was edited since
            raise ConfigError(f"cannot resume {cfg.out_dir}/ckpt.pt: {e}") from None
    return model


def start_run(cfg, ckpt, record):
    """The run's record (a resume's from its checkpoint), and a line on what it does."""
    if os.path.exists(os.path.join(cfg.out_dir, "ckpt.pt")) and not (ckpt or cfg.overwrite):
        raise ConfigError(f"{cfg.out_dir} holds a checkpoint: go on with --resume, or train "
                          f"into another --out_dir (--overwrite replaces it)")
    try:
        os.makedirs(cfg.out_dir, exist_ok=True)
    except OSError as e:  # a file in the way, or no permission
        raise ConfigError(f"--out_dir={cfg.out_dir}: cannot make that folder ({e.strerror})")
    run = {"iter_num": 0, "val_loss": None, "log": [], **record,
           "config": {k: v for k, v in vars(cfg).items() if k not in ACTIONS}}
    if ckpt:
        run.update({k: ckpt[k] for k in ("iter_num", "val_loss", "log")})
    if RANK == 0:
        print(f"{'resuming' if ckpt else 'training'} {cfg.out_dir} at step {run['iter_num']}: "
              f"{cfg.value_mode}, {run['num_params'] / 1e6:.2f}M parameters, on "
              f"{run['device']} in {run['dtype']}, {run['tokens_per_step']:,} tokens a step",
              flush=True)
    reads = cfg.max_iters * run["tokens_per_step"] / run["train_tokens"]
    if RANK == 0 and reads > 1:  # more than an epoch: some windows come again
        print(f"note: the run reads its {run['train_tokens']:,} training tokens {reads:.2f} "
              f"times", flush=True)
    return run


def log(run, iter_num, entry, line):
    """An entry in the log and a line on stdout; a loss that is not finite stops the run."""
    run["log"].append({"iter": iter_num, **entry})
    if RANK == 0:
        print(line, flush=True)
    if not math.isfinite(entry.get("loss", entry.get("val_loss"))):
        run["log"].append({"iter": iter_num, "kind": "diverged"})  # a result, to compare
        if RANK == 0:
            data.write_log(run["config"]["out_dir"], run["log"])
        raise ConfigError(f"the loss is not finite at step {iter_num}: stopped (try a lower "
                          f"--learning_rate)")


def log_eval(run, iter_num, losses, mixing):
    """The loss estimates, and each learned mixing weight's mean over the layers."""
    run["val_loss"] = losses["val"]
    line = f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
    for kind, names in MIXING_WEIGHTS.items():  # e.g. transformer.h.3.attn.value_lambdas
        values = [v for k, v in mixing.items() if k.split(".")[-1].split(":")[0] == kind]
        if values:
            line += "".join(f", {n} {x:.2f}" for n, x in zip(names, np.mean(values, axis=0).flat))
    log(run, iter_num, {"kind": "eval", "tokens": iter_num * run["tokens_per_step"],
                        "train_loss": losses["train"], "val_loss": losses["val"],
                        **({"mixing": mixing} if mixing else {})}, line)


def log_step(run, iter_num, loss, lr, dt):
    """The training loss (the processes' mean: all stop alike) and the speed."""
    if WORLD > 1:
        dist.all_reduce(loss)
        loss /= WORLD
    loss = loss.item()  # the one wait for the GPU in a logged step
    log(run, iter_num, {"kind": "train", "loss": loss, "lr": lr, "ms_per_step": 1000 * dt,
                        "tokens_per_sec": run["tokens_per_step"] / dt},
        f"iter {iter_num}/{run['config']['max_iters']}: loss {loss:.4f}, lr {lr:.2e}, "
        f"{1000 * dt:.0f} ms/step, {run['tokens_per_step'] / dt:,.0f} tok/s")


def finish(run, iter_num):
    """The log written, and a word on the checkpoint."""
    out_dir = run["config"]["out_dir"]
    if WORLD > 1:  # every process is done talking before any closes its connections
        dist.barrier()
        dist.destroy_process_group()
    if RANK == 0:
        data.write_log(out_dir, run["log"])
    if RANK == 0 and iter_num:  # (a run of 0 steps saves no checkpoint)
        print(f"{out_dir}/ckpt.pt is at step {iter_num}: python sample.py --out_dir={out_dir} "
              f"samples from it")


if __name__ == "__main__":
    run_main(main)
