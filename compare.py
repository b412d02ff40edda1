"""
The paper's comparison, side by side: train vanilla, ResFormer and SVFormer on the same data
with the same seeds and schedule, then measure loss, KV cache, speed and attention concentration.

    python compare.py                                     # CPU quickstart, 3 seeds, 9 runs
    python compare.py --seeds=1 --max_iters=200           # a quicker look
    python compare.py --modes=vanilla,resformer,resformer_learnable,svformer_kv1
    python compare.py config/gpt2_124m.py --seeds=1337,42 # any preset / train setting, listed seeds

Modes are value modes with optional suffixes: `_learnable` (ResFormer with learnable lambdas) and
`_kvN` (grouped-query attention with N key/value heads), e.g. svformer_kv1.
`--seeds=N` means N seeds starting at --seed; `--seeds=1,2,3` lists them (`--seeds=7,` is seed 7 alone).

Writes to out_dir: results.md, results.json, loss.png, attention_entropy.png, similarity.png,
and one folder per run (<mode>_seed<k>/ with train.py's log.jsonl, ckpt.pt and summary.json).
A run whose summary.json matches its settings is reused, so an interrupted comparison continues.
"""
import json
import math
import os
import platform
import re
import sys
import time

import numpy as np
import torch

import prepare
import train
from configurator import load_config

# compare's own settings, on top of every train.py setting (out_dir becomes the comparison's root)
COMPARE = dict(modes="vanilla,resformer,svformer", seeds="3", analysis_samples=64)
DEFAULTS = dict(train.DEFAULTS, out_dir="out-compare", **COMPARE)
MODE_RE = re.compile(r"^(vanilla|resformer|svformer)(_learnable)?(?:_kv(\d+))?$")


def parse_modes(text):
    """'vanilla,svformer_kv1' -> [('vanilla', {overrides}), ('svformer_kv1', {...})]."""
    modes = []
    for name in [m.strip() for m in text.split(",") if m.strip()]:
        match = MODE_RE.match(name)
        if not match:
            raise ValueError(f"unknown mode {name!r}: use vanilla, resformer or svformer, "
                             f"optionally with _learnable (resformer) and/or _kvN, e.g. svformer_kv1")
        base, learnable, kv = match.groups()
        if learnable and base != "resformer":
            raise ValueError(f"mode {name!r}: _learnable applies to resformer only")
        modes.append((name, dict(value_mode=base, learnable_lambda=bool(learnable), n_kv_head=int(kv or 0))))
    if not modes:
        raise ValueError("--modes is empty")
    return modes


def parse_seeds(text, first_seed):
    """'3' -> three seeds from first_seed; '1,2,3' (or '(1, 2, 3)', as a preset file's tuple arrives) -> those."""
    parts = [p for p in re.split(r"[,\s()\[\]]+", str(text)) if p]
    if not parts or not all(p.lstrip("-").isdigit() for p in parts):
        raise ValueError(f"--seeds={text}: give a count (3) or a list (1,2,3)")
    if len(parts) == 1 and "," not in str(text):
        if int(parts[0]) < 1:
            raise ValueError(f"--seeds={text}: need at least one seed")
        return [first_seed + i for i in range(int(parts[0]))]
    return [int(p) for p in parts]


# ---- the two analysis measures (the paper's official definitions) ----

def attention_entropy(att):
    """att (B, n_head, T, T) -> mean over samples of the entropy (nats) of the attention each key receives.

    Heads are averaged to one [T, T] map, summed over queries (column sums: how much attention each
    key gets), normalised to a distribution over keys. Concentration on a few keys -> low entropy.
    """
    received = att.float().mean(dim=1).sum(dim=1)  # (B, T_keys)
    p = received / received.sum(dim=-1, keepdim=True)
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(dim=-1)  # 0 * log 0 counts as 0
    return entropy.mean().item()


def token_similarity(hidden):
    """hidden (B, T, C) -> mean cosine similarity over all pairs of distinct tokens, mean over samples.

    Near 1 means the tokens' representations have collapsed together (over-smoothing).
    """
    h = torch.nn.functional.normalize(hidden.float(), dim=-1)
    sims = h @ h.transpose(1, 2)  # (B, T, T)
    T = h.size(1)
    off_diagonal = (sims.sum(dim=(1, 2)) - sims.diagonal(dim1=1, dim2=2).sum(dim=-1)) / (T * (T - 1))
    return off_diagonal.mean().item()


