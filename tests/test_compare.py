"""Tests for compare.py and lab/ (runs, analysis, tables): tiny real comparisons where what is
checked needs train.py, a stand-in run_grid where only the reporting is checked, and the
measures on numbers small enough to check by hand."""
import contextlib
import hashlib
import io
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import compare
import configurator
import data
import model
import prepare
import train
from configurator import ConfigError, UserError
from data import DataError, load_checkpoint
from lab import analysis, plots, runs, tables
from lab import grid as lab_grid
from lab import probe
from model import GPT, GPTConfig

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4",
        "--max_iters=2", "--eval_interval=1", "--eval_iters=2", "--log_interval=1",
        "--warmup_iters=1", "--lr_decay_iters=2",
        "--analysis_samples=3", "--device=cpu", "--jobs=2"]
LIVE_LINE = "the loss picture, redrawn every 30 s while they train: "


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    docs = [f"To be, or not to be, that is question number {i}.\n" * 8 for i in range(20)]
    cfg = configurator.defaults(prepare.SETTINGS, dataset="t", quiet=True,
                                out_root=str(tmp_path_factory.mktemp("data")))
    return prepare.prepare(cfg, documents=docs)


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def patch_runs(monkeypatch, run_grid):
    """A stand-in for lab.runs.run_grid, where compare.py and the lr search (lab.grid) call it."""
    monkeypatch.setattr(compare, "run_grid", run_grid)
    monkeypatch.setattr(lab_grid, "run_grid", run_grid)


def table_rows(md, heading):
    """The rows of the markdown table under a heading, as lists of cells."""
    part = md.split(heading, 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in part.splitlines()
            if line.startswith("| ") and not line.startswith("|---")][1:]  # no header row


# One tiny comparison, read by the tests below: every value mode, the learned-lambda ResFormer,
# and vanilla at 3 sizes (for the loss-against-size line).
TINY_MODES = ("vanilla,vanilla:n_embd=8,vanilla:n_embd=24,resformer,svformer,"
              "resformer_learnable,value_embed")


@pytest.fixture(scope="module")
def tiny(data_dir, tmp_path_factory):
    """compare.main on 2 seeds, what it printed and what it wrote."""
    out = tmp_path_factory.mktemp("tiny") / "cmp"
    args = TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1337,1338",
                   f"--modes={TINY_MODES}"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = compare.main(args)
    results = json.load(open(out / "results.json"))
    return types.SimpleNamespace(out=out, args=args, status=status, printed=printed.getvalue(),
                                 results=results, modes=results["modes"],
                                 md=(out / "results.md").read_text())


def test_tiny_comparison_writes_everything(tiny):
    assert tiny.status == 0
    out, m = tiny.out, tiny.modes
    # each line after the first finished run says how long is left, and where running runs are
    lines = [line for line in tiny.printed.splitlines()
             if line.startswith("[") or line.startswith("    done")]
    # 15 runs: 7 variants x 2 seeds and the noise floor (vanilla nudged) on the first seed
    assert len(lines) == 30 and lines[-1].startswith("    done")
    first_done = next(i for i, line in enumerate(lines) if "done" in line)
    left = r"(about \d+ min|under a minute) left"
    run = r"[\w.=-]+ at \d/[12]( \(loss \d+\.\d+\))?"
    running = rf"running: {run}(, {run})?"
    for line in lines[first_done:-1]:
        assert re.search(rf"\({left}(; {running})?\)$" if line.startswith("[") else
                         rf"\(\d+\.\d min so far, {left}(; {running})?\)$", line), line
    assert re.search(rf"\(\d+\.\d min so far(; {running})?\)$", lines[-1]), lines[-1]
    assert any(re.search(running, line) for line in lines), lines
    assert set(m) == set(TINY_MODES.split(",")) | {analysis.FLOOR}
    for name, r in m.items():
        for key in ("num_params", "active_params", "flops_per_token", "val_loss", "val_loss_mean",
                    "val_loss_std", "tokens", "steps", "tokens_per_step", "curves",
                    "kv_cache_bytes_per_token", "tokens_per_sec", "attention_entropy",
                    "similarity", "attention_entropy_std", "similarity_std"):
            assert key in r, (name, key)
        n = 1 if name == analysis.FLOOR else 2  # the floor: on the first seed only
        assert r["seeds"] == [1337, 1338][:n]
        assert len(r["val_loss"]) == n and math.isfinite(r["val_loss_mean"])
        assert len(r["attention_entropy"]) == len(r["similarity"]) == 2
        if name != "vanilla":  # paired against vanilla, seed by seed
            p = r["paired"]
            assert p["n"] == n and 0 <= p["wins"] <= n
            assert len(p["interval"]) == 2 if n == 2 else p["interval"] is None  # one seed: none
            v = m["vanilla"]["val_loss"]
            assert p["differences"] == pytest.approx([r["val_loss"][i] - v[i] for i in range(n)])
    assert m["vanilla"]["tokens"] == [0, 64, 128]  # evals at steps 0, 1, 2 of 4 x 16 tokens
    assert m["vanilla"]["steps"] == [0, 1, 2] and m["vanilla"]["tokens_per_step"] == 64
    assert m["svformer"]["num_params"] < m["vanilla"]["num_params"] == m["resformer"]["num_params"]
    assert (m["svformer"]["kv_cache_bytes_per_token"] * 4
            == m["vanilla"]["kv_cache_bytes_per_token"] * 3)  # (L+1)/2L
    assert list(m["resformer_learnable"]["mixing"]) == ["transformer.h.1.attn.value_lambdas"]
    assert len(m["resformer_learnable"]["mixing"]["transformer.h.1.attn.value_lambdas"]) == 2
    assert "lambdas" not in m["resformer_learnable"]  # "mixing" replaced it
    assert sorted(m["value_embed"]["mixing"]) == ["transformer.h.0.attn.value_lambda",
                                                  "transformer.h.1.attn.value_lambda"]
    md = tiny.md
    assert "| vanilla |" in md and "95% interval" in md and "of 2" in md and "In-run crossing" in md
    assert "| vanilla:nudge=1 (nudged one rounding step: the noise floor) |" in md
    assert (out / "vanilla_seed1338" / "summary.json").is_file()
    assert (out / "vanilla-nudge=1_seed1337" / "summary.json").is_file()
    assert not (out / "vanilla-nudge=1_seed1338").exists()  # --noise_floor=1: the first seed
    # each run records where it trained; all here, so the header names one machine, once
    assert json.load(open(out / "vanilla_seed1338" / "summary.json"))["machine"] == \
        runs.hardware("cpu")
    assert tiny.results["info"]["trained_on"] == {runs.hardware("cpu"): 15}
    assert "the runs trained on" not in md and md.count(runs.hardware("cpu")) == 1
    for png in ("loss.png", "attention_entropy.png", "similarity.png", "mixing.png",
                "size_curve.png"):
        assert (out / png).is_file() == _has_matplotlib()
    assert not (out / "lambdas.png").exists()
    if _has_matplotlib():  # the live picture's path, said once, before the first run starts
        assert tiny.printed.count(LIVE_LINE) == 1
        assert tiny.printed.index(f"{LIVE_LINE}{out / 'loss.png'}\n") < tiny.printed.index(
            "[1/15]")


def test_runs_reused_from_other_machines_are_named_in_the_header():
    """A campaign's committed runs may come from several machines (another CPU rounds
    otherwise): the header then says where each trained; runs older than the record, as such."""
    info = {"hardware": "CPU A, 2 cores", "trained_on": {"CPU A, 2 cores": 3}}
    assert tables.trained_on(info) == ""
    info["trained_on"] = {"CPU A, 2 cores": 3, "GPU B": 1, "not recorded": 2}
    assert tables.trained_on(info) == (
        "; the runs trained on CPU A, 2 cores (3 runs), GPU B (1 run), not recorded (2 runs) "
        "(a run's numbers hold on the machine that printed them)")


def test_a_variant_override_changes_only_that_variant(tiny):
    configs = {d: json.load(open(tiny.out / d / "summary.json"))["config"]
               for d in os.listdir(tiny.out) if d.endswith("_seed1337")}
    assert "vanilla-n_embd=8_seed1337" in configs and "resformer_seed1337" in configs
    vanilla, small = configs["vanilla_seed1337"], configs["vanilla-n_embd=8_seed1337"]
    assert vanilla["n_embd"] == 16 and small["n_embd"] == 8
    assert {k for k in vanilla if vanilla[k] != small[k]} == {"n_embd", "out_dir"}
    resformer = configs["resformer_seed1337"]
    assert {k for k in vanilla if vanilla[k] != resformer[k]} == {"value_mode", "out_dir"}


def test_what_each_variant_costs(tiny):
    """Every variant with its total and active params and FLOPs as model.py counts them;
    value embeddings' tables count one row per token, so fewer params are active."""
    m = tiny.modes
    rows = {row[0]: row for row in table_rows(tiny.md, "## What each variant costs")}
    assert set(rows) == set(m) - {analysis.FLOOR}  # the floor is vanilla again: no costs of its own
    for name, row in rows.items():
        assert row[1] == f"{m[name]['num_params']:,}"
        assert row[2] == f"{m[name]['active_params']:,}"
        assert row[3] == f"{m[name]['flops_per_token'] / 1e6:.2f}M"
    ckpt = load_checkpoint(str(tiny.out / "value_embed_seed1337" / "ckpt.pt"))
    value_embed = GPT.from_checkpoint(ckpt)
    assert m["value_embed"]["num_params"] == value_embed.num_params()
    assert m["value_embed"]["active_params"] == analysis.sizes(value_embed, 16)["active_params"]
    tables = sum(p.numel() for n, p in value_embed.named_parameters() if "value_embed" in n)
    flops = 6 * (value_embed.num_params() - tables) + 12 * 2 * 16 * 16  # PaLM's: 12 L C T
    assert m["value_embed"]["flops_per_token"] == flops
    assert m["value_embed"]["active_params"] < m["value_embed"]["num_params"]
    for name in ("vanilla", "resformer", "svformer"):  # no lookup tables: all params active
        assert m[name]["active_params"] == m[name]["num_params"]


