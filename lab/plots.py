"""Pictures for compare.py (matplotlib, optional): loss curves with the difference to vanilla,
attention entropy and token similarity per layer, learned lambdas, loss against model size."""
import os
import textwrap

import numpy as np

from data import plural
from model import VALUE_MODES

from .runs import read_log
from .tables import mixing_by_layer

from .analysis import FLOOR, bracketed, escape, vanilla_curve

# How the pictures name each value mode (the tables keep the exact names); another mode: its name.
MODE_NAMES = {"vanilla": "vanilla", "resformer": "ResFormer", "svformer": "SVFormer",
              "value_embed": "value embeddings"}
# what the difference panels draw as a grey band around 0 (analysis.FLOOR's runs)
FLOOR_LABEL = ("rounding alone, around 0 (vanilla nudged one float32 step): another CPU, "
               "not another seed")
# sizes that stay readable on a projector: text >= 11 points, curves >= 2 points wide
TEXT, SMALL, LINE = 13, 11, 2.0


def label(name, note=None):
    """A variant as a class reads it: 'resformer:lambda_1=2:lambda_2=1' -> 'ResFormer, λ = 2',
    'svformer_kv1' -> 'SVFormer, 1 KV head'; a note ('85% of the tokens') replaces the settings."""
    base, *settings = name.split(":")
    settings = [] if note else settings
    mode = max((m for m in VALUE_MODES if base.startswith(m)), key=len, default=None)
    if mode is None:
        return name
    words, rest = [MODE_NAMES.get(mode, mode)], base[len(mode):]
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
    """Grid, readable text sizes, each axes' legend right of it (a legend never covers a line),
    its entries wrapped to 34 characters, the figure widened by the widest legend."""
    widest = 0.0
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=SMALL)
        for text in (ax.xaxis.label, ax.yaxis.label):
            text.set_fontsize(max(text.get_fontsize(), SMALL))
        ax.title.set_fontsize(max(ax.title.get_fontsize(), TEXT))
    for ax in fig.axes:
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            legend = ax.legend(handles, [textwrap.fill(text, 34) for text in labels],
                               loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0,
                               fontsize=SMALL, frameon=False, labelspacing=0.6)
            widest = max(widest, legend.get_window_extent(fig.canvas.get_renderer()).width)
    if widest:
        fig.set_figwidth(fig.get_figwidth() + widest / fig.dpi + 0.2)
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


def write_all(root, results, search=None, escape_loss=0.0, unit="token"):
    """Every picture compare.py makes; returns the paths written. unit: the loss is nats per
    "byte" or per "token". The noise floor's runs are the difference panels' grey band."""
    plt = pyplot(quiet=True)  # (compare said so at its start)
    if plt is None:
        return []
    written = [loss_figure(plt, root, results, escape_loss, unit=unit)]
    written += [lr_figure(plt, root, search, unit)] if search else []
    variants = {n: r for n, r in results.items() if n != FLOOR}
    # each band stays inside what the measure can be: entropy >= 0, a cosine in [-1, 1]
    for key, ylabel, note, (low, high) in (
            ("attention_entropy",
             "how widely attention is spread\n(entropy of attention received, nats)",
             "higher = attention spread over more tokens", (0, np.inf)),
            ("similarity", "how alike the tokens' hidden states are\n(mean pairwise cosine)",
             "higher = tokens more alike, over-smoothed", (-1, 1))):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in variants.items():
            mean, std = np.array(r[key]), np.array(r[key + "_std"])
            layers = np.arange(1, len(mean) + 1)
            line, = ax.plot(layers, mean, marker="o", ms=4, lw=LINE,
                            label=label(name, r.get("note")))
            ax.fill_between(layers, np.clip(mean - std, low, high), np.clip(mean + std, low, high),
                            color=line.get_color(), alpha=0.15)
        ax.set(xlabel="layer", xticks=range(1, max(len(r[key]) for r in variants.values()) + 1))
        title = f"{key.replace('_', ' ').capitalize()} per layer: {note} (band: ±1 std, seeds)"
        ax.set(ylabel=ylabel, title="\n".join(textwrap.wrap(title, 56)))
        written.append(save(plt, fig, os.path.join(root, f"{key}.png")))
    learned = {n: mixing_by_layer(r["mixing"]) for n, r in variants.items() if r.get("mixing")}
    if learned:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, kinds in learned.items():
            for kind, by_layer in kinds.items():
                layers = sorted(by_layer)
                values = np.array([by_layer[layer] for layer in layers])
                width = values.shape[1]
                parts = (["λ1", "λ2"] if kind == "value_lambdas" else [kind] if width == 1
                         else [f"{kind}[{i}]" for i in range(width)])
                for i, part in enumerate(parts):
                    ax.plot(layers, values[:, i], marker="os^v"[i % 4], lw=LINE,
                            label=f"{label(name)}: {part}")
        ax.axhline(0.5, color="gray", ls="--", lw=1.5, label="the start: 0.5")
        n_layer = max(max(b) for k in learned.values() for b in k.values())
        ax.set(xlabel="layer", xticks=range(1, n_layer + 1))
        ax.set(ylabel="learned value", title="Learned mixing weights by layer (mean over seeds)")
        written.append(save(plt, fig, os.path.join(root, "mixing.png")))
    if vanilla_curve(results):
        written.append(curve_figure(plt, root, results, unit))
    return written


