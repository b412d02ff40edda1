"""The README's "Edits of your own", followed to the letter in a copy of the project: a mode of
your own (a learned gate on V_1), any edit as an A/B (SwiGLU) and rotary positions (RoPE). Each
edits model.py alone, then runs the scripts in one Python process in the copy (compare.py's runs
in it too), since the copy's modules are not this process's."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

import compare
import configurator
import prepare
from conftest import PLAYS, TINY
from lab import runs

ROOT = Path(__file__).resolve().parent.parent
# The README's edits to model.py: (a line there today, the lines added, after/before/replacing it).
GATED = [
    ('VALUE_MODES = ("vanilla", "resformer", "svformer", "value_embed")',
     'VALUE_MODES = ("vanilla", "resformer", "svformer", "value_embed", "gated")', "replace"),
    ('MIXING_WEIGHTS = {"value_lambdas": ("lambda_1", "lambda_2"), "value_lambda": ("lambda_n",)}',
     'MIXING_WEIGHTS = {"value_lambdas": ("lambda_1", "lambda_2"), "value_lambda": ("lambda_n",),\n'
     '                  "gate": ("gate",)}', "replace"),
    ("            self.value_lambda = nn.Parameter(torch.tensor(0.5))",
     '        if config.value_mode == "gated" and layer_idx > 0:\n'
     "            self.gate = nn.Parameter(torch.zeros(()))", "after"),
    ("        else:\n            raise NotImplementedError",
     '        elif self.value_mode == "gated":\n'
     "            value = v + self.gate * first_value", "before"),
]
ROPE = [
    ("            wpe=nn.Embedding(config.block_size, config.n_embd),  # GPT-2's learned "
     "positions", None, "replace"),
    ("        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)", None,
     "replace"),
    ("        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))",
     "        x = self.transformer.drop(self.transformer.wte(idx))", "replace"),
    ("        v = self.heads(parts[2], self.n_kv_head) if self.owns_value else None",
     "        q, k = rope(q, k, kv_cache.length if kv_cache is not None else 0)", "after"),
    ("class KVCache:", '''def rope(q, k, start):
    """Rotary positions (RoFormer): each pair of features of q and k turned by an angle that
    grows with the position, so attention sees how far apart two tokens are."""
    T, half = q.size(2), q.size(3) // 2
    freq = 10000 ** (-torch.arange(half, device=q.device) / half)
    angle = torch.arange(start, start + T, device=q.device)[:, None] * freq  # (T, half)
    cos, sin = angle.cos(), angle.sin()
    turn = lambda t: torch.cat([t[..., :half] * cos - t[..., half:] * sin,  # noqa: E731
                                t[..., :half] * sin + t[..., half:] * cos], dim=-1)
    return turn(q), turn(k)
''', "before"),
]
SWIGLU = [
    ("    learnable_lambda: bool = False  # resformer: learn them per layer, from these",
     '    mlp: str = "gelu"  # the MLP: "gelu" (GPT-2\'s) or "swiglu" (a gated one, as Llama\'s)',
     "after"),
    ("        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)",
     '        self.swiglu = config.mlp == "swiglu"  # two halves: one gates the other\n'
     "        self.c_fc = nn.Linear(config.n_embd, (8 if self.swiglu else 4) * config.n_embd,\n"
     "                              bias=config.bias)", "replace"),
    ("        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))",
     "        h = self.c_fc(x)\n"
     "        h = F.silu(h.chunk(2, dim=-1)[0]) * h.chunk(2, dim=-1)[1] if self.swiglu else "
     "self.gelu(h)\n"
     "        return self.dropout(self.c_proj(h))", "replace"),
]
SWIGLU_COMMAND = ("python compare.py config/demo.py --modes=vanilla,vanilla:mlp=swiglu "
                  "--noise_floor=0 --out_dir=out-swiglu")
# A comparison in tiny: the demo's settings but the model's shape, its steps, and no calibration
# (its folders are docs/results/, not in the copy, and of the demo's shape).
TINY_COMPARE = [*TINY, "--seeds=1,2", "--max_iters=6", "--eval_interval=3", "--calibration=",
                "--analysis_samples=2"]
# What each recipe's script does first: compare.py's runs in its own process, with the launcher
# of tests/conftest.py (whose imports are the copy's modules there).
PREAMBLE = f"""
import runpy
import torch
from lab import runs
shared = runpy.run_path({str(ROOT / "tests" / "conftest.py")!r})
runs.launch = shared["run_in_process"]
TINY, TINY_COMPARE = {TINY!r}, {TINY_COMPARE!r}
"""


def test_the_readme_shows_every_line_the_recipes_add():
    readme = (ROOT / "README.md").read_text()
    assert SWIGLU_COMMAND in readme
    for _, added, _ in GATED + ROPE + SWIGLU:
        for line in (added or "").splitlines():  # the code of each line, its comment aside
            assert line.split("  # ")[0].strip() in readme, line


def project_copy(tmp_path):
    """The project's root .py files, lab/, config/ and corpus/, with the made-up plays prepared
    as its data/shakespeare_byte (so the README's commands find their data)."""
    copy = tmp_path / "project"
    copy.mkdir()
    for path in ROOT.glob("*.py"):
        shutil.copy(path, copy)
    for folder in ("lab", "config", "corpus"):
        shutil.copytree(ROOT / folder, copy / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    prepare.prepare(configurator.parse_args(
        prepare.SETTINGS, [f"--out_root={copy / 'data'}", "--quiet"], ""), documents=PLAYS)
    return copy


def edit(copy, edits):
    """model.py edited as the README says; each anchor is found exactly once."""
    source = (copy / "model.py").read_text()
    for anchor, added, where in edits:
        assert source.count(anchor) == 1, anchor
        source = source.replace(anchor + "\n" if where == "replace" else anchor, {
            "replace": added + "\n" if added else "", "after": f"{anchor}\n{added}",
            "before": f"{added}\n{anchor}"}[where])
    (copy / "model.py").write_text(source)


def run(copy, *args):
    """python with args in the copy, its own modules first (scripts as -c, so that no file of
    theirs joins the copy's code): the output, once the process exited 0."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


GATED_RECIPE = """
import bench, compare, sample, train
from model import GPT, GPTConfig
model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=3, n_head=2, n_embd=16,
                      value_mode="gated"))
