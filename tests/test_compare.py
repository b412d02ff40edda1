import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lab import analysis
import compare
import prepare
from lab import runs
from lab import tables
import train
from model import GPT, GPTConfig
from shards import load_checkpoint

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4",
        "--max_iters=2", "--eval_interval=1", "--eval_iters=2", "--log_interval=1",
        "--warmup_iters=1", "--lr_decay_iters=2",
        "--analysis_samples=3", "--device=cpu", "--jobs=2"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    docs = [f"To be, or not to be, that is question number {i}.\n" * 8 for i in range(20)]
    return prepare.prepare(documents=docs, name="t", out_root=str(tmp_path_factory.mktemp("data")),
                           workers=1, quiet=True)


def test_tiny_comparison_writes_everything(data_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}",
                                "--seeds=2", "--less_data=0.5",
                                "--modes=vanilla,resformer,svformer,resformer_learnable"]) == 0
    # each line after the first finished run says how long is left, and where running runs are
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("[") or line.startswith("    done")]
    assert len(lines) == 20 and lines[-1].startswith("    done")
    first_done = next(i for i, line in enumerate(lines) if "done" in line)
    left = r"(about \d+ min|under a minute) left"
    run = r"[\w.=-]+ at \d/[12]( \(loss \d+\.\d+\))?"
    running = rf"running: {run}(, {run})?"
    for line in lines[first_done:-1]:
        assert re.search(rf"\({left}(; {running})?\)$" if line.startswith("[") else
                         rf"\(\d+\.\d min so far, {left}(; {running})?\)$", line), line
    assert re.search(rf"\(\d+\.\d min so far(; {running})?\)$", lines[-1]), lines[-1]
    assert any(re.search(running, line) for line in lines), lines
    results = json.load(open(out / "results.json"))
    assert set(results["modes"]) == {"vanilla", "resformer", "svformer", "resformer_learnable",
                                     "resformer:max_iters=1"}
    for name, r in results["modes"].items():
        for key in ("num_params", "val_loss", "val_loss_mean", "val_loss_std", "tokens", "curves",
                    "kv_cache_bytes_per_token", "tokens_per_sec", "attention_entropy", "similarity",
                    "attention_entropy_std", "similarity_std"):
            assert key in r, (name, key)
        assert len(r["val_loss"]) == 2 and math.isfinite(r["val_loss_mean"])
        assert len(r["attention_entropy"]) == len(r["similarity"]) == 2
        if name != "vanilla":  # paired against vanilla, seed by seed
            p = r["paired"]
            assert p["n"] == 2 and len(p["interval"]) == 2 and 0 <= p["wins"] <= 2
            v = results["modes"]["vanilla"]["val_loss"]
            assert p["differences"] == pytest.approx([r["val_loss"][i] - v[i] for i in range(2)])
    m = results["modes"]
    assert m["vanilla"]["tokens"] == [0, 64, 128]  # evals at steps 0, 1, 2 of 4 x 16 tokens
    assert (m["resformer:max_iters=1"]["tokens"] == [0, 64]
            and m["resformer:max_iters=1"]["total_tokens"] == 64)
    assert m["svformer"]["num_params"] < m["vanilla"]["num_params"] == m["resformer"]["num_params"]
    assert (m["svformer"]["kv_cache_bytes_per_token"] * 4
            == m["vanilla"]["kv_cache_bytes_per_token"] * 3)  # (L+1)/2L
    assert list(m["resformer_learnable"]["mixing"]) == ["transformer.h.1.attn.value_lambdas"]
    assert len(m["resformer_learnable"]["mixing"]["transformer.h.1.attn.value_lambdas"]) == 2
    md = (out / "results.md").read_text()
    assert "| vanilla |" in md and "95% interval" in md and "of 2" in md and "In-run crossing" in md
    assert (out / "vanilla_seed1338" / "summary.json").is_file()
    for png in ("loss.png", "attention_entropy.png", "similarity.png", "mixing.png",
                "attention_maps.png"):
        assert (out / png).is_file() == _has_matplotlib()

    # the same command again reuses every finished run instead of training it
    capsys.readouterr()
    compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}",
                         "--seeds=2", "--less_data=0.5",
                         "--modes=vanilla,resformer,svformer,resformer_learnable"])
    assert capsys.readouterr().out.count("reusing") == 10
    assert "10 of 10 runs reused" in (out / "results.md").read_text()


