"""python -m lab.stamp FOLDER [FOLDER ...]: give committed records made before runs recorded their
code (no probe) today's probe, where today's code gives their numbers: for each variant of each
folder one run is trained again (its first seed, into FOLDER.check/), and only where every
logged loss and the whole-split loss equal the record's to the last digit are all of that
variant's summaries stamped. Another kind of CPU prints other digits: run it on the CPU that
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


def stamp(folder):
    today, by_variant = Probes(folder), {}
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry, "summary.json")
        if os.path.isfile(path):
            summary = json.load(open(path))
            key = json.dumps({k: v for k, v in summary["config"].items()
                              if k not in ("seed", "out_dir")}, sort_keys=True)
            by_variant.setdefault(key, []).append((path, summary))
    for runs in by_variant.values():
        path, summary = runs[0]
        run_dir, cfg = os.path.dirname(path), summary["config"]
        check = os.path.join(folder + ".check", os.path.basename(run_dir))
        shutil.rmtree(check, ignore_errors=True)
        os.makedirs(check)
        args = command({**cfg, "out_dir": check}, check)[0]
        env = {**os.environ, "OMP_NUM_THREADS": str(summary["threads"]), "PYTHONPATH": ROOT}
        with open(os.path.join(check, "train.out"), "w") as out:
            subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, env=env, check=True)
        alike = losses(read_log(check)) == losses(read_log(run_dir))
        probe = today(cfg)
        print(f"{run_dir}: trained again, {'every loss equal' if alike else 'the losses DIFFER'}"
              f"; {'stamped' if alike else 'not stamped'}: {len(runs)} run(s)", flush=True)
        for path, summary in runs if alike else []:
            write_json(path, {**{k: v for k, v in summary.items() if k != "format"},
                              "probe": probe})


def main(argv):
    for folder in argv:
        stamp(folder.rstrip(os.sep))


if __name__ == "__main__":
    sys.argv[0] = "lab.stamp"
    run_main(main)
