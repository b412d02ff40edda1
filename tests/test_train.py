"""Tests for train.py on tiny data: every mode trains, exact resume, errors, Ctrl-C, NaN,
torchrun."""
import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import prepare
import shards
import train
from configurator import ConfigError, load_config, read_preset

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TEXT = "".join(f"KING {i % 7}:\nWhat say you, my lord, of the {i % 13} ships upon the sea?\n\n"
               for i in range(400))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    docs = [TEXT[i:i + 2000] for i in range(0, len(TEXT), 2000)]
    return prepare.prepare(documents=docs, name="tiny_byte", out_root=str(root), quiet=True)


def tiny_cfg(data_dir, out_dir, **kw):
    cfg = dict(train.DEFAULTS, dataset=data_dir, out_dir=str(out_dir), n_layer=2, n_head=2,
               n_embd=32, block_size=16, batch_size=8, max_iters=30, lr_decay_iters=30,
               warmup_iters=5, learning_rate=1e-2, min_lr=1e-3, eval_interval=10, eval_iters=2,
               log_interval=1, device="cpu")
    cfg.update(kw)
    return cfg


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("mode", ["vanilla", "resformer", "svformer"])
def test_each_mode_trains_and_writes_log_and_checkpoint(data_dir, tmp_path, mode):
    summary = train.train(tiny_cfg(data_dir, tmp_path, value_mode=mode))
    assert summary["status"] == "done" and summary["iter"] == 30
    evals = summary["evals"]
    assert [e["iter"] for e in evals] == [0, 10, 20, 30]
    # it learns (starts near ln 320 = 5.8)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0
    log = read_log(tmp_path)
    assert [r["iter"] for r in log if r["kind"] == "train"] == list(range(1, 31))
    assert all(r["tokens_per_sec"] > 0 and r["ms_per_step"] > 0
               for r in log if r["kind"] == "train")
    ckpt = shards.load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert ckpt["iter_num"] == 30 and ckpt["model_args"]["value_mode"] == mode
    assert ckpt["tokenizer"] == {"tokenizer": "byte", "vocab_size": 257, "eot": 256}
    assert ckpt["best_val_loss"] == min(e["val_loss"] for e in evals)
    assert not os.path.exists(str(tmp_path / "ckpt.pt.tmp"))


def test_learned_lambdas_step_at_their_own_learning_rate(data_dir, tmp_path, capsys):
    """lambda_lr_scale multiplies the lambdas' lr: 0 freezes them at their start while the
    weights learn; at 1 they move. (Adam moves a scalar by about lr per step.)"""
    def lambdas(scale):
        cfg = tiny_cfg(data_dir, tmp_path / str(scale), value_mode="resformer",
                       learnable_lambda=True, n_layer=3, max_iters=10, lr_decay_iters=10,
                       lambda_lr_scale=scale)
        summary = train.train(cfg)
        assert summary["evals"][-1]["val_loss"] < summary["evals"][0]["val_loss"] - 0.5
        mixing = summary["evals"][-1]["mixing"]  # layers 2..n, named as the model names them
        assert list(mixing) == [f"transformer.h.{i}.attn.value_lambdas" for i in (1, 2)]
        return np.array(list(mixing.values()))
    assert np.array_equal(lambdas(0.0), np.full((2, 2), 0.5))
    # the eval lines show them, layers 2..n, as the log records them
    assert ", value_lambdas 0.50/0.50 0.50/0.50\n" in capsys.readouterr().out
    moved = np.abs(lambdas(1.0) - 0.5).max()
    assert 0.005 < moved < 10 * 1e-2 + 1e-6  # at most about lr (1e-2) per step, 10 steps


