"""
The paper's comparison, settled with paired statistics: train vanilla, ResFormer and SVFormer on
the same data with the same seeds (same initial RNG state, same batches) and report, per variant,
the per-seed difference to vanilla, its mean, a 95% t interval and the wins.

    # config/compare.py: 3 seeds x (vanilla, ResFormer, SVFormer, ResFormer on 85% of the tokens)
    python compare.py
    # the headline pair (+ ResFormer on 85% of the tokens)
    python compare.py --modes=vanilla,resformer
    # a variant with its own settings
    python compare.py --modes=vanilla,resformer,resformer:n_layer=14
    python compare.py --sweep="n_layer=4:max_iters=1600,n_layer=16:max_iters=800" \
        --seeds=1 --less_data=0
    python compare.py config/quickstart.py --seeds=1337,42    # any preset, listed seeds

A mode is a value mode with optional suffixes `_learnable` (ResFormer, learned lambdas) and `_kvN`
(N key/value heads), then optional `:key=value` settings for that variant alone. Every run is
`python train.py` in its own folder (<mode>_seed<k>/); `jobs` runs go side by side, one CPU thread
each. A finished run is reused; a run that was stopped resumes from its checkpoint: run the same
command again. Writes results.md, results.json and pictures (with matplotlib) to out_dir.
"""
import json
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np
import torch

import plots
import shards
from analysis import analyse, crossing, internals, paired_stats, verdict
from configurator import (TRAIN_SETTINGS, ConfigError, defaults_of, given_keys, load_config,
                          parse_args, parse_list)
from model import GPT, load_checkpoint

COMPARE_SETTINGS = dict(
    modes=("vanilla,resformer,svformer",
        "variants to train: a value mode, _learnable, _kvN, :key=value"),
    seeds=("3", "a count (3 seeds from --seed) or a list (1,2,3)"),
    less_data=(0.85,
        "also train ResFormer on this share of the tokens (its own schedule); 0 = off"),
    sweep=("", "comma-separated sets of settings (key=value:key=value) to run every mode at"),
    jobs=(0, "runs side by side (0 = one per CPU core, or 1 on a GPU)"),
    plot=("",
        "only plot the log.jsonl of these run folders (e.g. out,out2) into plot_path, then exit"),
    plot_path=("runs.png", "the picture --plot writes"),
    analysis_samples=(64, "held-out windows for attention entropy and token similarity"),
)
SETTINGS = {**TRAIN_SETTINGS, "out_dir": ("out-compare", "root of the comparison"),
            **COMPARE_SETTINGS}
USAGE = ("usage: python compare.py [config/preset.py ...] [--key=value ...]   "
         "(default preset: config/compare.py)")
DEFAULT_PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", "compare.py")
MODE_RE = re.compile(r"^(vanilla|resformer|svformer)(_learnable)?(?:_kv(\d+))?$")
TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


def parse_overrides(text, what):
    """'n_layer=8:max_iters=400' -> {'n_layer': 8, 'max_iters': 400},
    typed like train.py's settings."""
    pairs = [p for p in text.split(":") if p]
    if not all("=" in p for p in pairs):
        raise ConfigError(f"{what}: settings are key=value, separated by ':' "
                          "(e.g. n_layer=8:max_iters=400)")
    given = load_config(defaults_of(TRAIN_SETTINGS), ["--" + p for p in pairs])
    return {p.partition("=")[0]: given[p.partition("=")[0]] for p in pairs}


def parse_modes(text):
    """'vanilla,svformer_kv1:n_layer=8' -> [(name, {train settings for that variant}), ...]."""
    modes = []
    for spec in parse_list(text):
        base_name, _, extra = spec.partition(":")
        match = MODE_RE.match(base_name)
        if not match:
            raise ConfigError(f"unknown mode {spec!r}: use vanilla, resformer or svformer, "
                              "optionally with _learnable (resformer), _kvN and :key=value "
                              "settings, e.g. svformer_kv1:n_layer=8")
        base, learnable, kv = match.groups()
        if learnable and base != "resformer":
            raise ConfigError(f"mode {spec!r}: _learnable applies to resformer only")
        modes.append((spec, dict(value_mode=base, learnable_lambda=bool(learnable),
                                 n_kv_head=int(kv or 0),
                                 **parse_overrides(extra, f"mode {spec!r}"))))
    if not modes:
        raise ConfigError("--modes is empty")
    return modes


