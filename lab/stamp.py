"""python -m lab.stamp [--steps=N] FOLDER [FOLDER ...]: give committed records made before runs
recorded their code (no probe) today's probe, where today's code gives their numbers: for each
variant of each folder one run is trained again (its first seed, beside it as <run>.check/, two
at a time), and only where every logged loss and the whole-split loss equal the record's to the
last digit are all of that variant's summaries stamped. With --steps=N the run again is stopped
after step N and its first N steps' losses (every evaluation and log line) are compared instead:
the same test of the code, in a fraction of the time, without the final whole-split loss.
Another kind of CPU prints other digits: run it on the CPU that trained the records (their
summaries name it). Says per variant what it found."""
import json
import os
import shutil
import subprocess
import sys
import time

from configurator import ConfigError, run_main

from .probe import Probes
from .runs import ROOT, command, read_log, write_json


def losses(entries, steps=None):
    """The logged losses to the last digit: all of them, or those of the first steps only."""
    return [(r["iter"], r.get("loss"), r.get("train_loss"), r.get("val_loss"),
             r.get("val_loss_full")) for r in entries if r["kind"] in ("train", "eval", "final")
            and (steps is None or (r["kind"] != "final" and r["iter"] <= steps))]


def stamp(folders, jobs=2, steps=None):
    """Each variant of each folder: one run trained again (jobs at a time), compared, stamped."""
    checks = []
    for folder in folders:
        today, by_variant = Probes(folder), {}
        for entry in sorted(os.listdir(folder)):
            path = os.path.join(folder, entry, "summary.json")
            if os.path.isfile(path):
                summary = json.load(open(path))
                key = json.dumps({k: v for k, v in summary["config"].items()
                                  if k not in ("seed", "out_dir")}, sort_keys=True)
                by_variant.setdefault(key, []).append((path, summary))
        for runs in by_variant.values():
            checks.append((today, runs))
    running = []
    for today, runs in checks:
        if len(running) == jobs:
            judge(*running.pop(0))
        path, summary = runs[0]
        cfg, check = summary["config"], os.path.dirname(path) + ".check"
        shutil.rmtree(check, ignore_errors=True)
        os.makedirs(check)
        env = {**os.environ, "OMP_NUM_THREADS": str(summary["threads"]), "PYTHONPATH": ROOT}
        with open(os.path.join(check, "train.out"), "w") as out:
            running.append((subprocess.Popen(command({**cfg, "out_dir": check}, check)[0],
                                             stdout=out, stderr=subprocess.STDOUT, env=env),
                            today, runs, check, steps))
    for item in running:
        judge(*item)


def judge(process, today, runs, check, steps):
    """Stamps runs with today's probe where the run trained again in check logged their losses."""
    while process.poll() is None:  # with --steps: stopped once its log is past step N
        if steps is not None and any(r["iter"] > steps for r in read_log(check)):
            process.terminate()
        time.sleep(2)
    run_dir = os.path.dirname(runs[0][0])
    alike = losses(read_log(check), steps) == losses(read_log(run_dir), steps) != []
    print(f"{run_dir}: trained again, {'every loss equal' if alike else 'the losses DIFFER'}"
          f"; {'stamped' if alike else 'not stamped'}: {len(runs)} run(s)", flush=True)
    probe = today(runs[0][1]["config"])
    for path, summary in runs if alike else []:
        write_json(path, {**{k: v for k, v in summary.items() if k != "format"}, "probe": probe})
    if alike:
        shutil.rmtree(check)


def main(argv):
    steps = [a.split("=", 1)[1] for a in argv if a.startswith("--steps=")]
    if steps and not steps[-1].isdigit():
        raise ConfigError(f"--steps={steps[-1]}: a whole number of steps, such as --steps=300")
    steps = [int(n) for n in steps]
    stamp([folder.rstrip(os.sep) for folder in argv if not folder.startswith("--")],
          steps=steps[-1] if steps else None)


if __name__ == "__main__":
    sys.argv[0] = "lab.stamp"
    run_main(main)
