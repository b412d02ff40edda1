import json
import math
import os
import sys

import pytest
import torch

import compare
import prepare
import train

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--max_iters=2",
        "--eval_interval=1", "--eval_iters=2", "--log_interval=1", "--warmup_iters=1", "--lr_decay_iters=2",
        "--analysis_samples=3", "--device=cpu"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    docs = [f"To be, or not to be, that is question number {i}.\n" * 8 for i in range(20)]
    return prepare.prepare(documents=docs, name="t", out_root=str(tmp_path_factory.mktemp("data")), workers=1, quiet=True)


def test_tiny_comparison_writes_everything(data_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=2"]) == 0
    results = json.load(open(out / "results.json"))
    assert set(results["modes"]) == {"vanilla", "resformer", "svformer"}
    for name, r in results["modes"].items():
        for key in ("num_params", "val_loss", "val_loss_mean", "val_loss_std", "tokens", "val_loss_at_tokens_mean",
                    "kv_cache_bytes_per_token", "tokens_per_sec", "attention_entropy", "similarity",
                    "attention_entropy_std", "similarity_std"):
            assert key in r, (name, key)
        assert len(r["val_loss"]) == 2 and math.isfinite(r["val_loss_mean"])
        assert r["tokens"] == [0, 64, 128]  # evals at steps 0, 1, 2 of 4 x 16 tokens
        assert len(r["attention_entropy"]) == len(r["similarity"]) == 2
    m = results["modes"]
    assert m["svformer"]["num_params"] < m["vanilla"]["num_params"] == m["resformer"]["num_params"]
    assert m["svformer"]["kv_cache_bytes_per_token"] * 4 == m["vanilla"]["kv_cache_bytes_per_token"] * 3  # (L+1)/2L
    md = (out / "results.md").read_text()
    assert "| vanilla |" in md and "resformer** vs vanilla" in md
    assert (out / "vanilla_seed1338" / "summary.json").is_file()
    assert "[run 6/6] svformer seed 1338" in capsys.readouterr().out
    for png in ("loss.png", "attention_entropy.png", "similarity.png"):
        assert (out / png).is_file() == _has_matplotlib()

    # the same command again reuses every finished run instead of training it
    compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=2"])
    assert capsys.readouterr().out.count("reusing") == 6
    assert "6 of 6 runs reused" in (out / "results.md").read_text()


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def test_without_matplotlib_tables_are_still_written(data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    out = tmp_path / "cmp"
    assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1", "--modes=vanilla"]) == 0
    assert (out / "results.md").is_file() and (out / "results.json").is_file()
    assert not (out / "loss.png").exists()
    assert "pip install matplotlib" in capsys.readouterr().out


def test_attention_entropy_uniform_and_one_key():
    T = 8
    uniform = torch.full((2, 3, T, T), 1.0 / T)  # every query spreads evenly over all T keys
    assert compare.attention_entropy(uniform) == pytest.approx(math.log(T), abs=1e-6)
    one_key = torch.zeros(2, 3, T, T)
    one_key[..., 0] = 1.0  # every query looks only at key 0
    assert compare.attention_entropy(one_key) == pytest.approx(0.0, abs=1e-6)


def test_similarity_identical_and_orthogonal_tokens():
    same = torch.randn(1, 1, 16).expand(2, 5, 16)
    assert compare.token_similarity(same) == pytest.approx(1.0, abs=1e-6)
    assert compare.token_similarity(torch.eye(4).unsqueeze(0)) == pytest.approx(0.0, abs=1e-6)


def test_modes_and_seeds_parsing():
    assert compare.parse_modes("vanilla, resformer_learnable,svformer_kv1") == [
        ("vanilla", dict(value_mode="vanilla", learnable_lambda=False, n_kv_head=0)),
        ("resformer_learnable", dict(value_mode="resformer", learnable_lambda=True, n_kv_head=0)),
        ("svformer_kv1", dict(value_mode="svformer", learnable_lambda=False, n_kv_head=1))]
    for bad in ("transformer", "svformer_learnable", ""):
        with pytest.raises(ValueError):
            compare.parse_modes(bad)
    assert compare.parse_seeds("3", 10) == [10, 11, 12]
    assert compare.parse_seeds("(1, 2, 5)", 10) == [1, 2, 5]  # what the configurator makes of --seeds=1,2,5
    assert compare.parse_seeds("(7,)", 10) == [7]
    with pytest.raises(ValueError):
        compare.parse_seeds("three", 1)


def test_compare_settings_do_not_shadow_train_settings(tmp_path):
    assert not set(compare.COMPARE) & set(train.DEFAULTS)
    with pytest.raises(ValueError, match="resume"):
        compare.main([f"--out_dir={tmp_path}", "--resume"])