@torch.no_grad()
def analyse(model, windows, batch=8):
    """Per-layer attention entropy and token similarity of a trained model on fixed held-out windows."""
    model.eval()
    device = next(model.parameters()).device
    n_layer = model.config.n_layer
    entropy, similarity = np.zeros(n_layer), np.zeros(n_layer)
    for i in range(0, len(windows), batch):
        x = windows[i:i + batch].to(device)
        _, _, internals = model(x, all_logits=True, return_internals=True)  # explicit softmax path
        for layer in range(n_layer):  # weight each chunk by its size: a mean over all samples
            entropy[layer] += attention_entropy(internals["attention"][layer]) * len(x)
            similarity[layer] += token_similarity(internals["hidden"][layer]) * len(x)
    return {"attention_entropy": (entropy / len(windows)).tolist(), "similarity": (similarity / len(windows)).tolist()}


def heldout_windows(cfg, n):
    """The same n windows of block_size tokens, evenly spaced over the val shard, for every mode."""
    data_dir = os.path.join(prepare.DATA_ROOT, cfg["dataset"])
    meta = prepare.load_meta(data_dir)
    tokens = prepare.read_shard(prepare.list_shards(data_dir, "val")[0], meta["vocab_size"])
    T = cfg["block_size"]
    if len(tokens) < T:
        raise ValueError(f"the val shard of {data_dir} has {len(tokens)} tokens, fewer than block_size {T}")
    starts = np.linspace(0, len(tokens) - T, num=n).astype(np.int64)
    return torch.stack([torch.from_numpy(tokens[s:s + T].astype(np.int64)) for s in starts])


# ---- running the grid ----

def run_one(cfg, run_dir, samples):
    """Train one mode/seed (or reuse a finished identical run) and analyse it; returns its summary."""
    summary_path = os.path.join(run_dir, "summary.json")
    if os.path.isfile(summary_path):
        with open(summary_path) as f:
            old = json.load(f)
        if old.get("config") == cfg and old.get("status") == "done":
            print(f"reusing {run_dir} (same settings, finished)")
            return {**old, "reused": True}
    for stale in ("log.jsonl", "ckpt.pt"):  # train appends to the log: start this run's files clean
        if os.path.exists(os.path.join(run_dir, stale)):
            os.remove(os.path.join(run_dir, stale))
    summary = train.train(cfg)
    model = summary.pop("model")  # the trained model, still on the training device
    if summary["status"] == "done":
        summary.update(analyse(model, heldout_windows(cfg, samples)))
    summary["config"] = cfg
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def aggregate(names, seeds, runs):
    """Per mode: means and spreads over the seeds that finished."""
    results = {}
    for name in names:
        done = [runs[name, s] for s in seeds if runs[name, s]["status"] == "done"]
        if not done:
            results[name] = {"status": [runs[name, s]["status"] for s in seeds]}
            continue
        finals = np.array([r["val_loss"] for r in done])
        curves = np.array([[e["val_loss"] for e in r["evals"]] for r in done])
        results[name] = {
            "seeds": [r["config"]["seed"] for r in done], "num_params": done[0]["num_params"],
            "val_loss": finals.tolist(), "val_loss_mean": finals.mean(),
            "val_loss_std": finals.std(ddof=1) if len(finals) > 1 else 0.0,  # sample std over seeds
            "val_loss_min": finals.min(), "val_loss_max": finals.max(),
            "tokens": [e["tokens"] for e in done[0]["evals"]],
            "val_loss_at_tokens_mean": curves.mean(axis=0).tolist(),
            "val_loss_at_tokens_min": curves.min(axis=0).tolist(), "val_loss_at_tokens_max": curves.max(axis=0).tolist(),
            "kv_cache_bytes_per_token": done[0]["kv_cache_bytes_per_token"],
            "tokens_per_sec": float(np.mean([r["tokens_per_sec"] for r in done])),
        }
        for key in ("attention_entropy", "similarity"):  # per layer: mean and sample std over seeds
            per_seed = np.array([r[key] for r in done])
            results[name][key] = per_seed.mean(axis=0).tolist()
            results[name][key + "_std"] = (per_seed.std(axis=0, ddof=1) if len(done) > 1 else 0 * per_seed[0]).tolist()
        results[name] = {k: float(v) if isinstance(v, np.floating) else v for k, v in results[name].items()}
    return results


