"""Tests for train.py's command line: resume rules, an occupied out_dir, every setting's check
(one line naming it), the schedule, the whole-split loss, the settings line, errors about the
data (and that they leave nothing behind)."""
import errno
import json
import math
import os
import subprocess
import sys
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import configurator
import data
import prepare
import train
from configurator import ConfigError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=8",
        "--eval_interval=10", "--eval_iters=2", "--log_interval=5", "--warmup_iters=5",
        "--device=cpu"]


def prepared(root, documents, name="d", **kw):
    """A byte dataset of these documents under root (prepare.py's function, quiet)."""
    return prepare.prepare(configurator.defaults(prepare.SETTINGS, dataset=name,
                                                 out_root=str(root), quiet=True, **kw),
                           documents=documents)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    text = "".join(f"KING {i % 7}:\nWhat say you, my lord, of the {i % 13} ships?\n\n"
                   for i in range(300))
    return prepared(tmp_path_factory.mktemp("data"),
                    [text[i:i + 2000] for i in range(0, len(text), 2000)], name="cli")


def records(out_dir, kind):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def run(*args, **kw):
    return subprocess.run([sys.executable, "train.py", *args], cwd=HERE, capture_output=True,
                          text=True, timeout=120, **kw)


def one_line_error(monkeypatch, capsys, *args):
    """`python train.py ARGS` in this process: what run_main exits with (nothing on stdout)."""
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    with pytest.raises(SystemExit) as stopped:
        configurator.run_main(train.main)
    assert capsys.readouterr().out == ""
    message = stopped.value.code
    assert isinstance(message, str) and "\n" not in message, message
    return message


# ---- resume ----

def test_resume_keeps_the_runs_settings_and_announces_changes(data_dir, tmp_path, capsys):
    out = str(tmp_path / "run")
    train.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--learning_rate=5e-3",
                       "--max_iters=20"])
    capsys.readouterr()
    # only --max_iters is given: learning_rate (5e-3, not the default), the dataset and the rest
    # come from the checkpoint
    train.main([f"--out_dir={out}", "--resume", "--max_iters=30"])
    printed = capsys.readouterr().out
    assert printed.split("settings:")[0].splitlines() == [
        "resume: max_iters: 20 -> 30", f"resuming {out} at step 20"]
    first, second = records(out, "config")
    assert first["settings"]["learning_rate"] == second["settings"]["learning_rate"] == 5e-3
    assert second["iter"] == 20 and second["settings"]["max_iters"] == 30
    assert second["settings"]["dataset"] == data_dir and second["settings"]["n_layer"] == 2
    steps = [r["iter"] for r in records(out, "train")]
    assert steps == [5, 10, 15, 20, 25, 30]  # went on from 20, not from 0
    lrs = {r["iter"]: r["lr"] for r in records(out, "train")}
    # the new schedule (its cosine now ends at 30)
    assert lrs[30] == pytest.approx(train.get_lr(29, SimpleNamespace(**second["settings"])))
    assert lrs[30] > second["settings"]["min_lr"]  # the old schedule ended at step 20


