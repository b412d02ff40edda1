"""Tests for train.py and its command line (configurator.py): every value mode trains, exact
resume and what a resume may change, an occupied out_dir, what stops a run (a non-finite loss,
Ctrl-C, a full disk, out of memory, a bug), every setting's check, the start line's note, MFU,
the schedule, the batches, and torchrun with 2 gloo processes."""
import collections
import dataclasses
import errno
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

import configurator
import data
import model
import train
from conftest import TINY
from configurator import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def load(out_dir):
    return data.load_checkpoint(os.path.join(out_dir, "ckpt.pt"))


def parse(argv):
    return configurator.parse_args(train.SETTINGS, [str(a) for a in argv], train.USAGE)


def raising(error):
    """A stand-in (for main, or train.training_step) that raises error."""
    def stand_in(*args, **kwargs):
        raise error
    return stand_in


@pytest.fixture
def tiny(plays, tmp_path):
    """The tiny model on the plays, into tmp_path/out: train.py's arguments."""
    return TINY + [f"--dataset={plays}", f"--out_dir={tmp_path / 'out'}"]


@pytest.fixture(scope="module")
def checkpoint(plays, tmp_path_factory):
    """A 4-step run at a learning rate other than the default: its out_dir. Tests only read it
    (a refused resume writes nothing); one that resumes it copies it first."""
    out = tmp_path_factory.mktemp("resumable") / "out"
    train.main(TINY + [f"--dataset={plays}", f"--out_dir={out}", "--max_iters=4",
                       "--eval_interval=2", "--learning_rate=5e-3"])
    return out


# ---- training ----

@pytest.mark.parametrize("mode", model.VALUE_MODES)
def test_every_value_mode_trains_and_logs_its_evaluations_and_steps(mode, tiny, tmp_path,
                                                                    capsys):
    out = tmp_path / "out"
    learned = ["--learnable_lambda"] if mode == "resformer" else []
    cfg = parse(tiny + [f"--value_mode={mode}", "--max_iters=10", "--eval_interval=5", *learned])
    trained, log = train.train(cfg)
    assert read_log(out) == log
    assert [(e["kind"], e["iter"]) for e in log] == [("eval", 0), ("train", 5), ("eval", 5),
                                                     ("train", 10), ("eval", 10)]
    evals, step = [e for e in log if e["kind"] == "eval"], cfg.batch_size * cfg.block_size
    assert [e["tokens"] for e in evals] == [0, 5 * step, 10 * step]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.2  # it learns (from about ln 257)
    assert evals[-1].get("mixing") == (trained.mixing_weights() or None)  # as it ends
    assert all(e["ms_per_step"] > 0 for e in log if e["kind"] == "train")
    assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl"]
    ckpt = load(out)
    assert ckpt["iter_num"] == 10 and ckpt["model_args"]["value_mode"] == mode
    assert ckpt["tokenizer"] == "byte"
    assert not set(train.ACTIONS) & set(ckpt["config"])  # --resume is a command's, not a run's
    printed = capsys.readouterr().out
    assert printed.startswith(f"training {out} at step 0: {mode}, ") and "note:" not in printed
    # The eval line names each learned mixing weight's numbers: their means over the layers.
    named = {"resformer": r", lambda_1 -?\d\.\d\d, lambda_2 -?\d\.\d\d\n",
             "value_embed": r", lambda_n -?\d\.\d\d\n"}.get(mode, r"\d\n")
    assert len(re.findall(r"step \d+: train loss [\d.]+, val loss [\d.]+" + named, printed)) == 3
    assert printed.endswith(f"{out}/ckpt.pt is at step 10: python sample.py --out_dir={out} "
                            f"samples from it\n")


def test_lambda_lr_scale_0_freezes_the_learned_lambdas_while_1_moves_them(tiny):
    mixing = {}
    for scale in (0.0, 1.0):  # the second run replaces the first (--overwrite)
        trained, _ = train.train(parse(tiny + ["--learnable_lambda", f"--lambda_lr_scale={scale}",
                                               "--max_iters=5", "--overwrite"]))
        mixing[scale] = np.array(list(trained.mixing_weights().values()))
    assert mixing[0.0].size and (mixing[0.0] == 0.5).all() and (mixing[1.0] != 0.5).any()


