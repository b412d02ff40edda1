"""
The paper's comparison, settled with paired statistics: every variant trained on the same data
with the same seeds (the same batches, vanilla's initial values for every tensor a mode shares),
and per variant the difference to vanilla on each seed, its mean, a 95% t interval and the wins.

    # config/compare.py: vanilla, ResFormer, the lambda = 2 mix and SVFormer on 3 seeds, each
    # at its own best peak lr (the preset's lrs, found by --tune)
    python compare.py
    # a class's demo (3-5 min on 2 cores): 250 of the 800 steps, one seed, with what other seeds
    # did (the preset's calibration) beside each difference
    python compare.py config/demo.py
    # the paper's protocol: every variant at one lr (the preset's learning_rate)
    python compare.py --lrs= --out_dir=out-paper
    # your variants and seeds (--seeds=7 is the one seed 7); a variant's own settings after ':'
    python compare.py --modes=vanilla,resformer,resformer:n_layer=14 --seeds=1337,7,99
    # each variant's best peak lr first, searched on seeds never reported (--tune_seeds)
    python compare.py --tune --modes=vanilla,resformer --out_dir=out-tune
    # the paper's "matches a vanilla model X% larger": vanilla at 3 or more sizes
    python compare.py --modes=vanilla,vanilla:n_embd=48,vanilla:n_embd=96,resformer

A variant is a value mode of model.py with optional suffixes _learnable (ResFormer, learned
lambdas) and _kvN (N key/value heads), then optional :key=value settings for it alone. Every run
is `python train.py` in its own folder (<variant>_seed<k>/; lab/runs.py), --jobs at a time (on
GPUs, spread over them), or by any scheduler: --plan prints the runs' commands. The same command
again reuses finished runs and resumes stopped ones. Writes results.md, results.json and (with
matplotlib) pictures to out_dir.
"""
import collections
import json
import os
import re
import time
from types import SimpleNamespace

import numpy as np
import torch

import data
from configurator import (COUNT, POSITIVE, ConfigError, at_least, between, given_keys,
                          load_config, parse_args, parse_list, plural, resolve_device, run_main)
from lab import plots, tables
from lab.analysis import (FLOOR, bands, bracketed, crossing, escape, next_lr, paired_stats,
                          round_lr)
from lab.runs import final_loss, finished, hardware, plan_line, run_grid
from model import VALUE_MODES
from train import ACTIONS, SETTINGS as TRAIN_SETTINGS, decay_end