def parse_seeds(text, first_seed):
    """'3' -> three seeds from first_seed; '1,2,3' (or '(1, 2, 3)', as a preset file's tuple
    arrives) -> those."""
    parts = [p for p in re.split(r"[,\s()\[\]]+", str(text)) if p]
    if not parts or not all(p.lstrip("-").isdigit() for p in parts):
        raise ConfigError(f"--seeds={text}: give a count (3) or a list (1,2,3)")
    if len(parts) == 1 and "," not in str(text):
        if int(parts[0]) < 1:
            raise ConfigError(f"--seeds={text}: need at least one seed")
        if int(parts[0]) > 50:  # surely meant as the seed itself
            raise ConfigError(f"--seeds={text} asks for {text} seeds: for the one seed {text} "
                              f"write --seeds={text}, (a list) or --seed={text} --seeds=1")
        return [first_seed + i for i in range(int(parts[0]))]
    return [int(p) for p in parts]


def heldout_windows(cfg, n):
    """The same n windows of block_size tokens, evenly spaced over the val shard, for every mode."""
    data_dir = shards.dataset_dir(cfg["dataset"])
    meta = shards.load_meta(data_dir)
    tokens = shards.read_shard(shards.list_shards(data_dir, "val")[0], meta["vocab_size"])
    T = cfg["block_size"]
    starts = np.linspace(0, len(tokens) - T, num=n).astype(np.int64)
    return torch.stack([torch.from_numpy(tokens[s:s + T].astype(np.int64)) for s in starts])


