"""The GPU path of config/gpt2_124m.py (torch.compile, bfloat16), exercised on the CPU: a tiny
model trained under bfloat16 autocast and with torch.compile (CPU inductor, which needs a C
compiler), resumed from its checkpoint and sampled from. About a minute, most of it compiling.
Run: pytest -q test_gpu_path.py"""
import io
import json
import os
import subprocess
import sys

import pytest
import torch

import configurator
import prepare
import sample
import train
from data import load_checkpoint

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TEXT = "".join(f"KING {i % 7}:\nWhat say you, my lord, of the {i % 13} ships upon the sea?\n\n"
               for i in range(400))
# the preset, shrunk to a tiny model: its compile=True, bias=True, accumulation and schedule stay
GPT2_TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
             "--gradient_accumulation_steps=2", "--lr_decay_iters=8", "--warmup_iters=2",
             "--eval_interval=4", "--eval_iters=2", "--log_interval=1", "--device=cpu",
             "--dtype=bfloat16"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    docs = [TEXT[i:i + 2000] for i in range(0, len(TEXT), 2000)]
    return prepare.prepare(configurator.defaults(
        prepare.SETTINGS, name="tiny_byte", out_root=str(tmp_path_factory.mktemp("data")),
        quiet=True), documents=docs)


@pytest.fixture(scope="module")
def inductor():
    """Skips where torch.compile cannot build CPU kernels (no C compiler, unsupported platform)."""
    try:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(4))
    except Exception as e:  # inductor raises its own types, wrapped by dynamo
        pytest.skip(f"torch.compile does not work here ({type(e).__name__}: "
                    f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})")


def train_losses(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [(r["iter"], r["loss"]) for r in map(json.loads, f) if r["kind"] == "train"]


def sample_from(out_dir, dtype):
    """(text, report, result) of greedy sample.py, cached, under dtype."""
    out, err = io.StringIO(), io.StringIO()
    cfg = configurator.parse_args(sample.SETTINGS, [
        f"--out_dir={out_dir}", "--device=cpu", f"--dtype={dtype}", "--start=KING",
        "--num_samples=1", "--max_new_tokens=24", "--temperature=0"], "sample.py")
    result = sample.sample(cfg, out, err)
    return out.getvalue(), err.getvalue(), result


def test_bfloat16_run_resumes_exactly_and_samples_with_a_bfloat16_cache(data_dir, tmp_path,
                                                                        capsys):
    """CPU autocast in bfloat16: weights and optimizer stay float32, a resumed run logs exactly
    the straight run's losses, and sampling in bfloat16 keeps its KV cache in bfloat16."""
    run = dict(dataset=data_dir, out_dir=str(tmp_path / "straight"),
               n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=8, max_iters=12,
               lr_decay_iters=12, warmup_iters=2, learning_rate=1e-2, min_lr=1e-3,
               eval_interval=6, eval_iters=2, log_interval=1, device="cpu",
               dtype="bfloat16", dropout=0.1)
    summary = train.train(configurator.defaults(train.SETTINGS, **run))
    assert summary["iter"] == 12 and summary["evals"][-1]["val_loss"] < 5.0  # it learns
    half = dict(run, out_dir=str(tmp_path / "resumed"), max_iters=6)
    train.train(configurator.defaults(train.SETTINGS, **half))
    capsys.readouterr()
    # as on the command line: only --max_iters given; the data, device and dtype come from the
    # checkpoint
    train.main([f"--out_dir={half['out_dir']}", "--resume", "--max_iters=12"])
    shown = capsys.readouterr().out
    assert " device=cpu dtype=bfloat16 " in shown and f" dataset={data_dir} " in shown
    assert "128 tokens/step (8 x 16 x 1 micro-step x 1 process)" in shown
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "straight")  # bitwise
    ckpt = load_checkpoint(str(tmp_path / "resumed" / "ckpt.pt"))
    assert all(v.dtype == torch.float32 for v in ckpt["model"].values() if v.is_floating_point())

    text, report, bf16 = sample_from(run["out_dir"], "bfloat16")
    _, _, fp32 = sample_from(run["out_dir"], "float32")
    assert text.startswith("KING") and len(bf16["tokens"][0]) == 24
    assert "cache on, cpu bfloat16: 24 tokens" in report
    assert bf16["cache_bytes"] * 2 == fp32["cache_bytes"]  # the cache really is bfloat16


# inductor's own use of torch.jit, not ours
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_gpt2_preset_compiled_in_bfloat16_trains_resumes_and_samples(inductor, data_dir,
                                                                     tmp_path, capsys):
    """python train.py config/gpt2_124m.py, shrunk, on the CPU: compiled (inductor) and in
    bfloat16, 4 steps, then --resume to 8 (compiled again); the checkpoint's keys are the
    uncompiled model's, and it samples in bfloat16. The first run is in this process (the
    inductor check warmed the compiler up), the resumed one a fresh `python train.py --resume`
    (it finds the first one's kernels in inductor's on-disk cache)."""
    out = tmp_path / "out"
    preset = os.path.join(HERE, "config", "gpt2_124m.py")
    train.main([preset, *GPT2_TINY, f"--dataset={data_dir}", f"--out_dir={out}",
                "--max_iters=4"])
    shown = capsys.readouterr().out
    assert " device=cpu dtype=bfloat16 compile=True" in shown
    assert "128 tokens/step (4 x 16 x 2 micro-steps x 1 process)" in shown
    resumed = subprocess.run([sys.executable, "train.py", f"--out_dir={out}", "--resume",
                              "--max_iters=8"], cwd=HERE, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {out} at step 4" in resumed.stdout
    assert " device=cpu dtype=bfloat16 compile=True" in resumed.stdout
    assert "128 tokens/step (4 x 16 x 2 micro-steps x 1 process)" in resumed.stdout
    losses = train_losses(out)
    assert [i for i, _ in losses] == list(range(1, 9)) and losses[-1][1] < losses[0][1]

    raw = torch.load(out / "ckpt.pt", weights_only=True)
    assert raw["config"]["compile"] and raw["config"]["dtype"] == "bfloat16"
    assert raw["iter_num"] == 8 and not any(k.startswith("_orig_mod.") for k in raw["model"])
    text, report, result = sample_from(str(out), "bfloat16")
    assert text.startswith("KING") and len(result["tokens"][0]) == 24
    assert "cache on, cpu bfloat16: 24 tokens" in report