def test_the_vanilla_size_curve_is_tabled_and_drawn(tiny):
    """Vanilla at 3 sizes (vanilla, vanilla:n_embd=8, vanilla:n_embd=24): results.json's
    vanilla_curve, its table in results.md, size_curve.png; every other variant placed (not
    the noise floor: vanilla again)."""
    m, curve = tiny.modes, tiny.results["vanilla_curve"]
    sizes = ("vanilla", "vanilla:n_embd=8", "vanilla:n_embd=24")
    assert curve["sizes"] == {n: m[n]["num_params"] for n in sizes}
    assert len(set(curve["sizes"].values())) == 3 and curve["seeds"] == [1337, 1338]
    assert set(curve["placed"]) == set(m) - set(sizes) - {analysis.FLOOR}  # (vanilla again)
    assert curve == json.loads(json.dumps(analysis.vanilla_curve(m)))
    assert "\n".join(tables.curve_table(analysis.vanilla_curve(m), m)) in tiny.md
    rows = table_rows(tiny.md, "## Matches a vanilla model X% larger")
    means = [m[n]["val_loss_mean"] for n in sorted(sizes, key=lambda n: m[n]["num_params"])]
    # off one line (R² under 0.9, or a larger vanilla not lower): the points, no reading
    assert curve["poor"] == (curve["r2"] < 0.9 or any(np.diff(means) >= 0)), curve
    if curve["poor"]:  # (2 steps of tiny models can be)
        assert "## Matches a vanilla model X% larger (the paper's measure): not read off\n" in (
            tiny.md)
        # one ladder, lowest mean first: the sizes (in bold) and every variant placed
        ladder = sorted(list(sizes) + list(curve["placed"]), key=lambda n: m[n]["val_loss_mean"])
        assert [row[:3] for row in rows] == [
            [f"**{n}**" if n in sizes else n, f"{m[n]['num_params']:,}",
             f"{m[n]['val_loss_mean']:.4f}"] for n in ladder]
    else:
        assert "## Matches a vanilla model X% larger (the paper's measure)\n" in tiny.md
        assert [row[:2] for row in rows] == [[n, f"{m[n]['num_params']:,}"]
                                             for n in curve["placed"]]
    assert (tiny.out / "size_curve.png").is_file() == _has_matplotlib()


@pytest.mark.skipif(not _has_matplotlib(), reason="the live picture needs matplotlib")
def test_the_live_picture_is_redrawn_while_the_runs_train(data_dir, tmp_path, monkeypatch):
    """While the runs train, compare redraws loss.png from their logs every 30 s: the picture
    is there before the comparison ends and changes as the runs progress. (The 30 s pass 30
    times faster here: run_grid's clock is sped up, nothing else changes. Two runs side by side
    start together: no later start postpones a redraw.)"""
    out = tmp_path / "live"
    redraws, real_live, real_time, t0 = [], plots.live_loss, time.time, time.time()

    def live_loss(root, grid, escape_loss=0.0, **settings):
        path = real_live(root, grid, escape_loss, **settings)
        if path is not None:  # (modification time, content, whether the comparison had ended)
            redraws.append((os.stat(path).st_mtime_ns, hashlib.sha256(
                open(path, "rb").read()).hexdigest(), (out / "results.md").exists()))
        return path
    monkeypatch.setattr(runs, "time", types.SimpleNamespace(
        time=lambda: t0 + 30 * (real_time() - t0), sleep=time.sleep))
    monkeypatch.setattr(plots, "live_loss", live_loss)
    args = [a for a in TINY if not a.startswith(("--max_iters", "--lr_decay_iters",
                                                 "--eval_interval", "--log_interval"))]
    assert compare.main(args + ["--max_iters=250", "--eval_interval=10", "--log_interval=50",
                                f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1337",
                                "--modes=vanilla,resformer"]) == 0
    during = [(mtime, digest) for mtime, digest, ended in redraws if not ended]
    assert len(during) >= 2, redraws
    assert len({digest for _, digest in during}) >= 2, redraws  # it changed
    assert during[-1][0] > during[0][0]  # and was written again, later
    assert (out / "loss.png").is_file() and not (out / "loss.live.png").exists()


def test_the_same_command_again_reuses_every_run(tiny, capsys, monkeypatch):
    monkeypatch.setattr(compare.plots, "write_all", lambda *a, **k: [])  # (pictures: above)
    assert compare.main(tiny.args) == 0
    assert "not reused" not in capsys.readouterr().out  # the noise floor's run too
    assert "15 of 15 runs reused" in (tiny.out / "results.md").read_text()


def test_vanilla_curve_on_numbers_checkable_by_hand():
    """Vanilla at 4 sizes exactly on loss = 5 - 0.2 ln N (seed offsets that average to 0);
    ResFormer with 150k parameters at the mean loss of a 300k vanilla: it matches a vanilla
    model 100% larger. The interval resamples the seeds and holds the estimate."""
    def r(n, loss, offsets):
        return {"num_params": int(n), "seeds": [1, 2, 3], "val_loss": [loss + d for d in offsets]}
    line = lambda n: 5 - 0.2 * math.log(n)  # noqa: E731
    results = {name: r(n, line(n), (-spread, 0.0, spread)) for name, n, spread in (
        ("vanilla:n_embd=8", 1e5, 0.01), ("vanilla", 2e5, 0.0), ("vanilla:n_embd=24", 4e5, 0.02),
        ("vanilla:n_layer=8:n_embd=24", 8e5, 0.03))}  # the spread grows with size: the slope
    # varies over resampled seeds
    results["resformer"] = r(1.5e5, line(3e5), (-0.03, 0.01, 0.02))
    results["svformer"] = r(2e5, line(2e5), (0.0, 0.0, 0.0))  # vanilla's loss at its own size
    curve = analysis.vanilla_curve(results)
    assert curve["line"] == pytest.approx([5, -0.2]) and curve["residual"] == pytest.approx(0,
                                                                                          abs=1e-9)
    assert curve["sizes"] == {"vanilla:n_embd=8": 100000, "vanilla": 200000,
                              "vanilla:n_embd=24": 400000, "vanilla:n_layer=8:n_embd=24": 800000}
    res = curve["placed"]["resformer"]
    assert res["larger"] == pytest.approx(1.0) and res["matched_params"] == pytest.approx(3e5)
    assert res["interval"][0] < 1.0 < res["interval"][1] and res["inside"]
    assert curve["placed"]["svformer"]["larger"] == pytest.approx(0.0, abs=1e-9)
    assert curve["vanilla_reading"] == pytest.approx(0.0, abs=1e-9)  # on its own line
    # vanilla 0.03 below the line's other points: read off the refitted line, as the line says
    low = {**results, "vanilla": r(2e5, line(2e5) - 0.03, (0.0, 0.0, 0.0))}
    bent = analysis.vanilla_curve(low)
    (a, b), own = bent["line"], bent["vanilla_reading"]
    assert own == pytest.approx(math.exp((line(2e5) - 0.03 - a) / b) / 2e5 - 1) and own > 0.05
    assert f"read off the same line, is as good as a vanilla model {100 * own:+.1f}% larger" in (
        "\n".join(tables.curve_table(bent)))
    # per seed: seed 2's sizes lie exactly on the line and its resformer run is 0.01 above a 300k
    # vanilla's loss, so seed 2 alone reads 2 exp(-0.01 / 0.2) - 1 = +90%
    assert res["per_seed"][1] == pytest.approx(2 * math.exp(-0.05) - 1)
    assert len(res["per_seed"]) == 3
    assert curve["placed"]["svformer"]["per_seed"][1] == pytest.approx(0.0, abs=1e-9)
    assert curve["slope_interval"][0] < -0.2 < curve["slope_interval"][1]
    table = tables.curve_table(curve)
    row = next(line for line in table if line.startswith("| resformer |"))
    assert row.startswith("| resformer | 150,000 | 300,000 | +100.0% | [") and row.endswith(
        "| yes |")
    assert f"| {100 * res['per_seed'][0]:+.0f}%, +90%, {100 * res['per_seed'][2]:+.0f}% | yes |" \
        in row
    assert "5.0000 -0.2000 ln(params)" in "\n".join(table)
    assert curve["floor"] is None and "rounding floor" not in "\n".join(table)
    # the noise floor's run (vanilla nudged, seed 1 only): 0.02 above vanilla on that seed is a
    # factor exp(0.02 / 0.2) = 1.105 of size on this line; svformer (+0%) is within it, resformer
    # (+100%) beyond it
    floored = {**results, analysis.FLOOR: {**r(2e5, 0, ()), "seeds": [1],
                                           "paired": {"differences": [0.02]}}}
    with_floor = analysis.vanilla_curve(floored)
    assert with_floor["floor_factor"] == pytest.approx(math.exp(0.1))
    assert analysis.FLOOR not in with_floor["placed"]
    assert with_floor["placed"]["svformer"]["within_floor"]
    assert not with_floor["placed"]["resformer"]["within_floor"]
    table = "\n".join(tables.curve_table(with_floor))
    assert "moved a final loss by up to 0.0200 (the noise floor): on this line that is a vanilla " \
           "model 11% larger or 10% smaller" in table
    assert "| svformer | 200,000 | 200,000 | +0.0% | [" in table
    assert next(line for line in table.splitlines() if line.startswith("| svformer |")).endswith(
        "| yes | no: not a result |")
    assert next(line for line in table.splitlines() if line.startswith("| resformer |")).endswith(
        "| yes | yes |")
    # too few sizes, too few shared seeds: no curve, no table
    three = {n: results[n] for n in ("vanilla", "vanilla:n_embd=8", "resformer")}
    assert analysis.vanilla_curve(three) is None and tables.curve_table(None) == []
    one_seed = {**results, "vanilla:n_embd=8": {**results["vanilla:n_embd=8"], "seeds": [1, 4, 5]}}
    # only seed 1 shared by every size: a line and a reading, but nothing to resample
    single = analysis.vanilla_curve(one_seed)
    assert single["seeds"] == [1] and single["slope_interval"] is None
    assert single["placed"]["resformer"]["interval"] is None
    assert "one seed: no interval" in "\n".join(tables.curve_table(single))
    assert "| - |" in next(line for line in tables.curve_table(single)
                           if line.startswith("| resformer |"))
    no_seed = {**results, "vanilla:n_embd=8": {**results["vanilla:n_embd=8"], "seeds": [4, 5, 6]}}
    assert analysis.vanilla_curve(no_seed) is None  # no seed shared by every size
    two_seeds = {**results, "vanilla:n_embd=8": {**results["vanilla:n_embd=8"], "seeds": [1, 2, 5]}}
    assert analysis.vanilla_curve(two_seeds)["seeds"] == [1, 2]
    same_size = {**results, "vanilla:n_embd=24": {**results["vanilla:n_embd=24"],
                                                  "num_params": 200000},
                 "vanilla:n_layer=8:n_embd=24": {**results["vanilla:n_layer=8:n_embd=24"],
                                                 "num_params": 100000}}
    assert analysis.vanilla_curve(same_size) is None  # 4 names, 2 sizes
    # which variants are vanilla sizes: only size settings changed
    assert analysis.is_vanilla_size("vanilla:n_embd=48:n_layer=8:n_head=4")
    assert not analysis.is_vanilla_size("vanilla:max_iters=100")
    assert not analysis.is_vanilla_size("vanilla_kv1") and not analysis.is_vanilla_size(
        "resformer:n_embd=48")