gates = [p for name, p in model.named_parameters() if name.endswith(".gate")]
assert len(gates) == 2 and not any(gates), gates  # layers 2 and 3 have one, at 0
groups = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), lambda_lr_scale=4.0).param_groups
mixing = [group for group in groups if group["lr_scale"] == 4.0]
assert len(mixing) == 1 and mixing[0]["weight_decay"] == 0.0
assert {id(p) for p in mixing[0]["params"]} == {id(p) for p in gates}
train.main(["--value_mode=gated", "--out_dir=out-gated", "--max_iters=10", "--eval_interval=5",
            *TINY])
sample.main(["--out_dir=out-gated", "--num_samples=1", "--max_new_tokens=20"])
compare.main(["config/demo.py", "--modes=vanilla,gated", "--out_dir=out-cmp", *TINY_COMPARE])
bench.main(["--modes=vanilla,gated", "--train_steps=2", "--warmup_steps=1", "--contexts=8",
            "--decode_tokens=4", "--decode_batch_sizes=1", "--json_out=bench.json",
            "--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2",
            "--threads=1", "--device=cpu"])
"""


def test_a_mode_added_in_model_py_alone_trains_samples_compares_and_benches(tmp_path):
    """The gate is a mixing weight (no decay, lambda_lr_scale x the lr), learns from 0, and shows
    in the eval lines, the log, results.md's learned-weights table and every bench table."""
    copy = project_copy(tmp_path)
    edit(copy, GATED)
    printed = run(copy, "-c", PREAMBLE + GATED_RECIPE)
    assert "  --value_mode=resformer  one of vanilla, resformer, svformer, value_embed, gated\n" \
        in run(copy, "train.py", "--help")  # its name in --help, from VALUE_MODES
    tested = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_model.py")
    assert " passed" in tested and "failed" not in tested  # test_model.py stays green
    assert re.search(r"^step 10: train loss [\d.]+, val loss [\d.]+, gate -?[\d.]+$", printed,
                     re.MULTILINE), printed  # the eval line: the gates' mean
    evals = [r for r in map(json.loads, open(copy / "out-gated" / "log.jsonl"))
             if r["kind"] == "eval"]
    assert list(evals[-1]["mixing"]) == ["transformer.h.1.attn.gate"]
    assert evals[-1]["mixing"]["transformer.h.1.attn.gate"] != 0.0
    assert "gated, cache on" in printed  # sample.py's report
    results = json.load(open(copy / "out-cmp" / "results.json"))
    assert results["modes"]["gated"]["paired"]["n"] == 2
    assert "## Learned gate of gated, by layer" in (copy / "out-cmp" / "results.md").read_text()
    bench = json.load(open(copy / "bench.json"))
    assert set(bench["train"]["modes"]) == {"vanilla", "gated"} and bench["decode"]["cache_exact"]
    assert {r["mode"] for r in bench["decode"]["rows"] + bench["cache"]["rows"]} == {
        "vanilla", "gated"}


