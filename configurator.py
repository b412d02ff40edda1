"""
Settings for every script: defaults < preset files < --key=value overrides.

    python train.py config/quickstart.py --value_mode=svformer --n_kv_head=2 --compile=False

A preset is a plain Python-looking file of `key = value` lines (comments allowed). It is read
with ast.literal_eval, never executed, so a preset can only set values, and every key it or an
override names must be one the script knows, with a value of the default's type.

Each script lists its settings as name=(default, meaning); `--help` prints that list. train.py's
settings live here, not in train.py, because compare.py and bench.py take them too and no script
imports another.
"""
import ast
import difflib
import os
import sys

# train.py's settings. The defaults are the CPU quickstart (config/quickstart.py spells them out):
# a small byte-level ResFormer on Shakespeare's plays, about 5 minutes on 2 quiet CPU cores.
TRAIN_SETTINGS = dict(
    # I/O
    out_dir=("out", "directory for ckpt.pt and log.jsonl"),
    eval_interval=(500, "evaluate (and checkpoint) every this many steps"),
    log_interval=(100, "print and log the training loss every this many steps"),
    eval_iters=(20, "batches per loss estimate during training"),
    resume=(False, "continue out_dir/ckpt.pt: its settings, changed only where given"),
    overwrite=(False, "start afresh even if out_dir already holds a checkpoint"),
    new_data=(False, "with --resume: go on although the dataset changed since the checkpoint"),
    seed=(1337, "seed of the initial weights and the order of the training batches"),
    # data
    dataset=("shakespeare_byte", "data/<dataset>/ from prepare.py, or a path to such a directory"),
    batch_size=(12, "sequences per micro-step"),
    block_size=(64, "tokens per sequence (the model's context length)"),
    gradient_accumulation_steps=(0,
        "micro-steps per optimizer step, in all, divided over torchrun's ranks "
        "(0 = one per rank)"),
    # model (see GPTConfig in model.py)
    n_layer=(4, "transformer blocks"),
    n_head=(4, "attention heads"),
    n_kv_head=(0, "key/value heads for grouped-query attention (0 = n_head)"),
    n_embd=(128, "model width"),
    dropout=(0.0, "dropout rate"),
    bias=(False, "biases in Linear and LayerNorm layers"),
    value_mode=("resformer",
        "vanilla | resformer (value residual) | svformer (single shared value)"),
    lambda_1=(0.5, "resformer: weight of layer 1's value V_1 in every later layer's value"),
    lambda_2=(0.5, "resformer: weight of the layer's own value V_n (the paper's sweep: 1)"),
    learnable_lambda=(False,
        "resformer: learn (lambda_1, lambda_2) per layer, starting from the values above"),
    lambda_lr_scale=(1.0, "learned lambdas: their learning rate as a multiple of the weights'"),
    # AdamW and the schedule: linear warmup, cosine decay to min_lr at lr_decay_iters
    learning_rate=(3e-3, "peak learning rate"),
    max_iters=(6000, "optimizer steps in all"),
    weight_decay=(0.1, "AdamW weight decay (2-D weights only)"),
    beta1=(0.9, "AdamW beta1"),
    beta2=(0.95, "AdamW beta2"),
    grad_clip=(1.0, "clip the gradient norm to this (0 = off)"),
    warmup_iters=(100, "linear warmup steps (clipped to the run)"),
    lr_decay_iters=(0, "step where the cosine reaches min_lr (0 = max_iters)"),
    min_lr=(3e-4, "final learning rate"),
    # system
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (bfloat16 on capable GPUs, else float32), float32, bfloat16, float16"),
    compile=(False, "torch.compile the model (GPU; slow to start)"),
)
# what a command does, not what a run is: never restored from a checkpoint, never compared
ACTIONS = ("resume", "overwrite", "new_data")


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
