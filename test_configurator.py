"""Tests for configurator.py: presets and --key=value overrides."""
import pytest

from configurator import ConfigError, load_config

DEFAULTS = dict(n_layer=6, learning_rate=1e-3, compile=True, value_mode="vanilla", top_k=None, betas=(0.9, 0.95))


def test_overrides_and_types(tmp_path):
    preset = tmp_path / "p.py"
    preset.write_text("# a preset\nn_layer = 8\nvalue_mode = 'resformer'  # trailing comment\n")
    cfg = load_config(DEFAULTS, [str(preset), "--learning_rate=3e-4", "--compile=False", "--n_layer=4",
                                 "--top_k=50", "--value_mode=svformer", "--learning_rate=1"])
    assert cfg == dict(n_layer=4, learning_rate=1.0, compile=False, value_mode="svformer", top_k=50, betas=(0.9, 0.95))
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
    for text, message in [("import os\n", "only `key = value`"), ("n_layer = os.cpu_count()\n", "must be a literal"),
                          ("bogus = 1\n", "unknown setting 'bogus'"), ("n_layer = \n", "not a valid preset")]:
        preset = tmp_path / "p.py"
        preset.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(DEFAULTS, [str(preset)])


def test_text_settings_keep_the_text_as_typed():
    cfg = load_config(DEFAULTS, ["--value_mode=1e3"])
    assert cfg["value_mode"] == "1e3"  # not "1000.0"
    assert load_config(DEFAULTS, ["--value_mode=0x10,2"])["value_mode"] == "0x10,2"
