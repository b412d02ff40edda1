"""compare.py and the lab it runs (lab/runs, grid, analysis, tables, plots): tiny comparisons
trained in this process (conftest's in_process), the measures on numbers checkable by hand, and
real processes only where the promise is about the process (a --plan run by xargs, a student's
bug shown where it is, Ctrl-C)."""
import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
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
from configurator import ConfigError
from conftest import TINY, run_in_process
from data import DataError
from lab import analysis, plots, runs, tables
from lab import grid as lab_grid
from lab.analysis import FLOOR
from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parent.parent
# Every comparison here: train.py's defaults (config/quickstart.py spells them out; naming it
# keeps compare.py's own preset out), the tiny model, 10 steps evaluated every 5, all runs at once.
BASE = [str(ROOT / "config" / "quickstart.py"), *TINY, "--max_iters=10", "--eval_interval=5",
        "--analysis_samples=4", "--jobs=12"]
# Vanilla at three sizes (the size line), learned lambdas (mixing.png) and SVFormer.
TINY_MODES = "vanilla,vanilla:n_embd=8,vanilla:n_embd=24,resformer_learnable,svformer"
# run_grid waits half a second between looks at its runs; a run in this process has ended when
# launch returns, so the tests skip the wait.
NO_WAIT = types.SimpleNamespace(time=time.time, sleep=lambda seconds: None)


@pytest.fixture
def quick(in_process, monkeypatch):
    """compare.py's runs trained in this process, without run_grid's waits, and no pictures."""
    monkeypatch.setattr(runs, "time", NO_WAIT)
    monkeypatch.setattr(plots, "write_all", lambda *args, **kwargs: [])


@pytest.fixture(scope="module")
def tiny(plays, tmp_path_factory):
    """One tiny comparison on seeds 1 and 2, trained in this process: what it printed and wrote."""
    out = tmp_path_factory.mktemp("tiny") / "cmp"
    args = BASE + [f"--dataset={plays}", f"--out_dir={out}", "--seeds=1,2", f"--modes={TINY_MODES}"]
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(runs, "launch", run_in_process)
        patch.setattr(runs, "time", NO_WAIT)
        assert compare.main(args) == 0
    return types.SimpleNamespace(out=out, args=args, printed=printed.getvalue(),
                                 results=json.loads((out / "results.json").read_text()),
                                 md=(out / "results.md").read_text())


# ---- what a comparison writes ----

def test_a_tiny_comparison_writes_its_tables_pictures_and_records(tiny):
    """results.md opens with the verdict; every run's folder holds its summary (with today's code
    version), its log with lab.evaluate's final entry and its code.json; the noise floor (vanilla
    nudged) trains on the first seed beside the variants."""
    out, modes = tiny.out, tiny.results["modes"]
    assert (f"11 runs (5 variants x 2 seeds, and vanilla nudged on 1 seed: the noise floor), "
            f"12 at a time, 1 thread each, in {out}") in tiny.printed
    assert tiny.md.startswith("# Value residual comparison\n\n**Verdict on 2 seeds at 10 steps")
    assert f"    trained {out / 'svformer_seed2'}; now its loss on every validation token\n" in \
        tiny.printed  # (lab.evaluate's pass, said as it starts)
    assert ("| vanilla, nudged one rounding step: the noise floor (`vanilla:nudge=1`) |"
            in tiny.md)
    assert set(modes) == set(TINY_MODES.split(",")) | {FLOOR} and modes[FLOOR]["seeds"] == [1]
    for png in ("loss.png", "attention_entropy.png", "similarity.png", "mixing.png",
                "size_curve.png"):  # (the size curve: vanilla at three sizes)
        assert (out / png).is_file(), png
    assert tiny.results["vanilla_curve"]["sizes"] == {
        n: modes[n]["num_params"] for n in ("vanilla", "vanilla:n_embd=8", "vanilla:n_embd=24")}
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == sorted([f"{name.replace(':', '-')}_seed{seed}"
                              for name in TINY_MODES.split(",") for seed in (1, 2)]
                             + ["vanilla-nudge=1_seed1"])
    today = runs.code_version()
    for folder in folders:
        summary = json.loads((out / folder / "summary.json").read_text())
        final = [e for e in runs.read_log(out / folder) if e["kind"] == "final"]
        assert summary["code"] == today == json.loads((out / folder / "code.json").read_text())[
            "code"], folder
        assert [e["iter"] for e in final] == [10]
        assert final[0]["val_loss_full"] == summary["val_loss_full"]
    assert json.loads((out / "vanilla-nudge=1_seed1" / "summary.json").read_text())[
        "config"]["nudge"] == 1
    svformer, vanilla = modes["svformer"], modes["vanilla"]
    assert svformer["paired"]["differences"] == pytest.approx(
        [a - b for a, b in zip(svformer["val_loss"], vanilla["val_loss"])])
    assert list(modes["resformer_learnable"]["mixing"]) == ["transformer.h.1.attn.value_lambdas"]


def test_a_variant_override_changes_only_that_variant(tiny):
    config = {p.parent.name: json.loads(p.read_text())["config"]
              for p in tiny.out.glob("*_seed1/summary.json")}
    vanilla = config["vanilla_seed1"]

    def differ(folder):
        keys = set(vanilla) | set(config[folder])
        return {k for k in keys if vanilla.get(k) != config[folder].get(k)} - {"out_dir"}
    assert differ("vanilla-n_embd=24_seed1") == {"n_embd"}
    assert config["vanilla-n_embd=24_seed1"]["n_embd"] == 24 and vanilla["n_embd"] == 16
    assert differ("svformer_seed1") == {"value_mode"}
    assert differ("vanilla-nudge=1_seed1") == {"nudge"}


