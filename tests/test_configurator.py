"""Tests for configurator.py: presets (and their base), --key=value overrides, their types and
limits, --help, the device, and run_main (one line for a user's mistake, a traceback for a bug)."""
import errno
import importlib
import os
import subprocess
import sys

import pytest

import configurator
import data
import sample
from configurator import ConfigError, parse_args, run_main

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root

SETTINGS = dict(n_layer=(6, "transformer blocks", (1, None)),
                learning_rate=(1e-3, "peak learning rate", (1e-12, None)),
                dropout=(0.0, "dropout rate", (0.0, 0.99)),
                compile=(True, "torch.compile the model"),
                value_mode=("vanilla", "the value mode"))
DEFAULTS = {key: spec[0] for key, spec in SETTINGS.items()}


def parse(argv):
    return vars(parse_args(SETTINGS, argv, "x.py"))


def test_overrides_and_types(tmp_path):
    """Presets, then overrides, in order; each value as its default's type."""
    preset = tmp_path / "p.py"
    preset.write_text("# a preset\nn_layer = 8\nvalue_mode = 'resformer'  # trailing comment\n")
    cfg = parse([str(preset), "--learning_rate=3e-4", "--compile=False", "--n_layer=4",
                 "--value_mode=svformer", "--learning_rate=1"])
    assert cfg == dict(n_layer=4, learning_rate=1.0, dropout=0.0, compile=False,
                       value_mode="svformer")
    assert isinstance(cfg["learning_rate"], float)
    assert parse(["--compile"])["compile"] is True and parse(["--compile=FALSE"])["compile"] is False
    assert parse([]) == DEFAULTS and parse([str(preset)])["n_layer"] == 8
    assert parse(["--value_mode=1e3"])["value_mode"] == "1e3"  # text stays text
    # defaults(): the defaults with the given ones, for code (tests, the lab) that calls a main
    assert vars(configurator.defaults(SETTINGS, n_layer=2)) == {**DEFAULTS, "n_layer": 2}


@pytest.mark.parametrize("argv,message", [
    (["--n_layers=4"], r"^unrecognized arguments: --n_layers=4$"),
    (["--n_layer=4.5"], r"^--n_layer=4.5: must be int, like 6$"),
    (["--n_layer=four"], r"^--n_layer=four: must be int, like 6$"),
    (["--compile=yes"], r"^--compile=yes: must be bool, like True$"),
    (["--learning_rate=fast"], r"^--learning_rate=fast: must be float, like 0.001$"),
    (["--n_layer=0"], r"^--n_layer=0: must be at least 1 \(transformer blocks\)$"),
    (["--dropout=1"], r"^--dropout=1.0: must be between 0.0 and 0.99 \(dropout rate\)$"),
    (["--lr=1"], r"^unrecognized arguments: --lr=1$"),  # no abbreviations: a typo is a typo
    (["no/such/preset.py"], "^no preset file no/such/preset.py"),
])
def test_bad_settings_are_one_line_errors(argv, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse(argv)
    assert "\n" not in str(e.value)


def test_bad_presets_are_one_line_errors_that_name_the_file(tmp_path):
    for text, message in [("import os\n", "only `key = value`"),
                          ("n_layer = os.cpu_count()\n", "not `key = literal`"),
                          ("bogus = 1\n", "p.py: unknown setting bogus"),
                          ("n_layer = \n", "not `key = literal`"),
                          ("n_layer = 0\n", "n_layer=0: must be at least 1"),
                          ("n_layer = 4.0\n", "n_layer=4.0: must be int"),
                          ("n_layer = 4\nbase = 'other.py'\n", "unknown setting base"),  # 1st only
                          ("base = 'missing.py'\n", "no preset file .*missing.py")]:
        preset = tmp_path / "p.py"
        preset.write_text(text)
        with pytest.raises(ConfigError, match=message) as e:
            parse([str(preset)])
        assert "\n" not in str(e.value)


def test_a_preset_builds_on_its_base_and_overrides_it(tmp_path, monkeypatch):
    """`base = "other.py"` first: the other preset's settings (found beside this one, wherever
    the command runs), then this one's over them; a base may have a base too."""
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "root.py").write_text("# the root\nn_layer = 8\ndropout = 0.5\n")
    (folder / "other.py").write_text("base = 'root.py'\nlearning_rate = 0.01\nn_layer = 12\n")
    (folder / "mine.py").write_text("base = \"other.py\"  # builds on it\n"
                                    "# my changes\nn_layer = 2\ncompile = False\n")
    (folder / "loop.py").write_text("base = 'loop.py'\n")
    monkeypatch.chdir(tmp_path)
    assert parse(["config/mine.py"]) == {**DEFAULTS, "n_layer": 2, "learning_rate": 0.01,
                                         "compile": False, "dropout": 0.5}
    assert parse(["config/other.py"])["n_layer"] == 12  # the base itself: unchanged
    assert parse(["config/mine.py", "--n_layer=3"])["n_layer"] == 3  # then the overrides
    with pytest.raises(ConfigError, match="its base leads back to itself"):
        parse(["config/loop.py"])
    # the settings a preset sets include its bases' (what --resume takes as given)
    train = importlib.import_module("train")
    assert train.given_settings(["config/mine.py", "--seed=3"]) == {
        "n_layer", "learning_rate", "compile", "dropout", "seed"}


