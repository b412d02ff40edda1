"""
compare.py's runs: each is `python train.py` in its own folder, `jobs` side by side (one CPU
thread each), a finished run reused, a stopped one resumed from its checkpoint; and summary.json,
a finished run's numbers with the analysis of its final model (analysis.analyse).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

import data
from model import GPT

from train import ACTIONS, SETTINGS as TRAIN_SETTINGS

from .analysis import analyse

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")


def heldout_windows(cfg, n):
    """The same n windows of block_size tokens, evenly spaced over the val shard, for every mode."""
    data_dir = data.dataset_dir(cfg["dataset"])
    meta = data.load_meta(data_dir)
    tokens = data.read_shard(data.list_shards(data_dir, "val")[0], meta["vocab_size"])
    T = cfg["block_size"]
    starts = np.linspace(0, len(tokens) - T, num=n).astype(np.int64)
    return torch.stack([torch.from_numpy(tokens[s:s + T].astype(np.int64)) for s in starts])


def read_log(run_dir):
    """A run's log records; none if it stopped before writing one (e.g. its data was refused)."""
    path = os.path.join(run_dir, "log.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:  # a line without its newline is being written (a run training)
        return [json.loads(line) for line in f if line.strip() and line.endswith("\n")]


def last_step(run_dir, with_loss=False):
    """The last training step a run has logged (0 before its first), read while it trains;
    with_loss: (step, its training loss or None)."""
    path, step, loss = os.path.join(run_dir, "log.jsonl"), 0, None
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:  # a line being written this instant
                    continue
                if record["kind"] == "train":
                    step, loss = record["iter"], record["loss"]
    return (step, loss) if with_loss else step


def progress(todo, running, timing, jobs, left="left", so_far=None):
    """' (4.1 min so far, about 12 min left; running: vanilla_seed1 at 400/800, ...)': so_far,
    the time left at the finished runs' pace (seconds per step, side by side) and where the
    running ones are; '' when there is nothing to say."""
    seen = {cfg["out_dir"]: last_step(cfg["out_dir"], with_loss=True) for _, cfg, _, _ in running}
    steps = {run: step for run, (step, _) in seen.items()}
    times = [so_far] if so_far else []
    if timing["steps"] and (todo or running):
        steps_left = (sum(cfg["max_iters"] for _, cfg in todo) +
                      sum(max(cfg["max_iters"] - steps[cfg["out_dir"]], 0)
                          for _, cfg, _, _ in running))
        side_by_side = max(1, min(jobs, len(todo) + len(running)))
        seconds = timing["seconds"] / timing["steps"] * steps_left / side_by_side
        times.append(f"about {seconds / 60:.0f} min {left}" if seconds >= 60
                     else f"under a minute {left}")
    parts = [", ".join(times)] if times else []
    if running:
        parts.append("running: " + ", ".join(
            f"{os.path.basename(cfg['out_dir'])} at {steps[cfg['out_dir']]}/{cfg['max_iters']}"
            + (f" (loss {seen[cfg['out_dir']][1]:.3f})" if seen[cfg["out_dir"]][1] else "")
            for _, cfg, _, _ in running))
    return f" ({'; '.join(parts)})" if parts else ""


def settings_only(cfg):
    """What makes two runs the same: their settings (without learned lambdas, their learning
    rate changes nothing). A setting train.py gained after a run was recorded counts at its
    default, so records committed earlier stay reusable."""
    cfg = {**{k: spec[0] for k, spec in TRAIN_SETTINGS.items() if k not in ACTIONS}, **cfg}
    return {k: v for k, v in cfg.items() if cfg.get("learnable_lambda") or k != "lambda_lr_scale"}


def same_run(cfg, run_dir, theirs):
    """Whether theirs (the settings a folder's run was made with) are cfg's; other settings are
    refused in one line naming them, never replaced: that folder holds someone's results."""
    mine, theirs = settings_only(cfg), settings_only(theirs)
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        shown = ", ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} now" for k in differ[:4])
        raise data.DataError(f"{run_dir} holds a run with other settings ({shown}"
                               f"{', ...' if len(differ) > 4 else ''}): delete it, or compare "
                               f"into another --out_dir")
    return True


