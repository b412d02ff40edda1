"""The measures compare.py reports, each small enough to check by hand (test_compare.py does):
paired statistics over seeds, the in-run crossing, the parameter saving read off loss against
model size, the lr search's rules, and the paper's attention entropy and token similarity."""
import math

import numpy as np
import torch
import torch.nn.functional as F

from model import KVCache


# ---- statistics ----

# Student t quantiles t_{0.975, df}, df = 1..30 (standard tables); beyond, a series in 1/df.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def plural(n, noun):  # '1 seed', '1,200 steps'
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def t975(df):
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion of t around the normal quantile
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def paired_stats(differences):
    """Mean of per-seed differences (variant - vanilla), 95% t interval (n-1 df), wins (< 0), and
    the sign test: how often coin tosses give as many seeds lower (p_lower) or higher (p_higher)."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    out = {"n": n, "differences": d.tolist(), "mean": float(d.mean()), "wins": int((d < 0).sum())}
    tail = lambda k: sum(math.comb(n, j) for j in range(k, n + 1)) / 2 ** n  # noqa: E731
    out.update(p_lower=tail(out["wins"]), p_higher=tail(int((d > 0).sum())))
    half = t975(n - 1) * d.std(ddof=1) / math.sqrt(n) if n >= 2 else None
    out["interval"] = [out["mean"] - half, out["mean"] + half] if n >= 2 else None
    return out


# Vanilla again with each initial weight moved one float32 rounding step (train.py --nudge): the
# same seed, the same batches, only the rounding changed. Its difference to vanilla is how far
# rounding alone moves a run (another CPU or thread count does as much): the noise floor.
FLOOR = "vanilla:nudge=1"


def noise_floor(results):
    """The largest |nudged - vanilla| final loss over the floor's seeds; None without it."""
    p = results.get(FLOOR, {}).get("paired")
    return max(abs(d) for d in p["differences"]) if p else None


def bands(results, calibration=None):
    """Each variant's band at the end: where its difference to vanilla falls on other draws. The
    lowest to highest of its 2+ seeds, or of a one-seed run's calibration seeds ("seeds"); else
    the difference give or take what rounding alone did ("rounding"), or none without the floor."""
    floor = noise_floor(results)
    for name, r in results.items():
        p = r.get("paired")
        if not p or name == FLOOR:
            continue
        own = (calibration or {}).get("modes", {}).get(name)
        if p["n"] > 1 or own:
            spread = p["differences"] if p["n"] > 1 else own["final"]
            r.update(band=[min(spread), max(spread)], band_source="seeds",
                     band_seeds=r["seeds"] if p["n"] > 1 else calibration["seeds"])
            if p["n"] == 1:
                r["calibration"] = own
        elif floor is not None:
            r.update(band=[p["mean"] - floor, p["mean"] + floor], band_source="rounding")


def held_on_every_seed(r, base):
    """What a one-seed variant shows that its calibration seeds all show too (lists of words):
    a final loss on one side of vanilla's, leaving the early plateau no later than vanilla."""
    own, held = r.get("calibration"), []
    if not own:
        return held
    finals = own["final"] + [r["paired"]["mean"]]
    side = "lower" if max(finals) < 0 else "higher" if min(finals) > 0 else None
    if side:
        held.append(f"a final loss {side} than vanilla's")
    if own.get("escape") and r.get("escape") and base.get("escape"):
        # A run that never left the plateau counts as later than any run that did.
        pairs = [(a[0] if a else math.inf, b[0] if b else math.inf)
                 for a, b in [*own["escape"], (r["escape"][0], base["escape"][0])]]
        sooner = sum(a < b for a, b in pairs)
        if sooner and all(a <= b for a, b in pairs):
            held.append(f"leaving the early plateau no later than vanilla (sooner on {sooner} "
                        f"of {len(pairs)})")
    return held


def verdict(stats, floor=None):
    """One computed sentence: beyond noise only when the mean exceeds the rounding floor, prints
    as more than +0.000 (a floor of 0, or none, must not make a level mean a result) and the 95%
    t interval excludes 0. The sign count decides nothing: on 8 seeds another CPU's rounding can
    turn one seed's sign, moving the sign test from 1 in 28 to 1 in 7 (seed 1342, 2026-12-06)."""
    within = floor is not None and abs(stats["mean"]) <= floor
    if stats["interval"] is None:
        return "one seed: no interval" + (", within the rounding floor" if within else "")
    if within:
        return f"within the rounding floor (±{floor:.4f}): not a result"
    if round(stats["mean"], 3) == 0:
        return f"level with vanilla ({stats['mean']:+.3f}): not a result"
    lo, hi = stats["interval"]
    if hi < 0 or lo > 0:
        side = "below" if hi < 0 else "above"
        return f"{side} vanilla, beyond noise (the 95% interval excludes 0; {signs(stats)})"
    # Most seeds on one side, yet the interval holds 0: both are true, said in one clause.
    most = 2 * max(stats["wins"], sum(d > 0 for d in stats["differences"])) > stats["n"]
    return (f"not distinguishable from vanilla ({signs(stats)}, but by amounts too uneven for the "
            f"95% interval to exclude 0)" if most else "not distinguishable from vanilla (the 95% "
            f"interval includes 0; {signs(stats)})")


