"""python -m lab.stamp FOLDER [FOLDER ...]: give committed records made before runs recorded their
code (no probe) today's probe, where today's code gives their numbers: for each variant of each
folder one run is trained again (its first seed, beside it as <run>.check/, two at a time), and
only where every logged loss and the whole-split loss equal the record's to the last digit are
all of that variant's summaries stamped. Another kind of CPU prints other digits: run it on the CPU that
trained the records (their summaries name it). Says per variant what it found."""
import json
import os
import shutil
import subprocess
import sys

from configurator import run_main

from .probe import Probes
from .runs import ROOT, command, read_log, write_json


def losses(entries):
    return [(r["iter"], r.get("loss"), r.get("train_loss"), r.get("val_loss"),
             r.get("val_loss_full")) for r in entries if r["kind"] in ("train", "eval", "final")]


def stamp(folders, jobs=2):
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
                            today, runs, check))
    for item in running:
        judge(*item)


def judge(process, today, runs, check):
    """Stamps runs with today's probe where the run trained again in check logged their losses."""
    process.wait()
    run_dir = os.path.dirname(runs[0][0])
    alike = losses(read_log(check)) == losses(read_log(run_dir)) != []
    print(f"{run_dir}: trained again, {'every loss equal' if alike else 'the losses DIFFER'}"
          f"; {'stamped' if alike else 'not stamped'}: {len(runs)} run(s)", flush=True)
    probe = today(runs[0][1]["config"])
    for path, summary in runs if alike else []:
        write_json(path, {**{k: v for k, v in summary.items() if k != "format"}, "probe": probe})
    if alike:
        shutil.rmtree(check)


def main(argv):
    stamp([folder.rstrip(os.sep) for folder in argv])


if __name__ == "__main__":
    sys.argv[0] = "lab.stamp"
    run_main(main)