def test_the_same_command_again_reuses_every_run(tiny, quick, capsys):
    assert compare.main(tiny.args) == 0
    printed = capsys.readouterr().out
    assert ": training" not in printed and "not reused" not in printed
    assert "(11 of 11 runs reused)" in (tiny.out / "results.md").read_text()


def test_runs_of_other_settings_threads_or_cut_short_are_refused_in_one_line(tiny, tmp_path,
                                                                             quick):
    """A folder holds someone's results: another setting or thread count is refused, naming
    it, and a summary.json cut short is named with what to do; nothing is moved or trained."""
    with pytest.raises(ConfigError, match=r"vanilla_seed1 holds a run with other settings "
                       r"\(weight_decay: 0.1 there, 0.2 now\): delete it, or compare into "
                       r"another --out_dir$"):
        compare.main(tiny.args + ["--weight_decay=0.2"])
    with pytest.raises(DataError, match=r"vanilla_seed1 trained on 1 thread, which rounds "
                       r"differently: compare with --threads=1, or into another --out_dir$"):
        compare.main(tiny.args + ["--threads=2"])
    assert not list(tiny.out.glob("*.other-code-*"))
    summary = tmp_path / "run" / "summary.json"
    summary.parent.mkdir()
    summary.write_text('{"format": "value-residual-gpt/2", "config": {"lear')
    with pytest.raises(DataError) as error:
        runs.finished({}, str(summary.parent))
    said = str(error.value)
    assert said.startswith(f"{summary} is not whole JSON (") and "\n" not in said
    assert said.endswith(f"restore it (git checkout -- {summary}), or delete "
                         f"{summary.parent} to train that run again")


# ---- reuse is sure (issue 65) ----

# Edits of a copy of the project: (file, a text there, its replacement; None: appended).
UNSEEN = [  # comments, docstrings, formatting
    ("model.py", None, "# the student's note: try lambda_1 = 2\n"),
    ("model.py", "One GPT, four value modes", "One GPT (my notes), four value modes"),
    ("train.py", '"""One AdamW step over', '"""One AdamW step (as nanoGPT) over'),
    ("train.py", "    end = cfg.lr_decay_iters or cfg.max_iters\n",
     "    end = (cfg.lr_decay_iters\n           or cfg.max_iters)  # reformatted\n"),
    ("lab/tables.py", None, "SHOWN = 3\n"),  # code that only reads logs and draws tables
    ("helper.py", None, "def activation(x):\n    return 2 * x\n"),  # a module nothing imports
]
SEEN = [  # every edit that can change what a run computes
    ("train.py", "coeff = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (end - warmup)))",
     "coeff = 1.0 - (it - warmup) / (end - warmup)"),  # linear, between the same endpoints
    ("train.py", 'group["lr"] = lr * group["lr_scale"]', 'group["lr"] = lr / 2 * group["lr_scale"]'
     ),  # the lr inside the loop
    ("model.py", '{"params": no_decay, "weight_decay": 0.0,',
     '{"params": no_decay, "weight_decay": weight_decay,'),
    ("lab/evaluate.py", None, "WINDOWS_AT_ONCE = 2\n"),
    ("mods/mlp.py", "2 * x", "3 * x"),  # deep in a package model.py imports
    ("model.py", None, "import mods.other\n"),  # a module of it newly imported
]


@pytest.mark.parametrize("edit,seen", [(e, False) for e in UNSEEN] + [(e, True) for e in SEEN],
                         ids=[f"unseen-{e[0]}-{i}" for i, e in enumerate(UNSEEN)]
                         + [f"seen-{e[0]}-{i}" for i, e in enumerate(SEEN)])
def test_the_code_version_sees_every_edit_that_can_change_a_run_and_no_comment(tmp_path, edit,
                                                                               seen):
    for path in ROOT.glob("*.py"):
        shutil.copy(path, tmp_path)
    shutil.copytree(ROOT / "lab", tmp_path / "lab", ignore=shutil.ignore_patterns("__pycache__"))
    # A student's package, which model.py imports: its code is a run's code too.
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "__init__.py").write_text("")
    (tmp_path / "mods" / "mlp.py").write_text("def act(x):\n    return 2 * x\n")
    (tmp_path / "mods" / "other.py").write_text("SCALE = 1\n")
    model_py = tmp_path / "model.py"
    model_py.write_text(model_py.read_text().replace("import torch\n",
                                                     "import torch\nfrom mods.mlp import act\n", 1))
    before = runs.code_version(str(tmp_path))
    name, old, new = edit
    path = tmp_path / name
    text = path.read_text() if path.exists() else ""
    assert old is None or text.count(old) == 1, f"{name} no longer holds {old!r}"
    path.write_text(text + new if old is None else text.replace(old, new))
    assert (runs.code_version(str(tmp_path)) != before) == seen


