"""Issue 47, without a GPU: what each device gets (the GPUs' capabilities mocked), MFU in the
log, compare.py's runs spread over the GPUs, --plan's commands run by another engine
(`xargs -P 2`) giving compare.py's own tables, and bench.py --gpu_check."""
import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import bench
import compare
import configurator
import data
import train
from lab import gpu_check, runs
from lab import analysis
from lab.analysis import gpu_peak_flops
from model import GPT, GPTConfig
from test_compare import TINY, data_dir  # noqa: F401 (a fixture: compare's tiny dataset)

ROOT = Path(__file__).resolve().parent.parent


def pretend(monkeypatch, cuda=None, native_bf16=False, mps=False, count=1):
    """This torch sees a CUDA GPU named `cuda` (or none) and/or Apple's MPS."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda is not None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count if cuda else 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: cuda)
    # torch's own default counts emulated bf16 as bf16: only including_emulation=False tells
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: native_bf16 or including_emulation)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


@pytest.mark.parametrize("gpu,native,mps,expected", [
    ("NVIDIA A100-SXM4-80GB", True, False, ("cuda", "bfloat16")),
    ("Tesla T4", False, False, ("cuda", "float16")),  # emulated bf16 no longer counts
    ("Tesla V100-SXM2-16GB", False, False, ("cuda", "float16")),
    (None, False, True, ("mps", "float32")),
    (None, False, False, ("cpu", "float32")),
])
def test_auto_picks_native_precision_on_every_device(monkeypatch, gpu, native, mps, expected):
    pretend(monkeypatch, gpu, native, mps)
    device, dtype, autocast = data.setup_device("auto", "auto")
    assert (device, dtype) == expected
    assert isinstance(autocast, contextlib.nullcontext) == (dtype == "float32")
    if gpu and not native:  # asked for by name where it is only emulated: one line, the way out
        with pytest.raises(configurator.ConfigError, match="no native bfloat16; use float16"):
            data.setup_device("auto", "bfloat16")


@pytest.mark.parametrize("mode", ["vanilla", "resformer", "svformer", "value_embed"])
def test_what_the_mac_gets_trains_every_mode(monkeypatch, data_dir, tmp_path, mode):
    """On MPS auto is float32 without autocast (MPS's autocast is young; --dtype tries it). The
    MPS device itself cannot run here: the four modes train a step with what auto picks there,
    on the CPU."""
    pretend(monkeypatch, mps=True)
    _, dtype, autocast = data.setup_device("auto")
    assert dtype == "float32"
    monkeypatch.undo()
    cfg = configurator.defaults(train.SETTINGS, dataset=data_dir, out_dir=str(tmp_path),
                                n_layer=2, n_head=2, n_embd=16, block_size=16, batch_size=4,
                                max_iters=2, eval_interval=2, eval_iters=1, device="cpu",
                                dtype=dtype, value_mode=mode, warmup_iters=1)
    with contextlib.redirect_stdout(io.StringIO()):
        assert train.train(cfg)["iter"] == 2


def test_gpu_peak_lookup():
    """The peak table behind MFU (bench.py's column, the GPU check's verdict): torch's names for
    the Hopper parts (the NVL cards are slower than SXM, despite the substring), whole words only
    (an L40 is no L4, an RTX A1000 no A100), no peak for float32 or a GPU not listed."""
    peak = lambda name: gpu_peak_flops(name, "bfloat16")  # noqa: E731
    assert peak("NVIDIA H100 80GB HBM3") == peak("NVIDIA H200") == 989.4e12
    assert peak("NVIDIA H100 NVL") == peak("NVIDIA H200 NVL") == 835e12
    assert peak("NVIDIA H100 PCIe") == 756e12 and peak("NVIDIA GH200 480GB") == 989.4e12
    assert peak("NVIDIA A10G") == 70e12 and peak("NVIDIA A100-SXM4-80GB") == 312e12
    for unlisted in ("NVIDIA L40", "NVIDIA RTX A1000", "NVIDIA T400", "Some Future GPU"):
        assert peak(unlisted) is None, unlisted
    assert gpu_peak_flops("NVIDIA H100", "float32") is None


def test_mfu_counts_the_matmul_weights_and_attention():
    """MFU is the FLOP/s achieved over the peak, by PaLM's count: 6 per matmul weight a token
    meets plus attention's 12 L C T; a lookup table (value embeddings') multiplies nothing."""
    config = GPTConfig(n_layer=3, n_head=4, n_embd=32, block_size=16, vocab_size=64)
    for mode in ("vanilla", "value_embed"):
        model = GPT(GPTConfig(**{**vars(config), "value_mode": mode}))
        tables = sum(m.weight.numel() for name, m in model.named_modules()
                     if isinstance(m, torch.nn.Embedding) and name.endswith("value_embed"))
        flops = 6 * (model.num_params() - tables) + 12 * 3 * 32 * 16
        assert analysis.mfu(model, 16, 1000, 1e12) == pytest.approx(flops * 1000 / 1e12)


def test_compare_spreads_its_runs_over_the_gpus(monkeypatch, tmp_path):
    """Each run pinned to one GPU (CUDA_VISIBLE_DEVICES), the one running the fewest; with
    --jobs=4 on 2 GPUs, two runs each. The ids are those the user's CUDA_VISIBLE_DEVICES names."""
    started = []

    class Run:  # a stand-in for a train.py process: it finishes when told
        def __init__(self, args, stdout, stderr, env):
            started.append(env.get("CUDA_VISIBLE_DEVICES"))

        returncode = 0

        def poll(self):
            return 0  # done at once

    monkeypatch.setattr(runs.subprocess, "Popen", Run)
    monkeypatch.setattr(runs, "summarise", lambda cfg, run_dir, samples, threads: {
        "val_loss_full": 1.0})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    grid = [((f"v{i}", 1, ""), {"out_dir": str(tmp_path / f"v{i}"), "max_iters": 1,
                                "seed": 1, "value_mode": "vanilla"}) for i in range(6)]
    monkeypatch.setattr(runs, "command", lambda cfg, run_dir: (["train.py"], False))
    with contextlib.redirect_stdout(io.StringIO()):
        done, _, failed = runs.run_grid(grid, jobs=4, threads=1, samples=1, gpus=2)
    assert started[:4] == ["2", "5", "2", "5"] and set(started) == {"2", "5"}
    assert len(done) == 6 and not failed
    assert runs.gpu_ids(2) == ["2", "5"]