def test_resume_equals_uninterrupted_run(data_dir, tmp_path):
    straight = tiny_cfg(data_dir, tmp_path / "straight", value_mode="resformer",
                        learnable_lambda=True)
    train.train(straight)
    # same schedule (lr_decay_iters)
    first_half = dict(straight, out_dir=str(tmp_path / "resumed"), max_iters=12)
    train.train(first_half)
    summary = train.train(dict(first_half, max_iters=30, resume=True))
    assert summary["iter"] == 30
    losses = lambda d: [(r["iter"], r["loss"]) for r in read_log(d) if r["kind"] == "train"]
    # bitwise: exact float equality
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")
    a = shards.load_checkpoint(str(tmp_path / "straight" / "ckpt.pt"))["model"]
    b = shards.load_checkpoint(str(tmp_path / "resumed" / "ckpt.pt"))["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# Ctrl-C (a real SIGINT) finishes the step it arrives in, then saves at the step boundary
@pytest.mark.parametrize("where,stopped_at", [("train", 15), ("eval", 10)])
def test_ctrl_c_saves_and_resume_continues_exactly(data_dir, tmp_path, monkeypatch, where,
                                                   stopped_at):
    cfg = tiny_cfg(data_dir, tmp_path / "a", dropout=0.1)  # dropout: the RNG state must resume too
    train.train(cfg)
    calls = {"train": 0, "eval": 0}
    real_next = train.Batches.next

    # eval windows come from generators seeded 1234, training's from cfg seed
    def interrupting_next(self):
        kind = "eval" if self.generator.initial_seed() == 1234 else "train"
        calls[kind] += 1
        if kind == where and calls[kind] == {"train": 15, "eval": 7}[where]:
            # train: while drawing step 14's batch; eval: in step 10's eval
            os.kill(os.getpid(), signal.SIGINT)
        return real_next(self)

    monkeypatch.setattr(train.Batches, "next", interrupting_next)
    summary = train.train(dict(cfg, out_dir=str(tmp_path / "b")))
    monkeypatch.undo()
    assert summary["status"] == "interrupted" and summary["iter"] == stopped_at
    assert shards.load_checkpoint(str(tmp_path / "b" / "ckpt.pt"))["iter_num"] == stopped_at
    train.train(dict(cfg, out_dir=str(tmp_path / "b"), resume=True))
    losses = lambda d: [(r["iter"], r["loss"]) for r in read_log(d) if r["kind"] == "train"]
    assert losses(tmp_path / "b") == losses(tmp_path / "a")


def test_second_ctrl_c_stops_at_once_and_keeps_the_last_checkpoint(data_dir, tmp_path, monkeypatch):
    calls = {"n": 0}
    real_next = train.Batches.next

    def two_interrupts(self):
        calls["n"] += 1
        if calls["n"] == 20:  # 4 eval batches at step 0, steps 1-10, 4 at step 10, steps 11 and 12
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.1)  # a second Ctrl-C (within a second, two signals count as one)
            os.kill(os.getpid(), signal.SIGINT)
        return real_next(self)

    monkeypatch.setattr(train.Batches, "next", two_interrupts)
    summary = train.train(tiny_cfg(data_dir, tmp_path))
    assert summary["status"] == "interrupted" and summary["iter"] < 30
    # the eval-time one, untouched
    assert shards.load_checkpoint(str(tmp_path / "ckpt.pt"))["iter_num"] == 10


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(data_dir, tmp_path, monkeypatch):
    real_ce = torch.nn.functional.cross_entropy
    calls = {"n": 0}

    def nan_after_a_while(*args, **kw):
        calls["n"] += 1
        loss = real_ce(*args, **kw)
        # 4 eval calls + 10 steps + 4 eval + 2 steps
        return loss * float("nan") if calls["n"] > 20 else loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", nan_after_a_while)
    summary = train.train(tiny_cfg(data_dir, tmp_path, eval_interval=10))
    assert summary["status"] == "diverged" and summary["iter"] == 13
    ckpt = shards.load_checkpoint(str(tmp_path / "ckpt.pt"))  # the one saved at step 10, still whole
    assert ckpt["iter_num"] == 10 and all(torch.isfinite(v).all()
                                          for v in ckpt["model"].values() if v.is_floating_point())


