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
from model import GPT, GPTConfig, VALUE_MODES
from shards import CHECKPOINT_FORMAT, load_checkpoint
from test_prepare import gpt2, gpt2_encoding  # noqa: F401 (fixtures: GPT-2 offline, or a skip)

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
    torch.save({"format": CHECKPOINT_FORMAT, "model": state, "model_args": model_args,
                "tokenizer": BYTE_TOKENIZER, "iter_num": 0, "best_val_loss": float("inf"),
                "config": {"dataset": os.path.join(out_dir, "no-data"), "max_iters": 0},
                "data": None}, os.path.join(out_dir, "ckpt.pt"))
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
    # it says what it loaded: the checkpoint, its step of max_iters, its val loss
    best = load_checkpoint(os.path.join(trained, "ckpt.pt"))["best_val_loss"]
    assert err1.startswith(f"loaded {trained}/ckpt.pt: resformer, step 2 of max_iters 2, "
                           f"best val loss {best:.4f} (fixed-window estimate)\n")


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
    # the paper's lambda = 2 mix: the same cache as vanilla, reported as such
    mix_dir = make_checkpoint(tmp_path / "mix", "resformer", n_layer=n_layer, lambda_1=2.0,
                              lambda_2=1.0)
    assert run(mix_dir, "--num_samples=1", "--max_new_tokens=3")[2]["cache_bytes"] == vanilla


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
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


# ---- issue 22: the real-words share, the data a model trained on, the README's notebook ----

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
REAL_WORDS = re.compile(r"real words: ([\d.]+)% of the ([\d,]+) sampled words occur in the "
                        r"training text of (.+)\n")


def reference_share(data_dir, tokenizer, samples):
    """The measure as README defines it, written out again: ASCII-letter words, lowercased,
    looked up among the words of the decoded train split (end-of-text left out)."""
    words = lambda text: [w.lower() for w in re.findall(r"[A-Za-z]+", text)]
    meta = shards.load_meta(data_dir)
    train = [t for p in shards.list_shards(data_dir, "train")
             for t in shards.read_shard(p, meta["vocab_size"]).tolist() if t != tokenizer.eot]
    vocabulary = set(words(tokenizer.decode(train)))
    sampled = words("\n".join(tokenizer.decode([t for t in s if t != tokenizer.eot])
                              for s in samples))
    return sum(w in vocabulary for w in sampled) / len(sampled), len(sampled)


def test_sample_reports_the_share_of_real_words(trained):
    _, err, result = run(trained, "--num_samples=3", "--max_new_tokens=60", "--seed=3")
    found = REAL_WORDS.search(err)
    assert found, err
    data_dir = load_checkpoint(os.path.join(trained, "ckpt.pt"))["config"]["dataset"]
    share, n = reference_share(data_dir, shards.get_tokenizer("byte"), result["tokens"])
    assert found.group(3) == data_dir and int(found.group(2).replace(",", "")) == n > 0
    assert float(found.group(1)) == pytest.approx(100 * share, abs=0.05)
    assert result["real_words"] == pytest.approx(share)
    vocabulary, _ = shards.training_vocabulary(data_dir, shards.get_tokenizer("byte"))
    assert {"romeo", "juliet", "window"} <= vocabulary
    assert shards.real_word_share("Romeo, ROMEO! zzyzx window", vocabulary) == (0.75, 4, 2 / 3)
    # repetition scores high on the share of words, not on the share of distinct words
    assert shards.real_word_share("I the the the the zzyzx qqq", vocabulary | {"i", "the"})[::2] \
        == (5 / 7, 0.5)
    assert f"real words among the distinct words: {100 * result['distinct_real_words']:.1f}%" in err


