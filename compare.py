"""
The paper's comparison, settled with paired statistics: every variant trained on the same data
with the same seeds (the same batches, vanilla's initial values for every tensor a mode shares),
and per variant the difference to vanilla on each seed, its mean, a 95% t interval, the sign
count and what it rules out.

    # config/compare.py: vanilla, the lambda = 2 mix and SVFormer at 250 steps on 8 seeds, each
    # at its own best peak lr (the preset's lrs, found by --tune)
    python compare.py
    # a class's demo (3-5 min on 2 cores): 250 steps, one seed, with what 20 other seeds did
    # (the preset's calibration) beside each difference
    python compare.py config/demo.py
    # the paper's protocol, every variant at one lr: here 6e-3, a grid step below their best
    python compare.py --lrs= --learning_rate=6e-3 --min_lr=6e-4 --out_dir=out-6e-3
    # your variants and seeds (--seeds=7 is the one seed 7); a variant's own settings after ':'
    python compare.py --modes=vanilla,resformer,resformer:n_layer=14 --seeds=1337,7,99
    # each variant's best peak lr first, searched on seeds never reported (--tune_seeds)
    python compare.py --tune --modes=vanilla,resformer --out_dir=out-tune
    # the paper's "matches a vanilla model X% larger": vanilla at 3 or more sizes
    python compare.py --modes=vanilla,vanilla:n_embd=48,vanilla:n_embd=96,resformer

A variant is a value mode of model.py, optionally with _learnable (ResFormer, learned lambdas),
_kvN (N key/value heads) and :key=value settings for it alone. Every run is `python train.py` in
its own folder (<variant>_seed<k>/), --jobs at a time (spread over GPUs), or by any scheduler
(--plan prints the commands). The same command again reuses finished runs and resumes stopped
ones only where today's code trained them (lab/runs.py's code_version, blind to comments and
formatting); a run of other code is moved aside, kept, and trained again. Writes results.md,
results.json and (with matplotlib) pictures to out_dir.
"""
import collections
import os
import sys
import time

import numpy as np
import torch

import data
from configurator import ConfigError, parse_args, run_main
from lab import plots, tables
from lab.analysis import FLOOR, bands, bracketed, plural
from lab.grid import (best_lrs, build_grid, calibrated, calibration_folders, own_lrs, parse_list,
                      parse_modes, parse_seeds, per_mode, search_lrs, tune_plan, tuned_grid,
                      with_floor)
from lab.runs import code_version, hardware, plan_line, run_grid
from train import ACTIONS, SETTINGS as TRAIN_SETTINGS

