"""
Settings for every script: defaults < preset files < --key=value overrides.

    python train.py config/quickstart.py --value_mode=svformer --n_kv_head=2 --compile=False

A preset is a plain Python-looking file of `key = value` lines (comments allowed). It is read
with ast.literal_eval, never executed, so a preset can only set values, and every key it or an
override names must be one the script knows, with a value of the default's type.

Each script lists its settings as name=(default, meaning) at its top; `--help` prints that list.
Also here, because every script needs them: the device a run computes on (setup_device; the GPU
peak table behind MFU) and the way a script runs as a program (run_main: a user's mistake is one
line, never a traceback; CtrlC: a training loop's first Ctrl-C stops it at a step boundary).
"""
import ast
import difflib
import errno
import os
import signal
import sys
import time
from contextlib import nullcontext

class ConfigError(ValueError):
    pass


def plural(n, noun):
    """'1 step', '2 steps', '1,200 steps'."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


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
    elif (isinstance(default, float) and isinstance(value, (int, float))
            and not isinstance(value, bool)):
        return float(value)
    elif isinstance(default, int) and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif isinstance(default, str):
        return str(value)
    elif isinstance(value, type(default)) and not isinstance(value, bool):
        return value
    raise ConfigError(f"{source}: {key} must be {type(default).__name__} "
                      f"(like {default!r}), got {value!r}")


def read_preset(path):
    """The `key = value` assignments of a preset file, as a dict."""
    if not os.path.isfile(path):
        raise ConfigError(f"no preset file {path} "
                          "(presets live in config/, e.g. config/quickstart.py)")
    try:
        tree = ast.parse(open(path).read(), filename=path)
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: not a valid preset line") from None
    settings = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            raise ConfigError(f"{path}:{node.lineno}: presets hold only `key = value` lines")
        try:
            settings[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
            raise ConfigError(f"{path}:{node.lineno}: the value must be a literal "
                              "(number, string, True/False/None)") from None
    return settings


def defaults_of(settings):
    """{name: default} from {name: (default, meaning)}."""
    return {key: default for key, (default, _) in settings.items()}


def help_text(settings, usage, values=None):
    """The usage line, then every setting with its value (the default, or values[key]: what the
    command as typed would use) and meaning."""
    values = values or defaults_of(settings)
    rows = [(f"--{key}={values[key]}", meaning) for key, (_, meaning) in settings.items()]
    width = max(len(r[0]) for r in rows) + 2
    return "\n".join([usage, "", "settings (--key=value; the values this command would use):"] +
                      [f"  {flag:<{width}}{meaning}" for flag, meaning in rows])


def parse_args(settings, argv, usage, ignored=()):
    """load_config for a script: --help/-h prints every setting, as the presets and overrides
    given with it set them, and exits 0. ignored: see load_config."""
    rest = [arg for arg in argv if arg not in ("--help", "-h")]
    cfg = load_config(defaults_of(settings), rest, ignored)
    if len(rest) < len(argv):
        print(help_text(settings, usage, cfg))
        sys.exit(0)
    return cfg


def given_keys(argv):
    """The settings an argv sets, by preset files or --key=value (as load_config reads them)."""
    keys = set()
    for arg in argv:
        if arg.startswith("--"):
            keys.add(arg[2:].partition("=")[0])
        elif arg not in ("-h",):
            keys.update(read_preset(arg))
    return keys


def parse_list(text, cast=str):
    """'128,512' -> [128, 512]; also '(128, 512)', which is how a preset file's tuple arrives."""
    items = [s.strip().strip("'\"") for s in str(text).strip("()[] ").split(",")]
    try:
        return [cast(s) for s in items if s]
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as a comma-separated list "
                          f"of {cast.__name__}") from None


def unknown(key, defaults, where):
    """The error for a setting the script does not know, with the closest known one."""
    close = difflib.get_close_matches(key, list(defaults), n=1, cutoff=0.8)
    hint = (f"did you mean {where}{close[0]}?" if close
            else f"known: {', '.join(sorted(defaults))}")
    return ConfigError(f"unknown setting {where}{key} ({hint})")


def load_config(defaults, argv, ignored=()):
    """defaults updated by preset files (plain arguments) then --key=value overrides, in order.
    ignored: keys a preset may set that this script does not use (bench.py reads train.py's
    presets); on the command line they are an error."""
    config = dict(defaults)
    for arg in argv:
        if arg.startswith("--"):
            key, sep, text = arg[2:].partition("=")
            if not sep and key in defaults and not isinstance(defaults[key], bool):
                raise ConfigError(f"--{key} needs a value: write --{key}=VALUE "
                                  "(one argument, with =)")
            if not sep:
                value = True  # a bare --flag means True (booleans only)
            elif isinstance(defaults.get(key), bool) and text.lower() in ("true", "false"):
                value = text.lower() == "true"  # --compile=false, as people type it
            elif isinstance(defaults.get(key), str):
                # text settings take the text as typed:
                # --start=1e3 stays "1e3", --seeds=1,2 stays "1,2"
                value = text
            else:
                value = _literal(text)
            source = arg
        else:
            for key, value in read_preset(arg).items():
                if key in ignored:
                    continue
                if key not in defaults:
                    raise ConfigError(f"{arg}: {unknown(key, defaults, '')}")
                config[key] = _checked(key, value, defaults[key], arg)
            continue
        if key in ignored:
            raise ConfigError(f"--{key}: a train.py setting this script does not use")
        if key not in defaults:
            raise unknown(key, defaults, "--")
        config[key] = _checked(key, value, defaults[key], source)
    return config