def test_time_left_counts_the_steps_left_at_the_finished_runs_pace(tmp_path):
    """Finished runs took 0.125 s a step; left: 2 runs of 800 steps and half of a running one,
    2 at a time: 2,000 steps x 0.125 s / 2 = 125 s."""
    grid = [{"out_dir": str(tmp_path / name), "max_iters": 800} for name in ("a", "b", "c")]
    os.makedirs(grid[2]["out_dir"])
    with open(os.path.join(grid[2]["out_dir"], "log.jsonl"), "w") as f:
        f.write('{"kind": "config", "iter": 0}\n{"kind": "train", "iter": 400, "loss": 2.3456}\n'
                '{"kind": "eval", "iter": 400}\n{"kind": "tra')  # a line being written
    todo, running = [(None, grid[0]), (None, grid[1])], [(None, grid[2], None, None)]
    timing = {"seconds": 200.0, "steps": 1600}
    assert runs.progress(todo, running, timing, jobs=2) == (
        " (about 2 min left; running: c at 400/800 (loss 2.346))")
    assert runs.progress([], running, timing, 2, "left in this round") == (
        " (under a minute left in this round; running: c at 400/800 (loss 2.346))")
    assert runs.progress(todo, [], {"seconds": 0.0, "steps": 0}, 2) == ""  # nothing known yet


def test_a_variant_override_changes_only_that_variant(data_dir, tmp_path):
    out = tmp_path / "cmp"
    compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1", "--less_data=0",
                         "--modes=vanilla,resformer:n_layer=3"])
    runs = {d: json.load(open(out / d / "summary.json"))["config"]
            for d in os.listdir(out) if "seed" in d}
    assert set(runs) == {"vanilla_seed1337", "resformer-n_layer=3_seed1337"}
    vanilla, variant = runs["vanilla_seed1337"], runs["resformer-n_layer=3_seed1337"]
    assert vanilla["n_layer"] == 2 and variant["n_layer"] == 3
    assert {k for k in vanilla if vanilla[k] != variant[k]} == {"n_layer", "value_mode", "out_dir"}


def test_interrupted_run_resumes_from_its_checkpoint(data_dir, tmp_path):
    """A run stopped mid-way (its checkpoint at step 1 of 2) continues from there, not from 0."""
    out = tmp_path / "cmp"
    args = TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1", "--less_data=0",
                   "--modes=vanilla"]
    cfg = compare.build_grid(compare.parse_args(compare.SETTINGS,
                                                [compare.DEFAULT_PRESET] + args, ""),
                             compare.parse_modes("vanilla"), [1337], [("", {})], str(out))[0][1]
    first_half = subprocess.run(runs.command(dict(cfg, max_iters=1), cfg["out_dir"])[0],
                                capture_output=True, text=True)
    assert first_half.returncode == 0, first_half.stderr  # a checkpoint at step 1, with max_iters=1
    # the same folder, but its settings say max_iters=2: the checkpoint is not this run's:
    # refused in one line naming the setting, never replaced
    with pytest.raises(ValueError, match=r"holds a run with other settings \(max_iters: 1 there, "
                                         r"2 now\): delete it, or compare into another --out_dir"):
        runs.command(cfg, cfg["out_dir"])
    # a checkpoint of exactly this run (as Ctrl-C leaves it) is resumed
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    ckpt = torch.load(ckpt_path, weights_only=False)
    ckpt["config"] = dict(cfg)  # exactly this run
    torch.save(ckpt, ckpt_path)
    args_, resuming = runs.command(cfg, cfg["out_dir"])
    assert resuming and "--resume" in args_
    assert compare.main(args) == 0
    log = runs.read_log(cfg["out_dir"])
    steps = [r["iter"] for r in log if r["kind"] == "train"]
    assert steps == [1, 2]  # step 1 from the first half, then only step 2: it went on, not from 0


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