def test_the_quickstart_preset_is_train_py_defaults():
    preset = configurator.read_preset(os.path.join(ROOT, "config", "quickstart.py"))
    assert preset and {k: (type(v), v) for k, v in preset.items()} == {
        k: (type(train.SETTINGS[k][0]), train.SETTINGS[k][0]) for k in preset}
    # The GPU presets of train.py are its settings too; GPT-2's step is 2**19 tokens.
    gpt2 = parse([os.path.join(ROOT, "config", "gpt2_124m.py")])
    assert gpt2.batch_size * gpt2.block_size * gpt2.gradient_accumulation_steps == 2**19
    parse([os.path.join(ROOT, "config", "plays_gpu.py")])


# ---- resume ----

@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_run_stopped_and_resumed_logs_the_losses_of_an_uninterrupted_one(dropout, plays,
                                                                           tmp_path):
    """12 steps straight, or 6 and then --resume to 12: the same losses, bit for bit, and the
    same weights and AdamW moments (with dropout, the random numbers resume too)."""
    run = TINY + [f"--dataset={plays}", "--max_iters=12", "--lr_decay_iters=12",
                  "--eval_interval=3", "--log_interval=1", f"--dropout={dropout}"]
    train.main(run + [f"--out_dir={tmp_path / 'straight'}"])
    train.main(run + [f"--out_dir={tmp_path / 'resumed'}", "--max_iters=6"])
    train.main([f"--out_dir={tmp_path / 'resumed'}", "--resume", "--max_iters=12"])
    logs = {name: [(e["kind"], e["iter"], e.get("loss"), e.get("lr"), e.get("val_loss"))
                   for e in read_log(tmp_path / name)] for name in ("straight", "resumed")}
    assert len(logs["straight"]) == 12 + 5 and logs["resumed"] == logs["straight"]
    a, b = load(tmp_path / "straight"), load(tmp_path / "resumed")
    assert b["iter_num"] == 12 and all(torch.equal(a["model"][k], b["model"][k])
                                       for k in a["model"])
    assert all(torch.equal(a["optimizer"]["state"][i]["exp_avg"], s["exp_avg"])
               for i, s in b["optimizer"]["state"].items())


def test_a_resume_may_repeat_the_runs_settings_and_change_the_resumable_ones(checkpoint, plays,
                                                                             tmp_path):
    out = tmp_path / "out"
    shutil.copytree(checkpoint, out)  # out_dir is resumable: the folder may move
    preset = tmp_path / "again.py"
    preset.write_text("# the run's own settings\nn_layer = 2\nlearning_rate = 5e-3\n")
    same = TINY + [f"--dataset={plays}", "--learning_rate=5e-3"]
    for given in ([], same, [preset], [preset, *same]):
        argv = [*given, f"--out_dir={out}", "--resume"]
        cfg, _ = train.resume_settings(parse(argv), [str(a) for a in argv])
        assert (cfg.learning_rate, cfg.n_embd, cfg.dataset, cfg.max_iters) == (
            5e-3, parse(TINY).n_embd, str(plays), 4)  # the run's, not the defaults
    assert set(train.RESUMABLE) <= set(train.SETTINGS)
    train.main([f"--out_dir={out}", "--resume", "--max_iters=6", "--eval_interval=3",
                "--log_interval=1", "--eval_iters=1", "--lr_decay_iters=8", "--device=cpu",
                "--dtype=float32", "--compile=False"])
    log, ckpt = read_log(out), load(out)
    assert [e["iter"] for e in log if e["kind"] == "train"] == [4, 5, 6]  # 5 steps, then 1
    assert [e["iter"] for e in log if e["kind"] == "eval"] == [0, 2, 4, 6]
    assert (ckpt["iter_num"], ckpt["config"]["lr_decay_iters"], ckpt["config"]["learning_rate"],
            ckpt["config"]["out_dir"]) == (6, 8, 5e-3, str(out))