def test_runs_of_other_code_are_moved_aside_whole_and_trained_again(plays, tmp_path, quick,
                                                                   capsys, monkeypatch):
    """Issue 65: a run of another code version is never reused as today's; it is moved to
    <run>.other-code-N (the first N free: an earlier one is kept whole) and trained again.
    --reuse_other_code reuses it, said in bold in results.md."""
    out = tmp_path / "cmp"
    run = out / "vanilla_seed1"
    args = BASE + [f"--dataset={plays}", f"--out_dir={out}", "--seeds=1", "--modes=vanilla",
                   "--noise_floor=0"]
    assert compare.main(args) == 0
    first, before = (run / "summary.json").read_text(), runs.code_version()
    for n, version in ((1, "0123456789abcdef"), (2, "fedcba9876543210")):
        monkeypatch.setattr(compare, "code_version", lambda v=version: v)
        capsys.readouterr()
        assert compare.main(args) == 0
        printed = capsys.readouterr()
        assert (f"not reused: {run} was trained by other code (code version {before} there, "
                f"{version} today); moved to {run}.other-code-{n}\n") in printed.err
        assert f"[1/1] {run}: training" in printed.out
        assert json.loads((run / "summary.json").read_text())["code"] == version
        before = version
    kept = Path(f"{run}.other-code-1")
    assert (kept / "summary.json").read_text() == first  # the first aside, whole
    assert {"ckpt.pt", "log.jsonl", "code.json", "train.out"} <= {p.name for p in kept.iterdir()}
    # The edit undone: the first run comes back, the run of the other code goes aside in its
    # place, and nothing trains.
    original = json.loads(first)["code"]
    monkeypatch.setattr(compare, "code_version", lambda: original)
    capsys.readouterr()
    assert compare.main(args) == 0
    printed = capsys.readouterr()
    assert f"moved to {run}.other-code-3\n" in printed.err and ": training" not in printed.out
    assert f"brought back: {kept}, trained by today's code, is {run} again\n" in printed.err
    assert (run / "summary.json").read_text() == first and not kept.exists()
    monkeypatch.setattr(compare, "code_version", lambda: "0000000000000000")
    capsys.readouterr()
    assert compare.main(args + ["--reuse_other_code"]) == 0
    printed = capsys.readouterr().out
    assert ": training" not in printed and "not reused" not in printed
    md = (out / "results.md").read_text()
    assert "(1 of 1 run reused)" in md
    assert "\n**Runs of other code were reused (--reuse_other_code): another version" in md



# ---- settings and their grammar ----

@pytest.mark.parametrize("parse,text,message", [
    (compare.parse_modes, "transformer", "unknown mode 'transformer': use "
     + ", ".join(model.VALUE_MODES) + " (model.py's VALUE_MODES)"),
    (compare.parse_modes, "svformer_learnable",
     "mode 'svformer_learnable': _learnable applies to resformer only"),
    (compare.parse_modes, " , ", "--modes is empty"),
    (compare.parse_modes, "resformer:n_layer", "mode 'resformer:n_layer': settings are key=value"),
    (compare.parse_seeds, "1,2,01", "--seeds=1,2,01: a seed is listed twice; list each seed once"),
    (compare.parse_seeds, "three", "--seeds=three: seeds are whole numbers >= 0, listed with "
     "commas (--seeds=1337,1338,1339; one seed: --seeds=1337)"),
    (compare.parse_seeds, "", "--seeds=: need at least one seed, e.g. --seeds=1337,1338,1339"),
    (lambda text: compare.parse_list(text, int), "1,x",
     "cannot read '1,x' as a comma-separated list of int"),
])
def test_mistakes_in_modes_seeds_and_lists_are_one_line(parse, text, message):
    with pytest.raises(ConfigError) as error:
        parse(text)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_modes_seeds_and_lists_are_read_as_written():
    assert compare.parse_modes("vanilla, resformer_learnable,svformer_kv1:n_layer=8") == [
        ("vanilla", dict(value_mode="vanilla", learnable_lambda=False, n_kv_head=0)),
        ("resformer_learnable", dict(value_mode="resformer", learnable_lambda=True, n_kv_head=0)),
        ("svformer_kv1:n_layer=8",
         dict(value_mode="svformer", learnable_lambda=False, n_kv_head=1, n_layer=8))]
    assert compare.parse_modes(FLOOR)[0][1]["nudge"] == 1  # the floor's settings: its name's
    assert compare.parse_seeds("7") == [7] and compare.parse_seeds("(1, 2, 5)") == [1, 2, 5]
    assert compare.parse_seeds("1337,1338,") == [1337, 1338]
    assert compare.parse_list("(128, 512)", int) == [128, 512] and compare.parse_list("") == []


@pytest.mark.parametrize("argv,message", [
    (["--resume"], "compare.py takes no --resume: the same command again reuses finished runs "
     "and resumes stopped ones from their checkpoints; to train them afresh, use another "
     "--out_dir"),
    (["--overwrite"], "compare.py takes no --overwrite: "),
    (["--seed=42"], "compare.py takes no seed: --seeds lists the seeds to train (--seeds=42 for "
     "one, --seeds=42,43,44 for three)"),
    (["--seeds=1", "--noise_floor=2"], "--noise_floor=2: the floor is trained on that many of "
     "the seeds, and --seeds names 1"),
    (["--gap_steps=7"], "--gap_steps=7: the loss is measured every eval_interval=5 steps and at "
     "max_iters; give steps among those"),
    (["--tune", "--plan"], "--plan lists a fixed grid, and --tune's search grows round by "
     "round: run the search with compare.py itself"),
    (["--calibration=no_such_folder"], "--calibration=no_such_folder: no comparison there (no "
     "results.json): name the out_dir of a compare.py run of this setting"),
])
def test_settings_compare_cannot_take_are_one_line_before_anything_is_done(tmp_path, argv,
                                                                          message):
    out = tmp_path / "cmp"
    with pytest.raises(ConfigError) as error:
        compare.main(BASE + [f"--out_dir={out}", "--seeds=1,2", *argv])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert not out.exists()


def test_without_a_preset_it_says_which_and_plans_without_any_data(tmp_path, capsys):
    """No preset named: compare.py's own, said with what it trains; --plan needs no data (it
    may be prepared where the runs will train) and prints one shell command per run."""
    assert compare.main(["--plan", f"--dataset={tmp_path / 'not_prepared'}",
                         f"--out_dir={tmp_path / 'plan'}"]) == 0
    printed = capsys.readouterr()  # (the word on the preset on stderr: stdout is for xargs)
    lines = ["", *printed.out.splitlines()]
    said = next(line.strip("# \n") for line in open(compare.DEFAULT_PRESET) if line[:1] == "#")
    assert printed.err == f"no preset named: config/compare.py ({said})\n"
    cfg = vars(configurator.parse_args(compare.SETTINGS, [compare.DEFAULT_PRESET], ""))
    assert len(lines) - 1 == len(compare.parse_modes(cfg["modes"])) * len(
        compare.parse_seeds(cfg["seeds"])) + cfg["noise_floor"]
    for line in lines[1:]:
        assert re.fullmatch(r"OMP_NUM_THREADS=1 python (train\.py|-m lab\.nudged --nudge=1) "
                            r"--out_dir=\S+ .* && OMP_NUM_THREADS=1 python -m lab\.evaluate "
                            r"--out_dir=\S+", line), line


