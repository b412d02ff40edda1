"""Tests for bench.py: a tiny CPU run completes in seconds and its JSON holds every field.
Run: python -m pytest -q test_bench.py"""
import json
import os
import re

import pytest

import bench

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root

TINY = ["--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=24", "--seq_len=16",
        "--batch_size=2", "--contexts=16,64", "--decode_tokens=4", "--decode_batch_sizes=1,2",
        "--train_steps=2", "--warmup_steps=1", "--device=cpu", "--dtype=float32"]
MODES = ["vanilla", "resformer", "svformer"]


def test_tiny_run_writes_every_field(tmp_path, capsys):
    out = tmp_path / "b.json"
    bench.main(TINY + [f"--json_out={out}"])
    result = json.loads(out.read_text())
    assert {"config", "device", "dtype", "device_name", "torch", "model", "train", "decode",
            "cache", "ratios", "targets", "wall_s"} <= set(result)

    train = result["train"]
    assert train["batch_size"] == 2 and train["seq_len"] == 16 and set(train["modes"]) == set(MODES)
    assert train["accumulation"] == 1  # gradient_accumulation_steps of the quickstart
    for m in train["modes"].values():
        assert len(m["step_ms"]) == 2 and m["ms_per_step"] > 0 and m["params"] > 0
        assert m["tokens_per_s"] == pytest.approx(2 * 16 / (m["ms_per_step"] / 1000))
        assert m["mfu"] is None and m["peak_mem_bytes"] is None  # CUDA only
    assert train["modes"]["svformer"]["params"] < train["modes"]["vanilla"]["params"]

    decode = result["decode"]
    # block_size added, 64 too long
    assert decode["contexts"] == [16, 24] and decode["skipped_contexts"] == [64]
    assert len(decode["rows"]) == 3 * 2 * 2 and decode["cache_exact"] is True
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
        assert r["formula_matches"] and r["bytes_full"] == r["bytes_per_token"] * 24
        if r["mode"] == "svformer":
            assert r["exact_svformer_ratio"] and r["vs_vanilla"] == pytest.approx((L + 1) / (2 * L))
        else:
            assert r["vs_vanilla"] == 1.0
    mha_vanilla = next(r for r in cache["rows"] if r["mode"] == "vanilla" and r["n_kv_head"] == 4)
    # k and v, per layer, heads x head_dim x fp32
    assert mha_vanilla["bytes_per_token"] == 2 * L * 4 * 8 * 4

    ratios = result["ratios"]
    assert ratios["train_resformer_vs_vanilla"] > 0 and ratios["train_svformer_vs_vanilla"] > 0
    assert len(ratios["decode_cached_vs_uncached"]) == 12
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
            and "targets" in printed)


def test_parts_and_modes_select(tmp_path):
    out = tmp_path / "c.json"
    result = bench.main([os.path.join(HERE, "config", "gpt2_124m.py"), "--parts=cache",
                         "--modes=svformer", "--kv_heads=12,6,1",
                         "--dtype=bfloat16", "--device=cpu", f"--json_out={out}"])
    assert result["train"] is None and result["decode"] is None
    rows = {(r["mode"], r["n_kv_head"]): r for r in result["cache"]["rows"]}
    # vanilla: the reference
    assert set(rows) == {(m, h) for m in ("vanilla", "svformer") for h in (12, 6, 1)}
    # GPT-2 124M, bf16, batch 1
    assert rows[("vanilla", 12)]["bytes_full"] == 2 * 12 * 12 * 1024 * 64 * 2
    assert rows[("svformer", 12)]["bytes_full"] * 24 == rows[("vanilla", 12)]["bytes_full"] * 13
    assert json.loads(out.read_text())["cache"]["dtype"] == "bfloat16"