def test_off_one_line_the_sizes_and_variants_stand_on_one_ladder():
    """Vanilla at 3 sizes whose middle one is the worst (a larger model not lower): poor, so no
    X% is read off; the table gives the line that was fitted, the floor's worth on it, and every
    run ranked by its mean loss with each seed's own loss."""
    def r(n, losses):
        return {"num_params": n, "seeds": [1, 2], "val_loss": list(losses)}
    results = {"vanilla:n_embd=8": r(100, (2.0, 2.2)), "vanilla": r(200, (2.3, 2.3)),
               "vanilla:n_embd=24": r(400, (1.5, 1.7)), "resformer": r(200, (1.9, 2.0)),
               analysis.FLOOR: {**r(200, ()), "seeds": [1], "paired": {"differences": [0.05]}}}
    curve = analysis.vanilla_curve(results)
    assert curve["poor"] and curve["points"]["vanilla"] == pytest.approx(2.3)
    table = tables.curve_table(curve, results)
    text = "\n".join(table)
    assert "not read off" in table[0] and "X% larger |" not in text
    a, b = curve["line"]
    assert f"would be loss = {a:.4f} {b:+.4f} ln(params)" in text and "slope 95% interval" in text
    assert (f"moved a final loss by up to 0.0500: on that line, a vanilla model "
            f"{100 * (math.exp(0.05 / -b) - 1):.0f}% larger") in text
    ladder = [line for line in table if line.startswith("| ") and not line.startswith("| run")]
    assert ladder == ["| **vanilla:n_embd=24** | 400 | 1.6000 | 1.5000, 1.7000 |",
                      "| resformer | 200 | 1.9500 | 1.9000, 2.0000 |",
                      "| **vanilla:n_embd=8** | 100 | 2.1000 | 2.0000, 2.2000 |",
                      "| **vanilla** | 200 | 2.3000 | 2.3000, 2.3000 |"]


def test_time_left_counts_the_steps_left_at_the_finished_runs_pace(tmp_path):
    """Finished runs took 0.125 s a step; left: 2 runs of 800 steps and half of a running one,
    2 at a time: c's 400 steps beside a's 800, then b's 800: 1,200 steps x 0.125 s = 150 s."""
    grid = [{"out_dir": str(tmp_path / name), "max_iters": 800} for name in ("a", "b", "c")]
    os.makedirs(grid[2]["out_dir"])
    with open(os.path.join(grid[2]["out_dir"], "log.jsonl"), "w") as f:
        f.write('{"kind": "config", "iter": 0}\n{"kind": "train", "iter": 400, "loss": 2.3456}\n'
                '{"kind": "eval", "iter": 400}\n{"kind": "tra')  # a line being written
    todo, running = [(None, grid[0]), (None, grid[1])], [(None, grid[2], None, None)]
    timing = {"seconds": 200.0, "steps": 1600}
    assert runs.progress(todo, running, timing, jobs=2) == (
        " (about 2 min left; running: c at 400/800 (loss 2.346))")
    assert runs.progress([], running, timing, 2) == (
        " (under a minute left; running: c at 400/800 (loss 2.346))")
    assert runs.progress(todo, [], {"seconds": 0.0, "steps": 0}, 2) == ""  # nothing known yet
    # read_log, which the live picture reads while runs train, skips the line being written
    assert [r["kind"] for r in runs.read_log(grid[2]["out_dir"])] == ["config", "train", "eval"]


def test_the_time_left_is_one_measure_wherever_it_is_said(tmp_path):
    """Made-up timings, 3 runs of 8,000 steps, 2 at a time, every run at 0.125 s a step (its
    start-up and final pass included): the time left is the same in each line said at one
    moment, and runs that have not finished count too. It jumped before (7 min, then 11, at
    the same step): the line of a run starting left that run out, and the finished runs' pace
    was divided by the runs side by side even where one run was left to train alone."""
    now = time.time()

    def run(name, step=None):
        cfg = {"out_dir": str(tmp_path / name), "max_iters": 8000}
        if step is not None:  # it has logged this step
            os.makedirs(cfg["out_dir"], exist_ok=True)
            with open(os.path.join(cfg["out_dir"], "log.jsonl"), "w") as f:
                f.write(json.dumps({"kind": "train", "iter": step, "loss": 2.0}) + "\n")
        return (name, cfg, None, None)
    # a finished (1,000 s for its 8,000 steps), b at 4,000 (500 s in), c about to start: b's
    # 4,000 steps beside c's 8,000, 8,000 x 0.125 s = 1,000 s, wherever it is said
    timing = {"seconds": 1000.0, "steps": 8000, "started": {"b": (now - 500, 0), "c": (now, 0)}}
    b, c = run("b", 4000), run("c")
    said = {"done a": runs.progress([c[:2]], [b], timing, 2),
            "[3/3] c: training": runs.progress([c[:2]], [b], timing, 2),  # as run_grid asks
            "30 s later, c at step 0": runs.progress([], [b, run("c", 0)], timing, 2)}
    assert {line: left.partition(";")[0] for line, left in said.items()} == {
        line: " (about 17 min left" for line in said}, said
    # no run finished yet: a and b at 3,200 after 400 s, c waiting: it follows one of them,
    # (4,800 + 8,000) x 0.125 s = 1,600 s
    timing = {"seconds": 0.0, "steps": 0, "started": {"a": (now - 400, 0), "b": (now - 400, 0)}}
    assert runs.progress([run("c")[:2]], [run("a", 3200), run("b", 3200)], timing, 2).startswith(
        " (about 27 min left; running: a at 3200/8000")
    # the last run alone: its own steps at a run's pace, not shared with an empty slot
    timing = {"seconds": 2000.0, "steps": 16000, "started": {"c": (now - 500, 0)}}
    assert runs.progress([], [run("c", 4000)], timing, 2).startswith(" (about 8 min left;")
    # one that has logged no step yet (start-up, or resumed) changes nothing
    timing = {"seconds": 1000.0, "steps": 8000, "started": {"b": (now - 999, 4000)}}
    assert runs.progress([run("c")[:2]], [run("b", 4000)], timing, 2).startswith(
        " (about 17 min left;")


def preset_grid(args, out, seeds=(1337,)):
    """The runs compare.py would make of these arguments (after its default preset)."""
    cfg = vars(compare.parse_args(compare.SETTINGS, [compare.DEFAULT_PRESET] + args, ""))
    return compare.build_grid(cfg, compare.parse_modes(cfg["modes"]), list(seeds), [("", {})],
                              str(out))


def test_paired_statistics_on_known_numbers():
    s = analysis.paired_stats([-0.03, -0.025, -0.02])  # mean -0.025, sd 0.005, t(2) = 4.303
    assert s["mean"] == pytest.approx(-0.025) and s["wins"] == 3
    half = 4.303 * 0.005 / math.sqrt(3)
    assert s["interval"] == pytest.approx([-0.025 - half, -0.025 + half])
    assert "beyond noise" in analysis.verdict(s)
    mixed = analysis.paired_stats([-0.03, 0.01, -0.01])
    assert mixed["wins"] == 2 and "not distinguishable" in analysis.verdict(mixed)
    assert analysis.paired_stats([0.5])["interval"] is None
    assert analysis.t975(1) == 12.706 and analysis.t975(1000) == pytest.approx(1.9623, abs=1e-3)


def test_crossing_interpolates_or_says_never():
    tokens, losses = [0, 100, 200, 300], [5.0, 3.0, 2.0, 1.5]
    assert analysis.crossing(tokens, losses, 2.5) == pytest.approx(150.0)
    assert analysis.crossing(tokens, losses, 2.0) == pytest.approx(200.0)
    assert analysis.crossing(tokens, losses, 1.0) is None  # the curve stays above


def test_hooked_attention_is_what_the_model_attends_with():
    """The weights the analysis hooks compute, applied to the layer's values,
    give the layer's output."""
    torch.manual_seed(0)
    for mode in model.VALUE_MODES:
        gpt = GPT(GPTConfig(n_layer=3, n_head=4, n_kv_head=2, n_embd=32, block_size=16,
                            vocab_size=64, value_mode=mode)).eval()
        x = torch.randint(64, (2, 12))
        outputs = []
        hook = gpt.transformer.h[2].attn.register_forward_hook(
            lambda m, a, out: outputs.append(out))
        attention, hidden = analysis.internals(gpt, x)
        gpt(x)
        hook.remove()
        att = attention[2]
        assert len(attention) == 3 and att.shape == (2, 4, 12, 12) and len(hidden) == 3
        assert (torch.allclose(att.sum(-1), torch.ones(2, 4, 12), atol=1e-5)
                and att.triu(1).abs().max() == 0)
        out, value = outputs[-1]
        y = att @ value.repeat_interleave(2, dim=1)  # (B, n_head, T, hd)
        y = gpt.transformer.h[2].attn.c_proj(y.transpose(1, 2).reshape(2, 12, 32))
        assert torch.allclose(y, out, atol=1e-5), mode


def test_attention_is_measured_as_the_model_computed_it_after_a_students_edit(monkeypatch):
    """Issue 46: the analysis recomputed q k^T from the layer's projection, so an edit that
    changes q or k on the way (RoPE, QK-norm) went unseen. A student's line before the attention
    call (here q rolled and scaled): the recorded weights still reproduce the layer's output."""
    import inspect
    import textwrap
    source = textwrap.dedent(inspect.getsource(model.CausalSelfAttention.forward))
    at = source.index("    y = F.scaled_dot_product_attention(")
    source = source[:at] + "    q = torch.roll(q, 1, dims=-1) * 3.0  # the student's line\n" \
        + source[at:]
    namespace = dict(vars(model))
    exec(source, namespace)
    monkeypatch.setattr(model.CausalSelfAttention, "forward", namespace["forward"])
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=64)).eval()
    x = torch.randint(64, (1, 10))
    outputs = []
    hook = gpt.transformer.h[1].attn.register_forward_hook(lambda m, a, out: outputs.append(out))
    attention, _ = analysis.internals(gpt, x)
    hook.remove()
    out, value = outputs[-1]
    y = attention[1] @ value
    y = gpt.transformer.h[1].attn.c_proj(y.transpose(1, 2).reshape(1, 10, 16))
    assert torch.allclose(y, out, atol=1e-5)


