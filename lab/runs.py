"""compare.py's runs: each `python train.py` (the noise floor's through lab.nudged), then
`python -m lab.evaluate`, in its own folder, `jobs` side by side on a fixed number of CPU threads,
reused or resumed only with the same settings and today's code (code_version)."""
import ast
import glob
import hashlib
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import torch

import data
from configurator import ConfigError
from model import GPT
from train import ACTIONS, SETTINGS as TRAIN_SETTINGS

from .analysis import analyse, plural, sizes
from .tables import label

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(ROOT, "train.py")
SUMMARY_FORMAT = "value-residual-gpt/2"  # summary.json's; the committed records carry it
# what a run may set beyond train.py's settings: lab.nudged's coin seed (the noise floor)
LAB_SETTINGS = dict(nudge=(0, "nonzero: train through lab.nudged, each initial weight one "
                              "float32 step up or down (the noise floor)", 0))
# The code of a run: the modules it executes (train.py or, for the noise floor, lab.nudged; then
# lab.evaluate) and the project's modules they import. What only reads logs (this module) is not.
RUN_MODULES = ("train", "lab.nudged", "lab.evaluate")
# How a slot starts a process (args, stdout=file, stderr=..., env=...): tests run them in-process.
launch = subprocess.Popen


def code_version(root=ROOT):
    """A fingerprint of the code that trains and scores a run: its files' syntax trees, docstrings
    aside, so a comment or reformatting changes nothing; no run of other code passes as today's."""
    digest = hashlib.sha256()
    for path in run_files(root):
        tree = ast.parse(open(path, encoding="utf-8").read())
        digest.update(f"{os.path.relpath(path, root)}\n{canonical(tree)}\n".encode())
    return digest.hexdigest()[:16]


def run_files(root=ROOT):
    """The project's files a run executes: RUN_MODULES and each project module they import
    (and the packages' __init__.py), followed through every import statement, in any function."""
    found, todo = set(), list(RUN_MODULES)
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):  # a.b.c: a/__init__.py, a/b/__init__.py, a/b/c.py
            for path in (os.path.join(root, *parts[:i]) + ".py",
                         os.path.join(root, *parts[:i], "__init__.py")):
                if os.path.isfile(path) and path not in found:
                    found.add(path)
                    todo += imported(path, parts[:i] if path.endswith("__init__.py")
                                     else parts[:i - 1])
    return sorted(found)


def imported(path, package):
    """The modules a file imports (`from .x import y`: x in its package, and y, maybe a module)."""
    names = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] if node.level else [])
            module = ".".join(filter(None, [base, node.module]))
            names += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return names


