"""Tests for train.py's command line: resume rules, occupied out_dir, settings errors,
the schedule."""
import json
import os
import subprocess
import sys

import pytest

import prepare
import configurator
import shards
import train
from configurator import ConfigError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=8",
        "--eval_interval=10", "--eval_iters=2", "--log_interval=5", "--warmup_iters=5",
        "--device=cpu"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    text = "".join(f"KING {i % 7}:\nWhat say you, my lord, of the {i % 13} ships?\n\n"
                   for i in range(300))
    docs = [text[i:i + 2000] for i in range(0, len(text), 2000)]
    return prepare.prepare(documents=docs, name="cli_byte",
                           out_root=str(tmp_path_factory.mktemp("data")), quiet=True)


def records(out_dir, kind):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def test_resume_keeps_the_runs_settings_and_announces_changes(data_dir, tmp_path, capsys):
    out = str(tmp_path / "run")
    base = TINY + [f"--dataset={data_dir}", f"--out_dir={out}"]
    assert train.main(base + ["--learning_rate=5e-3", "--max_iters=20"]) == 0
    capsys.readouterr()
    # only --max_iters is given: learning_rate (5e-3, not the default) and the rest
    # come from the checkpoint
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=30"]) == 0
    printed = capsys.readouterr().out
    assert ("resume: max_iters: 20 -> 30" in printed
            and "learning_rate" not in printed.split("settings:")[0])
    first, second = records(out, "config")
    assert (first["settings"]["learning_rate"] == 5e-3
            and second["settings"]["learning_rate"] == 5e-3)
    assert second["changes"] == {"max_iters": [20, 30]} and second["iter"] == 20
    assert second["settings"]["dataset"] == data_dir and second["settings"]["n_layer"] == 2
    steps = [r["iter"] for r in records(out, "train")]
    assert steps == [5, 10, 15, 20, 25, 30]  # went on from 20, not from 0
    lrs = {r["iter"]: r["lr"] for r in records(out, "train")}
    # the new schedule
    assert lrs[30] == pytest.approx(train.get_lr(29, {**train.DEFAULTS, **second["settings"]}))