@pytest.mark.parametrize("key,value,there,now", [
    ("batch_size", "8", 4, 8), ("n_layer", "3", 2, 3), ("learning_rate", "0.01", 5e-3, 0.01),
    ("value_mode", "vanilla", "resformer", "vanilla")])
def test_a_resume_that_changes_another_setting_is_one_line_naming_it(key, value, there, now,
                                                                      checkpoint):
    before = (checkpoint / "ckpt.pt").read_bytes()
    with pytest.raises(ConfigError) as error:
        train.main([f"--out_dir={checkpoint}", "--resume", f"--{key}={value}"])
    assert str(error.value).startswith(f"cannot resume {checkpoint}/ckpt.pt with {key} "
                                       f"{there!r} there, {now!r} now: a resume changes only ")
    assert "\n" not in str(error.value) and (checkpoint / "ckpt.pt").read_bytes() == before


def test_a_checkpoint_this_code_cannot_continue_is_one_line(checkpoint, tmp_path):
    """No checkpoint; one of 2 processes resumed by 1; one of other model code (a tensor today's
    model.py lacks, as after a RoPE edit): one line each, nothing written."""
    with pytest.raises(data.DataError, match=f"^no checkpoint at {tmp_path}/ckpt.pt: train one"):
        train.main([f"--out_dir={tmp_path}", "--resume"])
    ckpt = torch.load(checkpoint / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "rank_states": ckpt["rank_states"] * 2}, tmp_path / "ckpt.pt")
    with pytest.raises(ConfigError) as error:
        train.main([f"--out_dir={tmp_path}", "--resume", "--max_iters=6"])
    assert str(error.value) == (f"{tmp_path}/ckpt.pt was written by 2 processes: resume it "
                                f"with as many")
    ckpt["model"]["transformer.rotary"] = torch.zeros(3)
    torch.save(ckpt, tmp_path / "ckpt.pt")
    with pytest.raises(ConfigError) as error:
        train.main([f"--out_dir={tmp_path}", "--resume", "--max_iters=6"])
    assert str(error.value) == (f"cannot resume {tmp_path}/ckpt.pt: it does not fit today's "
                                f"model.py (transformer.rotary): other code trained it")
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


def test_overwrite_keeps_the_old_run_until_the_new_runs_first_checkpoint(tiny, tmp_path,
                                                                         monkeypatch, capsys):
    out, argv = tmp_path / "out", tiny + ["--max_iters=4", "--eval_interval=2"]
    train.main(argv)
    old = {name: (out / name).read_bytes() for name in ("ckpt.pt", "log.jsonl")}
    with pytest.raises(ConfigError) as error:
        train.main(argv)
    assert str(error.value) == (f"{out} holds a checkpoint: go on with --resume, or train "
                                f"into another --out_dir (--overwrite replaces it)")
    real, steps = train.training_step, []

    def stopped_in_the_second_step(*args):  # before the new run's first checkpoint (step 2)
        steps.append(1)
        if len(steps) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(train, "training_step", stopped_in_the_second_step)
    with pytest.raises(KeyboardInterrupt):
        train.main(argv + ["--overwrite", "--seed=7"])
    assert capsys.readouterr().err == (f"Ctrl-C: stopped; {out}/ckpt.pt is kept: go on with "
                                       f"python train.py --resume --out_dir={out}\n")
    assert {name: (out / name).read_bytes() for name in old} == old
    assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl"]
    monkeypatch.setattr(train, "training_step", real)
    train.main(argv + ["--overwrite", "--seed=7"])
    assert [e["iter"] for e in read_log(out) if e["kind"] == "eval"] == [0, 2, 4]  # its own log
    assert load(out)["config"]["seed"] == 7


# ---- what stops a run ----

def test_a_non_finite_loss_stops_with_one_line_and_a_diverged_entry(tiny, tmp_path, monkeypatch):
    out, real, steps = tmp_path / "out", train.training_step, []

    def nan_from_step_3(*args):
        steps.append(1)
        loss = real(*args)
        return loss * float("nan") if len(steps) >= 3 else loss

    monkeypatch.setattr(train, "training_step", nan_from_step_3)
    with pytest.raises(ConfigError) as error:
        train.main(tiny + ["--max_iters=6", "--eval_interval=2", "--log_interval=1"])
    assert str(error.value) == ("the loss is not finite at step 3: stopped (try a lower "
                                "--learning_rate)")
    log = read_log(out)
    assert log[-1] == {"iter": 3, "kind": "diverged"} and log[-2]["kind"] == "train"
    assert load(out)["iter_num"] == 2


