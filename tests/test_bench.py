"""Tests for bench.py: a tiny CPU run completes in seconds and its JSON holds every field; any
subset of model.py's value modes runs; every impossible setting is a one-line error.
Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_bench.py"""
import json
import os
import re
import sys

import pytest
import torch

import bench
from configurator import ConfigError, run_main
from lab.analysis import sizes
from model import GPT, VALUE_MODES

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
GPT2 = os.path.join(HERE, "config", "gpt2_124m.py")

TINY = ["--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=24", "--seq_len=16",
        "--batch_size=2", "--contexts=16,64", "--decode_tokens=4", "--decode_batch_sizes=1,2",
        "--train_steps=2", "--warmup_steps=1", "--device=cpu", "--dtype=float32"]
MODES = list(VALUE_MODES)  # bench's default --modes: every mode model.py has


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """--threads=N sets torch's thread count for the whole process: put it back after a test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def resolved(argv):
    """bench's settings for argv as main() sees them: parsed, derived values filled, checked."""
    return bench.resolve(vars(bench.parse_args(bench.SETTINGS, argv, bench.USAGE)))


def one_line_error(monkeypatch, argv):
    """What `python bench.py ARGV` says when it refuses ARGV: run_main's exit message, which
    must be one line. (In-process: run_main exits with the message as SystemExit's code.)"""
    monkeypatch.setattr(sys, "argv", ["bench.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        run_main(bench.main)
    message = exit_.value.code
    assert isinstance(message, str) and message.startswith("error: "), message
    assert "\n" not in message, message
    return message


def test_default_modes_are_every_mode_of_model_py():
    assert bench.SETTINGS["modes"][0] == ",".join(VALUE_MODES)
    assert resolved([])["modes"] == MODES


def test_tiny_run_writes_every_field(tmp_path, capsys):
    out = tmp_path / "b.json"
    bench.main(TINY + [f"--json_out={out}"])
    result = json.loads(out.read_text())
    assert {"config", "device", "dtype", "device_name", "torch", "threads", "model", "sizes",
            "train", "decode", "cache", "ratios", "targets", "wall_s"} <= set(result)
    assert list(result["sizes"]) == MODES

    train = result["train"]
    assert train["batch_size"] == 2 and train["seq_len"] == 16 and list(train["modes"]) == MODES
    assert train["accumulation"] == 1  # gradient_accumulation_steps of the quickstart
    for m in train["modes"].values():
        assert len(m["step_ms"]) == 2 and m["ms_per_step"] > 0 and m["params"] > 0
        assert m["tokens_per_s"] == pytest.approx(2 * 16 / (m["ms_per_step"] / 1000))
        assert m["mfu"] is None and m["peak_mem_bytes"] is None  # CUDA only
    params = {mode: m["params"] for mode, m in train["modes"].items()}
    assert params["svformer"] < params["vanilla"] == params["resformer"] < params["value_embed"]

    decode = result["decode"]
    # block_size added, 64 too long
    assert decode["contexts"] == [16, 24] and decode["skipped_contexts"] == [64]
    assert len(decode["rows"]) == len(MODES) * 2 * 2 and decode["cache_exact"] is True
    assert {r["mode"] for r in decode["rows"]} == set(MODES)
    for r in decode["rows"]:
        assert r["prompt_len"] == r["context"] - 4
        assert r["tokens_match"] and r["fp32_logit_error"] < 1e-4 and r["cache_exact"]
        for key in ("cached_tok_s", "uncached_tok_s", "cached_e2e_tok_s", "uncached_e2e_tok_s",
                    "speedup", "e2e_speedup"):
            assert r[key] > 0

    cache = result["cache"]
    assert cache["max_len"] == 24 and cache["dtype"] == "float32"
    assert ({(r["mode"], r["n_kv_head"]) for r in cache["rows"]}
            == {(m, h) for m in MODES for h in (4, 2, 1)})
    L = 2
    for r in cache["rows"]:
        assert r["bytes_full"] == r["bytes_per_token"] * 24
        if r["mode"] == "svformer":
            assert r["exact_svformer_ratio"] and r["vs_vanilla"] == pytest.approx((L + 1) / (2 * L))
        else:  # value_embed too: its tables hold values by token, the cache stores every layer's
            assert r["vs_vanilla"] == 1.0 and r["exact_svformer_ratio"] is None
    mha_vanilla = next(r for r in cache["rows"] if r["mode"] == "vanilla" and r["n_kv_head"] == 4)
    # k and v, per layer, heads x head_dim x fp32
    assert mha_vanilla["bytes_per_token"] == 2 * L * 4 * 8 * 4

    ratios = result["ratios"]
    assert ratios["train_resformer_vs_vanilla"] > 0 and ratios["train_svformer_vs_vanilla"] > 0
    assert len(ratios["decode_cached_vs_uncached"]) == len(decode["rows"])
    assert ratios["cache_svformer_vs_vanilla"] == {"4": 0.75, "2": 0.75, "1": 0.75}
    targets = {t["target"]: t for t in result["targets"]}
    assert len(targets) == 6
    assert targets["svformer cache bytes exactly (L+1)/(2L) of vanilla"]["met"] is True
    # not measured
    assert all(t["met"] is None for name, t in targets.items() if "MFU" in name or "1024" in name)
    applies = [t["applies"] for t in result["targets"]]
    assert applies == [True, True, True, False, True, False]  # on a CPU: not the GPU ones
    printed = capsys.readouterr().out
    assert ("training step" in printed and "decoding" in printed and "KV cache" in printed
            and "targets" in printed and "active/token" in printed)


@pytest.mark.parametrize("modes,parts", [
    ("vanilla,resformer", "train,decode,cache"),
    ("vanilla", "cache"),
    ("value_embed", "train,cache"),  # no vanilla among the modes: no ratios, the cache's reference
])
def test_any_subset_of_the_modes_finishes_and_writes_the_json(tmp_path, modes, parts):
    """Issue 35: leaving svformer out used to crash (its ratio and target were looked up)."""
    out = tmp_path / "b.json"
    bench.main(TINY + [f"--modes={modes}", f"--parts={parts}", f"--json_out={out}"])
    result = json.loads(out.read_text())
    asked = modes.split(",")
    assert list(result["sizes"]) == asked
    assert (result["train"] is None) == ("train" not in parts)
    assert (result["decode"] is None) == ("decode" not in parts)
    if result["train"]:
        assert list(result["train"]["modes"]) == asked
    if result["decode"]:
        assert {r["mode"] for r in result["decode"]["rows"]} == set(asked)
    # the cache table: the modes asked for, and vanilla as the reference of "vs vanilla"
    assert {r["mode"] for r in result["cache"]["rows"]} == set(asked) | {"vanilla"}
    assert not any("svformer" in key for key in result["ratios"] if key.startswith("train"))
    assert result["ratios"]["cache_svformer_vs_vanilla"] == {}
    svformer_target = next(t for t in result["targets"] if "(L+1)/(2L)" in t["target"])
    assert svformer_target["value"] is None and svformer_target["met"] is None
    if asked == ["vanilla", "resformer"]:
        assert result["ratios"]["train_resformer_vs_vanilla"] > 0


def test_decode_settings_are_checked_only_when_decoding():
    """--block_size=32 leaves one context, 32, which the default 32 decode_tokens cannot fill
    with a prompt: refused for decoding, and no matter when nothing is decoded."""
    small = ["--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=32", "--seq_len=16",
             "--batch_size=2", "--train_steps=2", "--warmup_steps=1", "--device=cpu",
             "--dtype=float32", "--modes=vanilla", "--json_out="]
    result = bench.main(small + ["--parts=train"])
    assert result["train"]["modes"]["vanilla"]["ms_per_step"] > 0 and result["decode"] is None
    with pytest.raises(ConfigError, match="context 32 must be longer than decode_tokens"):
        bench.main(small + ["--parts=train,decode"])


LIMITED = [key for key, spec in bench.BENCH_SETTINGS.items() if len(spec) > 2]


def test_every_numeric_bench_setting_has_limits():
    """Issue 35: bench's own numbers are checked beside their settings, as train.py's are."""
    numeric = [key for key, (default, *_) in bench.BENCH_SETTINGS.items()
               if isinstance(default, (int, float)) and not isinstance(default, bool)]
    assert numeric and "threads" in numeric
    assert [key for key in numeric if key not in LIMITED] == []


@pytest.mark.parametrize("key", LIMITED)
def test_each_limited_setting_refuses_an_impossible_value_in_one_line(monkeypatch, key):
    default, meaning, (low, _) = bench.SETTINGS[key]
    message = one_line_error(monkeypatch, ["--parts=cache", "--json_out=", f"--{key}={low - 1}"])
    assert message == f"error: --{key}={low - 1}: must be at least {low} ({meaning})"


def sizes_of(result, mode):
    s = result["sizes"][mode]
    return s["num_params"], s["active_params"], s["flops_per_token"]


def test_the_sizes_table_counts_what_each_mode_holds_uses_and_computes(capsys):
    """Per mode: total parameters, active parameters per token and training FLOPs per token at
    seq_len, as the model computes them. value_embed's tables (one per layer, vocab x kv_dim) are
    all in its total; a token uses one row of each, and a lookup multiplies nothing."""
    argv = TINY + ["--n_kv_head=2", "--parts=cache", "--json_out="]  # kv_dim 16, not n_embd
    result = bench.main(argv)
    cfg = resolved(argv)
    assert list(result["sizes"]) == MODES
    for mode in MODES:
        model = GPT(bench.model_config(cfg, mode))
        counted = sizes(model, 16)
        assert sizes_of(result, mode) == (model.num_params(), counted["active_params"],
                                          counted["flops_per_token"]), mode
    L, C, V, seq_len = 2, 32, result["model"]["vocab_size"], 16
    kv_dim = 2 * (C // 4)
    total, active, flops = sizes_of(result, "vanilla")
    assert active == total and flops == 6 * total + 12 * L * C * seq_len  # at seq_len, not 24
    assert sizes_of(result, "resformer") == (total, active, flops)  # fixed lambdas: buffers
    sv_total, sv_active, sv_flops = sizes_of(result, "svformer")
    assert sv_total == sv_active == total - (L - 1) * C * kv_dim  # no W_V after layer 1
    assert sv_flops == 6 * sv_total + 12 * L * C * seq_len
    ve_total, ve_active, ve_flops = sizes_of(result, "value_embed")
    lambdas = L  # and one learned scalar per layer, its mixing weight
    assert ve_total == total + L * V * kv_dim + lambdas
    assert ve_active == active + L * kv_dim + lambdas  # one row per table
    assert ve_flops == flops + 6 * lambdas  # nothing from the tables
    printed = capsys.readouterr().out
    assert re.search(rf"^value_embed +{ve_total:,} +{ve_active:,} +{ve_flops / 1e6:.2f}M$",
                     printed, re.M), printed


def test_resformers_own_settings_shape_only_the_resformer():
    """train.py's lambda_1, lambda_2, learnable_lambda are bench settings too; the other modes'
    models refuse them, so they go to the resformer alone (they used to crash every other mode)."""
    argv = TINY + ["--modes=vanilla,resformer,value_embed", "--parts=train,cache",
                   "--learnable_lambda", "--lambda_1=1.0", "--lambda_2=1.0", "--json_out="]
    result = bench.main(argv)
    vanilla, resformer = sizes_of(result, "vanilla")[0], sizes_of(result, "resformer")[0]
    assert resformer == vanilla + 2 * (2 - 1)  # (lambda_1, lambda_2) learned in layer 2
    assert result["train"]["modes"]["resformer"]["params"] == resformer
    model = GPT(bench.model_config(resolved(argv), "resformer"))
    assert model.transformer.h[1].attn.value_lambdas.tolist() == [1.0, 1.0]


def test_help_fits_in_100_columns(capsys):
    """--help lists every bench setting (none of train.py's that a timing does not use), with
    the values this command would use, in lines of at most 100 columns: the defaults, and a
    preset's with long lists."""
    for argv in (["--help"], [GPT2, "--contexts=128,256,512,1024,2048,4096,8192",
                              "--kv_heads=12,6,4,3,2,1", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            bench.main(argv)
        assert exit_.value.code == 0
        text = capsys.readouterr().out
        too_long = [line for line in text.splitlines() if len(line) > 100]
        assert too_long == []
        listed = re.findall(r"^  --(\w+) ", text, re.M)
        assert listed == list(bench.SETTINGS)
        assert f"({','.join(VALUE_MODES)})" in " ".join(text.split())


def test_parts_and_modes_select(tmp_path):
    out = tmp_path / "c.json"
    result = bench.main([GPT2, "--parts=cache", "--modes=svformer", "--kv_heads=12,6,1",
                         "--dtype=bfloat16", "--device=cpu", f"--json_out={out}"])
    assert result["train"] is None and result["decode"] is None
    rows = {(r["mode"], r["n_kv_head"]): r for r in result["cache"]["rows"]}
    # vanilla: the reference
    assert set(rows) == {(m, h) for m in ("vanilla", "svformer") for h in (12, 6, 1)}
    # GPT-2 124M, bf16, batch 1
    assert rows[("vanilla", 12)]["bytes_full"] == 2 * 12 * 12 * 1024 * 64 * 2
    assert rows[("svformer", 12)]["bytes_full"] * 24 == rows[("vanilla", 12)]["bytes_full"] * 13
    assert json.loads(out.read_text())["cache"]["dtype"] == "bfloat16"


def test_accumulation_defaults_to_the_presets_capped_and_multiplies_the_tokens():
    gpt2 = resolved([GPT2])
    assert gpt2["gradient_accumulation_steps"] == 16 and gpt2["accumulation"] == 4
    assert resolved([GPT2, "--gradient_accumulation_steps=2"])["accumulation"] == 2
    result = bench.main(TINY + ["--parts=train", "--modes=vanilla", "--accumulation=3",
                                "--json_out="])
    m = result["train"]["modes"]["vanilla"]
    assert result["train"]["accumulation"] == 3
    assert m["tokens_per_s"] == pytest.approx(3 * 2 * 16 / (m["ms_per_step"] / 1000))


@pytest.mark.parametrize("mode", ["resformer", "value_embed"])
def test_a_wrong_cache_is_caught_in_float32(monkeypatch, mode):
    real_store = bench.KVCache.store

    def keys_off_by_one(self, layer, k, v):  # each key one position late
        keys, values = real_store(self, layer, k, v)
        return keys.roll(1, dims=2), values

    monkeypatch.setattr(bench.KVCache, "store", keys_off_by_one)
    result = bench.main(TINY + ["--parts=decode", f"--modes={mode}", "--decode_batch_sizes=1",
                                "--json_out="])
    assert result["decode"]["cache_exact"] is False
    assert all(r["fp32_logit_error"] > bench.LOGIT_TOLERANCE for r in result["decode"]["rows"])


def fake_result(device, device_name, train_ratio, speedup, mfu, modes=("resformer", "svformer")):
    modes = {"vanilla": {"ms_per_step": 100.0, "mfu": mfu},
             **{mode: {"ms_per_step": 100.0 * train_ratio, "mfu": mfu} for mode in modes}}
    rows = [{"mode": "vanilla", "batch": 1, "context": 1024, "speedup": speedup}]
    return {"device": device, "device_name": device_name, "train": {"modes": modes},
            "decode": {"rows": rows}, "cache": None}


@pytest.mark.parametrize("device,name,met", [
    # CPU: the step-time targets and >= 5x decoding apply; 7x is enough there
    ("cpu", "cpu", [False, False, True, None, None, None]),
    # an H200: >= 10x decoding (7x misses) and the MFU target apply, the CPU targets do not
    ("cuda:0", "NVIDIA H200", [None, None, None, False, None, True]),
    # any other GPU: no MFU target
    ("cuda:0", "NVIDIA A100-SXM4-80GB", [None, None, None, False, None, None]),
])
def test_each_target_applies_on_its_own_device(device, name, met):
    _, targets = bench.ratios_and_targets(fake_result(device, name, 1.05, 7.0, 0.45))
    assert [t["met"] for t in targets] == met
    assert [t["applies"] for t in targets][:4] == [device == "cpu"] * 3 + [device != "cpu"]


def test_targets_without_svformer_are_not_measured():
    """Issue 35: with svformer left out its targets have no value, and nothing fails."""
    ratios, targets = bench.ratios_and_targets(
        fake_result("cpu", "cpu", 1.01, 7.0, None, modes=("resformer", "value_embed")))
    assert ratios["train_resformer_vs_vanilla"] == pytest.approx(1.01)
    assert "train_svformer_vs_vanilla" not in ratios
    by_name = {t["target"]: t for t in targets}
    svformer = [t for name, t in by_name.items() if name.startswith("svformer")]
    assert len(svformer) == 2 and all(t["value"] is None and t["met"] is None for t in svformer)
    assert by_name["resformer step time within 3% of vanilla (CPU)"]["met"] is True


@pytest.mark.parametrize("argv,message", [
    (["no/such/preset.py"], "no preset file"),
    (["--modes=vanilla,transformer"], "--modes=vanilla,transformer: name some of vanilla,"),
    (["--modes="], "--modes=: name some of vanilla, resformer"),
    (["--parts=train,speed"], "--parts=train,speed: name some of train, decode, cache"),
    (["--parts="], "--parts=: name some of train"),
    (["--kv_heads=3"], "must be a multiple"),
    (["--parts=decode", "--contexts=16", "--decode_tokens=16"],
     "must be longer than decode_tokens"),
    (["--decode_batch_sizes=1,0"], "sizes of at least 1"),
    (["--contexts=short"], "cannot read 'short' as a comma-separated list of int"),
    (["--seq_len=256"], "exceeds block_size"),
    (["--bias=maybe"], "--bias=maybe: must be bool"),
    (["--compile", "--warmup_steps=0"], "compile needs warmup_steps"),
    (["--accumulation=-1"], "--accumulation=-1: must be at least 0"),
    (["--train_step=3"], "unrecognized arguments: --train_step=3"),
    # the model's own checks, as train.py reports them (a ValueError would be a traceback now)
    (["--n_embd=30"], "n_embd (30) must be divisible by n_head (4)"),
    (["--n_kv_head=3"], "n_head (4) must be a multiple of n_kv_head (3)"),
])
def test_mistakes_are_one_line_errors(monkeypatch, argv, message):
    # a quick part unless the case names its own (a setting typed twice is refused)
    base = ["--parts=cache"] if not any(a.startswith("--parts=") for a in argv) else []
    assert message in one_line_error(monkeypatch, base + ["--json_out="] + argv)


def test_training_only_settings_are_not_bench_settings(capsys):
    """A preset may set train.py's settings a timing does not use (they are ignored); typed,
    they are an error; '1 thread', not '1 threads'."""
    for key in ("resume", "overwrite"):
        assert key not in bench.SETTINGS
    with pytest.raises(ConfigError, match="--eval_interval=5: a train.py setting that bench.py "
                                          "does not use"):
        bench.main(["--parts=cache", "--json_out=", "--eval_interval=5"])
    bench.main([GPT2, "--parts=cache", "--json_out=", "--threads=1", "--device=cpu",
                "--kv_heads=12"])
    assert ", 1 thread\n" in capsys.readouterr().out
