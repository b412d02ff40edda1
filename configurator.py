"""Settings for every script: defaults < preset files < --key=value, read by argparse.

    python train.py config/quickstart.py --value_mode=svformer --n_kv_head=2

A script lists its settings as name=(default, meaning[, (lowest, highest)]); --help prints them
with the values the command would use. A preset is a file of `key = value` lines read with
ast.literal_eval, never executed (a first line `base = "other.py"` builds on another preset).
Also here: the device, and run_main (a user's mistake is one line, a bug its traceback).
"""
import argparse
import ast
import errno
import os
import sys
import time
from contextlib import nullcontext
from types import SimpleNamespace


class UserError(Exception):
    """A mistake the user can fix (a setting, the data, a full disk): one line, no traceback."""


class ConfigError(UserError):
    pass


def plural(n, noun):
    return f"{n:,} {noun}{'' if n == 1 else 's'}"  # '1 step', '1,200 steps'


def read_preset(path, seen=()):
    """The `key = value` lines of a preset file, after those of its base if it names one."""
    if not os.path.isfile(path):
        raise ConfigError(f"no preset file {path} (presets live in config/, e.g. config/demo.py)")
    if os.path.abspath(path) in seen:
        raise ConfigError(f"{path}: its base leads back to itself")
    try:
        tree, settings = ast.parse(open(path).read(), filename=path), {}
        for i, node in enumerate(tree.body):
            if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
                raise ConfigError(f"{path}:{node.lineno}: presets hold only `key = value` lines")
            key, value = node.targets[0].id, ast.literal_eval(node.value)
            if key == "base" and i == 0:  # built on another preset, in the same folder
                settings.update(read_preset(os.path.join(os.path.dirname(path), value),
                                            (*seen, os.path.abspath(path))))
            else:
                settings[key] = value
    except (SyntaxError, ValueError) as e:
        raise ConfigError(f"{path}: a line is not `key = literal` ({type(e).__name__})") from None
    return settings


def typed(key, value, default):
    """value as its default's type, or a one-line error that says what the setting takes."""
    kind = type(default)
    if kind is bool and str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    try:
        if kind is bool or (kind is int and isinstance(value, float)):
            raise ValueError
        return kind(value)
    except ValueError:
        raise ConfigError(f"--{key}={value}: must be {kind.__name__}, like {default!r}") from None


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line (run_main's), not argparse's usage block and exit 2
        raise ConfigError(message)


def parse_args(settings, argv, usage):
    """The settings of a command line: presets (plain arguments) in order, then --key=value."""
    values = {k: spec[0] for k, spec in settings.items()}
    for path in [a for a in argv if not a.startswith("-")]:
        for key, value in read_preset(path).items():
            if key not in settings:
                raise ConfigError(f"{path}: unknown setting {key} (--help lists them)")
            values[key] = typed(key, value, settings[key][0])
    parser = Parser(usage=usage, allow_abbrev=False)
    for key, (default, meaning, *limits) in settings.items():
        bool_flag = dict(nargs="?", const="true") if isinstance(default, bool) else {}
        parser.add_argument(f"--{key}", default=values[key], help=f"{meaning} (%(default)s)",
                            type=lambda v, k=key: typed(k, v, settings[k][0]),
                            metavar=type(default).__name__.upper(), **bool_flag)
    cfg = parser.parse_args([a for a in argv if a.startswith("-")])
    for key, (default, meaning, *limits) in settings.items():
        (low, high), value = (limits[0] if limits else (None, None)), getattr(cfg, key)
        if (low is not None and value < low) or (high is not None and value > high):
            within = f"at least {low}" if high is None else f"between {low} and {high}"
            raise ConfigError(f"--{key}={value}: must be {within} ({meaning})")
    return cfg


def defaults(settings, **values):
    """A script's settings as a namespace without a command line: its defaults, then values."""
    return SimpleNamespace(**{**{k: spec[0] for k, spec in settings.items()}, **values})


def given(argv):
    """The settings an argv sets, by presets or --key=value (a resume changes only these)."""
    return {k for a in argv if not a.startswith("-") for k in read_preset(a)} | {
        a[2:].partition("=")[0] for a in argv if a.startswith("--")}


def setup_device(device="auto", dtype="auto"):
    """(device, dtype name, autocast): weights stay float32. auto: cuda > mps > cpu; bfloat16 on
    GPUs that have it natively, float16 on older CUDA GPUs (T4, V100: loss scaling), else float32."""
    import torch  # here: prepare.py reads its settings without torch
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else (
            "mps" if torch.backends.mps.is_available() else "cpu")
    kind, _, index = device.partition(":")
    usable = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not usable.get(kind) or (index and (kind != "cuda" or not index.isdigit()
                                           or int(index) >= torch.cuda.device_count())):
        raise ConfigError(f"--device={device}: not here; use auto, cpu, cuda, cuda:N "
                          f"({torch.cuda.device_count()} CUDA GPUs here) or mps")
    # is_bf16_supported() alone also says yes where bf16 is only emulated (slowly: T4, V100)
    bf16 = kind == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    dtype = ("bfloat16" if bf16 else "float16" if kind == "cuda" else "float32"
             ) if dtype == "auto" else dtype
    if dtype not in ("float32", "bfloat16", "float16") or (dtype == "float16" and kind == "cpu") \
            or (dtype == "bfloat16" and kind == "cuda" and not bf16):
        raise ConfigError(f"--dtype={dtype}: not on {kind}; use auto (it picks), float32, or "
                          f"bfloat16 (CPU, A100, H100) or float16 (GPUs without bfloat16)")
    autocast = (nullcontext() if dtype == "float32"
                else torch.autocast(kind, dtype=getattr(torch, dtype)))
    return device, dtype, autocast


def run_main(main):
    """A script's `__main__`: main(argv), its int result the exit status. A user's mistake
    (UserError, a full disk) is one line, exit 1; Ctrl-C exits 130; any other error: a traceback."""
    try:
        status = main(sys.argv[1:])
    except UserError as e:
        # Under torchrun every process meets the same mistake: rank 0 says it, and torchrun stops
        # the others, which wait first, so they speak only when the mistake is theirs alone.
        if os.environ.get("RANK", "0") != "0":
            time.sleep(20)
        sys.exit(f"error: {e}")
    except KeyboardInterrupt as e:  # under torchrun every process is stopped: rank 0 says it
        if e.args and os.environ.get("RANK", "0") == "0":
            print(f"Ctrl-C: stopped; {e.args[0]}", file=sys.stderr, flush=True)
        sys.exit(130)
    except BrokenPipeError:  # a reader that left early (`train.py --help | head`): quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except Exception as e:  # a full disk, also where torch.save wraps the OSError in its own
        full = e
        while full is not None and getattr(full, "errno", None) not in (errno.ENOSPC, errno.EDQUOT):
            full = full.__cause__ or full.__context__
        if full is None:
            raise
        sys.exit(f"error: no space left on device ({full.filename or 'writing'}): free some "
                 f"space and run the command again; files written whole before are kept")
    sys.exit(status if isinstance(status, int) else 0)
