"""
Pictures for compare.py (matplotlib, optional): loss curves with the difference to vanilla,
attention entropy and token similarity per layer, learned lambdas, a sweep, loss against model
size, attention maps; and plot_logs() for any runs' log.jsonl (python compare.py --plot=out,out2).
"""
import json
import os
import textwrap

import numpy as np

from model import VALUE_MODES

from .runs import read_log

from .analysis import bracketed, mixing_by_layer, size_sweep, vanilla_curve


def label(name, note=None):
    """A variant as a class reads it: 'resformer:lambda_1=2:lambda_2=1' -> 'ResFormer, λ = 2',
    'svformer_kv1' -> 'SVFormer, 1 KV head' (the tables keep the exact name); a note (such as
    '85% of the tokens') replaces the settings."""
    base, *settings = name.split(":")
    settings = [] if note else settings
    mode = max((m for m in VALUE_MODES if base.startswith(m)), key=len, default=None)
    if mode is None:
        return name
    words, rest = [VALUE_MODES[mode]], base[len(mode):]
    if "_learnable" in rest:
        words.append("learned λ")
    if "_kv" in rest:
        n = rest.rpartition("_kv")[2]
        words.append(f"{n} KV head{'' if n == '1' else 's'}")
    given = dict(s.partition("=")[::2] for s in settings)
    if given.get("lambda_2") == "1" and "lambda_1" in given:  # the paper's U = A (V_n + λ V_1)
        words.append(f"λ = {given.pop('lambda_1')}")
        given.pop("lambda_2")
    words += [f"{k} = {v}" for k, v in given.items()] + ([note] if note else [])
    return ", ".join(words)


def pyplot(quiet=False):
    """matplotlib.pyplot for files (no display), or None with one line saying how to get it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        if not quiet:
            print("pictures skipped: matplotlib is not installed (pip install matplotlib); "
                  "tables are written")
        return None


def save(plt, fig, path):
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:  # unless placed
            ax.legend(fontsize=8, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def token_units(x, _=None):
    """Axis labels for token counts: 0, 800k, 1.6M, 2B (not matplotlib's '1e6' offset)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}"


def tokens_axis(ax):
    from matplotlib.ticker import FuncFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(token_units))
    ax.set_xlabel("training tokens")


def layer_axis(plt, ax, n_layer):
    ax.set_xlabel("layer")
    ax.set_xticks(range(1, n_layer + 1))


def write_all(root, results, sweep, maps, search=None, escape_loss=0.0):
    """Every picture compare.py makes; returns the paths written."""
    plt = pyplot()
    if plt is None:
        return []
    written = [loss_figure(plt, root, results, escape_loss)]
    written += [lr_figure(plt, root, search)] if search else []
    # each band stays inside what the measure can be: entropy >= 0, a cosine in [-1, 1]
    for key, ylabel, note, (low, high) in (
            ("attention_entropy",
             "how widely attention is spread\n(entropy of attention received, nats)",
             "higher = attention spread over more tokens", (0, np.inf)),
            ("similarity", "how alike the tokens' hidden states are\n(mean pairwise cosine)",
             "higher = tokens more alike, over-smoothed", (-1, 1))):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in results.items():
            layers, mean, std = (np.arange(1, len(r[key]) + 1), np.array(r[key]),
                                 np.array(r[key + "_std"]))
            line, = ax.plot(layers, mean, marker="o", ms=3, label=label(name, r.get("note")))
            ax.fill_between(layers, np.clip(mean - std, low, high), np.clip(mean + std, low, high),
                            color=line.get_color(), alpha=0.15)
        layer_axis(plt, ax, max(len(r[key]) for r in results.values()))
        title = f"{key.replace('_', ' ').capitalize()} per layer: {note} (band: ±1 std, seeds)"
        ax.set(ylabel=ylabel, title="\n".join(textwrap.wrap(title, 70)))
        ax.title.set_fontsize(9)
        written.append(save(plt, fig, os.path.join(root, f"{key}.png")))
    learned = {n: mixing_by_layer(r["mixing"]) for n, r in results.items() if r.get("mixing")}
    if learned:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, kinds in learned.items():
            for kind, by_layer in kinds.items():
                layers = sorted(by_layer)
                values = np.array([by_layer[layer] for layer in layers])
                for i in range(values.shape[1]):
                    part = f"[{i}]" if values.shape[1] > 1 else ""
                    ax.plot(layers, values[:, i], marker="os^v"[i % 4],
                            label=f"{label(name)}: {kind}{part}")
        ax.axhline(0.5, color="gray", ls="--", lw=1, label="the start: 0.5")
        layer_axis(plt, ax, max(max(b) for k in learned.values() for b in k.values()))
        ax.set(ylabel="learned value", title="Learned mixing weights by layer (mean over seeds)")
        ax.legend(fontsize=7)
        written.append(save(plt, fig, os.path.join(root, "mixing.png")))
    paired = any("paired" in r for p in sweep.values() for r in p.values())
    if paired and not search:  # under --tune the one "point" is the paper's protocol: a table
        written.append(sweep_figure(plt, root, sweep))
    if size_sweep(sweep):
        written.append(size_figure(plt, root, sweep))
    if vanilla_curve(results):
        written.append(curve_figure(plt, root, results))
    if maps:
        written.append(attention_maps(plt, root, maps))
    return written