def signs(stats):
    """'lower on 7 of 8 seeds: chance alone, 1 in 28': most seeds' side, and its sign test."""
    higher = sum(d > 0 for d in stats["differences"])
    side, k, p = (("lower", stats["wins"], stats["p_lower"]) if stats["wins"] >= higher else
                  ("higher", higher, stats["p_higher"]))
    return f"{side} on {k} of {stats['n']} seeds: chance alone, 1 in {1 / p:.0f}"


def crossing(tokens, losses, target):
    """Tokens at which a loss curve first reaches target, linearly interpolated; None if never."""
    for i, (t, loss) in enumerate(zip(tokens, losses)):
        if loss <= target:
            if i == 0:
                return float(t)
            t0, l0 = tokens[i - 1], losses[i - 1]
            return float(t0 + (l0 - target) / (l0 - loss) * (t - t0))
    return None


def escape(evals, threshold):
    """(step, tokens) of the first evaluation below threshold (off the early plateau), or None."""
    return next(([e["iter"], e["tokens"]] for e in evals if e["val_loss"] < threshold), None)


# ---- fewer parameters: loss against model size (the paper's measure) ----

def vanilla_curve(results):
    """The paper's "matches a vanilla model X% larger": a line loss = a + b ln N through the final
    losses of vanilla at 3+ sizes (vanilla:<size settings>, shared seeds; else None), each other
    variant placed at the N_eq where the line meets its mean loss, X = N_eq / N - 1 of its total
    parameters. Interval: the seeds bootstrapped (fixed RNG), the line refitted; 'inside': N_eq
    within the sizes measured; 'floor_factor': the size ratio the noise floor is worth on the
    line, a reading within it ('within_floor') no result."""
    sizes = {n: r for n, r in results.items() if is_vanilla_size(n)}
    if len({r["num_params"] for r in sizes.values()}) < 3:
        return None
    seeds = sorted(set.intersection(*(set(r["seeds"]) for r in sizes.values())))
    if not seeds:
        return None
    params = np.log([r["num_params"] for r in sizes.values()])
    losses = np.array([[r["val_loss"][r["seeds"].index(s)] for s in seeds]
                       for r in sizes.values()])  # [size][seed]

    def fit(cols):
        b, a = np.polyfit(params, losses[:, cols].mean(axis=1), 1)
        return a, b

    def larger(r, cols, line):
        a, b = line
        mine = np.mean([r["val_loss"][r["seeds"].index(seeds[c])] for c in cols])
        return math.exp((mine - a) / b) / r["num_params"] - 1 if b < 0 else None

    # one seed gives a line and a reading but no interval: nothing to resample
    rng, every = np.random.default_rng(0), list(range(len(seeds)))
    draws = [list(rng.integers(0, len(seeds), len(seeds)))
             for _ in range(2000 if len(seeds) > 1 else 0)]
    lines = [fit(cols) for cols in draws]
    a, b = fit(every)
    # Rounding alone moves a final loss by up to `floor`; along the line that is a factor of
    # exp(floor / |b|) in size, so a reading closer than that to vanilla's own size is noise.
    floor = noise_floor(results)
    floor_factor = math.exp(floor / -b) if floor is not None and b < 0 else None
    placed = {}
    for name, r in results.items():
        if name in sizes or name == FLOOR or not set(seeds) <= set(r["seeds"]):
            continue
        x = larger(r, every, (a, b))
        boot = sorted(v for v in (larger(r, c, line) for c, line in zip(draws, lines))
                      if v is not None)
        n_eq = r["num_params"] * (1 + x) if x is not None else None
        placed[name] = {"num_params": r["num_params"], "larger": x,
                        # each seed alone: its own line, its own run read off it (one lucky
                        # seed shows here, whatever the mean)
                        "per_seed": [larger(r, [c], fit([c])) for c in every],
                        "interval": ([boot[50], boot[1949]] if len(boot) == 2000 else None),
                        "matched_params": n_eq, "inside": n_eq is not None
                        and math.exp(params.min()) <= n_eq <= math.exp(params.max()),
                        "within_floor": floor_factor is not None and x is not None
                        and 1 / floor_factor <= 1 + x <= floor_factor}
    # Vanilla's own preset point read off the same line: where the line misses it, every variant
    # near vanilla's loss inherits that miss, so a reading compares with this one, not with 0.
    own = larger(sizes["vanilla"], every, (a, b)) if "vanilla" in sizes else None
    means = losses.mean(axis=1)
    off = means - (a + b * params)  # each size's mean off the line
    r2 = 1 - np.sum(off ** 2) / max(np.sum((means - means.mean()) ** 2), 1e-30)
    return {"sizes": {n: r["num_params"] for n, r in sizes.items()}, "seeds": seeds,
            "line": [float(a), float(b)], "residual": float(np.std(off)),
            "points": {n: float(m) for n, m in zip(sizes, means)}, "r2": float(r2),
            # a line read off where the points do not lie on one tells nothing: say so instead
            "poor": bool(r2 < 0.9 or np.any(np.diff(means[np.argsort(params)]) >= 0)),
            "placed": placed, "floor": floor, "floor_factor": floor_factor, "vanilla_reading": own,
            "slope_interval": sorted(line[1] for line in lines)[50::1899][:2] or None}