# -----------------------------------------------------------------------------
# the device, and running a script as a program

def device_type(device):
    """'cuda:1' -> 'cuda' (what autocast, GradScaler and the RNG states take)."""
    return device.split(":")[0]


def setup_device(device="auto", dtype="auto"):
    """(device, dtype name, autocast context) from the --device/--dtype settings, or a one-line
    error naming the setting. auto: cuda > mps > cpu; bfloat16 on GPUs that have it, else float32.
    Weights stay float32; bf16/fp16 is compute under autocast."""
    import torch  # here, not at the top: prepare.py reads settings without torch
    if device == "auto":
        device = ("cuda" if torch.cuda.is_available()
                  else "mps" if torch.backends.mps.is_available() else "cpu")
    kind = device_type(device)
    if kind not in ("cpu", "cuda", "mps") or (kind != "cuda" and ":" in device):
        raise ValueError(f"--device={device}: use auto, cpu, cuda, cuda:N or mps")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device={device}: this torch sees no CUDA GPU; "
                             f"use --device=cpu (or auto)")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise ValueError(f"--device={device}: there are {torch.cuda.device_count()} "
                             f"CUDA devices (cuda:0 ...)")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device=mps: Apple's MPS backend is not available here; "
                         "use --device=cpu (or auto)")
    if dtype == "auto":
        dtype = "bfloat16" if kind == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype={dtype}: use auto, float32, bfloat16 or float16")
    if dtype == "bfloat16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype=bfloat16: {torch.cuda.get_device_name(device)} has no bfloat16; "
                         f"use --dtype=float16 or float32")
    if dtype == "float16" and kind == "cpu":
        raise ValueError("--dtype=float16 needs a GPU (CPU autocast supports bfloat16); "
                         "use float32 or bfloat16")
    autocast = (nullcontext() if dtype == "float32"
                else torch.autocast(kind, dtype=getattr(torch, dtype)))
    return device, dtype, autocast


# Dense bf16 peak FLOP/s per GPU, for MFU (an unknown GPU gets none rather than a wrong one).
# Hopper SXM 989.4 TFLOP/s (datasheets give twice that, with sparsity), NVL 835 per GPU, PCIe 756.
GPU_PEAK_BF16_FLOPS = {
    "H100 NVL": 835e12, "H200 NVL": 835e12, "H100 PCIe": 756e12,
    "H100": 989.4e12, "H200": 989.4e12, "GH200": 989.4e12,
    "A100": 312e12, "A10G": 70e12, "A10": 125e12, "L40S": 362e12, "L4": 121e12,
    "RTX 4090": 165e12, "RTX 3090": 71e12, "RTX A6000": 155e12, "V100": 125e12, "T4": 65e12}


def gpu_peak_flops(device_name):
    """Peak bf16 FLOP/s for a name like 'NVIDIA H200' (longest key first), or None if unknown."""
    return next((GPU_PEAK_BF16_FLOPS[n] for n in sorted(GPU_PEAK_BF16_FLOPS, key=len, reverse=True)
                 if n in device_name), None)


class CtrlC:
    """First Ctrl-C: the loop stops at the next step boundary (all ranks at one) and saves; a second
    stops at once. Under torchrun a rank gets each Ctrl-C twice: within a second, it is one.
    restore() gives SIGINT back to the handler it had before."""

    def __init__(self, log):
        self.log, self.requested, self.at = log, False, 0.0
        self.previous = signal.signal(signal.SIGINT, self.on_sigint)

    def on_sigint(self, signum, frame):
        if self.requested and time.time() - self.at >= 1.0:
            raise KeyboardInterrupt
        if not self.requested:
            self.requested, self.at = True, time.time()
            self.log(line="\nCtrl-C: stopping after this step (Ctrl-C again to stop at once)")

    def agreed(self, device, ddp):
        """Whether to stop; under DDP the ranks compare flags (a sync, so every log_interval)."""
        if not ddp:
            return self.requested
        import torch
        flag = torch.tensor(float(self.requested), device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return flag.item() > 0

    def restore(self):
        signal.signal(signal.SIGINT, self.previous)


def run_main(main):
    """A script's `__main__`: main(argv), its int result the exit status (anything else: 0). A
    user's mistake (a ValueError, a missing file, a full disk) is one line on stderr, exit 1;
    Ctrl-C exits 130; a reader that leaves early (`train.py --help | head`) ends it quietly."""
    try:
        status = main(sys.argv[1:])
    except ValueError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        sys.exit(1)
    except OSError as e:  # a full disk's message says what was kept
        sys.exit(f"error: {e.strerror if e.errno in (errno.ENOSPC, errno.EDQUOT) else e}")
    sys.exit(status if isinstance(status, int) else 0)