def test_without_matplotlib_tables_are_still_written(data_dir, tmp_path, capsys, monkeypatch):
    """matplotlib is optional: the tables are written, and no live picture is promised or
    drawn. That there will be no pictures is said at once, before any run trains (not only
    at the end, maybe hours later), also before a learning-rate search."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    runs_train = stand_in(lambda cfg: (2.0, [{"iter": 0, "tokens": 0, "val_loss": 5.0},
                                             {"iter": 2, "tokens": 128, "val_loss": 2.1}]))

    def run_grid(grid, *args, **kwargs):
        print("(the runs train)")
        return runs_train(grid, 1, 1, 1)
    patch_runs(monkeypatch, run_grid)
    out = tmp_path / "cmp"
    assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1337",
                                "--modes=vanilla,resformer"]) == 0
    assert (out / "results.md").is_file() and (out / "results.json").is_file()
    assert not list(out.glob("*.png"))
    printed = capsys.readouterr().out
    without = "pictures: matplotlib is not installed (pip install matplotlib): results.md only\n"
    assert printed.count(without) == 1 and printed.index(without) < printed.index("(the runs")
    assert LIVE_LINE not in printed  # no picture to see
    search = fake_runs({"vanilla": 0.01}, [])
    patch_runs(monkeypatch, lambda grid, *args, **kwargs: search(grid, 1, 1, 1))
    assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={tmp_path / 'tune'}",
                                "--tune", "--tune_seeds=1,2", "--seeds=1337", "--modes=vanilla",
                                "--tune_lrs=5e-3,1e-2,2e-2"]) == 0
    printed = capsys.readouterr().out
    assert printed.count(without) == 1 and printed.index(without) < printed.index("lr search")
    run_dir = out / "vanilla_seed1337"
    run_dir.mkdir()
    (run_dir / "log.jsonl").write_text("".join(json.dumps(
        {"kind": "eval", "iter": i, "tokens": 64 * i, "val_loss": 5.0 - i}) + "\n"
        for i in range(3)))
    assert plots.live_loss(str(out), [(("vanilla", 1337, ""), {"out_dir": str(run_dir)})]) is None
    assert not (out / "loss.png").exists() and capsys.readouterr().out == ""


def test_attention_entropy_uniform_and_one_key():
    T = 8
    uniform = torch.full((2, 3, T, T), 1.0 / T)  # every query spreads evenly over all T keys
    assert analysis.attention_entropy(uniform) == pytest.approx(math.log(T), abs=1e-6)
    one_key = torch.zeros(2, 3, T, T)
    one_key[..., 0] = 1.0  # every query looks only at key 0
    assert analysis.attention_entropy(one_key) == pytest.approx(0.0, abs=1e-6)


def test_similarity_identical_and_orthogonal_tokens():
    same = torch.randn(1, 1, 16).expand(2, 5, 16)
    assert analysis.token_similarity(same) == pytest.approx(1.0, abs=1e-6)
    assert analysis.token_similarity(torch.eye(4).unsqueeze(0)) == pytest.approx(0.0, abs=1e-6)


def test_modes_and_seeds_parsing():
    assert compare.parse_modes("vanilla, resformer_learnable,"
                               "svformer_kv1:n_layer=8:learning_rate=1e-3,value_embed") == [
        ("vanilla", dict(value_mode="vanilla", learnable_lambda=False, n_kv_head=0)),
        ("resformer_learnable", dict(value_mode="resformer", learnable_lambda=True, n_kv_head=0)),
        ("svformer_kv1:n_layer=8:learning_rate=1e-3",
         dict(value_mode="svformer", learnable_lambda=False, n_kv_head=1, n_layer=8,
              learning_rate=1e-3)),
        ("value_embed", dict(value_mode="value_embed", learnable_lambda=False, n_kv_head=0))]
    for bad in ("transformer", "svformer_learnable", "", "resformer:n_layer", "resformer:n_layer=x",
                "resformer:bogus=1", "resformer:n_layer=0"):
        with pytest.raises(ConfigError):
            compare.parse_modes(bad)


def test_seeds_are_a_list_and_one_number_is_that_seed():
    """--seeds=1 trains seed 1, not one seed counted from 1337: --seeds is always the seeds
    themselves, one or a list, also as recorded commands wrote one seed (7001,) and as a preset
    file's tuple arrives; compare's default names its eight seeds."""
    assert compare.parse_seeds("1") == [1] and compare.parse_seeds("3") == [3]
    assert compare.parse_seeds("0") == [0]
    assert compare.parse_seeds("1337,1338,1339") == [1337, 1338, 1339]
    assert compare.parse_seeds("7001,") == [7001]
    assert compare.parse_seeds("(1, 2, 5)") == [1, 2, 5] and compare.parse_seeds("(7,)") == [7]
    assert compare.parse_seeds(compare.SETTINGS["seeds"][0]) == list(range(1337, 1345))
    assert compare.parse_seeds(compare.SETTINGS["tune_seeds"][0], "tune_seeds") == [1, 2, 3, 4]
    with pytest.raises(ConfigError, match=r"--seeds=three: seeds are whole numbers >= 0, listed "
                                          r"with commas \(--seeds=1337,1338,1339; one seed: "
                                          r"--seeds=1337\)"):
        compare.parse_seeds("three")
    with pytest.raises(ConfigError, match="seeds are whole numbers >= 0"):
        compare.parse_seeds("-5,")  # refused once here, not by every train.py run
    with pytest.raises(ConfigError, match="--tune_seeds=,: need at least one seed"):
        compare.parse_seeds(",", "tune_seeds")
    with pytest.raises(ConfigError, match="a seed is listed twice"):
        compare.parse_seeds("1,2,01")


def test_a_mode_added_to_model_py_is_a_variant(monkeypatch):
    """A student's new mode in model.VALUE_MODES is a variant with no edit to compare.py (the
    end-to-end run: tests/test_own_mode.py), named in words in the pictures."""
    monkeypatch.setitem(model.VALUE_MODES, "gated", "gated residual")
    assert compare.parse_modes("vanilla,gated,gated_kv1:n_layer=3") == [
        ("vanilla", dict(value_mode="vanilla", learnable_lambda=False, n_kv_head=0)),
        ("gated", dict(value_mode="gated", learnable_lambda=False, n_kv_head=0)),
        ("gated_kv1:n_layer=3", dict(value_mode="gated", learnable_lambda=False, n_kv_head=1,
                                     n_layer=3))]
    with pytest.raises(ConfigError, match="_learnable applies to resformer only"):
        compare.parse_modes("gated_learnable")
    with pytest.raises(ConfigError, match="use vanilla, resformer, svformer, value_embed, gated"):
        compare.parse_modes("gatd")
    assert plots.label("gated_kv1") == "gated residual, 1 KV head"
    monkeypatch.delitem(model.VALUE_MODES, "gated")
    with pytest.raises(ConfigError, match="unknown mode 'gated'"):
        compare.parse_modes("gated")


def test_compare_settings_do_not_shadow_train_settings(tmp_path):
    assert not set(compare.COMPARE_SETTINGS) & set(train.SETTINGS)
    with pytest.raises(ConfigError, match="resume"):
        compare.main([f"--out_dir={tmp_path}", "--resume"])


@pytest.mark.parametrize("action", ["--overwrite", "--resume", "--resume=True"])
def test_train_actions_are_refused_not_ignored(tmp_path, action):
    """Issue 22: --overwrite was listed, accepted and ignored ("reusing ...")."""
    with pytest.raises(ConfigError, match=f"compare.py takes no {action}: the same command again "
                                          "reuses finished runs and resumes stopped ones from "
                                          "their checkpoints; to train them afresh, use another "
                                          "--out_dir"):
        compare.main([f"--out_dir={tmp_path}", action, "--modes=bogus"])
    assert action.split("=")[0][2:] not in compare.SETTINGS  # nor listed in --help


def one_line_error(monkeypatch, capsys, argv):
    """What `python compare.py ARGV` ends with: run_main's exit, in process (no training)."""
    monkeypatch.setattr(sys, "argv", ["compare.py", *argv])
    with pytest.raises(SystemExit) as stop:
        configurator.run_main(compare.main)
    assert capsys.readouterr().out == ""  # refused before anything is said or done
    return stop.value.code


# an impossible value for each numeric setting compare.py adds to train.py's
IMPOSSIBLE = {"jobs": -2, "escape_loss": -1, "analysis_samples": 0,
              "tune_extend": -1, "threads": 0, "noise_floor": -1}


def test_every_numeric_compare_setting_has_limits():
    numeric = {key for key, (default, *_) in compare.COMPARE_SETTINGS.items()
               if isinstance(default, (int, float)) and not isinstance(default, bool)}
    unlimited = {key for key in numeric if len(compare.COMPARE_SETTINGS[key]) < 3}
    assert not unlimited, f"numeric compare settings without limits: {unlimited}"
    assert set(IMPOSSIBLE) == numeric, "give IMPOSSIBLE a refused value for each"


@pytest.mark.parametrize("key", sorted(IMPOSSIBLE))
def test_impossible_settings_are_one_line(monkeypatch, capsys, tmp_path, key):
    """--jobs=-2 and the like: 'error: --jobs=-2: must be at least 0 (...)', exit 1."""
    value, (default, meaning, (low, _)) = IMPOSSIBLE[key], compare.COMPARE_SETTINGS[key]
    code = one_line_error(monkeypatch, capsys, [f"--out_dir={tmp_path / 'cmp'}",
                                                f"--{key}={value}"])
    shown = float(value) if isinstance(default, float) else value
    assert code == f"error: --{key}={shown}: must be at least {low} ({meaning})"
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize("argv,message", [
    (["--seeds=1,1"], "--seeds=1,1: a seed is listed twice; list each seed once"),
    (["--tune", "--tune_seeds=1,2,1"], "--tune_seeds=1,2,1: a seed is listed twice"),
    (["--seeds="], "--seeds=: need at least one seed, e.g. --seeds=1337,1338,1339"),
    # train.py's --seed has no meaning here (--seeds names every seed): refused before the modes
    (["--seed=42", "--modes=vanilla,bogus"], "compare.py takes no seed: --seeds lists the seeds "
                                            "to train (--seeds=42 for one, --seeds=42,43,44 for "
                                            "three)"),
    (["--modes=transformer"], "unknown mode 'transformer'"),
])
def test_impossible_seeds_and_modes_are_one_line(monkeypatch, capsys, tmp_path, argv, message):
    code = one_line_error(monkeypatch, capsys, [f"--out_dir={tmp_path / 'cmp'}", *argv])
    assert code.startswith("error: ") and "\n" not in code
    assert message in code, code
    assert not (tmp_path / "cmp").exists()


def test_help_lists_seeds_not_trains_one_seed(monkeypatch, capsys):
    """--seed is refused, so --help does not offer it; --seeds is what it lists."""
    monkeypatch.setattr(sys, "argv", ["compare.py", "--help"])
    with pytest.raises(SystemExit):
        configurator.run_main(compare.main)
    shown = capsys.readouterr()
    listed = re.findall(r"^  --(\w+) ", shown.out + shown.err, re.M)
    assert "seeds" in listed and "seed" not in listed


def test_a_run_of_an_older_version_is_refused_in_one_line(tmp_path):
    """A finished run is reused only with the same settings, and only if this version wrote it."""
    cfg = preset_grid([], tmp_path, seeds=[1])[0][1]
    assert not set(cfg) & {"resume", "overwrite"}
    os.makedirs(cfg["out_dir"])
    runs.write_json(os.path.join(cfg["out_dir"], "summary.json"), {"config": cfg, "status": "done"})
    assert runs.finished(cfg, cfg["out_dir"])["status"] == "done"
    with pytest.raises(ConfigError, match=r"holds a run with other settings \(n_layer: 16 "
                                          r"there, 3 now\)"):  # never replaced
        runs.finished(dict(cfg, n_layer=3), cfg["out_dir"])
    with open(os.path.join(cfg["out_dir"], "summary.json"), "w") as f:
        json.dump({"config": cfg, "status": "done"}, f)  # no format: an older version's
    with pytest.raises(DataError, match="written by an older version of compare.py: delete it"):
        runs.finished(cfg, cfg["out_dir"])
    summary = os.path.join(cfg["out_dir"], "summary.json")
    with open(summary, "w") as f:
        f.write('{"format": "value-residual-gpt/2", "config": {"lear')  # cut short
    with pytest.raises(DataError) as e:  # issue 46: it was a JSONDecodeError and a traceback
        runs.finished(cfg, cfg["out_dir"])
    assert str(e.value).startswith(f"{summary} is not whole JSON (") and "\n" not in str(e.value)
    assert f"restore it (git checkout -- {summary}), or delete {cfg['out_dir']}" in str(e.value)


