"""
Every script's settings, each name=(default, meaning[, lowest[, highest]]): the
defaults, then the presets named (config/*.py, whose `key = value` lines are read,
never run), then --key=value. And run_main: a user's mistake is one line, a bug its traceback.
"""
import ast
import errno
import math
import os
import sys
from types import SimpleNamespace


class UserError(Exception):
    """A mistake the user can fix (a setting, the data): said in one line."""


class ConfigError(UserError):
    """A mistake in the settings."""


def read_preset(path):
    """The `key = value` lines of a preset file, as a dict."""
    if not os.path.isfile(path):
        raise ConfigError(f"no preset file {path} (the presets are in config/)")
    try:  # an Import or an `a[0] = 1` has no .targets or no .id
        tree = ast.parse(open(path).read())
        settings = {target.id: ast.literal_eval(node.value) for node in tree.body
                    for target in node.targets}
    except (AttributeError, SyntaxError, ValueError):
        raise ConfigError(f"{path}: a preset holds only `key = value` lines") from None
    return settings


def typed(key, value, spec):
    """value as its setting's type and within its limits, or one line on what it takes."""
    default, meaning, *limits = spec
    kind, given = type(default), value
    try:  # an int takes no 2.5, a bool only true or false, a float no nan or inf
        if kind is bool:
            value = {"true": True, "false": False}[str(value).lower()]
        elif kind is int and isinstance(value, float):
            raise ValueError
        value = kind(value)
        if kind is float and not math.isfinite(value):
            raise ValueError
    except (KeyError, ValueError):
        finite = "a finite " if kind is float else ""
        raise ConfigError(f"--{key}={given}: must be {finite}{kind.__name__}, like "
                          f"{default!r}")
    low, high = (limits + [math.inf])[:2] if limits else (value, value)
    if not low <= value <= high:
        raise ConfigError(f"--{key}={value}: must be from {low} to {high} "
                          f"({meaning})")
    return value


def parse_args(settings, argv, usage, start=None):
    """A command line's settings: the defaults (or start), its presets, then --key=value."""
    values = {key: spec[0] for key, spec in settings.items()} | (start or {})
    presets = [arg for arg in argv if not arg.startswith("-")]
    for path in presets:
        for key, value in read_preset(path).items():
            if key not in settings:  # another script's preset, say
                raise ConfigError(f"{path}: {key} is no setting here (--help lists "
                                  f"them)")
            values[key] = typed(key, value, settings[key])
    for arg in [a for a in argv if a.startswith("-") and a not in ("-h", "--help")]:
        key, has_value, value = arg.lstrip("-").partition("=")
        if key not in settings:
            raise ConfigError(f"{arg}: no such setting here (--help lists them)")
        values[key] = typed(key, value if has_value else "true", settings[key])
    if "-h" in argv or "--help" in argv:  # each setting, with the value it would take
        print(f"usage: {usage}")
        for key, (default, meaning, *_) in settings.items():
            print(f"  --{key}={values[key]}  {meaning}")
        sys.exit(0)
    return SimpleNamespace(**values)


def run_main(main):
    """A script's __main__: main(argv), its result the exit status. A user's mistake (a
    UserError, a full disk) is one line and exit 1, Ctrl-C 130, a bug its traceback."""
    try:
        status = main(sys.argv[1:])
    except UserError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # the script has said what it kept
        sys.exit(130)
    except Exception as e:  # a full disk, which torch.save wraps in an error of its own
        while e and getattr(e, "errno", None) not in (errno.ENOSPC, errno.EDQUOT):
            e = e.__cause__ or e.__context__
        if not e:
            raise
        sys.exit(f"error: no space left on device ({e.filename or 'writing'}): free some "
                 f"space and run the command again")
    sys.exit(status)  # None: 0
