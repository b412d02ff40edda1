"""`python bench.py --gpu_check`: a GPU owner's first hour, run and checked in about 5 minutes on
one GPU, with one table at the end (and out-gpu-check/report.json). On synthetic GPT-2 tokens, the
commands a user runs: compare.py config/gpu_class.py (vanilla and value embeddings, compiled, and
lab.evaluate at 50,304 ids), the plays' first run (config/plays_gpu.py, as a resume), sample.py
with the KV cache, and bench.py's MFU at GPT-2 small in bf16. PASS or FAIL only for what must hold
on any card: no error, cached logits equal to uncached ones, a resume exact, the logged peak
memory within lab.memory's estimate. tests/test_gpu_path.py runs every step on the CPU."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

import data
from lab.analysis import LOGIT_TOLERANCE, cache_logit_error
from lab.memory import step_bytes
from lab.runs import ROOT, read_log
from model import GPT

OUT = os.path.join(ROOT, "out-gpu-check")
VOCAB = 50257  # GPT-2's ids, padded to 50,304 by train.py: the logits at their real size


def synthetic_dataset(folder, tokens):
    """Random GPT-2 ids as a dataset: train and val shards and their meta.json."""
    os.makedirs(folder, exist_ok=True)
    rng, shards = np.random.default_rng(0), []
    for split, n in (("train", tokens), ("val", tokens // 8)):
        data.write_shard(os.path.join(folder, f"synthetic_{split}.bin"),
                         rng.integers(0, VOCAB, n), VOCAB)
        shards.append({"file": f"synthetic_{split}.bin", "split": split, "tokens": n})
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump({"tokenizer": "gpt2", "vocab_size": VOCAB, "eot": VOCAB - 1, "shards": shards}, f)
    return folder


def run(*args):
    """A user's command, its output shown as it runs; True if it exited 0."""
    print(f"\n== python {' '.join(args)}", flush=True)
    return subprocess.run([sys.executable, *args], cwd=ROOT).returncode == 0


def val_losses(out_dir):
    return [(e["iter"], round(e["val_loss"], 4)) for e in read_log(out_dir) if e["kind"] == "eval"]