def test_run_main_one_line_for_a_users_mistake_130_for_ctrl_c_a_traceback_for_a_bug(
        tiny, monkeypatch, capsys):
    """A UserError: "error: ..." (Python exits 1 with it); Ctrl-C: 130 (the script has said what
    it kept); a bug (here in model.py) and any other error propagate, so Python shows the
    traceback."""
    monkeypatch.setattr(sys, "argv", ["train.py"])
    for error, code in [(ConfigError("--a=1: must be at least 2"), "error: --a=1: must be at "
                                                                   "least 2"),
                        (data.DataError("no dataset in data/x"), "error: no dataset in data/x"),
                        (KeyboardInterrupt(), 130)]:
        with pytest.raises(SystemExit) as stopped:
            configurator.run_main(raising(error))
        assert stopped.value.code == code
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit, match="^3$"):
        configurator.run_main(lambda argv: 3)
    with pytest.raises(OSError):  # not a full disk: a bug's
        configurator.run_main(raising(OSError(errno.ENOENT, "No such file or directory", "x")))
    monkeypatch.setattr(model, "MIXING_WEIGHTS", None)  # a bug in model.py
    monkeypatch.setattr(sys, "argv", ["train.py", *tiny, "--max_iters=2"])
    with pytest.raises(TypeError) as bug:
        configurator.run_main(train.main)
    shown = "".join(traceback.format_exception(bug.value))  # what Python prints with exit 1
    frames = [line for line in shown.splitlines() if line.startswith('  File "')]
    assert frames[-1].startswith(f'  File "{model.__file__}", line ')


def test_a_full_disk_is_one_line_and_keeps_the_files_written_before(tiny, tmp_path,
                                                                    monkeypatch):
    """The second checkpoint's write fails as torch.save fails on a full disk (its RuntimeError
    caused by the OSError): one line, the first checkpoint and its log whole, no partial file."""
    out, real, saves = tmp_path / "out", torch.save, []

    def full_at_the_second_save(obj, f):
        saves.append(obj["iter_num"])
        if len(saves) == 2:
            f.write(b"PK\x03\x04 half a checkpoint")
            raise RuntimeError("PytorchStreamWriter failed writing file data/0") from OSError(
                errno.ENOSPC, "No space left on device", f"{out}/ckpt.pt.tmp")
        return real(obj, f)

    monkeypatch.setattr(torch, "save", full_at_the_second_save)
    monkeypatch.setattr(sys, "argv", ["train.py", *tiny, "--max_iters=4", "--eval_interval=2"])
    with pytest.raises(SystemExit) as stopped:
        configurator.run_main(train.main)
    assert stopped.value.code == (f"error: no space left on device ({out}/ckpt.pt.tmp): free some"
                                  f" space and run the command again")
    assert saves == [2, 4] and sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl"]
    assert load(out)["iter_num"] == 2 and read_log(out)[-1]["iter"] == 2


def test_out_of_memory_is_one_line_naming_a_smaller_micro_step_and_lab_memory(tiny,
                                                                              monkeypatch):
    monkeypatch.setattr(train, "training_step", raising(torch.OutOfMemoryError("CUDA OOM")))
    with pytest.raises(ConfigError) as error:
        train.main(tiny + ["--overwrite"])
    assert str(error.value) == (
        "out of GPU memory: halve --batch_size and double --gradient_accumulation_steps "
        "(python -m lab.memory " + " ".join(tiny + ["--overwrite"]) + " says what fits)")


def test_python_train_py_with_a_bad_setting_exits_1_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "train.py", "--dropout=1.5",
                           f"--out_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", "error: --dropout=1.5: must be from 0.0 to 0.99 (dropout rate)\n")
    assert not (tmp_path / "out").exists()


