"""Tables for compare.py: results.md (what a class reads, each variant named in words) and
results.json (everything, under the variants' exact names, for re-analysis)."""
import json
import os
from fractions import Fraction

import numpy as np

import data
from model import VALUE_MODES, GPTConfig

from .analysis import (FLOOR, bracketed, held_on_every_seed, lr_range, noise_floor, paired_stats,
                       plural, vanilla_curve, verdict)

# How a class reads each value mode (results.json keeps the exact names); another mode: its name.
MODE_NAMES = {"vanilla": "vanilla", "resformer": "ResFormer", "svformer": "SVFormer",
              "value_embed": "value embeddings"}
# verdict()'s sentence, by its first word, as the headline groups the variants
VERDICT_GROUPS = {"below": "lower than vanilla beyond noise", "level": "level with vanilla",
                  "above": "higher than vanilla beyond noise",
                  "within": "within the rounding floor", "not": "not distinguishable from "
                  "vanilla: however many seeds are lower, the amounts vary too much from seed to "
                  "seed for the interval to exclude 0"}


def label(name):
    """A variant in words: 'resformer' -> 'ResFormer λ1 = λ2 = 0.5' (the official mix),
    'resformer:lambda_1=2:lambda_2=1' -> 'ResFormer λ1 = 2' (the paper's U = A (V_n + 2 V_1)),
    'svformer_kv1' -> 'SVFormer, 1 KV head'; the noise floor says what it is."""
    base, *settings = name.split(":")
    mode = max((m for m in VALUE_MODES if base.startswith(m)), key=len, default=None)
    if name == FLOOR or mode is None:
        return "vanilla, nudged one rounding step: the noise floor" if mode else name
    words, rest = [MODE_NAMES.get(mode, mode)], base[len(mode):]
    given = dict(s.partition("=")[::2] for s in settings)
    if mode == "resformer" and "_learnable" not in rest:  # its two lambdas, always said
        l1 = given.pop("lambda_1", str(GPTConfig.lambda_1))
        l2 = given.pop("lambda_2", str(GPTConfig.lambda_2))
        words[0] += (f" λ1 = λ2 = {l1}" if l1 == l2 else f" λ1 = {l1}" if l2 == "1"
                     else f" λ1 = {l1}, λ2 = {l2}")
    if "_learnable" in rest:
        words.append("learned λ1 and λ2")
    if "_kv" in rest:
        n = rest.rpartition("_kv")[2]
        words.append(f"{n} KV head{'' if n == '1' else 's'}")
    return ", ".join(words + [f"{k} = {v}" for k, v in given.items()])


def named(name):
    """The variant's words and, where they differ from it, its exact name (as --modes takes it)."""
    return label(name) if label(name).lower() == name else f"{label(name)} (`{name}`)"


def mixing_by_layer(mixing):
    """{kind: {layer (1-based): [values]}} from GPT.mixing_weights(): 'transformer.h.3.attn.
    value_lambdas' is layer 4's value_lambdas; a weight outside the blocks is layer 0's."""
    kinds = {}
    for name, value in mixing.items():
        parts = name.removesuffix(":mean").split(".")
        layer = int(parts[2]) + 1 if parts[:2] == ["transformer", "h"] else 0
        kinds.setdefault(parts[-1], {})[layer] = value if isinstance(value, list) else [value]
    return kinds


def fmt_mean(mean, std, n):
    """'1.9087 ± 0.0123' over several seeds; one seed has no spread to show."""
    return f"{mean:.4f}" if n < 2 else f"{mean:.4f} ± {std:.4f}"


def fmt_interval(stats):
    return ("-" if stats["interval"] is None
            else f"[{stats['interval'][0]:+.4f}, {stats['interval'][1]:+.4f}]")


