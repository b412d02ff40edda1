"""README's "Add your own mode", followed to the letter: its four edits to model.py in a copy of
the project, and then train.py, sample.py, compare.py and bench.py run the new mode with no other
file touched."""
import json
import os
import shutil
import subprocess
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The README's four edits: (the line they go after, or before, or replace, in model.py; the
# lines added).
EDITS = [
    ('    "value_embed": "value embeddings",', '    "gated": "gated residual",', "after"),
    ('MIXING_WEIGHTS = ("value_lambdas", "value_lambda")',
     'MIXING_WEIGHTS = ("value_lambdas", "value_lambda", "gate")', "replace"),
    ("            self.value_lambda = nn.Parameter(torch.tensor(0.5))",
     '        if config.value_mode == "gated" and layer_idx > 0:\n'
     "            self.gate = nn.Parameter(torch.zeros(()))", "after"),
    ("        else:\n            raise NotImplementedError",
     '        elif self.value_mode == "gated":\n'
     "            value = v + self.gate * first_value", "before"),
]


def readme():
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_the_readme_shows_the_edits_this_test_makes():
    text = readme()
    assert "## Add your own mode" in text
    for _, added, _ in EDITS:
        for line in added.splitlines():
            assert line.strip() in text, line  # the README's snippet, line for line


def follow_the_readme(project):
    for name in ("model.py", "train.py", "sample.py", "prepare.py", "compare.py", "bench.py",
                 "data.py", "configurator.py"):
        shutil.copy(os.path.join(ROOT, name), project / name)
    for folder in ("lab", "config", "corpus"):
        shutil.copytree(os.path.join(ROOT, folder), project / folder)
    source = (project / "model.py").read_text()
    for anchor, added, where in EDITS:
        assert source.count(anchor) == 1, anchor
        source = source.replace(anchor, f"{anchor}\n{added}" if where == "after"
                                else added if where == "replace" else f"{added}\n{anchor}")
    (project / "model.py").write_text(source)


def run(project, *args, timeout=300):
    result = subprocess.run([sys.executable, *args], cwd=project, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout + result.stderr


def test_a_mode_added_in_model_py_alone_works_everywhere(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    follow_the_readme(project)
    text = "".join(f"KING {i % 7}:\nWhat say you, my lord, of the {i % 13} ships?\n\n"
                   for i in range(300))
    (project / "plays.txt").write_text(text)
    run(project, "prepare.py", "--input=plays.txt", "--name=tiny", "--val_fraction=0.2")
    tiny = ["--dataset=tiny", "--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16",
            "--batch_size=4", "--eval_iters=2", "--log_interval=5", "--warmup_iters=2"]
    out = run(project, "train.py", "--value_mode=gated", "--max_iters=10", "--eval_interval=5",
              "--out_dir=out-gated", *tiny)
    assert ", gate " in out  # the eval lines show it, as they show the lambdas
    log = [json.loads(line) for line in open(project / "out-gated" / "log.jsonl")]
    evals = [r for r in log if r["kind"] == "eval"]
    assert list(evals[-1]["mixing"]) == ["transformer.h.1.attn.gate"]
    assert evals[-1]["mixing"]["transformer.h.1.attn.gate"] != 0.0  # it learned, undecayed
    out = run(project, "sample.py", "--out_dir=out-gated", "--num_samples=1",
              "--max_new_tokens=20")
    assert "gated, cache on" in out
    out = run(project, "compare.py", "--modes=vanilla,gated", "--seeds=1,2", "--max_iters=6",
              "--eval_interval=3", "--less_data=0", "--lrs=", "--jobs=2",
              "--analysis_samples=2", "--out_dir=out-cmp", *tiny, timeout=600)
    results = json.load(open(project / "out-cmp" / "results.json"))
    # (and compare's noise floor: vanilla again, nudged one rounding step, on the first seed)
    assert set(results["modes"]) == {"vanilla", "gated", "vanilla:nudge=1"}
    assert results["modes"]["gated"]["paired"]["n"] == 2
    out = run(project, "bench.py", "--modes=vanilla,gated", "--parts=train,cache",
              "--train_steps=2", "--warmup_steps=1", "--json_out=bench.json", "--n_layer=2",
              "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2")
    bench = json.load(open(project / "bench.json"))
    assert set(bench["train"]["modes"]) == {"vanilla", "gated"}
    assert {r["mode"] for r in bench["cache"]["rows"]} >= {"vanilla", "gated"}