def test_killed_checkpoint_write_leaves_previous_loadable(data_dir, tmp_path, monkeypatch):
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=10))
    path = str(tmp_path / "ckpt.pt")

    def dies_mid_write(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        f.flush()
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt), shards.atomic_write(path) as f:
        torch.save({"anything": 1}, f)
    monkeypatch.undo()
    assert shards.load_checkpoint(path)["iter_num"] == 10
    assert not os.path.exists(path + ".tmp")  # removed; a SIGKILL would leave it, unread:
    (tmp_path / "half.pt").write_bytes(b"PK\x03\x04 half a checkpoint")
    with pytest.raises(ValueError, match="not a readable torch checkpoint"):
        shards.load_checkpoint(str(tmp_path / "half.pt"))


# torch.save into a Python file on a full disk: the write's OSError(ENOSPC), then torch's zip
# writer fails on it (or, writing to a path itself, only "basic_ios::clear: iostream error")
FULL_DISK = {
    "oserror": "raise OSError(errno.ENOSPC, 'No space left on device')",
    "torch": ("try:\n"
              "        raise OSError(errno.ENOSPC, 'No space left on device')\n"
              "    except OSError:\n"
              "        raise RuntimeError('[enforce fail at inline_container.cc:672] . '\n"
              "                           'unexpected pos 704 vs 598')")}


