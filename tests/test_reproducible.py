"""Numbers that hold anywhere: a comparison's runs each on a fixed thread count (the same command
prints the same numbers whatever --jobs), the noise floor (vanilla again with its initial weights
nudged one float32 rounding step, python -m lab.nudged) beside every difference, and a campaign's
committed records (summary.json, log.jsonl; no checkpoint) reused by the same command."""
import contextlib
import io
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import compare
import configurator
import prepare
import train
from data import DataError
from lab import analysis, nudged, tables
from model import GPT, GPTConfig
from test_compare import data_dir  # noqa: F401 (a fixture: compare's tiny dataset)

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4",
        "--max_iters=4", "--eval_interval=2", "--eval_iters=2", "--log_interval=2",
        "--warmup_iters=1", "--analysis_samples=3", "--device=cpu", "--gap_steps=2,4"]


def run_compare(args):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = compare.main(args)
    return status, printed.getvalue()


def finals(out):
    """{variant: [final val loss per seed]} from a comparison's results.json."""
    return {n: r["val_loss"] for n, r in json.load(open(out / "results.json"))["modes"].items()}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores to run 2 threads")
def test_the_same_command_gives_the_same_numbers_whatever_jobs(tmp_path):
    """--jobs=1 used to train on every core's thread and --jobs=2 on one thread each: other
    roundings, other numbers. Now every run has the same thread count (--threads). (On the
    plays: the whole-split pass over their 478,921 validation bytes is where 2 threads round
    differently from 1 in a model this small.)"""
    plays = prepare.prepare(configurator.defaults(prepare.SETTINGS, quiet=True,
                                                  out_root=str(tmp_path / "data")))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torch's own default
    args = ["--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=32", "--batch_size=8",
            "--max_iters=20", "--eval_interval=10", "--eval_iters=2", "--warmup_iters=2",
            "--analysis_samples=3", "--device=cpu", "--modes=vanilla,resformer",
            "--seeds=1,", "--noise_floor=0", f"--dataset={plays}"]
    losses = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        done = subprocess.run([sys.executable, str(ROOT / "compare.py"), *args, f"--jobs={jobs}",
                               f"--out_dir={out}"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        losses[jobs] = finals(out)
        assert "1 thread each" in open(out / "results.md").read()
    assert losses[1] == losses[2]  # to the last digit


def test_nudge_moves_each_initial_weight_one_rounding_step(monkeypatch):
    """python -m lab.nudged builds train.py's model with each weight one float32 step up or
    down, by a fair coin per weight, and hands the rest of its command line to train.py."""
    config = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=64)
    monkeypatch.setattr(train, "GPT", train.GPT)  # restored after the test: main replaces it
    seen = {}

    def fake_main(argv):  # train.py as far as building its model
        torch.manual_seed(3)
        seen.update(argv=argv, model=train.GPT(config))
    monkeypatch.setattr(train, "main", fake_main)
    nudged.main(["--nudge=1", "--seed=3"])
    torch.manual_seed(3)
    plain = dict(GPT(config).named_parameters())
    assert seen["argv"] == ["--seed=3"]
    ups = total = 0
    for name, b in seen["model"].named_parameters():
        a = plain[name].detach()
        up, down = torch.nextafter(a, torch.full_like(a, math.inf)), torch.nextafter(
            a, torch.full_like(a, -math.inf))
        assert bool(((b == up) | (b == down)).all()), name  # exactly one float32 step away
        ups, total = ups + int((b == up).sum()), total + a.numel()
    assert 0.4 < ups / total < 0.6  # a fair coin per weight
    with pytest.raises(configurator.ConfigError, match="takes --nudge=N"):
        nudged.main(["--nudge=0"])


@pytest.fixture(scope="module")
def floored(data_dir, tmp_path_factory):
    """A tiny comparison on 2 seeds with the default noise floor (vanilla nudged on seed 1)."""
    out = tmp_path_factory.mktemp("floor") / "cmp"
    args = TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1,2",
                   "--modes=vanilla,svformer", "--jobs=2"]
    status, printed = run_compare(args)
    assert status == 0, printed
    return out, args, printed