# ---- statistics and measures, on numbers checkable by hand ----

def test_paired_statistics_and_verdicts_on_known_numbers():
    """Mean, a 95% t interval on n-1 degrees of freedom (t = 4.303 at 2), the seeds lower and the
    sign test; beyond noise only when the interval excludes 0 and the mean exceeds the floor."""
    s = analysis.paired_stats([-0.03, -0.025, -0.02])  # mean -0.025, standard deviation 0.005
    half = 4.303 * 0.005 / math.sqrt(3)
    assert s["mean"] == pytest.approx(-0.025) and s["wins"] == 3
    assert s["interval"] == pytest.approx([-0.025 - half, -0.025 + half])
    assert s["p_lower"] == 1 / 8 and s["p_higher"] == 1.0
    assert analysis.paired_stats([0.5])["interval"] is None
    assert analysis.verdict(s) == ("below vanilla, beyond noise (the 95% interval excludes 0; "
                                   "lower on 3 of 3 seeds: chance alone, 1 in 8)")
    assert analysis.verdict(s, floor=0.01).startswith("below vanilla, beyond noise")
    assert analysis.verdict(s, floor=0.03) == "within the rounding floor (±0.0300): not a result"
    skewed = analysis.paired_stats([-0.01] * 7 + [-1.0])  # lower on all 8, interval holds 0
    assert analysis.verdict(skewed, 0.002) == (
        "not distinguishable from vanilla (lower on 8 of 8 seeds: chance alone, 1 in 256, but by "
        "amounts too uneven for the 95% interval to exclude 0)")
    split = analysis.paired_stats([-0.03, -0.01, 0.01, 0.02])  # no side holds most seeds
    assert analysis.verdict(split) == ("not distinguishable from vanilla (the 95% interval "
                                       "includes 0; lower on 2 of 4 seeds: chance alone, 1 in 1)")
    # +0.000 as printed, its interval above 0: level, whatever the floor (0, or not measured)
    level = analysis.paired_stats([0.0001, 0.0002, 0.00015])
    assert level["interval"][0] > 0 and f"{level['mean']:+.3f}" == "+0.000"
    assert analysis.verdict(level, 0.0) == analysis.verdict(level) == (
        "level with vanilla (+0.000): not a result")
    higher = analysis.paired_stats([0.03] * 7 + [0.0])  # a tie counts as neither
    assert analysis.verdict(higher, 0.002) == ("above vanilla, beyond noise (the 95% interval "
                                               "excludes 0; higher on 7 of 8 seeds: chance "
                                               "alone, 1 in 28)")
    assert analysis.verdict(analysis.paired_stats([0.001]), 0.002) == (
        "one seed: no interval, within the rounding floor")


def test_crossing_and_the_next_learning_rate_to_try():
    tokens, losses = [0, 100, 200, 300], [5.0, 3.0, 2.0, 1.5]
    assert analysis.crossing(tokens, losses, 2.5) == pytest.approx(150.0)
    assert analysis.crossing(tokens, losses, 2.0) == pytest.approx(200.0)
    assert analysis.crossing(tokens, losses, 1.0) is None  # the curve stays above
    inf = float("inf")
    # An edge optimum extends the grid by the edge's own step, up to the cap.
    assert analysis.next_lr({1: 3, 2: 2, 4: 1}, lowest=0.1, highest=16) == 8
    assert analysis.next_lr({1: 1, 2: 2, 4: 3}, lowest=0.1, highest=16) == 0.5
    assert analysis.next_lr({1: 3, 2: 2, 4: 1}, lowest=0.1, highest=4) is None
    # An interior optimum with a coarse neighbour gets the midpoint (steps at most sqrt 2).
    assert analysis.next_lr({1: 3, 2: 1, 4: 3}, lowest=0.1, highest=16) == 1.41
    assert analysis.next_lr({1: 3, 1.41: 2, 2: 1, 2.83: 2, 4: 2.5}, 0.1, 16) is None
    assert analysis.next_lr({1: 3, 1.41: 2, 2: 1, 2.83: 2}, 0.1, 16) == 4  # twice the best
    # A diverged run counts as worse, not as an error.
    assert analysis.next_lr({1: 3, 1.41: 2, 2: 1, 2.83: inf}, 0.1, 16) is None
    assert analysis.bracketed({1: 3, 2: 1, 4: inf}) and not analysis.bracketed({1: 3, 2: 1})


def test_the_vanilla_size_line_on_made_up_numbers():
    """Vanilla at 3 sizes on loss = 5 - 0.2 ln N (each size's seeds centred on it); ResFormer of
    150k parameters at the loss of a 300k vanilla matches a vanilla model 100% larger."""
    def line(n):
        return 5 - 0.2 * math.log(n)

    def sized(n, loss, spread):
        return {"num_params": int(n), "seeds": [1, 2, 3],
                "val_loss": [loss - spread, loss, loss + spread]}
    results = {name: sized(n, line(n), spread) for name, n, spread in (
        ("vanilla:n_embd=8", 1e5, 0.01), ("vanilla", 2e5, 0.0), ("vanilla:n_embd=24", 4e5, 0.02))}
    results["resformer"] = sized(1.5e5, line(3e5), 0.01)
    curve = analysis.vanilla_curve(results)
    assert curve["line"] == pytest.approx([5, -0.2]) and not curve["poor"]
    placed = curve["placed"]["resformer"]
    assert placed["larger"] == pytest.approx(1.0) and placed["matched_params"] == pytest.approx(3e5)
    assert placed["inside"] and placed["interval"][0] <= 1.0 <= placed["interval"][1]
    assert curve["vanilla_reading"] == pytest.approx(0.0, abs=1e-9)  # on its own line
    two_sizes = {n: results[n] for n in ("vanilla", "vanilla:n_embd=8", "resformer")}
    assert analysis.vanilla_curve(two_sizes) is None