def seed_gaps(r, base):
    """(steps, [seed][step]) of a variant's per-seed differences to vanilla; None if none."""
    n = min(len(r["steps"]), len(base["steps"]))
    if list(r["steps"][:n]) != list(base["steps"][:n]):
        return None
    gaps = [np.array(r["curves"][i][:n]) - np.array(base["curves"][base["seeds"].index(s)][:n])
            for i, s in enumerate(r["seeds"]) if s in base["seeds"]]
    return (np.array(r["steps"][:n]), np.array(gaps)) if gaps else None


def floor_band(results):
    """(steps, half-width) of the noise floor: the largest |nudged - vanilla| at each step."""
    if FLOOR not in results or "vanilla" not in results:
        return None
    gaps = seed_gaps(results[FLOOR], results["vanilla"])
    return (gaps[0], np.abs(gaps[1]).max(0)) if gaps else None


def seeds_said(results):
    """What the top panel's lines and bands are over: a band only where 2+ seeds make one."""
    counts = {len(r["seeds"]) for r in results.values()}
    if max(counts) == 1:
        return "one seed"
    if min(counts) == 1:
        return "mean over seeds, band = min-max where 2+ seeds"
    return (f"mean over {min(counts)} seeds" if len(counts) == 1 else "mean over seeds") + \
        ", band = min-max"