def headline(results, info):
    """The verdict the numbers support, computed, ahead of every table."""
    floor, unit = noise_floor(results), info.get("unit", "token")
    floor_runs = len(results.get(FLOOR, {}).get("seeds", []))
    compared = {n: r for n, r in results.items() if r.get("paired") and n != FLOOR}
    if not compared:
        return "**Verdict: nothing to compare with vanilla.**"
    n = len(next(iter(compared.values()))["paired"]["differences"])
    if n == 1:
        return one_seed_verdict(results, compared, info, floor, unit)
    groups = {}
    for name, r in compared.items():
        p, said = r["paired"], verdict(r["paired"], floor)
        groups.setdefault(VERDICT_GROUPS[said.split()[0]], []).append(
            f"{label(name)} ({p['mean']:+.3f} {fmt_interval(p)}, lower on "
            f"{p['wins']} of {p['n']}" + (f"; by chance alone 1 in {1 / p['p_lower']:.0f}"
                                          if p["wins"] * 2 > p["n"] else "") + ")")
    said = [", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]
            + (" is " if len(names) == 1 else " are ") + what for what, names in groups.items()]
    return (f"**Verdict on {plural(n, 'seed')} at {info.get('steps', '?')} steps:** each "
            f"variant's final val loss minus vanilla's on the same seed (nats per {unit}), its "
            f"mean and 95% interval: " + "; ".join(said) + ". Beyond noise means the interval "
            "excludes 0 and the mean is larger than rounding alone moves a run; the count of "
            "seeds lower is said, but decides nothing (another CPU's rounding can turn one "
            "seed's sign)." + ("" if floor is None else
                               f" Rounding alone (vanilla trained again from starting weights "
                               f"nudged one float32 step: the same run, rounded as another CPU "
                               f"would) moved the final loss by up to {floor:.4f} over "
                               f"{plural(floor_runs, 'seed')}."))


def one_seed_verdict(results, compared, info, floor, unit):
    """One seed: each difference with where it fell on the calibration's other seeds, what held
    on every seed, and what rounding alone did (what another CPU does); no claim beyond those."""
    cal = info.get("calibration") or {}
    n_cal = len(cal.get("seeds") or [])
    lines = [f"**Verdict: one seed ({info['seeds'][0]}), so each difference is one draw.** Each "
             f"variant's final val loss minus vanilla's on this seed (nats per {unit})" + (
                 f", and the lowest and highest the same difference reached on {n_cal} other "
                 f"seeds ({cal['folder']}): another seed lands inside such a range "
                 f"{n_cal - 1} times in {n_cal + 1} (it is as likely to fall below, above or "
                 f"between any two of them).\n" if n_cal else ":\n")]
    held, unsettled = [], []
    for name, r in compared.items():
        d, words = r["paired"]["mean"], label(name)
        if r.get("band_source") == "seeds":
            lo, hi = r["band"]
            lines.append(f"- {words}: {d:+.3f}; on the other seeds {lo:+.3f} to {hi:+.3f}" + (
                "" if lo <= d <= hi else f": **this seed's difference is outside the other "
                f"{n_cal} seeds' range: one seed is one draw**"))
            shown = held_on_every_seed(r, results["vanilla"])
            held += [f"{words}: " + " and ".join(shown)] if shown else []
            unsettled += [words] if lo <= 0 <= hi else []
        else:
            lines.append(f"- {words}: {d:+.3f}; no other seeds of this setting to show beside it"
                         f" (another seed can move it much further than rounding does)")
    for name, why in (cal.get("unused") or {}).items():
        lines.append(f"- the calibration has none for {label(name)}: {why}")
    base = results["vanilla"]["kv_cache_bytes_per_token"]
    cache = [f"{label(name)}'s KV cache: {r['kv_cache_bytes_per_token']:,} bytes per token "
             f"against vanilla's {base:,} ({Fraction(r['kv_cache_bytes_per_token'], base)}, exact)"
             for name, r in compared.items() if r["kv_cache_bytes_per_token"] != base]
    if n_cal:  # (held needs the calibration: it is empty without one)
        lines.append(f"\nWhat held on all {n_cal + 1} seeds at {info.get('steps', 'these')} "
                     f"steps (another may still differ; the early plateau: the first steps, until "
                     f"the val loss falls below {info.get('escape_loss', 0):g}): "
                     + ("; ".join(held) or "nothing about the loss") + "." + (
                         f" The final loss of {', '.join(unsettled)} is not settled at this "
                         f"length: lower on some seeds, higher on others." if unsettled else ""))
        where = ", ".join(cal.get("machines") or [])
        lines.append(f"\nThe calibration's runs trained on {where}; this seed on " + (
            "the same kind of CPU" if where == info["hardware"] else info["hardware"]) + ". "
            "Another kind rounds otherwise: its digits differ, by about what rounding alone does.")
    if cache:
        lines.append("\nWhat holds on any seed: " + "; ".join(cache) + ".")
    if floor is not None:
        sizes = " and ".join(f"{abs(r['paired']['mean']):.3f}" for r in compared.values())
        others = [abs(x) for x in cal.get("floor") or []]
        lines.append(f"\nRounding alone: vanilla trained again from starting weights nudged one "
                     f"float32 step (one draw, this seed) ended {floor:.4f} away from vanilla, "
                     f"against the differences of {sizes} above" + (
                         f"; on {plural(len(others), 'other seed')} of the calibration it moved "
                         f"vanilla by {min(others):.3f} to {max(others):.3f}, so this one draw "
                         "does not tell its size" if others else "") + ". That is what another "
                     "CPU or thread count does to a run" + (
                         "; another seed does more (the ranges above)." if n_cal else
                         ". It is the only band here; another seed moves a difference much "
                         "further (--calibration, or --seeds=1337,1338,1339 for an interval)."))
    return "\n".join(lines)