def test_attention_entropy_and_token_similarity_at_their_limits():
    T = 8
    uniform = torch.full((2, 3, T, T), 1.0 / T)  # each key receives the same
    assert analysis.attention_entropy(uniform) == pytest.approx(math.log(T), abs=1e-6)
    one_key = torch.zeros(2, 3, T, T)
    one_key[..., 0] = 1.0  # every query looks at key 0 alone
    assert analysis.attention_entropy(one_key) == pytest.approx(0.0, abs=1e-6)
    same = torch.randn(1, 1, 16).expand(2, 5, 16)
    assert analysis.token_similarity(same) == pytest.approx(1.0, abs=1e-6)
    assert analysis.token_similarity(torch.eye(4).unsqueeze(0)) == pytest.approx(0.0, abs=1e-6)


def test_the_analysis_takes_the_attention_the_model_computed_after_a_students_edit(monkeypatch):
    """Issue 46: a line that changes q before the attention call (here q rolled and scaled, as
    RoPE or QK-norm would change it): the weights recorded still give the layer's output."""
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
    outputs = []
    hook = gpt.transformer.h[1].attn.register_forward_hook(lambda m, a, out: outputs.append(out))
    attention, hidden = analysis.internals(gpt, torch.randint(64, (1, 10)))
    hook.remove()
    out, value = outputs[-1]
    y = (attention[1] @ value).transpose(1, 2).reshape(1, 10, 16)
    assert torch.allclose(gpt.transformer.h[1].attn.c_proj(y), out, atol=1e-5)
    assert len(hidden) == 2 and hidden[1].shape == (1, 10, 16)


def test_the_cache_check_passes_the_real_cache_and_fails_a_broken_one(monkeypatch):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=64)).eval()
    seq = torch.randint(64, (2, 12))
    assert analysis.cache_logit_error(gpt, seq, 4) < analysis.LOGIT_TOLERANCE
    # A cache that forgets the past: each decoded token attends to itself alone.
    monkeypatch.setattr(model.KVCache, "store", lambda self, layer, k, v: (k, v))
    assert analysis.cache_logit_error(gpt, seq, 4) > 10 * analysis.LOGIT_TOLERANCE


def test_the_floor_nudges_each_initial_weight_one_float32_step(monkeypatch):
    """python -m lab.nudged builds train.py's model with each weight one float32 step up or down
    (a fair coin per weight) and hands the rest of its command line to train.py."""
    import train
    from lab import nudged
    config = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=64)
    seen = {}

    def building(argv):  # train.py as far as building its model
        torch.manual_seed(3)
        seen.update(argv=argv, model=train.GPT(config))
    monkeypatch.setattr(train, "main", building)
    nudged.main(["--nudge=1", "--seed=3"])
    assert seen["argv"] == ["--seed=3"] and train.GPT is GPT  # its own GPT again after
    torch.manual_seed(3)
    plain = dict(GPT(config).named_parameters())
    ups = total = 0
    for name, b in seen["model"].named_parameters():
        a = plain[name].detach()
        up = torch.nextafter(a, torch.full_like(a, math.inf))
        down = torch.nextafter(a, torch.full_like(a, -math.inf))
        assert bool(((b == up) | (b == down)).all()), name
        ups, total = ups + int((b == up).sum()), total + a.numel()
    assert 0.45 < ups / total < 0.55
    with pytest.raises(ConfigError, match="takes --nudge=N"):
        nudged.main(["--nudge=0"])


# ---- one seed with a calibration (the demo) ----

