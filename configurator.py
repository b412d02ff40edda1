"""Settings for every script: defaults < preset files < --key=value overrides.

    python train.py config/quickstart.py --value_mode=svformer --n_kv_head=2

A script lists its settings as name=(default, meaning[, check]); --help prints them. A preset is
a file of `key = value` lines, read with ast.literal_eval, never executed (a first line `base =
"other.py"` builds on another). Each key must be known, of its default's type and pass its check.
Also here: picking the device, and run_main (a user's mistake is one line, a bug a traceback).
"""
import ast
import difflib
import errno
import os
import re
import sys
import textwrap
import time
from contextlib import nullcontext
from types import SimpleNamespace


class UserError(Exception):
    """A mistake the user can fix (a setting, the data, a full disk): one line, no traceback."""


class ConfigError(UserError):
    pass


def plural(n, noun):
    """'1 step', '2 steps', '1,200 steps'."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


# A check is (test, what it asks): at_least(1) refuses --batch_size=0 as "must be at least 1".
def at_least(low):
    return (lambda v: isinstance(v, (int, float)) and v >= low), f"at least {low}"


def above(low):
    return (lambda v: isinstance(v, (int, float)) and v > low), f"above {low}"


def between(low, high):
    return ((lambda v: isinstance(v, (int, float)) and low <= v <= high),
            f"between {low} and {high}")


def one_of(*choices):
    return (lambda v: v in choices), f"one of {', '.join(map(str, choices))}"


POSITIVE, COUNT = at_least(1), at_least(0)


def typed(key, value, spec, source):
    """value as its default's type (an int is a float too), or a one-line error; None if allowed."""
    default = spec[0]
    if value is None and default is not None and "None" not in spec[1]:
        raise ConfigError(f"{source}: {key} cannot be None (like {default!r})")
    if default is None or value is None:
        return value  # None turns such a setting off (top_k: all tokens)
    if isinstance(default, bool) or isinstance(value, bool):
        ok = isinstance(value, bool) and isinstance(default, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float))
        value = float(value) if isinstance(value, int) else value
    elif isinstance(default, str):
        ok, value = True, str(value)  # a preset's 3 or (1, 2) for a text setting: its text
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ConfigError(f"{source}: {key} must be {type(default).__name__} (like {default!r}), "
                          f"got {value!r}")
    return value


def read_preset(path, seen=()):
    """The `key = value` lines of a preset file, after those of its base if it names one."""
    if os.path.abspath(path) in seen:
        raise ConfigError(f"{path}: its base leads back to itself")
    if not os.path.isfile(path):
        raise ConfigError(f"no preset file {path} (presets live in config/, e.g. "
                          f"config/quickstart.py)")
    try:
        tree = ast.parse(open(path).read(), filename=path)
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: not a valid preset line") from None
    settings = {}
    for i, node in enumerate(tree.body):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            raise ConfigError(f"{path}:{node.lineno}: presets hold only `key = value` lines")
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            raise ConfigError(f"{path}:{node.lineno}: the value must be a literal "
                              f"(number, string, True/False/None)") from None
        if node.targets[0].id == "base" and i == 0:  # built on another preset
            settings.update(read_preset(os.path.join(os.path.dirname(path), str(value)),
                                        (*seen, os.path.abspath(path))))
        else:
            settings[node.targets[0].id] = value
    return settings


def unknown(key, known, script, preset=None):
    """The error for an unknown setting, with a hint: what it may stand for, or where to look."""
    # what it may stand for: lr or bs by initials, max by a prefix, n_layers by its spelling
    guesses = [k for k in known if key == "".join(word[:1] for word in k.split("_"))]
    guesses += [k for k in known if key and k.startswith(key)]
    guesses += difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    guesses = list(dict.fromkeys(guesses))  # each once, in that order
    hint = f"{'python ' + script if script.endswith('.py') else 'its'} --help lists them"
    if guesses:
        *others, last = guesses
        hint = f"did you mean {', '.join(others) + ' or ' if others else ''}{last}?"
    elif preset:
        first = next((line for line in open(preset) if line.startswith("#")), "").strip("# \n")
        hint = f"{preset} says: {first!r}" if first else hint
    return ConfigError(f"{preset + ': ' if preset else ''}unknown setting {key} for {script} "
                       f"({hint})")


