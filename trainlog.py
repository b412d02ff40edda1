"""
train.py's console plumbing: what a run says (Report: lines on stdout, the same records in
out_dir/log.jsonl, the speed of each log window) and how it hears a Ctrl-C (CtrlC: the loop stops
at the next step boundary and saves there).
"""
import contextlib
import json
import os
import signal
import time

import torch
import torch.distributed as dist

from configurator import plural
from runtime import disk_full, gpu_peak_flops


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
        if settings["warmup_iters"] != cfg["warmup_iters"]:  # the warmup in effect was clipped
            print(f"note: warmup_iters {cfg['warmup_iters']} would fill the whole schedule: "
                  f"warming up for {plural(settings['warmup_iters'], 'step')}")
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


# ---- stopping ----

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