def test_one_seed_is_shown_with_where_the_calibrations_seeds_put_it(tiny, plays, tmp_path,
                                                                     quick, capsys):
    """--calibration: a comparison of this setting on other seeds (the tiny one, seeds 1 and 2).
    Each difference of the one seed is given with those seeds' lowest and highest; a
    calibration of other code is not used, said on stdout and in results.md."""
    out = tmp_path / "one"
    args = BASE + [f"--dataset={plays}", f"--out_dir={out}", "--seeds=7",
                   "--modes=vanilla,svformer"]
    assert compare.main(args + [f"--calibration={tiny.out}"]) == 0
    spread = tiny.results["modes"]["svformer"]["paired"]["differences"]
    r = json.loads((out / "results.json").read_text())["modes"]["svformer"]
    assert r["band_source"] == "seeds" and r["band_seeds"] == [1, 2]
    assert r["band"] == [min(spread), max(spread)]
    md = (out / "results.md").read_text()
    assert md.startswith("# Value residual comparison\n\n**Verdict: one seed (7), so each "
                         "difference is one draw.**")
    assert f"the same difference reached on 2 other seeds ({tiny.out}):" in md
    assert (f"- SVFormer: {r['paired']['mean']:+.3f}; on the other seeds {min(spread):+.3f} to "
            f"{max(spread):+.3f}") in md
    assert "\n| SVFormer | " in md
    other = tmp_path / "other"
    shutil.copytree(tiny.out, other, ignore=shutil.ignore_patterns("*.pt", "*.png"))
    for path in other.glob("*/summary.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "code": "0" * 16}))
    capsys.readouterr()
    assert compare.main(args + [f"--calibration={other}"]) == 0
    printed = capsys.readouterr().out
    why = (f"{other / 'vanilla_seed1'} was trained by other code (code version {'0' * 16} there, "
           f"{runs.code_version()} today)")
    assert f"calibration: none for vanilla: {why}\n" in printed and ": training" not in printed
    assert f"- the calibration has none for vanilla: {why}\n" in (out / "results.md").read_text()
    r = json.loads((out / "results.json").read_text())["modes"]["svformer"]
    assert r["band_source"] == "rounding"


# ---- the learning-rate search and each variant's own lr (stand-in runs) ----

def stand_in(optimum, calls):
    """A run_grid that trains nothing: a run's final loss is a U in log lr around its mode's
    optimum, and it diverges above 2.5 times it; every run asked for is kept in calls."""
    def run_grid(grid, *args, **kwargs):
        done = {}
        for key, cfg in grid:
            calls.append(cfg)
            lr, best = cfg["learning_rate"], optimum[cfg["value_mode"]]
            loss = 2 + math.log(lr / best) ** 2 + 0.01 * cfg["seed"]
            done[key] = {"status": "diverged" if lr > 2.5 * best else "done", "config": cfg,
                         "val_loss_full": loss, "num_params": 1, "kv_cache_bytes_per_token": 1,
                         "evals": [{"iter": 0, "tokens": 0, "val_loss": 5.0},
                                   {"iter": 10, "tokens": 640, "val_loss": loss}],
                         "tokens_per_sec": 1.0, "attention_entropy": [1.0], "similarity": [0.5]}
        return done, False, []
    return run_grid


def test_tune_brackets_each_best_lr_and_warns_when_it_is_the_grids_edge(plays, tmp_path, capsys,
                                                                       monkeypatch):
    """The search seeds alone search; each variant's best gets a worse neighbour each side, a
    diverged run counting as worse; a best at an edge the grid may not pass is a WARNING."""
    calls = []
    monkeypatch.setattr(compare, "run_grid", stand_in({"vanilla": 0.01, "resformer": 1.5e-3},
                                                      calls))
    monkeypatch.setattr(lab_grid, "run_grid", compare.run_grid)
    monkeypatch.setattr(plots, "write_all", lambda *args, **kwargs: [])
    args = BASE + [f"--dataset={plays}", "--tune", "--tune_lrs=1e-3,2e-3,4e-3",
                   "--tune_seeds=1,2", "--seeds=5", "--modes=vanilla,resformer"]
    assert compare.main(args + [f"--out_dir={tmp_path / 'a'}"]) == 0
    assert "WARNING" not in capsys.readouterr().out
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    for name, optimum in (("vanilla", 0.01), ("resformer", 1.5e-3)):
        means = {float(lr): np.mean(v) for lr, v in results["lr_search"][name].items()}
        best = results["info"]["best_lrs"][name]
        assert best == min(means, key=means.get) and analysis.bracketed(means), means
        assert abs(math.log(best / optimum)) < math.log(1.45)
    assert math.isinf(results["lr_search"]["resformer"]["0.004"][0])  # diverged: worse
    assert {c["seed"] for c in calls if "lr_search" in c["out_dir"]} == {1, 2}
    assert {c["seed"] for c in calls if "lr_search" not in c["out_dir"]} == {5}
    assert compare.main(args + [f"--out_dir={tmp_path / 'b'}", "--tune_extend=0"]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "WARNING" in line]
    assert warnings == ["WARNING: vanilla's best, 0.004, is the edge of the grid searched "
                        "(--tune_extend=0 reached): not a bracketed optimum; widen --tune_lrs "
                        "or raise --tune_extend"]


def test_lrs_trains_each_named_variant_at_its_own_peak_lr(plays, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(compare, "run_grid", stand_in({"vanilla": 0.01, "resformer": 0.02,
                                                       "svformer": 0.01}, calls))
    monkeypatch.setattr(plots, "write_all", lambda *args, **kwargs: [])
    assert compare.main(BASE + [f"--dataset={plays}", f"--out_dir={tmp_path}", "--seeds=5",
                                "--modes=vanilla,resformer,svformer", "--learning_rate=3e-3",
                                "--min_lr=3e-4", "--lrs=vanilla=1e-2,resformer=2e-2"]) == 0
    assert {(c["value_mode"], c["learning_rate"], c["min_lr"]) for c in calls} == {
        ("vanilla", 1e-2, 1e-3), ("resformer", 2e-2, 2e-3), ("svformer", 3e-3, 3e-4)}
    assert ("Each variant at its own peak learning rate (vanilla 0.01, resformer 0.02, svformer "
            "0.003) (named by --lrs for vanilla, resformer; svformer at the preset's "
            "learning_rate).") in (tmp_path / "results.md").read_text()
    with pytest.raises(ConfigError, match=r"^--lrs: 'vanila=1e-2' is not variant=learning_rate "
                                          r"for a variant \(vanilla, resformer, svformer, ...\)$"):
        compare.main(BASE + [f"--dataset={plays}", f"--out_dir={tmp_path}", "--lrs=vanila=1e-2"])


# ---- pictures ----

def test_the_live_picture_is_drawn_from_the_logs_with_the_floor_as_a_grey_band(tmp_path,
                                                                              monkeypatch):
    """While the runs train, loss.png is drawn from their logs: the variants named in words, a
    difference panel only with vanilla, and the noise floor a grey band there, not a line."""
    plt = plots.pyplot()
    drawn, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig) or close(fig))
    logs = {("vanilla", 1): [5.5, 3.0, 2.8], ("vanilla", 2): [5.5, 3.1, 2.9],
            ("resformer", 1): [5.5, 2.9, 2.7], (FLOOR, 1): [5.5, 3.02, 2.79]}
    grid = []
    for (name, seed), losses in logs.items():
        run_dir = tmp_path / f"{name.replace(':', '-')}_seed{seed}"
        run_dir.mkdir()
        (run_dir / "log.jsonl").write_text("".join(json.dumps(
            {"kind": "eval", "iter": 10 * i, "tokens": 640 * i, "val_loss": loss}) + "\n"
            for i, loss in enumerate(losses)))
        grid.append(((name, seed, ""), {"out_dir": str(run_dir)}))
    assert plots.live_loss(str(tmp_path), grid) == str(tmp_path / "loss.png")
    assert (tmp_path / "loss.png").is_file() and not (tmp_path / "loss.live.png").exists()
    top, gap = drawn[-1].axes  # the curves, then one panel a variant: resformer - vanilla
    assert [t.get_text() for t in top.get_legend().get_texts()] == [
        plots.label("vanilla"), plots.label("resformer")]  # no line of the floor's
    band, = [c for c in gap.collections if c.get_paths() and len(c.get_paths()[0].vertices)]
    assert max(band.get_paths()[0].vertices[:, 1]) == pytest.approx(0.02)  # |3.02 - 3.0|
    red, green, blue, _ = band.get_facecolor()[0]
    assert red == green == blue  # grey, and said with its size at the end
    said = [t.get_text().replace("\n", " ") for t in gap.get_legend().get_texts()]
    end = abs(logs[FLOOR, 1][-1] - logs["vanilla", 1][-1])  # the last step's, not the largest
    assert said[-1] == plots.textwrap.fill(f"{plots.FLOOR_LABEL}: {end:.3f} at the end (one "
                                           f"draw: on another seed it can be far larger)",
                                           34).replace("\n", " ")
    assert gap.get_xlabel() == "step (64 tokens each)"
    plots.live_loss(str(tmp_path), [item for item in grid if item[0][0] == "resformer"])
    assert len(drawn[-1].axes) == 1  # without vanilla: no difference to draw


