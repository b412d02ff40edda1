"""README's recipes followed to the letter in a copy of the project: "Add your own mode" (four
edits to model.py; then train.py, sample.py, compare.py and bench.py run the new mode with no
other file touched) and "Positions of your own" (RoPE in one function and its call: cached and
uncached logits agree, and compare.py meets the edited model with no number of the old code)."""
import json
import os
import shutil
import subprocess
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The README's edits: (the line they go after, or before, or replace, in model.py; the lines).
EDITS = [
    ('    "value_embed": "value embeddings",', '    "gated": "gated residual",', "after"),
    ('MIXING_WEIGHTS = {"value_lambdas": "lambda_1/lambda_2", "value_lambda": "lambda"}',
     'MIXING_WEIGHTS = {"value_lambdas": "lambda_1/lambda_2", "value_lambda": "lambda", '
     '"gate": "gate"}', "replace"),
    ("            self.value_lambda = nn.Parameter(torch.tensor(0.5))",
     '        if config.value_mode == "gated" and layer_idx > 0:\n'
     "            self.gate = nn.Parameter(torch.zeros(()))", "after"),
    ("        else:\n            raise NotImplementedError",
     '        elif self.value_mode == "gated":\n'
     "            value = v + self.gate * first_value", "before"),
]
ROPE = [
    ("            wpe=nn.Embedding(config.block_size, config.n_embd),  # positions: used in "
     "forward only\n", "", "replace"),
    ("        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))",
     "        x = self.transformer.drop(self.transformer.wte(idx))", "replace"),
    ("        v = self.heads(parts[2], self.n_kv_head) if self.owns_value else None  # None: no "
     "W_V here",
     "        q, k = rope(q, k, kv_cache.length if kv_cache is not None else 0)", "after"),
    ("class KVCache:",
     "def rope(q, k, start):\n"
     '    """Rotary positions (RoFormer): each pair of features of q and k turned by an angle that\n'
     '    grows with the position, so attention sees how far apart two tokens are."""\n'
     "    T, half = q.size(2), q.size(3) // 2\n"
     "    freq = 10000 ** (-torch.arange(half, device=q.device) / half)\n"
     "    angle = torch.arange(start, start + T, device=q.device)[:, None] * freq  # (T, half)\n"
     "    cos, sin = angle.cos(), angle.sin()\n"
     "    turn = lambda t: torch.cat([t[..., :half] * cos - t[..., half:] * sin,  # noqa: E731\n"
     "                                t[..., :half] * sin + t[..., half:] * cos], dim=-1)\n"
     "    return turn(q), turn(k)\n\n", "before"),
]
TEXT = "".join(f"KING {i % 7}:\nWhat say you, my lord, of the {i % 13} ships?\n\n"
               for i in range(300))
TINY = ["--dataset=plays_byte", "--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16",
        "--batch_size=4", "--eval_iters=2", "--log_interval=5", "--warmup_iters=2"]


def readme():
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_the_readme_shows_the_edits_these_tests_make():
    text = readme()
    assert "## Add your own mode" in text and "RoPE" in text
    for _, added, _ in EDITS + ROPE:
        for line in added.splitlines():
            assert line.split("  #")[0].strip() in text, line  # the README's snippets, line by line


def copy_project(project, edits):
    project.mkdir()
    for name in ("model.py", "train.py", "sample.py", "prepare.py", "compare.py", "bench.py",
                 "data.py", "configurator.py"):
        shutil.copy(os.path.join(ROOT, name), project / name)
    for folder in ("lab", "config", "corpus"):
        shutil.copytree(os.path.join(ROOT, folder), project / folder)
    edit(project, edits)
    (project / "plays.txt").write_text(TEXT)


