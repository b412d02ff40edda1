"""Tests for train.py on tiny data: every value mode trains, the mixing weights' own lr, exact
resume (also after Ctrl-C), what stops a run (a non-finite loss, a killed or full-disk checkpoint
write, a second run on the folder, a student's bug in model.py), the batches over shards, and
torchrun with 2 gloo processes."""
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import configurator
import data
import model
import prepare
import train
from configurator import ConfigError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TEXT = "".join(f"KING {i % 7}:\nWhat say you, my lord, of the {i % 13} ships upon the sea?\n\n"
               for i in range(400))
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=8, max_iters=30,
            lr_decay_iters=30, warmup_iters=5, learning_rate=1e-2, min_lr=1e-3, eval_interval=10,
            eval_iters=2, log_interval=1, device="cpu")


def default_sigint():
    """preexec_fn for a child a test Ctrl-Cs: a shell's background job (and so a pytest started
    as one) passes SIGINT on ignored, and Python then keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A byte dataset of 13 documents (about 22,500 train + 2,000 val tokens)."""
    root = tmp_path_factory.mktemp("data")
    docs = [TEXT[i:i + 2000] for i in range(0, len(TEXT), 2000)]
    return prepare.prepare(configurator.defaults(prepare.SETTINGS, dataset="tiny",
                                                 out_root=str(root), quiet=True), documents=docs)


def tiny_cfg(data_dir, out_dir, **kw):
    return configurator.defaults(train.SETTINGS, **{**TINY, "dataset": str(data_dir),
                                                    "out_dir": str(out_dir), **kw})


def changed(cfg, **kw):
    return SimpleNamespace(**{**vars(cfg), **kw})


def as_args(cfg):
    """The command line that gives these settings: --key=value for each one not at its default."""
    return [f"--{k}={v}" for k, v in vars(cfg).items() if v != train.SETTINGS[k][0]]


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_losses(out_dir):
    return [(r["iter"], r["loss"]) for r in read_log(out_dir) if r["kind"] == "train"]


def load(out_dir):
    return data.load_checkpoint(os.path.join(str(out_dir), "ckpt.pt"))


def run_script(*args, cwd=HERE, **kw):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, **kw)


# ---- training, in every value mode ----

@pytest.mark.parametrize("mode", list(model.VALUE_MODES))
def test_each_mode_trains_and_writes_log_and_checkpoint(data_dir, tmp_path, mode):
    summary = train.train(tiny_cfg(data_dir, tmp_path, value_mode=mode))
    assert summary["iter"] == 30
    evals = summary["evals"]
    assert [e["iter"] for e in evals] == [0, 10, 20, 30]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0  # it learns (from about ln 257)
    log = read_log(tmp_path)
    assert [r["kind"] for r in log][:2] == ["config", "eval"] and log[-1]["kind"] == "final"
    assert [r["iter"] for r in log if r["kind"] == "train"] == list(range(1, 31))
    assert all(r["tokens_per_sec"] > 0 and r["ms_per_step"] > 0
               for r in log if r["kind"] == "train")
    # the final number covers the whole val split: every token but the first predicted once
    meta = data.load_meta(data_dir)
    assert log[-1]["val_tokens"] == meta["val_tokens"] - 1
    assert log[-1]["val_loss_full"] == summary["val_loss_full"] < evals[0]["val_loss"] - 1.0
    ckpt = load(tmp_path)
    assert ckpt["iter_num"] == 30 and ckpt["model_args"]["value_mode"] == mode
    assert ckpt["tokenizer"] == {"tokenizer": "byte", "vocab_size": 257, "eot": 256}
    assert ckpt["best_val_loss"] == summary["best_val_loss"] == min(e["val_loss"] for e in evals)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "log.jsonl"]  # no .tmp
    # only value embeddings have mixing weights here (a learned value_lambda in every layer)
    mixing = evals[-1].get("mixing")
    if mode == "value_embed":
        assert list(mixing) == [f"transformer.h.{i}.attn.value_lambda" for i in range(2)]
    else:
        assert mixing is None