COMPARE_SETTINGS = dict(
    modes=("vanilla,resformer:lambda_1=2:lambda_2=1,svformer",
           "variants to train: a value mode of model.py, then _learnable, _kvN, :key=value"),
    seeds=("1337,1338,1339,1340,1341,1342,1343,1344",
           "the seeds to train, a list (7 is seed 7; 1,2,3 three seeds)"),
    jobs=(0, "runs side by side (0 = the CPU cores / threads; on GPUs, one per GPU; on MPS 1); "
             "on GPUs the runs are spread over them", 0),
    plan=(False, "print each run's shell command (from this folder) and train nothing: run them "
                 "with any scheduler, then this command again for the tables"),
    threads=(1, "CPU threads per run, whatever --jobs: another count rounds differently, so "
                "the same command prints the same numbers only at the same count", 1),
    noise_floor=(1, "on this many of the seeds, also train vanilla with its initial weights "
                    "nudged one rounding step (lab.nudged): how far rounding alone moves a run "
                    "(another CPU or thread count), beside every difference (0 = off)", 0),
    calibration=("", "folders of this setting's runs on other seeds (compare out_dirs, comma-"
                     "separated): beside each one-seed difference, where it fell on those seeds"),
    reuse_other_code=(False, "reuse runs (and calibrations) that other code trained (another "
                             "code version): said in results.md; for reading old records"),
    analysis_samples=(64, "held-out windows for attention entropy and token similarity", 1),
    tune=(False, "first find each variant's best peak learning rate, then compare each at its "
                 "own best and (the paper's protocol) all at vanilla's best"),
    tune_lrs=("6e-3,8.5e-3,1.2e-2,1.7e-2,2.4e-2",
              "--tune: starting grid of peak learning rates (min_lr follows the preset's ratio)"),
    tune_seeds=("1,2,3,4", "--tune: the seeds of the search, a list like --seeds; never the "
                           "reported --seeds; 4 so that one seed stalling moves the mean"),
    tune_extend=(4, "--tune: at most this many learning rates added beyond each end of the grid",
                 0),
    escape_loss=(2.9, "the early plateau's exit: a run has left it when its fixed-window val loss "
                      "first falls below this (nats per token; 2.9 suits byte-level text; 0: off)",
                 0.0),
    gap_steps=("", "steps at which the paired gap to vanilla is tabled along the run (fixed-window "
                   "val loss), e.g. 200,800,2400; empty: a quarter, half, three quarters, the end"),
    lrs=("", "each variant's own peak lr, e.g. vanilla=1.2e-2,svformer=8.5e-3 (what --tune "
             "prints; min_lr follows); variants not named train at learning_rate; --lrs= "
             "trains all at learning_rate (the paper's protocol); --tune ignores it"),
)
# train.py's settings without its actions (compare.py decides per run to resume or start afresh)
# and without its one seed (--seeds lists them all)
SETTINGS = {**{k: v for k, v in TRAIN_SETTINGS.items() if k not in ACTIONS and k != "seed"},
            "out_dir": ("out-compare", "root of the comparison"), **COMPARE_SETTINGS}
USAGE = "python compare.py [config/preset.py ...] [--key=value ...] (default: config/compare.py)"
DEFAULT_PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", "compare.py")


