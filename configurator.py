"""Every script's settings, name=(default, meaning[, (lowest, highest)]): defaults < presets (`key =
value` lines, read by ast.literal_eval, never run) < --key=value, by argparse. And run_main: a
user's mistake is one line, a bug its traceback."""
import argparse
import ast
import errno
import math
import os
import sys


class UserError(Exception):  # a mistake the user can fix (a setting, the data): one line
    pass


class ConfigError(UserError):  # a setting's
    pass


def read_preset(path):
    """The `key = value` lines of a preset file, as a dict."""
    if not os.path.isfile(path):
        raise ConfigError(f"no preset file {path} (presets live in config/)")
    settings = {}
    try:
        for node in ast.parse(open(path).read(), filename=path).body:
            if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
                raise ConfigError(f"{path}:{node.lineno}: presets hold only `key = value` lines")
            settings[node.targets[0].id] = ast.literal_eval(node.value)
    except (SyntaxError, ValueError) as e:
        raise ConfigError(f"{path}: a line is not `key = literal` ({type(e).__name__})") from None
    return settings


def typed(key, value, spec):
    """value as its setting's type and within its limits, or one line saying what it takes."""
    (default, meaning, *limits), kind = spec, type(spec[0])
    low, high, given = *(limits[0] if limits else (None, None)), value
    try:  # (an int takes no 2.5, a bool only true or false; nan would pass every limit)
        value = str(given).lower() == "true" if kind is bool else kind(given)
        if (kind is bool and str(given).lower() not in ("true", "false") or kind is int and
                isinstance(given, float) or kind is float and not math.isfinite(value)):
            raise ValueError
    except ValueError:
        raise ConfigError(f"--{key}={given}: must be {'a finite ' if kind is float else ''}"
                          f"{kind.__name__}, like {default!r}") from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(f"--{key}={value}: must be " + (f"at least {low}" if high is None else
                          f"between {low} and {high}") + f" ({meaning})")
    return value


class Parser(argparse.ArgumentParser):  # a mistake is one line (run_main's), not a usage block
    def error(self, message):
        raise ConfigError(message)


def parse_args(settings, argv, usage, start=None):
    """A command line's settings: start (or the defaults), its presets in order, --key=value."""
    values = {**{k: spec[0] for k, spec in settings.items()}, **(start or {})}
    for path in [a for a in argv if not a.startswith("-")]:
        for key, value in read_preset(path).items():
            if key not in settings:  # the preset's first comment says what it is for
                said = next((line.strip("# \n") for line in open(path) if line[:1] == "#"), "")
                raise ConfigError(f"{path}: unknown setting {key} ({said or '--help lists them'})")
            values[key] = typed(key, value, settings[key])
    parser = Parser(usage=usage, allow_abbrev=False, add_help=False)
    for key, (default, meaning, *_) in settings.items():
        parser.add_argument(f"--{key}", default=values[key], help=f"{meaning} (%(default)s)",
                            metavar=type(default).__name__.upper(),
                            type=lambda v, k=key: typed(k, v, settings[k]),
                            **(dict(nargs="?", const="true") if isinstance(default, bool) else {}))
    cfg = parser.parse_args([a for a in argv if a.startswith("-") and a not in ("-h", "--help")])
    if "-h" in argv or "--help" in argv:  # each setting with the value this command would use
        parser.set_defaults(**vars(cfg))
        parser.print_help()
        sys.exit(0)
    return cfg


def run_main(main):
    """A script's `__main__`: main(argv), its int result the exit status. A user's mistake
    (UserError, a full disk) is one line, exit 1; Ctrl-C 130; a bug: its traceback."""
    try:
        status = main(sys.argv[1:])
    except UserError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt as e:  # under torchrun every process is stopped: rank 0 says it
        if e.args and os.environ.get("RANK", "0") == "0":
            print(f"Ctrl-C: stopped; {e.args[0]}", file=sys.stderr, flush=True)
        sys.exit(130)
    except Exception as e:
        full = e  # a full disk, also where torch.save wraps the OSError in its own
        while full is not None and getattr(full, "errno", 0) not in (errno.ENOSPC, errno.EDQUOT):
            full = full.__cause__ or full.__context__
        if full is None:
            raise
        sys.exit(f"error: no space left on device ({full.filename or 'writing'}): free some "
                 f"space and run the command again; files written whole before are kept")
    sys.exit(status if isinstance(status, int) else 0)