def loss_figure(plt, root, results, escape_loss=0.0, path=None):
    """Val loss against steps (mean over seeds, min-max band; a triangle where the variant left
    the early plateau, on average), and with vanilla a second panel: the paired difference to
    vanilla at each evaluation, so close curves stay readable. Axes start where the curves
    compare: the first evaluations (loss 4-7, before the plateau) would squash the rest."""
    base = results.get("vanilla")
    if base is None:
        fig, top = plt.subplots(figsize=(7, 4.2))
        bottom = None
    else:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.8), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 2]})
    shown, gaps, escape_marked = [], [], False
    for name, r in results.items():
        steps, curves = np.array(r["steps"]), np.array(r["curves"])
        keep = steps > 0  # step 0 (loss ~ log vocab) would flatten everything else
        left = [e[0] for e in r.get("escape", []) if e]
        stalled = escape_loss and len(left) < len(r.get("escape", []))  # say so in the legend
        stalled = (f" (left the plateau on {len(left)} of {len(r['escape'])} seeds)"
                   if stalled else "")
        line, = top.plot(steps[keep], curves.mean(0)[keep], marker="o", ms=2,
                         label=label(name, r.get("note")) + stalled)
        top.fill_between(steps[keep], curves.min(0)[keep], curves.max(0)[keep],
                         color=line.get_color(), alpha=0.2)
        past = slice(2 if keep.sum() > 4 else 0, None)  # the y-range holds the band, all seeds
        shown += [curves.min(0)[keep][past], curves.max(0)[keep][past]]
        if escape_loss and left:  # one legend entry explains every triangle
            top.plot([np.mean(left)], [escape_loss], marker="v", ms=9, color=line.get_color(),
                     ls="none", label=None if escape_marked else
                     "leaves the plateau (mean step of the seeds that left)")
            escape_marked = True
        if base is not None and name != "vanilla":
            n = min(len(steps), len(base["steps"]))  # a shorter variant: its own steps
            paired = [np.array(r["curves"][i][:n])
                      - np.array(base["curves"][base["seeds"].index(s)][:n])
                      for i, s in enumerate(r["seeds"])
                      if s in base["seeds"] and list(r["steps"][:n]) == list(base["steps"][:n])]
            if paired:
                gap = np.array(paired).mean(0)[keep[:n]]
                bottom.plot(steps[:n][keep[:n]], gap, marker="o", ms=2, color=line.get_color(),
                            label=label(name, r.get("note")))
                gaps.append(gap)
    values = np.concatenate(shown)
    low, high = values.min(), values.max()
    if escape_loss and low <= escape_loss <= high:
        top.axhline(escape_loss, color="gray", ls=":", lw=1)
    if high > low:
        top.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
    top.legend(fontsize=8, framealpha=0.9, loc="best")
    top.set(ylabel="val loss (nats per token)",
            title="Val loss (fixed windows; mean over seeds, band = min-max; lower is better)")
    per_step = next(iter(results.values())).get("tokens_per_step")
    (bottom or top).set_xlabel(f"step ({per_step:,} tokens each)" if per_step else "step")
    if bottom is not None:
        bottom.axhline(0, color="black", lw=0.8)
        if gaps:  # each curve's 2nd to 98th percentile (its nearest points, not interpolated
            # toward an outlier): one early outlier per variant must not flatten the rest
            low = min(0, *(np.percentile(g, 2, method="nearest") for g in gaps))
            high = max(0, *(np.percentile(g, 98, method="nearest") for g in gaps))
            if high > low:
                bottom.set_ylim(low - 0.1 * (high - low), high + 0.1 * (high - low))
        bottom.set(ylabel="minus vanilla (same seed)",
                   title="Difference to vanilla, mean of per-seed differences (below 0 = better)")
    for ax in fig.axes:
        ax.title.set_fontsize(9)
    return save(plt, fig, path or os.path.join(root, "loss.png"))