def test_one_variant_without_vanilla_shorter_than_log_interval(data_dir, tmp_path, capsys,
                                                               monkeypatch):
    """Issue 22: without vanilla the results still spoke of the difference to vanilla; a run
    shorter than log_interval showed nan tokens/s; '1 runs'."""
    out = tmp_path / "cmp"
    args = [a for a in TINY if not a.startswith("--log_interval")] + ["--log_interval=5"]
    assert compare.main(args + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1337",
                                "--modes=resformer"]) == 0
    printed = capsys.readouterr().out
    assert f"1 run (1 variant x 1 seed), 2 at a time, 1 thread each, in {out}" in printed
    md = (out / "results.md").read_text()
    assert "vanilla" not in md and "nan" not in md and "| resformer | " in md
    assert "± 0.0000" not in md  # one seed: no spread
    assert "the same peak learning rate, 0.0085" in md
    summary = json.load(open(out / "resformer_seed1337" / "summary.json"))
    assert math.isfinite(summary["tokens_per_sec"]) and summary["tokens_per_sec"] > 0
    assert (out / "loss.png").is_file() == _has_matplotlib()


def test_ctrl_c_stops_the_comparison_and_the_same_command_continues(data_dir, tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) mid-run, after the run's
    first checkpoint: compare exits 130 without hanging, the run keeps its last checkpoint (from
    its last evaluation), and the same command again resumes that run from there, not from 0.
    A checkpoint of other settings in that folder is refused in one line, never replaced."""
    import signal
    out = tmp_path / "cmp"
    args = [a for a in TINY if not a.startswith(("--max_iters", "--lr_decay_iters",
                                                 "--eval_interval", "--log_interval", "--jobs"))]
    args += ["--max_iters=600", "--eval_interval=200", "--log_interval=10",
             f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1337",
             "--modes=vanilla", "--jobs=1", "--noise_floor=0"]  # (one run: the one stopped)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # A shell's background job starts with SIGINT ignored, and its children inherit that (then
    # Python keeps ignoring it): the run gets the default handler whatever started pytest.
    process = subprocess.Popen([sys.executable, "compare.py", *args], cwd=here,
                               start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ckpt_path = out / "vanilla_seed1337" / "ckpt.pt"
    deadline = time.time() + 120
    while time.time() < deadline and not ckpt_path.is_file():
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "run the same command again" in output
    stopped_at = load_checkpoint(str(ckpt_path))["iter_num"]
    assert 0 < stopped_at < 600 and stopped_at % 200 == 0
    assert not (out / "vanilla_seed1337" / "summary.json").exists()
    cfg = preset_grid(args, out)[0][1]  # the run compare.py makes of these arguments
    command, resuming = runs.command(cfg, cfg["out_dir"])
    assert resuming and command[-1] == "--resume"  # its checkpoint is this run's
    with pytest.raises(ConfigError, match=r"holds a run with other settings \(max_iters: 600 there, "
                                        r"700 now\): delete it, or compare into another --out_dir"):
        runs.command(dict(cfg, max_iters=700), cfg["out_dir"])
    assert compare.main(args) == 0
    log = runs.read_log(out / "vanilla_seed1337")
    steps = [r["iter"] for r in log if r["kind"] == "train"]
    # continued, no restart: the steps after the checkpoint once each, none lost
    assert steps[-1] == 600 and steps == list(range(10, 601, 10))
    assert [r["iter"] for r in log if r["kind"] == "config"] == [0, stopped_at]


def summary(cfg, val_loss_full, evals, status="done", **more):
    """A run's summary.json as run_grid returns it, with made-up numbers."""
    return {"status": status, "val_loss_full": val_loss_full, "config": cfg, "evals": evals,
            "num_params": 1, "kv_cache_bytes_per_token": 1, "tokens_per_sec": 1.0,
            "attention_entropy": [1.0], "similarity": [0.5], **more}


def stand_in(losses):
    """A run_grid that trains nothing: losses(cfg) -> (final loss, evals[, other numbers])."""
    def run_grid(grid, jobs, threads, samples, today=None, on_progress=None,
                 gpus=0):
        made = {key: losses(cfg) for key, cfg in grid}
        return {key: summary(cfg, final, evals, **(more[0] if more else {}))
                for (key, cfg), (final, evals, *more) in zip(grid, made.values())}, False, []
    return run_grid


# ---- the learning-rate search (--tune) ----

def test_next_lr_brackets_the_best_learning_rate():
    inf = float("inf")
    # an edge optimum extends the grid on that side by the edge's own step, up to the cap
    assert analysis.next_lr({1: 3, 2: 2, 4: 1}, lowest=0.1, highest=16) == 8
    assert analysis.next_lr({1: 1, 2: 2, 4: 3}, lowest=0.1, highest=16) == 0.5
    assert analysis.next_lr({1: 3, 2: 2, 4: 1}, lowest=0.1, highest=4) is None  # capped
    # an interior optimum with a coarse neighbour gets the midpoint (steps <= sqrt 2)
    assert analysis.next_lr({1: 3, 2: 1, 4: 3}, lowest=0.1, highest=16) == 1.41
    # bracketed with fine steps, twice the best on the grid: done
    assert analysis.next_lr({1: 3, 1.41: 2, 2: 1, 2.83: 2, 4: 2.5}, 0.1, 16) is None
    # ... but twice the best must be measured
    assert analysis.next_lr({1: 3, 1.41: 2, 2: 1, 2.83: 2}, 0.1, 16) == 4
    # a diverged run counts as worse, not as an error: the top point diverging brackets it
    assert analysis.next_lr({1: 3, 1.41: 2, 2: 1, 2.83: inf}, 0.1, 16) is None
    assert analysis.next_lr({1: 2, 1.41: inf}, 0.1, 16) == 0.709
    assert analysis.bracketed({1: 3, 2: 1, 4: inf}) and not analysis.bracketed({1: 3, 2: 1})
    spread = analysis.lr_range({1: 2.0, 1.41: 1.95, 2: 1.94, 2.83: 1.955, 4: inf})
    assert spread["good_lrs"] == [1.41, 2.83] and spread["loss_at_double"] == inf
    assert analysis.lr_range({1: 2.0, 2: 1.9, 2.83: 2.0, 4: 2.2})["loss_at_double"] == 2.2
    assert analysis.lr_range({1: 2.0, 2: 1.9})["loss_at_double"] is None


def fake_runs(optimum, calls):
    """A run_grid stand-in: the final loss is a U in log lr around each variant's optimum,
    diverged above 8x it; records every config it is asked to train."""
    def run_grid(grid, jobs, threads, samples, today=None, on_progress=None,
                 gpus=0):
        summaries = {}
        for key, cfg in grid:
            calls.append(cfg)
            lr, best = cfg["learning_rate"], optimum[cfg["value_mode"]]
            loss = 2 + math.log(lr / best) ** 2 + 0.01 * cfg["seed"] % 7
            summaries[key] = summary(
                cfg, None if lr > 8 * best else loss,
                [{"iter": 0, "tokens": 0, "val_loss": 5.0}, {"iter": 1, "tokens": 10,
                                                             "val_loss": loss}],
                status="diverged" if lr > 8 * best else "done")
        return summaries, False, []
    return run_grid


def test_leaving_the_plateau_is_measured_per_seed_and_paired(data_dir, tmp_path, monkeypatch):
    """The step each run's val loss first falls below escape_loss; paired in tokens against
    vanilla, a run that never leaves counted at its last tokens, not dropped."""
    assert analysis.escape([{"iter": 0, "tokens": 0, "val_loss": 5.5},
                            {"iter": 20, "tokens": 640, "val_loss": 2.95},
                            {"iter": 40, "tokens": 1280, "val_loss": 2.5}], 2.9) == [40, 1280]
    assert analysis.escape([{"iter": 0, "tokens": 0, "val_loss": 3.1}], 2.9) is None
    left_at = {("vanilla", 1): 140, ("vanilla", 2): None, ("resformer", 1): 60,
               ("resformer", 2): 100}

    def losses(cfg):
        at = left_at[cfg["value_mode"], cfg["seed"]]
        return 2.0, [{"iter": i, "tokens": 100 * i,
                      "val_loss": 2.0 if at is not None and i >= at else 3.2}
                     for i in range(0, 201, 20)]
    patch_runs(monkeypatch, stand_in(losses))
    assert compare.main(TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--seeds=1,2",
                                "--modes=vanilla,resformer"]) == 0
    results = json.load(open(tmp_path / "results.json"))["modes"]
    assert results["vanilla"]["escape"] == [[140, 14000], None]
    assert results["resformer"]["escape_paired"]["differences"] == [6000 - 14000, 10000 - 20000]
    assert results["resformer"]["escape_paired"]["wins"] == 2
    md = (tmp_path / "results.md").read_text()
    assert "## Leaving the early plateau (fixed-window val loss below 2.9)" in md
    assert "| vanilla | 140, never | - | - | - |" in md and "| resformer | 60, 100 | -9,000 |" in md


