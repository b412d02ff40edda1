"""`python bench.py --gpu_check`: a GPU owner's first hour, checked in about 5 minutes on an H100,
one table at the end (and out-gpu-check/report.json), no network (random GPT-2 ids, the plays).
Each row PASS or FAIL within its tolerance, or a number reported: the peak memory of eager steps
of config/gpt2_124m.py at the batch lab.memory picks for this card, and their MFU; cached against
uncached logits in every value mode (SVFormer also with fewer key/value heads) past block_size, in
float32 and the card's dtype, and SVFormer's cache bytes; compare.py config/gpu_class.py scaled
down (compiled), and its MFU; a resume of the plays' first run (eager) and of the class's vanilla
run (compiled) in the card's dtype (a T4's float16: the loss scaler's too); sample.py's text with
and without the cache. tests/test_gpu_path.py runs it on a CPU and plants a fault in each."""
import json
import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

import data
import train
from configurator import parse_args, read_preset
from lab import cards
from lab.analysis import LOGIT_TOLERANCE, cache_logit_error, decoded_logits, plural
from lab.memory import fit, measured_peak
from lab.runs import ROOT, read_log
from model import GPT, VALUE_MODES, GPTConfig, KVCache

OUT = os.path.join(ROOT, "out-gpu-check")
VOCAB = 50257  # GPT-2's ids, padded to 50,304 by train.py: the logits at their real size
# In the card's dtype, cached logits may differ from uncached ones by this many times the uncached
# logits' own distance from float32's; a wrong cache moves them 10 to 50 times as far.
ROUNDINGS = 4
MEMORY_TOLERANCE = 0.15  # measured peak against lab.memory's estimate, either way


def synthetic_dataset(folder, tokens):
    """Random GPT-2 ids as a dataset: llm.c's train and val shards, and their meta.json."""
    os.makedirs(folder, exist_ok=True)
    rng, shards = np.random.default_rng(0), []
    for split, n in (("train", tokens), ("val", tokens // 8)):
        with open(os.path.join(folder, f"synthetic_{split}.bin"), "wb") as f:
            f.write(np.array([20240520, 1, n] + [0] * 253, "<i4").tobytes()
                    + rng.integers(0, VOCAB, n).astype("<u2").tobytes())
        shards.append({"file": f"synthetic_{split}.bin", "split": split, "tokens": n})
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump({"tokenizer": "gpt2", "vocab_size": VOCAB, "eot": VOCAB - 1, "shards": shards}, f)
    return folder


def run(*args):
    """A user's command, its output shown as it runs: (exited 0, what it printed on stdout)."""
    print(f"\n== python {' '.join(args)}", flush=True)
    with subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE,
                          text=True) as process:
        printed = "".join(print(line, end="", flush=True) or line for line in process.stdout)
    return process.returncode == 0, printed


def verdict(ok):
    return "PASS" if ok else "FAIL"


def mfu_said(mfu):
    return "-, no peak FLOP/s known for this device" if mfu is None else f"{100 * mfu:.1f}%"


def memory_rows(device, dtype, shape):
    """Eager steps of config/gpt2_124m.py at lab.memory's batch: peak memory, the estimate, MFU."""
    cfg = parse_args(train.SETTINGS, [os.path.join(ROOT, "config", "gpt2_124m.py")] + [
        f"--{k}={v}" for k, v in shape.items()], "")
    cuda, rows, T = device.startswith("cuda"), [], cfg.block_size
    free = torch.cuda.mem_get_info(device)[0] if cuda else float("inf")
    amp = (data.setup_device(device, dtype)[2],
           torch.amp.GradScaler(device.split(":")[0], enabled=dtype == "float16"))
    for mode in ("vanilla", "value_embed"):
        torch.manual_seed(cfg.seed)  # built on the CPU, where lab.memory measures it
        model = GPT(GPTConfig.from_dict({**vars(cfg), "value_mode": mode,
                                         "vocab_size": data.padded_vocab({"vocab_size": VOCAB})}))
        fitted, what = fit(model, cfg, free), f"config/gpt2_124m.py, {mode}, eager, {dtype}"
        if fitted is None:
            rows.append((f"{what}: peak memory", f"does not fit in {free / 2**30:.1f} GiB free",
                         "", ""))
            continue
        optimizer = model.to(device).configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                                          (cfg.beta1, cfg.beta2))
        batches = SimpleNamespace(next=lambda x=torch.randint(VOCAB, (fitted[0], T),
                                                              device=device): (x, x))
        step = lambda: train.training_step(model, optimizer, batches, 1, cfg.grad_clip, amp)  # noqa
        step()  # AdamW's moments are made in the first step
        held = sum(t.nbytes for t in [*model.parameters(), *(
            v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))])
        peak, t0 = held + measured_peak(step, device), time.time()
        for _ in range(3):
            step()
        if cuda:
            torch.cuda.synchronize(device)  # the steps' kernels have all run
        seconds, peak_flops = time.time() - t0, cards.peak_flops(device, dtype)
        mfu = peak_flops and model.flops_per_token(T) * fitted[0] * T * 3 / seconds / peak_flops
        rows += [(f"{what}: peak memory of a step, batch {fitted[0]} x {T} (lab.memory's)",
                  f"{peak / 2**30:.2f} GiB, estimated {fitted[2] / 2**30:.2f}",
                  f"{MEMORY_TOLERANCE:.0%} either way",
                  verdict(abs(peak - fitted[2]) <= MEMORY_TOLERANCE * fitted[2])),
                 (f"{what}: MFU at that batch", mfu_said(mfu), "reported", "")]
        del model, optimizer, batches, step
    return rows