def live_loss(root, grid, escape_loss=0.0):
    """loss.png redrawn from the logs of the runs so far (compare.py calls it every 30 s while
    they train): each variant over the seeds that have started, up to the step all of them
    reached. Written to a temporary file and renamed, so a viewer never sees half a picture."""
    plt = pyplot(quiet=True)
    results = {}
    for (name, seed, point), cfg in grid:
        if point != grid[0][0][2]:  # a sweep: its first point, as the final picture
            continue
        evals = [r for r in read_log(cfg["out_dir"]) if r["kind"] == "eval"]
        if len(evals) >= 2:
            r = results.setdefault(name, {"seeds": [], "curves": [], "steps": None})
            r["seeds"].append(seed)
            r["curves"].append([e["val_loss"] for e in evals])
            r["steps"] = [e["iter"] for e in evals] if r["steps"] is None or len(evals) > len(
                r["steps"]) else r["steps"]
    if plt is None or not results:
        return None
    for r in results.values():
        n = min(map(len, r["curves"]))
        r["curves"], r["steps"] = [c[:n] for c in r["curves"]], r["steps"][:n]
    tmp = os.path.join(root, "loss.live.png")
    loss_figure(plt, root, results, escape_loss, path=tmp)
    os.replace(tmp, os.path.join(root, "loss.png"))
    return os.path.join(root, "loss.png")


def lr_figure(plt, root, search):
    """Final val loss against peak learning rate per variant (compare.py --tune): each search
    seed a dot, the mean a line, the best lr a ring. A diverged run is drawn at the top edge."""
    fig, ax = plt.subplots(figsize=(6, 4))
    finite = [x for by_lr in search.values() for v in by_lr.values() for x in v if np.isfinite(x)]
    ceiling = max(finite) + 0.05 * (max(finite) - min(finite) + 1e-3)
    for k, (name, by_lr) in enumerate(search.items()):
        lrs = sorted(by_lr)
        means = [np.mean(by_lr[lr]) for lr in lrs]
        for lr in lrs:
            ax.scatter([lr] * len(by_lr[lr]), np.minimum(by_lr[lr], ceiling), s=12,
                       color=f"C{k}", alpha=0.5)
        ax.plot(lrs, np.minimum(means, ceiling), color=f"C{k}",
                label=f"{label(name)} (dots: seeds)")
        best = lrs[int(np.argmin(means))]
        edge = not bracketed(dict(zip(lrs, means)))  # the lowest point at the grid's edge
        ax.scatter([best], [min(means)], s=120, facecolors="none", edgecolors=f"C{k}", lw=2,
                   ls="--" if edge else "-", label=f"{label(name)}: " + (
                       f"lowest at the grid's edge, {best:g} (not bracketed)" if edge
                       else f"best {best:g}"))
    ax.set_xscale("log")
    ax.set(xlabel="peak learning rate (log scale)", ylabel="final val loss (whole split)",
           title="Learning-rate search: each variant's U-curve")
    return save(plt, fig, os.path.join(root, "lr_search.png"))