COMPARE_SETTINGS = dict(
    modes=("vanilla,resformer,resformer:lambda_1=2:lambda_2=1,svformer",
        "variants to train: a value mode of model.py, then _learnable, _kvN, :key=value"),
    seeds=("1337,1338,1339", "the seeds to train, a list (7 is seed 7; 1,2,3 three seeds)"),
    less_data=(0.0,
        "also train ResFormer on this share of the tokens (its own schedule), e.g. 0.85; 0 = off",
        between(0.0, 0.999)),
    jobs=(0, "runs side by side (0 = the CPU cores / threads; on GPUs, one per GPU; on MPS 1); "
             "on GPUs the runs are spread over them", COUNT),
    plan=(False, "print each run's shell command (from this folder) and train nothing: run them "
                 "with any scheduler, then this command again for the tables"),
    threads=(1, "CPU threads per run, whatever --jobs: another count rounds differently, so "
                "the same command prints the same numbers only at the same count", POSITIVE),
    noise_floor=(1, "on this many of the seeds, also train vanilla with its initial weights "
                    "nudged one rounding step (train.py --nudge): how far rounding alone moves "
                    "a run (another CPU or thread count), beside every difference (0 = off)",
                 COUNT),
    calibration=("", "a folder of this setting's runs on other seeds (a compare out_dir): "
                     "beside each one-seed difference, where it fell on those seeds"),
    analysis_samples=(64, "held-out windows for attention entropy and token similarity",
                      POSITIVE),
    tune=(False, "first find each variant's best peak learning rate, then compare each at its "
                 "own best and (the paper's protocol) all at vanilla's best"),
    tune_lrs=("6e-3,8.5e-3,1.2e-2,1.7e-2,2.4e-2",
              "--tune: starting grid of peak learning rates (min_lr follows the preset's ratio)"),
    tune_seeds=("1,2,3,4", "--tune: the seeds of the search, a list like --seeds; never the "
                           "reported --seeds; 4 so that one seed stalling moves the mean"),
    tune_extend=(4, "--tune: at most this many learning rates added beyond each end of the grid",
                 COUNT),
    escape_loss=(2.9, "the early plateau's exit: a run has left it when its fixed-window val loss "
                      "first falls below this (nats per token; 2.9 suits byte-level text; 0: off)",
                 at_least(0.0)),
    gap_steps=("", "steps at which the paired gap to vanilla is tabled along the run (fixed-window "
                   "val loss), e.g. 200,800,2400; empty: a quarter, half, three quarters, the end"),
    lrs=("", "each variant's own peak lr, e.g. vanilla=1.2e-2,svformer=8.5e-3 (what --tune "
             "prints; min_lr follows); variants not named train at learning_rate; --lrs= "
             "trains all at learning_rate (the paper's protocol); --tune ignores it"),
)
# train.py's settings without its actions: compare.py decides per run to resume or start afresh
# and without its one seed: --seeds lists them all
SETTINGS = {**{k: v for k, v in TRAIN_SETTINGS.items() if k not in ACTIONS and k != "seed"},
            "out_dir": ("out-compare", "root of the comparison"), **COMPARE_SETTINGS}
USAGE = ("usage: python compare.py [config/preset.py ...] [--key=value ...]   "
         "(default preset: config/compare.py)")
DEFAULT_PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", "compare.py")
# a variant's name: a value mode of model.py, then optional _learnable and _kvN shorthands
MODE_RE = re.compile(r"^(\w+?)(_learnable)?(?:_kv(\d+))?$")


def parse_overrides(text, what):
    """'n_layer=8:max_iters=400' -> {'n_layer': 8, 'max_iters': 400},
    typed like train.py's settings."""
    pairs = [p for p in text.split(":") if p]
    if not all("=" in p for p in pairs):
        raise ConfigError(f"{what}: settings are key=value, separated by ':' "
                          "(e.g. n_layer=8:max_iters=400)")
    given = vars(load_config(TRAIN_SETTINGS, ["--" + p for p in pairs], "train.py"))
    return {p.partition("=")[0]: given[p.partition("=")[0]] for p in pairs}


def parse_modes(text):
    """'vanilla,svformer_kv1:n_layer=8' -> [(name, {train settings for that variant}), ...]. A
    name in VALUE_MODES is that mode, whatever it ends with (a mode of your own, gated_kv2)."""
    modes = []
    for spec in parse_list(text):
        base_name, _, extra = spec.partition(":")
        match = MODE_RE.match(base_name)
        if base_name not in VALUE_MODES and (not match or match.group(1) not in VALUE_MODES):
            raise ConfigError(f"unknown mode {spec!r}: use {', '.join(VALUE_MODES)} (model.py's "
                              "VALUE_MODES), optionally with _learnable (resformer), _kvN and "
                              ":key=value settings, e.g. svformer_kv1:n_layer=8")
        base, learnable, kv = ((base_name, None, None) if base_name in VALUE_MODES
                               else match.groups())
        if learnable and base != "resformer":
            raise ConfigError(f"mode {spec!r}: _learnable applies to resformer only")
        modes.append((spec, dict(value_mode=base, learnable_lambda=bool(learnable),
                                 n_kv_head=int(kv or 0),
                                 **parse_overrides(extra, f"mode {spec!r}"))))
    if not modes:
        raise ConfigError("--modes is empty")
    return modes