def canonical(node):
    """A syntax tree as text, the same on every Python that parses it: each node's type and fields,
    but docstrings and empty fields (one a newer Python adds, empty by default, changes nothing)."""
    if isinstance(node, list):
        return "[" + ", ".join(canonical(item) for item in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = dict(ast.iter_fields(node))
    body = fields.get("body")
    if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        fields["body"] = body[1:]  # the docstring
    return type(node).__name__ + "(" + ", ".join(
        f"{k}={canonical(v)}" for k, v in fields.items() if v is not None and v != []) + ")"


def heldout_windows(cfg, n):
    """The same n windows of block_size tokens, evenly spaced over the val shard, for every mode."""
    tokens = data.read_shard(data.list_shards(data.dataset_dir(cfg["dataset"]), "val")[0])
    T = cfg["block_size"]
    starts = np.linspace(0, len(tokens) - T, num=n).astype(np.int64)
    return torch.stack([data.window(tokens, s, T - 1) for s in starts])


def read_log(run_dir):
    """A run's log entries (train.py writes log.jsonl whole at each checkpoint); none before."""
    path = os.path.join(run_dir, "log.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:  # (a line without its newline: a log being written by other code)
        return [json.loads(line) for line in f if line.strip() and line.endswith("\n")]


def last_step(run_dir):
    """(the last step train.py has printed, the val loss it last printed or None), read from the
    end of train.out as the run trains: log.jsonl is written only at checkpoints, so it lags."""
    path, step, loss = os.path.join(run_dir, "train.out"), 0, None
    text = open(path, errors="replace").read()[-8192:] if os.path.isfile(path) else ""
    for found in re.finditer(r"^(?:step|iter) (\d+)\b(?:.*val loss ([\d.]+))?", text, re.M):
        step, loss = int(found[1]), (float(found[2]) if found[2] else loss)
    return step, loss


def progress(running, t_start, since):
    """What each run is doing, a line each; since: when each run's evaluation started, by key."""
    said = [f"   {(time.time() - t_start) / 60:.1f} min so far:"]
    for key, cfg, _, _, rest in running:  # no loss: runs sharing cores are at different steps
        step, who = last_step(cfg["out_dir"])[0], f"{label(key[0])}, seed {key[1]}"
        said.append(f"      {who}: " + (f"step {step} of {cfg['max_iters']}" if rest else
                    f"its loss on every validation token, "
                    f"{time.time() - since.get(key, t_start):.0f} s so far"))
    return "\n".join(said)


def settings_only(cfg):
    """What makes two runs the same: their settings, not their folder (nor, without learned
    lambdas, lambda_lr_scale); a setting added since a run was recorded counts at its default."""
    cfg = {**{k: spec[0] for k, spec in TRAIN_SETTINGS.items() if k not in ACTIONS},
           "nudge": 0, **cfg}
    return {k: v for k, v in cfg.items() if k != "out_dir" and (
        cfg.get("learnable_lambda") or k != "lambda_lr_scale")}


def same_run(cfg, run_dir, theirs):
    """Whether a folder's run has cfg's settings; others are refused by name, never replaced."""
    mine, theirs = settings_only(cfg), settings_only(theirs)
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        shown = ", ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} now" for k in differ[:4])
        raise ConfigError(f"{run_dir} holds a run with other settings ({shown}"
                          f"{', ...' if len(differ) > 4 else ''}): delete it, or compare "
                          f"into another --out_dir")
    return True


def finished(cfg, run_dir, threads=None):
    """The run's summary if it finished with these settings (and threads, if given), or None."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(path):
        return None
    try:
        summary = json.load(open(path))
    except ValueError as e:  # cut short (a full disk, a bad merge): say which, lose nothing
        raise data.DataError(f"{path} is not whole JSON ({e}): restore it (git checkout -- "
                             f"{path}), or delete {run_dir} to train that run again") from None
    if summary.get("format") != SUMMARY_FORMAT:
        raise data.DataError(f"{run_dir} was written by an older version of compare.py: "
                             f"delete it, or compare into another --out_dir")
    if threads and summary.get("status") == "done" and summary["threads"] != threads:
        raise data.DataError(f"{run_dir} trained on {plural(summary['threads'], 'thread')}, "
                             f"which rounds differently: compare with --threads="
                             f"{summary['threads']}, or into another --out_dir")
    return summary if same_run(cfg, run_dir, summary.get("config") or {}) else None


def command(cfg, run_dir):
    """([train.py's command, lab.evaluate's], resuming); a run of other settings is refused."""
    program = ["-m", "lab.nudged", f"--nudge={cfg['nudge']}"] if cfg.get("nudge") else [TRAIN_PY]
    train = [sys.executable, *program, f"--out_dir={cfg['out_dir']}"] + [
        f"--{k}={v}" for k, v in settings_only(cfg).items() if k in TRAIN_SETTINGS]
    evaluate = [sys.executable, "-m", "lab.evaluate", f"--out_dir={cfg['out_dir']}"]
    ckpt_path = os.path.join(run_dir, "ckpt.pt")
    resuming = os.path.isfile(ckpt_path) and same_run(
        {k: v for k, v in cfg.items() if k != "nudge"}, run_dir,
        torch.load(ckpt_path, mmap=True, weights_only=True)["config"])
    return [train + ["--resume"] if resuming else train, evaluate], resuming


def by_other_code(run_dir, today, force=False):
    """Why the run in run_dir is not today's code's (summary.json's or code.json's code version is
    another), or None; force: reused all the same. A folder with neither a summary nor a checkpoint
    holds nothing to reuse (a run that failed at once): None, it trains again in place."""
    summary, code = (os.path.join(run_dir, name) for name in ("summary.json", "code.json"))
    if os.path.isfile(summary):
        theirs = json.load(open(summary)).get("code")
    elif os.path.isfile(os.path.join(run_dir, "ckpt.pt")):  # a checkpoint alone
        theirs = json.load(open(code)).get("code") if os.path.isfile(code) else None
    else:
        return None
    return None if force or theirs == today else (
        f"code version {theirs} there, {today} today" if theirs else
        "it records no code version (trained before runs recorded their code)")


def keep_todays(run_dir, today, force=False):
    """Leaves in run_dir the run of today's code, if there is one: a run of other code there is
    kept as run_dir.other-code-N (the first N free), and one of today's code kept so before (the
    edit since undone) comes back. Said on stderr, as --plan's stdout is its commands."""
    why = os.path.isdir(run_dir) and by_other_code(run_dir, today, force)
    if why:
        n = 1
        while os.path.exists(aside := f"{run_dir.rstrip(os.sep)}.other-code-{n}"):
            n += 1
        os.replace(run_dir, aside)
        print(f"not reused: {run_dir} was trained by other code ({why}); moved to {aside}",
              file=sys.stderr, flush=True)
    asides = glob.glob(glob.escape(run_dir.rstrip(os.sep)) + ".other-code-*")
    for aside in [] if os.path.exists(run_dir) else sorted(asides):
        if by_other_code(aside, today) is None and any(
                os.path.isfile(os.path.join(aside, name)) for name in ("summary.json", "ckpt.pt")):
            os.replace(aside, run_dir)
            print(f"brought back: {aside}, trained by today's code, is {run_dir} again",
                  file=sys.stderr, flush=True)
            break