def test_train_py_with_the_demo_preset_says_what_the_preset_is_for():
    done = subprocess.run([sys.executable, "train.py", "config/demo.py"], cwd=HERE,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: config/demo.py: unknown setting ")
    assert done.stderr.count("\n") == 1 and "python compare.py config/demo.py" in done.stderr


# What no value of sample.py's limited settings may be: out of range, or not a number.
IMPOSSIBLE = {"num_samples": ["0", "-3"], "max_new_tokens": ["-1"], "temperature": ["-0.5"],
              "top_k": ["-1"], "seed": ["-1", str(2**63)]}


@pytest.mark.parametrize("script", ["train.py", "sample.py", "prepare.py", "compare.py",
                                    "bench.py"])
def test_every_numeric_setting_has_limits(script):
    settings = importlib.import_module(script[:-3]).SETTINGS
    numeric = {k for k, (default, *_) in settings.items() if type(default) in (int, float)}
    unlimited = {k for k in numeric if len(settings[k]) < 3} - {"lambda_1", "lambda_2", "seed",
                                                                 "beta1", "beta2"}
    assert unlimited == set(), f"{script}: numeric settings without limits: {unlimited}"


@pytest.mark.parametrize("key", sorted(IMPOSSIBLE))
def test_an_impossible_sample_setting_is_one_line(key, monkeypatch):
    """Through run_main, as `python sample.py --key=value` runs: exit with one line naming the
    setting and what it must be, before any checkpoint is read."""
    for value in IMPOSSIBLE[key]:
        monkeypatch.setattr(sys, "argv", ["sample.py", f"--{key}={value}"])
        with pytest.raises(SystemExit) as e:
            run_main(sample.main)
        message = str(e.value.code)
        assert message.startswith(f"error: --{key}=") and "\n" not in message, message
        assert "must be" in message, message
    ok = parse_args(sample.SETTINGS, ["--temperature=0", "--max_new_tokens=0", "--top_k=0",
                                      f"--seed={2**63 - 1}"], "")
    assert (ok.temperature, ok.top_k, ok.seed) == (0.0, 0, 2**63 - 1)


def help_of(script, *args):
    done = subprocess.run([sys.executable, script, *args, "--help"], cwd=HERE,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


@pytest.mark.parametrize("script", ["train.py", "sample.py", "compare.py", "bench.py",
                                    "prepare.py"])
def test_help_lists_every_setting_and_exits_0(script):
    """--help (and -h) print each setting, its meaning and the value the command would use."""
    settings = importlib.import_module(script[:-3]).SETTINGS
    for flag in ("--help", "-h"):
        done = subprocess.run([sys.executable, script, flag], cwd=HERE, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout.startswith("usage: python " + script)
        flat = " ".join(done.stdout.split())
        for key, (default, meaning, *_) in settings.items():
            assert f"--{key} " in done.stdout, key
            assert " ".join(meaning.replace("%", "%%").split()[:3]).replace("%%", "%") in flat, key


def test_help_shows_what_the_command_as_typed_would_use():
    flat = " ".join(help_of("train.py", "config/gpt2_124m.py", "--n_layer=6").split())
    assert "transformer blocks (this and below: GPTConfig in model.py) (6)" in flat
    assert "model width (768)" in flat and "torch.compile the model (GPU; slow to start) (True)" \
        in flat
    flat = " ".join(help_of("compare.py").split())  # compare.py trains its preset
    assert "model width (64)" in flat and "--resume" not in flat and "--overwrite" not in flat


def exits(main, monkeypatch, argv=("x.py",)):
    """run_main(main)'s SystemExit code."""
    monkeypatch.setattr(sys, "argv", list(argv))
    with pytest.raises(SystemExit) as e:
        run_main(main)
    return e.value.code


def raises(error):
    def main(argv):
        raise error
    return main


def test_run_main_one_line_for_a_users_mistake_a_traceback_for_a_bug(monkeypatch):
    """A UserError (ConfigError, data.DataError) and a full disk: one line, exit 1. Ctrl-C: exit
    130. Anything else is a bug (e.g. a ValueError from a student's model.py) and propagates,
    so Python prints its traceback."""
    assert exits(raises(ConfigError("--a=1: must be at least 2")), monkeypatch) == (
        "error: --a=1: must be at least 2")
    assert exits(raises(data.DataError("no dataset data/x: run ...")), monkeypatch) == (
        "error: no dataset data/x: run ...")
    full = exits(raises(OSError(errno.ENOSPC, "No space left on device", "out/ckpt.pt")),
                 monkeypatch)
    assert full.startswith("error: no space left on device (out/ckpt.pt)") and "\n" not in full
    wrapped = RuntimeError("torch.save failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded", "out/ckpt.pt.tmp")
    assert exits(raises(wrapped), monkeypatch).startswith("error: no space left on device")
    assert exits(raises(KeyboardInterrupt()), monkeypatch) == 130
    assert exits(lambda argv: 3, monkeypatch) == 3 and exits(lambda argv: None, monkeypatch) == 0
    assert exits(lambda argv: len(argv), monkeypatch, ["x.py", "--a", "--b"]) == 2  # argv[1:]
    for bug in (ValueError("n_embd (30) must be divisible by n_head (4)"), TypeError("oops"),
                OSError(errno.ENOENT, "No such file")):
        monkeypatch.setattr(sys, "argv", ["x.py"])
        with pytest.raises(type(bug)):
            run_main(raises(bug))


@pytest.mark.parametrize("error,stderr_has", [
    ("configurator.ConfigError('--n_layer=0: must be at least 1')",
     "error: --n_layer=0: must be at least 1\n"),
    ("ValueError('a bug in model.py')", "Traceback (most recent call last)"),
])
def test_run_main_as_a_program(error, stderr_has):
    """The same as a program: one line on stderr for a user's mistake, the whole traceback (with
    the failing line) for a bug; exit 1 either way."""
    program = f"import configurator\ndef main(argv):\n    raise {error}\nconfigurator.run_main(main)\n"
    done = subprocess.run([sys.executable, "-c", program], cwd=HERE, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    if stderr_has.startswith("error:"):
        assert done.stderr == stderr_has
    else:
        assert done.stderr.startswith(stderr_has) and "ValueError: a bug in model.py" in done.stderr


def test_a_reader_that_leaves_early_ends_quietly():
    done = subprocess.run(f"{sys.executable} train.py --help | head -1", shell=True, cwd=HERE,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("usage: python train.py") and "Traceback" not in done.stderr
