"""Pictures for compare.py (matplotlib, optional): loss curves with each variant's difference to
vanilla along the run, attention entropy and token similarity per layer, learned lambdas, loss
against model size. Each variant is named in words (tables.label)."""
import os
import textwrap

import numpy as np

from .analysis import FLOOR, bracketed, escape, is_vanilla_size, noise_floor, vanilla_curve
from .runs import read_log
from .tables import label, mixing_by_layer

# sizes that stay readable on a projector: text >= 11 points, curves >= 2 points wide
TEXT, SMALL, LINE = 13, 11, 2.0
# what the difference panels draw in grey around 0 (analysis.FLOOR's runs), in plain words
FLOOR_LABEL = ("grey: rounding alone (vanilla again, its starting weights nudged one "
               "float32 step: what another CPU does, not another seed)")
# One colour per variant in every picture, so a class can follow it; any other takes one free.
COLORS = {"vanilla": "C0", "resformer:lambda_1=2:lambda_2=1": "C1", "svformer": "C2",
          "resformer": "C3", "value_embed": "C4"}


def colour(name, names):
    """name's colour among names (the variants a picture draws, in their order)."""
    free = [f"C{i}" for i in range(10) if f"C{i}" not in COLORS.values()]
    others = [n for n in names if n not in COLORS]
    return COLORS.get(name) or free[others.index(name) % len(free)]


def pyplot():
    """matplotlib.pyplot for files (no display), or None (compare.py says so once, at its start)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def save(plt, fig, path):
    """Grid, readable sizes, legends right of the axes (never over a line), the figure widened."""
    widest = 0.0
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=SMALL)
        for text in (ax.xaxis.label, ax.yaxis.label):
            text.set_fontsize(max(text.get_fontsize(), SMALL))
        ax.title.set_fontsize(max(ax.title.get_fontsize(), TEXT))
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
    """Every picture compare.py makes: their paths. unit: the loss is nats per "byte" or "token"."""
    plt = pyplot()  # (compare said so at its start)
    if plt is None:
        return []
    written = [loss_figure(plt, root, results, escape_loss, unit=unit)]
    written += [lr_figure(plt, root, search, unit)] if search else []
    variants = {n: r for n, r in results.items() if n != FLOOR}
    written += [layer_figure(plt, root, variants, *measure) for measure in LAYER_MEASURES]
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
                    ax.plot(layers, values[:, i], marker="os^v"[i % 4], lw=LINE, ls="-:"[i % 2],
                            color=colour(name, list(learned)), label=f"{label(name)}: {part}")
        ax.axhline(0.5, color="gray", ls="--", lw=1.5, label="the start: 0.5")
        n_layer = max(max(b) for k in learned.values() for b in k.values())
        ax.set(xlabel="layer", xticks=range(1, n_layer + 1))
        ax.set(ylabel="learned value", title="Learned mixing weights by layer (mean over seeds)")
        written.append(save(plt, fig, os.path.join(root, "mixing.png")))
    if vanilla_curve(results):
        written.append(curve_figure(plt, root, results, unit))
    return written


# The paper's two per-layer measures: (key, title, the paper's claim, the side it expects of
# ResFormer against vanilla, y label, what the measure can be: a band is clipped to it).
LAYER_MEASURES = (
    ("attention_entropy",
     "Attention entropy per layer: how widely each layer spreads its attention",
     "the paper: higher than vanilla's in deep layers", "above",
     "entropy of the attention\neach token receives (nats)", (0, np.inf)),
    ("similarity", "Token similarity per layer: how alike the tokens' hidden states are",
     "the paper: lower than vanilla's (less over-smoothing)", "below",
     "mean pairwise cosine\nof the hidden states", (-1, 1)))


def layer_figure(plt, root, variants, key, title, claim, side, ylabel, limits):
    """A per-layer measure of the paper's, vanilla's other sizes aside: each variant's legend counts
    its deeper half's layers on the paper's side of vanilla; a ±1 std band with 2+ seeds."""
    shown = {n: r for n, r in variants.items() if n == "vanilla" or not is_vanilla_size(n)}
    base, seeds = shown.get("vanilla"), max(len(r["seeds"]) for r in shown.values())
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in shown.items():
        mean, std = np.array(r[key]), np.array(r[key + "_std"])
        layers, deep = np.arange(1, len(mean) + 1), len(mean) - len(mean) // 2
        said = label(name)
        if base is not None and name != "vanilla" and len(base[key]) == len(mean):
            on_side = (mean > base[key]) if side == "above" else (mean < base[key])
            said += f": {side} vanilla in {on_side[-deep:].sum()} of the {deep} deepest layers"
        line, = ax.plot(layers, mean, marker="o", ms=4, lw=LINE, label=said,
                        color=colour(name, list(shown)))
        if seeds > 1:
            ax.fill_between(layers, *np.clip([mean - std, mean + std], *limits),
                            color=line.get_color(), alpha=0.15)
    ax.set(xlabel="layer", ylabel=ylabel, xticks=range(1, len(base[key] if base else mean) + 1))
    steps = max(r["steps"][-1] for r in shown.values())
    ax.set_title("\n".join(textwrap.wrap(f"{title}; {claim}. Here, after {steps:,} steps: " + (
        f"mean over {seeds} seeds, band ±1 std." if seeds > 1 else "one seed."), 56)))
    return save(plt, fig, os.path.join(root, f"{key}.png"))


def seed_gaps(r, base):
    """(steps, [seed][step]) of a variant's per-seed differences to vanilla; None if none."""
    n = min(len(r["steps"]), len(base["steps"]))
    if list(r["steps"][:n]) != list(base["steps"][:n]):
        return None
    gaps = [np.array(r["curves"][i][:n]) - np.array(base["curves"][base["seeds"].index(s)][:n])
            for i, s in enumerate(r["seeds"]) if s in base["seeds"]]
    return (np.array(r["steps"][:n]), np.array(gaps)) if gaps else None