def test_learned_lambdas_step_at_their_own_learning_rate(data_dir, tmp_path, capsys):
    """lambda_lr_scale multiplies the lambdas' lr: 0 freezes them at their start while the
    weights learn; at 1 they move. (Adam moves a scalar by about lr per step.) They are logged at
    every evaluation."""
    def lambdas(scale):
        out = tmp_path / str(scale)
        summary = train.train(tiny_cfg(data_dir, out, value_mode="resformer",
                                       learnable_lambda=True, n_layer=3, max_iters=10,
                                       lr_decay_iters=10, lambda_lr_scale=scale))
        assert summary["evals"][-1]["val_loss"] < summary["evals"][0]["val_loss"] - 0.5
        mixing = summary["evals"][-1]["mixing"]  # layers 2..n, named as the model names them
        assert list(mixing) == [f"transformer.h.{i}.attn.value_lambdas" for i in (1, 2)]
        assert [r["mixing"] for r in read_log(out) if r["kind"] == "eval"][-1] == mixing
        return np.array(list(mixing.values()))
    assert np.array_equal(lambdas(0.0), np.full((2, 2), 0.5))
    # the eval lines show them, layers 2..n, as the log records them
    assert ", lambda_1/lambda_2 by layer 2: 0.50/0.50 3: 0.50/0.50\n" in capsys.readouterr().out
    moved = np.abs(lambdas(1.0) - 0.5).max()
    assert 0.005 < moved < 10 * 1e-2 + 1e-6  # at most about lr (1e-2) per step, 10 steps


# ---- resume ----

def test_resume_equals_uninterrupted_run(data_dir, tmp_path):
    """12 steps, then --resume to 30, logs bitwise the losses of 30 straight steps and ends on the
    same weights and AdamW state (dropout: the RNG state resumes too)."""
    straight = tiny_cfg(data_dir, tmp_path / "straight", value_mode="resformer",
                        learnable_lambda=True, dropout=0.1)
    train.train(straight)
    first_half = changed(straight, out_dir=str(tmp_path / "resumed"), max_iters=12)
    train.train(first_half)  # the same schedule: lr_decay_iters is set
    summary = train.train(changed(first_half, max_iters=30, resume=True))
    assert summary["iter"] == 30 and [e["iter"] for e in summary["evals"]] == [0, 10, 12, 20, 30]
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "straight")  # bitwise
    a, b = load(tmp_path / "straight"), load(tmp_path / "resumed")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["optimizer"]["state"][i]["exp_avg"], s["exp_avg"])
               for i, s in b["optimizer"]["state"].items())


def test_resume_with_a_different_model_is_a_clear_error(data_dir, tmp_path):
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=2))
    with pytest.raises(ConfigError, match=r"the model differs \(n_layer: checkpoint 2 vs now 3"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=4, n_layer=3, resume=True))
    assert load(tmp_path)["iter_num"] == 2  # untouched
    with pytest.raises(data.DataError, match="no checkpoint at .*empty/ckpt.pt: train one first"):
        train.train(tiny_cfg(data_dir, tmp_path / "empty", resume=True))
    # model.py edited since (here: the checkpoint holds a tensor today's model lacks, as after
    # a RoPE edit that removed the learned positions): one line naming it, not torch's key list
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    ckpt["model"]["transformer.rotary"] = torch.zeros(3)
    torch.save(ckpt, tmp_path / "ckpt.pt")
    with pytest.raises(ConfigError, match=r"cannot resume .*ckpt.pt: it does not fit today's "
                                          r"model.py \(transformer.rotary\): other code"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=4, resume=True))