def test_the_word_every_30_s_says_what_each_run_is_doing(tmp_path):
    """No dead air: the progress line reads train.py's own lines as they come (log.jsonl is
    written only at checkpoints), and names a run whose train.py is done as evaluating."""
    run, other = tmp_path / "vanilla_seed1", tmp_path / "svformer_seed1"
    run.mkdir()
    (run / "train.out").write_text("training vanilla_seed1 at step 0: vanilla, ...\n"
                                   "step 0: train loss 5.5000, val loss 5.4321\n"
                                   "step 20: train loss 3.3000, val loss 3.2500\n"
                                   "iter 30/250: loss 3.1000, lr 8.50e-03, 9 ms/step\n")
    assert runs.read_log(run) == [] and runs.last_step(run) == (30, 3.25)
    now = time.time()
    said = runs.progress([[("vanilla", 1, ""), {"out_dir": str(run), "max_iters": 250}, None,
                           None, ["eval"]],
                          [("svformer", 1, ""), {"out_dir": str(other), "max_iters": 250}, None,
                           None, []]], now, {("svformer", 1, ""): now - 42})
    assert said == ("   0.0 min so far:\n      vanilla, seed 1: step 30 of 250\n"
                    "      SVFormer, seed 1: its loss on every validation token, 42 s so far")


def test_pictures_and_tables_name_the_variants_in_words():
    """One name per variant wherever a class reads it: ResFormer always with its two lambdas
    (λ2 = 1 left unsaid: the paper's U = A (V_n + λ1 V_1)); the exact name only beside it."""
    assert plots.label("resformer") == "ResFormer λ1 = λ2 = 0.5"  # model.py's default mix
    assert plots.label("resformer:lambda_1=2:lambda_2=1") == "ResFormer λ1 = 2"
    assert plots.label("resformer:lambda_1=2") == "ResFormer λ1 = 2, λ2 = 0.5"
    assert plots.label("resformer_learnable") == "ResFormer, learned λ1 and λ2"
    assert plots.label("svformer_kv1") == "SVFormer, 1 KV head"
    assert plots.label("vanilla:n_embd=24") == "vanilla, n_embd = 24"
    assert plots.label("value_embed") == "value embeddings"
    assert plots.label("not_a_mode") == "not_a_mode"
    assert tables.named("resformer:lambda_1=2:lambda_2=1") == (
        "ResFormer λ1 = 2 (`resformer:lambda_1=2:lambda_2=1`)")
    assert tables.named("svformer") == "SVFormer"  # (the same word)


# ---- failures ----