def is_vanilla_size(name):
    """'vanilla', or vanilla with only its size changed ('vanilla:n_embd=48:n_layer=8')."""
    base, *settings = name.split(":")
    return base == "vanilla" and all(s.partition("=")[0] in ("n_embd", "n_layer", "n_head")
                                     for s in settings)


# ---- the learning-rate search ----

FINEST_LR_STEP = math.sqrt(2)  # neighbours of the best learning rate are at most this far apart


def round_lr(lr):
    """3 significant digits: grid points computed two ways (x1.414 up, /1.414 down) agree."""
    return float(f"{lr:.3g}")


def next_lr(mean_loss, lowest, highest):
    """The learning rate to try next so the best one is bracketed, or None when it is. mean_loss:
    {lr: mean final loss over the search seeds}, inf if diverged. The best lr needs a worse
    neighbour each side, at most FINEST_LR_STEP away: an edge optimum extends the grid by the edge's
    step (never past the cap lowest/highest), a coarse step next to it gets its midpoint; last, the
    grid reaches twice the best lr, so how fast a variant degrades above its optimum is measured."""
    lrs = sorted(mean_loss)
    i = min(range(len(lrs)), key=lambda j: (mean_loss[lrs[j]], j))
    below, above = lrs[0] ** 2 / lrs[1], lrs[-1] ** 2 / lrs[-2]  # one edge step further out
    if i == 0:
        return round_lr(below) if below >= lowest * 0.999 else None
    if i == len(lrs) - 1:
        return round_lr(above) if above <= highest * 1.001 else None
    for j in (i - 1, i + 1):
        if max(lrs[i], lrs[j]) / min(lrs[i], lrs[j]) > FINEST_LR_STEP * 1.01:
            return round_lr(math.sqrt(lrs[i] * lrs[j]))
    short = lrs[-1] < 2 * lrs[i] * 0.99 and math.isfinite(mean_loss[lrs[-1]])  # short of 2x
    return round_lr(above) if short and above <= highest * 1.001 else None


def bracketed(mean_loss):
    """True when the best lr has a neighbour on each side (and so a worse one on each side)."""
    lrs = sorted(mean_loss)
    best = min(lrs, key=lambda lr: mean_loss[lr])
    return 0 < lrs.index(best) < len(lrs) - 1


def lr_range(mean_loss, within=0.02):
    """How forgiving a variant is: (lowest, highest) lr whose mean loss is within `within` of
    the best, and the loss at twice the best lr (log-lr interpolation; None off the grid)."""
    lrs = sorted(lr for lr in mean_loss if math.isfinite(mean_loss[lr]))
    best = min(lrs, key=lambda lr: mean_loss[lr])
    good = [lr for lr in lrs if mean_loss[lr] <= mean_loss[best] + within]
    at_double, target = None, math.log(2 * best)
    everything = sorted(mean_loss)
    for lo, hi in zip(everything, everything[1:]):
        if math.log(lo) - 1e-3 <= target <= math.log(hi) + 1e-3:
            w = (target - math.log(lo)) / (math.log(hi) - math.log(lo))
            at_double = (mean_loss[lo] if w < 0.01 else mean_loss[hi] if w > 0.99
                         else (1 - w) * mean_loss[lo] + w * mean_loss[hi])  # inf: it diverged
            break
    return {"good_lrs": [good[0], good[-1]], "loss_at_double": at_double}


# ---- what a variant costs: parameters, FLOPs, the KV cache ----