def test_ctrl_c_then_resume_ends_on_the_losses_of_an_uninterrupted_run(data_dir, tmp_path):
    """A real SIGINT to `python train.py` after its first checkpoint: exit 130, no traceback but
    one line on what is kept and how to go on; the last checkpoint is whole, and `--resume` (its
    settings, only max_iters given) ends on exactly the losses of a run that was never stopped."""
    settings = dict(eval_interval=5, lr_decay_iters=40, dropout=0.1)
    out = tmp_path / "stopped"
    cfg = tiny_cfg(data_dir, out, max_iters=100_000, **settings)  # runs until stopped
    run = subprocess.Popen([sys.executable, "train.py", *as_args(cfg)], cwd=HERE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=default_sigint)
    try:
        deadline = time.time() + 60
        while not (out / "ckpt.pt").exists():
            assert run.poll() is None and time.time() < deadline, run.communicate()
            time.sleep(0.02)
        run.send_signal(signal.SIGINT)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    stop = load(out)["iter_num"]
    assert run.returncode == 130 and stderr == (
        f"Ctrl-C: stopped; {out}/ckpt.pt (step {stop}) is kept: go on with python train.py "
        f"--resume --out_dir={out}\n"), stderr[-2000:]
    assert stop % 5 == 0 and 5 <= stop < 60, stop
    train.main([f"--out_dir={out}", "--resume", "--max_iters=60"])
    straight = tiny_cfg(data_dir, tmp_path / "straight", max_iters=60, **settings)
    train.train(straight)
    expected = train_losses(straight.out_dir)
    log = read_log(out)
    resumed = [i for i, r in enumerate(log) if r["kind"] == "config"][-1]
    assert [(r["iter"], r["loss"]) for r in log[resumed:] if r["kind"] == "train"] == \
        expected[stop:]  # bitwise
    assert [(r["iter"], r["loss"]) for r in log[:resumed] if r["kind"] == "train"][:stop] == \
        expected[:stop]
    a, b = load(out), load(straight.out_dir)
    assert a["iter_num"] == 60 and all(torch.equal(a["model"][k], b["model"][k])
                                       for k in a["model"])


# ---- what stops a run ----

@pytest.mark.parametrize("where", ["train", "eval"])
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(data_dir, tmp_path, monkeypatch,
                                                              where):
    """From the first loss after step 10's checkpoint on, the loss is NaN: in training (seen at
    step 11's log line) or only in evaluation (seen at step 20's, before it would save). One line
    (ConfigError), a "diverged" record, and step 10's checkpoint is whole and finite."""
    real_ce, ckpt = torch.nn.functional.cross_entropy, tmp_path / "ckpt.pt"

    def nan_after_the_checkpoint(*args, **kw):
        loss = real_ce(*args, **kw)
        poisoned = ckpt.exists() and (where == "train" or not torch.is_grad_enabled())
        return loss * float("nan") if poisoned else loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", nan_after_the_checkpoint)
    step = {"train": 11, "eval": 20}[where]
    with pytest.raises(ConfigError) as error:
        train.train(tiny_cfg(data_dir, tmp_path))
    assert str(error.value) == (f"the loss is not finite at step {step}: stopped; the last good "
                                f"checkpoint is {tmp_path}/ckpt.pt (try a lower --learning_rate)")
    assert read_log(tmp_path)[-1] == {"kind": "diverged", "iter": step}
    saved = load(tmp_path)
    assert saved["iter_num"] == 10 and all(torch.isfinite(v).all() for v in
                                           saved["model"].values() if v.is_floating_point())
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "log.jsonl"]