def test_the_floor_is_trained_once_and_stands_beside_every_difference(floored):
    out, _, printed = floored
    assert "and vanilla nudged on 1 seed: the noise floor" in printed
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "svformer_seed1", "svformer_seed2", "vanilla-nudge=1_seed1", "vanilla_seed1",
        "vanilla_seed2"]
    assert json.load(open(out / "vanilla-nudge=1_seed1" / "summary.json"))["config"]["nudge"] == 1
    modes = json.load(open(out / "results.json"))["modes"]
    assert modes[analysis.FLOOR]["seeds"] == [1]
    md = open(out / "results.md").read()
    assert "Rounding alone (vanilla with its initial weights nudged" in md.split("\n\n")[1]
    assert "| vanilla:nudge=1 (nudged one rounding step: the noise floor) |" in md
    gap = md.split("## The gap along the run", 1)[1].split("\n## ", 1)[0]
    assert "| vanilla:nudge=1 |" in gap and "| svformer |" in gap
    costs = md.split("## What each variant costs", 1)[1].split("\n## ", 1)[0]
    assert "nudge" not in costs  # the floor is vanilla again: not a variant with costs


def test_a_difference_within_the_floor_is_called_so():
    stats = analysis.paired_stats([-0.03, -0.031, -0.029])  # beyond noise by its interval...
    assert analysis.verdict(stats).startswith("below vanilla, beyond noise")
    assert analysis.verdict(stats, floor=0.05).startswith("within the rounding floor")  # ...not
    assert analysis.verdict(stats, floor=0.01).startswith("below vanilla, beyond noise")
    results = {"vanilla": {"val_loss": [2.0, 2.1, 2.2]},
               "svformer": {"paired": stats},
               analysis.FLOOR: {"paired": analysis.paired_stats([0.05]), "seeds": [1]}}
    line = tables.headline(results, {"seeds": [1, 2, 3], "unit": "byte"})
    assert "svformer (-0.030" in line and "within the rounding floor" in line
    assert "nats per byte" in line and "moved the final loss by 0.0500 (one draw)" in line


def test_one_seed_shows_rounding_as_rounding_and_says_another_seed_moves_it_further():
    """Issue 45: one floor draw used to be drawn and read as the uncertainty of a one-seed
    difference ("a smaller difference is noise"). Without a calibration the text now says the
    band is rounding alone and another seed can move a difference much further; the band is
    labelled "rounding" in results.json."""
    one = {"vanilla": {"kv_cache_bytes_per_token": 256, "seeds": [7]},
           "svformer": {"paired": analysis.paired_stats([0.01]), "seeds": [7],
                        "kv_cache_bytes_per_token": 192},
           analysis.FLOOR: {"paired": analysis.paired_stats([-0.002]), "seeds": [7]}}
    analysis.bands(one)
    assert one["svformer"]["band_source"] == "rounding"
    assert one["svformer"]["band"] == pytest.approx([0.008, 0.012])
    text = tables.headline(one, {"seeds": [7], "unit": "byte"})
    assert "one seed (7), so each difference is one draw" in text
    assert "svformer: +0.010; no other seeds of this setting" in text
    assert "one draw on this seed) moved the final loss by 0.0020" in text
    assert "another seed moves a difference much further" in text
    assert "a smaller difference is noise" not in text
    assert "svformer's KV cache: 192 bytes per token against vanilla's 256 (3/4, exact)" in text


def test_committed_records_are_reused_without_checkpoints(floored, tmp_path):
    """A campaign commits each finished run's summary.json and log.jsonl, never its checkpoint;
    the same command in a fresh clone reuses them all and trains nothing."""
    out, args, _ = floored
    copy = tmp_path / "clone" / "cmp"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("*.pt", "train.out", "*.png",
                                                             "results.*"))
    fresh = [a if not a.startswith("--out_dir=") else f"--out_dir={copy}" for a in args]
    status, printed = run_compare(fresh)
    assert status == 0, printed
    assert ": training" not in printed and "not reused" not in printed
    assert json.load(open(copy / "results.json"))["info"]["reused"] == 5
    assert finals(copy) == finals(out)