def test_accumulation_defaults_to_the_presets_capped_and_multiplies_the_tokens(tmp_path):
    preset = [os.path.join(HERE, "config", "gpt2_124m.py")]
    gpt2 = bench.resolve(bench.parse_args(bench.SETTINGS, preset, bench.USAGE, bench.UNUSED))
    assert gpt2["gradient_accumulation_steps"] == 16 and gpt2["accumulation"] == 4
    result = bench.main(TINY + ["--parts=train", "--modes=vanilla", "--accumulation=3",
                                "--json_out="])
    m = result["train"]["modes"]["vanilla"]
    assert result["train"]["accumulation"] == 3
    assert m["tokens_per_s"] == pytest.approx(3 * 2 * 16 / (m["ms_per_step"] / 1000))


def test_a_wrong_cache_is_caught_in_float32(monkeypatch):
    real_store = bench.KVCache.store

    def keys_off_by_one(self, layer, k, v):  # each key one position late
        keys, values = real_store(self, layer, k, v)
        return keys.roll(1, dims=2), values

    monkeypatch.setattr(bench.KVCache, "store", keys_off_by_one)
    result = bench.main(TINY + ["--parts=decode", "--modes=resformer", "--decode_batch_sizes=1",
                                "--json_out="])
    assert result["decode"]["cache_exact"] is False
    assert all(r["fp32_logit_error"] > bench.LOGIT_TOLERANCE for r in result["decode"]["rows"])


def fake_result(device, device_name, train_ratio, speedup, mfu):
    modes = {"vanilla": {"ms_per_step": 100.0, "mfu": mfu},
             "resformer": {"ms_per_step": 100.0 * train_ratio, "mfu": mfu},
             "svformer": {"ms_per_step": 100.0 * train_ratio, "mfu": mfu}}
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


@pytest.mark.parametrize("argv,message", [
    (["no/such/preset.py"], "no preset file"),
    (["--modes=vanilla,transformer"], "modes must be among"),
    (["--parts=train,speed"], "parts are"),
    (["--kv_heads=3"], "must be a multiple"),
    (["--contexts=16", "--decode_tokens=16"], "must be longer than decode_tokens"),
    (["--seq_len=256"], "exceeds block_size"),
    (["--bias=maybe"], "bias must be bool"),
    (["--compile", "--warmup_steps=0"], "compile needs warmup_steps"),
    (["--accumulation=-1"], "accumulation must be at least 1"),
    (["--train_step=3"], "unknown setting"),
])
def test_mistakes_are_one_line_errors(argv, message):
    with pytest.raises(ValueError, match=message):
        bench.main(["--parts=cache", "--json_out="] + argv)


def test_training_only_settings_are_not_bench_settings(capsys):
    """Issue 22: --help listed out_dir ("for ckpt.pt"), resume, overwrite, eval_interval. A preset
    may still set them (they are ignored); typed, they are an error; '1 thread', not '1 threads'."""
    for key in ("out_dir", "resume", "overwrite", "eval_interval", "max_iters", "min_lr"):
        assert key not in bench.SETTINGS
    with pytest.raises(ValueError, match="--eval_interval: a train.py setting this script does "
                                         "not use"):
        bench.main(["--parts=cache", "--json_out=", "--eval_interval=5"])
    bench.main([os.path.join(HERE, "config", "gpt2_124m.py"), "--parts=cache", "--json_out=",
                "--threads=1", "--device=cpu", "--kv_heads=12"])
    assert ", 1 thread\n" in capsys.readouterr().out


def test_a_long_cpu_run_says_what_it_times_and_roughly_how_long():
    def plan(argv):
        cfg = bench.resolve(bench.parse_args(bench.SETTINGS, argv, bench.USAGE, bench.UNUSED))
        return bench.plan(cfg, "cpu")
    gpt2 = plan([os.path.join(HERE, "config", "gpt2_124m.py")])
    assert "3 + 20 training steps of 4 x " in gpt2 and "decoding 32 tokens" in gpt2
    assert re.search(r"on this CPU that is roughly [\d,]+ min: at this size bench.py is meant "
                     r"for a GPU", gpt2), gpt2
    assert "meant for a GPU" not in plan(TINY) and "meant for a GPU" not in plan(
        [os.path.join(HERE, "config", "gpt2_124m.py"), "--parts=cache"])