def attention_map_data(grid, summaries):
    """{vanilla, resformer: [(layer, (T, T) attention, mean over heads)]} for the first,
    middle and last layer, on one held-out window, from each mode's first finished run."""
    maps = {}
    for (name, seed, point), cfg in grid:
        if (name in ("vanilla", "resformer") and name not in maps
                and (name, seed, point) in summaries):
            model = GPT.from_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"))
            # the middle of 3 spaced windows
            attention, _ = internals(model, heldout_windows(cfg, 3)[1:2])
            layers = sorted({0, len(attention) // 2, len(attention) - 1})
            maps[name] = [(i + 1, attention[i][0].mean(0).numpy()) for i in layers]
    return maps if len(maps) == 2 else {}


# ---- running the grid: each run is train.py in its own folder ----

def read_log(run_dir):
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def finished(cfg, run_dir):
    """The run's summary if it finished with exactly these settings, else None."""
    path = os.path.join(run_dir, "summary.json")
    if os.path.isfile(path):
        with open(path) as f:
            summary = json.load(f)
        if summary.get("config") == cfg:
            return summary
    return None


def command(cfg, run_dir):
    """The train.py command for one run: resume its checkpoint if it is this run's,
    else start afresh."""
    args = [sys.executable, TRAIN_PY] + [f"--{k}={v}" for k, v in cfg.items()
                                         if k not in ("resume", "overwrite")]
    ckpt_path = os.path.join(run_dir, "ckpt.pt")
    if os.path.isfile(ckpt_path):
        try:
            flags = ("resume", "overwrite")  # how a run was started, not what it is
            same = {k: v for k, v in load_checkpoint(ckpt_path)["config"].items()
                    if k not in flags} == \
                   {k: v for k, v in cfg.items() if k not in flags}
        except (ValueError, KeyError):
            same = False
        return args + (["--resume"] if same else ["--overwrite"]), same
    return args, False


def summarise(cfg, run_dir, samples, threads):
    """summary.json of a finished run: its log's numbers and the analysis of its final model."""
    log = read_log(run_dir)
    train_records = [r for r in log if r["kind"] == "train"]
    speeds = sorted(r["tokens_per_sec"] for r in train_records[1:]) or [float("nan")]
    model = GPT.from_checkpoint(os.path.join(run_dir, "ckpt.pt"))
    first_record = next(r for r in log if r["kind"] == "config")
    summary = {"config": cfg, "status": "done",
               "val_loss_full": [r for r in log if r["kind"] == "final"][-1]["val_loss_full"],
               "evals": [r for r in log if r["kind"] == "eval"], "num_params": model.num_params(),
               "tokens_per_step": first_record["tokens_per_step"],
               "tokens_per_sec": speeds[len(speeds) // 2],
               "threads": threads, "kv_cache_bytes_per_token": model.kv_cache_bytes(1, 1),
               **analyse(model, heldout_windows(cfg, samples))}
    with open(os.path.join(run_dir, "summary.json.tmp"), "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(os.path.join(run_dir, "summary.json.tmp"), os.path.join(run_dir, "summary.json"))
    return summary


def run_grid(grid, jobs, samples):
    """Train every (name, seed, point, cfg) not finished yet, `jobs` at a time;
    returns summaries by key."""
    summaries, todo = {}, []
    for key, cfg in grid:
        done = finished(cfg, cfg["out_dir"])
        if done:
            print(f"reusing {cfg['out_dir']} (same settings, finished)")
            summaries[key] = {**done, "reused": True}
        else:
            todo.append((key, cfg))
    threads = 1 if jobs > 1 else torch.get_num_threads()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    running, t_start, interrupted, failed = [], time.time(), False, []
    n_total = len(todo)
    while running or (todo and not interrupted):
        while todo and len(running) < jobs and not interrupted:
            key, cfg = todo.pop(0)
            os.makedirs(cfg["out_dir"], exist_ok=True)
            args, resuming = command(cfg, cfg["out_dir"])
            log = open(os.path.join(cfg["out_dir"], "train.out"), "a")
            print(f"[{n_total - len(todo)}/{n_total}] {cfg['out_dir']}: " +
                  ("resuming from its checkpoint" if resuming else "training"), flush=True)
            running.append((key, cfg, subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                       env=env), log))
        try:
            time.sleep(0.5)
        except KeyboardInterrupt:  # train.py got the Ctrl-C too: each saves at its next step
            interrupted = True
            print("\nCtrl-C: the running trainings save a checkpoint and stop; "
                  "run the same command again to continue", flush=True)
        for item in list(running):
            key, cfg, process, log = item
            if process.poll() is None:
                continue
            running.remove(item)
            log.close()
            if process.returncode == 0:
                summaries[key] = summarise(cfg, cfg["out_dir"], samples, threads)
                elapsed = (time.time() - t_start) / 60
                print(f"    done {cfg['out_dir']}: val loss {summaries[key]['val_loss_full']:.4f} "
                      f"({elapsed:.1f} min so far)", flush=True)
            elif process.returncode == 130:
                interrupted = True
            else:
                failed.append(cfg["out_dir"])
                tail = (open(os.path.join(cfg["out_dir"], "train.out")).read()
                        .strip().splitlines()[-3:])
                print(f"    FAILED {cfg['out_dir']} (exit {process.returncode}):\n      " +
                      "\n      ".join(tail))
    return summaries, interrupted, failed


def build_grid(cfg, modes, seeds, points, root):
    """[((name, seed, point), train settings)] with seed outermost, so complete seed sets
    finish early."""
    base = {k: cfg[k] for k in TRAIN_SETTINGS}
    base["resume"], base["overwrite"] = False, False
    grid = []
    for seed in seeds:
        for point_name, point in points:
            for name, overrides in modes:
                folder = re.sub(r"[^A-Za-z0-9_.=-]+", "-",
                                f"{point_name}{'_' if point_name else ''}{name}_seed{seed}")
                run = {**base, **point, **overrides, "seed": seed,
                       "out_dir": os.path.join(root, folder)}
                # spelled out, so a shorter variant keeps its own full schedule
                if run["lr_decay_iters"] == 0:
                    run["lr_decay_iters"] = run["max_iters"]
                grid.append(((name, seed, point_name), run))
    return grid


def add_less_data(modes, cfg):
    """The paper's data-efficiency test: ResFormer trained on less_data of the tokens,
    its own schedule."""
    if not cfg["less_data"] or not any(o["value_mode"] == "resformer" for _, o in modes):
        return modes
    if not 0 < cfg["less_data"] < 1:
        raise ConfigError(f"--less_data={cfg['less_data']}: a share between 0 and 1 (e.g. 0.85), "
                          "or 0 for off")
    steps = round(cfg["less_data"] * cfg["max_iters"])
    extra = [(f"resformer:max_iters={steps}",
              dict(value_mode="resformer", learnable_lambda=False, n_kv_head=0,
                   max_iters=steps, lr_decay_iters=steps))]
    return modes + [m for m in extra if m[0] not in dict(modes)]


# ---- results ----

def per_mode(summaries, names, seeds, point):
    """For each variant: per-seed final losses and curves, and its paired statistics
    against vanilla."""
    results = {}
    for name in names:
        runs = {s: summaries[name, s, point] for s in seeds if (name, s, point) in summaries}
        if not runs:
            continue
        finals = [r["val_loss_full"] for r in runs.values()]
        first = next(iter(runs.values()))
        r = {"seeds": list(runs), "val_loss": finals, "val_loss_mean": float(np.mean(finals)),
             "val_loss_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0,
             "num_params": first["num_params"],
             "kv_cache_bytes_per_token": first["kv_cache_bytes_per_token"],
             "tokens": [e["tokens"] for e in first["evals"]],
             "total_tokens": first["evals"][-1]["tokens"],
             "curves": [[e["val_loss"] for e in run["evals"]] for run in runs.values()],
             "tokens_per_sec": float(np.mean([run["tokens_per_sec"] for run in runs.values()]))}
        for key in ("attention_entropy", "similarity"):
            per_seed = np.array([run[key] for run in runs.values()])
            r[key], r[key + "_std"] = (per_seed.mean(axis=0).tolist(),
                                       (per_seed.std(axis=0, ddof=1) if len(runs) > 1
                                        else 0 * per_seed[0]).tolist())
        lambdas = [run["evals"][-1].get("lambdas") for run in runs.values()]
        if all(lambdas):
            # per layer (lambda_1, lambda_2)
            r["lambdas"] = np.mean(np.array(lambdas), axis=0).tolist()
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
    return results


def fmt_interval(stats):
    return ("-" if stats["interval"] is None
            else f"[{stats['interval'][0]:+.4f}, {stats['interval'][1]:+.4f}]")


def write_tables(root, results, sweep, info):
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump({"info": info, "modes": results, "sweep": sweep}, f, indent=1)
    reused = f" ({info['reused']} of {info['runs']} runs reused)" if info["reused"] else ""
    md = ["# Value residual comparison\n",
          f"`{info['command']}` — {info['hardware']}, {info['jobs']} run(s) side "
          f"by side, {info['wall_min']:.1f} min{reused}\n",
          f"Final val loss = the whole validation split, every token once. Seeds {info['seeds']}: "
          f"same seed = same initial weights' RNG and the same batches in every mode. "
          f"Paired difference = variant - vanilla per seed; "
          f"interval = 95% Student t (n-1 df).\n",
          "| variant | params | tokens | val loss (mean ± std) | paired diff per seed | mean diff "
          "| 95% interval | wins | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        p = r.get("paired")
        cells = (["-", "-", "-", "-", "-"] if not p else
                 [", ".join(f"{d:+.4f}" for d in p["differences"]), f"{p['mean']:+.4f}",
                  fmt_interval(p), f"{p['wins']} of {p['n']}", verdict(p)])
        md.append(f"| {name} | {r['num_params'] / 1e6:.3f}M | {r['total_tokens'] / 1e6:.2f}M | "
                  f"{r['val_loss_mean']:.4f} ± {r['val_loss_std']:.4f} | " +
                  " | ".join(cells) + " |")
    if "vanilla" in results:
        md.append("\nIn-run crossing (labelled as such: with a cosine schedule it is not the "
                  "data-efficiency measure above): tokens at which each variant's fixed-window "
                  "val curve first reaches vanilla's final fixed-window loss, per seed, as a share "
                  "of vanilla's tokens.\n")
        total = results["vanilla"]["total_tokens"]
        for name, r in results.items():
            if r.get("crossing_tokens"):
                shown = ", ".join("never" if c is None else f"{c / total:.0%}"
                                  for c in r["crossing_tokens"])
                md.append(f"- {name}: {shown}")
    md += ["\n| variant | KV cache B/token | train tokens/s (per run) |", "|---|---|---|"]
    md += [f"| {n} | {r['kv_cache_bytes_per_token']:,} | {r['tokens_per_sec']:,.0f} |"
           for n, r in results.items()]
    for key, title in (("attention_entropy",
                        "Attention entropy per layer (nats; higher = less concentrated)"),
                       ("similarity",
                        "Token similarity per layer (mean pairwise cosine; higher = smoother)")):
        md += [f"\n## {title}\n", "| layer | " + " | ".join(results) + " |",
               "|---" * (len(results) + 1) + "|"]
        for layer in range(max(len(r[key]) for r in results.values())):
            md.append(f"| {layer + 1} | " +
                      " | ".join(f"{r[key][layer]:.4f} ± {r[key + '_std'][layer]:.4f}"
                                 if layer < len(r[key]) else "-" for r in results.values()) +
                      " |")
    learned = {n: r["lambdas"] for n, r in results.items() if "lambdas" in r}
    for name, lambdas in learned.items():
        md += [f"\n## Learned lambdas of {name} (mean over seeds)\n",
               "| layer | lambda_1 (V_1) | lambda_2 (V_n) |",
               "|---|---|---|"] + [f"| {i + 2} | {a:.3f} | {b:.3f} |"
                                   for i, (a, b) in enumerate(lambdas)]
    if sweep:
        md += ["\n## Sweep: paired difference to vanilla at each point\n",
               "| point | variant | vanilla val loss | variant val loss | mean diff | 95% interval "
               "| wins |",
               "|---|---|---|---|---|---|---|"]
        for point, point_results in sweep.items():
            for name, r in point_results.items():
                if "paired" in r:
                    p = r["paired"]
                    md.append(f"| {point} | {name} | "
                              f"{point_results['vanilla']['val_loss_mean']:.4f} | "
                              f"{r['val_loss_mean']:.4f} | {p['mean']:+.4f} | {fmt_interval(p)} | "
                              f"{p['wins']} of {p['n']} |")
    with open(os.path.join(root, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def main(argv):
    if not any(not a.startswith("-") for a in argv) and os.path.isfile(DEFAULT_PRESET):
        argv = [DEFAULT_PRESET] + list(argv)  # no preset named: the comparison preset
    cfg = parse_args(SETTINGS, argv, USAGE)
    if cfg["plot"]:
        path = plots.plot_logs(parse_list(cfg["plot"]), cfg["plot_path"])
        print(f"wrote {path}" if path else "nothing written")
        return 0 if path else 1
    if cfg["resume"]:
        raise ConfigError("compare.py takes no --resume: run the same command again; "
                          "finished runs are reused and stopped ones resume from their checkpoints")
    modes, seeds = (add_less_data(parse_modes(cfg["modes"]), cfg),
                    parse_seeds(cfg["seeds"], cfg["seed"]))
    points = [(p.replace(":", "_"), parse_overrides(p, f"--sweep point {p!r}"))
              for p in parse_list(cfg["sweep"])]
    if cfg["analysis_samples"] < 1:
        raise ConfigError("--analysis_samples must be at least 1")
    device = (cfg["device"] if cfg["device"] != "auto"
              else "cuda" if torch.cuda.is_available() else "cpu")
    jobs = cfg["jobs"] or (1 if device.startswith("cuda") else os.cpu_count() or 1)
    root = cfg["out_dir"]
    os.makedirs(root, exist_ok=True)
    grid = build_grid(cfg, modes, seeds, points or [("", {})], root)
    if cfg["dataset"] == TRAIN_SETTINGS["dataset"][0]:
        shards.prepare_default(shards.dataset_dir(cfg["dataset"]))  # once, not once per run
    print(f"{len(grid)} runs ({len(modes)} variants x {len(seeds)} seeds "
          f"x {max(len(points), 1)} points), {jobs} at a time, in {root}", flush=True)
    t_start = time.time()
    summaries, interrupted, failed = run_grid(grid, jobs, cfg["analysis_samples"])
    if interrupted:
        print(f"interrupted: finished runs are kept in {root}, stopped ones have checkpoints; "
              f"run the same command again to continue")
        return 130
    names = [n for n, _ in modes]
    results = per_mode(summaries, names, seeds, points[0][0] if points else "")
    sweep = {p: per_mode(summaries, names, seeds, p) for p, _ in points} if points else {}
    reused = sum(1 for s in summaries.values() if s.get("reused"))
    given = sorted(given_keys(argv[1:] if argv and argv[0] == DEFAULT_PRESET else argv))
    info = {"command": "python compare.py" + "".join(" " + a for a in argv if a != DEFAULT_PRESET),
            "seeds": seeds, "hardware": hardware(device), "jobs": jobs,
            "wall_min": (time.time() - t_start) / 60,
            "runs": len(grid), "reused": reused, "given": given}
    write_tables(root, results, sweep, info)
    pictures = plots.write_all(root, results, sweep, attention_map_data(grid, summaries))
    print(open(os.path.join(root, "results.md")).read())
    print("wrote " + ", ".join([os.path.join(root, "results.md"),
                                os.path.join(root, "results.json")] + pictures))
    return 1 if failed else 0


def hardware(device):
    """'NVIDIA H200, torch ...' or the CPU's model name and core count, for the results header."""
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    name = platform.processor() or platform.machine()
    if os.path.isfile("/proc/cpuinfo"):
        found = re.search(r"model name\s*:\s*(.+)", open("/proc/cpuinfo").read())
        name = found.group(1).strip() if found else name
    return f"{name}, {os.cpu_count()} cores, torch {torch.__version__}"


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, FileNotFoundError) as e:  # user mistakes: one line, no traceback
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