def parse_seeds(text, key="seeds"):
    """The seeds to train, always a list: '7' -> [7], '1337,1338,1339' -> those (also '7,', and
    '(1, 2, 3)', as a preset file's tuple arrives). key: the setting they came from, for the
    errors."""
    parts = [p for p in re.split(r"[,\s()\[\]]+", str(text)) if p]
    if not parts:
        raise ConfigError(f"--{key}={text}: need at least one seed, e.g. --{key}=1337,1338,1339")
    if not all(p.isdigit() for p in parts):
        raise ConfigError(f"--{key}={text}: seeds are whole numbers >= 0, listed with commas "
                          f"(--{key}=1337,1338,1339; one seed: --{key}=1337)")
    if len(set(map(int, parts))) < len(parts):
        raise ConfigError(f"--{key}={text}: a seed is listed twice; list each seed once")
    return [int(p) for p in parts]


def build_grid(cfg, modes, seeds, points, root):
    """[((name, seed, point), train settings)] with seed outermost, so complete seed sets
    finish early."""
    base = {k: cfg[k] for k in TRAIN_SETTINGS if k in cfg}
    grid = []
    for seed in seeds:
        for point_name, point in points:
            for name, overrides in modes:
                folder = re.sub(r"[^A-Za-z0-9_.=-]+", "-",
                                f"{point_name}{'_' if point_name else ''}{name}_seed{seed}")
                run = {**base, **point, **overrides, "seed": seed,
                       "out_dir": os.path.join(root, folder)}
                # spelled out: a shorter variant keeps its own full schedule
                run["lr_decay_iters"] = decay_end(SimpleNamespace(**run))
                grid.append(((name, seed, point_name), run))
    return grid


def with_floor(grid, cfg, modes, seeds, root):
    """The grid and, on the first noise_floor seeds, vanilla again with only its rounding changed
    (its initial weights nudged one float32 step: train.py --nudge), each beside its seed's runs:
    how far rounding alone moves a run, the noise floor of every difference."""
    if not cfg["noise_floor"] or "vanilla" not in dict(modes):
        return grid
    floor = [(FLOOR, {**dict(modes)["vanilla"], **dict(parse_modes(FLOOR))[FLOOR]})]
    if cfg["tune"]:  # at vanilla's own best lr, in a folder named by it like the others
        floor_grid = at_lr(build_grid(cfg, floor, seeds[:cfg["noise_floor"]], [("", {})], root),
                           root)
    else:
        floor_grid = build_grid(cfg, floor, seeds[:cfg["noise_floor"]], [("", {})], root)
    return sorted(grid + floor_grid, key=lambda item: seeds.index(item[0][1]))


# ---- the learning-rate search (--tune) ----

def lr_settings(cfg, lr):
    """A peak learning rate with min_lr following it (the preset's ratio)."""
    return {"learning_rate": lr, "min_lr": round_lr(lr * cfg["min_lr"] / cfg["learning_rate"])}


def at_lr(grid, root, sub=""):
    """The grid's runs in folders named by variant, peak lr and seed (root/sub/), so a run
    shared by two protocols (vanilla at its best lr) is one run."""
    renamed = []
    for (name, seed, point), run in grid:
        lr = f"{run['learning_rate']:g}".replace("e+", "e")  # 1e+06 -> 1e06, not 1e-06
        folder = re.sub(r"[^A-Za-z0-9_.=-]+", "-", f"{name}_lr{lr}_seed{seed}")
        renamed.append(((name, seed, point), {**run, "out_dir": os.path.join(root, sub, folder)}))
    return renamed


