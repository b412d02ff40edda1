"""Tests for sample.py on tiny checkpoints (one really trained, the others built by hand)."""
import io
import os
import re
import subprocess
import sys

import pytest
import torch

import prepare
import sample
import shards
import train
from model import CHECKPOINT_FORMAT, GPT, GPTConfig, VALUE_MODES

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=320, bias=False)
BYTE_TOKENIZER = {"tokenizer": "byte", "vocab_size": 257, "eot": 256}


def make_checkpoint(out_dir, value_mode="vanilla", compiled=False, **overrides):
    """A checkpoint of a randomly initialised tiny model, in train.py's format, without training."""
    torch.manual_seed(0)
    model_args = dict(GPTConfig(**{**TINY, **overrides, "value_mode": value_mode}).__dict__)
    state = GPT(GPTConfig(**model_args)).state_dict()
    if compiled:  # what a torch.compile'd model's state dict looks like
        state = {"_orig_mod." + k: v for k, v in state.items()}
    os.makedirs(out_dir, exist_ok=True)
    train.save_checkpoint(os.path.join(out_dir, "ckpt.pt"), {
        "format": CHECKPOINT_FORMAT, "model": state, "model_args": model_args,
        "tokenizer": BYTE_TOKENIZER, "iter_num": 0})
    return str(out_dir)


