"""python -m lab.stamp --from=REV [--steps=N] FOLDER [FOLDER ...]: after a refactor, stamp the
records REV's code trained (carrying REV's code version, or none) with today's, where today's code
computes what REV's did: per variant, its first seed is trained again on this machine (the records'
CPU need not be this one) by REV's code and today's, for N steps (default: all), scored on the whole
val split; a variant whose two runs log every loss equal, to the last digit, is stamped."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from configurator import ConfigError, parse_args, run_main

from .runs import ROOT, code_version, command, read_log, settings_only, write_json

SETTINGS = {"steps": (0, "train each check run this many steps (0: as many as the records)", 0),
            "jobs": (2, "check runs side by side (each on one thread)", 1),
            "from": ("", "the git revision whose code trained the records (a commit, a tag)")}


def losses(log):
    """Every logged loss, to the last digit, with its step."""
    return [(r["iter"], r["kind"], r.get("loss"), r.get("train_loss"), r.get("val_loss"),
             r.get("val_loss_full")) for r in log if r["kind"] in ("train", "eval", "final")]


def variants(folders, today, theirs):
    """{settings: [(summary path, summary)]} of REV's records (version theirs or none, not ours)."""
    found = {}
    for folder in folders:
        for entry in sorted(os.listdir(folder)):
            path = os.path.join(folder, entry, "summary.json")
            summary = json.load(open(path)) if os.path.isfile(path) else None
            if summary is None or summary.get("code") == today:
                continue
            if summary.get("code") not in (None, theirs):
                print(f"{path}: code version {summary['code']}, not REV's ({theirs}): left alone")
                continue
            key = json.dumps({k: v for k, v in settings_only(summary["config"]).items()
                              if k != "seed"}, sort_keys=True)  # (a missing key: its default)
            found.setdefault(key, []).append((path, summary))
    return found


def check_runs(cfg, old_root, scratch, steps):
    """The two check runs of one variant: (their commands, folders, working folders)."""
    cfg = {**cfg, "max_iters": steps or cfg["max_iters"]}  # (lr_decay_iters is spelled out)
    old, new = os.path.join(scratch, "rev"), os.path.join(scratch, "today")
    program = ["-m", "lab.nudged", f"--nudge={cfg['nudge']}"] if cfg.get("nudge") else ["train.py"]
    old_args = [sys.executable, *program, f"--out_dir={old}"] + [  # REV's own settings only
        f"--{k}={v}" for k, v in cfg.items() if k not in ("out_dir", "nudge")]
    new_args = command({**cfg, "out_dir": new}, new)[0]
    old_evaluate = ([[sys.executable, "-m", "lab.evaluate", f"--out_dir={old}"]]  # (REV's own,
                    if os.path.isfile(os.path.join(old_root, "lab", "evaluate.py")) else [])
    return [([old_args] + old_evaluate, old, old_root), (new_args, new, ROOT)]  # or train.py's)


def stamp(folders, rev, steps=0, jobs=2):
    """Trains the check runs (jobs at a time) and stamps the variants whose losses agree."""
    missing = [folder for folder in folders if not os.path.isdir(folder)]
    if missing:
        raise ConfigError(f"{missing[0]}: no such folder of records")
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True)
    if archive.returncode:
        raise ConfigError(f"--from={rev}: not a revision of this repository "
                          f"({archive.stderr.decode().strip()})")
    old_root = tempfile.mkdtemp(prefix="stamp-rev-")
    subprocess.run(["tar", "-x", "-C", old_root], input=archive.stdout, check=True)
    # the data: REV's prepare.py makes the plays in REV's own format; other datasets are linked
    os.makedirs(os.path.join(old_root, "data"))
    ours = os.path.join(ROOT, "data")
    for name in os.listdir(ours) if os.path.isdir(ours) else []:
        if name != "shakespeare_byte":
            os.symlink(os.path.join(ROOT, "data", name), os.path.join(old_root, "data", name))
    subprocess.run([sys.executable, "prepare.py", "--quiet=True"], cwd=old_root, check=True)
    # REV's code version as REV's own lab.runs computes it: the one its records carry
    theirs = subprocess.run([sys.executable, "-c", "from lab.runs import code_version; "
                             "print(code_version())"], cwd=old_root, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": old_root}, check=True).stdout.strip()
    today = code_version()
    print(f"REV {rev}: code version {theirs}; today's: {today}", flush=True)
    work = [(key, runs, check_runs(settings_only(runs[0][1]["config"]), old_root,
                                   tempfile.mkdtemp(prefix="stamp-check-"), steps))
            for key, runs in variants(folders, today, theirs).items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for i in range(0, len(work), max(1, jobs // 2)):  # a variant's two runs side by side
        batch = work[i:i + max(1, jobs // 2)]
        procs = [(subprocess.Popen(" && ".join(shlex.join(a) for a in args),
                                   shell=True, cwd=cwd, env={**env, "PYTHONPATH": cwd},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT), out)
                 for _, _, runs in batch for args, out, cwd in runs]
        for process, _ in procs:
            process.wait()
        for _, records, runs in batch:
            judge(records, [out for _, out, _ in runs], today, steps)
    shutil.rmtree(old_root)


def judge(records, outs, today, steps):
    """Stamps a variant's records where its check runs' losses agree (then deletes the runs)."""
    alike = losses(read_log(outs[0])) == losses(read_log(outs[1])) != []
    name = os.path.basename(os.path.dirname(records[0][0]))
    print(f"{name} and {len(records) - 1} other record(s) of its settings: trained again "
          f"{'to step ' + str(steps) if steps else 'in full'} by REV's code and today's: "
          + ("every loss equal: stamped" if alike else f"the losses DIFFER: not stamped (the "
                                                        f"runs: {', '.join(outs)})"), flush=True)
    if alike:
        shutil.rmtree(os.path.dirname(outs[0]))
    for path, summary in records if alike else []:
        write_json(path, {**{k: v for k, v in summary.items() if k not in ("format", "probe")},
                          "code": today})


def main(argv):
    folders = [a.rstrip(os.sep) for a in argv if not a.startswith("-")]
    cfg = parse_args(SETTINGS, [a for a in argv if a.startswith("-")],
                     "python -m lab.stamp --from=REV [--steps=N] FOLDER [FOLDER ...]")
    if not getattr(cfg, "from") or not folders:
        raise ConfigError("name the revision whose code trained the records and their folders: "
                          "python -m lab.stamp --from=06ce0aa docs/results/default")
    stamp(folders, getattr(cfg, "from"), cfg.steps, cfg.jobs)


if __name__ == "__main__":
    sys.argv[0] = "lab.stamp"
    run_main(main)