def tune_plan(cfg):
    """The search's starting grid, its cap (lowest, highest lr) and seeds, checked before
    anything trains."""
    start = sorted({round_lr(lr) for lr in parse_list(cfg["tune_lrs"], float)})
    if len(start) < 2 or start[0] <= 0:
        raise ConfigError(f"--tune_lrs={cfg['tune_lrs']}: give at least two positive learning "
                          "rates, e.g. 6e-3,8.5e-3,1.2e-2")
    lowest = start[0] / (start[1] / start[0]) ** cfg["tune_extend"]
    highest = start[-1] * (start[-1] / start[-2]) ** cfg["tune_extend"]
    seeds = parse_seeds(cfg["tune_seeds"], "tune_seeds")
    reported = set(parse_seeds(cfg["seeds"]))
    if reported & set(seeds):
        raise ConfigError(f"--tune_seeds and --seeds share {sorted(reported & set(seeds))}: "
                          "the reported seeds must not be the ones the learning rate was picked on")
    return start, lowest, highest, seeds


def search_lrs(cfg, modes, root, jobs, samples):
    """Each variant's best peak learning rate, bracketed (analysis.next_lr): train the grid on
    the search seeds, add the point next_lr asks for, repeat until no variant asks for more.
    Returns ({name: {lr: [final loss per search seed]}}, interrupted, failed)."""
    start, lowest, highest, seeds = tune_plan(cfg)
    lrs = {name: list(start) for name, _ in modes}
    round_no = 0
    while True:
        round_no += 1
        search = {name: [(name, {**overrides, **lr_settings(cfg, lr)}) for lr in lrs[name]]
                  for name, overrides in modes}
        grid = at_lr(build_grid(cfg, [m for ms in search.values() for m in ms], seeds,
                                [("", {})], root), root, "lr_search")
        grid = [((name, seed, run["learning_rate"]), run) for (name, seed, _), run in grid]
        todo = sum(1 for _, run in grid if not finished(run, run["out_dir"]))
        print(f"lr search, round {round_no}: {len(grid)} runs ({todo} to train) on seeds "
              f"{seeds}", flush=True)
        summaries, interrupted, failed = run_grid(grid, jobs, cfg["threads"], samples,
                                                  quiet_reuse=True,
                                                  left="left in this round")
        if interrupted or failed:
            return None, interrupted, failed
        losses = {name: {lr: [final_loss(summaries[name, s, lr]) for s in seeds]
                         for lr in lrs[name]} for name in lrs}
        added = False
        for name in lrs:
            new_lr = next_lr({lr: float(np.mean(v)) for lr, v in losses[name].items()},
                             lowest, highest)
            if new_lr is not None and new_lr not in lrs[name]:
                print(f"    {name}: best lr not bracketed yet, adding {new_lr:g}", flush=True)
                lrs[name].append(new_lr)
                added = True
        if not added:
            return losses, False, []


def own_lrs(modes, cfg):
    """--lrs: the named variants at their own peak lr (the fair protocol without a search);
    a preset's lrs may name variants this command does not train."""
    lrs = {}
    for item in parse_list(cfg["lrs"]):
        name, _, lr = item.rpartition("=")  # a variant's name may hold '=' itself
        try:
            parse_modes(name)
            lrs[name] = float(lr)
        except (ValueError, ConfigError):
            lrs[name] = 0.0  # not a variant or not a number: refused below
        if lrs[name] <= 0:
            raise ConfigError(f"--lrs: {item!r} is not variant=learning_rate for a variant "
                              f"(vanilla, resformer, svformer, ...)")
    return [(name, {**o, **lr_settings(cfg, lrs[name])} if name in lrs else o)
            for name, o in modes]


def best_lrs(search):
    """{name: the lr of the lowest mean final loss over the search seeds}."""
    return {name: min(by_lr, key=lambda lr: np.mean(by_lr[lr])) for name, by_lr in search.items()}