def unit_attention(model):
    """Queries and keys drawn anew at std n_embd^-1/2, so attention scores spread about 1 and
    attention picks positions: a cache that stores or reads a wrong one then moves the logits far
    past rounding (model.py's std of 0.02 leaves attention near uniform, where it barely shows)."""
    c = model.config
    with torch.no_grad():
        for block in model.transformer.h:  # c_attn's rows: q (n_embd), k (kv_dim), then v
            torch.nn.init.normal_(block.attn.c_attn.weight[:c.n_embd + c.kv_heads * c.head_dim],
                                  std=c.n_embd ** -0.5)
    return model


def cache_rows(device, dtype, shape):
    """Cached against uncached logits in each mode, 8 tokens to block_size, 8 past; cache bytes."""
    config = {**read_preset(os.path.join(ROOT, "config", "gpu_class.py")), **shape,
              "vocab_size": data.padded_vocab({"vocab_size": VOCAB}), "dropout": 0.0}
    T, L, low = config["block_size"], config["n_layer"], getattr(torch, dtype)
    seq = torch.randint(VOCAB, (2, T + 8), generator=torch.Generator().manual_seed(0))
    seq, rows, fewer = seq.to(device), [], max(config["n_head"] // 2, 1)
    for mode, kv_heads in [(mode, 0) for mode in VALUE_MODES] + [("svformer", fewer)]:
        torch.manual_seed(0)
        model = GPT(GPTConfig.from_dict({**config, "value_mode": mode, "n_kv_head": kv_heads}))
        model = unit_attention(model).to(device).eval()
        exact = cache_logit_error(model, seq, T - 8)
        error = cache_logit_error(model, seq, T - 8, low)
        rounding = (decoded_logits(model, seq, T - 8, False, low)
                    - decoded_logits(model, seq, T - 8, False)).abs().max().item()
        heads = f" ({plural(kv_heads, 'key/value head')})" if kv_heads else ""
        rows.append((f"{mode}{heads}: cached against uncached logits, tokens {T - 8} to "
                     f"{T + 8} (past {T}: refilled)",
                     f"float32 {exact:.1e}, {dtype} {error:.1e}",
                     f"float32 {LOGIT_TOLERANCE:.0e}; {dtype} {ROUNDINGS} x its rounding "
                     f"({rounding:.1e})",
                     verdict(exact <= LOGIT_TOLERANCE
                             and error <= max(ROUNDINGS * rounding, LOGIT_TOLERANCE))))
    bytes_of = {(mode, h): KVCache(GPTConfig.from_dict({**config, "value_mode": mode,
                                                         "n_kv_head": h}), 1, T, device, low)
                .nbytes() for mode in ("vanilla", "svformer") for h in (0, fewer)}
    rows.append((f"SVFormer's KV cache against vanilla's, {T} tokens in {dtype}, {L} layers",
                 f"{bytes_of['svformer', 0]:,} of {bytes_of['vanilla', 0]:,} bytes",
                 f"exactly (L+1)/(2L) = {L + 1}/{2 * L}, and with "
                 f"{plural(fewer, 'key/value head')}",
                 verdict(all(bytes_of["svformer", h] * 2 * L == bytes_of["vanilla", h] * (L + 1)
                             for h in (0, fewer)))))
    return rows


def class_rows(args, steps, peak_flops):
    """compare.py config/gpu_class.py, vanilla and value embeddings, steps steps each."""
    out = os.path.join(OUT, "compare")
    ok, _ = run("compare.py", "config/gpu_class.py", *args, "--modes=vanilla,value_embed",
                "--seeds=1", "--noise_floor=0", "--analysis_samples=4", f"--out_dir={out}")
    logs = {m: read_log(os.path.join(out, f"{m}_seed1")) for m in ("vanilla", "value_embed")}
    finals = {m: [e for e in log if e["kind"] == "final"] for m, log in logs.items()}
    speeds = [e["tokens_per_sec"] for e in logs["vanilla"] if e["kind"] == "train"]
    ckpt = os.path.join(out, "vanilla_seed1", "ckpt.pt")  # its FLOPs per token
    mfu = peak_flops and speeds and os.path.isfile(ckpt) and (
        data.load_checkpoint(ckpt)["flops_per_token"] * speeds[-1] / peak_flops)
    compiled = "compiled" if "--compile=False" not in args else "eager"
    return [(f"compare.py config/gpu_class.py, {steps} steps, {compiled}: vanilla, value "
             f"embeddings, each through train.py and lab.evaluate at 50,304 ids", ", ".join(
                 f"{m} {f[-1]['val_loss_full']:.3f}" for m, f in finals.items() if f),
             "exit 0, a whole-split loss each", verdict(ok and all(finals.values()))),
            (f"MFU of its {compiled} steps (vanilla, the first aside)",
             mfu_said(mfu or None), "reported", "")]


def losses(out_dir):
    """The loss estimates a run logged: (step, train, val) at 4 decimals, as train.py prints."""
    return [(e["iter"], round(e["train_loss"], 4), round(e["val_loss"], 4))
            for e in read_log(out_dir) if e["kind"] == "eval"]


def resume_row(what, argv, steps, whole):
    """train.py argv for steps // 2 steps, then --resume to steps, against whole's losses."""
    halves = os.path.join(OUT, "resumed-" + os.path.basename(whole))
    first, _ = run("train.py", *argv, f"--max_iters={steps // 2}", f"--lr_decay_iters={steps}",
                   f"--out_dir={halves}")
    second, _ = run("train.py", "--resume", f"--max_iters={steps}", f"--out_dir={halves}")
    same = first and second and losses(halves) == losses(whole) != []
    return (f"{what} resumed at step {steps // 2}", "equal" if same else "different",
            "the uninterrupted run's train and val losses, 4 decimals", verdict(same))


def gpu_check(device="cuda", dtype="auto", shape=None, steps=20, tokens=4_000_000):
    """Every part, then the table: 1 if a check failed. shape: the CPU test's tiny settings."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("bench.py --gpu_check: no CUDA GPU here (torch sees none): nothing to check")
        return 0
    shutil.rmtree(OUT, ignore_errors=True)  # never read an earlier check's files as this one's
    shape, dtype = shape or {}, data.setup_device(device, dtype)[1]  # auto: bf16, a T4 fp16
    settings = [f"--{k}={v}" for k, v in shape.items()] + [
        f"--device={device}", f"--dtype={dtype}", f"--max_iters={steps}",
        f"--eval_interval={steps // 2}", "--eval_iters=2", "--log_interval=5"]
    dataset = synthetic_dataset(os.path.join(OUT, "data"), tokens)
    plays = ["config/plays_gpu.py", "--compile=False", *settings, f"--lr_decay_iters={steps}"]
    whole = os.path.join(OUT, "plays")
    vanilla = os.path.join(OUT, "compare", "vanilla_seed1")
    model_shape = {k: v for k, v in shape.items() if k in GPTConfig.__dataclass_fields__}

    def resume_class():  # the class's vanilla run again, from its own settings, compiled
        if not os.path.isfile(os.path.join(vanilla, "ckpt.pt")):
            return [("the class's vanilla run resumed", "no checkpoint", "", "FAIL")]
        config = data.load_checkpoint(os.path.join(vanilla, "ckpt.pt"))["config"]
        return [resume_row(f"the class's vanilla run, compile={config['compile']}, {dtype},",
                           [f"--{k}={v}" for k, v in config.items()], steps, vanilla)]

    def plays_and_samples():
        if not os.path.isdir(os.path.join(ROOT, data.DATA_ROOT, data.DEFAULT_DATASET)):
            run("prepare.py")
        ran, _ = run("train.py", *plays, f"--out_dir={whole}")
        block_size = {**read_preset(os.path.join(ROOT, plays[0])), **shape}["block_size"]
        start = ("O Romeo, Romeo, wherefore art thou Romeo? " * 99)[:block_size + 16]
        texts = [run("sample.py", f"--out_dir={whole}", f"--start={start}", "--temperature=0",
                     "--max_new_tokens=32", f"--device={device}", "--dtype=float32",
                     f"--use_cache={cache}") for cache in (True, False)]
        same = ran and texts[0][0] and texts[1][0] and texts[0][1] == texts[1][1]
        return [resume_row(f"config/plays_gpu.py, eager, {dtype},", plays, steps, whole),
                ("sample.py with and without the KV cache: greedy, float32, a prompt longer "
                 "than block_size", "equal" if same else "different", "the same text",
                 verdict(same))]
    parts = {"memory": lambda: memory_rows(device, dtype, shape),
             "cache": lambda: cache_rows(device, dtype, model_shape),
             "class": lambda: class_rows([f"--dataset={dataset}", *settings], steps,
                                         cards.peak_flops(device, dtype)),
             "plays": plays_and_samples, "resume": resume_class}
    rows, t_start = [], time.time()
    for part in parts.values():
        t0 = time.time()
        rows += [(*row, f"{time.time() - t0:.0f}" if not i else "") for i, row in enumerate(part())]
    return report(device, rows, time.time() - t_start)


def report(device, rows, seconds):
    """The table on stdout and in report.json; 1 if a check failed, else 0."""
    failed = sum(row[3] == "FAIL" for row in rows)
    rows.append(("all of the above", "", "", f"{failed} FAIL" if failed else "PASS",
                 f"{seconds:.0f}"))
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else device
    print(f"\n## bench.py --gpu_check on {name}, torch {torch.__version__}\n\n"
          "| check | measured | tolerance | verdict | s |\n|---|---|---|---|---|\n" +
          "\n".join("| " + " | ".join(cell or "-" for cell in row) + " |" for row in rows))
    with data.atomic_write(os.path.join(OUT, "report.json"), "w") as f:
        json.dump({"device": name, "torch": torch.__version__, "checks": [dict(zip(
            ("check", "measured", "tolerance", "verdict", "seconds"), row)) for row in rows]},
            f, indent=1)
    return 1 if failed else 0