def run(out_dir, *args):
    """(stdout, stderr, result) of sample.py with these arguments, in this process (fast)."""
    out, err = io.StringIO(), io.StringIO()
    result = sample.main([f"--out_dir={out_dir}", "--device=cpu", "--dtype=float32", *args],
                         out, err)
    return out.getvalue(), err.getvalue(), result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real checkpoint from train.train: 2 steps of a tiny model on a tiny prepared dataset."""
    root = tmp_path_factory.mktemp("trained")
    text = ("ROMEO: But soft, what light through yonder window breaks?\n"
            "JULIET: Ay me! \u2014 O Romeo.\n") * 20
    data_dir = prepare.prepare(documents=[text, text.upper()], name="tiny_byte", out_root=str(root),
                               quiet=True, workers=1)
    cfg = dict(train.DEFAULTS, dataset=data_dir, out_dir=str(root / "out"),
               device="cpu", dtype="float32",
               n_layer=2, n_embd=32, n_head=2, block_size=16, batch_size=4,
               eval_iters=1, eval_interval=2, max_iters=2, log_interval=1)
    train.train(cfg)
    return cfg["out_dir"]


def test_trained_checkpoint_streams_repeatable_samples(trained):
    args = ["--num_samples=3", "--max_new_tokens=20", "--temperature=1.0", "--top_k=None"]
    out1, err1, r1 = run(trained, "--seed=7", *args)
    out2, _, r2 = run(trained, "--seed=7", *args)
    _, _, r3 = run(trained, "--seed=8", *args)
    assert out1 == out2 and r1["tokens"] == r2["tokens"]  # same seed, same text
    assert r3["tokens"] != r1["tokens"]
    assert out1.count(sample.SEPARATOR) == 3 and len(r1["tokens"]) == 3
    assert all(len(t) == 20 for t in r1["tokens"])
    assert r1["tokens"][0] != r1["tokens"][1]  # one seed per run, not per sample
    assert "tokens/s" in err1 and "tokens/s" not in out1  # the report stays off stdout


@pytest.mark.parametrize("value_mode", VALUE_MODES)
def test_cached_and_uncached_greedy_agree(tmp_path, value_mode):
    out_dir = make_checkpoint(tmp_path, value_mode, n_kv_head=1)
    # 40 new tokens after a 5-token prompt runs past block_size 16: the cache's refill path too
    args = ["--start=hello", "--num_samples=1", "--max_new_tokens=40", "--temperature=0"]
    cached, _, r_cached = run(out_dir, *args)
    uncached, err, r_uncached = run(out_dir, *args, "--use_cache=False")
    assert r_cached["tokens"] == r_uncached["tokens"] and cached == uncached
    assert cached.startswith("hello") and "cache off" in err


def test_file_prompt_same_as_inline_and_compiled_prefix(tmp_path):
    out_dir = make_checkpoint(tmp_path / "out", compiled=True)  # _orig_mod. keys load too
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("JULIET:\n", encoding="utf-8")
    from_file, _, r_file = run(out_dir, f"--start=FILE:{prompt}", "--num_samples=1",
                               "--max_new_tokens=8", "--temperature=0")
    inline, _, r_inline = run(out_dir, "--start=JULIET:\n", "--num_samples=1",
                              "--max_new_tokens=8", "--temperature=0")
    assert (from_file.startswith("JULIET:\n") and from_file == inline
            and r_file["tokens"] == r_inline["tokens"])


def test_long_prompt_is_cropped_to_block_size(tmp_path):
    out_dir = make_checkpoint(tmp_path)
    long_prompt = "".join(chr(ord("a") + i % 26) for i in range(50))
    args = ["--num_samples=1", "--max_new_tokens=5", "--temperature=0"]
    out, err, result = run(out_dir, f"--start={long_prompt}", *args)
    assert "prompt is 50 tokens, longer than block_size 16: keeping its last 16" in err
    tail, _, tail_result = run(out_dir, f"--start={long_prompt[-16:]}", *args)
    assert (out.startswith(long_prompt[-16:]) and out == tail
            and result["tokens"] == tail_result["tokens"])


def test_empty_prompt_starts_from_end_of_text(tmp_path, monkeypatch):
    out_dir = make_checkpoint(tmp_path)
    seen = []
    real = GPT.generate_tokens
    monkeypatch.setattr(GPT, "generate_tokens", lambda self, idx, *a, **k:
                        seen.append(idx.tolist()) or real(self, idx, *a, **k))
    run(out_dir, "--num_samples=1", "--max_new_tokens=2")
    assert seen == [[[BYTE_TOKENIZER["eot"]]]]


def test_svformer_cache_bytes_reported_against_vanilla(tmp_path):
    n_layer = 4
    out_dir = make_checkpoint(tmp_path, "svformer", n_layer=n_layer)
    _, err, result = run(out_dir, "--num_samples=1", "--max_new_tokens=3")
    match = re.search(r"KV cache: ([\d,]+) bytes .*a vanilla cache: ([\d,]+) bytes", err)
    svformer, vanilla = (int(g.replace(",", "")) for g in match.groups())
    assert svformer * 2 * n_layer == vanilla * (n_layer + 1)  # (L+1)/(2L), exactly
    # the vanilla figure is what a vanilla model's cache really allocates
    vanilla_dir = make_checkpoint(tmp_path / "vanilla", "vanilla", n_layer=n_layer)
    assert run(vanilla_dir, "--num_samples=1", "--max_new_tokens=3")[2]["cache_bytes"] == vanilla
    assert result["cache_bytes"] == svformer


def test_stream_decoder_joins_split_characters():
    decoder = sample.StreamDecoder(shards.get_tokenizer("byte"))
    pieces = ([decoder.push(b) for b in "a\u2014b\u00e9".encode("utf-8")]
              + [decoder.push(256), decoder.flush()])
    assert "".join(pieces) == "a\u2014b\u00e9" and "\ufffd" not in "".join(pieces)


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"python train.py --out_dir="):
        run(tmp_path / "nothing")
    os.makedirs(tmp_path / "other")
    torch.save({"format": "someone-else/3", "model": {}}, tmp_path / "other" / "ckpt.pt")
    with pytest.raises(ValueError, match="not a checkpoint of this project"):
        run(tmp_path / "other")
    out_dir = make_checkpoint(tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="no prompt file"):
        run(out_dir, f"--start=FILE:{tmp_path / 'missing.txt'}")
    with pytest.raises(ValueError, match="temperature"):
        run(out_dir, "--temperature=-1")


def test_command_line_error_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "sample.py", f"--out_dir={tmp_path}"],
                          capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: no checkpoint at") and done.stderr.count("\n") == 1


def test_learned_lambdas_are_reported(tmp_path):
    out_dir = make_checkpoint(tmp_path, "resformer", learnable_lambda=True, n_layer=3)
    _, err, _ = run(out_dir, "--num_samples=1", "--max_new_tokens=2")
    assert ("learned lambdas (lambda_1 on V_1 / lambda_2 on V_n), layers 2-3: "
            "0.50/0.50, 0.50/0.50" in err)
    _, err, _ = run(make_checkpoint(tmp_path / "fixed", "resformer"), "--num_samples=1",
                    "--max_new_tokens=2")
    assert "learned lambdas" not in err