def made_up_size_sweep(bigger, noise=0.01, seeds=(1, 2, 3, 4, 5)):
    """A sweep over 4 sizes where ResFormer's loss is vanilla's at `bigger` times the size
    (loss = 5 - 0.2 ln N), and an SVFormer whose loss does not fall with size."""
    rng = np.random.default_rng(0)
    sweep = {}
    for n_layer, n in zip((2, 4, 8, 16), (1e5, 2e5, 4e5, 8e5)):
        losses = {"vanilla": 5 - 0.2 * np.log(n), "resformer": 5 - 0.2 * np.log(bigger * n),
                  "svformer": 2.0}
        sweep[f"n_layer={n_layer}"] = {
            name: {"num_params": int(n), "seeds": list(seeds),
                   "val_loss": list(loss + noise * rng.standard_normal(len(seeds)))}
            for name, loss in losses.items()}
    return sweep


def test_fewer_parameters_read_off_the_fitted_curves():
    fits = analysis.size_sweep(made_up_size_sweep(bigger=1.25))
    res = fits["resformer"]  # the loss of a 1.25x larger vanilla: 1 - 1/1.25 = 20% fewer
    assert res["saving"] == pytest.approx(0.2, abs=0.03)
    assert res["interval"][0] < 0.2 < res["interval"][1] and res["interval"][1] - res["interval"][0] < 0.1
    assert res["slope_vanilla"] == pytest.approx(-0.2, abs=0.02) and res["seeds"] == [1, 2, 3, 4, 5]
    assert analysis.size_sweep(made_up_size_sweep(bigger=0.8))["resformer"]["saving"] < 0
    flat = fits["svformer"]  # its loss does not fall with size: nothing to read off
    assert flat["saving"] is None and flat["interval"] is None
    noisy = analysis.size_sweep(made_up_size_sweep(bigger=1.25, noise=0.5))["resformer"]
    assert noisy["interval"] is None and noisy["falling"] < 1  # not pinned down: no interval
    assert res["falling"] == 1.0
    # two sizes are no curve; a sweep that does not change the size is not a size sweep
    two = dict(list(made_up_size_sweep(1.25).items())[:2])
    assert analysis.size_sweep(two) == {}
    same_size = made_up_size_sweep(1.25)
    for point in same_size.values():
        for r in point.values():
            r["num_params"] = 1000
    assert analysis.size_sweep(same_size) == {}
    table = "\n".join(tables.size_table(made_up_size_sweep(bigger=1.25)))
    assert "Loss against parameters" in table and "| resformer |" in table
    assert re.search(r"\| svformer \| [^|]+ \| [^|]+ \| [^|]+ \| - \| - \| \d+% of", table)


def test_crossing_interpolates_or_says_never():
    tokens, losses = [0, 100, 200, 300], [5.0, 3.0, 2.0, 1.5]
    assert analysis.crossing(tokens, losses, 2.5) == pytest.approx(150.0)
    assert analysis.crossing(tokens, losses, 2.0) == pytest.approx(200.0)
    assert analysis.crossing(tokens, losses, 1.0) is None  # the curve stays above


def test_hooked_attention_is_what_the_model_attends_with():
    """The weights the analysis hooks compute, applied to the layer's values,
    give the layer's output."""
    torch.manual_seed(0)
    for mode in ("vanilla", "resformer", "svformer"):
        model = GPT(GPTConfig(n_layer=3, n_head=4, n_kv_head=2, n_embd=32, block_size=16,
                              vocab_size=64, value_mode=mode)).eval()
        x = torch.randint(64, (2, 12))
        outputs = []
        hook = model.transformer.h[2].attn.register_forward_hook(
            lambda m, a, out: outputs.append(out))
        attention, hidden = analysis.internals(model, x)
        model(x)
        hook.remove()
        att = attention[2]
        assert len(attention) == 3 and att.shape == (2, 4, 12, 12) and len(hidden) == 3
        assert (torch.allclose(att.sum(-1), torch.ones(2, 4, 12), atol=1e-5)
                and att.triu(1).abs().max() == 0)
        out, value = outputs[-1]
        y = att @ value.repeat_interleave(2, dim=1)  # (B, n_head, T, hd)
        y = model.transformer.h[2].attn.c_proj(y.transpose(1, 2).reshape(2, 12, 32))
        assert torch.allclose(y, out, atol=1e-5)


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def test_without_matplotlib_tables_are_still_written(data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    out = tmp_path / "cmp"
    assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1",
                                "--modes=vanilla"]) == 0
    assert (out / "results.md").is_file() and (out / "results.json").is_file()
    assert not (out / "loss.png").exists()
    assert "pip install matplotlib" in capsys.readouterr().out


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
                               "svformer_kv1:n_layer=8:learning_rate=1e-3") == [
        ("vanilla", dict(value_mode="vanilla", learnable_lambda=False, n_kv_head=0)),
        ("resformer_learnable", dict(value_mode="resformer", learnable_lambda=True, n_kv_head=0)),
        ("svformer_kv1:n_layer=8:learning_rate=1e-3",
         dict(value_mode="svformer", learnable_lambda=False, n_kv_head=1, n_layer=8,
              learning_rate=1e-3))]
    for bad in ("transformer", "svformer_learnable", "", "resformer:n_layer", "resformer:n_layer=x",
                "resformer:bogus=1"):
        with pytest.raises(ValueError):
            compare.parse_modes(bad)
    assert compare.parse_seeds("3", 10) == [10, 11, 12]
    # what the configurator makes of --seeds=1,2,5
    assert compare.parse_seeds("(1, 2, 5)", 10) == [1, 2, 5]
    assert compare.parse_seeds("(7,)", 10) == [7]
    assert compare.parse_seeds("102,", 10) == [102]
    with pytest.raises(ValueError):
        compare.parse_seeds("three", 1)
    with pytest.raises(ValueError, match="--seed=102 --seeds=1"):
        compare.parse_seeds("102", 1)  # a count this big is a seed typed as a count