def seeds_said(results):
    """What the top panel's lines and bands are over: a band only where 2+ seeds make one."""
    counts = {len(r["seeds"]) for r in results.values()}
    if max(counts) == 1:
        return "one seed"
    return (f"mean over {min(counts)} seeds" if len(counts) == 1 else "mean over seeds") + (
        ", band = min-max" + (" where 2+ seeds" if min(counts) == 1 else ""))


def loss_figure(plt, root, results, escape_loss=0.0, path=None, unit="token"):
    """Val loss along the run (curves_panel) and, with vanilla, a panel a variant below it
    (vanilla's other sizes aside): its difference to vanilla along the run, one y-axis for all."""
    base = results.get("vanilla")
    variants = {n: r for n, r in results.items() if n != FLOOR} or results  # (the floor alone)
    compared = {n: gaps for n, r in variants.items() if base and n != "vanilla"
                and not is_vanilla_size(n) and (gaps := seed_gaps(r, base))}
    cols = min(len(compared), 2) or 1
    rows = -(-len(compared) // cols)
    fig = plt.figure(figsize=(8, 4.8 + 3.2 * rows))
    spec = fig.add_gridspec(1 + rows, cols, height_ratios=[3] + [2] * rows)
    top = fig.add_subplot(spec[0, :])
    # vanilla's other sizes crowd the curves: size_curve.png shows them, where they are the point
    shown = {n: r for n, r in variants.items() if n == "vanilla" or not is_vanilla_size(n)}
    colors = curves_panel(top, shown if len(shown) > 1 else variants, escape_loss, unit)
    per_step = next(iter(results.values())).get("tokens_per_step")
    xlabel = f"step ({per_step:,} tokens each)" if per_step else "step"
    top.set_xlabel("" if compared else xlabel)
    panels, held, off = [], [], []
    floor = FLOOR in results and base and seed_gaps(results[FLOOR], base)
    band = (floor[0], np.abs(floor[1]).max(0)) if floor else None  # the largest |nudged - vanilla|
    for i, (name, gaps) in enumerate(compared.items()):
        ax = fig.add_subplot(spec[1 + i // cols, i % cols], sharey=panels[0] if panels else None)
        panels.append(ax)
        held += gap_panel(ax, name, variants[name], gaps, band, colors[name], off)
        ax.set_xlabel(xlabel if i >= len(compared) - cols else "")
        ax.set_ylabel(f"minus vanilla\n(nats per {unit})" if i % cols == 0 else "")
    if panels:
        values = np.concatenate(held)
        low, high = min(0, values.min()), max(0, values.max())
        panels[0].set_ylim(low - 0.1 * (high - low), high + 0.1 * (high - low))
        gap_legend(panels[min(cols, len(panels)) - 1], results, compared, band, off,
                   colors[next(iter(compared))])
    return save(plt, fig, path or os.path.join(root, "loss.png"))


def curves_panel(ax, variants, escape_loss, unit):
    """The top panel: each variant's val loss, a triangle where it left the plateau; its colour."""
    shown, colors = [], {}
    for name, r in variants.items():
        steps, curves = np.array(r["steps"]), np.array(r["curves"])
        keep = steps > 0  # step 0 (loss ~ log vocab) would flatten everything else
        left, tried = [e[0] for e in r.get("escape", []) if e], len(r.get("escape", []))
        mean = "" if tried == 1 else " (mean)" if len(left) == tried else (
            f" (mean; on {len(left)} of {tried} seeds)")
        said = "" if not (escape_loss and tried) else (  # in words too: triangles can overlap
            f": leaves the plateau at step {np.mean(left):.0f}{mean}" if left
            else f" (left the plateau on 0 of {tried} seeds)")
        line, = ax.plot(steps[keep], curves.mean(0)[keep], marker="o", ms=3, lw=LINE,
                        color=colour(name, list(variants)), label=label(name) + said)
        colors[name] = line.get_color()
        if len(curves) > 1:
            ax.fill_between(steps[keep], curves.min(0)[keep], curves.max(0)[keep],
                            color=line.get_color(), alpha=0.2)
        past = slice(2 if keep.sum() > 4 else 0, None)  # the y-range holds the band, all seeds
        shown += [curves.min(0)[keep][past], curves.max(0)[keep][past]]
    many = max(len(v["seeds"]) for v in variants.values()) > 1
    for i, (name, r) in enumerate(variants.items()):
        left = [e[0] for e in r.get("escape", []) if e]
        if escape_loss and left:  # each smaller than the last, so two on one step both show
            ax.plot([np.mean(left)], [escape_loss], marker="v", ms=max(15 - 3 * i, 5),
                    color=colors[name], ls="none", zorder=3 + i)
    if escape_loss and any(e for r in variants.values() for e in r.get("escape", [])):
        ax.plot([], [], marker="v", ms=12, color="0.4", ls="none", label=(  # one for them all
            f"where each leaves the early plateau (in its colour): its first evaluation below the "
            f"dotted line ({escape_loss:g})" + (", mean over the seeds that left" if many else "")))
    low, high = np.concatenate(shown).min(), np.concatenate(shown).max()
    high = max(high, escape_loss + 0.4) if escape_loss else high  # the plateau itself in view
    if escape_loss and low <= escape_loss <= high:
        ax.axhline(escape_loss, color="gray", ls=":", lw=1.5)
    if high > low:
        ax.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
    last = max(r["steps"][-1] for r in variants.values())
    ax.set(ylabel=f"val loss (nats per {unit})", title=textwrap.fill(
        f"Val loss over {last:,} steps (a few fixed batches; {seeds_said(variants)}; lower is "
        f"better)", 80))
    return colors


def gap_panel(ax, name, r, paired, band, color, off):
    """A variant minus vanilla along the run: the mean bold, each seed thin, the calibration's other
    seeds shaded, rounding alone grey. Returns what the shared y-axis holds: the lines and grey band
    past the first two evaluations, and the shaded range's edges clipped at 1.5 times the farthest
    of those (a seed where vanilla stalled would squash the rest flat); a cut edge goes into off."""
    steps, per_seed = paired
    keep = steps > 0
    x, past = steps[keep], slice(2 if keep.sum() > 4 else 0, None)
    ax.axhline(0, color="black", lw=1.2)
    for seed_gap in per_seed if len(per_seed) > 1 else []:
        ax.plot(x, seed_gap[keep], lw=1, alpha=0.5, color=color)
    ax.plot(x, per_seed.mean(0)[keep], marker="o", ms=3, lw=2.5, color=color, zorder=3)
    share = 5 if len(per_seed) > 1 else 0  # a few early outliers must not flatten every panel
    held = [np.percentile(per_seed[:, keep][:, past], [share, 100 - share], method="nearest")]
    if band is not None and list(band[0][:len(steps)]) == list(steps[:len(band[0])]):
        half = band[1][:len(steps)][keep[:len(band[1])]]
        ax.fill_between(x[:len(half)], -half, half, color="0.55", alpha=0.35, lw=0, zorder=1)
        held.append(half[past])
    reach = 1.5 * max(np.abs(np.concatenate(held)).max(), 1e-3)
    other, p = r.get("calibration"), r.get("paired")
    if other and other["steps"][:len(steps)] == list(steps):
        spread = np.sort(np.array(other["curves"])[:, :len(steps)][:, keep], axis=0)
        ax.fill_between(x, spread[0], spread[-1], color=color, alpha=0.2, lw=0, zorder=1)
        edges = np.concatenate([spread[0][past], spread[-1][past]])
        held.append(np.clip(edges, -reach, reach))
        off += [e for e in (edges.min(), edges.max()) if abs(e) > reach]
    said = "" if not p else f": {p['mean']:+.3f} at the end" + (
        "\n[{:+.3f}, {:+.3f}]".format(*p["interval"]) if p["n"] > 1 else "\nother seeds {:+.3f} "
        "to {:+.3f}".format(*r["band"]) if r.get("band_source") == "seeds" else "")
    ax.set_title(label(name) + said, fontsize=SMALL)
    return held


def gap_legend(ax, results, compared, band, off, color):
    """One plain-words legend for the difference panels, beside the last one of their first row."""
    n = max(len(gaps[1]) for gaps in compared.values())
    finished = any(results[name].get("paired") for name in compared)  # (live: no final numbers)
    ax.plot([], [], lw=2.5, color="0.3", label=(
        "each panel: a variant minus vanilla on the same seed, below 0 = better; " + (
            f"bold: the mean of {n} seeds, thin: each seed" if n > 1 else "bold: this seed")
        + "; lines: a few fixed batches at each evaluation" + (
            "; the numbers over a panel: the whole validation split at the end"
            + (", mean and 95% interval" if n > 1 else "") if finished else "")))
    k = next((len(results[n]["calibration"]["final"]) for n in compared
              if results[n].get("calibration")), 0)  # the calibration's other seeds
    if k:
        ax.fill_between([], [], [], color=color, alpha=0.2, lw=0, label=(
            f"shaded, in the variant's colour: lowest to highest of {k} other seeds (another "
            f"lands inside {k - 1} times in {k + 1}, about {(k - 1) / (k + 1):.0%})"
            + (f"; off the axis, at some step, as far as {max(off, key=abs):+.2f}" if off else "")))
    if band is not None:  # its size at the end: the whole split's where the runs finished
        end, many = noise_floor(results), len(results[FLOOR]["seeds"]) > 1
        end = band[1][-1] if end is None else end
        ax.fill_between([], [], [], color="0.55", alpha=0.35, lw=0, label=(
            f"{FLOOR_LABEL}: {'up to ' if many else ''}{end:.3f} at the end"
            + ("" if many else " (one draw: on another seed it can be far larger)")))


def live_loss(root, grid, escape_loss=0.0, unit="token", calibration=None):
    """loss.png redrawn from the runs' logs so far (every 30 s while they train), up to the step all
    of a variant's started seeds reached; written elsewhere, then renamed: never half a picture."""
    plt = pyplot()
    runs, per_step = {}, None
    for (name, seed, point), cfg in grid:
        if point:  # --tune's paper protocol: the final picture has the variants' own lrs only
            continue
        evals = [r for r in read_log(cfg["out_dir"]) if r["kind"] == "eval"]
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
    for name, by_lr in search.items():
        lrs, c = sorted(by_lr), colour(name, list(search))
        means = [np.mean(by_lr[lr]) for lr in lrs]
        for lr in lrs:
            ax.scatter([lr] * len(by_lr[lr]), np.minimum(by_lr[lr], ceiling), s=12,
                       color=c, alpha=0.5)
        ax.plot(lrs, np.minimum(means, ceiling), color=c, lw=LINE,
                label=f"{label(name)} (dots: seeds)")
        best = lrs[int(np.argmin(means))]
        edge = not bracketed(dict(zip(lrs, means)))  # the lowest point at the grid's edge
        ax.scatter([best], [min(means)], s=120, facecolors="none", edgecolors=c, lw=2,
                   ls="--" if edge else "-", label=f"{label(name)}: " + (
                       f"lowest at the grid's edge, {best:g} (not bracketed)" if edge
                       else f"best {best:g}"))
    ax.set_xscale("log")
    ax.set(xlabel="peak learning rate (log scale)",
           ylabel=f"final val loss (nats per {unit},\nwhole split)",
           title="Learning-rate search: each variant's U-curve")
    return save(plt, fig, os.path.join(root, "lr_search.png"))


def curve_figure(plt, root, results, unit="token"):
    """The paper's measure: vanilla's final loss at each size (dots: seeds), the line through them,
    an arrow from each variant to the vanilla size it matches; off one line, their means joined."""
    curve = vanilla_curve(results)
    (a, b), sizes = curve["line"], curve["sizes"]
    fig, ax = plt.subplots(figsize=(7, 6))
    for n in sizes:
        r = results[n]
        ax.scatter([r["num_params"]] * len(r["val_loss"]), r["val_loss"], s=10, color="gray",
                   alpha=0.5)
    if curve["poor"]:  # as the table: the points, and no size read off a line they do not follow
        by_size = sorted(sizes, key=sizes.get)
        ax.plot([sizes[n] for n in by_size], [curve["points"][n] for n in by_size], "o--",
                color="black", lw=LINE, label=f"vanilla, {len(sizes)} sizes (grey dots: seeds): "
                f"not on one line (R² {curve['r2']:.2f}), so no reading")
        for name in (n for n in curve["placed"] if n != FLOOR):
            ax.scatter([results[name]["num_params"]], [results[name]["val_loss_mean"]], s=60,
                       color=colour(name, list(results)), zorder=3, label=label(name))
        ylabel, title = ("whole split, mean over seeds",
                         "Vanilla's loss against size, and each variant")
    else:
        span = np.geomspace(min(sizes.values()) / 1.15, max(sizes.values()) * 1.15, 50)
        line = a + b * np.log(span)
        ax.plot(span, line, color="black", lw=LINE, label=f"vanilla at {len(sizes)} sizes: the "
                f"line through them (black dots: their means, grey: each seed)")
        for n, x in sizes.items():  # each vanilla size's mean, named, so a class reads it off
            ax.scatter([x], [curve["points"][n]], s=30, color="black", zorder=5)  # over a variant
            ax.annotate(label(n).replace("vanilla, ", "").replace(" = ", " "),
                        (x, curve["points"][n]), fontsize=SMALL, textcoords="offset points",
                        xytext=(0, -20), ha="center")
        own = 1 + (curve["vanilla_reading"] or 0)  # vanilla's own point, read off its own line
        if curve["vanilla_reading"] is not None:  # the line misses vanilla's own point: say so
            x, loss = sizes["vanilla"], curve["points"]["vanilla"]
            ax.annotate("", (x * (1 + curve["vanilla_reading"]), loss), (x, loss),
                        arrowprops=dict(arrowstyle="->", color="black", lw=LINE, ls="--"),
                        zorder=4)  # dashed: a variant's arrow of the same length shows under it
            ax.plot([], [], color="black", lw=LINE, ls="--", marker=">", label=(
                f"vanilla itself, read off the line the same way: as good as a vanilla model "
                f"{1 + curve['vanilla_reading']:.2f} times its size (its own point lies "
                f"{'below' if curve['vanilla_reading'] >= 0 else 'above'} the line): compare "
                f"each arrow's length with this one"))
        if curve["floor"] is not None:  # a variant inside the band is within what rounding does
            ax.fill_between(span, line - curve["floor"], line + curve["floor"], color="gray",
                            alpha=0.2, lw=0, label=f"rounding floor (±{curve['floor']:.3f})")
        placed = {n: p for n, p in curve["placed"].items() if n != FLOOR}  # (analysis skips it)
        for name, p in placed.items():
            loss, c = results[name]["val_loss_mean"], colour(name, list(results))
            text = label(name) + ("" if p["larger"] is None else
                                  f": as good as a vanilla model {1 + p['larger']:.2f} times its "
                                  f"size, {(1 + p['larger']) / own:.2f} times vanilla's own reading"
                                  + (" (within the rounding floor)" if p["within_floor"] else ""))
            ax.scatter([p["num_params"]], [loss], s=90, color=c, zorder=3, label=text)
            if p["matched_params"]:
                ax.annotate("", (p["matched_params"], loss), (p["num_params"], loss),
                            arrowprops=dict(arrowstyle="->", color=c, lw=LINE))
        steps = max(results[n]["steps"][-1] for n in sizes)
        ylabel, title = "whole split", f"Loss against size after {steps:,} steps, on vanilla's line"
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(token_units)
    ax.xaxis.set_minor_formatter(lambda x, _: token_units(x) if str(x)[0] in "2468" else "")
    ax.set(xlabel="parameters (total)", ylabel=f"final val loss (nats per {unit},\n{ylabel})",
           title=title)
    return save(plt, fig, os.path.join(root, "size_curve.png"))