def loss_figure(plt, root, results, escape_loss=0.0, path=None, unit="token"):
    """Val loss against steps (mean over seeds, min-max band with 2+ seeds; a triangle where a
    variant left the early plateau) and, with vanilla, the paired difference to it (bold: mean,
    thin: each seed) around the noise floor's grey band; axes skip the first evaluations."""
    base = results.get("vanilla")
    variants = {n: r for n, r in results.items() if n != FLOOR} or results  # (the floor alone)
    if base is None:
        (fig, top), bottom = plt.subplots(figsize=(8, 4.8)), None
    else:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.6), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 2]})
    shown, gaps, colors = [], [], {}
    for name, r in variants.items():
        steps, curves = np.array(r["steps"]), np.array(r["curves"])
        keep = steps > 0  # step 0 (loss ~ log vocab) would flatten everything else
        left = [e[0] for e in r.get("escape", []) if e]
        stalled = (f" (left the plateau on {len(left)} of {len(r['escape'])} seeds)"
                   if escape_loss and len(left) < len(r.get("escape", [])) else "")
        line, = top.plot(steps[keep], curves.mean(0)[keep], marker="o", ms=3, lw=LINE,
                         label=label(name, r.get("note")) + stalled)
        colors[name] = line.get_color()
        if len(curves) > 1:
            top.fill_between(steps[keep], curves.min(0)[keep], curves.max(0)[keep],
                             color=line.get_color(), alpha=0.2)
        past = slice(2 if keep.sum() > 4 else 0, None)  # the y-range holds the band, all seeds
        shown += [curves.min(0)[keep][past], curves.max(0)[keep][past]]
    marked, many = False, max(len(v["seeds"]) for v in variants.values()) > 1
    for i, (name, r) in enumerate(variants.items()):  # one legend entry explains every triangle
        left = [e[0] for e in r.get("escape", []) if e]
        if escape_loss and left:  # each smaller than the last, so two on one step both show
            top.plot([np.mean(left)], [escape_loss], marker="v", ms=max(15 - 3 * i, 5),
                     color=colors[name], ls="none", zorder=3 + i, label=None if marked else
                     f"leaves the plateau: the first evaluation below the dotted line "
                     f"({escape_loss:g})" + (", mean over the seeds that left" if many else ""))
            marked = True
    values = np.concatenate(shown)
    low, high = values.min(), values.max()
    if escape_loss and low <= escape_loss <= high:
        top.axhline(escape_loss, color="gray", ls=":", lw=1.5)
    if high > low:
        top.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
    top.set(ylabel=f"val loss (nats per {unit})",
            title=f"Val loss (fixed windows; {seeds_said(variants)}; lower is better)")
    per_step = next(iter(results.values())).get("tokens_per_step")
    (bottom or top).set_xlabel(f"step ({per_step:,} tokens each)" if per_step else "step")
    if bottom is not None:
        several, calibrated = False, 0
        for name, r in variants.items():
            paired = seed_gaps(r, base) if name != "vanilla" else None
            if paired is None:
                continue
            steps, per_seed = paired
            keep = steps > 0
            gap = per_seed.mean(0)[keep]
            bottom.plot(steps[keep], gap, marker="o", ms=3, lw=2.5, color=colors[name],
                        label=label(name, r.get("note")), zorder=3)
            gaps.append(gap)
            other = r.get("calibration")  # one seed: where the same difference fell on others
            if other and other["steps"][:len(steps)] == list(steps):
                spread = np.sort(np.array(other["curves"])[:, :len(steps)][:, keep], axis=0)
                # Only the edges, dashed in the variant's colour: two bands that overlap, filled,
                # would blend into a colour that is neither.
                for edge in (spread[0], spread[-1]):
                    bottom.plot(steps[keep], edge, color=colors[name], lw=1.2, ls="--", zorder=1)
                # The axis holds all seeds but the extreme one each side: a single seed where
                # vanilla stalled on the plateau would squash the demo's own line to a flat one.
                inner = len(spread) >= 5
                span = np.ptp(spread[1:-1]) / 2 if inner else 0.0
                low_off = bool(inner and spread[0].min() < spread[1].min() - span)
                high_off = bool(inner and spread[-1].max() > spread[-2].max() + span)
                gaps += [spread[1 if low_off else 0], spread[-2 if high_off else -1]]
                below = f"the lowest runs below the axis, {spread[0].min():.2f} at worst"
                above = f"the highest above it, {spread[-1].max():+.2f} at worst"
                off = ([below] if low_off else []) + ([above] if high_off else [])
                n_other = len(other["final"])
                bottom.plot([], [], color=colors[name], lw=1.2, ls="--",
                            label=f"{label(name)}: lowest and highest of {n_other} other seeds "
                            f"(a min-max range: holds another seed about "
                            f"{(n_other - 1) / (n_other + 1):.0%} of the time)"
                            + "".join("; " + o for o in off))
                (lo, hi), own = r.get("band", (None, None)), r.get("paired", {}).get("mean")
                if own is not None and lo is not None and not lo <= own <= hi:
                    bottom.plot([steps[keep][-1]], [gap[-1]], marker="X", ms=14, ls="none",
                                color=colors[name], zorder=4, label=f"{label(name)}: this seed "
                                f"ends outside the other {n_other} seeds' range (whole split): "
                                f"one seed is one draw")
                calibrated = n_other
            if len(per_seed) > 1:  # the spread: each seed's own difference, thin
                several = True
                for seed_gap in per_seed:
                    bottom.plot(steps[keep], seed_gap[keep], lw=1, alpha=0.5,
                                color=colors[name], zorder=2)
                    gaps.append(seed_gap[keep])
        if several:  # one legend entry for all thin lines (drawn after the variants)
            bottom.plot([], [], lw=1, alpha=0.6, color="0.3", label="thin lines: each seed")
        bottom.axhline(0, color="black", lw=1.2)
        band = floor_band(results)
        floor_high = 0.0
        if band is not None:
            steps, half = band
            keep = steps > 0
            draws = len(results[FLOOR]["seeds"])
            bottom.fill_between(steps[keep], -half[keep], half[keep], color="0.55", alpha=0.35,
                                lw=0, zorder=1, label=f"{FLOOR_LABEL} ("
                                + ("one draw" if draws == 1 else plural(draws, "seed"))
                                + f", at most ±{half[keep].max() if keep.any() else 0:.2g})")
            past = slice(2 if keep.sum() > 4 else 0, None)  # as the top panel's range
            floor_high = half[keep][past].max() if keep.any() else 0.0
        # each curve's 2nd to 98th percentile (its nearest points, not interpolated toward an
        # outlier): one early outlier per variant must not flatten the rest; the floor's band
        # is always inside
        low = min(0, -floor_high, *(np.percentile(g, 2, method="nearest") for g in gaps))
        high = max(0, floor_high, *(np.percentile(g, 98, method="nearest") for g in gaps))
        if high > low:
            bottom.set_ylim(low - 0.1 * (high - low), high + 0.1 * (high - low))
        said = ((["bold = mean, thin = each seed"] if several else ["one seed"] if gaps else [])
                + ([f"dashed = lowest and highest of {calibrated} other seeds"] if calibrated
                   else []) + (["grey = rounding alone"] if band else []))
        bottom.set(ylabel=f"minus vanilla (nats per {unit})", title="Difference to vanilla on the "
                   "same seed (below 0 = better)" + ("\n" + "; ".join(said) if said else ""))
    return save(plt, fig, path or os.path.join(root, "loss.png"))


