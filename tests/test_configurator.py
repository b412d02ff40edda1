"""Tests for configurator.py: presets, --key=value overrides, --help."""
import os
import subprocess
import sys

import pytest

from configurator import ConfigError, given_keys, load_config

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root

DEFAULTS = dict(n_layer=6, learning_rate=1e-3, compile=True, value_mode="vanilla", top_k=None,
                betas=(0.9, 0.95))


def test_overrides_and_types(tmp_path):
    preset = tmp_path / "p.py"
    preset.write_text("# a preset\nn_layer = 8\nvalue_mode = 'resformer'  # trailing comment\n")
    cfg = load_config(DEFAULTS, [str(preset), "--learning_rate=3e-4", "--compile=False",
                                 "--n_layer=4", "--top_k=50", "--value_mode=svformer",
                                 "--learning_rate=1"])
    assert cfg == dict(n_layer=4, learning_rate=1.0, compile=False, value_mode="svformer", top_k=50,
                       betas=(0.9, 0.95))
    assert isinstance(cfg["learning_rate"], float)
    assert load_config(DEFAULTS, ["--compile"])["compile"] is True
    assert load_config(DEFAULTS, []) == DEFAULTS


@pytest.mark.parametrize("argv,message", [
    (["--n_layers=4"], "unknown setting --n_layers"),
    (["--n_layer=4.5"], "n_layer must be int"),
    (["--n_layer=four"], "n_layer must be int"),
    (["--compile=yes"], "compile must be bool"),
    (["--learning_rate=True"], "learning_rate must be float"),
    (["no/such/preset.py"], "no preset file"),
])
def test_bad_settings_are_clear_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        load_config(DEFAULTS, argv)


def test_bad_presets(tmp_path):
    for text, message in [("import os\n", "only `key = value`"),
                          ("n_layer = os.cpu_count()\n", "must be a literal"),
                          ("bogus = 1\n", "unknown setting bogus"),
                          ("n_layer = \n", "not a valid preset")]:
        preset = tmp_path / "p.py"
        preset.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(DEFAULTS, [str(preset)])


def test_text_settings_keep_the_text_as_typed():
    cfg = load_config(DEFAULTS, ["--value_mode=1e3"])
    assert cfg["value_mode"] == "1e3"  # not "1000.0"
    assert load_config(DEFAULTS, ["--value_mode=0x10,2"])["value_mode"] == "0x10,2"


def help_values(script, *args):
    """{key: value as --help shows it} for `python script *args --help`."""
    result = subprocess.run([sys.executable, script, *args, "--help"], cwd=HERE,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return dict(line.split()[0][2:].split("=", 1) for line in result.stdout.splitlines()
                if line.startswith("  --"))


@pytest.mark.parametrize("script", ["train.py", "sample.py", "compare.py", "bench.py",
                                    "prepare.py"])
def test_help_lists_every_setting_and_exits_0(script):
    """--help (and -h) print each setting with the value the command would use (the default,
    or a preset's: compare.py starts from config/compare.py) and its meaning."""
    import importlib
    module = importlib.import_module(script[:-3])
    settings = module.SETTINGS
    preset = [module.DEFAULT_PRESET] if script == "compare.py" else []
    values = load_config({k: d for k, (d, _) in settings.items()}, preset,
                         getattr(module, "UNUSED", ()))
    for flag in ("--help", "-h"):
        result = subprocess.run([sys.executable, script, flag], cwd=HERE, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].startswith("usage: python " + script)
        for key, (_, meaning) in settings.items():
            assert any(line.split()[:1] == [f"--{key}={values[key]}"] and line.endswith(meaning)
                       for line in lines), key


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
    with pytest.raises(ConfigError, match=r"unknown setting --max_iter \(did you mean "
                                          r"--max_iters\?\)"):
        load_config(dict(max_iters=5, n_layer=2), ["--max_iter=10"])
    with pytest.raises(ConfigError, match=r"unknown setting --zebra \(known: max_iters, "
                                          r"n_layer\)"):
        load_config(dict(max_iters=5, n_layer=2), ["--zebra=1"])
    cfg = load_config(DEFAULTS, ["--compile=false", "--compile=true", "--compile=FALSE"])
    assert cfg["compile"] is False
    assert load_config(DEFAULTS, ["--compile=true"])["compile"] is True
    with pytest.raises(ConfigError, match="compile must be bool"):
        load_config(DEFAULTS, ["--compile=yes"])


def test_key_space_value_is_a_one_line_error_and_bare_flags_are_booleans_only():
    with pytest.raises(ConfigError, match=r"--n_layer needs a value: write --n_layer=VALUE"):
        load_config(DEFAULTS, ["--n_layer", "4"])
    with pytest.raises(ConfigError, match="n_layer must be int"):
        load_config(DEFAULTS, ["--n_layer=True"])
    assert load_config(DEFAULTS, ["--compile"])["compile"] is True
    assert given_keys(["--n_layer=3", "--compile"]) == {"n_layer", "compile"}