ROPE_RECIPE = """
import compare
from lab.analysis import LOGIT_TOLERANCE, cache_logit_error
from model import GPT, VALUE_MODES, GPTConfig
for mode in VALUE_MODES:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2,
                          n_embd=32, value_mode=mode)).eval()
    assert not any("wpe" in name for name in model.state_dict())
    seq = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(1))
    assert cache_logit_error(model, seq, 5) <= LOGIT_TOLERANCE, mode
    prompt = seq[:, :6]  # and greedy tokens past block_size, where the cache is refilled
    assert torch.equal(model.generate(prompt, 20, temperature=0),
                       model.generate(prompt, 20, temperature=0, use_cache=False)), mode
# Positions: in one layer without them, the last token's output would not depend on the order
# of the tokens before it (attention sums over a set: apart by rounding alone). With RoPE it
# does, the more the sharper the attention (here 10 x the initial q and k).
model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=4, n_embd=32)).eval()
with torch.no_grad():
    model.transformer.h[0].attn.c_attn.weight *= 10
swapped = torch.cat([seq[:, 1:2], seq[:, :1], seq[:, 2:]], dim=1)
last, other = (model.hidden_states(s)[:, -1] for s in (seq, swapped))
assert (last - other).abs().max() > 1e-2 * last.abs().max(), "RoPE changed nothing"
compare.main(BEFORE)  # the same command as before the edit
"""


def test_rope_keeps_the_cache_exact_and_test_model_green_and_retrains_a_comparison(
        tmp_path, in_process):
    """RoPE from the README: cached and uncached decoding agree in every mode, test_model.py (its
    equations take q and k from the model itself) passes in the copy, and a comparison that the
    project's code trained is not reused by the edited copy: set aside, trained again."""
    copy = project_copy(tmp_path)
    assert runs.code_version(copy) == runs.code_version(ROOT)  # a copy alone changes nothing
    before = ["--modes=vanilla", "--seeds=1", "--noise_floor=0", "--max_iters=4",
              "--eval_interval=2", "--analysis_samples=2", f"--out_dir={copy / 'out-cmp'}",
              f"--dataset={copy / 'data' / 'shakespeare_byte'}", *TINY]
    compare.main(before)  # by this process: the project's own code, in its own folder
    edit(copy, ROPE)
    assert runs.code_version(copy) != runs.code_version(ROOT)
    printed = run(copy, "-c", PREAMBLE + f"BEFORE = {before!r}\n" + ROPE_RECIPE)
    run_dir = copy / "out-cmp" / "vanilla_seed1"
    said = [line for line in printed.splitlines() if line.startswith(f"not reused: {run_dir} ")]
    assert len(said) == 1 and all(s in said[0] for s in (
        runs.code_version(ROOT), runs.code_version(copy), f"{run_dir}.other-code-1")), printed
    assert (copy / "out-cmp" / "vanilla_seed1.other-code-1" / "summary.json").is_file()
    assert json.load(open(run_dir / "summary.json"))["code"] == runs.code_version(copy)
    tested = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_model.py")
    assert " passed" in tested and "failed" not in tested


SWIGLU_RECIPE = """
import compare, train
assert train.SETTINGS["mlp"][0] == "gelu"  # train.py took the new field as a setting
compare.main(ARGV)
"""


def test_an_edit_of_your_own_is_a_gptconfig_field_compared_as_two_variants(tmp_path):
    """SwiGLU as a GPTConfig field whose default is today's MLP: --mlp=swiglu is a setting of
    train.py and a variant of compare.py with no other file touched, and the README's command
    (in tiny) trains both on the same seeds and tables their paired difference."""
    copy = project_copy(tmp_path)
    edit(copy, SWIGLU)
    argv = SWIGLU_COMMAND.split()[2:] + TINY_COMPARE
    run(copy, "-c", PREAMBLE + f"ARGV = {argv!r}\n" + SWIGLU_RECIPE)
    results = json.load(open(copy / "out-swiglu" / "results.json"))
    paired = results["modes"]["vanilla:mlp=swiglu"]["paired"]
    assert paired["n"] == 2 and set(results["modes"]) == {"vanilla", "vanilla:mlp=swiglu"}
    table = (copy / "out-swiglu" / "results.md").read_text()
    row = next(line for line in table.splitlines() if "(`vanilla:mlp=swiglu`) |" in line)
    assert f"{paired['mean']:+.4f}" in row
    for folder, width in (("vanilla_seed1", 4), ("vanilla-mlp=swiglu_seed1", 8)):
        ckpt = torch.load(copy / "out-swiglu" / folder / "ckpt.pt", weights_only=True)
        assert ckpt["model"]["transformer.h.0.mlp.c_fc.weight"].shape == (width * 16, 16)
        assert ckpt["config"]["mlp"] == ("swiglu" if width == 8 else "gelu")