def test_resume_with_another_model_shape_says_so(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2"])
    with pytest.raises(ConfigError, match=r"the model differs \(n_layer: checkpoint 2 vs now 3\); "
                                          r"a run keeps its shape"):
        train.main([f"--out_dir={out}", "--resume", "--n_layer=3"])


def test_an_occupied_out_dir_is_refused_unless_overwrite(data_dir, tmp_path):
    out = str(tmp_path / "run")
    args = TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2"]
    train.main(args)
    before = os.path.getmtime(os.path.join(out, "ckpt.pt"))
    with pytest.raises(ConfigError, match=r"already holds a checkpoint: continue it with "
                                          r"--resume, or train into another --out_dir"):
        train.main(args)
    assert os.path.getmtime(os.path.join(out, "ckpt.pt")) == before  # untouched
    train.main(args + ["--overwrite"])
    assert len(records(out, "config")) == 1  # a fresh log for the fresh run


def test_an_overwrite_stopped_before_its_first_checkpoint_leaves_the_old_run(data_dir, tmp_path,
                                                                               monkeypatch):
    """--overwrite keeps the old checkpoint and log until the new run writes its first
    checkpoint: Ctrl-C (or a crash) before that leaves the old run whole, still resumable."""
    out = str(tmp_path / "run")
    args = TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=4",
                   "--eval_interval=2"]
    train.main(args)
    old = {name: open(os.path.join(out, name), "rb").read() for name in ("ckpt.pt", "log.jsonl")}
    real, calls = train.training_step, []

    def interrupted(*a):
        calls.append(1)
        if len(calls) == 2:  # the new run's second step: before its first checkpoint (step 2)
            raise KeyboardInterrupt
        return real(*a)
    monkeypatch.setattr(train, "training_step", interrupted)
    with pytest.raises(KeyboardInterrupt, match=r"ckpt.pt \(step 4\) is kept"):
        train.main(args + ["--overwrite", "--seed=7"])
    assert all(open(os.path.join(out, name), "rb").read() == old[name] for name in old)
    monkeypatch.setattr(train, "training_step", real)
    train.main(args + ["--resume", "--max_iters=6"])  # the old run goes on
    assert records(out, "train")[-1]["iter"] == 6


def test_resume_on_data_that_changed_is_refused(tmp_path, capsys):
    """Other text prepared under the run's dataset name: --resume refuses it in one line with
    both sizes; the original text prepared again (the same shards) resumes."""
    def text(words, n):
        return [f"{words}{i}\n" * 40 for i in range(n)]
    root = tmp_path / "data"
    dataset = prepared(root, text("Speak, speak, my lord. ", 50))
    out = str(tmp_path / "run")
    train.main(TINY + [f"--dataset={dataset}", f"--out_dir={out}", "--max_iters=10"])
    before = data.load_checkpoint(os.path.join(out, "ckpt.pt"))["data"]
    prepared(root, text("Other words. ", 10))  # the same name, other text
    now = data.load_meta(dataset)
    with pytest.raises(data.DataError) as error:
        train.main([f"--out_dir={out}", "--resume", "--max_iters=20"])
    assert before["train_tokens"] != now["train_tokens"] and str(error.value) == (
        f"cannot resume {out}/ckpt.pt: {dataset} now holds other data than it trained on; "
        f"prepare that data again, or start anew")
    assert data.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] == 10  # untouched
    prepared(root, text("Speak, speak, my lord. ", 50))  # the original, prepared again
    train.main([f"--out_dir={out}", "--resume", "--max_iters=20"])
    assert data.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] == 20


# ---- the schedule ----

def test_schedule_follows_max_iters_and_warmup_is_clipped():
    cfg = configurator.defaults(train.SETTINGS, learning_rate=1.0, min_lr=0.1, warmup_iters=100,
                                lr_decay_iters=0, max_iters=20)
    lrs = [train.get_lr(it, cfg) for it in range(21)]
    # decays to min_lr at max_iters, not at 500
    assert lrs[19] < 0.2 and lrs[20] == pytest.approx(0.1)
    # warmup clipped: peak, then decay
    assert train.schedule(cfg) == (2, 20) and lrs[2] == pytest.approx(1.0)
    # explicit setting wins
    longer = SimpleNamespace(**{**vars(cfg), "lr_decay_iters": 40})
    assert train.schedule(longer) == (100, 40)[:0] + (4, 40) and train.get_lr(10, longer) > \
        train.get_lr(10, cfg)


# ---- every setting's check ----

# Numeric settings that take any value: resformer's mixing weights (the paper swept lambda from
# -1 to 2; negatives are a valid experiment).
ANY_VALUE = {"lambda_1", "lambda_2"}
LIMITED = [key for key, spec in train.SETTINGS.items() if len(spec) > 2]


def test_every_numeric_setting_has_limits():
    unlimited = [key for key, (default, *rest) in train.SETTINGS.items() if type(default) in
                 (int, float) and not rest and key not in ANY_VALUE]
    assert unlimited == [], f"numeric settings without limits: {unlimited}"
    assert len(LIMITED) >= 20