def printed_alike(a, b, tol=1e-4):
    """Whether two JSON values agree wherever the tables print them: floats to within 1e-4
    (absolute or relative; the tables print 4 decimals or 0.1%), everything else exactly."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(printed_alike(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(printed_alike(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=tol, abs_tol=tol))
    return a == b


def test_printed_alike_ignores_the_last_digits_only():
    ours = {"line": [2.5622603096565695, -0.0717], "r2": 0.91, "poor": False, "n": 4}
    theirs = {"line": [2.5622603096565677, -0.0717], "r2": 0.91, "poor": False, "n": 4}
    assert printed_alike(ours, theirs)  # another CPU's rounding
    assert not printed_alike(ours, {**theirs, "r2": 0.92})  # a number the table would print
    assert not printed_alike(ours, {**theirs, "poor": True})
    assert not printed_alike(ours, {**theirs, "line": [2.5622]})


def test_the_committed_size_curve_table_is_what_its_committed_runs_give(tmp_path, monkeypatch):
    """docs/results/size_curve/results.json (what the notebook and docs/RESULTS.md read) is what
    the command on the first line of its results.md rebuilds from the runs committed beside it,
    training nothing: the table is never staler than its records."""
    committed = ROOT / "docs" / "results" / "size_curve"
    table = json.load(open(committed / "results.json"))
    shutil.copytree(committed, tmp_path / "docs" / "results" / "size_curve",
                    ignore=shutil.ignore_patterns("*.pt", "train.out", "*.png", "results.*"))
    monkeypatch.chdir(tmp_path)  # the records name their folders relative to the repository
    monkeypatch.setattr(compare.plots, "write_all", lambda *a, **k: [])
    prepare.prepare(configurator.defaults(prepare.SETTINGS, quiet=True))  # its probes' data
    command = shlex.split(table["info"]["command"])
    assert command[:2] == ["python", "compare.py"]
    status, printed = run_compare(command[2:])
    assert status == 0 and ": training" not in printed, printed
    rebuilt = json.load(open(tmp_path / "docs" / "results" / "size_curve" / "results.json"))
    assert rebuilt["info"]["reused"] == rebuilt["info"]["runs"] == table["info"]["runs"]
    # recomputed (a least-squares line, a bootstrap): another CPU rounds the last digits
    # differently, so compared at the precision the table prints, never to the last bit
    assert printed_alike(rebuilt["vanilla_curve"], table["vanilla_curve"])
    assert finals(tmp_path / "docs" / "results" / "size_curve") == finals(committed)
    # the README gives that very command beside the table's row
    assert table["info"]["command"] in (ROOT / "README.md").read_text()


def test_a_run_on_another_thread_count_is_refused_not_mixed_in(floored):
    out, args, _ = floored
    with pytest.raises(DataError, match="trained on 1 thread, which rounds differently"):
        run_compare(args + ["--threads=2"])


def test_the_probe_sees_an_edit_to_the_model_and_not_another_thread_count(data_dir,
                                                                            monkeypatch):
    """The probe of a run's settings: the same code on another thread count gives it at the
    printed precision; RMSNorm in place of LayerNorm (a student's everyday edit) moves it."""
    from lab import probe
    settings = {**{k: spec[0] for k, spec in train.SETTINGS.items()}, "dataset": data_dir,
                "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "max_iters": 100}
    today = probe.probe(settings)
    threads = torch.get_num_threads()
    torch.set_num_threads(2 if threads == 1 else 1)
    try:
        assert probe.same(probe.probe(settings), today)
    finally:
        torch.set_num_threads(threads)

    class RMSNorm(torch.nn.RMSNorm):
        def __init__(self, n, bias=False):
            super().__init__(n)
    monkeypatch.setattr(torch.nn, "LayerNorm", RMSNorm)
    edited = probe.probe(settings)
    assert not probe.same(edited, today)
    assert probe.differs(today, edited).startswith("the probe differs (")