def test_tune_brackets_each_variant_and_compares_at_each_optimum(data_dir, tmp_path, monkeypatch,
                                                                capsys):
    calls = []
    patch_runs(monkeypatch, fake_runs({"vanilla": 0.01, "resformer": 0.02},
                                                       calls))
    assert compare.main(TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--tune",
                                "--tune_lrs=1e-3,2e-3,4e-3", "--tune_seeds=1,2", "--seeds=5,6",
                                "--modes=vanilla,resformer"]) == 0
    # the count and its factors agree; the paper's protocol's runs are named as extra
    printed = capsys.readouterr().out
    assert ("7 runs (2 variants x 2 seeds at their own best lr, and 2 at vanilla's best lr: "
            "the paper's protocol, and vanilla nudged on 1 seed: the noise floor)") in printed
    assert "WARNING" not in printed  # every best bracketed
    results = json.load(open(tmp_path / "results.json"))
    search = {n: {float(lr): v for lr, v in by_lr.items()}
              for n, by_lr in results["lr_search"].items()}
    for name, best in (("vanilla", 0.01), ("resformer", 0.02)):
        means = {lr: float(np.mean(v)) for lr, v in search[name].items()}
        found = min(means, key=means.get)
        assert abs(math.log(found / best)) < math.log(1.45) and analysis.bracketed(means)
        assert max(means) >= 2 * found * 0.99  # twice the best measured
        assert results["info"]["best_lrs"][name] == found
    # search seeds only in the search, reported seeds only after it
    search_runs = [c for c in calls if "lr_search" in c["out_dir"]]
    final_runs = [c for c in calls if "lr_search" not in c["out_dir"]]
    assert {c["seed"] for c in search_runs} == {1, 2} and {c["seed"] for c in final_runs} == {5, 6}
    best = results["info"]["best_lrs"]
    # fair: each at its own best; the paper's protocol: all at vanilla's
    lrs = {(c["value_mode"], c["max_iters"], c["learning_rate"]) for c in final_runs}
    assert lrs == {("vanilla", 2, best["vanilla"]), ("resformer", 2, best["resformer"]),
                   ("resformer", 2, best["vanilla"])}
    # the noise floor: vanilla at its own best lr again, nudged, on the first reported seed
    assert [(c["value_mode"], c["seed"], c["learning_rate"]) for c in final_runs
            if c.get("nudge")] == [("vanilla", 5, best["vanilla"])]
    assert [os.path.basename(c["out_dir"]) for c in final_runs if c.get("nudge")] == [
        f"vanilla-nudge=1_lr{best['vanilla']:g}_seed5"]  # named by its lr, like the others
    assert results["modes"][analysis.FLOOR]["paired"]["n"] == 1
    assert all(c["min_lr"] == pytest.approx(c["learning_rate"] / 10, rel=0.01) for c in calls)
    assert results["paper_protocol"]["resformer"]["paired"]["n"] == 2
    md = (tmp_path / "results.md").read_text()
    assert "## Learning-rate search" in md and "The paper's protocol" in md and "| yes |" in md
    assert (tmp_path / "lr_search.png").is_file() == _has_matplotlib()
    with pytest.raises(ConfigError, match="must not be the ones"):
        compare.main(TINY + [f"--out_dir={tmp_path}", "--tune", "--tune_seeds=1,2",
                             "--seeds=2,3"])


def test_tune_warns_when_the_best_is_the_grids_edge(data_dir, tmp_path, monkeypatch, capsys):
    """vanilla's optimum (0.1) lies beyond a grid that --tune_extend=0 may not extend: the best
    found, 4e-3, is its edge, said in a WARNING line and in the search table; resformer's
    (2e-3) is bracketed and not warned about."""
    patch_runs(monkeypatch, fake_runs({"vanilla": 0.1, "resformer": 2e-3}, []))
    assert compare.main(TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--tune",
                                "--tune_lrs=1e-3,1.41e-3,2e-3,2.83e-3,4e-3", "--tune_extend=0",
                                "--tune_seeds=1,2", "--seeds=5,6", "--modes=vanilla,resformer"
                                ]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "WARNING" in line]
    assert warnings == ["WARNING: vanilla's best, 0.004, is the edge of the grid searched "
                        "(--tune_extend=0 reached): not a bracketed optimum; widen --tune_lrs or "
                        "raise --tune_extend"]
    md = (tmp_path / "results.md").read_text()
    assert re.search(r"\| vanilla \|.*\| 0\.004 \| NO \(grid capped\) \|", md)
    assert re.search(r"\| resformer \|.*\| 0\.002 \| yes \|", md)


def test_lrs_trains_each_named_variant_at_its_own_peak_lr(data_dir, tmp_path, monkeypatch):
    """--lrs (what --tune prints): named variants at their own lr, min_lr following; the others
    at learning_rate; mistakes in one line."""
    calls = []
    patch_runs(monkeypatch, fake_runs({"vanilla": 0.01, "resformer": 0.02,
                                                        "svformer": 0.01}, calls))
    args = TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--seeds=5",
                   "--modes=vanilla,resformer,svformer",
                   "--learning_rate=3e-3", "--min_lr=3e-4"]
    assert compare.main(args + ["--lrs=vanilla=1e-2,resformer=2e-2"]) == 0
    lrs = {(c["value_mode"], c["max_iters"], c["learning_rate"], c["min_lr"]) for c in calls}
    assert lrs == {("vanilla", 2, 1e-2, 1e-3), ("resformer", 2, 2e-2, 2e-3),
                   ("svformer", 2, 3e-3, 3e-4)}
    results = json.load(open(tmp_path / "results.json"))
    assert results["info"]["peak_lrs"] == {"vanilla": 1e-2, "resformer": 2e-2, "svformer": 3e-3}
    assert "own peak learning rate (vanilla 0.01, resformer 0.02" in (
        tmp_path / "results.md").read_text()
    # a variant this command does not train (a preset's lrs for all three) is not an error
    calls.clear()
    assert compare.main(args + ["--modes=vanilla",
                                "--lrs=vanilla=1e-2,resformer_kv1=5e-3"]) == 0
    assert {(c["value_mode"], c["learning_rate"]) for c in calls} == {("vanilla", 1e-2)}
    for bad in ("--lrs=vanila=1e-2", "--lrs=vanilla=fast", "--lrs=vanilla=-1"):
        with pytest.raises(ConfigError, match="is not variant=learning_rate"):
            compare.main(args + [bad])


def test_tune_counts_a_diverged_run_as_worse(data_dir, tmp_path, capsys):
    """Real tiny runs: lr 1e6 diverges; the search goes on and picks the finite one, which is
    the grid's lower edge (--tune_extend=0: no room to look below): a WARNING says so."""
    out = tmp_path / "tune"
    assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--tune",
                                "--tune_lrs=1e-2,1e6", "--tune_extend=0", "--tune_seeds=1",
                                "--seeds=1337", "--modes=vanilla"]) == 0
    results = json.load(open(out / "results.json"))
    assert math.isinf(results["lr_search"]["vanilla"]["1e+06"][0])
    assert results["info"]["best_lrs"] == {"vanilla": 0.01}
    summary_ = json.load(open(out / "lr_search" / "vanilla_lr1e06_seed1" / "summary.json"))
    assert summary_["status"] == "diverged"
    assert any(r["kind"] == "diverged" for r in runs.read_log(out / "lr_search" /
                                                              "vanilla_lr1e06_seed1"))
    assert "inf" in (out / "results.md").read_text()
    assert (out / "vanilla_lr0.01_seed1337" / "summary.json").is_file()
    assert ("WARNING: vanilla's best, 0.01, is the edge of the grid searched (--tune_extend=0 "
            "reached)") in capsys.readouterr().out


def test_data_refused_once_before_any_run(data_dir, tmp_path):
    """A dataset train.py would refuse (meta.json names a shard that is gone) stops compare.py
    with data.py's one line before any run starts."""
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copytree(data_dir, broken, dirs_exist_ok=True)
    for shard in data.list_shards(str(broken), "train"):
        os.remove(shard)
    with pytest.raises(DataError, match="is missing, though .*meta.json names it: run prepare.py"):
        compare.main(TINY + [f"--dataset={broken}", f"--out_dir={tmp_path / 'cmp'}", "--seeds=1337",
                             "--modes=vanilla"])
    assert not (tmp_path / "cmp" / "vanilla_seed1337").exists()
    with pytest.raises(DataError, match="no train shards"):
        compare.main(TINY + [f"--dataset={tmp_path / 'nothing'}", f"--out_dir={tmp_path / 'cmp'}",
                             "--seeds=1337", "--modes=vanilla"])
    assert issubclass(DataError, UserError)  # so run_main says it in one line


def test_a_run_that_fails_before_its_log_is_reported_not_a_crash(tmp_path, monkeypatch, capsys):
    """train.py exiting with a user's mistake before it writes log.jsonl: FAILED with that one
    line."""
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit('error: this data is refused')\n")
    monkeypatch.setattr(runs, "TRAIN_PY", str(script))
    cfg = {"out_dir": str(tmp_path / "run"), "max_iters": 2}
    summaries, interrupted, failed = runs.run_grid([(("vanilla", 1, ""), cfg)], 1, 1, 1)
    assert (summaries, interrupted, failed) == ({}, False, [cfg["out_dir"]])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"    FAILED {cfg['out_dir']} (exit 1): error: this data is refused")