def plan_line(cfg, threads, today):
    """An unfinished run as a shell command from the project's folder (--plan); None if done."""
    keep_todays(cfg["out_dir"], today)
    if finished(cfg, cfg["out_dir"], threads) or trained_elsewhere(cfg, cfg["out_dir"]):
        return None
    os.makedirs(cfg["out_dir"], exist_ok=True)
    write_json(os.path.join(cfg["out_dir"], "code.json"), {"code": today})
    shown = []
    for args in command(cfg, cfg["out_dir"])[0]:  # from the project's folder: python train.py
        args = ["python", os.path.relpath(args[1], ROOT) if args[1] == TRAIN_PY else args[1],
                *args[2:]]
        shown.append(shlex.join([f"OMP_NUM_THREADS={threads}", *args]))
    return " && ".join(shown)


def trained_elsewhere(cfg, run_dir):
    """Whether a --plan command finished this run: its log final at max_iters, and its checkpoint
    one of these settings (command's check, as for a resume)."""
    final = [r for r in read_log(run_dir) if r["kind"] == "final"]
    return bool(final) and final[-1]["iter"] == cfg["max_iters"] and command(cfg, run_dir)[1]


def hardware(device, gpus=1):
    """Where a run trained: 'NVIDIA H200, torch ...' ('8 x ...' with gpus), Apple MPS or the CPU."""
    device = data.setup_device(device, "float32")[0]
    if device.startswith("cuda"):
        return (f"{f'{gpus} x ' if gpus > 1 else ''}{torch.cuda.get_device_name(device)}, "
                f"torch {torch.__version__}")
    if device == "mps":
        return f"Apple MPS ({platform.machine()}), torch {torch.__version__}"
    name = platform.processor() or platform.machine()
    if os.path.isfile("/proc/cpuinfo"):
        found = re.search(r"model name\s*:\s*(.+)", open("/proc/cpuinfo").read())
        name = found.group(1).strip() if found else name
    return f"{name}, {os.cpu_count()} cores, torch {torch.__version__}"


