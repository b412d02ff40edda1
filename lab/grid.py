"""compare.py's grid: the variants and seeds asked for (their grammar), the runs they make, the
noise floor's runs, the learning-rate search (--tune), each variant's numbers over its seeds
(per_mode), and what a calibration folder says of the same setting on other seeds."""
import itertools
import json
import os
import re
import numpy as np

import data
from configurator import ConfigError, parse_args
from model import VALUE_MODES
from train import SETTINGS as TRAIN_SETTINGS

from .analysis import FLOOR, crossing, escape, next_lr, paired_stats, round_lr
from .runs import LAB_SETTINGS, ROOT, by_other_code, final_loss, finished, run_grid

# a variant's name: a value mode of model.py, then optional _learnable and _kvN shorthands
MODE_RE = re.compile(r"^(\w+?)(_learnable)?(?:_kv(\d+))?$")


def parse_list(text, cast=str):
    """'128,512' -> [128, 512]; also '(128, 512)', which is how a preset file's tuple arrives."""
    items = [s.strip().strip("'\"") for s in str(text).strip("()[] ").split(",")]
    try:
        return [cast(s) for s in items if s]
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as a comma-separated list "
                          f"of {cast.__name__}") from None


def parse_overrides(text, what):
    """'n_layer=8:max_iters=400' -> {'n_layer': 8, 'max_iters': 400}, typed as train.py's."""
    pairs = [p for p in text.split(":") if p]
    if not all("=" in p for p in pairs):
        raise ConfigError(f"{what}: settings are key=value, separated by ':' "
                          "(e.g. n_layer=8:max_iters=400)")
    given = vars(parse_args({**TRAIN_SETTINGS, **LAB_SETTINGS}, ["--" + p for p in pairs], ""))
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
    """The seeds to train, always a list: '7' -> [7], '1337,1338,1339' -> those (also '7,' and a
    preset's tuple '(1, 2, 3)'). key: the setting they came from, for the errors."""
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
    """[((name, seed, point), train settings)], seed outermost: whole seed sets finish early."""
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
                run["lr_decay_iters"] = run["lr_decay_iters"] or run["max_iters"]
                grid.append(((name, seed, point_name), run))
    return grid


def with_floor(grid, cfg, modes, seeds, root):
    """The grid and, on the first noise_floor seeds, vanilla nudged one float32 step (FLOOR)."""
    if not cfg["noise_floor"] or "vanilla" not in dict(modes):
        return grid
    floor = [(FLOOR, {**dict(modes)["vanilla"], **dict(parse_modes(FLOOR))[FLOOR]})]
    floor_grid = build_grid(cfg, floor, seeds[:cfg["noise_floor"]], [("", {})], root)
    if cfg["tune"]:  # at vanilla's own best lr, in a folder named by it like the others
        floor_grid = at_lr(floor_grid, root)
    return sorted(grid + floor_grid, key=lambda item: seeds.index(item[0][1]))


def lr_settings(cfg, lr):
    """A peak learning rate with min_lr following it (the preset's ratio)."""
    return {"learning_rate": lr, "min_lr": round_lr(lr * cfg["min_lr"] / cfg["learning_rate"])}


def at_lr(grid, root, sub=""):
    """The runs in root/sub/ folders named by variant, lr and seed: protocols share a run."""
    renamed = []
    for (name, seed, point), run in grid:
        lr = f"{run['learning_rate']:g}".replace("e+", "e")  # 1e+06 -> 1e06, not 1e-06
        folder = re.sub(r"[^A-Za-z0-9_.=-]+", "-", f"{name}_lr{lr}_seed{seed}")
        renamed.append(((name, seed, point), {**run, "out_dir": os.path.join(root, sub, folder)}))
    return renamed


def tune_plan(cfg):
    """The search's starting grid, its cap (lowest, highest lr) and seeds, checked up front."""
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


def search_lrs(cfg, modes, root, jobs, today):
    """Each variant's best peak lr, bracketed: train on the search seeds, add what next_lr asks.
    Returns ({name: {lr: [final loss per search seed]}}, interrupted, failed)."""
    start, lowest, highest, seeds = tune_plan(cfg)
    lrs = {name: list(start) for name, _ in modes}
    for round_no in itertools.count(1):
        search = [(name, {**overrides, **lr_settings(cfg, lr)})
                  for name, overrides in modes for lr in lrs[name]]
        grid = at_lr(build_grid(cfg, search, seeds, [("", {})], root), root, "lr_search")
        grid = [((name, seed, run["learning_rate"]), run) for (name, seed, _), run in grid]
        todo = sum(1 for _, run in grid if not finished(run, run["out_dir"]))
        print(f"lr search, round {round_no}: {len(grid)} runs ({todo} to train) on seeds "
              f"{seeds}", flush=True)
        summaries, interrupted, failed = run_grid(grid, jobs, cfg["threads"],
                                                  cfg["analysis_samples"], today,
                                                  force=cfg["reuse_other_code"])
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
    """--lrs: the named variants at their own peak lr; a preset's may name variants not trained."""
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
    return [(name, {**o, **lr_settings(cfg, lrs[name])} if name in lrs else o) for name, o in modes]