def test_real_words_with_gpt2_tokens(tmp_path, gpt2):
    text = "But soft, what light through yonder window breaks? It is the east.\n"
    data_dir = prepare.prepare(documents=[text * 30, text.upper() * 30] * 5, name="g",
                               tokenizer="gpt2", out_root=str(tmp_path), quiet=True, workers=1)
    vocabulary, scanned = shards.training_vocabulary(data_dir, gpt2)
    assert {"soft", "yonder", "window", "east"} <= vocabulary and "endoftext" not in vocabulary
    assert scanned == shards.load_meta(data_dir)["train_tokens"]
    out_dir = make_checkpoint(tmp_path / "out", vocab_size=50304)
    ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=False)
    ckpt["tokenizer"] = {"tokenizer": "gpt2", "vocab_size": 50257, "eot": 50256}
    ckpt["config"]["dataset"] = data_dir
    ckpt["data"] = shards.data_identity(data_dir, shards.load_meta(data_dir))
    torch.save(ckpt, os.path.join(out_dir, "ckpt.pt"))
    _, err, result = run(out_dir, "--num_samples=2", "--max_new_tokens=30", "--start=But soft")
    share, n = reference_share(data_dir, gpt2, result["tokens"])
    assert REAL_WORDS.search(err) and result["real_words"] == pytest.approx(share)


ROMEO_TEXT = "ROMEO: But soft, what light through yonder window breaks?\n"


def train_one_step(tmp_path):
    """(out_dir, data_dir) of a 1-step tiny run on a byte dataset named d."""
    data_dir = prepare.prepare(documents=[ROMEO_TEXT * 20] * 4, name="d", out_root=str(tmp_path),
                               quiet=True, workers=1)
    cfg = dict(train.DEFAULTS, dataset=data_dir, out_dir=str(tmp_path / "out"), device="cpu",
               n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=2, eval_iters=1,
               max_iters=1, log_interval=1)
    train.train(cfg)
    return cfg["out_dir"], data_dir


def test_sample_says_when_the_data_changed_since_training(tmp_path):
    out_dir, data_dir = train_one_step(tmp_path)
    # the same name, other text: sampling still works, and says the measure is against other data
    prepare.prepare(documents=["Other words entirely.\n" * 30] * 4, name="d",
                    out_root=str(tmp_path), quiet=True, workers=1)
    _, err, _ = run(out_dir, "--num_samples=1", "--max_new_tokens=5")
    assert (f"note: {data_dir} changed since this model trained on it (generation 1: " in err
            and "; now generation 2: " in err and REAL_WORDS.search(err))


def test_sample_says_when_the_tokenizer_no_longer_matches(tmp_path, gpt2):
    out_dir, data_dir = train_one_step(tmp_path)
    text = ROMEO_TEXT
    cfg = {"out_dir": out_dir}
    # another tokenizer under that name: decoding stays with the checkpoint's, and says so
    prepare.prepare(documents=[text * 20] * 4, name="d", tokenizer="gpt2", out_root=str(tmp_path),
                    quiet=True, workers=1, overwrite=True)
    out, err, _ = run(cfg["out_dir"], "--num_samples=1", "--max_new_tokens=5", "--start=ROMEO")
    assert (f"note: {data_dir} now holds gpt2 tokens, but this model was trained on byte tokens: "
            f"decoding with byte, as the checkpoint records; real words not counted") in err
    assert out.startswith("ROMEO") and not REAL_WORDS.search(err)


def test_the_readme_notebook_snippet_turns_text_into_tokens_and_back(trained):
    readme = open(os.path.join(HERE, "README.md")).read()
    snippet = readme.split("Load a trained model in a notebook:")[1].split("```python\n")[1]
    snippet = snippet.split("```")[0]
    assert "get_tokenizer(" in snippet and "_tiktoken_encoding" not in snippet
    done = subprocess.run([sys.executable, "-c", snippet], cwd=os.path.dirname(trained),
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": HERE})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ROMEO:") and len(done.stdout) > len("ROMEO:") + 20


def test_nothing_in_the_product_refers_to_the_shared_folder():
    """../shared is the developers' folder; a clone does not have it."""
    product = [f for f in os.listdir(HERE) if f.endswith((".py", ".md", ".txt"))
               and not f.startswith(("test_", "conftest"))]
    product += [os.path.join("config", f) for f in os.listdir(os.path.join(HERE, "config"))]
    assert "README.md" in product and "sample.py" in product
    for name in product:
        text = open(os.path.join(HERE, name), encoding="utf-8").read()
        assert "../shared" not in text and "shared/tools" not in text, name