def summarise(cfg, run_dir, samples, threads, machine=None):
    """summary.json of a finished run: its log's numbers, its model's analysis, its code version."""
    log = read_log(run_dir)
    train_records = [r for r in log if r["kind"] == "train"]
    # the first window includes start-up: left out, unless it is the only one (a short run)
    timed = train_records[1:] or train_records
    speeds = sorted(r["tokens_per_sec"] for r in timed) or [float("nan")]
    ckpt = data.load_checkpoint(os.path.join(run_dir, "ckpt.pt"))
    model = GPT.from_checkpoint(ckpt)
    summary = {"config": cfg, "status": "done",
               "val_loss_full": [r for r in log if r["kind"] == "final"][-1]["val_loss_full"],
               "evals": [r for r in log if r["kind"] == "eval"],
               **sizes(model, cfg["block_size"]), "tokens_per_step": ckpt["tokens_per_step"],
               "tokens_per_sec": speeds[len(speeds) // 2], "threads": threads,
               # another CPU rounds otherwise: a run's numbers hold on the machine that printed them
               "machine": machine or hardware(cfg["device"]), "code": recorded_code(run_dir),
               **analyse(model, heldout_windows(cfg, samples))}
    return write_json(os.path.join(run_dir, "summary.json"), summary)


def recorded_code(run_dir):
    """The code version a run was started with (code.json, written as it was launched)."""
    path = os.path.join(run_dir, "code.json")
    return json.load(open(path))["code"] if os.path.isfile(path) else None


def write_json(path, record):
    """A record, whole or not at all, tagged with the version that wrote it."""
    with data.atomic_write(path, "w") as f:
        json.dump({"format": SUMMARY_FORMAT, **record}, f, indent=1)
    return {"format": SUMMARY_FORMAT, **record}


def final_loss(summary):
    return summary["val_loss_full"] if summary["status"] == "done" else float("inf")


def why_failed(out_path, start=0):
    """The rest of a failed run's FAILED line, from this attempt's output (train.out from byte
    start): a user's mistake is train.py's 'error: ...' line; a bug, its traceback's innermost frame
    in this project's files with its code and the error; else the output's last lines."""
    try:
        with open(out_path, "rb") as f:
            f.seek(start)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        lines = []
    if "Traceback (most recent call last):" in lines:
        first = len(lines) - lines[::-1].index("Traceback (most recent call last):")  # the last
        frames, error = [], "(no error line)"
        for i in range(first, len(lines)):
            frame = re.match(r'  File "(.+)", line \d+, in ', lines[i])
            if frame:  # ours: in the project, not in a virtual environment inside it
                project = os.path.dirname(TRAIN_PY) + os.sep  # (a copy of the project: its own)
                ours = (os.path.abspath(frame.group(1)).startswith(project) and not
                        {"site-packages", "dist-packages"} & set(frame.group(1).split(os.sep)))
                frames.append((i, ours))
            elif lines[i][:1].strip():  # the first line not indented: the error itself
                error = lines[i]
                break
        at = [i for i, ours in frames if ours] or [i for i, _ in frames]
        # that frame's line, and the code there where Python could show it (indented deeper)
        shown = [line for n, line in enumerate(lines[at[-1]:at[-1] + 2] if at else [])
                 if n == 0 or line.startswith("    ")]
        return (":\n      " + "\n      ".join(shown + [error])
                + f"\n      the whole traceback: {out_path}")
    mistakes = [line for line in lines if line.startswith("error: ")]
    if mistakes:
        return ": " + mistakes[-1]
    tail = [line for line in lines if line.strip()][-3:]
    return (":\n      " + "\n      ".join(tail + [f"its whole output: {out_path}"]) if tail
            else ", with no output")


def reusable(grid, threads, samples, today, force=False):
    """(summaries of today's code's finished runs, runs to train); other code is set aside."""
    summaries, todo = {}, []
    for key, cfg in grid:
        run_dir = cfg["out_dir"]
        keep_todays(run_dir, today, force)
        done = finished(cfg, run_dir, threads)
        if not done and trained_elsewhere(cfg, run_dir):  # by a --plan command
            done = summarise(cfg, run_dir, samples, threads,
                             "an unrecorded machine, by a --plan command")
        if done:
            summaries[key] = {**done, "reused": True}
        else:
            command(cfg, run_dir)  # a folder holding other settings: refused before any run
            todo.append((key, cfg))
    return summaries, todo


def run_grid(grid, jobs, threads, samples, today, on_progress=None, gpus=0, force=False):
    """Train every (key, cfg) not finished, `jobs` at a time, each on `threads` CPU threads (a fixed
    count: the numbers do not depend on jobs) and with gpus on the GPU running the fewest. Returns
    (summaries by key, interrupted, failed); force: reuse other code's runs; on_progress(): 30 s."""
    summaries, todo = reusable(grid, threads, samples, today, force)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    running, t_start, interrupted, failed, gpu_of = [], time.time(), False, [], {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # the GPUs to spread runs over, by name
    ids = [g.strip() for g in visible.split(",")][:gpus] if visible else list(map(str, range(gpus)))
    n_total = len(todo)
    # Each run's train.out size at its start, so a failure shows this attempt's output alone.
    said, out_sizes, since = time.time(), {}, {}
    drawn = time.time()  # the live picture's own clock: runs that start do not postpone it

    def start(key, cfg, args, log):
        slot_env = {**env, **({"CUDA_VISIBLE_DEVICES": gpu_of[key]} if gpus else {})}
        return launch(args, stdout=log, stderr=subprocess.STDOUT, env=slot_env, cwd=ROOT)

    while running or (todo and not interrupted):
        while todo and len(running) < jobs and not interrupted:
            key, cfg = todo.pop(0)
            os.makedirs(cfg["out_dir"], exist_ok=True)
            write_json(os.path.join(cfg["out_dir"], "code.json"), {"code": today})
            commands, resuming = command(cfg, cfg["out_dir"])
            log = open(os.path.join(cfg["out_dir"], "train.out"), "a")
            out_sizes[key] = os.path.getsize(log.name)
            print(f"[{n_total - len(todo)}/{n_total}] {cfg['out_dir']}: " +
                  ("resuming from its checkpoint" if resuming else "training") +
                  f" ({(time.time() - t_start) / 60:.1f} min so far)", flush=True)
            said = time.time() - 20  # the first word on it 10 s later, then every 30 s
            if gpus:  # the GPU running the fewest runs
                gpu_of[key] = min(ids, key=lambda g: sum(gpu_of.get(k) == g for k, *_ in running))
            running.append([key, cfg, start(key, cfg, commands[0], log), log, commands[1:]])
        try:
            if running and time.time() - said > 30:  # a word at least every 30 s while runs go
                print(progress(running, t_start, since), flush=True)
                said = time.time()
            if on_progress and running and time.time() - drawn > 30:
                on_progress()
                drawn = time.time()
            time.sleep(0.5)
        except KeyboardInterrupt:  # the runs got the Ctrl-C too: each stops, its checkpoint
            interrupted = True      # whole; the caller says so once, when all have stopped,
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # and another Ctrl-C changes nothing
        for item in list(running):
            key, cfg, process, log, rest = item
            if process.poll() is None:
                continue
            if process.returncode == 0 and rest and not interrupted:  # its evaluation next
                item[2:], since[key] = [start(key, cfg, rest[0], log), log, rest[1:]], time.time()
                print(f"    trained {cfg['out_dir']}; now its loss on every validation token",
                      flush=True)
                continue
            running.remove(item)
            log.close()
            if process.returncode == 0 and not rest:
                summaries[key] = summarise(cfg, cfg["out_dir"], samples, threads)
                print(f"    done {cfg['out_dir']}: val loss {summaries[key]['val_loss_full']:.4f}" +
                      f" ({(time.time() - t_start) / 60:.1f} min so far)", flush=True)
            elif process.returncode in (0, 130) or interrupted:  # a run the Ctrl-C stopped
                interrupted = True
            elif any(r["kind"] == "diverged" for r in read_log(cfg["out_dir"])):
                # A result (worse than any finite loss), reused like a finished run.
                summaries[key] = write_json(os.path.join(cfg["out_dir"], "summary.json"), {
                    "config": cfg, "status": "diverged", "val_loss_full": None,
                    "code": recorded_code(cfg["out_dir"]), "machine": hardware(cfg["device"])})
                print(f"    diverged {cfg['out_dir']} (counts as worse than any finite loss)" +
                      f" ({(time.time() - t_start) / 60:.1f} min so far)", flush=True)
            else:
                failed.append(cfg["out_dir"])
                print(f"    FAILED {cfg['out_dir']} (" + (
                    f"exit {process.returncode}" if process.returncode > 0
                    else f"killed by signal {-process.returncode}") + ")" + why_failed(
                        os.path.join(cfg["out_dir"], "train.out"), out_sizes[key]), flush=True)
    if interrupted:  # Python's own handler again: the one that raised the KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return summaries, interrupted, failed