def test_killed_checkpoint_write_leaves_previous_loadable(data_dir, tmp_path, monkeypatch):
    """Ctrl-C (or a kill) in the middle of the second checkpoint's write: the first checkpoint is
    whole, the half-written file is gone, and --resume goes on from the first."""
    real_save, saves = torch.save, []

    def dies_mid_write(obj, f):
        saves.append(obj["iter_num"])
        if len(saves) == 1:
            return real_save(obj, f)
        f.write(b"PK\x03\x04 half a checkpoint")
        f.flush()
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        train.train(tiny_cfg(data_dir, tmp_path))
    monkeypatch.undo()
    assert saves == [10, 20] and load(tmp_path)["iter_num"] == 10
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "log.jsonl"]
    assert train.train(tiny_cfg(data_dir, tmp_path, resume=True))["iter"] == 30
    # a half file (what a SIGKILL would leave as ckpt.pt.tmp) is never read as a checkpoint
    (tmp_path / "half.pt").write_bytes(b"PK\x03\x04 half a checkpoint")
    with pytest.raises(data.DataError, match="half.pt is not a readable torch checkpoint"):
        data.load_checkpoint(str(tmp_path / "half.pt"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_full_disk_while_saving_is_one_line_and_keeps_the_last_checkpoint(data_dir, tmp_path):
    """The OS's own ENOSPC: ckpt.pt.tmp is a link to /dev/full, where every write fails. The save
    at step 20 of `python train.py --resume` fails: one line, exit 1, step 10's checkpoint whole
    and the partial file gone. At a fresh run's first save, nothing is left but the lock."""
    out = tmp_path / "out"
    train.train(tiny_cfg(data_dir, out, max_iters=10))
    os.symlink("/dev/full", out / "ckpt.pt.tmp")
    result = run_script("train.py", f"--out_dir={out}", "--resume", "--max_iters=20")
    assert result.returncode == 1 and "step 20: train loss" in result.stdout
    assert result.stderr.startswith("error: no space left on device") and \
        result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl"]
    assert load(out)["iter_num"] == 10

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    os.symlink("/dev/full", fresh / "ckpt.pt.tmp")
    with pytest.raises(SystemExit) as stopped:  # run_main: what `python train.py` does with it
        configurator.run_main(lambda argv: train.train(tiny_cfg(data_dir, fresh, max_iters=10)))
    assert str(stopped.value.code).startswith("error: no space left on device")
    assert os.listdir(fresh) == []


def test_a_students_bug_in_model_py_shows_its_traceback(data_dir, tmp_path):
    """A bug planted in a copy of the lesson files (unpacking two lambdas into three names) is
    not a user's mistake: the run ends with the traceback at the planted line, exit 1."""
    lesson = tmp_path / "lesson"
    lesson.mkdir()
    for name in ("model.py", "train.py", "data.py", "configurator.py", "prepare.py"):
        shutil.copy(os.path.join(HERE, name), lesson / name)
    shutil.copytree(os.path.join(HERE, "corpus"), lesson / "corpus")
    lines = (lesson / "model.py").read_text().splitlines(keepends=True)
    line = "lambda_1, lambda_2 = self.value_lambdas"
    [index] = [i for i, text in enumerate(lines) if text.strip() == line]
    lines[index] = lines[index].replace(line, "lambda_1, lambda_2, lambda_3 = self.value_lambdas")
    (lesson / "model.py").write_text("".join(lines))
    cfg = tiny_cfg(data_dir, tmp_path / "out", value_mode="resformer", max_iters=2)
    result = run_script("train.py", *as_args(cfg), cwd=lesson)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert f'File "{lesson / "model.py"}", line {index + 1}' in result.stderr
    assert result.stderr.rstrip().endswith(
        "ValueError: not enough values to unpack (expected 3, got 2)"), result.stderr[-2000:]


# ---- the batches ----

def test_batches_draw_windows_from_every_shard_in_proportion_to_its_windows():
    """Random windows over all shards: each of a shard's len - block_size - 1 windows is drawn,
    shards in proportion to their windows, never one shorter than block_size + 2 (a shard of
    exactly that many has one window), and each row is one window of one shard."""
    B, T = 8, 4
    lengths = [T + 1, 60, 200, T + 2, 30]
    shards = [np.arange(1000 * s, 1000 * s + n, dtype=np.uint16) for s, n in enumerate(lengths)]
    windows = [max(n - T - 1, 0) for n in lengths]  # 0, 55, 195, 1, 25
    batches = data.Batches(shards, B, T, seed=0, split="train")
    starts, draws = collections.defaultdict(collections.Counter), 2000
    for _ in range(draws):
        x, y = batches.next()
        assert x.shape == y.shape == (B, T) and x.dtype == torch.int64
        for row_x, row_y in zip(x, y):
            shard, start = divmod(int(row_x[0]), 1000)
            assert torch.equal(row_x, torch.arange(int(row_x[0]), int(row_x[0]) + T))
            assert torch.equal(row_y, row_x + 1)  # the next tokens, of the same shard
            starts[shard][start] += 1
    for s, w in enumerate(windows):
        assert sorted(starts[s]) == list(range(w))  # every window, none past the shard's end
        n, p = draws * B, w / sum(windows)
        assert abs(sum(starts[s].values()) - n * p) <= 5 * (n * p * (1 - p)) ** 0.5 + 1e-9
    batches.reset()  # the fixed windows of the loss estimates: the same after every reset
    first = batches.next()
    batches.reset()
    assert all(torch.equal(a, b) for a, b in zip(first, batches.next()))


def test_one_shard_gives_the_old_single_shard_windows():
    """With one shard, a batch is torch.randint(len - block_size - 1) starts from the seeded
    generator, as the single-shard reader always drew them (so old runs replay)."""
    B, T, seed = 5, 16, 1337
    tokens = (np.arange(3000) * 7919 % 257).astype(np.uint16)
    batches = data.Batches([tokens], B, T, seed=seed, split="train")
    generator = torch.Generator().manual_seed(seed)
    for _ in range(20):
        ix = torch.randint(len(tokens) - T - 1, (B,), generator=generator)
        rows = torch.stack([torch.from_numpy(tokens[i:i + T + 1].astype(np.int64)) for i in ix])
        x, y = batches.next()
        assert torch.equal(x, rows[:, :-1]) and torch.equal(y, rows[:, 1:])


def test_a_split_without_a_window_is_a_data_error_naming_it():
    """Every shard shorter than block_size + 2: the split, its longest shard's real size and a
    block_size that does fit (it does); with 2 tokens or fewer no block_size fits."""
    shards = [np.arange(n, dtype=np.uint16) for n in (17, 10, 12)]
    with pytest.raises(data.DataError) as error:
        data.Batches(shards, 8, 16, seed=0, split="val")
    assert str(error.value) == ("the val split's longest shard has 17 tokens, fewer than one "
                                "window needs (block_size 16 + 2): use --block_size=15 or less, "
                                "or prepare more text")
    data.Batches(shards, 8, 15, seed=0, split="val")
    with pytest.raises(data.DataError, match=r"has 2 tokens, fewer than one window needs "
                                             r"\(block_size 16 \+ 2\): prepare more text$"):
        data.Batches([np.arange(2, dtype=np.uint16)], 8, 16, seed=0, split="train")


# ---- settings ----

def test_missing_data_names_the_prepare_command(tmp_path):
    """data.py's one line for a missing dataset, with the command that makes one."""
    missing = str(tmp_path / "plays_gpt2")
    with pytest.raises(data.DataError) as error:
        train.train(tiny_cfg(missing, tmp_path / "out"))
    assert str(error.value) == (f"no train shards in {missing}: make them with python "
                                f"prepare.py (its --help says how), or name another --dataset")


@pytest.mark.parametrize("arg,message", [
    ("--n_layers=4", "error: unrecognized arguments: --n_layers=4"),
    ("--n_layer=4.5", "error: --n_layer=4.5: must be int, like 4"),
    ("--value_mode=resformr", "error: value_mode must be one of vanilla, resformer,")])
def test_bad_overrides_exit_with_one_line(arg, message, monkeypatch, capsys):
    """`python train.py ARG`, in-process: run_main exits with one line, nothing on stdout."""
    monkeypatch.setattr(sys, "argv", ["train.py", arg])
    with pytest.raises(SystemExit) as stopped:
        configurator.run_main(train.main)
    assert stopped.value.code.startswith(message) and "\n" not in stopped.value.code
    assert capsys.readouterr().out == ""


def test_quickstart_preset_is_the_defaults():
    preset = configurator.read_preset(os.path.join(HERE, "config", "quickstart.py"))
    assert preset and all(train.SETTINGS[k][0] == v for k, v in preset.items())
    # every key known, typed
    gpt2 = configurator.parse_args(train.SETTINGS, [os.path.join(HERE, "config",
                                                                    "gpt2_124m.py")], "")
    assert gpt2.batch_size * gpt2.block_size * gpt2.gradient_accumulation_steps == 2 ** 19
    with pytest.raises(ConfigError):
        configurator.parse_args(train.SETTINGS, ["--max_iters=many"], "")


def test_lr_schedule():
    cfg = configurator.defaults(train.SETTINGS, learning_rate=1.0, min_lr=0.1, warmup_iters=10,
                                lr_decay_iters=110)
    lrs = [train.get_lr(it, cfg) for it in range(130)]
    assert lrs[0] < lrs[5] < lrs[9] < 1.0 and lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55) and lrs[110] == pytest.approx(0.1) and lrs[129] == 0.1
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


# ---- torchrun (gloo, 2 CPU processes) ----

def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            *args]