@pytest.mark.parametrize("key", LIMITED)
def test_an_impossible_value_of_each_limited_setting_is_one_line_naming_it(key):
    default, meaning, (low, high) = train.SETTINGS[key]
    step = 1 if isinstance(default, int) else 0.5
    for value in [v for v in (low - step if low is not None else None,
                              high + step if high is not None else None) if v is not None]:
        with pytest.raises(ConfigError) as error:
            configurator.parse_args(train.SETTINGS, [f"--{key}={value}"], "")
        assert str(error.value).startswith(f"--{key}={value}: must be ") and str(
            error.value).endswith(f"({meaning})")


def test_an_impossible_value_on_the_command_line_is_one_line(tmp_path):
    result = run("--dropout=1.5", f"--out_dir={tmp_path / 'out'}")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == "error: --dropout=1.5: must be between 0.0 and 0.99 (dropout rate)\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arg,message", [
    ("--device=cuda", "error: --device=cuda: not here; use auto, cpu, cuda, cuda:N (0 CUDA"),
    ("--device=gpu", "error: --device=gpu: not here; use auto, cpu, cuda, cuda:N"),
    ("--device=mps", "error: --device=mps: not here; use auto"),
    ("--dtype=fp8", "error: --dtype=fp8: use auto (it picks), float32, bfloat16"),
    ("--n_layer=True", "error: --n_layer=True: must be int, like 4"),
    ("--max_iters", "error: argument --max_iters: expected one argument"),
    ("--max_iter=10", "error: unrecognized arguments: --max_iter=10"),
    ("--min_lr=0.1", "error: --min_lr=0.1: must be at most learning_rate (0.003)"),
    ("--n_embd=30", "error: n_embd (30) must be divisible by n_head (4)"),
    ("--learnable_lambda", "error: lambda_1, lambda_2 and learnable_lambda only apply to "
                           "value_mode=resformer"),
])
def test_setting_mistakes_are_one_line_errors(arg, message, data_dir, tmp_path, monkeypatch,
                                              capsys):
    """Mistakes the per-setting checks cannot see (the device, a type, settings that only make
    sense together) and close misses: one line, and nothing made in out_dir."""
    if arg == "--device=cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if arg == "--device=mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    extra = ["--value_mode=vanilla"] if arg == "--learnable_lambda" else []
    got = one_line_error(monkeypatch, capsys, *arg.split(), *extra, f"--dataset={data_dir}",
                         f"--out_dir={tmp_path / 'out'}")
    assert got.startswith(message), got
    assert not (tmp_path / "out").exists()


def test_out_dirs_that_cannot_be_folders_and_a_reader_that_leaves_early(data_dir, tmp_path):
    """A file as out_dir, or a folder inside a file (README.md/sub): one line each; and
    `train.py --help | head -1` ends quietly."""
    (tmp_path / "notes.txt").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"notes.txt: cannot make that folder \(File exists\)$"):
        train.main(TINY + [f"--dataset={data_dir}", f"--out_dir={tmp_path / 'notes.txt'}"])
    result = run(f"--dataset={data_dir}", "--out_dir=README.md/sub")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"error: --out_dir=README.md/sub: cannot make that folder "
                             f"({os.strerror(errno.ENOTDIR)})\n")
    shell = subprocess.run(f"{sys.executable} train.py --help | head -1", shell=True, cwd=HERE,
                           capture_output=True, text=True, timeout=120)
    assert shell.stdout.startswith("usage: python train.py") and shell.stderr == "", shell.stderr