def test_compare_knows_each_device_from_the_one_resolver(monkeypatch):
    """compare.py and the machine it names decide 'auto' as train.py does (cuda > mps > cpu):
    on a Mac, one job on the one MPS device (it used to start one per CPU core) and the
    machine named MPS, not the CPU."""
    pretend(monkeypatch, mps=True)
    assert data.setup_device("auto")[0] == "mps"
    assert runs.hardware("auto").startswith("Apple MPS")
    pretend(monkeypatch, "NVIDIA H200", True, count=8)
    assert runs.hardware("auto", 8).startswith("8 x NVIDIA H200")  # the comparison's machine
    assert runs.hardware("auto").startswith("NVIDIA H200")  # a run's: one GPU
    assert runs.hardware("cuda:3").startswith("NVIDIA H200")


def test_plan_prints_each_run_and_any_engine_runs_them_to_the_same_tables(data_dir, tmp_path):
    """--plan prints one shell command per run and trains nothing; `xargs -P 2` runs them from
    the project's folder; the same compare command then tabulates them (training nothing) into
    the tables compare.py makes when it trains the grid itself."""
    if shutil.which("xargs") is None:
        pytest.skip("needs xargs")
    args = TINY + [f"--dataset={data_dir}", "--seeds=1,2", "--modes=vanilla,svformer",
                   "--lrs="]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def compare_py(*more):
        done = subprocess.run([sys.executable, "compare.py", *args, *more], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    printed = compare_py(f"--out_dir={tmp_path / 'planned'}", "--plan")
    (tmp_path / "runs.txt").write_text(printed)  # as `> runs.txt` writes it
    lines = subprocess.run(f"wc -l < {tmp_path / 'runs.txt'}", shell=True, capture_output=True,
                           text=True).stdout  # what the README's SLURM line counts
    plan = printed.splitlines()
    assert len(plan) == 5 == int(lines) and not list((tmp_path / "planned").glob("*/log.jsonl"))
    assert all(line.startswith("OMP_NUM_THREADS=1 python train.py --") for line in plan
               if "nudge" not in line)  # the noise floor's run: python -m lab.nudged
    engine = subprocess.run(f"xargs -d '\\n' -n 1 -P 2 sh -c < {tmp_path / 'runs.txt'}",
                            shell=True, cwd=ROOT, env={**env, "PATH": os.environ["PATH"]},
                            capture_output=True, text=True, timeout=600)
    assert engine.returncode == 0, engine.stderr[-2000:]
    assert compare_py(f"--out_dir={tmp_path / 'planned'}", "--plan") == ""  # nothing left
    tabulated = compare_py(f"--out_dir={tmp_path / 'planned'}")
    assert ": training" not in tabulated
    compare_py(f"--out_dir={tmp_path / 'itself'}")
    planned, itself = (json.load(open(tmp_path / name / "results.json"))
                       for name in ("planned", "itself"))
    for name, r in itself["modes"].items():
        mine = planned["modes"][name]
        assert mine["val_loss"] == r["val_loss"] and mine.get("paired") == r.get("paired")
        assert mine["curves"] == r["curves"] and mine["attention_entropy"] == r["attention_entropy"]
    tables = [the_numbers((tmp_path / name / "results.md").read_text())
              for name in ("planned", "itself")]
    assert tables[0] == tables[1] and len(tables[0]) > 40


def the_numbers(md):
    """results.md without what depends on the clock: the line with the command (the folder,
    the minutes, runs reused) and each run's speed (the costs table's last column)."""
    lines, costs = [], False
    for line in md.splitlines():
        costs = line.startswith("## What each variant costs") or (costs and
                                                                  not line.startswith("## "))
        if not line.startswith("`python compare.py"):
            lines.append(line.rsplit("|", 2)[0] if costs and line.startswith("| ") else line)
    return lines


def test_plan_with_tune_is_refused_in_one_line(data_dir):
    with pytest.raises(configurator.ConfigError, match="--plan lists a fixed grid"):
        compare.main(TINY + [f"--dataset={data_dir}", "--tune", "--plan"])


def test_the_gpu_check_says_in_one_line_that_there_is_no_gpu(capsys):
    assert torch.cuda.device_count() == 0 or pytest.skip("a GPU is here: the check would run")
    assert bench.main(["--gpu_check"]) == 0
    out = capsys.readouterr().out
    assert out == "bench.py --gpu_check: no CUDA GPU here (torch sees none): nothing to check\n"


def test_the_gpu_checks_steps_run_end_to_end_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """The check's own steps (the preset's run, a resume, float16 with loss scaling, a mode
    compiled, the attention kernel, cached against uncached logits), here on the CPU with a tiny
    preset in place of GPT-2 small's shape, and its report."""
    preset = tmp_path / "tiny.py"
    preset.write_text('n_layer = 2\nn_head = 2\nn_embd = 16\nblock_size = 32\nbatch_size = 4\n')
    monkeypatch.setattr(gpu_check, "OUT", str(tmp_path / "out-gpu-check"))
    monkeypatch.setattr(gpu_check, "TOKENS", 40_000)
    assert gpu_check.gpu_check([str(preset), "--warmup_iters=1"], gpus=1, device="cpu",
                               modes=("svformer",)) == 0
    report = json.load(open(tmp_path / "out-gpu-check" / "report.json"))
    assert report["device"] == "cpu" and all(c["ok"] for c in report["checks"])
    assert len(report["checks"]) == 8 and report["checks"][5]["modes"]["svformer"]["loss_finite"]
    printed = capsys.readouterr().out
    assert printed.count("  ok     ") == 8 and "FAILED" not in printed
    assert "cached against uncached logits, float32: largest difference" in printed


def test_the_one_gpu_class_preset_runs_end_to_end_at_a_reduced_size(tmp_path, monkeypatch):
    """config/gpu_class.py as a class runs it (every variant it names, the noise floor, GPT-2's
    vocabulary), on the CPU at a reduced size: shape, steps and seeds cut, nothing else."""
    monkeypatch.setattr(gpu_check, "TOKENS", 20_000)
    dataset = gpu_check.synthetic_dataset(str(tmp_path / "data"))
    preset = str(ROOT / "config" / "gpu_class.py")
    status = compare.main([preset, f"--dataset={dataset}", f"--out_dir={tmp_path / 'out'}",
                           "--seeds=1", "--n_layer=2", "--n_head=2", "--n_embd=16",
                           "--block_size=32", "--batch_size=4", "--max_iters=4",
                           "--warmup_iters=1", "--eval_interval=2", "--eval_iters=1",
                           "--analysis_samples=2", "--compile=False", "--device=cpu"])
    assert status == 0
    results = json.load(open(tmp_path / "out" / "results.json"))
    named = configurator.read_preset(preset)["modes"].split(",")
    assert set(named) | {"vanilla:nudge=1"} == set(results["modes"])
    assert all(math.isfinite(r["val_loss_mean"]) for r in results["modes"].values())


def test_a_batch_too_big_for_the_gpu_is_halved_keeping_the_tokens_per_step():
    """On a GPU (its free memory given, as lab.memory gives a T4's), batch_size halves and the
    micro-steps double until a step fits in 90% of it; where even the smallest batch cannot fit,
    one line names the settings to change. The estimate grows with the batch, by the tokens."""
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=320)
    model = train.GPT(config)
    cfg = configurator.defaults(train.SETTINGS, batch_size=32, block_size=64,
                                gradient_accumulation_steps=2)
    roomy = train.fit_memory(model, cfg, 1, "cpu", "float32", free=2**34)
    assert roomy[0][:2] == (32, 2) and "does not fit" not in roomy[1]
    half = train.fit_memory(model, configurator.defaults(
        train.SETTINGS, **{**vars(cfg), "batch_size": 16}), 1, "cpu", "float32", free=2**34)
    per_token = (roomy[0][2] - half[0][2]) / (16 * 64)  # the estimate grows with the tokens
    fixed = roomy[0][2] - per_token * 32 * 64
    assert per_token > 8 * 320  # the logits' gradients alone
    assert fixed >= 16 * sum(p.numel() for p in model.parameters())  # weights, grads, AdamW's
    free = (fixed + per_token * 8 * 64) / 0.9 + 1  # room for 8 sequences, not for 16
    (batch, accum, need), line = train.fit_memory(model, cfg, 1, "cpu", "float32", free=free)
    assert (batch, accum) == (8, 8) and need <= 0.9 * free
    assert "batch_size 32 does not fit: 8 x 8 micro-steps instead, the same tokens per step" in line
    with pytest.raises(configurator.ConfigError, match="too much; use a smaller --batch_size"):
        train.fit_memory(model, cfg, 1, "cpu", "float32", free=fixed / 2)