def verdicts(results):
    """One computed sentence per mode vs vanilla: is the difference bigger than the seed spread?"""
    if "vanilla" not in results or "val_loss_mean" not in results["vanilla"]:
        return []
    base, lines = results["vanilla"], []
    for name, r in results.items():
        if name == "vanilla" or "val_loss_mean" not in r:
            continue
        diff = r["val_loss_mean"] - base["val_loss_mean"]
        spread = max(r["val_loss_std"], base["val_loss_std"])  # the larger of the two modes' seed std
        if len(r["val_loss"]) < 2 or len(base["val_loss"]) < 2:
            verdict = "one seed only: no spread to compare against"
        elif abs(diff) > spread:
            verdict = f"{'below' if diff < 0 else 'above'} vanilla by more than the seed spread"
        else:
            verdict = "within the seed spread: not distinguishable from vanilla here"
        # same seed = same init and data order, so per-seed differences are paired
        paired = [a - b for s, a in zip(r["seeds"], r["val_loss"]) for t, b in zip(base["seeds"], base["val_loss"]) if s == t]
        lines.append(f"- **{name}** vs vanilla: {diff:+.4f} (spread = max seed std of the two = {spread:.4f}): {verdict}; "
                     f"per seed: {', '.join(f'{d:+.4f}' for d in paired)}.")
    return lines


def write_tables(out_dir, results, info):
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"info": info, "modes": results}, f, indent=1)
    ok = {n: r for n, r in results.items() if "val_loss_mean" in r}
    reused = f" ({info['reused']} of {info['runs']} runs reused from an earlier invocation)" if info["reused"] else ""
    md = [f"# Value residual comparison\n", f"`{info['command']}` — {info['hardware']}, {info['wall_min']:.1f} min{reused}\n",
          "| mode | params | final val loss (mean ± std) | min–max | KV cache B/token | train tokens/s |",
          "|---|---|---|---|---|---|"]
    for name, r in ok.items():
        md.append(f"| {name} | {r['num_params'] / 1e6:.3f}M | {r['val_loss_mean']:.4f} ± {r['val_loss_std']:.4f} | "
                  f"{r['val_loss_min']:.4f}–{r['val_loss_max']:.4f} | {r['kv_cache_bytes_per_token']:,} | {r['tokens_per_sec']:,.0f} |")
    md += [f"\n{len(info['seeds'])} seed(s) per mode: {info['seeds']}; std is the sample std over seeds. "
           "Same seed = same init and data order across modes.\n"] + verdicts(results)
    failed = [f"- {n}: {r['status']}" for n, r in results.items() if "val_loss_mean" not in r]
    md += ["\nRuns that did not finish:"] + failed if failed else []
    if ok:
        first = next(iter(ok.values()))
        md += ["\n## Val loss at equal tokens (mean over seeds)\n", "| tokens | " + " | ".join(ok) + " |",
               "|---" * (len(ok) + 1) + "|"]
        for i, tokens in enumerate(first["tokens"]):
            md.append(f"| {tokens:,} | " + " | ".join(f"{r['val_loss_at_tokens_mean'][i]:.4f}" for r in ok.values()) + " |")
        T = info["block_size"]  # reference points for reading the entropy numbers
        causal_uniform = attention_entropy((torch.ones(T, T).tril() / torch.arange(1, T + 1).unsqueeze(1))[None, None])
        md += [f"\nEntropy reference at T={T}: every query uniform over its causal prefix = {causal_uniform:.4f}, "
               f"log T = {math.log(T):.4f} (the maximum), all attention on one key = 0."]
        for key, title in (("attention_entropy", "Attention entropy per layer (nats, mean ± std over seeds; higher = less concentrated)"),
                           ("similarity", "Mean pairwise cosine similarity of token hidden states per layer (mean ± std; higher = smoother)")):
            md += [f"\n## {title}\n", "| layer | " + " | ".join(ok) + " |", "|---" * (len(ok) + 1) + "|"]
            for layer in range(len(first[key])):
                md.append(f"| {layer + 1} | " + " | ".join(f"{r[key][layer]:.4f} ± {r[key + '_std'][layer]:.4f}" for r in ok.values()) + " |")
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def write_plots(out_dir, results):
    """loss.png, attention_entropy.png, similarity.png; skipped with one line when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("pictures skipped: matplotlib is not installed (pip install matplotlib); tables are written")
        return []
    ok = {n: r for n, r in results.items() if "val_loss_mean" in r}
    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in ok.items():
        t = np.array(r["tokens"])
        keep = t > 0  # step 0 (loss ~ log vocab) would flatten everything else
        line, = ax.plot(t[keep], np.array(r["val_loss_at_tokens_mean"])[keep], marker="o", ms=3, label=name)
        ax.fill_between(t[keep], np.array(r["val_loss_at_tokens_min"])[keep], np.array(r["val_loss_at_tokens_max"])[keep],
                        color=line.get_color(), alpha=0.2)
    ax.set(xlabel="training tokens", ylabel="val loss", title="Val loss (mean over seeds, band = min–max)")
    written.append(save(fig, ax, os.path.join(out_dir, "loss.png")))
    for key, ylabel, title in (("attention_entropy", "entropy of attention received (nats)", "Attention concentration"),
                               ("similarity", "mean pairwise cosine similarity", "Token similarity (over-smoothing)")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in ok.items():
            layers, mean, std = np.arange(1, len(r[key]) + 1), np.array(r[key]), np.array(r[key + "_std"])
            line, = ax.plot(layers, mean, marker="o", ms=3, label=name)
            ax.fill_between(layers, mean - std, mean + std, color=line.get_color(), alpha=0.15)
        ax.set(xlabel="layer", ylabel=ylabel, title=title + " (band = ±1 std over seeds)")
        written.append(save(fig, ax, os.path.join(out_dir, f"{key}.png")))
    return written


def save(fig, ax, path):
    import matplotlib.pyplot as plt
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def hardware(device):
    """'cuda: NVIDIA H200' or the CPU's model name and core count, for the results header."""
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    name = platform.processor() or platform.machine()
    if os.path.isfile("/proc/cpuinfo"):
        found = re.search(r"model name\s*:\s*(.+)", open("/proc/cpuinfo").read())
        name = found.group(1).strip() if found else name
    return f"{device}: {name}, {os.cpu_count()} cores visible, torch {torch.__version__}"