def tuned_grid(cfg, modes, seeds, root, best):
    """The runs after the search, on the reported seeds: each variant at its own best lr (the
    fair protocol, point "") and, as the paper did, every variant at vanilla's best ("paper").
    Returns (grid, the variants, [the paper's point] or [])."""
    protocols = [("", best)] + ([("paper", {n: best["vanilla"] for n in best})]
                                if "vanilla" in best and len(best) > 1 else [])
    grid, variants = [], None
    for label, lr_of in protocols:
        at_lr_of = add_less_data([(n, {**o, **lr_settings(cfg, lr_of[n])}) for n, o in modes], cfg)
        grid += at_lr(build_grid(cfg, at_lr_of, seeds, [(label, {})], root), root)
        variants = variants or at_lr_of
    return grid, variants, protocols[1:]


def add_less_data(modes, cfg):
    """The paper's data-efficiency test: ResFormer trained on less_data of the tokens,
    its own schedule."""
    if not cfg["less_data"] or not any(o["value_mode"] == "resformer" for _, o in modes):
        return modes
    if not 0 < cfg["less_data"] < 1:
        raise ConfigError(f"--less_data={cfg['less_data']}: a share between 0 and 1 (e.g. 0.85), "
                          "or 0 for off")
    steps = round(cfg["less_data"] * cfg["max_iters"])
    resformer = dict(modes).get("resformer",
                                dict(value_mode="resformer", learnable_lambda=False, n_kv_head=0))
    extra = [(f"resformer:max_iters={steps}",
              {**resformer, "max_iters": steps, "lr_decay_iters": steps})]
    return modes + [m for m in extra if m[0] not in dict(modes)]


# ---- results ----

def per_mode(summaries, names, seeds, point, escape_loss=0.0, gap_steps=()):
    """For each variant: per-seed final losses and curves, when each left the early plateau
    (escape_loss), and the paired statistics of both against vanilla, also of the fixed-window
    loss at gap_steps along the run."""
    results = {}
    for name in names:
        runs = {s: summaries[name, s, point] for s in seeds
                if summaries.get((name, s, point), {}).get("status") == "done"}
        if not runs:
            continue
        finals = [r["val_loss_full"] for r in runs.values()]
        first = next(iter(runs.values()))
        r = {"seeds": list(runs), "val_loss": finals, "val_loss_mean": float(np.mean(finals)),
             "val_loss_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0,
             "num_params": first["num_params"], "active_params": first.get("active_params"),
             "flops_per_token": first.get("flops_per_token"),
             "kv_cache_bytes_per_token": first["kv_cache_bytes_per_token"],
             "tokens": [e["tokens"] for e in first["evals"]],
             "steps": [e["iter"] for e in first["evals"]],
             "total_tokens": first["evals"][-1]["tokens"],
             "tokens_per_step": first.get("tokens_per_step"),
             "curves": [[e["val_loss"] for e in run["evals"]] for run in runs.values()],
             "tokens_per_sec": float(np.mean([run["tokens_per_sec"] for run in runs.values()]))}
        for key in ("attention_entropy", "similarity"):
            per_seed = np.array([run[key] for run in runs.values()])
            r[key], r[key + "_std"] = (per_seed.mean(axis=0).tolist(),
                                       (per_seed.std(axis=0, ddof=1) if len(runs) > 1
                                        else 0 * per_seed[0]).tolist())
        if escape_loss:
            r["escape"] = [escape(run["evals"], escape_loss) for run in runs.values()]
        mixing = [run["evals"][-1].get("mixing") for run in runs.values()]
        if all(mixing):  # each learned mixing weight at the end, the mean over seeds
            r["mixing"] = {k: np.mean([m[k] for m in mixing], axis=0).tolist() for k in mixing[0]}
        results[name] = r
    if "vanilla" in results:
        base = results["vanilla"]
        for name, r in results.items():
            pairs = [(s, r["val_loss"][i] - base["val_loss"][base["seeds"].index(s)])
                     for i, s in enumerate(r["seeds"]) if name != "vanilla" and s in base["seeds"]]
            if pairs:
                r["paired"] = paired_stats([d for _, d in pairs])
                # in-run crossing: tokens where this curve first reaches vanilla's final
                # (fixed-window) loss
                r["crossing_tokens"] = [crossing(r["tokens"], r["curves"][i],
                                                 base["curves"][base["seeds"].index(s)][-1])
                                        for i, s in enumerate(r["seeds"]) if s in base["seeds"]]
            at = [st for st in gap_steps if st in r["steps"] and st in base["steps"]]
            if pairs and at:  # the gap along the run, inside the same runs
                r["gap"] = {st: paired_stats(
                    [r["curves"][i][r["steps"].index(st)]
                     - base["curves"][base["seeds"].index(s)][base["steps"].index(st)]
                     for i, s in enumerate(r["seeds"]) if s in base["seeds"]]) for st in at}
            if pairs and escape_loss:
                def left(res, i):  # a run still on the plateau counts at its last tokens
                    return res["escape"][i][1] if res["escape"][i] else res["tokens"][-1]
                r["escape_paired"] = paired_stats(
                    [left(r, i) - left(base, base["seeds"].index(s))
                     for i, s in enumerate(r["seeds"]) if s in base["seeds"]])
    return results


