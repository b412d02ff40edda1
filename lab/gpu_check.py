"""
`python bench.py --gpu_check`: what a GPU owner's first hour runs, checked in under 10 minutes on
one GPU, with a JSON report (out-gpu-check/report.json). At GPT-2 small's shape and vocabulary
(synthetic tokens, so nothing is downloaded): train.py with the preset (its batch fitted to this
GPU, compiled, MFU judged against its target, peak memory against the estimate), a resume
checked against the same run uninterrupted, a forced float16 run with loss scaling, every value
mode and grouped-query attention compiled with their recompiles counted, the SDPA kernel that
ran, cached against uncached logits, and torchrun on 2 GPUs where there are two. Every step runs
on the CPU at a tiny size in tests/test_gpu_ready.py.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

import data
import train
from lab import analysis
from lab.analysis import gpu_peak_flops
from model import GPT, VALUE_MODES, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "out-gpu-check")
PRESET = [os.path.join(ROOT, "config", "gpt2_124m.py"), "--gradient_accumulation_steps=4"]
TOKENS = 4_000_000  # the synthetic training split: enough for the check's steps without repeats
MFU_TARGET = 0.45  # GPT-2 small, bf16, compiled, on an A100/H100-class GPU (llm.c reaches ~50%)


def synthetic_dataset(folder, vocab_size=50257):
    """TOKENS random ids of GPT-2's vocabulary in llm.c shards: the preset's logits and tables at
    their real size, with nothing to download."""
    os.makedirs(folder, exist_ok=True)
    rng, shards, tokens = np.random.default_rng(0), [], TOKENS
    for split, n in (("train", tokens), ("val", tokens // 8)):
        file = f"synthetic_{split}_000000.bin"
        sha = data.write_shard(os.path.join(folder, file), rng.integers(0, vocab_size, n),
                               vocab_size)
        shards.append({"file": file, "split": split, "tokens": n, "sha256": sha})
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump({"tokenizer": "gpt2", "vocab_size": vocab_size, "eot": vocab_size - 1,
                   "train_tokens": tokens, "val_tokens": tokens // 8, "shards": shards}, f)
    return folder


def run(args, log_dir=None):
    """A user's command (its output shown as it runs); (ok, its log's entries)."""
    shown = [os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in args]
    print(f"\n== python {' '.join(shown)}", flush=True)
    ok = subprocess.run([sys.executable, *args], cwd=ROOT).returncode == 0
    path = log_dir and os.path.join(log_dir, "log.jsonl")
    return ok, [json.loads(line) for line in open(path)] if path and os.path.exists(path) else []


def losses(entries, up_to):
    return [(e["iter"], round(e.get("loss", e.get("val_loss", 0.0)), 4)) for e in entries
            if e["kind"] in ("train", "eval") and e["iter"] <= up_to]


def kernel_of_attention(model, x):
    """The SDPA kernel a forward ran (flash, efficient, cudnn or math), from the profiler."""
    with torch.profiler.profile() as prof, torch.no_grad():
        model(x)
    names = " ".join(e.key.lower() for e in prof.key_averages())
    return next((k for k, marks in (("flash", ("flash",)), ("cudnn", ("cudnn",)),
                                    ("efficient", ("efficient", "mem_eff", "fmha")))
                 if any(m in names for m in marks)), "math")


def compiled_modes(shape, device, dtype, modes):
    """Each mode (and vanilla with a third of the key/value heads) compiled for three warm-up
    steps, then three more: how many graphs each compiled after warm-up (0 is right)."""
    from torch._dynamo.utils import counters
    _, _, autocast = data.setup_device(device, dtype)
    found = {}
    for name, extra in [(m, {}) for m in modes] + [("vanilla_gqa", {"n_kv_head": max(
            shape["n_head"] // 3, 1)})]:
        torch.manual_seed(0)
        config = GPTConfig(**{**shape, "value_mode": name.removesuffix("_gqa"), **extra})
        model = GPT(config).to(device)
        optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
        amp = autocast, torch.amp.GradScaler(device.split(":")[0], enabled=dtype == "float16")
        x = torch.randint(config.vocab_size, (2, config.block_size), device=device)
        batches = type("Fixed", (), {"next": staticmethod(lambda: (x, x))})
        compiled = torch.compile(model)
        for _ in range(3):
            train.training_step(compiled, optimizer, batches, 1, 1.0, amp)
        before = counters["stats"]["unique_graphs"]
        for _ in range(3):
            loss = train.training_step(compiled, optimizer, batches, 1, 1.0, amp)
        found[name] = {"recompiles_after_warmup": counters["stats"]["unique_graphs"] - before,
                       "loss_finite": bool(torch.isfinite(loss).item())}
    return found


def gpu_check(preset=PRESET, gpus=None, device="cuda", modes=tuple(VALUE_MODES)):
    """Runs every step, prints a verdict line per check, writes the report; the exit status."""
    gpus = torch.cuda.device_count() if gpus is None else gpus
    if not gpus:
        print("bench.py --gpu_check: no CUDA GPU here (torch sees none): nothing to check")
        return 0
    shutil.rmtree(OUT, ignore_errors=True)  # never read an earlier check's files as this one's
    dataset = synthetic_dataset(os.path.join(OUT, "data"))
    common = [*preset, f"--dataset={dataset}", "--eval_iters=2", "--log_interval=5",
              f"--device={device}"]
    report, checks = {"device": torch.cuda.get_device_name(0) if device == "cuda" else device}, []

    def check(what, ok, **measured):
        checks.append({"check": what, "ok": bool(ok), **measured})
        print(f"  {'ok    ' if ok else 'FAILED'} {what}", flush=True)

    # 1. the preset as a user runs it: batch fitted to this GPU, compiled, MFU and memory
    whole = os.path.join(OUT, "run")
    ok, log = run(["train.py", *common, "--max_iters=20", "--eval_interval=10",
                   "--lr_decay_iters=20", f"--out_dir={whole}"], whole)
    trained = [e for e in log if e["kind"] == "train"]
    config = next((e for e in log if e["kind"] == "config"), {})
    last = trained[-1] if trained else {}
    estimate = config.get("memory_estimate_bytes")
    peak = last.get("peak_memory_gib")
    check("train.py with the preset: trained, the batch fitted to this GPU", ok and trained,
          ms_per_step=last.get("ms_per_step"), settings=config.get("settings"))
    mfu = None
    if config and last and gpu_peak_flops(report["device"], config["settings"]["dtype"]):
        with torch.device("meta"):  # its shape only: the FLOPs a token costs
            shaped = GPT(GPTConfig.from_dict({**config["settings"], "vocab_size": 50304}))
        mfu = analysis.mfu(shaped, config["settings"]["block_size"], last["tokens_per_sec"],
                           gpu_peak_flops(report["device"], config["settings"]["dtype"]))
    hopper_or_ampere = any(g in report["device"] for g in ("A100", "H100", "H200"))
    check(f"MFU {100 * (mfu or 0):.1f}% (target {100 * MFU_TARGET:.0f}% on A100/H100-class GPUs)",
          mfu is None or not hopper_or_ampere or mfu >= MFU_TARGET, mfu=mfu)
    check(f"peak memory {peak} GiB, the estimate {estimate and estimate / 2**30:.1f} GiB",
          peak is None or estimate is None or 0.5 <= peak * 2**30 / estimate <= 1.3,
          peak_memory_gib=peak, estimate_bytes=estimate)
    # 2. a resume: 10 steps, then on to 20, against the same 20 steps uninterrupted
    halves = os.path.join(OUT, "resumed")
    first, _ = run(["train.py", *common, "--max_iters=10", "--eval_interval=10",
                    "--lr_decay_iters=20", "--compile=False", f"--out_dir={halves}"])
    second, resumed = run(["train.py", *common, "--max_iters=20", "--resume",
                           f"--out_dir={halves}"], halves)
    eager = os.path.join(OUT, "eager")
    _, straight = run(["train.py", *common, "--max_iters=20", "--eval_interval=10",
                       "--lr_decay_iters=20", "--compile=False", f"--out_dir={eager}"], eager)
    check("a resume gives the uninterrupted run's losses (at the printed precision)",
          first and second and losses(resumed, 20) == losses(straight, 20) != [])
    # 3. float16 with loss scaling, as a T4 or V100 runs it
    fp16 = os.path.join(OUT, "fp16")
    ok, log = run(["train.py", *common, "--max_iters=10", "--eval_interval=10",
                   "--dtype=float16", "--compile=False", f"--out_dir={fp16}"], fp16)
    check("float16 with loss scaling trains (finite losses)", ok and all(
        np.isfinite(e["loss"]) for e in log if e["kind"] == "train"))
    # 4. every mode, value embeddings at the real vocabulary and GQA, compiled
    shape = {k: v for k, v in (config.get("settings") or {}).items()
             if k in ("n_layer", "n_head", "n_embd", "block_size", "bias")}
    shape = {"vocab_size": 50304, **shape} if shape else {}
    if shape:
        compiled = compiled_modes(shape, device, config["settings"]["dtype"], modes)
        check("every mode compiled, no recompile after warm-up: " + ", ".join(compiled),
              all(r["recompiles_after_warmup"] == 0 and r["loss_finite"]
                  for r in compiled.values()), modes=compiled)
    # 5. the attention kernel, and the cache, on the trained model
    if os.path.exists(os.path.join(whole, "ckpt.pt")):
        model = GPT.from_checkpoint(data.load_checkpoint(os.path.join(whole, "ckpt.pt")), device)
        T = model.config.block_size
        x = torch.randint(model.config.vocab_size, (1, T), device=device)
        with data.setup_device(device, config["settings"]["dtype"])[2]:
            kernel = kernel_of_attention(model, x)
        check(f"the attention kernel that ran: {kernel} (not the slow math one)",
              kernel != "math" or not device.startswith("cuda"), kernel=kernel)
        from bench import LOGIT_TOLERANCE, cache_logit_error
        error = cache_logit_error(model, x[:, :min(T, 256)], min(T, 256) // 2, device)
        check(f"cached against uncached logits, float32: largest difference {error:.1e}",
              error <= LOGIT_TOLERANCE, logit_error=error)
    # 6. torchrun, where there are two GPUs
    if gpus >= 2:
        ddp = os.path.join(OUT, "ddp")
        ok, log = run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       "train.py", *common, "--max_iters=10", "--eval_interval=10",
                       f"--out_dir={ddp}"], ddp)
        check("torchrun on 2 GPUs trains", ok and any(e["kind"] == "final" for e in log))
    report["checks"] = checks
    with data.atomic_write(os.path.join(OUT, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"\n{sum(c['ok'] for c in checks)} of {len(checks)} checks passed; the report: "
          f"{os.path.join(OUT, 'report.json')}")
    return 0 if all(c["ok"] for c in checks) else 1