def search_table(search, seeds):
    """The lr search as markdown: mean loss per lr, the best, bracketed, the good range."""
    lrs = sorted({lr for by_lr in search.values() for lr in by_lr})
    md = [f"\n## Learning-rate search (seeds {seeds}, never the reported ones)\n",
          "Mean final val loss over the search seeds at each peak lr (min_lr follows; "
          "inf = diverged). Best in bold; good range = the lrs within 0.02 of the best.\n",
          "| variant | " + " | ".join(f"{lr:g}" for lr in lrs) +
          " | best lr | bracketed | good range | loss at 2x best |", "|---" * (len(lrs) + 5) + "|"]
    for name, by_lr in search.items():
        means = {lr: float(np.mean(v)) for lr, v in by_lr.items()}
        best = min(means, key=means.get)
        spread = lr_range(means)
        double = spread["loss_at_double"]
        cells = [("-" if lr not in means else f"**{means[lr]:.4f}**" if lr == best
                  else f"{means[lr]:.4f}") for lr in lrs]
        md.append(f"| {name} | " + " | ".join(cells) + f" | {best:g} | "
                  f"{'yes' if bracketed(means) else 'NO (grid capped)'} | "
                  f"{spread['good_lrs'][0]:g} - {spread['good_lrs'][1]:g} | " +
                  ("not measured" if double is None else f"{double:.4f}") + " |")
    return md


def lr_said(info, search):
    """Which peak learning rate each variant trained at, and where it came from."""
    if search:
        return ("Each variant at its own best peak learning rate (" +
                ", ".join(f"{n} {lr:g}" for n, lr in info["best_lrs"].items()) +
                f"), found on the search seeds {info['tune_seeds']}; the search is below.\n")
    lrs, named = info["peak_lrs"], info.get("own_lrs", [])
    others = [n for n in lrs if n not in named]
    source = ("" if not named else " (all named by --lrs)" if not others else
              f" (named by --lrs for {', '.join(named)}; {', '.join(others)} at the preset's "
              f"learning_rate)")
    if len(set(lrs.values())) == 1:  # (each one's own, where --lrs named them all: the same)
        said = ("each one's searched best (the same for all)" if named and not others else
                "one lr for all, as in the paper's protocol")
        return (f"Every variant at the same peak learning rate, "
                f"{next(iter(lrs.values())):g}{source}: {said}.\n")
    return ("Each variant at its own peak learning rate (" +
            ", ".join(f"{n} {lr:g}" for n, lr in lrs.items()) + f"){source}.\n")