@pytest.mark.parametrize("kind", FULL_DISK)
def test_full_disk_while_saving_is_one_line_and_keeps_the_last_checkpoint(data_dir, tmp_path,
                                                                          kind):
    """The save at step 20 runs out of space halfway: one line says so and which checkpoint is
    kept (step 10's, whole), the exit is non-zero and the partial file is gone."""
    script = tmp_path / "full_disk.py"
    script.write_text(
        "import errno, runpy, sys, torch\n"
        "real_save, saves = torch.save, []\n"
        "def save(obj, f):\n"
        "    saves.append(obj['iter_num'])\n"
        "    if len(saves) == 1:\n"
        "        return real_save(obj, f)\n"
        "    f.write(b'PK\\x03\\x04 the first part of a checkpoint')\n"
        "    f.flush()\n"
        f"    {FULL_DISK[kind]}\n"
        "torch.save = save\n"
        f"sys.path.insert(0, {HERE!r})\n"
        f"sys.argv = ['train.py'] + sys.argv[1:]\n"
        f"runpy.run_path({os.path.join(HERE, 'train.py')!r}, run_name='__main__')\n")
    out = tmp_path / "out"
    args = [f"--{k}={v}" for k, v in tiny_cfg(data_dir, out).items() if v != train.DEFAULTS[k]]
    result = subprocess.run([sys.executable, str(script), *args], cwd=HERE, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "step 20: train loss" in result.stdout
    assert result.stderr == (f"error: no space left on device while saving {out / 'ckpt.pt'}; "
                             "the checkpoint of step 10 is kept (free some space, then add "
                             "--resume)\n")
    assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl", "train.lock"]
    assert shards.load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 10


def test_full_disk_at_the_first_save_says_nothing_was_saved(data_dir, tmp_path, monkeypatch):
    def full(obj, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(shards.DiskFull, match=r"while saving .*ckpt.pt; no checkpoint was saved$"):
        train.train(tiny_cfg(data_dir, tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["log.jsonl", "train.lock"]


def test_resume_with_a_different_model_is_a_clear_error(data_dir, tmp_path):
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=2))
    with pytest.raises(ValueError, match=r"the model differs \(n_layer: checkpoint 2 vs now 3"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=4, n_layer=3, resume=True))
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        train.train(tiny_cfg(data_dir, tmp_path / "empty", resume=True))


def test_missing_data_names_the_prepare_command(tmp_path):
    with pytest.raises(shards.DataError,
                       match="run python prepare.py --dataset=tinyshakespeare --tokenizer=gpt2"):
        train.train(tiny_cfg(str(tmp_path / "tinyshakespeare_gpt2"), tmp_path / "out"))


def run_script(*args, **kw):
    return subprocess.run([sys.executable, *args], cwd=HERE, capture_output=True, text=True,
                          timeout=120, **kw)


@pytest.mark.parametrize("arg,message", [
    ("--n_layers=4", "error: unknown setting --n_layers"),
    ("--n_layer=4.5", "error: --n_layer=4.5: n_layer must be int"),
    ("--value_mode=resformr", "error: value_mode must be one of")])
def test_bad_overrides_exit_with_one_line(arg, message, tmp_path):
    result = run_script("train.py", arg, f"--out_dir={tmp_path}")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr


def test_quickstart_preset_is_the_defaults():
    preset = read_preset(os.path.join(HERE, "config", "quickstart.py"))
    assert preset and all(train.DEFAULTS[k] == v for k, v in preset.items())
    # every key known, typed
    gpt2 = load_config(train.DEFAULTS, [os.path.join(HERE, "config", "gpt2_124m.py")])
    assert gpt2["batch_size"] * gpt2["block_size"] * gpt2["gradient_accumulation_steps"] == 2 ** 19
    with pytest.raises(ConfigError):
        load_config(train.DEFAULTS, ["--max_iters=many"])


def test_lr_schedule():
    cfg = dict(train.DEFAULTS, learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110)
    lrs = [train.get_lr(it, cfg) for it in range(130)]
    assert lrs[0] < lrs[5] < lrs[9] < 1.0 and lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55) and lrs[110] == pytest.approx(0.1) and lrs[129] == 0.1
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_torchrun_two_processes_gloo(data_dir, tmp_path):
    """2 CPU ranks under torchrun: identical parameters after training, only rank 0 writes files."""
    script = tmp_path / "ddp_check.py"
    script.write_text(
        "import os, sys, torch\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import train\n"
        "cfg = dict(train.DEFAULTS, **eval(sys.argv[1]))\n"
        "summary = train.train(cfg)\n"
        "torch.save(summary['model'].state_dict(), "
        "os.path.join(sys.argv[2], f\"rank{os.environ['RANK']}.pt\"))\n")
    out = tmp_path / "out"
    # gradient_accumulation_steps left at its default: one micro-step per rank
    overrides = tiny_cfg(data_dir, out, max_iters=6, eval_interval=3, value_mode="resformer")
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc_per_node=2", str(script), repr(overrides), str(tmp_path)],
                            cwd=HERE, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    saved = shards.load_checkpoint(str(out / "ckpt.pt"))["model"]
    assert all(torch.equal(rank0[k], saved[k]) for k in rank0)
    assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl", "train.lock"]
    log = read_log(out)
    # once, not once per rank
    assert [r["iter"] for r in log if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert result.stdout.count("step 6: train loss") == 1  # only rank 0 prints
    # the default accumulation: one micro-step on each rank
    assert "256 tokens/step (8 x 16 x 1 micro-step x 2 ranks)" in result.stdout


def test_torchrun_explicit_accumulation_that_does_not_divide_is_a_one_line_error(data_dir,
                                                                                  tmp_path):
    """An explicit gradient_accumulation_steps is the total over the ranks (the torchrun runs
    below give 2: one each); 3 cannot be shared by 2 ranks."""
    result = subprocess.run(torchrun("train.py", f"--dataset={data_dir}",
                                     f"--out_dir={tmp_path / 'out'}", "--device=cpu",
                                     "--gradient_accumulation_steps=3"),
                            cwd=HERE, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0 and "Traceback" not in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert set(errors) == {"error: --gradient_accumulation_steps=3 is the total over all ranks "
                           "and must divide by the 2 ranks (0: one micro-step per rank)"}
    assert not (tmp_path / "out" / "ckpt.pt").exists()


# ---- torchrun (gloo, 2 CPU ranks): resume, Ctrl-C; data edge cases; one run per out_dir ----

def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            *args]


def kill_launch(launcher):
    """SIGKILL torchrun and its ranks (each rank runs in a session of its own, so by pid)."""
    try:
        with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as f:
            ranks = [int(pid) for pid in f.read().split()]
    except OSError:
        ranks = []
    for pid in ranks + [launcher.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait()


def run_torchrun(*args, timeout=180):
    """(returncode, stdout, stderr) of a 2-rank torchrun launch; a timeout leaves nothing behind."""
    launcher = subprocess.Popen(torchrun(*args), cwd=HERE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_launch(launcher)
        raise
    return launcher.returncode, stdout, stderr


def run_under_torchrun(tmp_path, cfg, name):
    """train.train(cfg) on 2 gloo ranks; returns the finished process and, per rank, the training
    batches (x) that rank drew. One run per launch: a second init_process_group in the same
    processes reuses the first one's store keys and can hang."""
    script = tmp_path / "ddp_run.py"
    script.write_text(
        "import os, sys, torch\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import train\n"
        "drawn = []\n"
        "real_next = train.Batches.next\n"
        "def recording_next(self):  # training batches only: eval windows come from seed 1234\n"
        "    x, y = real_next(self)\n"
        "    if self.generator.initial_seed() != 1234:\n"
        "        drawn.append(x)\n"
        "    return x, y\n"
        "train.Batches.next = recording_next\n"
        "train.train(dict(train.DEFAULTS, **eval(sys.argv[1])))\n"
        "torch.save(drawn, sys.argv[2] + os.environ['RANK'] + '.pt')\n")
    returncode, stdout, stderr = run_torchrun(str(script), repr(cfg), str(tmp_path / name))
    assert returncode == 0, stderr[-3000:]
    return stdout, [torch.load(tmp_path / f"{name}{r}.pt") for r in range(2)]


def train_losses(out_dir):
    return [(r["iter"], r["loss"]) for r in read_log(out_dir) if r["kind"] == "train"]


def test_torchrun_resume_equals_uninterrupted_run(data_dir, tmp_path):
    """2 ranks stopped at step 8 and resumed to 16 log exactly the losses of 16 straight steps: each
    rank restores its own data stream and RNG (dropout), so after resuming the ranks still draw
    different batches, the very ones they drew in the straight run."""
    straight = tiny_cfg(data_dir, tmp_path / "straight", max_iters=16, lr_decay_iters=16,
                        eval_interval=8, dropout=0.1, value_mode="resformer",
                        gradient_accumulation_steps=2)
    half = dict(straight, out_dir=str(tmp_path / "resumed"), max_iters=8)
    _, straight_x = run_under_torchrun(tmp_path, straight, "straight")
    run_under_torchrun(tmp_path, half, "half")
    resume = dict(half, max_iters=16, resume=True)
    stdout, resumed_x = run_under_torchrun(tmp_path, resume, "resumed")
    assert f"resuming {tmp_path / 'resumed' / 'ckpt.pt'} at step 8" in stdout
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "straight")  # bitwise
    assert [i for i, _ in train_losses(tmp_path / "resumed")] == list(range(1, 17))
    assert len(resumed_x[0]) == len(resumed_x[1]) == 8  # 8 steps x 1 micro-step per rank
    assert not torch.equal(resumed_x[0][0], resumed_x[1][0])  # the ranks' batches differ
    for r in range(2):  # and each rank continues its own stream where the straight run had it
        assert all(torch.equal(a, b) for a, b in zip(resumed_x[r], straight_x[r][8:]))
    a = shards.load_checkpoint(str(tmp_path / "straight" / "ckpt.pt"))
    b = shards.load_checkpoint(str(tmp_path / "resumed" / "ckpt.pt"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert len(b["rank_states"]) == 2

    # the checkpoint holds 2 ranks' states: resuming it in 1 process is a one-line error
    one = run_script("train.py", f"--out_dir={tmp_path / 'resumed'}", "--resume", "--max_iters=20")
    assert one.returncode == 1 and one.stdout == "", one.stderr
    assert one.stderr.count("\n") == 1 and "written by 2 process(es)" in one.stderr
    assert "--nproc_per_node" in one.stderr


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    """Train shards of 4,000 bytes (the last shorter) and a val shard: sequential reading."""
    root = tmp_path_factory.mktemp("sharded")
    docs = [TEXT[i:i + 2000] for i in range(0, len(TEXT), 2000)]
    return prepare.prepare(documents=docs, name="sharded_byte", out_root=str(root), quiet=True,
                           shard_size=4000)


def test_torchrun_ctrl_c_stops_every_rank_at_one_step_and_resumes(sharded_dir, tmp_path):
    """Ctrl-C in a terminal reaches torchrun, which passes SIGINT on to each rank. Both ranks finish
    the step, agree on where to stop, rank 0 saves both ranks' states, nothing hangs, and
    --resume under torchrun continues from that step."""
    out = tmp_path / "out"
    cfg = tiny_cfg(sharded_dir, out, max_iters=100_000, lr_decay_iters=100_000, eval_interval=50,
                   dropout=0.1, gradient_accumulation_steps=2)
    args = [f"--{k}={v}" for k, v in cfg.items() if v != train.DEFAULTS[k]]  # as a command line
    launcher = subprocess.Popen(torchrun("train.py", *args), cwd=HERE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not ((out / "log.jsonl").exists() and len(train_losses(out)) >= 3):
            assert launcher.poll() is None and time.time() < deadline, launcher.communicate()
            time.sleep(0.1)
        os.killpg(launcher.pid, signal.SIGINT)  # what Ctrl-C does: the terminal's process group
        stdout, stderr = launcher.communicate(timeout=60)  # torchrun SIGKILLs a hung rank at 30 s
    finally:
        if launcher.poll() is None:
            kill_launch(launcher)
    assert "forcefully exiting" not in stderr and "Traceback" not in stdout, stderr[-3000:]
    saved = shards.load_checkpoint(str(out / "ckpt.pt"))
    stop = saved["iter_num"]
    assert f"interrupted at step {stop}: saved" in stdout
    assert 3 <= stop < 100_000 and train_losses(out)[-1][0] == stop
    # both ranks stopped after `stop` steps: each saved data position is exactly that many steps in
    token_shards = [shards.read_shard(p) for p in shards.list_shards(sharded_dir, "train")]
    for r in range(2):
        replay = train.Batches(token_shards, 8, 16, cfg["seed"], rank=r, world=2)
        for _ in range(stop):  # 1 micro-step per rank per step
            replay.next()
        state = saved["rank_states"][r]["data"]
        assert (state["shard"], state["pos"]) == (replay.shard, replay.pos)

    # --resume under torchrun continues from there, each rank from its own position
    returncode, stdout, stderr = run_torchrun("train.py", f"--out_dir={out}", "--resume",
                                              f"--max_iters={stop + 3}")
    assert returncode == 0, stderr[-3000:]
    assert f"resuming {out / 'ckpt.pt'} at step {stop}" in stdout
    assert [i for i, _ in train_losses(out)] == list(range(1, stop + 4))
    assert shards.load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == stop + 3


def write_dataset(path, train_lengths, val_length=600):
    """A byte dataset of shards with the given token counts (tokens from TEXT) and its meta.json."""
    os.makedirs(path)
    tokens = torch.tensor(list(TEXT.encode()))
    named = [(f"d_train_{i:06d}.bin", "train", tokens[:n]) for i, n in enumerate(train_lengths)]
    named.append(("d_val_000000.bin", "val", tokens[-val_length:]))
    entries = []
    for file, split, part in named:  # meta.json names every shard, as prepare.py writes it
        sha = shards.write_shard(os.path.join(path, file), part.numpy(), 257)
        entries.append({"file": file, "split": split, "tokens": len(part),
                        "bytes": os.path.getsize(os.path.join(path, file)), "sha256": sha})
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump({"tokenizer": "byte", "vocab_size": 257, "eot": 256, "dtype": "uint16",
                   "generation": 1, "input": None, "shards": entries}, f)
    return str(path)


def test_short_last_shard_is_skipped_and_reading_wraps_around(tmp_path, monkeypatch):
    """Sequential reading needs B*T+1 tokens per rank-step: a last shard of 100 is skipped, and
    after the two usable shards (2 batches each) reading starts again at shard 0."""
    data = write_dataset(tmp_path / "d", [300, 300, 100])
    visited = []
    real_next = train.Batches.next

    def recording_next(self):
        batch = real_next(self)
        if self.sequential:
            visited.append((self.shard, self.pos))
        return batch

    monkeypatch.setattr(train.Batches, "next", recording_next)
    summary = train.train(tiny_cfg(data, tmp_path / "out", max_iters=10, lr_decay_iters=10))
    assert summary["status"] == "done" and summary["iter"] == 10
    # (shard, position after the batch): shard 2 is never read
    assert visited == [(0, 128), (0, 256), (1, 128), (1, 256)] * 2 + [(0, 128), (0, 256)]


def test_sequential_ranks_read_disjoint_chunks_and_skip_shards_too_short_for_every_rank():
    tokens = [torch.arange(n).numpy() for n in (600, 300, 200)]  # 2 ranks x 8 x 16 + 1 = 257 needed
    ranks = [train.Batches(tokens, 8, 16, seed=0, rank=r, world=2) for r in range(2)]
    assert ranks[0].sequential and ranks[0].usable == [0, 1]
    for _ in range(6):
        (x0, y0), (x1, y1) = (b.next() for b in ranks)
        assert ranks[0].shard == ranks[1].shard != 2
        assert x0[0, 0] + 128 == x1[0, 0]  # neighbouring chunks, no overlap
        assert torch.equal(y0.flatten()[:-1], x0.flatten()[1:])
    with pytest.raises(shards.DataError, match=r"every shard of the train split is shorter than "
                                               r"the 257 tokens one step needs \(2 ranks x "
                                               r"batch_size 8 x block_size 16 \+ 1; the longest "
                                               r"has 200\)"):
        train.Batches(tokens[2:] * 2, 8, 16, seed=0, rank=1, world=2)


def test_every_shard_too_short_is_a_one_line_error(tmp_path):
    data = write_dataset(tmp_path / "d", [100, 120, 90])
    result = run_script("train.py", f"--dataset={data}", f"--out_dir={tmp_path / 'out'}",
                        "--batch_size=8", "--block_size=16", "--n_layer=1", "--n_embd=16",
                        "--n_head=2", "--device=cpu")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"error: every shard of the train split of {data} is shorter than "
                             f"the 129 tokens one step needs (1 rank x batch_size 8 x block_size "
                             f"16 + 1; the longest has 120): lower --batch_size or --block_size\n")


def test_second_run_on_an_out_dir_is_refused_until_the_first_is_gone(data_dir, tmp_path):
    out = tmp_path / "out"
    args = ["train.py", f"--dataset={data_dir}", f"--out_dir={out}", "--n_layer=2", "--n_head=2",
            "--n_embd=32", "--block_size=16", "--batch_size=8", "--max_iters=100000",
            "--eval_interval=5", "--eval_iters=2", "--log_interval=1000", "--device=cpu"]
    first = subprocess.Popen([sys.executable, *args], cwd=HERE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not (out / "ckpt.pt").exists():  # training, and holding the lock
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.1)
        second = run_script(*args)
        assert second.returncode == 1 and second.stdout == ""
        assert second.stderr == (f"error: {out} is in use by another training run: wait for "
                                 "it, stop it, or use another --out_dir\n")
    finally:
        first.kill()  # kill -9: no handler runs, the lock goes with the process
        first.wait()
    step = shards.load_checkpoint(str(out / "ckpt.pt"))["iter_num"]
    resumed = run_script("train.py", f"--out_dir={out}", "--resume", f"--max_iters={step + 2}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {out / 'ckpt.pt'} at step {step}" in resumed.stdout
    assert shards.load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == step + 2