def test_resume_with_another_model_shape_says_so(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2"])
    with pytest.raises(ConfigError, match=r"the model differs \(n_layer: checkpoint 2 vs now 3\); "
                                          r"a run keeps its model shape"):
        train.main([f"--out_dir={out}", "--resume", "--n_layer=3"])


def test_an_occupied_out_dir_is_refused_unless_overwrite(data_dir, tmp_path):
    out = str(tmp_path / "run")
    args = TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2"]
    train.main(args)
    before = os.path.getmtime(os.path.join(out, "ckpt.pt"))
    with pytest.raises(ConfigError, match=r"already holds a checkpoint: continue it with "
                                          r"--resume, or train into "
                                          r"another --out_dir"):
        train.main(args)
    assert os.path.getmtime(os.path.join(out, "ckpt.pt")) == before  # untouched
    assert train.main(args + ["--overwrite"]) == 0
    assert len(records(out, "config")) == 1  # a fresh log for the fresh run


def test_schedule_follows_max_iters_and_warmup_is_clipped():
    cfg = dict(train.DEFAULTS, learning_rate=1.0, min_lr=0.1, warmup_iters=100, lr_decay_iters=0,
               max_iters=20)
    lrs = [train.get_lr(it, cfg) for it in range(21)]
    # decays to min_lr at max_iters, not at 500
    assert lrs[19] < 0.2 and lrs[20] == pytest.approx(0.1)
    # warmup clipped: peak, then decay
    assert train.warmup_steps(cfg) == 2 and lrs[2] == pytest.approx(1.0)
    # explicit setting wins
    assert train.get_lr(10, dict(cfg, lr_decay_iters=40)) > train.get_lr(10, cfg)


def run(*args):
    return subprocess.run([sys.executable, "train.py", *args], cwd=HERE, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("arg,message", [
    ("--device=cuda", "error: --device=cuda: this torch sees no CUDA GPU; use --device=cpu"),
    ("--device=gpu", "error: --device=gpu: use auto, cpu, cuda, cuda:N or mps"),
    ("--device=mps", "error: --device=mps: Apple's MPS backend is not available here"),
    ("--dtype=float16", "error: --dtype=float16 needs a GPU"),
    ("--dtype=fp8", "error: --dtype=fp8: use auto, float32, bfloat16 or float16"),
    ("--batch_size=0", "error: --batch_size=0: must be at least 1"),
    ("--eval_iters=-1", "error: --eval_iters=-1: must be at least 1"),
    ("--block_size=0", "error: --block_size=0: must be at least 1"),
    ("--log_interval=0", "error: --log_interval=0: must be at least 1"),
    ("--gradient_accumulation_steps=-1",
     "error: --gradient_accumulation_steps=-1: must be 0 or more"),
    ("--n_layer=True", "error: --n_layer=True: n_layer must be int"),
    ("--max_iters", "error: --max_iters needs a value: write --max_iters=VALUE"),
    ("--lambda_lr_scale=-1", "error: --lambda_lr_scale=-1.0: must be 0 or more"),
])
def test_setting_mistakes_are_one_line_errors(arg, message, tmp_path):
    if arg == "--device=cuda" and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    if arg == "--device=mps" and __import__("torch").backends.mps.is_available():
        pytest.skip("this machine has MPS")
    result = run(arg, f"--out_dir={tmp_path}")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr


def test_an_out_dir_that_is_a_file_and_a_reader_that_leaves_early_are_no_tracebacks(tmp_path):
    (tmp_path / "notes.txt").write_text("not a folder")
    result = run(f"--out_dir={tmp_path / 'notes.txt'}")
    assert result.returncode == 1 and result.stderr == (
        f"error: --out_dir={tmp_path / 'notes.txt'} is a file: name a folder\n")
    shell = subprocess.run(f"{sys.executable} train.py --help | head -1", shell=True, cwd=HERE,
                           capture_output=True, text=True, timeout=120)
    assert shell.stdout.startswith("usage: python train.py") and shell.stderr == "", shell.stderr


def test_whole_split_loss_visits_every_token_exactly_once():
    """Each position 1..N-1 of every shard is predicted once, from windows that do not
    cross shards."""
    import numpy as np
    import torch
    from contextlib import nullcontext

    class Recorder(torch.nn.Module):  # uniform logits; remembers every input window
        def __init__(self):
            super().__init__()
            self.seen = []

        def forward(self, idx, all_logits=False):
            self.seen += idx.flatten().tolist()
            return torch.zeros(*idx.shape, 1000), None

    # 103 and 37 tokens
    shards = [np.arange(0, 103, dtype=np.uint16), np.arange(500, 537, dtype=np.uint16)]
    model = Recorder()
    loss, count = train.full_split_loss(model, shards, block_size=8, batch_size=3, device="cpu",
                                        autocast=nullcontext())
    assert count == 102 + 36 and loss == pytest.approx(np.log(1000))
    # inputs: every token but the last
    assert sorted(model.seen) == list(range(0, 102)) + list(range(500, 536))
    # shared over 2 "ranks": each takes its windows; together they cover the split once
    seen = []
    for rank in range(2):
        part = Recorder()
        with pytest.MonkeyPatch.context() as mp:  # world > 1 all-reduces: here each rank's own sums
            mp.setattr(train.dist, "all_reduce", lambda tensor: None)
            train.full_split_loss(part, shards, 8, 3, "cpu", nullcontext(), rank=rank, world=2)
        seen += part.seen
    assert sorted(seen) == sorted(model.seen)


# ---- issue 22: nothing changes behind the user's back ----

def tiny_data(root, text="Speak, speak, my lord. ", n=2000, **kw):
    """A small byte dataset under root: documents of `text`."""
    docs = [f"{text}{i}\n" * 40 for i in range(n // 40)]
    return prepare.prepare(documents=docs, name="d", out_root=str(root), quiet=True, workers=1,
                           **kw)


def test_resume_on_data_that_changed_is_refused_unless_asked_for(tmp_path, capsys):
    data = tiny_data(tmp_path / "data")
    out = str(tmp_path / "run")
    assert train.main(TINY + [f"--dataset={data}", f"--out_dir={out}", "--max_iters=10"]) == 0
    before = shards.load_checkpoint(os.path.join(out, "ckpt.pt"))["data"]
    tiny_data(tmp_path / "data", text="Other words. ", n=400)  # the same name, other text
    with pytest.raises(ConfigError) as error:
        train.main([f"--out_dir={out}", "--resume", "--max_iters=20"])
    message = str(error.value)
    assert message.startswith(f"cannot resume {out}/ckpt.pt: it trained on {data} (generation 1: "
                              f"{before['train_tokens']:,} train + {before['val_tokens']:,} val "
                              f"tokens), but {data} now holds other data (generation 2: ")
    assert message.endswith("prepare the original data again, or go on with this data with "
                            "--new_data") and "\n" not in message
    assert shards.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] == 10  # untouched
    capsys.readouterr()
    # said explicitly: it goes on, and says what changed
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=20", "--new_data"]) == 0
    printed = capsys.readouterr().out
    assert f"resume: the data changed: {data} (generation 1: " in printed
    assert f" -> {data} (generation 2: " in printed
    ckpt = shards.load_checkpoint(os.path.join(out, "ckpt.pt"))
    assert ckpt["iter_num"] == 20 and ckpt["data"]["generation"] == 2
    assert "new_data" not in ckpt["config"]  # an action, not a setting the next resume restores
    # the same data re-prepared (same shards, new generation) is the same data
    tiny_data(tmp_path / "data", text="Other words. ", n=400)
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=22"]) == 0


def test_resume_announces_every_setting_that_changes_in_effect(data_dir, tmp_path, capsys):
    """Issue 22: --resume --max_iters=100 after 50 steps printed only max_iters, yet the cosine
    (whose end follows max_iters) restarted higher and the clipped warmup doubled."""
    out = str(tmp_path / "run")
    base = [a for a in TINY if not a.startswith("--warmup_iters")]
    assert train.main(base + [f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=20",
                              "--warmup_iters=100", "--learning_rate=1e-3", "--min_lr=1e-4"]) == 0
    capsys.readouterr()
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=40"]) == 0
    printed = capsys.readouterr().out.split("settings:")[0].splitlines()
    old = dict(train.DEFAULTS, max_iters=20, warmup_iters=100, learning_rate=1e-3, min_lr=1e-4)
    new = dict(old, max_iters=40)
    assert printed[:4] == [
        "resume: max_iters: 20 -> 40",
        "resume: warmup_iters in effect: 2 -> 4",
        "resume: lr_decay_iters in effect: 20 -> 40",
        f"resume: learning rate at step 20: {train.get_lr(20, old):.2e} -> "
        f"{train.get_lr(20, new):.2e} (the schedule changed)"]
    second = records(out, "config")[1]
    assert second["changes_in_effect"] == printed[1:4]


def test_settings_show_the_values_in_effect_and_leave_out_actions(data_dir, tmp_path, capsys):
    """Issue 22: the settings line said warmup_iters=100 after 'warming up for 10 steps',
    device=auto, n_kv_head=0, and on resume overwrite=True restored from the checkpoint."""
    out = str(tmp_path / "run")
    args = [a for a in TINY if not a.startswith(("--warmup_iters", "--device"))]
    args += [f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=20", "--warmup_iters=100"]
    train.main(args + ["--max_iters=2"])
    capsys.readouterr()
    assert train.main(args + ["--overwrite"]) == 0
    printed = capsys.readouterr().out
    assert "warming up for 2 steps" in printed
    line = next(l for l in printed.splitlines() if l.startswith("settings: "))
    shown = dict(kv.split("=", 1) for kv in line[len("settings: "):].split())
    device = configurator.setup_device("auto")[0]
    assert (shown["warmup_iters"], shown["lr_decay_iters"], shown["n_kv_head"]) == ("2", "20", "2")
    assert shown["device"] == device != "auto" and shown["dtype"] != "auto"
    assert "overwrite" not in shown and "resume" not in shown
    logged = records(out, "config")[0]["settings"]
    assert {k: str(v) for k, v in logged.items()} == shown  # log.jsonl's first record: the same
    assert "overwrite" not in shards.load_checkpoint(os.path.join(out, "ckpt.pt"))["config"]
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=22"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("settings: "))
    assert "overwrite=" not in line and "resume=" not in line and "max_iters=22" in line


def test_a_short_split_is_named_with_its_real_numbers(tmp_path):
    """Issue 22: 'every shard is shorter than the 1,026 tokens one batch needs (batch_size 12 x
    block_size 1024 x 1 ranks)' when only the validation split was short."""
    data = tiny_data(tmp_path / "data", val_tokens=40)
    r = run("--dataset=" + data, f"--out_dir={tmp_path / 'out'}", "--block_size=64",
            "--n_layer=1", "--n_head=2", "--n_embd=16", "--device=cpu")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == (f"error: the val split of {data} has 40 tokens, fewer than the 66 one "
                        f"window needs (block_size 64 + 2): use --block_size=38 or less, or "
                        f"prepare more text\n")


def test_words_and_suggestions(data_dir, tmp_path):
    """Issue 22: --max_iter suggests max_iters; --resume=true and --compile=false are accepted;
    '1 step', not '1 steps'; --resume on a finished run says it is already there."""
    r = run("--max_iter=10", f"--out_dir={tmp_path}")
    assert r.returncode == 1 and r.stderr == ("error: unknown setting --max_iter "
                                              "(did you mean --max_iters?)\n")
    out = str(tmp_path / "run")
    r = run(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=1",
            "--compile=false")
    assert r.returncode == 0, r.stderr
    assert ", 1 step, data " in r.stdout and "x 1 micro-step x 1 rank)" in r.stdout
    evals = len(records(out, "eval"))
    r = run(f"--out_dir={out}", "--resume=true")
    assert r.returncode == 0, r.stderr
    assert (f"{out}/ckpt.pt is already at step 1 of max_iters 1: nothing to train; to go "
            f"further, --resume with a larger --max_iters") in r.stdout
    assert "saved" not in r.stdout and len(records(out, "eval")) == evals  # nothing trained
