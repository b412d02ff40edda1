"""
Train a GPT in any value mode on token shards, on one GPU, a laptop CPU, or several GPUs.

    python train.py                                   # the CPU quickstart (prepares data if needed)
    python train.py --value_mode=resformer            # any setting: --key=value
    python train.py config/gpt2_124m.py               # a preset, then overrides
    python train.py --resume                          # continue out_dir/ckpt.pt exactly
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py

Every log line also goes to out_dir/log.jsonl; checkpoints are written atomically to out_dir/ckpt.pt.
"""
import json
import math
import os
import sys
import time
from contextlib import nullcontext

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

import prepare
from configurator import load_config
from model import GPT, GPTConfig, gpu_peak_flops

# The defaults are the CPU quickstart: a deep, narrow byte-level model on Shakespeare's plays that
# trains in a few minutes on 2 CPU cores (depth is where the value residual shows; see README).
DEFAULTS = dict(
    # I/O
    out_dir="out", eval_interval=100, log_interval=10, eval_iters=20, resume=False, seed=1337,
    # data: data/<dataset>/ from prepare.py; tokens per step = batch_size * block_size * accumulation * GPUs
    dataset="shakespeare_byte", batch_size=32, block_size=128, gradient_accumulation_steps=1,
    # model (see GPTConfig)
    n_layer=12, n_head=4, n_kv_head=0, n_embd=128, dropout=0.0, bias=False,
    value_mode="vanilla", learnable_lambda=False,
    # AdamW and the schedule: linear warmup, cosine decay to min_lr at lr_decay_iters
    learning_rate=2e-3, max_iters=500, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,
    warmup_iters=50, lr_decay_iters=500, min_lr=2e-4,
    # system: device auto = cuda > mps > cpu; dtype auto = bfloat16 on capable GPUs, else float32
    device="auto", dtype="auto", compile=False,
)
DEFAULT_DATASET = "shakespeare_byte"  # what `python prepare.py` with no arguments writes
CHECKPOINT_FORMAT = "value-residual-gpt/1"