def write_tables(root, results, paper, info, search=None):
    """results.json and results.md; paper: per_mode's results at vanilla's best lr (--tune)."""
    with data.atomic_write(os.path.join(root, "results.json"), "w") as f:
        json.dump({"info": info, "modes": results, "paper_protocol": paper,
                   "vanilla_curve": vanilla_curve(results),
                   "lr_search": {n: {f"{lr:g}": v for lr, v in by_lr.items()}
                                 for n, by_lr in (search or {}).items()}}, f, indent=1)
    reused = (f" ({info['reused']} of {plural(info['runs'], 'run')} reused)" if info["reused"]
              else "")
    paired, one = "vanilla" in results, len(info["seeds"]) == 1  # vanilla: what to pair with
    head = ["variant", "params", "tokens", "val loss" if one else "val loss (mean ± std)"] + (
        [] if not paired else ["minus vanilla", "verdict"] if one else
        ["minus vanilla, per seed", "mean", "95% interval", "lower on", "verdict"])
    md = ["# Value residual comparison\n"] + ([headline(results, info), ""] if paired else []) + [
          f"`{info['command']}` — {info['hardware']}, {plural(info['jobs'], 'run')} side "
          f"by side, {plural(info.get('threads', 1), 'thread')} each, "
          f"{info['wall_min']:.1f} min{reused}{trained_on(info)}\n" + (
              "\n**Runs of other code were reused (--reuse_other_code): another version of the "
              "code trained them, so these numbers may not be what today's code computes.**\n"
              if info.get("other_code") else ""), lr_said(info, search),
          f"Final val loss = the whole validation split, every token once. Seeds {info['seeds']}: "
          "same seed = the same batches in every mode" + (", and the same initial values for "
          "every tensor a mode shares with vanilla." if paired else ".") +
          ("" if one or not paired else " Interval = 95% Student t over the seeds (n-1 df).")
          + "\n", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, r in results.items():
        p = r.get("paired")
        said = ("the noise floor: rounding alone" if name == FLOOR else one_seed_cell(r)
                if r.get("band_source") == "seeds" and one else p and verdict(
                    p, noise_floor(results)))
        cells = ([] if not paired else ["-"] * (len(head) - 4) if not p else
                 [f"{p['mean']:+.4f}", said] if one else
                 [", ".join(f"{d:+.4f}" for d in p["differences"]), f"{p['mean']:+.4f}",
                  fmt_interval(p), "-" if name == FLOOR else f"{p['wins']} of {p['n']}", said])
        md.append(f"| {named(name)} | {r['num_params'] / 1e6:.3f}M | "
                  f"{r['total_tokens'] / 1e6:.2f}M | "
                  f"{fmt_mean(r['val_loss_mean'], r['val_loss_std'], len(r['seeds']))} |" +
                  "".join(f" {c} |" for c in cells))
    if paired:
        md.append("\nIn-run crossing, the paper's \"less data\" reading taken inside each run: "
                  "the share of vanilla's tokens at which a variant's val loss on a few fixed "
                  "batches first reached vanilla's final one, per seed (never: it did not).\n")
        total = results["vanilla"]["total_tokens"]
        for name, r in results.items():
            if r.get("crossing_tokens") and name != FLOOR:
                shares = [None if c is None else c / total for c in r["crossing_tokens"]]
                shown = ", ".join("never" if c is None else f"{c:.0%}" for c in shares)
                if len(shares) > 1 and None not in shares:  # the data it needs, over the seeds
                    stats = paired_stats(shares)
                    shown += (f": mean {stats['mean']:.0%} [{stats['interval'][0]:.0%}, "
                              f"{stats['interval'][1]:.0%}] of vanilla's tokens")
                md.append(f"- {label(name)}: {shown}")
    md += ["\n## What each variant costs\n",
           "Parameters (position embeddings left out), those one token uses (a table counts one "
           "row), training FLOPs per token (6 x the matmul parameters + attention), the KV cache, "
           "and each run's tokens a second while it shared the cores with the others: not a "
           "speed test (bench.py times the modes side by side in one process).\n",
           "| variant | total params | active params / token | FLOPs / token | KV cache B/token "
           "| train tokens/s (sharing the cores) |", "|---|---|---|---|---|---|"]
    variants = {n: r for n, r in results.items() if n != FLOOR}  # the floor is vanilla again
    for n, r in variants.items():
        speed = f"{r['tokens_per_sec']:,.0f}" if np.isfinite(r["tokens_per_sec"]) else "-"
        active, flops = r.get("active_params"), r.get("flops_per_token")
        md.append(f"| {label(n)} | {r['num_params']:,} | "
                  f"{'-' if active is None else f'{active:,}'} | "
                  f"{'-' if flops is None else f'{flops / 1e6:.2f}M'} | "
                  f"{r['kv_cache_bytes_per_token']:,} | {speed} |")
    md += curve_table(vanilla_curve(results), results)
    for key, title in (("attention_entropy", "Attention entropy per layer (the paper's measure of "
                        "concentration, nats: higher = attention spread over more tokens)"),
                       ("similarity", "Token similarity per layer (the paper's measure of "
                        "over-smoothing, mean pairwise cosine: higher = tokens more alike)")):
        md += [f"\n## {title}\n", "| layer | " + " | ".join(map(label, variants)) + " |",
               "|---" * (len(variants) + 1) + "|"]
        for layer in range(max(len(r[key]) for r in variants.values())):
            cells = [fmt_mean(r[key][layer], r[key + "_std"][layer], len(r["seeds"]))
                     if layer < len(r[key]) else "-" for r in variants.values()]
            md.append(f"| {layer + 1} | " + " | ".join(cells) + " |")
    for name, r in variants.items():  # learned mixing weights, e.g. ResFormer's lambdas
        for kind, by_layer in mixing_by_layer(r.get("mixing", {})).items():
            width = max(len(v) for v in by_layer.values())
            heads = (["λ1", "λ2"] if kind == "value_lambdas" else
                     [kind] if width == 1 else [f"{kind}[{i}]" for i in range(width)])
            md += [f"\n## Learned {kind} of {label(name)}, by layer (mean over seeds)\n",
                   "| layer | " + " | ".join(heads) + " |", "|---" * (width + 1) + "|"]
            md += [f"| {layer} | " + " | ".join(f"{x:.3f}" for x in v) + " |"
                   for layer, v in sorted(by_layer.items())]
    if search:
        md += search_table(search, info["tune_seeds"])
    if paper and "vanilla" in paper:
        md += ["\n## The paper's protocol: every variant at vanilla's best learning rate\n",
               "| variant | vanilla val loss | variant val loss | mean diff | 95% interval "
               "| lower on |", "|---|---|---|---|---|---|"]
        md += [f"| {label(name)} | {paper['vanilla']['val_loss_mean']:.4f} | "
               f"{r['val_loss_mean']:.4f} | {r['paired']['mean']:+.4f} | "
               f"{fmt_interval(r['paired'])} | {r['paired']['wins']} of {r['paired']['n']} |"
               for name, r in paper.items() if "paired" in r]
    with data.atomic_write(os.path.join(root, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def one_seed_cell(r):
    """A one-seed row's verdict in the calibration's terms (the rounding floor decides nothing)."""
    (lo, hi), d, n = r["band"], r["paired"]["mean"], len(r["band_seeds"])
    return (f"inside the other {n} seeds' range" if lo <= d <= hi else
            f"outside the other {n} seeds' range: one seed is one draw")


def trained_on(info):
    """'' when every run trained on the machine that writes the table; else where each did."""
    machines = info.get("trained_on", {})
    return "" if set(machines) <= {info["hardware"]} else (
        "; the runs trained on " + ", ".join(f"{m} ({plural(n, 'run')})"
                                             for m, n in sorted(machines.items()))
        + " (a run's numbers hold on the machine that printed them)")


def slope_interval(curve):
    return ("one seed: no interval" if curve["slope_interval"] is None
            else "slope 95% interval [{:+.4f}, {:+.4f}]".format(*curve["slope_interval"]))


def curve_table(curve, results=None):
    """The paper's measure: each variant placed on vanilla's loss-against-size line."""
    if not curve:
        return []
    (a, b), sizes = curve["line"], curve["sizes"]
    if curve["poor"]:  # the points, not a number read off a line they do not follow
        return poor_curve_table(curve, results)
    md = ["\n## Matches a vanilla model X% larger (the paper's measure)\n",
          f"Vanilla at {len(sizes)} sizes ({', '.join(f'{n} {p:,}' for n, p in sizes.items())} "
          f"parameters), seeds {curve['seeds']}: the line loss = {a:.4f} {b:+.4f} ln(params) "
          f"({slope_interval(curve)}, the sizes' means off it by {curve['residual']:.4f} rms, R² "
          f"{curve['r2']:.2f}). Each variant's mean final loss read off it: the vanilla size with "
          f"that loss, X% more than the variant's total parameters. Interval: the seeds "
          f"resampled, the line refitted; per seed: each seed's own line and run.\n"]
    if curve["vanilla_reading"] is not None:
        md.append(f"The line misses vanilla's own point: read off it, vanilla itself "
                  f"({sizes['vanilla']:,} parameters) comes out "
                  f"{100 * curve['vanilla_reading']:+.1f}% larger. Compare each variant's "
                  f"reading with this one, not with 0.\n")
    if factor := curve["floor_factor"]:
        md.append(f"Rounding alone moved a final loss by up to {curve['floor']:.4f} (the noise "
                  f"floor): on this line that is a vanilla model {100 * (factor - 1):.0f}% "
                  f"larger or {100 * (1 - 1 / factor):.0f}% smaller, so a variant read within "
                  f"that is not a result.\n")
    md += ["| variant | its params | matches vanilla of | X% larger | 95% interval | per seed | "
           "within the sizes measured |" + (" beyond the rounding floor |" if factor else ""),
           "|---|---|---|---|---|---|---|" + ("---|" if factor else "")]
    for name, p in curve["placed"].items():
        if p["larger"] is None:
            md.append(f"| {label(name)} | {p['num_params']:,} | - | - | - | - | the line does "
                      f"not fall |")
            continue
        interval = ("-" if p["interval"] is None else
                    f"[{100 * p['interval'][0]:+.1f}%, {100 * p['interval'][1]:+.1f}%]")
        per_seed = ", ".join("-" if x is None else f"{100 * x:+.0f}%" for x in p["per_seed"])
        md.append(f"| {label(name)} | {p['num_params']:,} | {p['matched_params']:,.0f} | "
                  f"{100 * p['larger']:+.1f}% | {interval} | {per_seed} | "
                  f"{'yes' if p['inside'] else 'no: extrapolated'} |" +
                  ((" no: not a result |" if p["within_floor"] else " yes |") if factor else ""))
    return md


def poor_curve_table(curve, results):
    """Vanilla's sizes off one line: no X% read off, but every run of the measure on one ladder,
    lowest mean loss first (which sizes a variant lies between), and the line, for the record."""
    (a, b), seeds = curve["line"], curve["seeds"]
    md = ["\n## Matches a vanilla model X% larger (the paper's measure): not read off\n",
          f"Vanilla's mean final loss does not follow one line in ln(params) (R² "
          f"{curve['r2']:.2f}; a larger model should be lower), seeds {seeds}: the points instead "
          f"of a reading. The line through them would be loss = {a:.4f} {b:+.4f} ln(params) "
          f"({slope_interval(curve)}, the sizes' means off it by {curve['residual']:.4f} rms)."]
    if f := curve["floor_factor"]:
        md[-1] += (f" Rounding alone moved a final loss by up to {curve['floor']:.4f}: on that "
                   f"line, a vanilla model {100 * (f - 1):.0f}% larger or "
                   f"{100 * (1 - 1 / f):.0f}% smaller.")
    md += ["\nEvery run of the measure, lowest mean final loss first (vanilla's sizes in bold):\n",
           "| run | params | mean val loss | per seed |", "|---|---|---|---|"]
    losses = {n: [results[n]["val_loss"][results[n]["seeds"].index(s)] for s in seeds]
              for n in [*curve["sizes"], *curve["placed"]]}
    for name in sorted(losses, key=lambda n: np.mean(losses[n])):
        shown = f"**{label(name)}**" if name in curve["sizes"] else label(name)
        md.append(f"| {shown} | {results[name]['num_params']:,} | {np.mean(losses[name]):.4f} | "
                  + ", ".join(f"{x:.4f}" for x in losses[name]) + " |")
    return md