def note(name):
    """The note compare.py gives a variant (label's note): the noise floor's says what it is."""
    return "nudged one rounding step: the noise floor" if name == FLOOR else None


def live_loss(root, grid, escape_loss=0.0, unit="token", calibration=None):
    """loss.png redrawn from the runs' logs so far (every 30 s while they train), up to the step all
    of a variant's started seeds reached; written elsewhere, then renamed: never half a picture."""
    plt = pyplot(quiet=True)
    runs, per_step = {}, None
    for (name, seed, point), cfg in grid:
        if point:  # --tune's paper protocol: the final picture has the variants' own lrs only
            continue
        log = read_log(cfg["out_dir"])
        evals = [r for r in log if r["kind"] == "eval"]
        if len(evals) >= 2:
            runs.setdefault(name, []).append((seed, evals))
            per_step = per_step or evals[-1]["tokens"] // evals[-1]["iter"]
    if plt is None or not runs or all(name == FLOOR for name in runs):
        return None
    results = {}
    for name, seeded in runs.items():
        n = min(len(evals) for _, evals in seeded)
        r = results[name] = {"seeds": [seed for seed, _ in seeded],
                             "steps": [e["iter"] for e in seeded[0][1][:n]],
                             "curves": [[e["val_loss"] for e in evals[:n]] for _, evals in seeded],
                             "tokens_per_step": per_step}
        if escape_loss:
            r["escape"] = [escape(evals[:n], escape_loss) for _, evals in seeded]
        if note(name):
            r["note"] = note(name)
        if calibration and len(r["seeds"]) == 1 and name in calibration["modes"]:
            r["calibration"] = calibration["modes"][name]
    tmp = os.path.join(root, "loss.live.png")
    loss_figure(plt, root, results, escape_loss, path=tmp, unit=unit)
    os.replace(tmp, os.path.join(root, "loss.png"))
    return os.path.join(root, "loss.png")