def main(argv):
    if not any(not a.startswith("-") for a in argv) and os.path.isfile(DEFAULT_PRESET):
        argv = [DEFAULT_PRESET] + list(argv)  # no preset named: the comparison preset, said
        said = next(line.strip("# \n") for line in open(DEFAULT_PRESET) if line[:1] == "#")
        if "-h" not in argv and "--help" not in argv:
            print(f"no preset named: config/compare.py ({said})", file=sys.stderr, flush=True)
    for arg in argv:  # train.py's settings that mean nothing here, each said in one line
        if arg.startswith("--") and arg[2:].partition("=")[0] in ACTIONS:
            raise ConfigError(f"compare.py takes no {arg}: the same command again reuses finished "
                              f"runs and resumes stopped ones from their checkpoints; to train "
                              f"them afresh, use another --out_dir")
    if any(a.startswith("--seed=") for a in argv):  # train.py's one seed: --seeds lists them
        raise ConfigError("compare.py takes no seed: --seeds lists the seeds to train "
                          "(--seeds=42 for one, --seeds=42,43,44 for three)")
    cfg = vars(parse_args(SETTINGS, argv, USAGE))
    modes, seeds, gaps = checked(cfg)
    device = data.setup_device(cfg["device"], "float32")[0]
    gpus = torch.cuda.device_count() if device == "cuda" else 0  # cuda:N: that one GPU alone
    jobs = cfg["jobs"] or (gpus or 1 if device.startswith(("cuda", "mps"))
                           else max(1, (os.cpu_count() or 1) // cfg["threads"]))
    root, today = cfg["out_dir"], code_version()  # today: the version of today's code
    os.makedirs(root, exist_ok=True)
    if not cfg["plan"]:  # (a plan prints commands: its data may come later)
        data_dir = data.dataset_dir(cfg["dataset"])
        unit = "byte" if data.load_meta(data_dir)["tokenizer"] == "byte" else "token"  # loss's
        data.list_shards(data_dir, "train")  # the data's problems in one line, not once a run
    drawing = not cfg["plan"] and plots.pyplot()
    if not drawing and not cfg["plan"]:  # without matplotlib, said now: a search takes hours
        print("pictures: matplotlib is not installed (pip install matplotlib): results.md only",
              flush=True)
    t_start, search, best, points = time.time(), None, None, []
    if cfg["tune"]:
        search, interrupted, failed = search_lrs(cfg, modes, root, jobs, today)
        if interrupted or failed:
            return stopped(root) if interrupted else failures(failed)
        best = best_lrs(search)
        print("best peak learning rates: " + ", ".join(f"{n} {lr:g}" for n, lr in best.items()) +
              '\n  for a preset: lrs = "' + ",".join(f"{n}={lr:g}" for n, lr in best.items()) + '"')
        for name, by_lr in search.items():  # stopped at its cap: the best may lie beyond it
            if not bracketed({lr: np.mean(v) for lr, v in by_lr.items()}):
                print(f"WARNING: {name}'s best, {best[name]:g}, is the edge of the grid searched "
                      f"(--tune_extend={cfg['tune_extend']} reached): not a bracketed optimum; "
                      f"widen --tune_lrs or raise --tune_extend", flush=True)
        grid, modes, points = tuned_grid(cfg, modes, seeds, root, best)
    else:
        modes = own_lrs(modes, cfg)
        grid = build_grid(cfg, modes, seeds, [("", {})], root)
    grid = with_floor(grid, cfg, modes, seeds, root)
    unique = {}  # a run two protocols share (vanilla at its best lr) trains once
    for key, run in grid:
        unique.setdefault(run["out_dir"], (key, run))
    if cfg["plan"]:  # each run not finished yet as a shell command; nothing trains here
        for _, run in unique.values():
            if line := plan_line(run, cfg["threads"], today):
                print(line)
        return 0
    spread = f" over {plural(gpus, 'GPU')}" if gpus else ""
    print(f"{plural(len(unique), 'run')} ({shape(unique, modes, seeds, cfg)}), {jobs} at a "
          f"time{spread}, {plural(cfg['threads'], 'thread')} each, in {root}", flush=True)
    calibration = calibrated(cfg, modes, seeds, today) if cfg["calibration"] else None
    live = lambda: plots.live_loss(root, grid, cfg["escape_loss"], unit=unit,  # noqa: E731
                                   calibration=calibration)
    if drawing:
        print(f"the loss picture, redrawn every 30 s while they train: "
              f"{os.path.join(root, 'loss.png')}", flush=True)
    done, interrupted, failed = run_grid(list(unique.values()), jobs, cfg["threads"],
                                         cfg["analysis_samples"], today, live, gpus,
                                         cfg["reuse_other_code"])
    if interrupted:
        return stopped(root)
    if failed:  # no tables: they would leave the failed variants out as if never asked for
        return failures(failed, len(unique))
    summaries = {key: done[unique[run["out_dir"]][0]] for key, run in grid
                 if unique[run["out_dir"]][0] in done}
    names = [n for n, _ in modes] + [FLOOR]  # (the floor: only where it was trained)
    results = per_mode(summaries, names, seeds, "", cfg["escape_loss"], gaps)
    paper = per_mode(summaries, names, seeds, points[0][0], 0.0, ()) if points else {}
    bands(results, calibration)
    info = {"command": "python compare.py" + "".join(" " + a for a in argv if a != DEFAULT_PRESET),
            "seeds": seeds, "hardware": hardware(device, gpus or 1), "jobs": jobs,
            "threads": cfg["threads"],
            # a reused run may have trained elsewhere: its numbers hold on the machine that did
            "trained_on": dict(collections.Counter(s.get("machine", "not recorded")
                                                   for s in done.values())),
            "wall_min": (time.time() - t_start) / 60, "runs": len(unique),
            "reused": sum(1 for s in done.values() if s.get("reused")),
            "other_code": cfg["reuse_other_code"], "code": today,
            "escape_loss": cfg["escape_loss"], "unit": unit, "steps": cfg["max_iters"],
            "calibration": calibration and {k: calibration[k] for k in (
                "folder", "seeds", "command", "unused", "machines", "floor")}}
    if not search:  # what every table describes: each variant's peak lr
        info["peak_lrs"] = {n: o.get("learning_rate", cfg["learning_rate"]) for n, o in modes}
        named = [item.rpartition("=")[0] for item in parse_list(cfg["lrs"])]
        info["own_lrs"] = [n for n, _ in modes if n in named]  # those --lrs gave their own lr
    else:
        info.update(tune_seeds=parse_seeds(cfg["tune_seeds"], "tune_seeds"), best_lrs=best)
    tables.write_tables(root, results, paper, info, search)
    pictures = plots.write_all(root, results, search, cfg["escape_loss"], unit=unit)
    print(open(os.path.join(root, "results.md")).read())
    print("wrote " + ", ".join([os.path.join(root, "results.md"),
                                os.path.join(root, "results.json")] + pictures))
    return 0


def checked(cfg):
    """(modes, seeds, gap steps), each mistake refused in one line before any data work."""
    modes, seeds = parse_modes(cfg["modes"]), parse_seeds(cfg["seeds"])
    gaps = parse_list(cfg["gap_steps"], int) or [  # evaluated steps only
        int(cfg["max_iters"] * f) // cfg["eval_interval"] * cfg["eval_interval"]
        for f in (0.25, 0.5, 0.75)] + [cfg["max_iters"]]
    if any(st % cfg["eval_interval"] and st != cfg["max_iters"] for st in gaps):
        raise ConfigError(f"--gap_steps={cfg['gap_steps']}: the loss is measured every "
                          f"eval_interval={cfg['eval_interval']} steps and at max_iters; "
                          f"give steps among those")
    if cfg["tune"] and cfg["plan"]:
        raise ConfigError("--plan lists a fixed grid, and --tune's search grows round by round: "
                          "run the search with compare.py itself")
    if cfg["tune"]:
        tune_plan(cfg)  # a mistake in the search's settings stops here, before any data work
    if cfg["noise_floor"] > len(seeds):
        raise ConfigError(f"--noise_floor={cfg['noise_floor']}: the floor is trained on that many "
                          f"of the seeds, and --seeds names {len(seeds)}")
    calibration_folders(cfg)  # a folder named is never ignored silently
    own_lrs(modes, cfg)  # a mistake in --lrs, said now too
    return modes, seeds, gaps


def shape(unique, modes, seeds, cfg):
    """'3 variants x 1 seed, and vanilla nudged on 1 seed: the noise floor': what is trained."""
    floors = sum(1 for (name, _, _), _ in unique.values() if name == FLOOR)
    fair = len(modes) * len(seeds)
    return (f"{plural(len(modes), 'variant')} x {plural(len(seeds), 'seed')}"
            + (" at their own best lr" if cfg["tune"] else "")
            + (f", and {len(unique) - fair - floors} at vanilla's best lr: the paper's protocol"
               if len(unique) > fair + floors else "")
            + (f", and vanilla nudged on {plural(floors, 'seed')}: the noise floor"
               if floors else ""))


def failures(failed, total=None):
    """The last line when runs failed, each having said why as it failed; exit status 1."""
    print((f"{len(failed)} of {plural(total, 'run')}" if total else
           f"{plural(len(failed), 'run')} of the learning-rate search") + " failed (" +
          ", ".join(os.path.basename(run) for run in failed) + "): fix it and run the same "
          "command again; finished runs are reused", flush=True)
    return 1


def stopped(root):
    """Ctrl-C's one line, once every run has stopped (run_grid says nothing itself); exit 130."""
    print(f"Ctrl-C: stopped; finished runs are kept in {root}, stopped ones keep their last "
          f"checkpoint: the same command again goes on from there", flush=True)
    return 130


if __name__ == "__main__":
    run_main(main)