def test_ctrl_c_says_what_is_kept_and_how_to_go_on(tmp_path, monkeypatch, capsys):
    """Ctrl-C exited 130 without a word on what it kept: now one line on stderr names the
    checkpoint and the command that continues it, or says there is none yet; under torchrun
    (every process gets Ctrl-C) only rank 0 says it. The real SIGINT: tests/test_train.py."""
    def stopped_by_ctrl_c(cfg, given=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "train", stopped_by_ctrl_c)
    monkeypatch.chdir(tmp_path)

    def ctrl_c(rank=None):
        """stderr of `python train.py` (as process `rank` of torchrun's) stopped by Ctrl-C."""
        if rank is None:
            monkeypatch.delenv("RANK", raising=False)
        else:
            monkeypatch.setenv("RANK", rank)
        monkeypatch.setattr(sys, "argv", ["train.py"])
        with pytest.raises(SystemExit) as stopped:
            configurator.run_main(train.main)
        out, err = capsys.readouterr()
        assert stopped.value.code == 130 and out == ""
        return err

    assert ctrl_c() == "Ctrl-C: stopped; no checkpoint yet\n"
    os.makedirs("out")
    torch.save({"iter_num": 500, "model": {"w": torch.zeros(3)}}, "out/ckpt.pt")
    line = ("Ctrl-C: stopped; out/ckpt.pt (step 500) is kept: go on with python train.py "
            "--resume --out_dir=out")
    assert ctrl_c() == ctrl_c("0") == line + "\n" and len(line) <= 100
    assert ctrl_c("1") == ""


# ---- the whole-split loss ----

class Recorder(torch.nn.Module):
    """A stand-in model: uniform logits over 1,000 ids; remembers every input row."""

    def __init__(self):
        super().__init__()
        self.lm_head, self.rows = torch.nn.Linear(1, 1), []  # (full_split_loss reads its device)

    def forward(self, idx, all_logits=False):
        assert all_logits
        self.rows += idx.tolist()
        return torch.zeros(*idx.shape, 1000), None


def test_whole_split_loss_visits_every_token_exactly_once(monkeypatch):
    """Each position 1..N-1 of every shard is predicted once, from windows of at most block_size
    tokens that do not cross shards; two processes share the windows without overlap."""
    shards = [np.arange(0, 103, dtype=np.uint16), np.arange(500, 537, dtype=np.uint16)]
    cfg = SimpleNamespace(block_size=8, batch_size=3)
    model = Recorder()
    loss, count = train.full_split_loss(model, shards, cfg, nullcontext())
    assert count == 102 + 36 and loss == pytest.approx(math.log(1000))
    for row in model.rows:  # consecutive tokens of one shard
        assert len(row) <= 8 and row == list(range(row[0], row[0] + len(row)))
    inputs = sorted(t for row in model.rows for t in row)
    assert inputs == list(range(0, 102)) + list(range(500, 536))  # every token but each last
    # shared over 2 processes: each takes its windows; together they cover the split once
    monkeypatch.setattr(train.dist, "all_reduce", lambda tensor: None)  # each its own sums
    parts = [Recorder() for _ in range(2)]
    counts = [train.full_split_loss(p, shards, cfg, nullcontext(), rank=r, world=2)[1]
              for r, p in enumerate(parts)]
    assert sum(counts) == count and min(counts) > 0
    assert sorted(t for p in parts for row in p.rows for t in row) == inputs


# ---- what a run prints ----

def test_settings_show_the_values_in_effect_and_leave_out_actions(data_dir, tmp_path, capsys):
    """Issue 22: the settings line said warmup_iters=100 where 2 are done, device=auto,
    n_kv_head=0, and on resume overwrite=True restored from the checkpoint."""
    out = str(tmp_path / "run")
    args = [a for a in TINY if not a.startswith(("--warmup_iters", "--device"))]
    args += [f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=20", "--warmup_iters=100"]
    train.main(args + ["--max_iters=2"])
    capsys.readouterr()
    train.main(args + ["--overwrite"])
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("settings: "))
    shown = dict(kv.split("=", 1) for kv in line[len("settings: "):].split())
    device, dtype, _ = data.setup_device("auto")
    assert (shown["warmup_iters"], shown["lr_decay_iters"], shown["n_kv_head"]) == ("2", "20", "2")
    assert (shown["device"], shown["dtype"]) == (device, dtype) and "auto" not in (device, dtype)
    assert set(shown) == set(train.SETTINGS) - set(train.ACTIONS)  # every setting, no action
    logged = records(out, "config")[0]["settings"]
    assert {k: str(v) for k, v in logged.items()} == shown  # log.jsonl's first record: the same
    saved = data.load_checkpoint(os.path.join(out, "ckpt.pt"))["config"]
    assert "overwrite" not in saved and saved["device"] == "auto"  # what was asked, not found
    train.main([f"--out_dir={out}", "--resume", "--max_iters=22"])
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("settings: "))
    assert "overwrite=" not in line and "resume=" not in line and "max_iters=22" in line