def test_a_failed_run_says_why_in_a_few_lines(tmp_path, monkeypatch, capsys):
    """A bug: the innermost frame of the traceback in the project's files (a library in a
    virtual environment inside the project is not the project's), its code, the error and where
    the whole traceback is. A user's mistake (train.py's 'error: ...'): that line alone, though
    train.out keeps the earlier attempt's traceback. Anything else: the last lines."""
    project = tmp_path / "project"
    library = project / ".venv" / "lib" / "python3.11" / "site-packages"
    (library / "tensors").mkdir(parents=True)
    (library / "tensors" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (project / "mymodel.py").write_text("import tensors\n\n\ndef forward(x):\n"
                                        "    return tensors.add(x, 'a string')\n")
    monkeypatch.setattr(runs, "TRAIN_PY", str(project / "train.py"))
    cfg = {"out_dir": str(tmp_path / "out" / "gated_seed1"), "max_iters": 2}
    out = os.path.join(cfg["out_dir"], "train.out")

    def attempt(source):
        (project / "train.py").write_text("import sys\nprint('settings: ...', flush=True)\n"
                                          + source)
        capsys.readouterr()
        assert runs.run_grid([(("gated", 1, ""), cfg)], 1, 1, 1)[2] == [cfg["out_dir"]]
        return capsys.readouterr().out.splitlines()[1:]  # after "[1/1] ...: training"
    assert attempt(f"sys.path.insert(0, {str(library)!r})\nimport mymodel\n"
                   "mymodel.forward(1)\n") == [
        f"    FAILED {cfg['out_dir']} (exit 1):",
        f'        File "{project / "mymodel.py"}", line 5, in forward',
        "          return tensors.add(x, 'a string')",
        "      TypeError: unsupported operand type(s) for +: 'int' and 'str'",
        f"      the whole traceback: {out}"]
    assert attempt("sys.exit('error: --device=cuda: this torch sees no CUDA GPU; use "
                   "--device=cpu')\n") == [
        f"    FAILED {cfg['out_dir']} (exit 1): error: --device=cuda: this torch sees no CUDA "
        f"GPU; use --device=cpu"]
    assert "Traceback" in open(out).read()  # the first attempt's, kept
    assert attempt("import os\nprint('step 1', flush=True)\nos.kill(os.getpid(), 9)\n") == [
        f"    FAILED {cfg['out_dir']} (killed by signal 9):", "      settings: ...",
        "      step 1", f"      its whole output: {out}"]


def test_failed_runs_end_the_command_in_one_line(capsys):
    """After the runs (each failure said as it happened): which failed, and what to do."""
    assert compare.failures(["out/gated_seed1", "out/gated_seed2"], 6) == 1
    assert compare.failures(["out/lr_search/vanilla_lr0.01_seed1"]) == 1  # a search's round
    assert capsys.readouterr().out.splitlines() == [
        "2 of 6 runs failed (gated_seed1, gated_seed2): fix it and run the same command again; "
        "finished runs are reused",
        "1 run of the learning-rate search failed (vanilla_lr0.01_seed1): fix it and run the "
        "same command again; finished runs are reused"]


def test_a_bug_in_model_py_is_shown_where_it_is_and_no_tables_pretend(data_dir, tmp_path):
    """A student's shape error in model.py (README, "Add your own mode"): compare.py shows
    the traceback's frame in model.py with its code, not torch's, and the error, names train.out
    for the whole traceback, trains the other runs, then ends in one line and exit 1 rather than
    in tables without that variant and a verdict of nothing to compare."""
    root = Path(__file__).resolve().parent.parent
    project = tmp_path / "project"
    project.mkdir()
    for name in ("model.py", "train.py", "compare.py", "prepare.py", "data.py",
                 "configurator.py"):
        shutil.copy(root / name, project / name)
    for folder in ("lab", "config"):
        shutil.copytree(root / folder, project / folder)
    source = (project / "model.py").read_text()
    right = "value = lambda_1 * first_value + lambda_2 * v"
    assert source.count(right) == 1
    (project / "model.py").write_text(source.replace(right, right + ".transpose(2, 3)"))
    line = next(n for n, text in enumerate(source.splitlines(), 1) if right in text)
    result = subprocess.run([sys.executable, "compare.py", *TINY, f"--dataset={data_dir}",
                             "--out_dir=out-bug", "--seeds=1337", "--modes=vanilla,resformer"
                             ], cwd=project, capture_output=True, text=True,
                            timeout=300)
    printed = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    at = printed.index("    FAILED out-bug/resformer_seed1337 (exit 1):")
    assert re.fullmatch(rf'        File ".*project/model\.py", line {line}, in forward',
                        printed[at + 1]), printed[at + 1]
    assert printed[at + 2].strip().startswith(right + ".transpose(2, 3)")  # its code
    assert printed[at + 3].startswith("      RuntimeError: The size of tensor a (")
    assert printed[at + 4] == "      the whole traceback: out-bug/resformer_seed1337/train.out"
    assert "Traceback" in (project / "out-bug" / "resformer_seed1337" / "train.out").read_text()
    assert "site-packages" not in result.stdout  # no frame of torch's
    assert re.fullmatch(r"1 of \d runs failed \(resformer_seed1337\): fix it and run the same "
                        r"command again; finished runs are reused", printed[-1]), printed[-1]
    assert (project / "out-bug" / "vanilla_seed1337" / "summary.json").is_file()  # reusable
    assert "Verdict" not in result.stdout and not (project / "out-bug" / "results.md").exists()


def test_results_open_with_the_verdict_and_table_the_gap_along_the_run(data_dir, tmp_path,
                                                                        monkeypatch):
    """One computed sentence first; then the paired fixed-window gap at the asked steps, from
    the same runs: here resformer gains 0.1 early and nothing at the end, and svformer's 0.000
    at the end is within what rounding alone moved vanilla (the noise floor, 0.002)."""
    def losses(cfg):
        early = {"vanilla": 0.0, "resformer": -0.1, "svformer": 0.05}[cfg["value_mode"]]
        evals = [{"iter": i, "tokens": 100 * i, "val_loss": 3.0 - i / 100 + cfg["seed"] / 100
                  + (early if i <= 100 else 0.0)} for i in range(0, 201, 20)]
        final = {"vanilla": 2.0, "resformer": 1.9, "svformer": 2.0}[cfg["value_mode"]]
        return final + cfg["seed"] / 1000 + 0.002 * cfg.get("nudge", 0), evals  # (the floor)
    patch_runs(monkeypatch, stand_in(losses))
    args = TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--seeds=1,2,3",
                   "--modes=vanilla,resformer,svformer", "--max_iters=200",
                   "--eval_interval=20"]
    with pytest.raises(ConfigError, match="gap_steps=50: the loss is measured every"):
        compare.main(args + ["--gap_steps=50"])
    assert compare.main(args + ["--gap_steps=40,200"]) == 0
    gap = json.load(open(tmp_path / "results.json"))["modes"]["resformer"]["gap"]
    assert gap["40"]["differences"] == pytest.approx([-0.1] * 3)
    assert gap["200"]["differences"] == pytest.approx([0.0] * 3)
    md = (tmp_path / "results.md").read_text().splitlines()
    assert md[2].startswith("**Verdict on 3 seeds at 200 steps (final val loss, nats per byte, "
                            "variant - vanilla per seed, 95% interval; beyond noise: the interval "
                            "excludes 0 and the mean exceeds the rounding floor; the count of "
                            "seeds lower is said but decides nothing, as another CPU's rounding "
                            "can turn one seed's sign): resformer (-0.100 [")
    assert md[2].endswith(
        "resformer (-0.100 [-0.1000, -0.1000], lower on 3 of 3; by chance alone 1 in 8) is lower "
        "than vanilla beyond noise; svformer (+0.000 [+0.0000, +0.0000], lower on 0 of 3) is "
        "within the rounding floor. Rounding alone (vanilla with its initial weights nudged one float32 step: the "
        "same run rounded differently, as on another CPU) moved the final loss by 0.0020 (one "
        "draw): a mean difference smaller than that is no result, whatever its interval.**")
    assert next(line for line in md if line.startswith("| svformer |")).endswith(
        "| within the rounding floor (±0.0020): not a result |")
    assert next(line for line in md if line.startswith("| vanilla:nudge=1 (")).endswith(
        "| +0.0020 | +0.0020 | - | 0 of 1 | the noise floor: rounding alone |")
    row = next(line for line in md if line.startswith("| resformer | -0.1000 [-0.1000, -0.1000]"))
    assert row.endswith("| +0.0000 [+0.0000, +0.0000], 0 of 3 |")
    # without --gap_steps: a quarter, half, three quarters and the end
    assert compare.main(args) == 0
    gap = json.load(open(tmp_path / "results.json"))["modes"]["svformer"]["gap"]
    assert list(gap) == ["40", "100", "140", "200"]
    assert gap["100"]["mean"] == pytest.approx(0.05) and gap["140"]["mean"] == pytest.approx(0)


def test_the_docstrings_commands_plan_as_written(data_dir, tmp_path, monkeypatch):
    """Every command in compare.py's docstring plans its runs as written (here on a tiny
    dataset, and nothing trains), and the first says what config/compare.py trains: its
    variants, its number of seeds, no ResFormer on less data when the preset has none."""
    root = Path(__file__).resolve().parent.parent
    text = compare.__doc__.replace("\\\n", " ")  # a command continued on the next line
    commands = [shlex.split(line, comments=True) for line in text.splitlines()
                if line.strip().startswith("python compare.py")]
    assert len(commands) >= 5
    planned = []

    def run_grid(grid, *args, **kwargs):  # what would train; then a Ctrl-C: no tables
        planned.append(grid)
        return {}, True, []
    patch_runs(monkeypatch, run_grid)
    monkeypatch.chdir(tmp_path)  # (the out_dirs they name)
    for command in commands:
        argv = [str(root / a) if a.endswith(".py") else a for a in command[2:]]
        assert compare.main(argv + [f"--dataset={data_dir}"]) == 130, command
    preset = configurator.read_preset(compare.DEFAULT_PRESET)
    variants = {name for (name, _, _), _ in planned[0]} - {getattr(analysis, "FLOOR", None)}
    assert variants == set(compare.SETTINGS["modes"][0].split(","))
    # one source of each default (issue 46): the preset holds what only its shape decides
    assert not set(preset) & (set(compare.COMPARE_SETTINGS) - {"lrs"})
    said = compare.__doc__.split("python compare.py\n")[0].rsplit("config/compare.py:", 1)[1]
    words = {"vanilla": "vanilla", "svformer": "SVFormer",
             "resformer:lambda_1=2:lambda_2=1": "the lambda = 2 mix"}
    assert all(words[name] in said for name in variants), said
    seeds = {seed for (_, seed, _), _ in planned[0]}
    assert f"on {len(seeds)} seeds" in said and seeds == set(range(1337, 1345))


def test_the_demo_is_the_default_comparison_on_one_seed():
    """config/demo.py builds on compare's default preset and changes only the seeds (one), the
    folder, how many run at once (all: its variants and the noise floor) and the calibration: the
    same model, data, steps and learning rates, so what the demo shows is what the default
    measures on 8 seeds (README, "What a class will see")."""
    from configurator import read_preset
    root = Path(__file__).resolve().parent.parent
    demo_path = root / "config" / "demo.py"
    lines = [line for line in demo_path.read_text().splitlines() if not line.startswith("#")]
    assert lines[0] == 'base = "compare.py"'  # builds on it (a base must come first)
    demo, full = read_preset(str(demo_path)), read_preset(str(root / "config" / "compare.py"))
    assert compare.parse_seeds(demo.pop("seeds")) == [1337] and len(compare.parse_seeds(
        compare.SETTINGS["seeds"][0])) == 8
    jobs, out_dir, calibration = demo.pop("jobs"), demo.pop("out_dir"), demo.pop("calibration")
    modes = compare.SETTINGS["modes"][0].split(",")
    assert demo == full and out_dir == "out-demo" and jobs == len(modes) + 1  # and the floor
    assert len(calibration.split(",")) == 2  # the 20 committed seeds


def test_one_seed_states_its_differences_and_own_lrs_are_named(data_dir, tmp_path, monkeypatch):
    """One seed: the differences beside the noise floor, and no claim (in nats per byte, the
    byte tokenizer's unit). Every variant's lr named in --lrs, all equal:
    said as one lr, named per variant (so also the paper's protocol), not as 'its own' lr."""
    patch_runs(monkeypatch, stand_in(lambda cfg: (
        {"vanilla": 2.0, "svformer": 2.05}[cfg["value_mode"]],
        [{"iter": 0, "tokens": 0, "val_loss": 5.0}, {"iter": 2, "tokens": 10, "val_loss": 2.5}])))
    assert compare.main(TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--seeds=1337",
                                "--modes=vanilla,svformer",
                                "--lrs=vanilla=3e-3,svformer=3e-3"]) == 0
    md = (tmp_path / "results.md").read_text()
    assert ("\nEvery variant at the same peak learning rate, 0.003 (all named by --lrs): one lr "
            "for all, as in the paper's protocol.\n") in md
    assert "its own peak learning rate" not in md
    assert ("\n**Verdict: one seed (1337), so each difference is one draw.** Final val loss - "
            "vanilla's (nats per byte):\n\n- svformer: +0.050; no other seeds of this setting to "
            "show beside it (another seed can move it much further than rounding does)\n") in md
    assert ("Rounding alone (vanilla with its initial weights nudged one float32 step, one draw "
            "on this seed) moved the final loss by 0.0000: what another CPU or thread count does "
            "to a run. It is the only band here; another seed moves a difference much further "
            "(--calibration, or --seeds=1337,1338,1339 for an interval).") in md
    # a variant --lrs does not name trains at the preset's lr, and results.md says which
    assert compare.main(TINY + [f"--out_dir={tmp_path}/b", f"--dataset={data_dir}",
                                "--seeds=1337", "--modes=vanilla,svformer",
                                "--lrs=vanilla=3e-3", "--learning_rate=2e-3"]) == 0
    md = (tmp_path / "b" / "results.md").read_text()
    assert ("\nEach variant at its own peak learning rate (vanilla 0.003, svformer 0.002) (named "
            "by --lrs for vanilla; svformer at the preset's learning_rate).\n") in md


