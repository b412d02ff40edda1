"""
Speed and memory of model.py's value modes, side by side in one run: training step, decoding with
and without the KV cache, and the cache's bytes. Prints tables and writes everything to JSON.

    python bench.py                                       # the quickstart model, this device
    python bench.py --threads=1 --block_size=1024 --seq_len=64   # decoding up to 1024, steadier
    python bench.py config/gpt2_124m.py                   # GPT-2 124M (a GPU: bf16, MFU, memory)
    python bench.py config/gpt2_124m.py --parts=cache --dtype=bfloat16   # cache bytes, anywhere
    python bench.py --gpu_check                           # a GPU owner's first hour, checked

Tokens are random ids (speed does not depend on them, and no data needs preparing). Decoding runs
the eager model: torch.compile applies to training only (the cache would recompile every step).
"""
import json
import os
import time
from functools import partial
from types import SimpleNamespace

import torch
from torch.utils.benchmark import Measurement, Timer

import data
from configurator import ConfigError, parse_args, run_main
from lab import cards
from lab.analysis import LOGIT_TOLERANCE, cache_logit_error, plural, sizes
from lab.grid import parse_list
from model import GPT, VALUE_MODES, GPTConfig, KVCache
from train import ACTIONS, SETTINGS as TRAIN_SETTINGS, training_step

# train.py's settings a timing does not use: ignored in a preset, refused on the command line.
UNUSED = ("out_dir", "eval_interval", "log_interval", "eval_iters", "max_iters", "warmup_iters",
          "lr_decay_iters", "min_lr", "dropout", "value_mode") + ACTIONS
BENCH_SETTINGS = dict(
    seq_len=(0, "tokens per sequence in the timed training step (0 = block_size)", 0),
    vocab_size=(0, "the random tokens' vocabulary (0: 320 for a *_byte dataset, else 50,304)", 0),
    parts=("train,decode,cache", "what to measure: train, decode, cache"),
    modes=(",".join(VALUE_MODES), "value modes, side by side (model.py's VALUE_MODES)"),
    train_steps=(20, "timed training steps (the median is reported)", 1),
    accumulation=(0, "micro-steps a timed step (0: gradient_accumulation_steps, at most 4)", 0),
    warmup_steps=(3, "untimed steps first (allocation, autotuning, compilation)", 0),
    contexts=("128,512,1024", "decoding contexts (and block_size; longer: skipped)"),
    decode_tokens=(32, "new tokens per decoding measurement", 1),
    decode_batch_sizes=("1,8", "batch sizes for decoding"),
    kv_heads=("", "n_kv_head variants for the cache table (empty: n_head, n_head/2, 1)"),
    json_out=("out/bench.json", "where the full results go (empty: nowhere)"),
    threads=(0, "CPU threads for torch (0 = its default; 1 is steadier on a busy shared CPU)", 0),
    gpu_check=(False, "a GPU owner's first hour, checked (lab/gpu_check.py): 5 min on an H100"),
)
SETTINGS = {**{k: v for k, v in TRAIN_SETTINGS.items() if k not in ACTIONS}, **BENCH_SETTINGS}
USAGE = "python bench.py [config/preset.py ...] [--key=value ...]"


