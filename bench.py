"""
Speed and memory of model.py's value modes, side by side in one run: training step, decoding with
and without the KV cache, and the cache's bytes. Prints tables and writes everything to JSON.

    python bench.py                                       # the quickstart model, this device
    python bench.py --threads=1 --block_size=1024 --seq_len=64   # decoding up to 1024, steadier
    python bench.py config/gpt2_124m.py                   # GPT-2 124M (a GPU: bf16, MFU, memory)
    python bench.py config/gpt2_124m.py --parts=cache --dtype=bfloat16   # cache bytes, anywhere
    python bench.py --gpu_check                           # the GPU path end to end (lab/gpu_check)

Tokens are synthetic (random ids): speed does not depend on which tokens they are, and the bench
then needs no prepared data. Decoding always runs the eager model (torch.compile, when on, is
applied to the training step only: the cache's growing length would recompile every step).
"""
import json
import os
import time
from types import SimpleNamespace

import torch
from torch.utils.benchmark import Measurement, Timer

import data
from configurator import ConfigError, parse_args, plural, run_main
from lab.analysis import gpu_peak_flops, mfu, sizes
from lab.grid import parse_list
from model import GPT, VALUE_MODES, GPTConfig, KVCache
from train import ACTIONS, SETTINGS as TRAIN_SETTINGS, training_step

# train.py's settings a timing does not use: a preset may set them (config/*.py work as they are)
# and they are ignored; the command line refuses them
UNUSED = ("out_dir", "eval_interval", "log_interval", "eval_iters", "max_iters", "warmup_iters",
          "lr_decay_iters", "min_lr", "dropout", "value_mode") + ACTIONS
BENCH_SETTINGS = dict(
    seq_len=(0, "tokens per sequence in the timed training step (0 = block_size)", (0, None)),
    vocab_size=(0, "vocabulary of the synthetic tokens (0 = 320 for a *_byte dataset, "
                   "else GPT-2's 50304)", (0, None)),
    parts=("train,decode,cache", "what to measure: train, decode, cache"),
    modes=(",".join(VALUE_MODES), "value modes, side by side (model.py's VALUE_MODES)"),
    train_steps=(20, "timed training steps (the median is reported)", (1, None)),
    accumulation=(0, "micro-steps per timed training step (0 = gradient_accumulation_steps, "
                     "at most 4): the optimizer step amortised as in training", (0, None)),
    warmup_steps=(3, "untimed steps first (allocation, autotuning, compilation)", (0, None)),
    contexts=("128,512,1024", "decoding contexts (block_size is always added; "
                              "longer ones are skipped)"),
    decode_tokens=(32, "new tokens per decoding measurement", (1, None)),
    decode_batch_sizes=("1,8", "batch sizes for decoding"),
    kv_heads=("", "n_kv_head variants for the cache table (empty: n_head, n_head/2, 1)"),
    json_out=("out/bench.json", "where the full results go (empty: nowhere)"),
    threads=(0, "CPU threads for torch (0 = its default; 1 is steadier on a busy shared CPU)",
             (0, None)),
    gpu_check=(False, "check the GPU path end to end, under 10 min on one GPU (lab/gpu_check.py:"
                      " the preset fitted, every mode compiled, fp16, resume, the SDPA kernel, "
                      "the cache, torchrun), with a JSON report"),
)
SETTINGS = {**{k: v for k, v in TRAIN_SETTINGS.items() if k not in ACTIONS}, **BENCH_SETTINGS}
USAGE = "python bench.py [config/preset.py ...] [--key=value ...]"
# Cached vs recomputed float32 logits differ by rounding only (1e-7 to 1e-5); a wrong cache, even
# in a freshly initialised model whose attention barely matters, is off by 1e-3 or more.
LOGIT_TOLERANCE = 1e-4