def kill_launch(launcher):
    """SIGKILL torchrun and its processes (each worker is a child of the launcher)."""
    try:
        with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as f:
            workers = [int(pid) for pid in f.read().split()]
    except OSError:
        workers = []
    for pid in workers + [launcher.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait()


def run_torchrun(*args, timeout=120):
    """(returncode, stdout, stderr) of a 2-process launch; a timeout leaves nothing behind."""
    launcher = subprocess.Popen(torchrun(*args), cwd=HERE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_launch(launcher)
        raise
    return launcher.returncode, stdout, stderr


RECORDING = """\
import os, sys, torch
sys.path.insert(0, {here!r})
import configurator, train
drawn, real_next = [], train.data.Batches.next
def recording_next(self):  # training batches only, not the loss estimates' fixed ones
    x, y = real_next(self)
    if self.seed != train.EVAL_SEED:
        drawn.append(x)
    return x, y
train.data.Batches.next = recording_next
summary = train.train(configurator.defaults(train.SETTINGS, **eval(sys.argv[1])))
torch.save({{"drawn": drawn, "model": summary["model"].state_dict()}},
           sys.argv[2] + os.environ["RANK"] + ".pt")
"""


def run_recorded(tmp_path, cfg, name):
    """train.train(cfg) under torchrun; (stdout, per process: the training batches it drew and
    its final weights)."""
    script = tmp_path / "recording.py"
    script.write_text(RECORDING.format(here=HERE))
    returncode, stdout, stderr = run_torchrun(str(script), repr(vars(cfg)), str(tmp_path / name))
    # Where a process died shows at the start of stderr; the launcher's report fills the end.
    assert returncode == 0, stderr[:3000] + "\n...\n" + stderr[-1500:]
    return stdout, [torch.load(tmp_path / f"{name}{r}.pt") for r in range(2)]


TORCHRUN = dict(max_iters=30, lr_decay_iters=30, eval_interval=5, dropout=0.1,
                value_mode="resformer", gradient_accumulation_steps=2)  # 1 micro-step each


@pytest.fixture(scope="module")
def torchrun_straight(data_dir, tmp_path_factory):
    """30 steps on 2 processes, never stopped: (out_dir, stdout, what each process recorded)."""
    tmp = tmp_path_factory.mktemp("torchrun")
    cfg = tiny_cfg(data_dir, tmp / "straight", **TORCHRUN)
    stdout, ranks = run_recorded(tmp, cfg, "straight")
    return tmp / "straight", stdout, ranks


def test_torchrun_two_processes_gloo(torchrun_straight, tmp_path):
    """2 CPU processes: the same weights in both after training, one log, one checkpoint of both
    processes' states, written by rank 0 alone; resuming it in 1 process is a one-line error."""
    out, stdout, ranks = torchrun_straight
    weights = [r["model"] for r in ranks]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    saved = load(out)
    assert all(torch.equal(weights[0][k], saved["model"][k]) for k in weights[0])
    assert len(saved["rank_states"]) == 2 and sorted(os.listdir(out)) == [
        "ckpt.pt", "log.jsonl"]
    assert [i for i, _ in train_losses(out)] == list(range(1, 31))  # once, not once per process
    assert stdout.count("step 30: train loss") == 1  # only rank 0 prints
    assert "256 tokens/step (8 x 16 x 1 micro-step x 2 processes)" in stdout
    assert not torch.equal(ranks[0]["drawn"][0], ranks[1]["drawn"][0])  # each its own batches
    one = tmp_path / "one"
    shutil.copytree(out, one)
    with pytest.raises(ConfigError, match=r"ckpt.pt was written by 2 process\(es\): resume it with "
                                          r"as many \(torchrun --nproc_per_node\)"):
        train.main([f"--out_dir={one}", "--resume", "--max_iters=40"])


def test_torchrun_ctrl_c_then_resume_equals_uninterrupted_run(data_dir, torchrun_straight,
                                                              tmp_path):
    """Ctrl-C in a terminal (SIGINT to the launch's process group) after the first checkpoint:
    nothing hangs, the checkpoint is whole; --resume under torchrun ends bitwise on the losses and
    weights of the straight run, each process continuing its own batch stream and dropout."""
    straight, _, straight_ranks = torchrun_straight
    out = tmp_path / "stopped"
    cfg = tiny_cfg(data_dir, out, **{**TORCHRUN, "max_iters": 100_000})  # runs until stopped
    launcher = subprocess.Popen(torchrun("train.py", *as_args(cfg)), cwd=HERE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=default_sigint)
    try:
        deadline = time.time() + 60
        while not (out / "ckpt.pt").exists():
            assert launcher.poll() is None and time.time() < deadline, launcher.communicate()
            time.sleep(0.02)
        os.killpg(launcher.pid, signal.SIGINT)  # what Ctrl-C does: the terminal's process group
        _, stderr = launcher.communicate(timeout=60)  # torchrun SIGKILLs a hung process at 30 s
    finally:
        if launcher.poll() is None:
            kill_launch(launcher)
    assert launcher.returncode != 0 and "forcefully exiting" not in stderr, stderr[-3000:]
    stop = load(out)["iter_num"]
    assert stop % 5 == 0 and 5 <= stop < 30, stop
    said = [line for line in stderr.splitlines() if line.startswith("Ctrl-C: ")]
    assert said == [f"Ctrl-C: stopped; {out}/ckpt.pt (step {stop}) is kept: go on with python "
                    f"train.py --resume --out_dir={out}"], stderr[-3000:]  # rank 0's only

    stdout, ranks = run_recorded(tmp_path, changed(cfg, max_iters=30, resume=True), "resumed")
    assert f"resuming {out} at step {stop}" in stdout
    log = read_log(out)
    resumed = [i for i, r in enumerate(log) if r["kind"] == "config"][-1]
    assert [(r["iter"], r["loss"]) for r in log[resumed:] if r["kind"] == "train"] == \
        train_losses(straight)[stop:]  # bitwise
    for r in range(2):  # each process continued its own stream where the straight run had it
        assert len(ranks[r]["drawn"]) == 30 - stop
        assert all(torch.equal(a, b) for a, b in zip(ranks[r]["drawn"],
                                                     straight_ranks[r]["drawn"][stop:]))
    a, b = load(straight), load(out)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_torchrun_accumulation_that_does_not_divide_is_a_one_line_error(data_dir, tmp_path):
    """An explicit gradient_accumulation_steps is the total over the processes (the runs above
    give 2: one each); 3 cannot be shared by 2. Every process meets the mistake, rank 0 alone
    says it: one line, never two interleaved (which made this test fail 1 run in 3)."""
    returncode, stdout, stderr = run_torchrun("train.py", f"--dataset={data_dir}",
                                              f"--out_dir={tmp_path / 'out'}", "--device=cpu",
                                              "--gradient_accumulation_steps=3")
    assert returncode != 0 and "Traceback" not in stdout
    errors = [line for line in stderr.splitlines() if "error: " in line]
    assert errors == ["error: --gradient_accumulation_steps=3 is the total over all processes: "
                      "it must divide by their number (2); 0 is one micro-step per process"]
    assert not (tmp_path / "out").exists()


def test_batches_reach_a_gpu_from_pinned_memory_the_same_tokens(monkeypatch):
    """On CUDA the batch is copied from pinned memory without blocking (nanoGPT's way); the
    tokens are those the CPU run draws, bit for bit. (No GPU here: pin_memory and the copy are
    stand-ins that record their calls.)"""
    shards = [np.arange(1000, dtype=np.uint16) % 97]
    on_cpu = data.Batches(shards, 4, 8, 5, "train")
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin") or self)
    real_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: calls.append((a, k)) or (
        self if a[:1] == ("cuda:0",) else real_to(self, *a, **k)))
    on_gpu = data.Batches(shards, 4, 8, 5, "train", device="cuda:0")
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(on_cpu.next(), on_gpu.next()))
    assert calls.count("pin") == 3
    assert calls.count((("cuda:0",), {"non_blocking": True})) == 3