def defaults(settings, **given):
    """A script's settings as a namespace: the defaults, with the given ones (unchecked)."""
    return SimpleNamespace(**{**{key: spec[0] for key, spec in settings.items()}, **given})


def parse_value(text, default):
    """A --key=value's text: as typed for text (--start=1e3), true/false too, else a literal."""
    if isinstance(default, bool) and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if isinstance(default, str):
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word: the type check names it


def load_config(settings, argv, script="this script", ignored=()):
    """Defaults, then presets and --key=value overrides in order, each checked. ignored: keys a
    preset may set but this script does not use (bench.py reads train.py's presets)."""
    config = vars(defaults(settings))
    for arg in argv:
        if not arg.startswith("--"):
            given = {k: v for k, v in read_preset(arg).items() if k not in ignored}
            source = preset = arg
        else:
            key, sep, text = arg[2:].partition("=")
            if key in ignored:
                raise ConfigError(f"--{key}: a train.py setting {script} does not use")
            if key in settings and not sep and not isinstance(settings[key][0], bool):
                raise ConfigError(f"--{key} needs a value: write --{key}=VALUE "
                                  f"(one argument, with =)")
            given = {key: parse_value(text, settings.get(key, ("",))[0]) if sep else True}
            source, preset = arg, None
        for key, value in given.items():
            if key not in settings:
                raise unknown(key, settings, script, preset)
            config[key] = typed(key, value, settings[key], source)
            check = settings[key][2] if len(settings[key]) > 2 else None
            if check and value is not None and not check[0](config[key]):
                raise ConfigError(f"{'' if preset is None else preset + ': '}--{key}="
                                  f"{config[key]}: must be {check[1]}")
    return SimpleNamespace(**config)


def help_text(settings, usage, values):
    """The usage line, then each setting with the value this command would use, and its meaning."""
    lines = [*textwrap.wrap(usage, 100), "",
             "settings (--key=value; the values this command would use):"]
    for key, (_, meaning, *check) in settings.items():
        flag = f"  --{key}={getattr(values, key)}"
        # only a value too long for one line (a list) breaks, after its commas
        flags = [flag] if len(flag) <= 100 else [f.replace(", ", ",") for f in textwrap.wrap(
            flag.replace(",", ", "), 100, subsequent_indent=" " * 6)]
        *head, flag = flags
        text = meaning + (f" ({check[0][1]})" if check else "")
        indent = 32 if len(flag) < 31 else len(flag) + 2  # a long value: its meaning after it
        body = textwrap.wrap(text, 100 - 32) or [""]
        first = (flag.ljust(indent) + body[0]) if len(flag) + 2 + len(body[0]) <= 100 else flag
        rest = body[1:] if first != flag else body
        lines += head + [first] + [" " * 32 + b for b in rest]
    return "\n".join(lines)


def parse_args(settings, argv, usage, script, ignored=()):
    """load_config for a command line; --help (-h) prints the settings it would use, and exits."""
    rest = [arg for arg in argv if arg not in ("--help", "-h")]
    cfg = load_config(settings, rest, script, ignored)
    if len(rest) < len(argv):
        print(help_text(settings, usage, cfg))
        sys.exit(0)
    return cfg


def given_keys(argv):
    """The settings an argv sets, by preset files or --key=value."""
    keys = set()
    for arg in argv:
        if arg.startswith("--"):
            keys.add(arg[2:].partition("=")[0])
        elif arg != "-h":
            keys.update(read_preset(arg))
    return keys


def typed_once(argv):
    """argv, or an error where it gives a --key twice (the last would win, hiding a typo)."""
    seen = {}  # --key: the argument that gave it
    for arg in argv:
        if arg.startswith("--"):  # (a plain argument is a preset)
            key = arg[2:].partition("=")[0]
            if key in seen:
                raise ConfigError(f"--{key} is given twice ({seen[key]}, then {arg}): keep one")
            seen[key] = arg
    return argv