# ---- issue 45: one seed with what other seeds did; issue 46: compare's traps ----

def test_a_one_seed_difference_is_shown_with_where_other_seeds_put_it(data_dir, tmp_path):
    """--calibration: a folder with this setting's runs on other seeds. For each variant the
    band at the end (results.json's band, band_source "seeds", the picture's shading) is those
    seeds' lowest to highest difference, never narrower; a variant whose runs there have other
    settings gets none, said in one line, and its band is rounding's."""
    common = TINY + [f"--dataset={data_dir}", "--modes=vanilla,svformer", "--lrs="]
    assert compare.main(common + [f"--out_dir={tmp_path / 'cal'}", "--seeds=1,2,3",
                                  "--noise_floor=0"]) == 0
    cal = json.load(open(tmp_path / "cal" / "results.json"))["modes"]["svformer"]["paired"]
    assert compare.main(common + [f"--out_dir={tmp_path / 'one'}", "--seeds=7",
                                  f"--calibration={tmp_path / 'cal'}"]) == 0
    r = json.load(open(tmp_path / "one" / "results.json"))["modes"]["svformer"]
    assert r["band_source"] == "seeds" and r["band_seeds"] == [1, 2, 3]
    assert r["band"] == [min(cal["differences"]), max(cal["differences"])]
    md = (tmp_path / "one" / "results.md").read_text()
    assert f"- svformer: {r['paired']['mean']:+.3f}; on the other seeds " \
           f"{r['band'][0]:+.3f} to {r['band'][1]:+.3f}" in md
    assert "where the same difference fell on 3 other seeds" in md and "50% of the time" in md
    # another setting (here 3 steps, not 2) is not this setting's spread: not used
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert compare.main(common + [f"--out_dir={tmp_path / 'other'}", "--seeds=7",
                                      "--max_iters=3", f"--calibration={tmp_path / 'cal'}"]) == 0
    r = json.load(open(tmp_path / "other" / "results.json"))
    assert r["modes"]["svformer"]["band_source"] == "rounding"
    assert "holds a run with other settings (max_iters: 2 there, 3 now" in \
        r["info"]["calibration"]["unused"]["vanilla"]


def test_the_demo_band_is_the_recorded_seed_spread(tmp_path):
    """The demo's preset names a calibration committed in docs/results: every variant of the
    demo finds its runs there, and the band the demo draws is exactly those seeds' spread (a
    band narrower than the recorded spread fails here), wider than rounding alone."""
    preset = configurator.read_preset(str(Path(compare.__file__).parent / "config" / "demo.py"))
    cfg = vars(configurator.parse_args(compare.SETTINGS, [
        str(Path(compare.__file__).parent / "config" / "demo.py")], ""))
    modes = compare.own_lrs(compare.parse_modes(cfg["modes"]), cfg)
    root = Path(compare.__file__).parent
    cwd = os.getcwd()
    prepare.prepare(configurator.defaults(prepare.SETTINGS, quiet=True,
                                          out_root=str(tmp_path / "data")))  # the probe's data
    os.chdir(tmp_path)  # the preset's folders are found in the project, from anywhere
    try:
        today = probe.Probes(str(tmp_path))
        today.force = False
        cal = compare.calibrated(cfg, modes, compare.parse_seeds(cfg["seeds"]), today)
    finally:
        os.chdir(cwd)
    assert cal["folder"] == preset["calibration"] and len(cal["seeds"]) >= 20 and not cal["unused"]
    assert set(cal["modes"]) == {n for n, _ in modes} - {"vanilla"}
    for name, c in cal["modes"].items():
        finals = {}
        for seed in cal["seeds"]:  # straight from the committed records
            for variant in ("vanilla", name):
                run = compare.build_grid(cfg, [(variant, dict(modes)[variant])], [seed],
                                         [("", {})], "")[0][1]["out_dir"]
                path = next(root / f / run / "summary.json"
                            for f in preset["calibration"].split(",")
                            if (root / f / run / "summary.json").exists())
                finals[variant, seed] = json.load(open(path))["val_loss_full"]
        spread = [finals[name, s] - finals["vanilla", s] for s in cal["seeds"]]
        results = {"vanilla": {"seeds": [1337]},
                   name: {"paired": analysis.paired_stats([0.0]), "seeds": [1337]}}
        analysis.bands(results, cal)
        assert results[name]["band"] == [min(spread), max(spread)]
        assert max(spread) - min(spread) > 0.03  # far wider than a nudge moves a 250-step run


def test_compares_traps_for_a_student(data_dir, tmp_path, capsys):
    """A mode named in VALUE_MODES is that mode whatever its name ends with (a student's
    'gated_kv2' was read as gated with 2 KV heads); a noise floor on more seeds than there are
    is refused, not cut to fit; the floor's settings are its name's; a preset named on the
    command line no longer brings compare.py's old defaults (ResFormer on 85% of the tokens)."""
    import model as model_module
    model_module.VALUE_MODES["gated_kv2"] = "a student's mode"
    try:
        (name, settings), = compare.parse_modes("gated_kv2")
        assert settings["value_mode"] == "gated_kv2" and settings["n_kv_head"] == 0
    finally:
        del model_module.VALUE_MODES["gated_kv2"]
    assert compare.parse_modes("svformer_kv2")[0][1]["n_kv_head"] == 2
    assert dict(compare.parse_modes(analysis.FLOOR))[analysis.FLOOR]["nudge"] == 1
    with pytest.raises(ConfigError, match="--noise_floor=2: the floor is trained on that many "
                                          "of the seeds, and --seeds names 1"):
        compare.main(TINY + [f"--dataset={data_dir}", "--seeds=1", "--noise_floor=2"])
    quickstart = str(Path(compare.__file__).parent / "config" / "quickstart.py")
    assert compare.main([quickstart, f"--dataset={data_dir}", f"--out_dir={tmp_path}",
                         "--plan", "--max_iters=2"]) == 0
    planned = capsys.readouterr().out
    assert "--max_iters=2 " in planned and "--max_iters=1 " not in planned  # no 85% run
    assert planned.count("python train.py") == len(compare.SETTINGS["modes"][0].split(",")) * len(
        compare.parse_seeds(compare.SETTINGS["seeds"][0])) and planned.count(
        "python -m lab.nudged") == 1


def test_the_interval_decides_and_the_signs_are_said_beside_it():
    """Lower on 8 of 8 seeds, one far lower: the t interval includes 0, so no verdict of a size,
    with the signs said (1 in 256 by chance). 7 of 8 and 6 of 8 with the same interval get the
    same verdict: one seed's sign, which another CPU's rounding can turn, moves no verdict. A
    mean within the rounding floor is no result whatever its signs."""
    skewed = analysis.paired_stats([-0.01] * 7 + [-1.0])
    assert skewed["interval"][1] > 0 and skewed["p_lower"] == 1 / 256
    assert analysis.verdict(skewed, floor=0.002) == (
        "not distinguishable from vanilla (the 95% interval includes 0; lower on 8 of 8 seeds: "
        "chance alone, 1 in 256)")
    seven = analysis.paired_stats([-0.05] * 7 + [0.01])
    assert analysis.verdict(seven, 0.002) == ("below vanilla, beyond noise (the 95% interval "
                                              "excludes 0; lower on 7 of 8 seeds: chance "
                                              "alone, 1 in 28)")
    higher = analysis.paired_stats([0.03] * 7 + [0.0])  # a tie counts as neither
    assert analysis.verdict(higher, 0.002) == ("above vanilla, beyond noise (the 95% interval "
                                               "excludes 0; higher on 7 of 8 seeds: chance "
                                               "alone, 1 in 28)")
    assert analysis.verdict(skewed, floor=0.2).startswith("within the rounding floor")


def test_the_default_comparisons_verdicts_do_not_flip_with_the_rounding():
    """The committed default comparison, on its own seeds and on 8 new ones, each at 1 thread and
    2 threads per run: every variant gets the same verdict under both roundings. (The sign test
    as a verdict had flipped lambda = 2 on seeds 1337-1344: 7 of 8 lower at 1 thread, 6 of 8 at
    2.)"""
    said = {}
    for folder in ("default", "default_2threads", "default_check", "default_check_2threads"):
        results = json.load(open(Path(compare.__file__).parent / "docs" / "results" / folder /
                                 "results.json"))["modes"]
        floor = analysis.noise_floor(results)
        said[folder] = {name: analysis.verdict(r["paired"], floor).split(" (")[0]
                        for name, r in results.items()
                        if r.get("paired") and name != analysis.FLOOR}
    assert said["default"] == said["default_2threads"] and len(said["default"]) == 2
    assert said["default_check"] == said["default_check_2threads"]
    assert set(said["default_check"].values()) == {"below vanilla, beyond noise"}


def test_a_calibration_folder_that_is_not_there_is_an_error_not_ignored(data_dir, tmp_path):
    """--calibration names folders of compare.py runs: a misspelt one (or one not committed) is
    one line naming it, before anything trains; never a demo quietly without its band."""
    with pytest.raises(ConfigError, match=r"--calibration=docs/results/no_such: no comparison "
                                          r"there \(no results.json\)"):
        compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={tmp_path / 'out'}",
                             "--seeds=1", "--calibration=docs/results/no_such"])
    assert not (tmp_path / "out").exists()


def test_a_demo_seed_outside_its_calibration_is_said_in_bold_and_the_table_cell():
    """One seed whose difference falls outside the calibration's range (as 1 in 11 seeds does
    against 20 others): said in bold where its difference is given, and in the table's cell;
    what held on every seed counts this seed too."""
    cal = {"seeds": [1, 2, 3], "folder": "docs/results/cal", "machines": ["CPU A"]}
    compared = {name: {"paired": analysis.paired_stats([d]), "band_source": "seeds",
                       "band": [-0.3, -0.1], "band_seeds": [1, 2, 3], "kv_cache_bytes_per_token":
                       256, "calibration": {"final": [-0.3, -0.2, -0.1]}}
                for name, d in (("svformer", -0.45), ("resformer", -0.2))}
    results = {"vanilla": {"kv_cache_bytes_per_token": 256}, **compared}
    info = {"seeds": [1337], "calibration": cal, "steps": 250, "hardware": "CPU A"}
    text = tables.one_seed_verdict(results, compared, info, 0.002, "byte")
    assert ("- svformer: -0.450; on the other seeds -0.300 to -0.100: **this seed's difference "
            "is outside the other 3 seeds' range: one seed is one draw**") in text
    assert "- resformer: -0.200; on the other seeds -0.300 to -0.100\n" in text
    assert "What held on all 4 seeds, at 250 steps: svformer: a final loss lower than " \
           "vanilla's; resformer: a final loss lower than vanilla's." in text
    assert tables.one_seed_cell(compared["svformer"]) == ("outside the other 3 seeds' range: "
                                                          "one seed is one draw")
    assert tables.one_seed_cell(compared["resformer"]) == "inside the other 3 seeds' range"