def get_lr(it, cfg):
    """Linear warmup, then cosine decay from learning_rate to min_lr, then min_lr."""
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
    if it >= cfg["lr_decay_iters"]:
        return cfg["min_lr"]
    progress = (it - cfg["warmup_iters"]) / (cfg["lr_decay_iters"] - cfg["warmup_iters"])
    return cfg["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg["learning_rate"] - cfg["min_lr"])


class Batches:
    """(x, y) batches from memmapped shards, with a state() that checkpoints can hold.

    One shard (small data): random windows from a seeded generator. Several shards (FineWeb):
    each rank reads the token stream in order, rank r taking every world-th chunk.
    """

    def __init__(self, shards, batch_size, block_size, seed, rank=0, world=1, sequential=None):
        self.shards, self.B, self.T, self.rank, self.world = shards, batch_size, block_size, rank, world
        self.sequential = len(shards) > 1 if sequential is None else sequential
        self.generator = torch.Generator().manual_seed(seed + rank)
        self.shard, self.pos = 0, rank * batch_size * block_size

    def next(self):
        B, T = self.B, self.T
        if self.sequential:
            if self.pos + B * T + 1 > len(self.shards[self.shard]):  # next shard, wrapping around
                self.shard, self.pos = (self.shard + 1) % len(self.shards), self.rank * B * T
            chunk = torch.from_numpy(self.shards[self.shard][self.pos:self.pos + B * T + 1].astype("int64"))
            self.pos += self.world * B * T
            return chunk[:-1].view(B, T), chunk[1:].view(B, T)
        tokens = self.shards[0]
        if len(tokens) <= T + 1:
            raise prepare.DataError(f"a shard of {len(tokens)} tokens is too short for block_size {T}")
        starts = torch.randint(len(tokens) - T - 1, (B,), generator=self.generator).tolist()
        rows = torch.stack([torch.from_numpy(tokens[i:i + T + 1].astype("int64")) for i in starts])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state(self):
        return {"generator": self.generator.get_state(), "shard": self.shard, "pos": self.pos}

    def load_state(self, state):
        self.generator.set_state(state["generator"])
        self.shard, self.pos = state["shard"], state["pos"]


def optimizer_step(model, optimizer, scaler, grad_clip):
    """After backward: clip the gradient norm (unscaled first, for fp16), step AdamW, clear the gradients."""
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def save_checkpoint(path, checkpoint):
    """Write to a temporary file, then rename: a crash mid-write never leaves a truncated ckpt.pt."""
    tmp = path + ".tmp"
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, map_location="cpu"):
    """A checkpoint dict (model weights without torch.compile's prefix), or a one-line error."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}: train one first, e.g. python train.py --out_dir={os.path.dirname(path) or '.'}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} is not a readable torch checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a checkpoint of this project (expected format {CHECKPOINT_FORMAT})")
    ckpt["model"] = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    return ckpt


def pick_device_and_dtype(cfg):
    device = cfg["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    dtype = cfg["dtype"]
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") and torch.cuda.is_bf16_supported() else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    return device, dtype


def train(cfg):
    """Run one training job; returns a summary dict with the trained model (used by compare.py)."""
    GPTConfig.from_dict(cfg)  # a bad model setting fails now, before any data is touched
    ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun?
    rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if ddp else (0, 1)
    device, dtype = pick_device_and_dtype(cfg)
    if ddp:
        init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
    master = rank == 0
    device_type = "cuda" if device.startswith("cuda") else device
    torch.manual_seed(cfg["seed"])
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=getattr(torch, dtype))

    # ---- data ----
    data_dir = os.path.join(prepare.DATA_ROOT, cfg["dataset"])
    if cfg["dataset"] == DEFAULT_DATASET and not os.path.exists(os.path.join(data_dir, "meta.json")) and master:
        print(f"{data_dir} is not prepared yet: running python prepare.py (once, offline)")
        prepare.prepare()
    if ddp:
        torch.distributed.barrier()
    meta = prepare.load_meta(data_dir)
    train_shards = [prepare.read_shard(p, meta["vocab_size"]) for p in prepare.list_shards(data_dir, "train")]
    val_shards = [prepare.read_shard(p, meta["vocab_size"]) for p in prepare.list_shards(data_dir, "val")]
    batches = Batches(train_shards, cfg["batch_size"], cfg["block_size"], cfg["seed"], rank, world)

    # ---- model and optimizer, fresh or from the checkpoint ----
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    vocab_size = -(-meta["vocab_size"] // 64) * 64  # round up to a multiple of 64: faster matmuls
    model_args = dict(GPTConfig.from_dict({**cfg, "vocab_size": vocab_size}).__dict__)
    ckpt = load_checkpoint(ckpt_path) if cfg["resume"] else None
    if ckpt is not None:
        differ = {k: (ckpt["model_args"].get(k), v) for k, v in model_args.items() if ckpt["model_args"].get(k) != v}
        if differ:
            shown = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in differ.items())
            raise ValueError(f"cannot resume {ckpt_path}: the model differs ({shown}); drop those overrides or use a new out_dir")
    model = GPT(GPTConfig(**model_args))
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    model.to(device)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]), device_type)
    iter_num, best_val_loss = 0, float("inf")
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        batches.load_state(ckpt["data_state"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device_type == "cuda" and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"])
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        if master:
            print(f"resuming {ckpt_path} at step {iter_num}")
    start_iter, ckpt = iter_num, None  # free the checkpoint's memory
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
    raw_model = model
    if cfg["compile"]:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])] if device_type == "cuda" else None)

    # Loss estimates use the same fixed windows every time, so curves compare across steps and modes.
    eval_batches = {split: Batches(shards, cfg["batch_size"], cfg["block_size"], seed=1234, sequential=False)
                    for split, shards in (("train", train_shards), ("val", val_shards))}

    @torch.no_grad()
    def estimate_loss():
        raw_model.eval()
        losses = {}
        for split, source in eval_batches.items():
            source.generator.manual_seed(1234)
            total = 0.0
            for _ in range(cfg["eval_iters"]):
                x, y = source.next()
                with autocast:
                    total += raw_model(x.to(device), y.to(device))[1].item()
            losses[split] = total / cfg["eval_iters"]
        raw_model.train()
        return losses

    tokens_per_step = cfg["batch_size"] * cfg["block_size"] * cfg["gradient_accumulation_steps"] * world
    peak = gpu_peak_flops(torch.cuda.get_device_name(device)) if device_type == "cuda" else None
    os.makedirs(cfg["out_dir"], exist_ok=True)
    log_file = open(os.path.join(cfg["out_dir"], "log.jsonl"), "a") if master else None

    def log(record):
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()

    def checkpoint(step_start):
        """Everything an exact resume needs, as of the start of step iter_num."""
        data_state, torch_rng = step_start
        return {"format": CHECKPOINT_FORMAT, "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                "model_args": model_args, "config": cfg, "iter_num": iter_num, "best_val_loss": best_val_loss,
                "tokenizer": {k: meta[k] for k in ("tokenizer", "vocab_size", "eot")},
                "rng": {"torch": torch_rng, "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None},
                "data_state": data_state}

    if master:
        print(f"{cfg['value_mode']}: {raw_model.num_params() / 1e6:.2f}M parameters, {device} {dtype}, "
              f"{tokens_per_step:,} tokens/step, {cfg['max_iters']} steps, data {data_dir}")
    evals, speeds, status, val_loss = [], [], "done", float("nan")
    t0, last_log_iter, phase = time.time(), iter_num, "between"
    try:
        while True:
            if iter_num % cfg["eval_interval"] == 0 and (iter_num > start_iter or iter_num == 0) or iter_num == cfg["max_iters"]:
                losses = estimate_loss()
                val_loss = losses["val"]
                if not math.isfinite(val_loss):
                    status = "diverged"
                    break
                best_val_loss = min(best_val_loss, val_loss)
                evals.append({"iter": iter_num, "tokens": iter_num * tokens_per_step, "train_loss": losses["train"], "val_loss": val_loss})
                if master:
                    print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {val_loss:.4f}")
                    log({"kind": "eval", **evals[-1]})
                    if iter_num > start_iter:
                        save_checkpoint(ckpt_path, checkpoint((batches.state(), torch.get_rng_state())))
                t0 = time.time()  # evaluation time is not training time
            if iter_num >= cfg["max_iters"]:
                break

            step_start, phase = (batches.state(), torch.get_rng_state()), "computing"  # for a Ctrl-C mid-step
            lr = get_lr(iter_num, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for micro_step in range(cfg["gradient_accumulation_steps"]):
                if ddp:  # synchronise gradients on the last micro-step only
                    model.require_backward_grad_sync = micro_step == cfg["gradient_accumulation_steps"] - 1
                x, y = batches.next()
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                with autocast:
                    loss = model(x, y)[1] / cfg["gradient_accumulation_steps"]
                scaler.scale(loss).backward()
            phase = "updating"
            optimizer_step(model, optimizer, scaler, cfg["grad_clip"])
            iter_num, phase = iter_num + 1, "between"

            if iter_num % cfg["log_interval"] == 0 or iter_num == cfg["max_iters"]:
                loss_now = loss.detach() * cfg["gradient_accumulation_steps"]
                if ddp:  # the mean over ranks: every rank logs and checks the same number, so all stop together
                    torch.distributed.all_reduce(loss_now)
                    loss_now /= world
                lossf = loss_now.item()  # a GPU sync: only when logging
                if not math.isfinite(lossf):
                    status = "diverged"
                    break
                dt = (time.time() - t0) / (iter_num - last_log_iter)
                record = {"kind": "train", "iter": iter_num, "loss": lossf, "lr": lr, "ms_per_step": 1000 * dt,
                          "tokens_per_sec": tokens_per_step / dt}
                if peak and iter_num > start_iter + cfg["log_interval"]:  # the first window includes compilation
                    record["mfu"] = raw_model.estimate_mfu(record["tokens_per_sec"] / world, peak, cfg["block_size"])
                if iter_num > start_iter + cfg["log_interval"]:
                    speeds.append(record["tokens_per_sec"])
                if master:
                    mfu = f", mfu {100 * record['mfu']:.1f}%" if "mfu" in record else ""
                    print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {record['ms_per_step']:.0f} ms/step, "
                          f"{record['tokens_per_sec']:,.0f} tok/s{mfu}")
                    log(record)
                t0, last_log_iter, phase = time.time(), iter_num, "between"
    except KeyboardInterrupt:
        status = "interrupted"
        if master and phase != "updating":  # weights change only inside optimizer.step
            state = step_start if phase == "computing" else (batches.state(), torch.get_rng_state())
            save_checkpoint(ckpt_path, checkpoint(state))
            print(f"\ninterrupted at step {iter_num}: saved {ckpt_path}; continue with --resume")
        elif master:
            print(f"\ninterrupted mid-step {iter_num}: kept the last checkpoint in {ckpt_path}; continue with --resume")
    if status == "diverged" and master:
        print(f"loss is not finite at step {iter_num}: stopped; the last good checkpoint is {ckpt_path} "
              f"(try a lower --learning_rate or --grad_clip=1.0)")
    if log_file:
        log_file.close()
    if ddp:
        destroy_process_group()
    speeds.sort()
    return {"status": status, "iter": iter_num, "val_loss": val_loss, "best_val_loss": best_val_loss, "evals": evals,
            "num_params": raw_model.num_params(), "tokens_per_sec": speeds[len(speeds) // 2] if speeds else float("nan"),
            "kv_cache_bytes_per_token": raw_model.kv_cache_bytes(1, 1, getattr(torch, dtype)), "out_dir": cfg["out_dir"],
            "model": raw_model}


def main(argv):
    summary = train(load_config(DEFAULTS, argv))
    return {"done": 0, "interrupted": 130, "diverged": 1}[summary["status"]]


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, FileNotFoundError) as e:  # user mistakes: one line, no traceback
        sys.exit(f"error: {e}")