def best_lrs(search):
    """{name: the lr of the lowest mean final loss over the search seeds}."""
    return {name: min(by_lr, key=lambda lr: np.mean(by_lr[lr])) for name, by_lr in search.items()}


def tuned_grid(cfg, modes, seeds, root, best):
    """After the search: each variant at its own best lr (point "") and, as the paper did, all at
    vanilla's best ("paper"). Returns (grid, the variants, [the paper's point] or [])."""
    protocols = [("", best)] + ([("paper", {n: best["vanilla"] for n in best})]
                                if "vanilla" in best and len(best) > 1 else [])
    grid, variants = [], None
    for label, lr_of in protocols:
        at_lr_of = [(n, {**o, **lr_settings(cfg, lr_of[n])}) for n, o in modes]
        grid += at_lr(build_grid(cfg, at_lr_of, seeds, [(label, {})], root), root)
        variants = variants or at_lr_of
    return grid, variants, protocols[1:]


def per_mode(summaries, names, seeds, point, escape_loss=0.0, gap_steps=()):
    """For each variant: per-seed final losses and curves, when each left the early plateau, and
    the paired statistics against vanilla, also of the fixed-window loss at gap_steps."""
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
    base = results.get("vanilla")
    for name, r in results.items() if base else []:
        # (i, j): a seed's place in this variant's lists and in vanilla's
        pairs = [(i, base["seeds"].index(s)) for i, s in enumerate(r["seeds"])
                 if name != "vanilla" and s in base["seeds"]]
        if pairs:
            r["paired"] = paired_stats([r["val_loss"][i] - base["val_loss"][j] for i, j in pairs])
            # The in-run crossing: where this curve first reaches vanilla's final loss.
            r["crossing_tokens"] = [crossing(r["tokens"], r["curves"][i], base["curves"][j][-1])
                                    for i, j in pairs]
        at = [st for st in gap_steps if st in r["steps"] and st in base["steps"]]
        if pairs and at:  # the gap along the run, inside the same runs
            r["gap"] = {st: paired_stats([r["curves"][i][r["steps"].index(st)]
                                          - base["curves"][j][base["steps"].index(st)]
                                          for i, j in pairs]) for st in at}
    return results


def calibration_folders(cfg):
    """--calibration's folders, as given or in the project; one not there is an error."""
    folders = []
    for folder in parse_list(cfg["calibration"]):
        found = next((f for f in (folder, os.path.join(ROOT, folder))
                      if os.path.isfile(os.path.join(f, "results.json"))), None)
        if found is None:
            raise ConfigError(f"--calibration={folder}: no comparison there (no results.json): "
                              f"name the out_dir of a compare.py run of this setting")
        folders.append(found)
    return folders


def calibrated(cfg, modes, seeds, today):
    """What --calibration's folders say of this setting on other seeds: per variant today's code
    finished there, its per-seed differences to vanilla, at the end and along the run; machines."""
    runs, unused, other, commands = {}, {}, [], []
    for folder in calibration_folders(cfg):
        info = json.load(open(os.path.join(folder, "results.json")))["info"]
        theirs = [s for s in info["seeds"] if s not in seeds and s not in other]
        other, commands = other + theirs, commands + [info.get("command")]
        # Rounding alone too, where a folder trained it: one draw of it does not tell its size.
        floor = [(FLOOR, {**dict(modes).get("vanilla", {}), **dict(parse_modes(FLOOR))[FLOOR]})]
        for (name, seed, _), run in build_grid(cfg, modes + floor, theirs, [("", {})], folder):
            # Each reason in words that name what is there: a calibration is a record, never
            # to be deleted, and a folder not there is not named as if it were.
            if not os.path.isdir(run["out_dir"]):  # (rounding alone: only where it was trained)
                if name != FLOOR:
                    unused.setdefault(name, f"{folder} has no run of it on seed {seed}")
                continue
            try:
                summary = finished(run, run["out_dir"])
            except (ConfigError, data.DataError):  # other settings, or an older format
                unused.setdefault(name, f"{run['out_dir']} holds a run of other settings")
                continue
            why = summary and by_other_code(run["out_dir"], today, cfg["reuse_other_code"])
            if why:
                unused.setdefault(name, f"{run['out_dir']} was trained by other code ({why})")
            elif (summary or {}).get("status") != "done":  # stopped, or diverged
                unused.setdefault(name, f"{run['out_dir']} holds no finished run")
            else:
                runs[name, seed] = summary
    for name, why in unused.items():
        print(f"calibration: none for {name}: {why}", flush=True)
    out = {"folder": cfg["calibration"], "seeds": other, "command": commands, "modes": {},
           "unused": unused, "machines": sorted({r.get("machine", "not recorded")
                                                 for r in runs.values()}),
           "floor": [runs[FLOOR, s]["val_loss_full"] - runs["vanilla", s]["val_loss_full"]
                     for s in other if (FLOOR, s) in runs and ("vanilla", s) in runs]}
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
            "escape": [tuple(escape(x["evals"], cfg["escape_loss"]) for x in (m, b))
                       for m, b in zip(mine, base)] if cfg["escape_loss"] else None}
    return out