def lr_figure(plt, root, search, unit="token"):
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
        ax.plot(lrs, np.minimum(means, ceiling), color=f"C{k}", lw=LINE,
                label=f"{label(name)} (dots: seeds)")
        best = lrs[int(np.argmin(means))]
        edge = not bracketed(dict(zip(lrs, means)))  # the lowest point at the grid's edge
        ax.scatter([best], [min(means)], s=120, facecolors="none", edgecolors=f"C{k}", lw=2,
                   ls="--" if edge else "-", label=f"{label(name)}: " + (
                       f"lowest at the grid's edge, {best:g} (not bracketed)" if edge
                       else f"best {best:g}"))
    ax.set_xscale("log")
    ax.set(xlabel="peak learning rate (log scale)",
           ylabel=f"final val loss (nats per {unit},\nwhole split)",
           title="Learning-rate search: each variant's U-curve")
    return save(plt, fig, os.path.join(root, "lr_search.png"))


def curve_figure(plt, root, results, unit="token"):
    """The paper's measure: vanilla's final loss at each size (dots: seeds), the line through
    them, each variant with an arrow along it to the vanilla size that matches it; where the
    sizes do not lie on one line, their means joined and no arrow."""
    curve = vanilla_curve(results)
    (a, b), sizes = curve["line"], curve["sizes"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in sizes:
        r = results[n]
        ax.scatter([r["num_params"]] * len(r["val_loss"]), r["val_loss"], s=10, color="gray",
                   alpha=0.5)
    if curve["poor"]:  # as the table: the points, and no size read off a line they do not follow
        by_size = sorted(sizes, key=sizes.get)
        ax.plot([sizes[n] for n in by_size], [curve["points"][n] for n in by_size], "o--",
                color="black", lw=LINE, label=f"vanilla, {len(sizes)} sizes (grey dots: seeds): "
                f"not on one line (R² {curve['r2']:.2f}), so no reading")
        for k, name in enumerate(n for n in curve["placed"] if n != FLOOR):
            ax.scatter([results[name]["num_params"]], [results[name]["val_loss_mean"]], s=60,
                       color=f"C{k}", zorder=3, label=label(name, results[name].get("note")))
        ylabel, title = ("whole split, mean over seeds",
                         "Vanilla's loss against size, and each variant")
    else:
        span = np.geomspace(min(sizes.values()) / 1.15, max(sizes.values()) * 1.15, 50)
        line = a + b * np.log(span)
        ax.plot(span, line, color="black", lw=LINE,
                label=f"vanilla, {len(sizes)} sizes (dots: seeds)")
        if curve["floor"] is not None:  # a variant inside the band is within what rounding does
            ax.fill_between(span, line - curve["floor"], line + curve["floor"], color="gray",
                            alpha=0.2, lw=0, label=f"rounding floor (±{curve['floor']:.3f})")
        placed = {n: p for n, p in curve["placed"].items() if n != FLOOR}  # (analysis skips it)
        for k, (name, p) in enumerate(placed.items()):
            loss = results[name]["val_loss_mean"]
            text = label(name, results[name].get("note")) + ("" if p["larger"] is None else
                                  f": as good as a vanilla model {abs(100 * p['larger']):.0f}% "
                                  f"{'larger' if p['larger'] >= 0 else 'smaller'}" +
                                  (" (within the rounding floor)" if p["within_floor"] else ""))
            ax.scatter([p["num_params"]], [loss], s=60, color=f"C{k}", zorder=3, label=text)
            if p["matched_params"]:
                ax.annotate("", (p["matched_params"], loss), (p["num_params"], loss),
                            arrowprops=dict(arrowstyle="->", color=f"C{k}", lw=LINE))
        ylabel, title = "whole split", "Each variant on vanilla's loss-against-size line"
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(token_units)
    ax.xaxis.set_minor_formatter(lambda x, _: token_units(x) if str(x)[0] in "2468" else "")
    ax.set(xlabel="parameters (total)", ylabel=f"final val loss (nats per {unit},\n{ylabel})",
           title=title)
    return save(plt, fig, os.path.join(root, "size_curve.png"))