def sizes(model, seq_len):
    """Parameters, those a token uses (a table counts one row), FLOPs and KV cache bytes a token."""
    tables = [m for name, m in model.named_modules() if isinstance(m, torch.nn.Embedding)
              and name not in ("transformer.wte", "transformer.wpe")]
    total = model.num_params()
    return {"num_params": total,
            "active_params": total - sum(m.weight.numel() - m.embedding_dim for m in tables),
            "flops_per_token": model.flops_per_token(seq_len),
            "kv_cache_bytes_per_token": KVCache(model.config, 1, 1, "cpu", torch.float32).nbytes()}


# ---- the two analysis measures (the paper's official definitions) ----

def attention_entropy(att):
    """att (B, n_head, T, T) -> mean over samples of the entropy (nats) of the attention each key
    receives: heads averaged, summed over queries, normalised over keys (few keys: low entropy)."""
    received = att.float().mean(dim=1).sum(dim=1)  # (B, T_keys)
    p = received / received.sum(dim=-1, keepdim=True)
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(dim=-1)  # 0 * log 0 counts as 0
    return entropy.mean().item()


def token_similarity(hidden):
    """hidden (B, T, C) -> mean cosine similarity over pairs of distinct tokens and samples."""
    h = torch.nn.functional.normalize(hidden.float(), dim=-1)
    sims = h @ h.transpose(1, 2)  # (B, T, T)
    T = h.size(1)
    off_diagonal = ((sims.sum(dim=(1, 2)) - sims.diagonal(dim1=1, dim2=2).sum(dim=-1))
                    / (T * (T - 1)))
    return off_diagonal.mean().item()


@torch.no_grad()
def internals(model, x):
    """Per layer: attention weights (B, n_head, T, T), recorded from scaled_dot_product_attention's
    own q and k (right under RoPE or QK-norm), and block outputs (B, T, C) for tokens x."""
    attention, hidden, sdpa = [], [], F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, **kw):
        keys = k.repeat_interleave(q.size(1) // k.size(1), dim=1)  # grouped-query attention
        scores = q @ keys.transpose(-2, -1) * (scale or 1 / math.sqrt(q.size(-1)))
        if is_causal:
            causal = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                      else scores + attn_mask)
        attention.append(scores.softmax(dim=-1))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa, **kw)

    hooks = [block.register_forward_hook(lambda block, args, output: hidden.append(output[0]))
             for block in model.transformer.h]
    F.scaled_dot_product_attention = recording
    try:
        model.hidden_states(x)
    finally:
        F.scaled_dot_product_attention = sdpa
        for hook in hooks:
            hook.remove()
    return attention, hidden


@torch.no_grad()
def analyse(model, windows, batch=8):
    """Per-layer attention entropy and token similarity on fixed held-out windows."""
    n_layer = model.config.n_layer
    entropy, similarity = np.zeros(n_layer), np.zeros(n_layer)
    for i in range(0, len(windows), batch):
        x = windows[i:i + batch]
        attention, hidden = internals(model, x)
        for layer in range(n_layer):  # weight each chunk by its size: a mean over all samples
            entropy[layer] += attention_entropy(attention[layer]) * len(x)
            similarity[layer] += token_similarity(hidden[layer]) * len(x)
    return {"attention_entropy": (entropy / len(windows)).tolist(),
            "similarity": (similarity / len(windows)).tolist()}


# Cached against recomputed float32 logits differ by rounding alone (1e-7 to 1e-5); a wrong cache,
# even in a freshly drawn model whose attention barely matters, is off by 1e-3 or more.
LOGIT_TOLERANCE = 1e-4


@torch.no_grad()
def decoded_logits(model, seq, prompt_len, use_cache, dtype=torch.float32):
    """The logits generate() computes along seq, teacher-forced: the next token's after prompt_len
    tokens, then after each one more, with the cache (refilled once full) or without. Under autocast
    to dtype; float32 exact (TF32 off)."""
    T, steps = model.config.block_size, []
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.autocast(seq.device.type, dtype=dtype, enabled=dtype != torch.float32):
            cache = model.new_kv_cache(seq.size(0), dtype=dtype) if use_cache else None
            for end in range(prompt_len, seq.size(1) + 1):
                if cache is not None and 0 < cache.length < T:
                    fed = seq[:, end - 1:end]
                else:  # the first step, or a full cache: the last block_size tokens anew
                    fed = seq[:, max(end - T, 0):end]
                    if cache is not None:
                        cache.length = 0
                steps.append(model(fed, kv_cache=cache)[0].float())
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return torch.cat(steps, dim=1)


def cache_logit_error(model, seq, prompt_len, dtype=torch.float32):
    """Largest |difference| between cached and uncached decoding's logits along seq (see
    decoded_logits): in float32 rounding alone parts them. In bf16 other kernels' rounding can
    flip a near-tie in greedy decoding, so equal tokens are no test there."""
    return (decoded_logits(model, seq, prompt_len, True, dtype)
            - decoded_logits(model, seq, prompt_len, False, dtype)).abs().max().item()