def parse_list(text, cast=str):
    """'128,512' -> [128, 512]; also '(128, 512)', which is how a preset file's tuple arrives."""
    items = [s.strip().strip("'\"") for s in str(text).strip("()[] ").split(",")]
    try:
        return [cast(s) for s in items if s]
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as a comma-separated list "
                          f"of {cast.__name__}") from None


# ---- the device, and running a script as a program ----

def resolve_device(device="auto"):
    """--device as a device: auto is cuda > mps > cpu, for every script (compare too)."""
    import torch  # here, not at the top: prepare.py reads settings without torch
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() \
        else "cpu"


def setup_device(device="auto", dtype="auto"):
    """(device, dtype name, autocast): weights stay float32. auto: bfloat16 on GPUs that have it
    natively, float16 on older CUDA GPUs (T4, V100: loss scaling), else float32 (CPU, MPS)."""
    import torch
    device = resolve_device(device)
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (index and kind != "cuda"):
        raise ConfigError(f"--device={device}: use auto, cpu, cuda, cuda:N or mps")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device={device}: this torch sees no CUDA GPU; use --device=cpu")
    if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
        raise ConfigError(f"--device={device}: there are {torch.cuda.device_count()} CUDA "
                          f"devices (cuda:0 ...)")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("--device=mps: Apple's MPS backend is not available here; use cpu")
    # is_bf16_supported() alone also says yes where bf16 is only emulated (slowly: T4, V100)
    bf16 = kind == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    if dtype == "auto":
        dtype = "bfloat16" if bf16 else "float16" if kind == "cuda" else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype={dtype}: use auto, float32, bfloat16 or float16")
    if dtype == "bfloat16" and kind == "cuda" and not bf16:
        raise ConfigError("--dtype=bfloat16: this GPU has no native bfloat16; use float16 "
                          "(auto picks it) or float32")
    if dtype == "float16" and kind == "cpu":
        raise ConfigError("--dtype=float16 needs a GPU (CPU autocast supports bfloat16); "
                          "use float32 or bfloat16")
    autocast = (nullcontext() if dtype == "float32"
                else torch.autocast(kind, dtype=getattr(torch, dtype)))
    return device, dtype, autocast


# Dense 16-bit tensor-core peak FLOP/s per GPU, for MFU: a GPU not listed gets none rather than a
# wrong one. Hopper SXM 989.4 TFLOP/s (datasheets: twice that, with sparsity), NVL 835, PCIe 756.
GPU_PEAK_FLOPS = {
    "H100 NVL": 835e12, "H200 NVL": 835e12, "H100 PCIe": 756e12, "H100": 989.4e12, "H200": 989.4e12,
    "GH200": 989.4e12, "A100": 312e12, "A10G": 70e12, "A10": 125e12, "L40S": 362e12, "L4": 121e12,
    "RTX 4090": 165e12, "RTX 3090": 71e12, "RTX A6000": 155e12, "V100": 125e12, "T4": 65e12}


def gpu_peak_flops(device_name, dtype="bfloat16"):
    """16-bit peak FLOP/s of 'NVIDIA H200' (its longest key, a whole word), else None (float32 too)."""
    return None if dtype == "float32" else next(
        (GPU_PEAK_FLOPS[n] for n in sorted(GPU_PEAK_FLOPS, key=len, reverse=True)
         if re.search(rf"(?<!\w){re.escape(n)}(?!\w)", device_name)), None)


def run_main(main):
    """A script's `__main__`: main(argv), its int result the exit status. A user's mistake
    (UserError, a full disk) is one line, exit 1; Ctrl-C exits 130; any other error: a traceback."""
    try:
        status = main(typed_once(sys.argv[1:]))  # the command line as typed
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
        full, seen = e, set()
        while full is not None and not (isinstance(full, OSError) and full.errno in
                                        (errno.ENOSPC, errno.EDQUOT)) and id(full) not in seen:
            seen.add(id(full))
            full = full.__cause__ or full.__context__
        if full is None or id(full) in seen:
            raise
        sys.exit(f"error: no space left on device ({full.filename or 'writing'}): free some "
                 f"space and run the command again; files written whole before are kept")
    sys.exit(status if isinstance(status, int) else 0)