def test_words_and_a_finished_run(data_dir, tmp_path, capsys):
    """--resume=true and --compile=false are accepted; '1 step', '1 micro-step x 1 process', not
    '1 steps'; --resume on a finished run says it is there already and trains nothing."""
    out = str(tmp_path / "run")
    train.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=1",
                       "--compile=false"])
    printed = capsys.readouterr().out
    assert ", 1 step, data " in printed and "x 1 micro-step x 1 process)" in printed
    evals = len(records(out, "eval"))
    train.main([f"--out_dir={out}", "--resume=true"])
    printed = capsys.readouterr().out
    assert f"resuming {out} at step 1\n" in printed and "iter " not in printed
    assert f"kept {out}/ckpt.pt (step 1)" in printed and "saved" not in printed
    assert len(records(out, "eval")) == evals  # nothing trained


# ---- errors about the data ----

def test_a_short_split_is_named_with_its_real_numbers(tmp_path):
    """Issue 22: a message blamed every shard when only the validation split was short. One
    document: its last tenth is the val split (40 tokens); the block_size it suggests trains."""
    dataset = prepared(tmp_path / "data", ["x" * 399], name="short")
    val = data.load_meta(dataset)["val_tokens"]
    cfg = configurator.defaults(train.SETTINGS, dataset=dataset, out_dir=str(tmp_path / "out"),
                                block_size=64, n_layer=1, n_head=2, n_embd=16, device="cpu",
                                max_iters=1, eval_iters=1)
    with pytest.raises(data.DataError) as error:
        train.train(cfg)
    assert val == 40 and str(error.value) == (
        f"the val split's longest shard has {val} tokens, fewer than one window needs "
        f"(block_size 64 + 2): use --block_size={val - 2} or less, or prepare more text")
    cfg.block_size = val - 2
    assert train.train(cfg)["iter"] == 1


def test_a_dataset_typo_is_reported_before_the_checkpoint_in_out(data_dir, tmp_path, monkeypatch):
    """With out/ holding a checkpoint, --dataset=<typo> names the missing dataset and what is
    prepared (not 'out already holds a checkpoint'), with --resume too."""
    monkeypatch.chdir(tmp_path)
    prepared("data", ["Speak, speak. " * 50] * 20, name="plays")
    train.main(TINY + ["--dataset=plays_byte", "--max_iters=1"])  # into out/
    assert os.path.exists("out/ckpt.pt")
    for extra in ([], ["--resume"]):
        with pytest.raises(data.DataError) as error:
            train.main(TINY + ["--dataset=plays_bytes", *extra])
        assert str(error.value).startswith("no train shards in data/plays_bytes: make them with "
                                           "python prepare.py")


def test_a_failed_command_leaves_no_file_in_a_fresh_out_dir(data_dir, tmp_path):
    """Missing data, a split too short, a truncated shard: the run fails, and a fresh out_dir
    holds no file afterwards (no log, no lock file, no checkpoint)."""
    short = prepared(tmp_path / "data", ["x" * 399], name="short")
    broken = prepared(tmp_path / "data", ["Speak, speak. " * 50] * 20, name="broken")
    shard = data.list_shards(broken, "train")[0]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 10)
    for i, (dataset, error) in enumerate([(tmp_path / "missing", "no train shards"),
                                          (short, "the val split's longest shard has 40 tokens"),
                                          (broken, "(truncated?)")]):
        out = tmp_path / f"out{i}"
        cfg = configurator.defaults(train.SETTINGS, dataset=str(dataset), out_dir=str(out),
                                    n_layer=1, n_head=2, n_embd=16, device="cpu")
        with pytest.raises(data.DataError, match=error.replace("(", r"\(").replace("?)", r"\?\)")):
            train.train(cfg)
        assert not out.exists() or os.listdir(out) == [], os.listdir(out)