def test_a_runs_mistake_is_its_one_line_and_failed_runs_end_the_command_without_tables(
        plays, tmp_path, quick, capsys):
    """A run train.py refuses (a variant's n_head that does not divide its width) says
    train.py's one line; the others finish; the command ends in one line, exit 1, no tables
    that would leave it out."""
    out = tmp_path / "cmp"
    assert compare.main(BASE + [f"--dataset={plays}", f"--out_dir={out}", "--seeds=1",
                                "--noise_floor=0", "--modes=vanilla,vanilla:n_head=3"]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert (f"    FAILED {out / 'vanilla-n_head=3_seed1'} (exit 1): error: n_embd (16) must be "
            f"divisible by n_head (3)") in printed
    assert printed[-1] == ("1 of 2 runs failed (vanilla-n_head=3_seed1): fix it and run the "
                           "same command again; finished runs are reused")
    assert (out / "vanilla_seed1" / "summary.json").is_file()
    assert not (out / "results.md").exists() and not (out / "results.json").exists()


# ---- real processes: a plan run by a scheduler, a student's bug, Ctrl-C ----

def test_a_plan_run_by_xargs_is_reused_by_the_same_command(plays, tmp_path, quick, capsys):
    """--plan's lines are shell commands from the project's folder (train.py, then lab.evaluate):
    any scheduler runs them (here xargs, two at a time); the same command then trains nothing,
    reuses every run and writes the tables."""
    out = tmp_path / "cmp"
    args = BASE + [f"--dataset={plays}", f"--out_dir={out}", "--seeds=1", "--noise_floor=0",
                   "--modes=vanilla,svformer"]
    assert compare.main(args + ["--plan"]) == 0
    plan = capsys.readouterr().out
    assert len(plan.splitlines()) == 2 and all(
        " train.py --out_dir=" in line and " && OMP_NUM_THREADS=1 python -m lab.evaluate "
        "--out_dir=" in line for line in plan.splitlines())
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    done = subprocess.run(["xargs", "-P", "2", "-I{}", "sh", "-c", "{}"], input=plan, cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert compare.main(args) == 0
    assert ": training" not in capsys.readouterr().out
    assert "(2 of 2 runs reused)" in (out / "results.md").read_text()
    summary = json.loads((out / "vanilla_seed1" / "summary.json").read_text())
    assert summary["code"] == runs.code_version()
    assert summary["machine"] == "an unrecorded machine, by a --plan command"


def test_a_bug_in_model_py_is_shown_at_its_line_and_no_tables_pretend(plays, tmp_path):
    """A student's line raising in CausalSelfAttention.forward (in a copy of the project): the
    FAILED line shows model.py's frame, its code and the error, names train.out for the whole
    traceback, and the command ends in one line, exit 1, with no results.md."""
    project = tmp_path / "project"
    project.mkdir()
    for path in ROOT.glob("*.py"):
        shutil.copy(path, project)
    for folder in ("lab", "config"):
        shutil.copytree(ROOT / folder, project / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    source = (project / "model.py").read_text()
    anchor = ("        q, k = self.heads(parts[0], self.n_head), "
              "self.heads(parts[1], self.n_kv_head)\n")
    bug = "q = q.view(B, T, C + 1)  # the student's line"
    assert source.count(anchor) == 1
    (project / "model.py").write_text(source.replace(anchor, anchor + f"        {bug}\n"))
    line = source.splitlines().index(anchor.rstrip("\n")) + 2
    done = subprocess.run([sys.executable, "compare.py", "config/quickstart.py", *BASE[1:],
                           f"--dataset={plays}", "--out_dir=out", "--seeds=1", "--modes=vanilla",
                           "--noise_floor=0"], cwd=project, capture_output=True, text=True,
                          timeout=300)
    printed = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    at = printed.index("    FAILED out/vanilla_seed1 (exit 1):")
    assert printed[at + 1:at + 3] == [
        f'        File "{project / "model.py"}", line {line}, in forward', f"          {bug}"]
    assert printed[at + 3].startswith("      RuntimeError: shape '[")
    assert printed[at + 4] == "      the whole traceback: out/vanilla_seed1/train.out"
    assert printed[-1] == ("1 of 1 run failed (vanilla_seed1): fix it and run the same command "
                           "again; finished runs are reused")
    assert not (project / "out" / "results.md").exists() and "Verdict" not in done.stdout


def test_ctrl_c_exits_130_and_the_same_command_goes_on_from_the_checkpoint(plays, tmp_path,
                                                                          quick, capsys):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) once the run has a
    checkpoint, and again while it stops: compare exits 130 saying once, in one line, how to go
    on; the same command resumes the run from its checkpoint, each step trained and logged once."""
    out = tmp_path / "cmp"
    run = out / "vanilla_seed1"
    args = BASE + [f"--dataset={plays}", f"--out_dir={out}", "--seeds=1", "--modes=vanilla",
                   "--noise_floor=0", "--max_iters=320", "--eval_interval=40"]
    # A shell's background job starts with SIGINT ignored, and its children inherit that: the
    # process gets the default handler whatever started pytest.
    process = subprocess.Popen([sys.executable, "compare.py", *args], cwd=ROOT,
                               start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not (run / "ckpt.pt").is_file() and time.time() < deadline and process.poll() is None:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGINT)
    time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    printed, _ = process.communicate(timeout=60)
    assert process.returncode == 130, printed
    said = [line for line in printed.splitlines() if "Ctrl-C" in line or "interrupt" in line]
    assert said == [printed.rstrip().splitlines()[-1]] == [
        f"Ctrl-C: stopped; finished runs are kept in {out}, stopped ones keep their last "
        f"checkpoint: the same command again goes on from there"], printed
    stopped_at = data.load_checkpoint(str(run / "ckpt.pt"))["iter_num"]
    assert 0 < stopped_at < 320 and not (run / "summary.json").exists()
    assert compare.main(args) == 0
    assert f"[1/1] {run}: resuming from its checkpoint" in capsys.readouterr().out
    log = runs.read_log(run)
    assert [e["iter"] for e in log if e["kind"] == "train"] == list(range(5, 321, 5))
    assert [e["iter"] for e in log if e["kind"] == "eval"] == list(range(0, 321, 40))
    assert [e["iter"] for e in log if e["kind"] == "final"] == [320]


def test_a_calibration_missing_a_run_names_what_is_there_and_advises_no_deletion(
        tiny, plays, tmp_path, quick, capsys):
    """A calibration is a record: its reasons never advise deleting it, and never name a folder
    that is not there (a seed it lacks), nor call a run of other settings anything else."""
    other = tmp_path / "other"
    shutil.copytree(tiny.out, other, ignore=shutil.ignore_patterns("*.pt", "*.png"))
    shutil.rmtree(other / "svformer_seed2")  # a run never made
    summary = other / "vanilla_seed1" / "summary.json"
    record = json.loads(summary.read_text())
    summary.write_text(json.dumps({**record, "config": {**record["config"], "dropout": 0.2}}))
    args = BASE + [f"--dataset={plays}", f"--out_dir={tmp_path / 'one'}", "--seeds=7",
                   "--modes=vanilla,svformer", f"--calibration={other}"]
    assert compare.main(args) == 0
    printed = capsys.readouterr().out
    assert (f"calibration: none for vanilla: {other / 'vanilla_seed1'} holds a run of other "
            f"settings\n") in printed
    assert f"calibration: none for svformer: {other} has no run of it on seed 2\n" in printed
    assert "delete" not in printed and "not finished there" not in printed