def resolve(cfg):
    """Fill derived values, parse the lists, and check everything before any timing starts."""
    cfg = dict(cfg)
    cfg["seq_len"] = cfg["seq_len"] or cfg["block_size"]
    if not cfg["vocab_size"]:  # as train.py pads them: 257 bytes -> 320, GPT-2's 50257 -> 50304
        cfg["vocab_size"] = data.padded_vocab({"vocab_size": 257 if
                                               cfg["dataset"].endswith("_byte") else 50257})
    if cfg["seq_len"] > cfg["block_size"]:
        raise ConfigError(f"seq_len {cfg['seq_len']} exceeds block_size {cfg['block_size']}")
    cfg["parts"], cfg["modes"] = parse_list(cfg["parts"]), parse_list(cfg["modes"])
    if not cfg["parts"] or not set(cfg["parts"]) <= {"train", "decode", "cache"}:
        raise ConfigError(f"--parts={','.join(cfg['parts'])}: name some of train, decode, cache")
    if not cfg["modes"] or not set(cfg["modes"]) <= set(VALUE_MODES):
        raise ConfigError(f"--modes={','.join(cfg['modes'])}: name some of "
                          f"{', '.join(VALUE_MODES)}")
    n_head = cfg["n_head"]
    cfg["kv_heads"] = (parse_list(cfg["kv_heads"], int)
                       or sorted({n_head, max(n_head // 2, 1), 1}, reverse=True))
    if any(h < 1 or n_head % h for h in cfg["kv_heads"]):
        raise ConfigError(f"--kv_heads: n_head ({n_head}) must be a multiple of each")
    cfg["decode_batch_sizes"] = parse_list(cfg["decode_batch_sizes"], int)
    if min(cfg["decode_batch_sizes"], default=0) < 1:
        raise ConfigError("--decode_batch_sizes: sizes of at least 1")
    # Contexts above block_size cannot be decoded with learned positions: skip them, say so.
    asked = parse_list(cfg["contexts"], int) + [cfg["block_size"]]
    cfg["contexts"] = sorted({c for c in asked if c <= cfg["block_size"]})
    cfg["skipped_contexts"] = sorted({c for c in asked if c > cfg["block_size"]})
    if "decode" in cfg["parts"] and min(cfg["contexts"]) <= cfg["decode_tokens"]:
        raise ConfigError(f"context {min(cfg['contexts'])} must be longer than decode_tokens "
                          f"({cfg['decode_tokens']}): the prompt is context - decode_tokens")
    # a preset's full accumulation (GPT-2: 16) would make each timed step long; 4 micro-steps
    # already put AdamW under 1% of a GPU step
    cfg["accumulation"] = cfg["accumulation"] or min(cfg["gradient_accumulation_steps"] or 1, 4)
    if cfg["compile"] and cfg["warmup_steps"] < 1:
        raise ConfigError("compile needs warmup_steps >= 1, or compilation is timed")
    for mode in cfg["modes"]:  # the model's own checks (n_embd by n_head, ...), as train.py's
        try:
            model_config(cfg, mode)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return cfg


def model_config(cfg, mode, n_kv_head=None):
    """A mode's GPTConfig; the resformer's mix settings apply to the resformer alone."""
    keep = {k: v for k, v in cfg.items() if mode == "resformer" or k not in (
        "lambda_1", "lambda_2", "learnable_lambda")}
    return GPTConfig.from_dict({**keep, "value_mode": mode, "dropout": 0.0,
                                "n_kv_head": cfg["n_kv_head"] if n_kv_head is None else n_kv_head})


def build(cfg, mode):
    """A fresh GPT in one value mode, from the same seed for every mode."""
    torch.manual_seed(cfg["seed"])
    return GPT(model_config(cfg, mode))


def synchronize(device):
    """CUDA runs asynchronously: wait for the queued kernels before reading the clock."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def bench_train(cfg, device, dtype, autocast):
    """Median ms/step of train.py's training_step per mode (torch.utils.benchmark's Timer), after
    warm-up; the modes take turns step by step, so a busy neighbour slows them all alike."""
    kind = device.split(":")[0]
    B, T, micro_steps = cfg["batch_size"], cfg["seq_len"], cfg["accumulation"]
    gen = torch.Generator().manual_seed(cfg["seed"])
    x, y = (torch.randint(cfg["vocab_size"], (B, T), generator=gen).to(device) for _ in range(2))
    batches = SimpleNamespace(next=lambda: (x, y))  # the same tokens every micro-step
    timers, raws, results = {}, {}, {}
    for mode in cfg["modes"]:
        if kind == "cuda":  # this mode's peak: its own weights, optimizer state and activations
            others = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        raw = build(cfg, mode).to(device)
        opt = raw.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                       (cfg["beta1"], cfg["beta2"]))
        amp = autocast, torch.amp.GradScaler(kind, enabled=dtype == "float16")
        model = torch.compile(raw) if cfg["compile"] else raw
        step = partial(training_step, model, opt, batches, micro_steps, cfg["grad_clip"], amp)
        for _ in range(cfg["warmup_steps"]):  # first calls allocate, autotune, compile: not timed
            step()
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - others if kind == "cuda" else None
        timers[mode] = Timer("step()", globals={"step": step}, description=mode,
                             num_threads=torch.get_num_threads())  # (its default is 1 thread)
        raws[mode] = raw
        results[mode] = {"params": raw.num_params(), "step_ms": None, "peak_mem_bytes": peak}
    steps = {mode: [] for mode in cfg["modes"]}
    for i in range(cfg["train_steps"]):
        k = i % len(cfg["modes"])  # rotate who goes first
        for mode in cfg["modes"][k:] + cfg["modes"][:k]:
            steps[mode].append(timers[mode].timeit(number=1))
    peak_flops = cards.peak_flops(device, dtype)
    for mode, r in results.items():
        measured = Measurement.merge(steps[mode])[0]
        r["step_ms"] = [1000 * t for t in measured.times]
        r["ms_per_step"] = 1000 * measured.median
        r["tokens_per_s"] = B * T * micro_steps / (r["ms_per_step"] / 1000)
        r["mfu"] = (raws[mode].flops_per_token(T) * r["tokens_per_s"] / peak_flops
                    if peak_flops else None)
    return {"batch_size": B, "seq_len": T, "accumulation": micro_steps, "steps": cfg["train_steps"],
            "warmup_steps": cfg["warmup_steps"], "compile": cfg["compile"],
            "peak_flops": peak_flops, "modes": results}


def timed_generate(model, prompt, n, use_cache, device):
    """Greedy generation of n tokens: (the new tokens, seconds, with the prompt's prefill)."""
    synchronize(device)
    t0 = time.perf_counter()
    out = model.generate(prompt, n, temperature=0, use_cache=use_cache)
    synchronize(device)
    return out[:, prompt.size(1):], time.perf_counter() - t0


@torch.no_grad()
def bench_decode(cfg, device, autocast):
    """tokens/s with the cache and without (nanoGPT's recompute), from one prompt of context -
    decode_tokens tokens in the run's dtype, and whether cached and full logits agree in float32."""
    n = cfg["decode_tokens"]
    models = {mode: build(cfg, mode).to(device).eval() for mode in cfg["modes"]}
    gen = torch.Generator().manual_seed(cfg["seed"])
    rows = []
    skipped = (f"; skipped contexts {cfg['skipped_contexts']} > block_size"
               if cfg["skipped_contexts"] else "")
    print(f"\ndecoding: {n} new tokens, greedy, with the prompt's prefill{skipped}; same = equal "
          f"tokens in this dtype; fp32 err = largest cached vs full-forward logit difference in "
          f"float32 (<= {LOGIT_TOLERANCE})")
    print(f"{'mode':<12} {'batch':>5} {'context':>7} {'cached':>9} {'uncached':>9} {'speedup':>8} "
          f"{'same':>5} {'fp32 err':>8}")
    with autocast:
        for model in models.values():  # warm-up: first calls allocate and pick kernels
            for use_cache in (True, False):
                timed_generate(model, torch.zeros(1, 1, dtype=torch.long, device=device), 2,
                               use_cache, device)
        for B in cfg["decode_batch_sizes"]:
            for C in cfg["contexts"]:
                prompt = torch.randint(cfg["vocab_size"], (B, C - n), generator=gen).to(device)
                for mode, model in models.items():
                    cached, c_time = timed_generate(model, prompt, n, True, device)
                    plain, p_time = timed_generate(model, prompt, n, False, device)
                    r = {"mode": mode, "batch": B, "context": C, "prompt_len": C - n,
                         "new_tokens": n, "cached_tok_s": B * n / c_time,
                         "uncached_tok_s": B * n / p_time,
                         "tokens_match": bool(torch.equal(cached, plain)),  # in the run's dtype
                         "fp32_logit_error": cache_logit_error(
                             model, torch.cat([prompt, cached], dim=1), C - n)}
                    r["cache_exact"] = r["fp32_logit_error"] <= LOGIT_TOLERANCE
                    r["speedup"] = r["cached_tok_s"] / r["uncached_tok_s"]
                    rows.append(r)
                    print(f"{mode:<12} {B:>5} {C:>7} {r['cached_tok_s']:>9,.0f} "
                          f"{r['uncached_tok_s']:>9,.0f} {r['speedup']:>7.1f}x "
                          f"{str(r['tokens_match']):>5} {r['fp32_logit_error']:>8.1e}", flush=True)
    return {"new_tokens": n, "contexts": cfg["contexts"],
            "skipped_contexts": cfg["skipped_contexts"],
            "batch_sizes": cfg["decode_batch_sizes"], "logit_tolerance": LOGIT_TOLERANCE,
            "cache_exact": all(r["cache_exact"] for r in rows), "rows": rows}


def bench_cache(cfg, device, ptdtype):
    """Bytes of real KVCache tensors (batch 1, block_size long, in the run's dtype) for each mode
    and n_kv_head, and SVFormer's against vanilla's: exactly (L+1)/(2L)."""
    L, max_len = cfg["n_layer"], cfg["block_size"]
    rows, vanilla = [], {}
    for h in cfg["kv_heads"]:
        for mode in VALUE_MODES:  # vanilla always, so svformer's ratio has its reference
            cache = KVCache(model_config(cfg, mode, h), 1, max_len, device, ptdtype)
            nbytes = cache.nbytes()
            vanilla.setdefault(h, nbytes)  # (vanilla is VALUE_MODES' first)
            rows.append({"mode": mode, "n_kv_head": h,
                         "tensors": len(cache.keys) + len(cache.values),
                         "bytes_per_token": nbytes // max_len, "bytes_full": nbytes,
                         "max_len": max_len, "vs_vanilla": nbytes / vanilla[h],
                         "vs_vanilla_mha": nbytes / vanilla[cfg["kv_heads"][0]],
                         # exact, in integers: svformer * 2L == vanilla * (L+1)
                         "exact_svformer_ratio": nbytes * 2 * L == vanilla[h] * (L + 1)
                         if mode == "svformer" else None})
            del cache
    rows = [r for r in rows if r["mode"] in cfg["modes"] or r["mode"] == "vanilla"]
    return {"dtype": str(ptdtype).removeprefix("torch."), "batch": 1, "max_len": max_len,
            "expected_svformer_ratio": (L + 1) / (2 * L), "rows": rows}


def print_tables(result, cfg):
    """The tables of what was measured (the JSON has it all)."""
    print(f"\n{'mode':<12} {'params':>12} {'active/token':>13} {'FLOPs/token':>12} "
          f"(at {cfg['seq_len']} tokens; position embeddings left out)")
    for mode, s in result["sizes"].items():
        print(f"{mode:<12} {s['num_params']:>12,} {s['active_params']:>13,} "
              f"{s['flops_per_token'] / 1e6:>11.2f}M")
    tr, ca = result["train"], result["cache"]
    if tr:
        print(f"\ntraining step: {tr['accumulation']} micro-step(s) of {tr['batch_size']} x "
              f"{tr['seq_len']} tokens, then AdamW; median of {plural(tr['steps'], 'step')} after "
              f"{tr['warmup_steps']} warm-up, compile={tr['compile']}")
        print(f"{'mode':<12} {'params':>10} {'ms/step':>9} {'tokens/s':>10} {'vs vanilla':>10} "
              f"{'MFU':>6} {'peak mem':>9}")
        base = tr["modes"].get("vanilla", {}).get("ms_per_step")
        for mode, m in tr["modes"].items():
            rel = f"{m['ms_per_step'] / base:.3f}" if base else "-"
            mfu = f"{100 * m['mfu']:.1f}%" if m["mfu"] is not None else "-"
            mem = (f"{m['peak_mem_bytes'] / 2**20:.0f}MiB" if m["peak_mem_bytes"] is not None
                   else "-")
            print(f"{mode:<12} {m['params']:>10,} {m['ms_per_step']:>9.1f} "
                  f"{m['tokens_per_s']:>10,.0f} {rel:>10} {mfu:>6} {mem:>9}")
    if ca:
        print(f"\nKV cache: batch 1, {ca['max_len']} tokens, {ca['dtype']}, live tensor bytes "
              f"(svformer expected {ca['expected_svformer_ratio']:.4f} of vanilla)")
        print(f"{'mode':<12} {'kv_heads':>8} {'tensors':>7} {'bytes/token':>11} "
              f"{'at full ctx':>13} {'vs vanilla':>10} {'vs MHA':>7} {'exact':>5}")
        for r in ca["rows"]:
            exact = "-" if r["exact_svformer_ratio"] is None else str(r["exact_svformer_ratio"])
            print(f"{r['mode']:<12} {r['n_kv_head']:>8} {r['tensors']:>7} "
                  f"{r['bytes_per_token']:>11,} {r['bytes_full']:>13,} {r['vs_vanilla']:>10.4f} "
                  f"{r['vs_vanilla_mha']:>7.4f} {exact:>5}")


def main(argv):
    t_start = time.time()
    for arg in argv:
        if arg.startswith("--") and arg[2:].partition("=")[0] in UNUSED:
            raise ConfigError(f"{arg}: a train.py setting that bench.py does not use")
    cfg = resolve(vars(parse_args(SETTINGS, argv, USAGE)))
    if cfg["gpu_check"]:
        if len(argv) > 1:
            raise ConfigError("--gpu_check runs settings of its own: give it alone")
        from lab.gpu_check import gpu_check
        return gpu_check()
    # as train.py: float32 weights, bf16/fp16 compute under autocast (the cache: autocast's)
    device, dtype, autocast = data.setup_device(cfg["device"], cfg["dtype"])
    if cfg["threads"] > 0:
        torch.set_num_threads(cfg["threads"])
    if device.startswith("cuda") and ":" in device:
        torch.cuda.set_device(device)  # cuda:N: the Timer synchronises the current device
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    result = {"config": cfg, "device": device, "dtype": dtype,
              "device_name": (torch.cuda.get_device_name(device) if device.startswith("cuda")
                              else device),
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "model": {k: cfg[k] for k in ("n_layer", "n_head", "n_kv_head", "n_embd",
                                            "vocab_size", "bias", "block_size")},
              "train": None, "decode": None, "cache": None}
    print(f"{plural(cfg['n_layer'], 'layer')} x {cfg['n_embd']}, block_size {cfg['block_size']}, "
          f"{device} ({result['device_name']}) {dtype}, torch {torch.__version__}, "
          f"{plural(result['threads'], 'thread')}", flush=True)
    with torch.device("meta"):  # shapes only: no memory, no initialising (GPT-2's tables: 2 GB)
        result["sizes"] = {m: sizes(GPT(model_config(cfg, m)), cfg["seq_len"])
                           for m in cfg["modes"]}
    parts = cfg["parts"]
    result["train"] = bench_train(cfg, device, dtype, autocast) if "train" in parts else None
    result["decode"] = bench_decode(cfg, device, autocast) if "decode" in parts else None
    result["cache"] = bench_cache(cfg, device, getattr(torch, dtype)) if "cache" in parts else None
    result["wall_s"] = time.time() - t_start
    print_tables(result, cfg)
    if cfg["json_out"]:
        os.makedirs(os.path.dirname(cfg["json_out"]) or ".", exist_ok=True)
        with data.atomic_write(cfg["json_out"], "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {cfg['json_out']} ({result['wall_s']:.0f}s)")
    return result


if __name__ == "__main__":
    run_main(main)