def test_compare_settings_do_not_shadow_train_settings(tmp_path):
    assert not set(compare.COMPARE_SETTINGS) & set(train.DEFAULTS)
    with pytest.raises(ValueError, match="resume"):
        compare.main([f"--out_dir={tmp_path}", "--resume"])


@pytest.mark.parametrize("action", ["--overwrite", "--resume", "--new_data=True"])
def test_train_actions_are_refused_not_ignored(tmp_path, action):
    """Issue 22: --overwrite was listed, accepted and ignored ("reusing ...")."""
    with pytest.raises(ValueError, match=f"compare.py takes no {action}: the same command again "
                                         "reuses finished runs and resumes stopped ones from "
                                         "their checkpoints; to train them afresh, use another "
                                         "--out_dir"):
        compare.main([f"--out_dir={tmp_path}", action, "--modes=bogus"])
    assert action.split("=")[0][2:] not in compare.SETTINGS  # nor listed in --help


def test_a_run_of_an_older_version_is_refused_in_one_line(tmp_path):
    """A finished run is reused only with the same settings, and only if this version wrote it."""
    cfg = compare.build_grid(compare.parse_args(compare.SETTINGS, [compare.DEFAULT_PRESET], ""),
                             compare.parse_modes("vanilla"), [1], [("", {})], str(tmp_path))[0][1]
    assert not set(cfg) & {"resume", "overwrite", "new_data"}
    os.makedirs(cfg["out_dir"])
    runs.write_summary(cfg["out_dir"], {"config": cfg, "status": "done"})
    assert runs.finished(cfg, cfg["out_dir"])["status"] == "done"
    with pytest.raises(ValueError, match=r"holds a run with other settings \(n_layer: 16 there, "
                                         r"3 now\)"):  # never replaced
        runs.finished(dict(cfg, n_layer=3), cfg["out_dir"])
    with open(os.path.join(cfg["out_dir"], "summary.json"), "w") as f:
        json.dump({"config": cfg, "status": "done"}, f)  # no format: an older version's
    with pytest.raises(ValueError, match="written by an older version of compare.py: delete it"):
        runs.finished(cfg, cfg["out_dir"])


def test_one_variant_without_vanilla_shorter_than_log_interval(data_dir, tmp_path, capsys,
                                                               monkeypatch):
    """Issue 22: without vanilla the results still spoke of the difference to vanilla; a run
    shorter than log_interval showed nan tokens/s; '1 runs'; --plot wrote runs.png into the
    current folder whatever --out_dir said."""
    out = tmp_path / "cmp"
    args = [a for a in TINY if not a.startswith("--log_interval")] + ["--log_interval=5"]
    assert compare.main(args + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1",
                                "--less_data=0", "--modes=resformer"]) == 0
    printed = capsys.readouterr().out
    assert f"1 run (1 variant x 1 seed), 2 at a time, in {out}" in printed
    md = (out / "results.md").read_text()
    assert "vanilla" not in md and "nan" not in md and "| resformer | " in md
    assert "± 0.0000" not in md and "the same for all: 0.0085" in md  # one seed: no spread
    summary = json.load(open(out / "resformer_seed1337" / "summary.json"))
    assert math.isfinite(summary["tokens_per_sec"]) and summary["tokens_per_sec"] > 0
    assert (out / "attention_maps.png").is_file() == _has_matplotlib()
    monkeypatch.chdir(tmp_path)
    assert compare.main([f"--plot={out / 'resformer_seed1337'}", "--out_dir=pictures"]) == (
        0 if _has_matplotlib() else 1)
    assert (tmp_path / "pictures" / "runs.png").is_file() == _has_matplotlib()
    assert not (tmp_path / "runs.png").exists()