def gpu_check(device="cuda", shape=(), steps=20, tokens=4_000_000):
    """Every step, then the table; exit 1 if a check failed; shape: the CPU test's own settings."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("bench.py --gpu_check: no CUDA GPU here (torch sees none): nothing to check")
        return 0
    shutil.rmtree(OUT, ignore_errors=True)  # never read an earlier check's files as this one's
    dataset = synthetic_dataset(os.path.join(OUT, "data"), tokens)
    common = [f"--dataset={dataset}", f"--device={device}", f"--max_iters={steps}",
              f"--eval_interval={steps // 2}", "--eval_iters=2", "--log_interval=5", *shape]
    rows = []  # (what, what it measured, "PASS"/"FAIL" or "" for a number only reported)

    # 1. the class's comparison, compiled, with its whole-split pass at the real vocabulary
    out = os.path.join(OUT, "compare")
    ok = run("compare.py", "config/gpu_class.py", *common, "--modes=vanilla,value_embed",
             "--seeds=1", "--noise_floor=0", "--analysis_samples=4", f"--out_dir={out}")
    finals = {m: [e for e in read_log(os.path.join(out, f"{m}_seed1")) if e["kind"] == "final"]
              for m in ("vanilla", "value_embed")}
    rows.append(("compare.py config/gpu_class.py: vanilla, value embeddings, each through "
                 "train.py and lab.evaluate", ", ".join(
                     f"{m} {f[-1]['val_loss_full']:.3f}" for m, f in finals.items() if f),
                 "PASS" if ok and all(finals.values()) else "FAIL"))
    # 2. the peak memory each run logged, against lab.memory's estimate for its batch
    for mode in finals:
        run_dir = os.path.join(out, f"{mode}_seed1")
        peak = [e["peak_gib"] for e in read_log(run_dir) if e["kind"] == "memory"]
        if peak and os.path.isfile(os.path.join(run_dir, "ckpt.pt")):
            ckpt = data.load_checkpoint(os.path.join(run_dir, "ckpt.pt"))
            fixed, per_token = step_bytes(GPT.from_checkpoint(ckpt), ckpt["config"]["block_size"])
            estimate = (fixed + per_token * ckpt["config"]["batch_size"]
                        * ckpt["config"]["block_size"]) / 2**30
            rows.append((f"{mode}: peak memory, logged, against lab.memory's estimate",
                         f"{peak[0]:.2f} of {estimate:.2f} GiB",
                         "PASS" if peak[0] <= estimate else "FAIL"))
    # 3. the first run on the plays (config/plays_gpu.py), as a resume: half its steps, then on
    # to the end, against the same steps uninterrupted (eager: compiling it thrice costs minutes)
    if not os.path.isdir(os.path.join(ROOT, "data", data.DEFAULT_DATASET)):
        run("prepare.py")
    halves, whole = os.path.join(OUT, "resumed"), os.path.join(OUT, "uninterrupted")
    plays = ["config/plays_gpu.py", f"--device={device}", f"--max_iters={steps}",
             f"--eval_interval={steps // 2}", "--eval_iters=2", "--log_interval=5",
             f"--lr_decay_iters={steps}", "--compile=False", *shape]
    first = run("train.py", *plays, f"--max_iters={steps // 2}", f"--out_dir={halves}")
    second = run("train.py", *plays, "--resume", f"--out_dir={halves}")
    straight = run("train.py", *plays, f"--out_dir={whole}")
    same = first and second and straight and val_losses(halves) == val_losses(whole) != []
    rows.append((f"config/plays_gpu.py resumed at step {steps // 2}: the uninterrupted run's "
                 f"val losses (4 digits)", "equal" if same else "different",
                 "PASS" if same else "FAIL"))
    # 4. sampling on the GPU, and the cache: cached logits against a full forward's, float32
    ok = run("sample.py", f"--out_dir={whole}", "--num_samples=1", "--max_new_tokens=64",
             f"--device={device}")
    rows.append(("sample.py with the KV cache", "ran" if ok else "failed",
                 "PASS" if ok else "FAIL"))
    if os.path.isfile(os.path.join(whole, "ckpt.pt")):
        model = GPT.from_checkpoint(data.load_checkpoint(os.path.join(whole, "ckpt.pt")), device)
        x = torch.randint(model.config.vocab_size, (1, model.config.block_size), device=device)
        error = cache_logit_error(model, x, x.size(1) // 2)
        rows.append(("cached against uncached logits (float32)", f"largest difference "
                     f"{error:.1e}", "PASS" if error <= LOGIT_TOLERANCE else "FAIL"))
    # 5. MFU at GPT-2 small, bf16, compiled: bench.py's training step (a number, reported)
    mfu_json = os.path.join(OUT, "bench.json")
    run("bench.py", "config/gpt2_124m.py", "--parts=train", "--modes=vanilla", "--train_steps=10",
        "--accumulation=1", f"--device={device}", f"--json_out={mfu_json}", *shape)
    mfu = (json.load(open(mfu_json))["train"]["modes"]["vanilla"]["mfu"]
           if os.path.isfile(mfu_json) else None)
    rows.append(("MFU, GPT-2 small, bf16, compiled (bench.py)", "not measured" if mfu is None
                 else f"{100 * mfu:.1f}%", ""))

    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else device
    print(f"\n## bench.py --gpu_check on {name}, torch {torch.__version__}\n\n"
          "| check | measured | verdict |\n|---|---|---|\n" +
          "\n".join(f"| {w} | {m} | {v or '-'} |" for w, m, v in rows))
    with data.atomic_write(os.path.join(OUT, "report.json"), "w") as f:
        json.dump({"device": name, "torch": torch.__version__, "checks": [
            {"check": w, "measured": m, "verdict": v} for w, m, v in rows]}, f, indent=1)
    return 1 if any(verdict == "FAIL" for _, _, verdict in rows) else 0