def edit(project, edits):
    source = (project / "model.py").read_text()
    for anchor, added, where in edits:
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
    copy_project(project, EDITS)
    run(project, "prepare.py", "--input=plays.txt", "--val_fraction=0.2")
    out = run(project, "train.py", "--value_mode=gated", "--max_iters=10", "--eval_interval=5",
              "--out_dir=out-gated", *TINY)
    assert ", gate by layer 2: " in out  # the eval lines show it, labelled, as the lambdas
    log = [json.loads(line) for line in open(project / "out-gated" / "log.jsonl")]
    evals = [r for r in log if r["kind"] == "eval"]
    assert list(evals[-1]["mixing"]) == ["transformer.h.1.attn.gate"]
    assert evals[-1]["mixing"]["transformer.h.1.attn.gate"] != 0.0  # it learned, undecayed
    out = run(project, "sample.py", "--out_dir=out-gated", "--num_samples=1",
              "--max_new_tokens=20")
    assert "gated, cache on" in out
    run(project, "compare.py", "--modes=vanilla,gated", "--seeds=1,2", "--max_iters=6",
        "--eval_interval=3", "--lrs=", "--jobs=2", "--analysis_samples=2", "--out_dir=out-cmp",
        *TINY, timeout=600)
    results = json.load(open(project / "out-cmp" / "results.json"))
    # (and compare's noise floor: vanilla again, nudged one rounding step, on the first seed)
    assert set(results["modes"]) == {"vanilla", "gated", "vanilla:nudge=1"}
    assert results["modes"]["gated"]["paired"]["n"] == 2
    run(project, "bench.py", "--modes=vanilla,gated", "--parts=train,cache", "--train_steps=2",
        "--warmup_steps=1", "--json_out=bench.json", "--n_layer=2", "--n_head=2", "--n_embd=16",
        "--block_size=16", "--batch_size=2")
    bench = json.load(open(project / "bench.json"))
    assert set(bench["train"]["modes"]) == {"vanilla", "gated"}
    assert {r["mode"] for r in bench["cache"]["rows"]} >= {"vanilla", "gated"}


CACHED_AGAINST_UNCACHED = """
import torch
from model import GPT, GPTConfig
for mode in ("vanilla", "resformer", "svformer", "value_embed"):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2,
                          n_embd=32, value_mode=mode)).eval()
    assert not any("wpe" in name for name, _ in model.named_parameters())
    x = torch.randint(64, (2, 16))
    full, _ = model(x, all_logits=True)
    cache = model.new_kv_cache(2)
    with torch.no_grad():
        steps = [model(x[:, :5], kv_cache=cache, all_logits=True)[0]]
        steps += [model(x[:, t:t + 1], kv_cache=cache)[0] for t in range(5, 16)]
    error = (torch.cat(steps, dim=1) - full).abs().max().item()
    assert error < 1e-5, (mode, error)
    shifted, _ = model(torch.roll(x, 1, dims=1), all_logits=True)  # positions matter
    assert not torch.allclose(shifted[:, 1:], full[:, :-1], atol=1e-3)
print("cached = uncached")
"""


def test_rope_from_the_readme_is_one_function_and_compare_never_shows_the_old_code(tmp_path):
    """The README's RoPE: learned positions out, one function and its call in. Cached and
    uncached logits agree in every mode; train.py and sample.py run it. A comparison made
    before the edit (its runs, and a calibration of them) is not reused: the same command again
    trains every run afresh and says why in one line each, and its table is the edited code's."""
    project = tmp_path / "project"
    copy_project(project, [])
    run(project, "prepare.py", "--input=plays.txt", "--dataset=plays", "--val_fraction=0.2")
    compare = ["compare.py", "--modes=vanilla,svformer", "--seeds=1", "--max_iters=6",
               "--eval_interval=3", "--noise_floor=0", "--lrs=", "--jobs=2",
               "--analysis_samples=2", *TINY]
    run(project, *compare, "--out_dir=before", "--seeds=5,6", timeout=600)  # a calibration
    run(project, *compare, "--out_dir=out-cmp", timeout=600)
    old = json.load(open(project / "out-cmp" / "results.json"))["modes"]["svformer"]["val_loss"]
    again = run(project, *compare, "--out_dir=out-cmp", "--calibration=before", timeout=600)
    assert "not reused" not in again and "calibration: none for" not in again  # unchanged code
    edit(project, ROPE)
    assert "cached = uncached" in run(project, "-c", CACHED_AGAINST_UNCACHED)
    run(project, "train.py", "--value_mode=svformer", "--max_iters=4", "--eval_interval=2",
        "--out_dir=out-rope", *TINY)
    run(project, "sample.py", "--out_dir=out-rope", "--num_samples=1", "--max_new_tokens=20")
    printed = run(project, *compare, "--out_dir=out-cmp", "--calibration=before", timeout=600)
    set_aside = [line for line in printed.splitlines() if line.startswith("not reused: ")]
    assert len(set_aside) == 2 and all("was trained by other code: the probe differs" in line
                                       for line in set_aside), printed
    unused = [line for line in printed.splitlines() if line.startswith("calibration: none for")]
    assert len(unused) == 2 and all("trained by other code" in line for line in unused)
    new = json.load(open(project / "out-cmp" / "results.json"))
    assert new["modes"]["svformer"]["val_loss"] != old  # and neither calibration run was used:
    assert sorted(new["info"]["calibration"]["unused"]) == ["svformer", "vanilla"]
    assert (project / "out-cmp" / "svformer_seed1.other-code" / "summary.json").is_file()