def test_ctrl_c_stops_the_comparison_and_the_same_command_continues(data_dir, tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) mid-run: compare exits 130
    without hanging, the run leaves a checkpoint, and the same command again resumes that run,
    not from 0."""
    import signal
    out = tmp_path / "cmp"
    args = [a for a in TINY if not a.startswith(("--max_iters", "--lr_decay_iters",
                                                 "--eval_interval", "--log_interval"))]
    args += ["--max_iters=3000", "--eval_interval=1000", "--log_interval=10",
             f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1", "--less_data=0",
             "--modes=vanilla", "--jobs=1"]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    process = subprocess.Popen([sys.executable, "compare.py", *args], cwd=here,
                               start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    log_path = out / "vanilla_seed1337" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log_path.is_file()
                                          and '"kind": "train"' in log_path.read_text()):
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "run the same command again" in output
    stopped_at = load_checkpoint(str(out / "vanilla_seed1337" / "ckpt.pt"))["iter_num"]
    assert 0 < stopped_at < 3000
    assert compare.main(args) == 0
    steps = [r["iter"] for r in runs.read_log(out / "vanilla_seed1337") if r["kind"] == "train"]
    # continued, no restart
    assert steps[-1] == 3000 and steps.count(stopped_at + 10 - stopped_at % 10) == 1
    assert [r["iter"] for r in runs.read_log(out / "vanilla_seed1337")
            if r["kind"] == "config"] == [0, stopped_at]


def test_sweep_reports_the_paired_difference_at_each_point(data_dir, tmp_path):
    out = tmp_path / "sweep"
    assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1",
                                "--less_data=0", "--modes=vanilla,resformer",
                                "--sweep=n_layer=1:max_iters=2,n_layer=3:max_iters=1"]) == 0
    sweep = json.load(open(out / "results.json"))["sweep"]
    assert set(sweep) == {"n_layer=1_max_iters=2", "n_layer=3_max_iters=1"}
    for point in sweep.values():
        assert point["resformer"]["paired"]["n"] == 1 and "paired" not in point["vanilla"]
    assert len(sweep["n_layer=3_max_iters=1"]["resformer"]["attention_entropy"]) == 3
    md = (out / "results.md").read_text()
    assert "## Sweep" in md and "describe its first point, `n_layer=1_max_iters=2`" in md
    assert (out / "sweep.png").is_file() == _has_matplotlib()


def test_sweep_point_labels_one_setting_per_line():
    from lab import plots
    assert plots.point_label("learning_rate=2e-3_min_lr=2e-4") == "learning_rate=2e-3\nmin_lr=2e-4"
    assert plots.point_label("n_layer=4_max_iters=1600") == "n_layer=4\nmax_iters=1600"
    assert plots.point_label("n_layer=4") == "n_layer=4"


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
    def run_grid(grid, jobs, samples, quiet_reuse=False, left="left"):
        summaries = {}
        for key, cfg in grid:
            calls.append(cfg)
            lr, best = cfg["learning_rate"], optimum[cfg["value_mode"]]
            loss = 2 + math.log(lr / best) ** 2 + 0.01 * cfg["seed"] % 7
            summaries[key] = {
                "status": "diverged" if lr > 8 * best else "done",
                "val_loss_full": None if lr > 8 * best else loss, "config": cfg,
                "evals": [{"iter": 0, "tokens": 0, "val_loss": 5.0},
                          {"iter": 1, "tokens": 10, "val_loss": loss}],
                "num_params": 1, "kv_cache_bytes_per_token": 1, "tokens_per_sec": 1.0,
                "attention_entropy": [1.0], "similarity": [0.5]}
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

    def run_grid(grid, jobs, samples, quiet_reuse=False, left="left"):
        summaries = {}
        for key, cfg in grid:
            at = left_at[cfg["value_mode"], cfg["seed"]]
            evals = [{"iter": i, "tokens": 100 * i,
                      "val_loss": 2.0 if at is not None and i >= at else 3.2}
                     for i in range(0, 201, 20)]
            summaries[key] = {"status": "done", "val_loss_full": 2.0, "config": cfg,
                              "evals": evals, "num_params": 1, "kv_cache_bytes_per_token": 1,
                              "tokens_per_sec": 1.0, "attention_entropy": [1.0],
                              "similarity": [0.5]}
        return summaries, False, []
    monkeypatch.setattr(compare, "run_grid", run_grid)
    monkeypatch.setattr(compare, "attention_map_data", lambda grid, summaries, names: {})
    assert compare.main(TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--seeds=1,2",
                                "--modes=vanilla,resformer", "--less_data=0"]) == 0
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
    monkeypatch.setattr(compare, "run_grid", fake_runs({"vanilla": 0.01, "resformer": 0.02},
                                                       calls))
    monkeypatch.setattr(compare, "attention_map_data", lambda grid, summaries, names: {})
    assert compare.main(TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--tune",
                                "--tune_lrs=1e-3,2e-3,4e-3", "--tune_seeds=1,2", "--seeds=5,6",
                                "--modes=vanilla,resformer", "--less_data=0.5"]) == 0
    # the count and its factors agree; the paper's protocol's runs are named as extra
    assert ("10 runs (3 variants x 2 seeds at their own best lr, and 4 at vanilla's best lr: "
            "the paper's protocol)") in capsys.readouterr().out
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
    # fair: each at its own best (the 50%-data ResFormer at ResFormer's); paper: all at vanilla's
    lrs = {(c["value_mode"], c["max_iters"], c["learning_rate"]) for c in final_runs}
    assert lrs == {("vanilla", 2, best["vanilla"]), ("resformer", 2, best["resformer"]),
                   ("resformer", 1, best["resformer"]), ("resformer", 2, best["vanilla"]),
                   ("resformer", 1, best["vanilla"])}
    assert all(c["min_lr"] == pytest.approx(c["learning_rate"] / 10, rel=0.01) for c in calls)
    assert results["sweep"]["paper"]["resformer"]["paired"]["n"] == 2
    md = (tmp_path / "results.md").read_text()
    assert "## Learning-rate search" in md and "The paper's protocol" in md and "| yes |" in md
    assert (tmp_path / "lr_search.png").is_file() == _has_matplotlib()
    with pytest.raises(ValueError, match="must not be the ones"):
        compare.main(TINY + [f"--out_dir={tmp_path}", "--tune", "--tune_seeds=1,2",
                             "--seeds=2,3"])


def test_lrs_trains_each_named_variant_at_its_own_peak_lr(data_dir, tmp_path, monkeypatch):
    """--lrs (what --tune prints): named variants (and the less-data ResFormer, at ResFormer's)
    at their own lr, min_lr following; the others at learning_rate; mistakes in one line."""
    calls = []
    monkeypatch.setattr(compare, "run_grid", fake_runs({"vanilla": 0.01, "resformer": 0.02,
                                                        "svformer": 0.01}, calls))
    monkeypatch.setattr(compare, "attention_map_data", lambda grid, summaries, names: {})
    args = TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--seeds=5",
                   "--modes=vanilla,resformer,svformer", "--less_data=0.5",
                   "--learning_rate=3e-3", "--min_lr=3e-4"]
    assert compare.main(args + ["--lrs=vanilla=1e-2,resformer=2e-2"]) == 0
    lrs = {(c["value_mode"], c["max_iters"], c["learning_rate"], c["min_lr"]) for c in calls}
    assert lrs == {("vanilla", 2, 1e-2, 1e-3), ("resformer", 2, 2e-2, 2e-3),
                   ("resformer", 1, 2e-2, 2e-3), ("svformer", 2, 3e-3, 3e-4)}
    results = json.load(open(tmp_path / "results.json"))
    assert results["info"]["peak_lrs"] == {"vanilla": 1e-2, "resformer": 2e-2, "svformer": 3e-3,
                                           "resformer:max_iters=1": 2e-2}
    assert "own peak learning rate (vanilla 0.01, resformer 0.02" in (
        tmp_path / "results.md").read_text()
    # a variant this command does not train (a preset's lrs for all three) is not an error
    calls.clear()
    assert compare.main(args + ["--modes=vanilla", "--less_data=0",
                                "--lrs=vanilla=1e-2,resformer_kv1=5e-3"]) == 0
    assert {(c["value_mode"], c["learning_rate"]) for c in calls} == {("vanilla", 1e-2)}
    for bad in ("--lrs=vanila=1e-2", "--lrs=vanilla=fast", "--lrs=vanilla=-1"):
        with pytest.raises(ValueError, match="is not variant=learning_rate"):
            compare.main(args + [bad])


def test_tune_counts_a_diverged_run_as_worse(data_dir, tmp_path):
    """Real tiny runs: lr 1e6 diverges; the search goes on and picks the finite one."""
    out = tmp_path / "tune"
    assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--tune",
                                "--tune_lrs=1e-2,1e6", "--tune_extend=0", "--tune_seeds=1",
                                "--seeds=1", "--modes=vanilla", "--less_data=0"]) == 0
    results = json.load(open(out / "results.json"))
    assert math.isinf(results["lr_search"]["vanilla"]["1e+06"][0])
    assert results["info"]["best_lrs"] == {"vanilla": 0.01}
    summary = json.load(open(out / "lr_search" / "vanilla_lr1e06_seed1" / "summary.json"))
    assert summary["status"] == "diverged"
    assert "inf" in (out / "results.md").read_text()
    assert (out / "vanilla_lr0.01_seed1337" / "summary.json").is_file()


def test_data_refused_once_before_any_run(data_dir, tmp_path):
    """A dataset train.py would refuse (an older layout) stops compare.py with train.py's one
    line before any run starts."""
    old = tmp_path / "old"
    old.mkdir()
    for name in os.listdir(data_dir):
        (old / name).write_bytes((Path(data_dir) / name).read_bytes())
    meta = json.loads((old / "meta.json").read_text())
    del meta["generation"]
    (old / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="older version of prepare.py"):
        compare.main(TINY + [f"--dataset={old}", f"--out_dir={tmp_path / 'cmp'}", "--seeds=1",
                             "--less_data=0", "--modes=vanilla"])
    assert not (tmp_path / "cmp" / "vanilla_seed1").exists()


def test_a_run_that_fails_before_its_log_is_reported_not_a_crash(tmp_path, monkeypatch, capsys):
    """train.py exiting with an error before it writes log.jsonl: FAILED with its last lines."""
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit('error: this data is refused')\n")
    monkeypatch.setattr(runs, "TRAIN_PY", str(script))
    cfg = {"out_dir": str(tmp_path / "run"), "max_iters": 2}
    summaries, interrupted, failed = runs.run_grid([(("vanilla", 1, ""), cfg)], 1, 1)
    assert (summaries, interrupted, failed) == ({}, False, [cfg["out_dir"]])
    assert "error: this data is refused" in capsys.readouterr().out


def test_results_open_with_the_verdict_and_table_the_gap_along_the_run(data_dir, tmp_path,
                                                                        monkeypatch):
    """One computed sentence first; then the paired fixed-window gap at the asked steps, from
    the same runs: here resformer gains 0.1 early and nothing at the end."""
    def run_grid(grid, jobs, samples, quiet_reuse=False, left="left"):
        summaries = {}
        for key, cfg in grid:
            early = {"vanilla": 0.0, "resformer": -0.1, "svformer": 0.05}[cfg["value_mode"]]
            evals = [{"iter": i, "tokens": 100 * i, "val_loss": 3.0 - i / 100 + cfg["seed"] / 100
                      + (early if i <= 100 else 0.0)} for i in range(0, 201, 20)]
            final = {"vanilla": 2.0, "resformer": 1.9, "svformer": 2.0}[cfg["value_mode"]]
            summaries[key] = {"status": "done", "val_loss_full": final + cfg["seed"] / 1000,
                              "config": cfg, "evals": evals, "num_params": 1,
                              "kv_cache_bytes_per_token": 1, "tokens_per_sec": 1.0,
                              "attention_entropy": [1.0], "similarity": [0.5]}
        return summaries, False, []
    monkeypatch.setattr(compare, "run_grid", run_grid)
    monkeypatch.setattr(compare, "attention_map_data", lambda grid, summaries, names: {})
    args = TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--seeds=1,2,3",
                   "--modes=vanilla,resformer,svformer", "--less_data=0", "--max_iters=200",
                   "--eval_interval=20"]
    with pytest.raises(compare.ConfigError, match="gap_steps=50: the loss is measured every"):
        compare.main(args + ["--gap_steps=50"])
    assert compare.main(args + ["--gap_steps=40,200"]) == 0
    gap = json.load(open(tmp_path / "results.json"))["modes"]["resformer"]["gap"]
    assert gap["40"]["differences"] == pytest.approx([-0.1] * 3)
    assert gap["200"]["differences"] == pytest.approx([0.0] * 3)
    md = (tmp_path / "results.md").read_text().splitlines()
    assert md[2].startswith("**Verdict on 3 seeds") and "resformer (-0.100 [" in md[2]
    assert "resformer (-0.100 [-0.1000, -0.1000], lower on 3 of 3) is lower than vanilla " \
           "beyond noise; svformer (+0.000 [+0.0000, +0.0000], lower on 0 of 3) is not " \
           "distinguishable from vanilla" in md[2]
    row = next(line for line in md if line.startswith("| resformer | -0.1000 [-0.1000, -0.1000]"))
    assert row.endswith("| +0.0000 [+0.0000, +0.0000], 0 of 3 |")
    # without --gap_steps: a quarter, half, three quarters and the end
    assert compare.main(args) == 0
    gap = json.load(open(tmp_path / "results.json"))["modes"]["svformer"]["gap"]
    assert list(gap) == ["40", "100", "140", "200"]
    assert gap["100"]["mean"] == pytest.approx(0.05) and gap["140"]["mean"] == pytest.approx(0)


def test_the_demo_is_the_default_comparison_shortened():
    """config/demo.py is compare's default preset for half its steps on one seed: the same
    model, data, learning rates and variants, so what the demo shows is what the full run
    measures (README, "What a class will see")."""
    from configurator import read_preset
    root = Path(__file__).resolve().parent.parent
    demo, full = (read_preset(str(root / "config" / f"{n}.py")) for n in ("demo", "compare"))
    assert demo.pop("max_iters") * 2 == full.pop("max_iters")
    assert (demo.pop("seeds"), demo.pop("jobs"), demo.pop("out_dir")) == ("1", 4, "out-demo")
    assert set(demo["lrs"].split(",")) == {f"{m}=8.5e-3" for m in demo["modes"].split(",")}
    full.pop("out_dir")
    assert demo == full


def test_one_seed_states_its_differences_and_own_lrs_are_named(data_dir, tmp_path, monkeypatch):
    """One seed: the differences, and no claim. Every variant's lr named in --lrs, all equal:
    each at its own lr (so also the paper's protocol), not 'one shared lr'."""
    def run_grid(grid, jobs, samples, quiet_reuse=False, left="left"):
        return {key: {"status": "done", "val_loss_full": {"vanilla": 2.0, "svformer": 2.05}[
                          cfg["value_mode"]], "config": cfg,
                      "evals": [{"iter": 0, "tokens": 0, "val_loss": 5.0},
                                {"iter": 2, "tokens": 10, "val_loss": 2.5}], "num_params": 1,
                      "kv_cache_bytes_per_token": 1, "tokens_per_sec": 1.0,
                      "attention_entropy": [1.0], "similarity": [0.5]}
                for key, cfg in grid}, False, []
    monkeypatch.setattr(compare, "run_grid", run_grid)
    monkeypatch.setattr(compare, "attention_map_data", lambda grid, summaries, names: {})
    assert compare.main(TINY + [f"--out_dir={tmp_path}", f"--dataset={data_dir}", "--seeds=1",
                                "--modes=vanilla,svformer", "--less_data=0",
                                "--lrs=vanilla=3e-3,svformer=3e-3"]) == 0
    md = (tmp_path / "results.md").read_text()
    assert ("one seed (1337), so no interval and nothing here is beyond noise; final val loss - "
            "vanilla's: svformer +0.050") in md
    assert "Each variant at its own peak learning rate (--lrs), the same for all: 0.003" in md