def point_label(point):
    """'learning_rate=2e-3_min_lr=2e-4' -> one setting per line (a piece without '=' is part of
    the next key: the folder name joined settings with '_')."""
    lines, key = [], []
    for piece in point.split("_"):
        key.append(piece)
        if "=" in piece:
            lines.append("_".join(key))
            key = []
    return "\n".join(lines + (["_".join(key)] if key else []))


def sweep_figure(plt, root, sweep):
    """Paired difference to vanilla at each sweep point: each seed as a dot, the mean as a line,
    and the 95% interval where there are 3 seeds or more (with 2 it spans t = 12.7 errors)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    points = list(sweep)
    names = sorted({n for p in sweep.values() for n, r in p.items() if "paired" in r})
    for k, name in enumerate(names):
        xs, means, errs = [], [], []
        for i, point in enumerate(points):
            r = sweep[point].get(name)
            if r and "paired" in r:
                p = r["paired"]
                x = i + 0.08 * k
                xs.append(x)
                means.append(p["mean"])
                errs.append(p["interval"][1] - p["mean"] if p["n"] >= 3 else 0)
                ax.scatter([x] * p["n"], p["differences"], s=12, color=f"C{k}", alpha=0.5)
        ax.errorbar(xs, means, yerr=errs, marker="o", capsize=3, color=f"C{k}",
                    label=f"{name} (dots: seeds; line: mean)")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([point_label(p) for p in points], fontsize=8)
    ax.set(ylabel="val loss minus vanilla (below 0 = better)",
           title="Gain over vanilla across the sweep")
    return save(plt, fig, os.path.join(root, "sweep.png"))


def size_figure(plt, root, sweep):
    """Final loss against parameter count: each seed as a dot, the fitted line per variant
    (analysis.param_saving), the saving at the middle size in the legend."""
    fits = size_sweep(sweep)
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, name in enumerate(["vanilla"] + list(fits)):
        points = [p[name] for p in sweep.values() if name in p]
        params = np.array([r["num_params"] for r in points], dtype=float)
        for n, r in zip(params, points):
            ax.scatter([n] * len(r["val_loss"]), r["val_loss"], s=10, color=f"C{k}", alpha=0.4)
        f = fits.get(name)
        # the lines analysis.param_saving fitted (vanilla's is the same against every variant)
        a, b = f["line_variant"] if f else next(iter(fits.values()))["line_vanilla"]
        if f is None:
            label = name
        elif f["saving"] is None:
            label = f"{name}: no saving read off (a loss does not fall with size)"
        elif f["interval"] is None:
            label = (f"{name}: {100 * f['saving']:.1f}% fewer parameters, not pinned down "
                     f"(both fall in {100 * f['falling']:.0f}% of resamples)")
        else:
            lo, hi = f["interval"]
            label = (f"{name}: {100 * f['saving']:.1f}% fewer parameters "
                     f"[{100 * lo:.1f}, {100 * hi:.1f}]")
        ax.plot(params, a + b * np.log(params), color=f"C{k}", label=label)
    ax.set_xscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + 0.3 * (high - low))  # room for the legend above the dots
    ax.set(xlabel="parameters", ylabel="final val loss",
           title="Loss against model size (lines: loss = a + b ln params)")
    return save(plt, fig, os.path.join(root, "params.png"))


def curve_figure(plt, root, results):
    """The paper's measure as a picture: vanilla's final loss at each size (dots: seeds), the
    line through them, and each variant at its own parameters with an arrow along the line to
    the vanilla size that matches it."""
    curve = vanilla_curve(results)
    (a, b), sizes = curve["line"], curve["sizes"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in sizes:
        r = results[n]
        ax.scatter([r["num_params"]] * len(r["val_loss"]), r["val_loss"], s=10, color="gray",
                   alpha=0.5)
    span = np.geomspace(min(sizes.values()) / 1.15, max(sizes.values()) * 1.15, 50)
    ax.plot(span, a + b * np.log(span), color="black", lw=1.2,
            label=f"vanilla, {len(sizes)} sizes (dots: seeds)")
    for k, (name, p) in enumerate(curve["placed"].items()):
        loss = results[name]["val_loss_mean"]
        text = label(name, results[name].get("note")) + ("" if p["larger"] is None else
                              f": as good as a vanilla model {abs(100 * p['larger']):.0f}% "
                              f"{'larger' if p['larger'] >= 0 else 'smaller'}")
        ax.scatter([p["num_params"]], [loss], s=40, color=f"C{k}", zorder=3, label=text)
        if p["matched_params"]:
            ax.annotate("", (p["matched_params"], loss), (p["num_params"], loss),
                        arrowprops=dict(arrowstyle="->", color=f"C{k}", lw=1))
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(token_units)
    ax.xaxis.set_minor_formatter(lambda x, _: token_units(x) if str(x)[0] in "2468" else "")
    ax.set(xlabel="parameters (total)", ylabel="final val loss (whole split)",
           title="Each variant on vanilla's loss-against-size line")
    ax.legend(fontsize=8, loc="upper right")
    return save(plt, fig, os.path.join(root, "size_curve.png"))


def attention_maps(plt, root, maps):
    """maps: {name: [(layer number, (T, T) attention averaged over heads)]} -> rows of heatmaps,
    one colour scale for all."""
    n_cols = max(len(m) for m in maps.values())
    fig, axes = plt.subplots(len(maps), n_cols, figsize=(3 * n_cols + 1, 3 * len(maps) + 0.6),
                             squeeze=False, layout="constrained")
    for row, (name, layers) in enumerate(maps.items()):
        for col in range(n_cols):
            ax = axes[row][col]
            if col >= len(layers):  # a shallower variant: fewer maps than the row above
                ax.axis("off")
                continue
            layer, att = layers[col]
            # sqrt: small weights stay visible
            image = ax.imshow(np.sqrt(att), cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"{label(name)}\nlayer {layer}", fontsize=8)
            ax.set_xlabel("key position", fontsize=8)
            ax.set_ylabel("query position", fontsize=8)
    # the scale in attention weights, not their square roots
    bar = fig.colorbar(image, ax=axes, shrink=0.8, ticks=np.sqrt([0, 0.01, 0.1, 0.3, 0.6, 1]))
    bar.ax.set_yticklabels(["0", "0.01", "0.1", "0.3", "0.6", "1"], fontsize=8)
    bar.set_label("attention weight (sqrt scale)", fontsize=8)
    # wrapped to the figure's width (8-point text: about 16 characters an inch)
    title = ("Attention on one held-out window (mean over heads): a bright column is a key that "
             "draws attention from every query (concentration)")
    fig.suptitle("\n".join(textwrap.wrap(title, int(14 * fig.get_figwidth()))), fontsize=8)
    path = os.path.join(root, "attention_maps.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_logs(run_dirs, path):
    """Training and val loss of any runs' log.jsonl against tokens, in one picture."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for run_dir in run_dirs:
        log_path = os.path.join(run_dir, "log.jsonl")
        if not os.path.isfile(log_path):
            raise FileNotFoundError(f"no {log_path}: give run folders written by train.py "
                                    "(e.g. --plot=out)")
        with open(log_path) as f:
            log = [json.loads(line) for line in f if line.strip()]
        per_step = next((r["tokens_per_step"] for r in log if r["kind"] == "config"), 1)
        train = [(r["iter"] * per_step, r["loss"]) for r in log if r["kind"] == "train"]
        val = [(r["tokens"], r["val_loss"]) for r in log if r["kind"] == "eval" and r["iter"] > 0]
        color = None
        if train:  # markers where there are few points: one record alone is still drawn
            line, = ax.plot(*zip(*train), alpha=0.4, lw=1, marker="o" if len(train) < 20 else None,
                            ms=3, label=f"{run_dir} train")
            color = line.get_color()
        if val:
            ax.plot(*zip(*val), marker="o", ms=3, color=color, label=f"{run_dir} val")
    ax.set(ylabel="loss", title="Training runs")
    tokens_axis(ax)
    return save(plt, fig, path)
