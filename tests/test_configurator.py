"""Tests for configurator.py: presets (and their base), --key=value overrides and their checks,
--help, and run_main (one line for a user's mistake, a traceback for a bug)."""
import errno
import importlib
import os
import subprocess
import sys

import pytest

import configurator
import data
import sample
from configurator import (POSITIVE, ConfigError, above, given_keys, load_config, one_of,
                          run_main)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root

SETTINGS = dict(n_layer=(6, "transformer blocks", POSITIVE),
                learning_rate=(1e-3, "peak learning rate", above(0.0)),
                compile=(True, "torch.compile the model"),
                value_mode=("vanilla", "the value mode"),
                top_k=(None, "keep the k likeliest tokens"),
                betas=((0.9, 0.95), "AdamW's betas"))
DEFAULTS = {key: spec[0] for key, spec in SETTINGS.items()}


def test_overrides_and_types(tmp_path):
    """Presets, then overrides, in order; each value as its default's type."""
    preset = tmp_path / "p.py"
    preset.write_text("# a preset\nn_layer = 8\nvalue_mode = 'resformer'  # trailing comment\n")
    cfg = load_config(SETTINGS, [str(preset), "--learning_rate=3e-4", "--compile=False",
                                 "--n_layer=4", "--top_k=50", "--value_mode=svformer",
                                 "--learning_rate=1", "--betas=(0.8, 0.99)"])
    assert vars(cfg) == dict(n_layer=4, learning_rate=1.0, compile=False, value_mode="svformer",
                             top_k=50, betas=(0.8, 0.99))
    assert isinstance(cfg.learning_rate, float)
    assert load_config(SETTINGS, ["--compile"]).compile is True
    assert vars(load_config(SETTINGS, [])) == DEFAULTS
    # defaults(): the defaults with the given ones, for code (tests) that calls a script's main
    assert vars(configurator.defaults(SETTINGS, n_layer=2)) == {**DEFAULTS, "n_layer": 2}