def main(argv):
    cfg = load_config(DEFAULTS, argv)
    modes, seeds = parse_modes(cfg["modes"]), parse_seeds(cfg["seeds"], cfg["seed"])
    if cfg["analysis_samples"] < 1:
        raise ValueError("--analysis_samples must be at least 1")
    if cfg["resume"]:  # each run starts fresh; continuing a comparison is reusing its finished runs
        raise ValueError("compare.py takes no --resume: run the same command again and finished runs are reused")
    root = cfg["out_dir"]
    os.makedirs(root, exist_ok=True)
    base = {k: cfg[k] for k in train.DEFAULTS}  # train gets only its own settings
    device = train.pick_device_and_dtype(base)[0]
    grid = [(seed, name, overrides) for seed in seeds for name, overrides in modes]  # seed outer: complete sets early
    runs, t_start, durations, reused = {}, time.time(), [], 0
    for i, (seed, name, overrides) in enumerate(grid):
        eta = f"ETA {np.mean(durations) * (len(grid) - i) / 60:.0f} min" if durations else "ETA after the first run"
        print(f"\n[run {i + 1}/{len(grid)}] {name} seed {seed} — {eta}", flush=True)
        run_dir = os.path.join(root, f"{name}_seed{seed}")
        t0 = time.time()
        runs[name, seed] = run_one({**base, **overrides, "seed": seed, "out_dir": run_dir}, run_dir, cfg["analysis_samples"])
        durations.append(time.time() - t0)
        reused += runs[name, seed].pop("reused", False)
        if runs[name, seed]["status"] == "interrupted":
            print(f"interrupted: finished runs are kept in {root}; run the same command again to continue")
            return 130
    results = aggregate([n for n, _ in modes], seeds, runs)
    info = {"command": "python compare.py" + "".join(" " + a for a in argv), "seeds": seeds, "block_size": cfg["block_size"],
            "hardware": hardware(device),
            "wall_min": (time.time() - t_start) / 60, "runs": len(grid), "reused": reused}
    write_tables(root, results, info)
    pictures = write_plots(root, results)
    print(open(os.path.join(root, "results.md")).read())
    print("wrote " + ", ".join(os.path.join(root, f) for f in ["results.md", "results.json"]) +
          "".join(", " + p for p in pictures))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, FileNotFoundError) as e:  # user mistakes: one line, no traceback
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # Ctrl-C outside training (analysis): finished runs stay reusable
        sys.exit(130)