def resolve(cfg):
    """Fill derived values, parse the lists, and check everything before any timing starts."""
    cfg = dict(cfg)
    cfg["seq_len"] = cfg["seq_len"] or cfg["block_size"]
    if not cfg["vocab_size"]:  # as train.py pads them: 257 bytes -> 320, GPT-2's 50257 -> 50304
        cfg["vocab_size"] = data.padded_vocab({"vocab_size": data.ByteTokenizer.vocab_size if
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
    """train.py's settings of the resformer's mix shape the resformer only (GPTConfig refuses
    them elsewhere)."""
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
    """ms/step over train_steps AdamW steps per mode (train.py's training_step itself), after
    warm-up; the modes take turns step by step so that a busy neighbour on a shared machine slows
    them all alike. torch.utils.benchmark's Timer times each step (at this run's thread count,
    the GPU synchronised) and gives the median."""
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

        def step(model=model, opt=opt, amp=amp):
            training_step(model, opt, batches, micro_steps, cfg["grad_clip"], amp)

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
    peak_flops = gpu_peak_flops(torch.cuda.get_device_name(device), dtype) if kind == "cuda" \
        else None
    for mode, r in results.items():
        measured = Measurement.merge(steps[mode])[0]
        r["step_ms"] = [1000 * t for t in measured.times]
        r["ms_per_step"] = 1000 * measured.median
        r["tokens_per_s"] = B * T * micro_steps / (r["ms_per_step"] / 1000)
        r["mfu"] = mfu(raws[mode], T, r["tokens_per_s"], peak_flops) if peak_flops else None
    return {"batch_size": B, "seq_len": T, "accumulation": micro_steps, "steps": cfg["train_steps"],
            "warmup_steps": cfg["warmup_steps"], "compile": cfg["compile"],
            "peak_flops": peak_flops, "modes": results}


def timed_generate(model, prompt, n, use_cache, device):
    """Greedy generation; returns (new tokens, seconds to the first token, seconds for the rest)."""
    synchronize(device)
    t0 = time.perf_counter()
    new = []
    for tok in model.generate_tokens(prompt, n, temperature=0,
                                     kv_cache=None if use_cache else False):
        new.append(tok)
        if len(new) == 1:  # the first token costs a full forward of the prompt either way
            synchronize(device)
            t1 = time.perf_counter()
    synchronize(device)
    return torch.cat(new, dim=1), t1 - t0, time.perf_counter() - t1


@torch.no_grad()
def cache_logit_error(model, seq, prompt_len, device):
    """Largest |difference| between the next-token logits of cached decoding along seq (prefill
    prompt_len tokens, then one token per step) and those of one full forward over seq, in exact
    float32: autocast and TF32 off. In bf16 the two paths run different kernels whose rounding
    can flip a near-tie in greedy decoding, so token equality is no test there."""
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.autocast(device.split(":")[0], enabled=False):
            full, _ = model(seq, all_logits=True)
            cache = model.new_kv_cache(seq.size(0), dtype=torch.float32)
            steps = [model(seq[:, :prompt_len], kv_cache=cache)[0]]  # predicts token prompt_len
            for t in range(prompt_len, seq.size(1)):
                steps.append(model(seq[:, t:t + 1], kv_cache=cache)[0])
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return (torch.cat(steps, dim=1) - full[:, prompt_len - 1:]).abs().max().item()


@torch.no_grad()
def bench_decode(cfg, device, autocast):
    """tokens/s with the cache (prefill once, then one token per step) and without it (nanoGPT's
    recompute of the whole context per token), from the same prompt of context - decode_tokens
    tokens, so each run ends at exactly `context` tokens; speed in the run's dtype. Correctness:
    along the cached run's tokens, cached and full-forward logits agree in float32."""
    n = cfg["decode_tokens"]
    models = {mode: build(cfg, mode).to(device).eval() for mode in cfg["modes"]}
    gen = torch.Generator().manual_seed(cfg["seed"])
    rows = []
    skipped = f"; skipped contexts {cfg['skipped_contexts']} > block_size" * bool(
        cfg["skipped_contexts"])
    print(f"\ndecoding: {n} new tokens, greedy; tok/s after the first token, e2e = speedup with "
          f"the prompt's prefill{skipped}; same = equal tokens in this dtype; fp32 err = largest "
          f"cached vs full-forward logit difference in float32 (<= {LOGIT_TOLERANCE})")
    print(f"{'mode':<12} {'batch':>5} {'context':>7} {'cached':>9} {'uncached':>9} {'speedup':>8} "
          f"{'e2e':>6} {'same':>5} {'fp32 err':>8}")
    with autocast:
        for model in models.values():  # warm-up: first calls allocate and pick kernels
            for use_cache in (True, False):
                timed_generate(model, torch.zeros(1, 1, dtype=torch.long, device=device), 2,
                               use_cache, device)
        for B in cfg["decode_batch_sizes"]:
            for C in cfg["contexts"]:
                prompt = torch.randint(cfg["vocab_size"], (B, C - n), generator=gen).to(device)
                for mode, model in models.items():
                    cached, c_first, c_rest = timed_generate(model, prompt, n, True, device)
                    plain, p_first, p_rest = timed_generate(model, prompt, n, False, device)
                    r = {"mode": mode, "batch": B, "context": C, "prompt_len": C - n,
                         "new_tokens": n,  # steady state (after the first token), and with prefill
                         "cached_tok_s": B * (n - 1) / c_rest if n > 1 else None,
                         "uncached_tok_s": B * (n - 1) / p_rest if n > 1 else None,
                         "cached_e2e_tok_s": B * n / (c_first + c_rest),
                         "uncached_e2e_tok_s": B * n / (p_first + p_rest),
                         "tokens_match": bool(torch.equal(cached, plain)),  # in the run's dtype
                         "fp32_logit_error": cache_logit_error(
                             model, torch.cat([prompt, cached], dim=1), C - n, device)}
                    r["cache_exact"] = r["fp32_logit_error"] <= LOGIT_TOLERANCE
                    r["speedup"] = r["cached_tok_s"] / r["uncached_tok_s"] if n > 1 else None
                    r["e2e_speedup"] = r["cached_e2e_tok_s"] / r["uncached_e2e_tok_s"]
                    rows.append(r)
                    speedup = f"{r['speedup']:.1f}x" if r["speedup"] else "-"
                    print(f"{mode:<12} {B:>5} {C:>7} {r['cached_tok_s'] or 0:>9,.0f} "
                          f"{r['uncached_tok_s'] or 0:>9,.0f} {speedup:>8} "
                          f"{r['e2e_speedup']:>5.1f}x {str(r['tokens_match']):>5} "
                          f"{r['fp32_logit_error']:>8.1e}", flush=True)
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


def ratios_and_targets(result):
    """Ratios between the modes, and the targets. Each target was set for one kind of device:
    elsewhere its value is still reported, but it is neither met nor missed (met None)."""
    tr, de, ca = result["train"], result["decode"], result["cache"]
    ratios, targets = {}, []
    modes = tr["modes"] if tr else {}
    for mode in modes if "vanilla" in modes else []:  # every mode's step against vanilla's
        if mode != "vanilla":
            ratios[f"train_{mode}_vs_vanilla"] = (modes[mode]["ms_per_step"]
                                                  / modes["vanilla"]["ms_per_step"])
    if de:
        ratios["decode_cached_vs_uncached"] = {
            f"{r['mode']}_b{r['batch']}_c{r['context']}": r["speedup"] for r in de["rows"]}
    if ca:
        ratios["cache_svformer_vs_vanilla"] = {str(r["n_kv_head"]): r["vs_vanilla"]
                                               for r in ca["rows"] if r["mode"] == "svformer"}
    on_cpu, on_cuda = result["device"] == "cpu", result["device"].startswith("cuda")
    on_hopper = on_cuda and any(name in result["device_name"] for name in ("H100", "H200"))

    def target(name, value, goal, applies=True, met=None):
        if met is None and value is not None:  # goal "<= x" or ">= x"
            op, bound = goal.split()
            met = value <= float(bound) if op == "<=" else value >= float(bound)
        targets.append({"target": name, "value": value, "goal": goal, "applies": applies,
                        "met": met if applies and value is not None else None})

    target("resformer step time within 3% of vanilla (CPU)",
           ratios.get("train_resformer_vs_vanilla"), "<= 1.03", on_cpu)
    target("svformer step at least as fast as vanilla (CPU)",
           ratios.get("train_svformer_vs_vanilla"), "<= 1.00", on_cpu)
    at_1024 = [row["speedup"] for row in (de["rows"] if de else [])
               if row["context"] == 1024 and row["speedup"]]
    worst = min(at_1024) if at_1024 else None  # the worst mode and batch size
    target("cached decoding at 1024 context >= 5x recompute (CPU)", worst, ">= 5", on_cpu)
    target("cached decoding at 1024 context >= 10x recompute (GPU)", worst, ">= 10", on_cuda)
    exact = [row["exact_svformer_ratio"] for row in (ca["rows"] if ca else [])
             if row["mode"] == "svformer"]
    target("svformer cache bytes exactly (L+1)/(2L) of vanilla",
           ca["expected_svformer_ratio"] if exact else None, "exact",
           met=all(exact) if exact else None)
    mfus = [m["mfu"] for m in modes.values() if m["mfu"] is not None]
    target("MFU >= 45% (H100/H200, GPT-2 124M, bf16, compile)", min(mfus) if mfus else None,
           ">= 0.45", on_hopper)
    return ratios, targets


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
    print("\ntargets:")
    for t in result["targets"]:
        value = "not measured" if t["value"] is None else f"{t['value']:.4f}"
        met = {True: "met", False: "MISSED", None: "-"}[t["met"]]
        print(f"  {t['target']}: {value} (goal {t['goal']}) "
              f"{met if t['applies'] else '(another device target)'}")


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
    if "train" in cfg["parts"]:
        result["train"] = bench_train(cfg, device, dtype, autocast)
    if "decode" in cfg["parts"]:
        result["decode"] = bench_decode(cfg, device, autocast)
    if "cache" in cfg["parts"]:
        result["cache"] = bench_cache(cfg, device, getattr(torch, dtype))
    result["ratios"], result["targets"] = ratios_and_targets(result)
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