def test_ctrl_c_exits_130_naming_the_kept_checkpoint_which_resume_continues(tiny, tmp_path):
    """A real SIGINT to `python train.py` after its first checkpoint: no traceback, one line on
    what is kept and how to go on; --resume (only max_iters given) continues it."""
    out = tmp_path / "out"
    # A shell's background job (so a pytest started as one) passes SIGINT on ignored: undo that.
    run = subprocess.Popen([sys.executable, "train.py", *tiny, "--max_iters=100000",
                            "--eval_interval=5"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 60
        while not (out / "ckpt.pt").exists():
            assert run.poll() is None, run.communicate()  # it ended: why
            assert time.time() < deadline, "no checkpoint within 60 s"
            time.sleep(0.02)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 130 and stderr == (
        f"Ctrl-C: stopped; {out}/ckpt.pt is kept: go on with python train.py --resume "
        f"--out_dir={out}\n"), stderr[-2000:]
    assert not [name for name in os.listdir(out) if name.endswith(".tmp")]
    stop = load(out)["iter_num"]
    assert stop > 0 and stop % 5 == 0
    train.main([f"--out_dir={out}", "--resume", f"--max_iters={stop + 5}"])
    assert load(out)["iter_num"] == stop + 5
    assert [e["iter"] for e in read_log(out) if e["kind"] == "eval"] == list(range(0, stop + 6, 5))


# ---- the settings ----

@pytest.mark.parametrize("script", ["train", "sample", "prepare", "compare", "bench"])
def test_every_numeric_setting_has_limits(script):
    settings = importlib.import_module(script).SETTINGS
    unlimited = {k for k, (default, *rest) in settings.items()
                 if type(default) in (int, float) and not rest}
    # ResFormer's mixing weights take any value (the paper swept lambda from -1 to 2), and
    # prepare.py's seed seeds random.Random, which takes any integer.
    assert unlimited <= {"lambda_1", "lambda_2"} | ({"seed"} if script == "prepare" else set())


@pytest.mark.parametrize("key", [k for k, spec in train.SETTINGS.items() if len(spec) > 2])
def test_a_value_outside_its_settings_limits_is_one_line_naming_it(key):
    default, meaning, low, *high = train.SETTINGS[key]
    high = high[0] if high else None
    step = 1 if isinstance(default, int) else 0.5
    for value in [v for v in (low, high) if v is not None]:
        assert getattr(parse([f"--{key}={value}"]), key) == value  # the limits are allowed
    outside = [low - step] if low is not None else []
    outside += ([high + step] if high is not None else []) + (
        ["nan", "inf", "-inf"] if isinstance(default, float) else [])
    assert outside
    for value in outside:
        with pytest.raises(ConfigError) as error:
            parse([f"--{key}={value}"])
        assert str(error.value).startswith(f"--{key}=") and "must be" in str(error.value)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("argv,message", [
    (["--learning_rate=nan"], "--learning_rate=nan: must be a finite float, like 0.003"),
    (["--dropout=1.5"], "--dropout=1.5: must be from 0.0 to 0.99 (dropout rate)"),
    (["--n_layer=0"], "--n_layer=0: must be from 1 to inf (transformer blocks)"),
    (["--n_layer=4.5"], "--n_layer=4.5: must be int, like 4"),
    (["--compile=yes"], "--compile=yes: must be bool, like False"),
    (["--n_layers=4"], "--n_layers=4: no such setting here (--help lists them)"),
    (["--lr=1"], "--lr=1: no such setting here"),  # no abbreviations: a typo is a typo
    (["--max_iters"], "--max_iters=true: must be int, like 6000")])
def test_a_bad_value_is_one_line(argv, message):
    with pytest.raises(ConfigError) as error:
        parse(argv)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize("argv,world,message", [
    (["--gradient_accumulation_steps=3"], 2, "--gradient_accumulation_steps=3: must divide "
                                             "among the 2 processes"),
    (["--n_head=3"], 1, "n_embd (16) must be divisible by n_head (3)"),
    (["--value_mode=resformr"], 1, "value_mode 'resformr': use vanilla, resformer, svformer"),
    (["--value_mode=vanilla", "--learnable_lambda"], 1, "lambda_1, lambda_2 and learnable_lambda "
                                                        "are resformer's alone"),
    (["--device=cuda"], 1, "--device=cuda: not here; use auto or cpu"),
    (["--dtype=fp8"], 1, "--dtype=fp8: use auto, float32, float16 or"),
    (["--dataset=no_such_plays"], 1, "no dataset in data/no_such_plays: make one with python "
                                     "prepare.py")])
def test_settings_that_cannot_train_are_one_line_before_any_file(argv, world, message, tiny,
                                                                  tmp_path, monkeypatch):
    if argv == ["--device=cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(train, "WORLD", world)  # 2: as one of torchrun's 2 processes
    with pytest.raises(configurator.UserError) as error:
        train.main(tiny + argv)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_an_out_dir_that_cannot_be_a_folder_is_one_line(tiny, tmp_path):
    """A file, or a folder inside a file, as --out_dir: a user's mistake, not a traceback."""
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    for out in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "sub"):
        with pytest.raises(configurator.UserError) as error:
            train.main(tiny + [f"--out_dir={out}", "--max_iters=1"])
        assert f"--out_dir={out}" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("text,message", [
    (None, "no preset file {} (the presets are in config/)"),
    ("import os\n", "{}: a preset holds only `key = value` lines"),
    ("n_layer = os.cpu_count()\n", "{}: a preset holds only `key = value` lines"),
    ("n_layer = \n", "{}: a preset holds only `key = value` lines"),
    ("# for compare.py, not train.py\n# more\nmodes = 'vanilla'\n",
     "{}: modes is no setting here (--help lists them)"),
    ("bogus = 1\n", "{}: bogus is no setting here (--help lists them)"),
    ("n_layer = 4.0\n", "--n_layer=4.0: must be int, like 4")])
def test_a_bad_preset_is_one_line(text, message, tmp_path):
    preset = tmp_path / "preset.py"
    if text is not None:
        preset.write_text(text)
    with pytest.raises(ConfigError) as error:
        parse([preset])
    assert str(error.value) == message.format(preset)


def test_presets_then_overrides_each_value_as_its_settings_type(tmp_path):
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("# a preset\nn_layer = 8\ndropout = 0.5\nvalue_mode = 'svformer'  # too\n")
    second.write_text("n_layer = 3\n")
    cfg = parse(["--dropout=0.25", first, second, "--learning_rate=1", "--compile"])
    assert (cfg.n_layer, cfg.dropout, cfg.value_mode, cfg.learning_rate, cfg.compile) == (
        3, 0.25, "svformer", 1.0, True)
    assert type(cfg.learning_rate) is float and parse(["--compile=FALSE"]).compile is False
    assert parse(["--value_mode=1e3"]).value_mode == "1e3"  # text stays text
    with pytest.raises(ConfigError, match="demo.py: [a-z_]+ is no setting here"):
        parse([os.path.join(ROOT, "config", "demo.py")])  # a compare.py preset


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_setting_with_the_value_the_command_would_use(flag, capsys):
    argv = [os.path.join(ROOT, "config", "gpt2_124m.py"), "--n_layer=6"]
    with pytest.raises(SystemExit) as stopped:
        parse(argv + [flag])
    printed = capsys.readouterr().out
    assert stopped.value.code == 0 and printed.startswith(f"usage: {train.USAGE}")
    cfg = parse(argv)
    assert (cfg.n_layer, cfg.n_embd) == (6, 768)
    for key, (default, meaning, *_) in train.SETTINGS.items():
        assert f"  --{key}={getattr(cfg, key)}  {meaning}\n" in printed, key
    assert "one of vanilla, resformer, svformer, value_embed" in printed  # model.py's modes


def test_a_field_added_to_gptconfig_becomes_a_setting_of_train_py(monkeypatch):
    """Every GPTConfig field but vocab_size (the data's) is a setting; train.py, loaded with a
    GPTConfig of one more field, has that field as a setting at its default."""
    fields = {f.name for f in dataclasses.fields(model.GPTConfig)}
    assert fields - {"vocab_size"} <= set(train.SETTINGS) and "vocab_size" not in train.SETTINGS

    @dataclasses.dataclass
    class WithRope(model.GPTConfig):
        rope_base: float = 10000.0

    monkeypatch.setattr(model, "GPTConfig", WithRope)
    try:
        importlib.reload(train)
        assert train.SETTINGS["rope_base"][0] == 10000.0
        assert parse(["--rope_base=500"]).rope_base == 500.0
    finally:
        monkeypatch.undo()
        importlib.reload(train)
    assert "rope_base" not in train.SETTINGS


def test_the_start_line_notes_a_run_that_sees_its_tokens_more_than_once(tiny, plays,
                                                                         monkeypatch, capsys):
    """The note appears exactly when max_iters x tokens a step exceeds the training split's
    tokens: a run of the plays (stopped at its first step), then start_run at the boundary."""
    train_tokens, cfg = data.load_meta(plays)["train_tokens"], parse(TINY)
    step = cfg.batch_size * cfg.block_size
    many = train_tokens // step + 1  # steps that take a few tokens more than the split
    monkeypatch.setattr(train, "training_step", raising(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        train.main(tiny + [f"--max_iters={many}"])
    out, err = capsys.readouterr()
    assert (f"\nnote: the run reads its {train_tokens:,} training tokens "
            f"{many * step / train_tokens:.2f} times\n") in out
    assert err == ""  # no checkpoint yet: nothing kept to name
    record = dict(tokens_per_step=step, num_params=1000, device="cpu", dtype="float32",
                  train_tokens=10 * step)
    for steps, noted in [(10, False), (11, True)]:  # a split of 10 steps' tokens
        train.start_run(parse(tiny + [f"--max_iters={steps}"]), None, record)
        assert ("note: the run reads its" in capsys.readouterr().out) == noted


# ---- the schedule ----

def test_the_lr_warms_up_then_follows_a_cosine_down_to_min_lr():
    cfg = SimpleNamespace(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110,
                          max_iters=200)
    lrs = [train.get_lr(it, cfg) for it in range(200)]
    assert lrs[:10] == pytest.approx([(it + 1) / 11 for it in range(10)])  # linear, up
    assert lrs[10] == pytest.approx(1.0) and lrs[60] == pytest.approx(0.55)  # the cosine's middle
    assert all(a > b for a, b in zip(lrs[10:110], lrs[11:111])) and lrs[110:] == [0.1] * 90
    # lr_decay_iters 0: the cosine ends at max_iters
    to_max = SimpleNamespace(**{**vars(cfg), "lr_decay_iters": 0, "max_iters": 110})
    assert [train.get_lr(it, to_max) for it in range(111)] == lrs[:111]
    # A warmup that would fill the run (or more) is cut to a tenth of it.
    for warmup in (20, 100):
        short = SimpleNamespace(**{**vars(to_max), "warmup_iters": warmup, "max_iters": 20})
        lrs = [train.get_lr(it, short) for it in range(21)]
        assert lrs[:3] == pytest.approx([1 / 3, 2 / 3, 1.0]) and lrs[20] == 0.1


# ---- the batches ----

def test_batches_draw_every_window_of_every_shard_and_a_split_too_short_is_one_line():
    """Rows are windows of one shard (never across two, none past a shard's end): a shard of n
    tokens has n - block_size - 1 of them; a reset draws the same batches again."""
    T = 4
    shards = [np.arange(1000 * s, 1000 * s + n, dtype=np.uint16)
              for s, n in enumerate([T + 1, 30, T + 2, 12])]
    batches = data.Batches(shards, 8, T, seed=0)
    starts = collections.defaultdict(set)  # shard: the starts of the windows drawn from it
    for _ in range(300):
        x, y = batches.next()
        assert x.shape == (8, T) and x.dtype == torch.int64
        assert torch.equal(x - x[:, :1], torch.arange(T).expand(8, T)) and torch.equal(y, x + 1)
        for first in x[:, 0].tolist():
            starts[first // 1000].add(first % 1000)
    assert starts == {1: set(range(25)), 2: {0}, 3: set(range(7))}
    batches.reset()
    first = batches.next()
    batches.reset()
    assert all(torch.equal(a, b) for a, b in zip(first, batches.next()))
    with pytest.raises(data.DataError) as error:
        data.Batches([np.arange(17, dtype=np.uint16)], 8, 16, seed=0)
    assert str(error.value) == ("no shard holds a window of block_size 16 + 2 tokens: use a "
                                "smaller --block_size, or more text")
    with pytest.raises(data.DataError):  # a split without shards
        data.Batches([], 8, 16, seed=0)


# ---- torchrun: 2 processes, gloo on the CPU ----

def torchrun(*args):
    """The stdout of `torchrun --standalone --nproc_per_node=2 train.py ARGS`, which must exit
    0; on a timeout the launcher and its processes are killed (they are their own session)."""
    launch = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc_per_node=2", "train.py", *args], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        stdout, stderr = launch.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        launch.communicate()
        raise
    assert launch.returncode == 0, stderr[:3000] + "\n...\n" + stderr[-1500:]
    return stdout


@pytest.mark.skipif(not dist.is_available(), reason="needs torch.distributed")
def test_torchrun_two_processes_log_once_and_their_checkpoint_resumes_with_two(tiny, tmp_path):
    """4 steps of 2 processes (one micro-step each): one log and one checkpoint, written by rank
    0, holding both processes' own batch streams; 1 process cannot resume it, 2 do."""
    out = tmp_path / "out"
    stdout = torchrun(*tiny, "--max_iters=4", "--eval_interval=2", "--log_interval=1",
                      "--gradient_accumulation_steps=2")
    cfg = parse(TINY)
    assert f", {2 * cfg.batch_size * cfg.block_size} tokens a step\n" in stdout
    assert stdout.count("step 4: train loss") == 1  # rank 0 alone prints
    ckpt = load(out)
    assert ckpt["world"] == 2 and len(ckpt["rank_states"]) == 2
    generators = [state["batches"] for state in ckpt["rank_states"]]
    assert not torch.equal(*generators)  # each process draws its own batches
    assert [e["iter"] for e in read_log(out) if e["kind"] == "train"] == [1, 2, 3, 4]
    assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl"]
    with pytest.raises(ConfigError, match=r"written by 2 processes: resume it with as many"):
        train.main([f"--out_dir={out}", "--resume", "--max_iters=6"])
    stdout = torchrun(f"--out_dir={out}", "--resume", "--max_iters=6")
    assert stdout.startswith(f"resuming {out} at step 4: ")
    assert [e["iter"] for e in read_log(out) if e["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert load(out)["iter_num"] == 6


def test_a_float16_run_resumes_with_its_loss_scale(plays, tmp_path, monkeypatch):
    """In float16 the GradScaler's scale is part of the run: it halves when a step's gradients
    overflow and doubles after growth_interval good ones (here 2, not 2,000, so that it moves).
    12 steps straight, or 6 and a resume: the same losses and the same scale."""
    scaler = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler", lambda *a, **kw: scaler(
        *a, growth_interval=2, **kw))
    run = TINY + [f"--dataset={plays}", "--max_iters=12", "--lr_decay_iters=12",
                  "--eval_interval=3", "--log_interval=1", "--dtype=float16"]
    train.main(run + [f"--out_dir={tmp_path / 'straight'}"])
    train.main(run + [f"--out_dir={tmp_path / 'resumed'}", "--max_iters=6"])
    half = load(tmp_path / "resumed")["scaler"]["scale"]
    train.main([f"--out_dir={tmp_path / 'resumed'}", "--resume", "--max_iters=12"])
    logs = {name: [(e["kind"], e["iter"], e.get("loss"), e.get("val_loss"))
                   for e in read_log(tmp_path / name)] for name in ("straight", "resumed")}
    assert len(logs["straight"]) == 12 + 5 and logs["resumed"] == logs["straight"]
    scales = [load(tmp_path / name)["scaler"]["scale"] for name in ("straight", "resumed")]
    assert half != 2.0 ** 16 and scales[0] == scales[1]  # moved by step 6, and carried on