def main(argv):
    if not any(not a.startswith("-") for a in argv) and os.path.isfile(DEFAULT_PRESET):
        argv = [DEFAULT_PRESET] + list(argv)  # no preset named: the comparison preset
    refuse_train_only(argv)
    cfg = vars(parse_args(SETTINGS, argv, USAGE, "compare.py"))
    modes, seeds, gaps = checked(cfg)
    device = resolve_device(cfg["device"])
    gpus = torch.cuda.device_count() if device == "cuda" else 0  # cuda:N: that one GPU alone
    jobs = cfg["jobs"] or (gpus or 1 if device.startswith(("cuda", "mps"))
                           else max(1, (os.cpu_count() or 1) // cfg["threads"]))
    root = cfg["out_dir"]
    os.makedirs(root, exist_ok=True)
    if cfg["dataset"] == TRAIN_SETTINGS["dataset"][0]:
        data.prepare_default(data.dataset_dir(cfg["dataset"]))  # once, not once per run
    # the data's problems (missing, an older layout) in one line now, not once per run
    data_dir = data.dataset_dir(cfg["dataset"])
    unit = "byte" if data.load_meta(data_dir)["tokenizer"] == "byte" else "token"  # the loss's
    data.list_shards(data_dir, "train")
    drawing = not cfg["plan"] and plots.pyplot(quiet=True)
    if not drawing and not cfg["plan"]:  # without matplotlib, said now: a search takes hours
        print("pictures: matplotlib is not installed (pip install matplotlib): results.md only",
              flush=True)
    t_start, search, best, points = time.time(), None, None, []
    if cfg["tune"]:
        search, interrupted, failed = search_lrs(cfg, modes, root, jobs, cfg["analysis_samples"])
        if interrupted or failed:
            return stopped(root) if interrupted else failures(failed)
        best = best_lrs(search)
        capped = [n for n, by_lr in search.items()
                  if not bracketed({lr: np.mean(v) for lr, v in by_lr.items()})]
        print("best peak learning rates: " + ", ".join(f"{n} {lr:g}" for n, lr in best.items()) +
              "\n  for a preset: lrs = \"" + ",".join(f"{n}={lr:g}" for n, lr in best.items())
              + '"')
        for name in capped:  # the search stopped at its cap: the best may lie beyond the grid
            print(f"WARNING: {name}'s best, {best[name]:g}, is the edge of the grid searched "
                  f"(--tune_extend={cfg['tune_extend']} reached): not a bracketed optimum; "
                  f"widen --tune_lrs or raise --tune_extend", flush=True)
        grid, modes, points = tuned_grid(cfg, modes, seeds, root, best)
    else:
        modes = add_less_data(own_lrs(modes, cfg), cfg)
        grid = build_grid(cfg, modes, seeds, [("", {})], root)
    grid = with_floor(grid, cfg, modes, seeds, root)
    unique = {}  # a run two protocols share (vanilla at its best lr) trains once
    for key, run in grid:
        unique.setdefault(run["out_dir"], (key, run))
    if cfg["plan"]:  # each run not finished yet as a shell command; nothing trains here
        for _, run in unique.values():
            if line := plan_line(run, cfg["threads"]):
                print(line)
        return 0
    spread = f" over {plural(gpus, 'GPU')}" if gpus else ""
    print(f"{plural(len(unique), 'run')} ({shape(unique, modes, seeds, cfg)}), "
          f"{jobs} at a time{spread}, {plural(cfg['threads'], 'thread')} each, in {root}",
          flush=True)
    calibration = calibrated(cfg, modes, seeds) if cfg["calibration"] else None
    live = lambda: plots.live_loss(root, grid, cfg["escape_loss"], unit=unit,  # noqa: E731
                                   less_data=cfg["less_data"], calibration=calibration)
    if drawing:
        print(f"the loss picture, redrawn every 30 s while they train: "
              f"{os.path.join(root, 'loss.png')}", flush=True)
    done, interrupted, failed = run_grid(list(unique.values()), jobs, cfg["threads"],
                                         cfg["analysis_samples"], on_progress=live, gpus=gpus)
    if interrupted:
        return stopped(root)
    if failed:  # no tables: they would leave the failed variants out as if never asked for
        return failures(failed, len(unique))
    summaries = {key: done[unique[run["out_dir"]][0]] for key, run in grid
                 if unique[run["out_dir"]][0] in done}
    names = [n for n, _ in modes] + [FLOOR]  # (the floor: only where it was trained)
    results = per_mode(summaries, names, seeds, "", cfg["escape_loss"], gaps)
    paper = per_mode(summaries, names, seeds, points[0][0], 0.0, ()) if points else {}
    for name, r in results.items():  # the data-efficiency variant and the floor say what they are
        if plots.note(name, cfg["less_data"]):
            r["note"] = plots.note(name, cfg["less_data"])
    bands(results, calibration)
    info = {"command": "python compare.py" + "".join(" " + a for a in argv if a != DEFAULT_PRESET),
            "seeds": seeds, "hardware": hardware(device, gpus or 1), "jobs": jobs,
            "threads": cfg["threads"],
            # a reused run may have trained elsewhere: its numbers hold on the machine that did
            "trained_on": dict(collections.Counter(s.get("machine", "not recorded")
                                                   for s in done.values())),
            "wall_min": (time.time() - t_start) / 60, "runs": len(unique),
            "reused": sum(1 for s in done.values() if s.get("reused")),
            "given": sorted(given_keys(argv[1:] if argv and argv[0] == DEFAULT_PRESET else argv)),
            "escape_loss": cfg["escape_loss"], "unit": unit, "steps": cfg["max_iters"],
            "calibration": calibration and {k: calibration[k] for k in ("folder", "seeds",
                                                                         "command", "unused")}}
    if not search:  # what every table describes: each variant's peak lr
        info["peak_lrs"] = {n: o.get("learning_rate", cfg["learning_rate"]) for n, o in modes}
        named = [item.rpartition("=")[0] for item in parse_list(cfg["lrs"])]
        info["own_lrs"] = [n for n, _ in modes if n in named]  # those --lrs gave their own lr
    if search:
        info.update(tune_seeds=parse_seeds(cfg["tune_seeds"], "tune_seeds"), best_lrs=best)
    tables.write_tables(root, results, paper, info, search)
    pictures = plots.write_all(root, results, search, cfg["escape_loss"], unit=unit)
    print(open(os.path.join(root, "results.md")).read())
    print("wrote " + ", ".join([os.path.join(root, "results.md"),
                                os.path.join(root, "results.json")] + pictures))
    return 0


def checked(cfg):
    """(modes, seeds, gap steps) from the settings, each mistake refused in one line before any
    data work or training."""
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


# ---- the calibration: what other seeds did ----

def calibrated(cfg, modes, seeds):
    """What --calibration's folder says of this setting on other seeds: for each variant whose
    runs there are finished with exactly this command's settings (seed and folder aside), the
    per-seed differences to vanilla, at the end and along the run. The folder is a comparison of
    its own (its results.json names its seeds and command); a variant whose runs there differ
    or are missing gets none, and results.md says why."""
    folder = cfg["calibration"]
    try:
        with open(os.path.join(folder, "results.json")) as f:
            info = json.load(f)["info"]
    except (OSError, ValueError, KeyError):
        print(f"calibration: {folder}/results.json is missing or unreadable: no seed spread "
              f"beside the differences", flush=True)
        return {"folder": folder, "seeds": [], "command": None, "unused": {"all": "missing"},
                "modes": {}}
    other = [s for s in info["seeds"] if s not in seeds]
    runs, unused = {}, {}
    for (name, seed, _), run in build_grid(cfg, modes, other, [("", {})], folder):
        try:
            runs[name, seed] = finished(run, run["out_dir"])
        except (ConfigError, data.DataError) as e:  # other settings there: not this setting's
            unused[name] = str(e)
        if (runs.get((name, seed)) or {}).get("status") != "done":  # missing, or diverged
            unused.setdefault(name, f"{run['out_dir']}: not finished there")
    out = {"folder": folder, "seeds": other, "command": info.get("command"), "modes": {},
           "unused": unused}
    if "vanilla" in unused or "vanilla" not in dict(modes) or not other:
        return out  # nothing to pair a difference with
    for name in [n for n, _ in modes if n != "vanilla" and n not in unused]:
        base = [runs["vanilla", s] for s in other]
        mine = [runs[name, s] for s in other]
        out["modes"][name] = {
            "final": [m["val_loss_full"] - b["val_loss_full"] for m, b in zip(mine, base)],
            "steps": [e["iter"] for e in base[0]["evals"]],
            "curves": [[e["val_loss"] - v["val_loss"] for e, v in zip(m["evals"], b["evals"])]
                       for m, b in zip(mine, base)],
            "escape": [(escape(m["evals"], cfg["escape_loss"]), escape(b["evals"],
                                                                         cfg["escape_loss"]))
                       for m, b in zip(mine, base)] if cfg["escape_loss"] else None}
    return out


def failures(failed, total=None):
    """The last line when runs failed, each having said why as it failed; exit status 1."""
    print((f"{len(failed)} of {plural(total, 'run')}" if total else
           f"{plural(len(failed), 'run')} of the learning-rate search") + " failed (" +
          ", ".join(os.path.basename(run) for run in failed) + "): fix it and run the same "
          "command again; finished runs are reused", flush=True)
    return 1


def refuse_train_only(argv):
    """train.py's settings that mean nothing here, each refused in one line that says why."""
    for arg in argv:
        if arg.startswith("--") and arg[2:].partition("=")[0] in ACTIONS:
            raise ConfigError(f"compare.py takes no {arg}: the same command again reuses finished "
                              f"runs and resumes stopped ones from their checkpoints; to train "
                              f"them afresh, use another --out_dir")
    if "seed" in given_keys(argv):  # train.py's one seed: here --seeds names every one
        raise ConfigError("compare.py takes no seed: --seeds lists the seeds to train "
                          "(--seeds=42 for one, --seeds=42,43,44 for three)")


def stopped(root):
    print(f"interrupted: finished runs are kept in {root}, stopped ones have checkpoints; "
          f"run the same command again to continue")
    return 130


if __name__ == "__main__":
    run_main(main)