@pytest.mark.parametrize("argv,message", [
    (["--n_layers=4"], "unknown setting n_layers for this script"),
    (["--n_layer=4.5"], "n_layer must be int"),
    (["--n_layer=four"], "n_layer must be int"),
    (["--compile=yes"], "compile must be bool"),
    (["--learning_rate=True"], "learning_rate must be float"),
    (["--n_layer=0"], r"^--n_layer=0: must be at least 1$"),
    (["--learning_rate=0"], r"^--learning_rate=0.0: must be above 0.0$"),
    (["no/such/preset.py"], "no preset file"),
])
def test_bad_settings_are_clear_errors(argv, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config(SETTINGS, argv)
    assert "\n" not in str(e.value)


def test_bad_presets(tmp_path):
    for text, message in [("import os\n", "only `key = value`"),
                          ("n_layer = os.cpu_count()\n", "must be a literal"),
                          ("bogus = 1\n", "p.py: unknown setting bogus for this script"),
                          ("n_layer = \n", "not a valid preset"),
                          ("n_layer = 0\n", "n_layer=0: must be at least 1"),
                          ("n_layer = 4\nbase = 'other.py'\n", "unknown setting base"),  # 1st only
                          ("base = 'missing.py'\n", "no preset file .*missing.py")]:
        preset = tmp_path / "p.py"
        preset.write_text(text)
        with pytest.raises(ConfigError, match=message) as e:
            load_config(SETTINGS, [str(preset)])
        assert "\n" not in str(e.value)


def test_a_preset_builds_on_its_base_and_overrides_it(tmp_path, monkeypatch):
    """`base = "other.py"` first: the other preset's settings (found beside this one, wherever
    the command runs), then this one's over them; a base may have a base too."""
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "root.py").write_text("# the root\nn_layer = 8\ntop_k = 5\n")
    (folder / "other.py").write_text("base = 'root.py'\nlearning_rate = 0.01\nn_layer = 12\n")
    (folder / "mine.py").write_text("base = \"other.py\"  # builds on it\n"
                                    "# my changes\nn_layer = 2\ncompile = False\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(SETTINGS, ["config/mine.py"])
    assert vars(cfg) == {**DEFAULTS, "n_layer": 2, "learning_rate": 0.01, "compile": False,
                         "top_k": 5}
    assert load_config(SETTINGS, ["config/other.py"]).n_layer == 12  # the base itself: unchanged
    assert load_config(SETTINGS, ["config/mine.py", "--n_layer=3"]).n_layer == 3  # then overrides
    # the settings a preset sets include its bases' (what --resume takes as given)
    assert given_keys(["config/mine.py"]) == {"n_layer", "learning_rate", "compile", "top_k"}


def test_an_unknown_key_in_a_preset_names_the_preset_and_quotes_its_first_comment(tmp_path):
    preset = tmp_path / "cmp.py"
    preset.write_text("x = 1\n# For compare.py: four variants at once\n# more words\n"
                      "modes = 'vanilla,svformer'\n")
    with pytest.raises(ConfigError) as e:
        load_config(SETTINGS, [str(preset)], "train.py")
    assert str(e.value).startswith(f"{preset}: unknown setting x for train.py")
    assert f"{preset} says: 'For compare.py: four variants at once'" in str(e.value)
    # a close miss suggests the setting instead
    preset.write_text("# a typo\nn_layr = 3\n")
    with pytest.raises(ConfigError, match=r"unknown setting n_layr .*did you mean n_layer\?"):
        load_config(SETTINGS, [str(preset)], "train.py")


def test_train_py_with_the_demo_preset_says_it_is_compare_py_s():
    done = subprocess.run([sys.executable, "train.py", "config/demo.py"], cwd=HERE,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: config/demo.py: unknown setting ")
    assert done.stderr.count("\n") == 1 and "python compare.py config/demo.py" in done.stderr


def test_text_settings_keep_the_text_as_typed():
    assert load_config(SETTINGS, ["--value_mode=1e3"]).value_mode == "1e3"  # not "1000.0"
    assert load_config(SETTINGS, ["--value_mode=0x10,2"]).value_mode == "0x10,2"


# What no value of sample.py's checked settings may be: out of range, or not a number. Every
# numeric setting must have a check and a row here.
IMPOSSIBLE = {"num_samples": ["0", "-3"], "max_new_tokens": ["-1"], "temperature": ["-0.5"],
              "top_k": ["0", "-1"], "seed": ["-1", str(2**64)]}


def test_every_numeric_sample_setting_has_a_check_and_a_row_of_impossible_values():
    checked = {key for key, spec in sample.SETTINGS.items() if len(spec) > 2}
    numeric = {key for key, (default, *_) in sample.SETTINGS.items()
               if default is None or type(default) in (int, float)}
    assert numeric <= checked, f"numeric settings without a check: {numeric - checked}"
    assert set(IMPOSSIBLE) == checked


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
        assert message.endswith(f"{value}: must be {sample.SETTINGS[key][2][1]}"), message
    # the edges of what is allowed are allowed
    ok = load_config(sample.SETTINGS, ["--temperature=0", "--max_new_tokens=0", "--top_k=None",
                                       f"--seed={2**64 - 1}"])
    assert (ok.temperature, ok.top_k, ok.seed) == (0.0, None, 2**64 - 1)


def help_entries(stdout):
    """{key: (value shown, the text after it, continuation lines joined)} of a --help output."""
    entries = {}
    for line in stdout.splitlines():
        if line.startswith("  --"):
            flag, _, text = line[4:].partition(" ")
            key, _, value = flag.partition("=")
            entries[key] = [value, text]
        elif line.startswith(" " * 32) and entries:
            entries[key][1] += " " + line.strip()
        elif line.startswith(" " * 6) and entries:  # a long value, broken after a comma
            more, _, text = line.strip().partition(" ")
            entries[key] = [entries[key][0] + more, text.strip()]
    return entries


def help_values(script, *args):
    """{key: value as --help shows it} for `python script *args --help`."""
    result = subprocess.run([sys.executable, script, *args, "--help"], cwd=HERE,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return {key: value for key, (value, _) in help_entries(result.stdout).items()}


@pytest.mark.parametrize("script", ["train.py", "sample.py", "compare.py", "bench.py",
                                    "prepare.py"])
def test_help_lists_every_setting_and_exits_0(script):
    """--help (and -h) print each setting with the value the command would use (the default,
    or a preset's: compare.py starts from config/compare.py), its meaning and its check, in
    lines of at most 100 columns."""
    module = importlib.import_module(script[:-3])
    settings = module.SETTINGS
    preset = [module.DEFAULT_PRESET] if script == "compare.py" else []
    values = vars(load_config(settings, preset, script, getattr(module, "UNUSED", ())))
    for flag in ("--help", "-h"):
        result = subprocess.run([sys.executable, script, flag], cwd=HERE, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].startswith("usage: python " + script)
        too_long = [line for line in lines if len(line) > 100]
        assert not too_long, too_long
        entries = help_entries(result.stdout)
        assert list(entries) == list(settings)  # every setting, in order, and only those
        for key, (_, meaning, *check) in settings.items():
            shown, text = entries[key]
            assert shown == str(values[key]), key
            expected = meaning + (f" ({check[0][1]})" if check else "")
            assert "".join(text.split()) == "".join(expected.split()), key  # wrapped, whole


def test_help_shows_what_the_command_as_typed_would_use():
    # compare.py trains its preset, not train.py's quickstart
    shown = help_values("compare.py")
    assert (shown["n_layer"], shown["n_embd"], shown["batch_size"], shown["max_iters"]) == (
        "16", "64", "32", "800")
    assert "overwrite" not in shown and "resume" not in shown  # compare.py decides those per run
    # a preset and an override before --help
    shown = help_values("train.py", "config/gpt2_124m.py", "--n_layer=6")
    assert (shown["n_layer"], shown["n_embd"], shown["block_size"], shown["compile"]) == (
        "6", "768", "1024", "True")
    # bench.py lists only what a timing uses, and still reads train.py's presets
    shown = help_values("bench.py", "config/gpt2_124m.py")
    assert shown["n_embd"] == "768" and shown["json_out"] == "out/bench.json"
    for training_only in ("out_dir", "resume", "overwrite", "eval_interval", "max_iters",
                          "warmup_iters", "min_lr"):
        assert training_only not in shown


def test_a_close_miss_suggests_the_setting_and_booleans_take_lower_case():
    small = dict(max_iters=(5, "steps"), n_layer=(2, "blocks"))
    with pytest.raises(ConfigError, match=r"unknown setting max_iter for train.py \(did you mean "
                                          r"max_iters\?\)"):
        load_config(small, ["--max_iter=10"], "train.py")
    with pytest.raises(ConfigError, match=r"^unknown setting zebra for this script \(its --help "
                                          r"lists them\)$"):
        load_config(small, ["--zebra=1"])
    cfg = load_config(SETTINGS, ["--compile=false", "--compile=true", "--compile=FALSE"])
    assert cfg.compile is False
    assert load_config(SETTINGS, ["--compile=true"]).compile is True
    with pytest.raises(ConfigError, match="compile must be bool"):
        load_config(SETTINGS, ["--compile=yes"])


@pytest.mark.parametrize("script,key,hint", [
    ("train.py", "lr", "did you mean learning_rate or lr_decay_iters?"),  # initials, a prefix
    ("train.py", "bs", "did you mean batch_size or block_size?"),  # both are b..._s...
    ("train.py", "wd", "did you mean weight_decay?"),
    ("train.py", "max", "did you mean max_iters?"),
    ("train.py", "n_layers", "did you mean n_layer?"),  # a close spelling, as before
    ("sample.py", "temp", "did you mean temperature?"),
    ("sample.py", "mnt", "did you mean max_new_tokens?"),
    ("train.py", "zebra", "python train.py --help lists them"),  # not all 30 of them
    ("sample.py", "zebra", "python sample.py --help lists them"),
])
def test_an_unknown_setting_suggests_what_it_stands_for_in_one_short_line(script, key, hint,
                                                                          monkeypatch):
    """`python train.py --lr=1e-3` listed every setting on one line of 440 columns; now the
    settings an abbreviation stands for (initials, a prefix, a close spelling), or --help."""
    module = importlib.import_module(script[:-3])
    monkeypatch.setattr(sys, "argv", [script, f"--{key}=1"])
    with pytest.raises(SystemExit) as e:
        run_main(module.main)
    assert e.value.code == f"error: unknown setting {key} for {script} ({hint})"
    assert len(e.value.code) <= 100


def test_a_setting_typed_twice_is_refused_but_a_preset_is_there_to_be_overridden(monkeypatch,
                                                                                 capsys):
    """`python train.py --max_iters=10 --max_iters=20` trained 20 steps without a word: one line
    naming the key. A preset's value, then --key=value, is the design, not a repeat; and an argv
    that code builds (a test's base list, then overrides) still reads in order."""
    train = importlib.import_module("train")
    monkeypatch.setattr(train, "train", lambda cfg, given=None: pytest.fail("it trained"))
    monkeypatch.setattr(sys, "argv", ["train.py", "--max_iters=10", "--max_iters=20"])
    with pytest.raises(SystemExit) as e:
        run_main(train.main)
    assert e.value.code == ("error: --max_iters is given twice (--max_iters=10, then "
                            "--max_iters=20): keep one")
    with pytest.raises(ConfigError, match=r"^--compile is given twice \(--compile, then "
                                          r"--compile=false\): keep one$"):
        configurator.typed_once(["config/x.py", "--compile", "--n_layer=2", "--compile=false"])
    quickstart = os.path.join(HERE, "config", "quickstart.py")  # it sets max_iters too
    monkeypatch.setattr(sys, "argv", ["train.py", quickstart, "--max_iters=5", "-h"])
    with pytest.raises(SystemExit) as e:
        run_main(train.main)
    assert e.value.code == 0 and "  --max_iters=5 " in capsys.readouterr().out
    assert load_config(SETTINGS, ["--n_layer=2", "--n_layer=3"]).n_layer == 3


def test_key_space_value_is_a_one_line_error_and_bare_flags_are_booleans_only():
    with pytest.raises(ConfigError, match=r"--n_layer needs a value: write --n_layer=VALUE"):
        load_config(SETTINGS, ["--n_layer", "4"])
    with pytest.raises(ConfigError, match=r"--top_k needs a value"):
        load_config(SETTINGS, ["--top_k"])  # a None default is not a boolean either
    with pytest.raises(ConfigError, match="n_layer must be int"):
        load_config(SETTINGS, ["--n_layer=True"])
    assert load_config(SETTINGS, ["--compile"]).compile is True
    assert given_keys(["--n_layer=3", "--compile"]) == {"n_layer", "compile"}


def test_ignored_settings_come_from_presets_only(tmp_path):
    """bench.py reads train.py's presets: their keys it does not use are skipped there, and an
    error on its command line."""
    preset = tmp_path / "p.py"
    preset.write_text("n_layer = 3\nmax_iters = 100\n")
    cfg = load_config(SETTINGS, [str(preset)], "bench.py", ignored=("max_iters",))
    assert cfg.n_layer == 3 and not hasattr(cfg, "max_iters")
    with pytest.raises(ConfigError, match="--max_iters: a train.py setting bench.py does not use"):
        load_config(SETTINGS, ["--max_iters=5"], "bench.py", ignored=("max_iters",))


def test_checks_say_what_they_ask():
    assert one_of("a", "b")[1] == "one of a, b" and not one_of("a", "b")[0]("c")
    choice = dict(mode=("a", "the mode", one_of("a", "b")))
    with pytest.raises(ConfigError, match=r"^--mode=c: must be one of a, b$"):
        load_config(choice, ["--mode=c"])


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
