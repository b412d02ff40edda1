"""
The measures compare.py reports, each small enough to check by hand (test_compare.py does):
paired statistics over seeds, the in-run crossing, and the paper's two analysis measures
(attention entropy, token similarity) with the forward hooks that collect what they need.
"""
import math

import numpy as np
import torch


# ---- statistics ----

# Student t quantiles t_{0.975, df}, df = 1..30 (standard tables); beyond, a series in 1/df.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df):
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion of t around the normal quantile
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def paired_stats(differences):
    """Mean of per-seed differences (variant - vanilla), 95% t interval (n-1 df), wins (< 0)."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    out = {"n": n, "differences": d.tolist(), "mean": float(d.mean()), "wins": int((d < 0).sum())}
    if n >= 2:
        half = t975(n - 1) * d.std(ddof=1) / math.sqrt(n)
        out["interval"] = [out["mean"] - half, out["mean"] + half]
    else:
        out["interval"] = None
    return out


def verdict(stats):
    """One computed sentence: beyond noise only when the 95% interval excludes 0."""
    if stats["interval"] is None:
        return "one seed: no interval"
    lo, hi = stats["interval"]
    if hi < 0:
        return "below vanilla, beyond noise (the 95% interval excludes 0)"
    if lo > 0:
        return "above vanilla, beyond noise (the 95% interval excludes 0)"
    return "not distinguishable from vanilla (the 95% interval includes 0)"


def crossing(tokens, losses, target):
    """Tokens at which a loss curve first reaches target, linearly interpolated; None if never."""
    for i, (t, loss) in enumerate(zip(tokens, losses)):
        if loss <= target:
            if i == 0:
                return float(t)
            t0, l0 = tokens[i - 1], losses[i - 1]
            return float(t0 + (l0 - target) / (l0 - loss) * (t - t0))
    return None


# ---- the two analysis measures (the paper's official definitions) ----

def attention_entropy(att):
    """att (B, n_head, T, T) -> mean over samples of the entropy (nats) of the attention
    each key receives.

    Heads are averaged to one [T, T] map, summed over queries (column sums: how much attention each
    key gets), normalised to a distribution over keys. Concentration on a few keys -> low entropy.
    """
    received = att.float().mean(dim=1).sum(dim=1)  # (B, T_keys)
    p = received / received.sum(dim=-1, keepdim=True)
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(dim=-1)  # 0 * log 0 counts as 0
    return entropy.mean().item()


def token_similarity(hidden):
    """hidden (B, T, C) -> mean cosine similarity over all pairs of distinct tokens,
    mean over samples."""
    h = torch.nn.functional.normalize(hidden.float(), dim=-1)
    sims = h @ h.transpose(1, 2)  # (B, T, T)
    T = h.size(1)
    off_diagonal = ((sims.sum(dim=(1, 2)) - sims.diagonal(dim1=1, dim2=2).sum(dim=-1))
                    / (T * (T - 1)))
    return off_diagonal.mean().item()


@torch.no_grad()
def internals(model, x):
    """Per layer: attention weights (B, n_head, T, T) and block outputs (B, T, C) for tokens x,
    collected with forward hooks, so the model's forward stays the plain training path."""
    attention, hidden, hooks = [], [], []

    def on_attention(attn, args, output):  # args[0]: the block's normalised input
        q, k, _ = attn.project(args[0])
        k = k.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)
        causal = torch.ones(q.size(2), q.size(2), dtype=torch.bool, device=q.device).tril()
        attention.append(scores.masked_fill(~causal, float("-inf")).softmax(dim=-1))

    for block in model.transformer.h:
        hooks.append(block.attn.register_forward_hook(on_attention))
        hooks.append(block.register_forward_hook(
            lambda block, args, output: hidden.append(output[0])))
    try:
        model(x, all_logits=True)
    finally:
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