def test_what_a_forward_keeps_once_is_counted_once_not_once_a_token():
    """A forward keeps some tensors for its backward once, whatever the batch (views of the
    weights; under autocast their 16-bit copies). Counted once per token, as a first version
    measured them (one sequence, divided by its length), they made GPT-2 small's estimate six
    times what was measured (762 MiB a 1,024-token sequence). Now the estimate of what a batch
    of 8 keeps is what a forward of 8 sequences really keeps, within 10%."""
    model = train.GPT(GPTConfig(n_layer=2, n_head=4, n_embd=256, block_size=64, vocab_size=8192))
    kept = {}

    def keep(t):  # what the backward will read, each storage once, not counting the weights
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() * (
            not isinstance(t, torch.nn.Parameter))
        return t
    x = torch.zeros(8, 64, dtype=torch.long)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(x, x)
    cfg = configurator.defaults(train.SETTINGS, batch_size=8, block_size=64)
    need = train.fit_memory(model, cfg, 1, "cpu", "float32", free=2**40)[0][2]
    estimate = need - 16 * model.num_params(non_embedding=False) - 8 * 8192 * 8 * 64
    assert 0.9 * sum(kept.values()) <= estimate <= 1.1 * sum(kept.values())


def test_a_run_that_cannot_fit_is_refused_in_one_line_before_it_starts(data_dir, tmp_path,
                                                                        capsys):
    """More memory than this machine has: one line with the fix, before any evaluation and with
    nothing written in out_dir (here on the CPU, where nothing is halved)."""
    with pytest.raises(configurator.ConfigError) as refused:
        train.main([f"--dataset={data_dir}", f"--out_dir={tmp_path / 'out'}", "--n_layer=2",
                    "--n_head=2", "--n_embd=16", "--block_size=64", "--batch_size=2000000",
                    "--device=cpu"])
    message = str(refused.value)
    assert message.startswith("memory: about ") and "free on cpu: too much; use a smaller " \
        "--batch_size or --block_size" in message and "\n" not in message
    assert capsys.readouterr().out == "" and not (tmp_path / "out" / "log.jsonl").exists()


def test_the_first_step_compiling_is_not_counted_into_the_first_log_line(data_dir, tmp_path,
                                                                        monkeypatch):
    """torch.compile makes the first step take minutes: the first log line's ms/step, tok/s, MFU
    and ETA time the steps after it (nanoGPT skips its first iterations likewise)."""
    real, calls = train.training_step, []

    def slow_first(*args):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(1.0)  # as compiling does
        return real(*args)
    monkeypatch.setattr(train, "training_step", slow_first)
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        train.main([f"--dataset={data_dir}", f"--out_dir={out}", "--n_layer=1", "--n_head=2",
                    "--n_embd=16", "--block_size=16", "--batch_size=2", "--max_iters=4",
                    "--log_interval=2", "--eval_interval=4", "--eval_iters=1", "--device=cpu"])
    steps = [r for r in map(json.loads, open(out / "log.jsonl")) if r["kind"] == "train"]
    assert [r["iter"] for r in steps] == [2, 4] and len(calls) == 4
    assert steps[0]["ms_per_step"] < 400  # counted in, the sleep alone would make it 500 or more
