"""The committed records (docs/results/*: each finished run's summary.json and log.jsonl, never a
checkpoint) and what is built from them. Where today's code is the code that trained them (its
code version), the commands that made them reuse every run and rebuild their tables, training
nothing; after an edit to that code they are reused by nothing (tests/test_compare.py shows the
set-aside), so these tests then fail until the records are stamped again."""
import contextlib
import io
import json
import math
import shlex
import shutil
from pathlib import Path

import pytest

import compare
import configurator
import prepare
from lab import analysis
from lab.grid import calibrated, parse_modes, parse_seeds
from lab.runs import code_version

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
STAMPED = ["default", "default_2threads", "default_check", "default_check_2threads",
           "demo_calibration", "demo_heldout", "demo_check", "demo_check_2threads",
           "demo_seed1337_2threads", "size_curve", "vanilla_seed5001_check", "long_6e-3"]


def records(folder):
    return [json.load(open(p)) for p in sorted((RESULTS / folder).glob("*/summary.json"))]


def assert_todays_code():
    """The committed records carry today's code version: after an edit to a run's code they
    are stale, and these tests fail (not skip) until the maintainer stamps them again with
    python -m lab.stamp (docs/RESULTS.md gives the command)."""
    versions = {s.get("code") for folder in STAMPED for s in records(folder)}
    assert versions == {code_version()}, (
        f"today's code ({code_version()}) did not train the committed records "
        f"({', '.join(sorted(map(str, versions)))}): stamp them again (docs/RESULTS.md)")


def printed_alike(a, b, tol=1e-4):
    """Two JSON values alike wherever the tables print them: floats within 1e-4 (absolute or
    relative: another CPU rounds a refitted line's last digits), everything else exactly."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(printed_alike(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(printed_alike(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=tol, abs_tol=tol))
    return a == b


def test_printed_alike_ignores_the_last_digits_only():
    ours = {"line": [2.5622603096565695, -0.0717], "r2": 0.91, "poor": False}
    assert printed_alike(ours, {**ours, "line": [2.5622603096565677, -0.0717]})
    assert not printed_alike(ours, {**ours, "r2": 0.92})
    assert not printed_alike(ours, {**ours, "poor": True})


def test_every_record_is_one_code_version_and_names_its_machine():
    """A stamp (python -m lab.stamp) gives all of a variant's records one version at once."""
    for folder in STAMPED:
        for summary in records(folder):
            assert summary.get("code") and "probe" not in summary, folder
            assert summary["machine"] and summary["threads"] in (1, 2)


def test_the_committed_comparisons_plan_nothing_to_train(tmp_path):
    """`python compare.py --out_dir=docs/results/default --plan` prints no run: every record is
    reused (a copy of the folder, since --plan writes each unfinished run's code.json)."""
    assert_todays_code()
    for folder, argv in (("default", []), ("size_curve", None)):
        copy = tmp_path / "docs" / "results" / folder
        shutil.copytree(RESULTS / folder, copy, ignore=shutil.ignore_patterns("*.png"))
        info = json.load(open(RESULTS / folder / "results.json"))["info"]
        argv = argv if argv is not None else shlex.split(info["command"])[2:]
        argv = [a for a in argv if not a.startswith("--out_dir=")] + [f"--out_dir={copy}"]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert compare.main(argv + ["--plan"]) == 0
        assert [line for line in printed.getvalue().splitlines()
                if "train.py" in line] == [], folder


def test_the_size_curve_table_is_what_its_committed_runs_give(tmp_path, monkeypatch):
    """docs/results/size_curve/results.json (which docs/RESULTS.md and the notebook read) is what
    the command on its first line rebuilds from the runs committed beside it, training nothing."""
    assert_todays_code()
    committed = RESULTS / "size_curve"
    table = json.load(open(committed / "results.json"))
    shutil.copytree(committed, tmp_path / "docs" / "results" / "size_curve",
                    ignore=shutil.ignore_patterns("*.png", "results.*"))
    monkeypatch.chdir(tmp_path)  # the records name their folders relative to the repository
    monkeypatch.setattr(compare.plots, "write_all", lambda *a, **k: [])
    prepare.prepare(configurator.parse_args(prepare.SETTINGS, ["--quiet"], ""))  # its data
    command = shlex.split(table["info"]["command"])
    assert command[:2] == ["python", "compare.py"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert compare.main(command[2:]) == 0
    assert ": training" not in printed.getvalue(), printed.getvalue()
    rebuilt = json.load(open(tmp_path / "docs" / "results" / "size_curve" / "results.json"))
    assert rebuilt["info"]["reused"] == rebuilt["info"]["runs"] == table["info"]["runs"]
    assert printed_alike(rebuilt["vanilla_curve"], table["vanilla_curve"])
    assert {n: r["val_loss"] for n, r in rebuilt["modes"].items()} == {
        n: r["val_loss"] for n, r in table["modes"].items()}
    assert table["info"]["command"] in (ROOT / "docs" / "RESULTS.md").read_text()


def test_the_demos_calibration_is_reused_by_todays_code():
    """config/demo.py's 20 calibration seeds give every variant of the demo its band."""
    assert_todays_code()
    cfg = vars(configurator.parse_args(compare.SETTINGS, [str(ROOT / "config" / "demo.py")], ""))
    modes = parse_modes(cfg["modes"])
    from lab.grid import own_lrs
    found = calibrated(cfg, own_lrs(modes, cfg), parse_seeds(cfg["seeds"]), code_version())
    assert found["unused"] == {} and len(found["seeds"]) == 20
    assert set(found["modes"]) == {name for name, _ in modes if name != "vanilla"}
    # ... and rounding alone where the calibration trained it (10 of its seeds), so the demo
    # says how far it moved vanilla there, not only on its own seed
    table = json.load(open(RESULTS / "demo_calibration" / "results.json"))["modes"]
    vanilla = dict(zip(table["vanilla"]["seeds"], table["vanilla"]["val_loss"]))
    nudged = dict(zip(table[analysis.FLOOR]["seeds"], table[analysis.FLOOR]["val_loss"]))
    assert len(found["floor"]) == len(nudged) == 10
    assert sorted(f"{x:.4f}" for x in found["floor"]) == sorted(
        f"{nudged[s] - vanilla[s]:.4f}" for s in nudged)


def test_the_default_comparisons_verdicts_do_not_flip_with_the_rounding():
    """The committed default comparison, on its own seeds and on 8 new ones, at 1 and 2 threads
    a run: each variant gets the same verdict under both roundings (the sign test, as a verdict,
    had flipped lambda = 2 on seeds 1337-1344: 7 of 8 lower at 1 thread, 6 of 8 at 2)."""
    said = {}
    for folder in ("default", "default_2threads", "default_check", "default_check_2threads"):
        results = json.load(open(RESULTS / folder / "results.json"))["modes"]
        floor = analysis.noise_floor(results)
        said[folder] = {name: analysis.verdict(r["paired"], floor).split(" (")[0]
                        for name, r in results.items()
                        if r.get("paired") and name != analysis.FLOOR}
    assert said["default"] == said["default_2threads"] and len(said["default"]) == 2
    assert said["default_check"] == said["default_check_2threads"]
    assert set(said["default_check"].values()) == {"below vanilla, beyond noise"}