def finished(cfg, run_dir):
    """The run's summary if it finished (with exactly these settings: others are refused)."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    if summary.get("format") != data.CHECKPOINT_FORMAT:
        raise data.DataError(f"{run_dir} was written by an older version of compare.py: "
                               f"delete it, or compare into another --out_dir")
    return summary if same_run(cfg, run_dir, summary.get("config") or {}) else None


def command(cfg, run_dir):
    """(the train.py command for one run, whether it resumes): a stopped run of these settings
    goes on from its checkpoint; one of other settings is refused."""
    args = [sys.executable, TRAIN_PY] + [f"--{k}={v}" for k, v in settings_only(cfg).items()]
    ckpt_path = os.path.join(run_dir, "ckpt.pt")
    if os.path.isfile(ckpt_path) and same_run(cfg, run_dir,
                                              data.load_checkpoint(ckpt_path)["config"]):
        return args + ["--resume"], True
    return args, False


def summarise(cfg, run_dir, samples, threads):
    """summary.json of a finished run: its log's numbers and the analysis of its final model."""
    log = read_log(run_dir)
    train_records = [r for r in log if r["kind"] == "train"]
    # the first window includes start-up: left out, unless it is the only one (a short run)
    timed = train_records[1:] or train_records
    speeds = sorted(r["tokens_per_sec"] for r in timed) or [float("nan")]
    model = GPT.from_checkpoint(data.load_checkpoint(os.path.join(run_dir, "ckpt.pt")))
    first_record = next(r for r in log if r["kind"] == "config")
    summary = {"config": cfg, "status": "done",
               "val_loss_full": [r for r in log if r["kind"] == "final"][-1]["val_loss_full"],
               "evals": [r for r in log if r["kind"] == "eval"], "num_params": model.num_params(),
               "active_params": model.active_params(),
               "flops_per_token": model.flops_per_token(cfg["block_size"]),
               "tokens_per_step": first_record["tokens_per_step"],
               "tokens_per_sec": speeds[len(speeds) // 2],
               "threads": threads, "kv_cache_bytes_per_token": model.kv_cache_bytes(1, 1),
               **analyse(model, heldout_windows(cfg, samples))}
    return write_summary(run_dir, summary)


def diverged_summary(cfg, run_dir):
    """summary.json of a run whose loss stopped being finite: a result (worse than any finite
    loss), reused like a finished run."""
    return write_summary(run_dir, {"config": cfg, "status": "diverged", "val_loss_full": None})


def write_summary(run_dir, summary):
    """summary.json, whole or not at all, tagged with the version that wrote it."""
    with data.atomic_write(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump({"format": data.CHECKPOINT_FORMAT, **summary}, f, indent=1)
    return summary


def final_loss(summary):
    return summary["val_loss_full"] if summary["status"] == "done" else float("inf")


def run_grid(grid, jobs, samples, quiet_reuse=False, left="left", on_progress=None):
    """Train every (name, seed, point, cfg) not finished yet, `jobs` at a time;
    returns summaries by key. Each line says how long is left (left: how to say it);
    on_progress() is called beside the line printed every 30 s (compare's live picture)."""
    summaries, todo = {}, []
    for key, cfg in grid:
        done = finished(cfg, cfg["out_dir"])
        if done:
            if not quiet_reuse:
                print(f"reusing {cfg['out_dir']} (same settings, finished)")
            summaries[key] = {**done, "reused": True}
        else:
            command(cfg, cfg["out_dir"])  # a folder holding other settings: refused before any run
            todo.append((key, cfg))
    threads = 1 if jobs > 1 else torch.get_num_threads()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    running, t_start, interrupted, failed = [], time.time(), False, []
    n_total = len(todo)
    # each run's (start time, start step); the finished ones' seconds and steps, for the time left
    started, timing, said = {}, {"seconds": 0.0, "steps": 0}, time.time()
    drawn = time.time()  # the live picture's own clock: runs that start do not postpone it
    while running or (todo and not interrupted):
        while todo and len(running) < jobs and not interrupted:
            key, cfg = todo.pop(0)
            os.makedirs(cfg["out_dir"], exist_ok=True)
            args, resuming = command(cfg, cfg["out_dir"])
            log = open(os.path.join(cfg["out_dir"], "train.out"), "a")
            print(f"[{n_total - len(todo)}/{n_total}] {cfg['out_dir']}: " +
                  ("resuming from its checkpoint" if resuming else "training") +
                  progress(todo, running, timing, jobs, left), flush=True)
            started[key] = (time.time(), last_step(cfg["out_dir"]) if resuming else 0)
            said = time.time()
            running.append((key, cfg, subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                       env=env), log))
        if running and time.time() - said > 30:  # a word at least every 30 s while runs train
            pace = timing if timing["steps"] else {  # before any finished: the running ones' pace
                "seconds": sum(time.time() - started[k][0] for k, *_ in running),
                "steps": sum(max(last_step(c["out_dir"]) - started[k][1], 0)
                             for k, c, *_ in running)}
            print("   " + progress(todo, running, pace, jobs, left), flush=True)
            said = time.time()
        if on_progress and running and time.time() - drawn > 30:
            on_progress()
            drawn = time.time()
        try:
            time.sleep(0.5)
        except KeyboardInterrupt:  # train.py got the Ctrl-C too: each stops, its last
            interrupted = True      # checkpoint (from its last evaluation) whole
            print("\nCtrl-C: the running trainings stop and keep their last checkpoints; "
                  "run the same command again to continue", flush=True)
        for item in list(running):
            key, cfg, process, log = item
            if process.poll() is None:
                continue
            running.remove(item)
            log.close()
            if process.returncode == 0:
                timing["seconds"] += time.time() - started[key][0]
                timing["steps"] += cfg["max_iters"] - started[key][1]
                summaries[key] = summarise(cfg, cfg["out_dir"], samples, threads)
                elapsed = (time.time() - t_start) / 60
                print(f"    done {cfg['out_dir']}: val loss {summaries[key]['val_loss_full']:.4f}" +
                      progress(todo, running, timing, jobs, left, f"{elapsed:.1f} min so far"),
                      flush=True)
            elif process.returncode == 130:
                interrupted = True
            elif any(r["kind"] == "diverged" for r in read_log(cfg["out_dir"])):
                summaries[key] = diverged_summary(cfg, cfg["out_dir"])
                print(f"    diverged {cfg['out_dir']} (counts as worse than any finite loss)" +
                      progress(todo, running, timing, jobs, left), flush=True)
            else:
                failed.append(cfg["out_dir"])
                tail = (open(os.path.join(cfg["out_dir"], "train.out")).read()
                        .strip().splitlines()[-3:])
                print(f"    FAILED {cfg['out_dir']} (exit {process.returncode}):\n      " +
                      "\n      ".join(tail))
    return summaries, interrupted, failed
