"""Tests for configurator.py: presets, --key=value overrides, --help."""
import os
import subprocess
import sys

import pytest

from configurator import TRAIN_SETTINGS, ConfigError, given_keys, load_config

HERE = os.path.dirname(os.path.abspath(__file__))

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
                          ("bogus = 1\n", "unknown setting 'bogus'"),
                          ("n_layer = \n", "not a valid preset")]:
        preset = tmp_path / "p.py"
        preset.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(DEFAULTS, [str(preset)])


def test_text_settings_keep_the_text_as_typed():
    cfg = load_config(DEFAULTS, ["--value_mode=1e3"])
    assert cfg["value_mode"] == "1e3"  # not "1000.0"
    assert load_config(DEFAULTS, ["--value_mode=0x10,2"])["value_mode"] == "0x10,2"


@pytest.mark.parametrize("script", ["train.py", "sample.py", "compare.py", "bench.py",
                                    "prepare.py"])
def test_help_lists_every_setting_and_exits_0(script):
    """--help (and -h) print each setting with its default and meaning,
    from the script's SETTINGS."""
    import importlib
    module = importlib.import_module(script[:-3])
    settings = getattr(module, "SETTINGS", None) or TRAIN_SETTINGS
    for flag in ("--help", "-h"):
        result = subprocess.run([sys.executable, script, flag], cwd=HERE, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].startswith("usage: python " + script)
        for key, (default, meaning) in settings.items():
            assert any(line.split()[:1] == [f"--{key}={default}"] and line.endswith(meaning)
                       for line in lines), key


def test_key_space_value_is_a_one_line_error_and_bare_flags_are_booleans_only():
    with pytest.raises(ConfigError, match=r"--n_layer needs a value: write --n_layer=VALUE"):
        load_config(DEFAULTS, ["--n_layer", "4"])
    with pytest.raises(ConfigError, match="n_layer must be int"):
        load_config(DEFAULTS, ["--n_layer=True"])
    assert load_config(DEFAULTS, ["--compile"])["compile"] is True
    assert given_keys(["--n_layer=3", "--compile"]) == {"n_layer", "compile"}
