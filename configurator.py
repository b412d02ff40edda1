"""
Settings for every script: defaults (in the script) < preset files < --key=value overrides.

    python train.py config/quickstart.py --value_mode=svformer --n_kv_head=2 --compile=False

A preset is a plain Python-looking file of `key = value` lines (comments allowed). It is read
with ast.literal_eval, never executed, so a preset can only set values, and every key it or an
override names must be one the script knows, with a value of the default's type.
"""
import ast
import os


class ConfigError(ValueError):
    pass


def _literal(text):
    """'3e-4' -> 0.0003, 'True' -> True, 'None' -> None, 'svformer' -> 'svformer'."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word is a string


def _checked(key, value, default, source):
    """value converted to the default's type, or a ConfigError that names the key and both types."""
    if default is None or value is None:
        return value  # settings defaulting to None (e.g. top_k) take any value; None turns them off
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif isinstance(default, int) and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif isinstance(default, str):
        return str(value)
    elif isinstance(value, type(default)):
        return value
    raise ConfigError(f"{source}: {key} must be {type(default).__name__} (like {default!r}), got {value!r}")


def read_preset(path):
    """The `key = value` assignments of a preset file, as a dict."""
    if not os.path.isfile(path):
        raise ConfigError(f"no preset file {path} (presets live in config/, e.g. config/quickstart.py)")
    try:
        tree = ast.parse(open(path).read(), filename=path)
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: not a valid preset line") from None
    settings = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise ConfigError(f"{path}:{node.lineno}: presets hold only `key = value` lines")
        try:
            settings[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
            raise ConfigError(f"{path}:{node.lineno}: the value must be a literal (number, string, True/False/None)") from None
    return settings


def load_config(defaults, argv):
    """defaults updated by preset files (plain arguments) then --key=value overrides, in order."""
    config = dict(defaults)
    for arg in argv:
        if arg.startswith("--"):
            key, sep, text = arg[2:].partition("=")
            if not sep:
                value = True  # a bare --flag means True
            elif isinstance(defaults.get(key), str):
                value = text  # text settings take the text as typed: --start=1e3 stays "1e3", --seeds=1,2 stays "1,2"
            else:
                value = _literal(text)
            source = arg
        else:
            for key, value in read_preset(arg).items():
                if key not in defaults:
                    raise ConfigError(f"{arg}: unknown setting {key!r}")
                config[key] = _checked(key, value, defaults[key], arg)
            continue
        if key not in defaults:
            known = ", ".join(sorted(defaults))
            raise ConfigError(f"unknown setting --{key} (known: {known})")
        config[key] = _checked(key, value, defaults[key], source)
    return config
