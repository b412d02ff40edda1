"""Tests for sample.py on tiny checkpoints (one really trained, the others built by hand).

Dropped with the rewrite (issue 33), on purpose: the learned-lambda report (sample.py no longer
prints mixing weights; train.py logs them at every evaluation), the "data changed since training"
and "tokenizer no longer matches" notes (now: real words are simply not counted when the data is
absent or in another tokenizer, tested below), and the StreamDecoder class (the decoder is inline
in sample.sample, tested through its output)."""
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import configurator
import data
import prepare
import sample
import train
from model import GPT, GPTConfig, VALUE_MODES

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=320, bias=False)
BYTE_TOKENIZER = {"tokenizer": "byte", "vocab_size": 257, "eot": 256}
SEPARATOR = "\n---------------\n"  # what sample.py prints after each sample


def make_checkpoint(out_dir, value_mode="vanilla", **overrides):
    """A checkpoint of a randomly initialised tiny model, in train.py's format, without training."""
    torch.manual_seed(0)
    model_args = dict(GPTConfig(**{**TINY, **overrides, "value_mode": value_mode}).__dict__)
    state = GPT(GPTConfig(**model_args)).state_dict()
    os.makedirs(out_dir, exist_ok=True)
    torch.save({"format": data.CHECKPOINT_FORMAT, "model": state, "model_args": model_args,
                "tokenizer": BYTE_TOKENIZER, "iter_num": 0, "best_val_loss": float("inf"),
                "val_loss": 5.5,
                "config": {"dataset": os.path.join(str(out_dir), "no-data"), "max_iters": 0},
                "data": None}, os.path.join(out_dir, "ckpt.pt"))
    return str(out_dir)


def run(out_dir, *args, out=None):
    """(stdout, stderr, result) of sample.py with these arguments, in this process (fast)."""
    out, err = out or io.StringIO(), io.StringIO()
    cfg = configurator.parse_args(sample.SETTINGS, [f"--out_dir={out_dir}", "--device=cpu",
                                                    "--dtype=float32", *args], "")
    result = sample.sample(cfg, out, err)
    return out.getvalue(), err.getvalue(), result


def tiny_data(root, documents, name="tiny", **settings):
    """A prepared dataset from these texts (prepare.prepare, quiet), its folder."""
    return prepare.prepare(configurator.defaults(prepare.SETTINGS, dataset=name,
                                                 out_root=str(root), quiet=True, **settings),
                           documents=documents)


def tiny_train(data_dir, out_dir, **settings):
    """A tiny train.train run on the CPU; its out_dir."""
    train.train(configurator.defaults(
        train.SETTINGS, **{**dict(dataset=data_dir, out_dir=str(out_dir), device="cpu",
                                  dtype="float32", n_layer=2, n_embd=32, n_head=2, block_size=16,
                                  batch_size=4, eval_iters=1, eval_interval=2, max_iters=2,
                                  log_interval=1), **settings}))
    return str(out_dir)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real checkpoint from train.train: 2 steps of a tiny model on a tiny prepared dataset;
    its out_dir is `out` (what the README's snippet loads)."""
    root = tmp_path_factory.mktemp("trained")
    text = ("ROMEO: But soft, what light through yonder window breaks?\n"
            "JULIET: Ay me! \u2014 O Romeo.\n") * 20
    data_dir = tiny_data(root, [text, text.upper()])
    return tiny_train(data_dir, root / "out")


def test_trained_checkpoint_streams_repeatable_samples(trained):
    args = ["--num_samples=3", "--max_new_tokens=20", "--temperature=1.0", "--top_k=0"]
    out1, err1, r1 = run(trained, "--seed=7", *args)
    out2, _, r2 = run(trained, "--seed=7", *args)
    _, _, r3 = run(trained, "--seed=8", *args)
    assert out1 == out2 and r1["tokens"] == r2["tokens"]  # same seed, same text
    assert r3["tokens"] != r1["tokens"]
    assert out1.count(SEPARATOR) == 3 and len(r1["tokens"]) == 3
    assert all(len(t) == 20 for t in r1["tokens"])
    assert r1["tokens"][0] != r1["tokens"][1]  # one seed per run, not per sample
    assert "tokens/s" in err1 and "tokens/s" not in out1  # the report stays off stdout
    # it says what it loaded: the checkpoint, its mode and step, that step's val loss (not the
    # best one: the checkpoint is the last step's)
    ckpt = data.load_checkpoint(os.path.join(trained, "ckpt.pt"))
    evals = [json.loads(line) for line in open(os.path.join(trained, "log.jsonl"))]
    assert ckpt["val_loss"] == [r for r in evals if r["kind"] == "eval"][-1]["val_loss"]
    assert err1.startswith(f"loaded {trained}/ckpt.pt: resformer, step 2, "
                           f"val loss {ckpt['val_loss']:.4f} there\n")


@pytest.mark.parametrize("value_mode", VALUE_MODES)
def test_cached_and_uncached_greedy_agree(tmp_path, value_mode):
    """Every value mode (value_embed too), grouped-query attention: the KV cache changes the
    speed, never the tokens."""
    out_dir = make_checkpoint(tmp_path, value_mode, n_kv_head=1)
    # 40 new tokens after a 5-token prompt runs past block_size 16: the cache's refill path too
    args = ["--start=hello", "--num_samples=1", "--max_new_tokens=40", "--temperature=0"]
    cached, err_cached, r_cached = run(out_dir, *args)
    uncached, err, r_uncached = run(out_dir, *args, "--use_cache=False")
    assert r_cached["tokens"] == r_uncached["tokens"] and cached == uncached
    assert len(r_cached["tokens"][0]) == 40
    assert cached.startswith("hello") and "cache off" in err and "cache on" in err_cached


def test_file_prompt_same_as_inline(tmp_path):
    out_dir = make_checkpoint(tmp_path / "out")
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


def fake_generation(monkeypatch, tokens, seen=None):
    """GPT.generate_tokens replaced: records the prompt it is given, yields these tokens."""
    def generate_tokens(self, idx, *args, **kwargs):
        if seen is not None:
            seen.append(idx.tolist())
        for t in tokens:
            yield torch.tensor([[t]])
    monkeypatch.setattr(GPT, "generate_tokens", generate_tokens)


def test_empty_prompt_starts_from_end_of_text(tmp_path, monkeypatch):
    out_dir = make_checkpoint(tmp_path)
    seen = []
    real = GPT.generate_tokens
    monkeypatch.setattr(GPT, "generate_tokens", lambda self, idx, *a, **k:
                        seen.append(idx.tolist()) or real(self, idx, *a, **k))
    out, _, result = run(out_dir, "--num_samples=1", "--max_new_tokens=2")
    assert seen == [[[BYTE_TOKENIZER["eot"]]]] and len(result["tokens"][0]) == 2


class Writes(io.StringIO):
    """stdout that keeps each write apart, to see what streamed when."""

    def __init__(self):
        super().__init__()
        self.pieces = []

    def write(self, text):
        self.pieces.append(text)
        return super().write(text)


def test_streamed_text_joins_characters_split_across_tokens(tmp_path, monkeypatch):
    """Byte tokens split a character of 2 or 3 UTF-8 bytes over 2 or 3 tokens: the stream holds
    its first bytes back until it is whole, so no write shows a replacement character, and the
    text after a multi-byte prompt is exactly what was generated (an end-of-text prints nothing)."""
    out_dir = make_checkpoint(tmp_path)
    prompt, generated = "\u00c9t\u00e9 \u2014 ", "a\u2014b\u00e9\u2026!"
    new = list(generated.encode("utf-8")) + [BYTE_TOKENIZER["eot"]] + list("\u00e9".encode())
    fake_generation(monkeypatch, new)
    writes = Writes()
    out, _, result = run(out_dir, f"--start={prompt}", "--num_samples=1",
                         f"--max_new_tokens={len(new)}", out=writes)
    assert out == prompt + generated + "\u00e9" + SEPARATOR
    assert result["tokens"] == [new]
    assert not any("\ufffd" in piece for piece in writes.pieces)
    # 16 tokens at a time (one wait for the device each, never one per token); a character cut
    # by the 16th token is held back until its last bytes arrive with the next 16
    fake_generation(monkeypatch, list(b"x" * 15) + list("\u2014".encode()))
    writes = Writes()
    run(out_dir, "--start=>", "--num_samples=1", "--max_new_tokens=18", out=writes)
    assert [piece for piece in writes.pieces if piece][:3] == [">", "x" * 15, "\u2014"]
    # bytes that never make a character are not held back for ever: each shows as U+FFFD
    fake_generation(monkeypatch, [0xFF] * 20)
    out, _, _ = run(out_dir, "--start=x", "--num_samples=1", "--max_new_tokens=20")
    assert out == "x" + "\ufffd" * 20 + SEPARATOR


def test_svformer_cache_bytes_reported_against_vanilla(tmp_path):
    n_layer = 4
    out_dir = make_checkpoint(tmp_path, "svformer", n_layer=n_layer)
    _, err, result = run(out_dir, "--num_samples=1", "--max_new_tokens=3")
    match = re.search(r"KV cache: ([\d,]+) bytes .*a vanilla cache: ([\d,]+) bytes", err)
    svformer, vanilla = (int(g.replace(",", "")) for g in match.groups())
    assert svformer * 2 * n_layer == vanilla * (n_layer + 1)  # (L+1)/(2L), exactly
    assert f"({n_layer} key + 1 value tensors)" in err
    # the vanilla figure is what a vanilla model's cache really allocates
    vanilla_dir = make_checkpoint(tmp_path / "vanilla", "vanilla", n_layer=n_layer)
    assert run(vanilla_dir, "--num_samples=1", "--max_new_tokens=3")[2]["cache_bytes"] == vanilla
    assert result["cache_bytes"] == svformer and result["vanilla_bytes"] == vanilla
    # the paper's lambda = 2 mix: the same cache as vanilla, reported as such
    mix_dir = make_checkpoint(tmp_path / "mix", "resformer", n_layer=n_layer, lambda_1=2.0,
                              lambda_2=1.0)
    assert run(mix_dir, "--num_samples=1", "--max_new_tokens=3")[2]["cache_bytes"] == vanilla


def test_errors(tmp_path):
    """Each mistake is a UserError (one line from run_main) that says what to do."""
    with pytest.raises(data.DataError, match=r"no checkpoint at .*python train.py --out_dir="):
        run(tmp_path / "nothing")
    os.makedirs(tmp_path / "other")
    torch.save({"format": "someone-else/3", "model": {}}, tmp_path / "other" / "ckpt.pt")
    with pytest.raises(data.DataError, match="not a checkpoint of this version of train.py"):
        run(tmp_path / "other")
    out_dir = make_checkpoint(tmp_path / "out")
    with pytest.raises(configurator.ConfigError, match="no prompt file"):
        run(out_dir, f"--start=FILE:{tmp_path / 'missing.txt'}")
    with pytest.raises(configurator.ConfigError, match=r"--temperature=-1.0: must be at least"):
        run(out_dir, "--temperature=-1")


def test_out_dir_naming_the_checkpoint_says_to_name_its_folder(tmp_path):
    """`--out_dir=out/ckpt.pt` answered 'no checkpoint at out/ckpt.pt/ckpt.pt: train one first,
    e.g. python train.py --out_dir=out/ckpt.pt'; now: name the run's folder."""
    out_dir = make_checkpoint(tmp_path / "out")
    open(os.path.join(out_dir, "log.jsonl"), "w").close()
    for named in ("ckpt.pt", "log.jsonl"):  # any file of the run: its folder
        with pytest.raises(configurator.ConfigError) as e:
            run(os.path.join(out_dir, named))
        assert str(e.value) == f"--out_dir is the run's folder: use --out_dir={out_dir}"
    done = subprocess.run([sys.executable, "sample.py", "--out_dir=README.md"], cwd=HERE,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr == (
        "error: --out_dir is the run's folder: use --out_dir=.\n")


def test_command_line_error_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "sample.py", f"--out_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=HERE)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: no checkpoint at") and done.stderr.count("\n") == 1


# ---- the real-words share (lab/real_words.py), and the README's notebook snippet ----

def reference_share(data_dir, tokenizer, text):
    """The measure as README defines it, written out again: ASCII-letter words, lowercased,
    looked up among the words of the decoded train split (end-of-text left out); (share, words,
    share among the distinct words)."""
    words = lambda text: [w.lower() for w in re.findall(r"[A-Za-z]+", text)]
    meta = data.load_meta(data_dir)
    train_ids = [t for p in data.list_shards(data_dir, "train")
                 for t in data.read_shard(p, meta["vocab_size"]).tolist() if t != tokenizer.eot]
    vocabulary = set(words(tokenizer.decode(train_ids)))
    sampled = words(text)
    share = lambda ws: sum(w in vocabulary for w in ws) / len(ws)
    return share(sampled), len(sampled), share(set(sampled))


def test_real_words_of_samples_and_of_a_known_text(trained, tmp_path, capsys):
    """The share of sampled words found in the training text, from sample.py's output (a file
    or stdin): as the measure's definition gives it; case does not matter, repetition counts in
    the share of words, not in that of distinct words."""
    from lab.real_words import main, real_words
    out, _, _ = run(trained, "--num_samples=3", "--max_new_tokens=60", "--seed=3")
    data_dir = data.load_checkpoint(os.path.join(trained, "ckpt.pt"))["config"]["dataset"]
    (shares, n), byte = real_words(data_dir, data.get_tokenizer("byte"), out), \
        data.get_tokenizer("byte")
    share, words, distinct = reference_share(data_dir, byte, out)
    assert n == words > 0 and shares == pytest.approx((share, distinct))
    (tmp_path / "samples.txt").write_text(out)
    main([trained, str(tmp_path / "samples.txt")])
    assert capsys.readouterr().out == (f"real words: {share:.1%} of the {words:,} sampled words "
                                       f"occur in the training text of {data_dir} "
                                       f"({distinct:.1%} of the distinct ones)\n")
    assert real_words(data_dir, byte, "Romeo, ROMEO! zzyzx window; window qqq.")[0] == \
        pytest.approx((4 / 6, 2 / 4))


def test_real_words_read_at_most_10M_tokens_of_the_training_text(tmp_path, monkeypatch):
    """However many train shards a dataset has (FineWeb's: 100M tokens each), the words are
    looked up among its first 10M tokens, not 10M of every shard."""
    from lab.real_words import real_words
    data_dir = tiny_data(tmp_path, ["Some words to train on.\n" * 40])
    big = np.tile(np.array(list(b"a "), dtype=np.uint16), 3_000_000)  # 3 shards of 6M tokens
    monkeypatch.setattr(data, "list_shards", lambda d, split: ["s0", "s1", "s2"])
    monkeypatch.setattr(data, "read_shard", lambda path, vocab_size=None: big)
    decoded = []
    real_decode = data.ByteTokenizer.decode
    monkeypatch.setattr(data.ByteTokenizer, "decode",
                        lambda self, ids: decoded.append(len(ids)) or real_decode(self, ids))
    assert real_words(data_dir, data.get_tokenizer("byte"), "a b")[0] == (0.5, 0.5)
    assert sum(n for n in decoded if n > 1000) == 10_000_000


def test_real_words_are_not_counted_without_the_training_text_or_in_other_tokens(tmp_path):
    """A dataset folder that is gone, or now holds another tokenizer's shards, or a sample with
    no word: not counted, and said why."""
    from lab.real_words import real_words
    byte = data.get_tokenizer("byte")
    assert real_words(str(tmp_path / "gone"), byte, "ROMEO") == (
        None, f"the training text ({tmp_path / 'gone'}) is not here")
    data_dir = tiny_data(tmp_path, ["ROMEO: But soft, what light?\n" * 20])
    meta_path = os.path.join(data_dir, "meta.json")
    json.dump({**json.load(open(meta_path)), "tokenizer": "gpt2"}, open(meta_path, "w"))
    assert real_words(data_dir, byte, "ROMEO") == (
        None, f"{data_dir} now holds gpt2 tokens, not the model's byte tokens")
    json.dump({**json.load(open(meta_path)), "tokenizer": "byte"}, open(meta_path, "w"))
    assert real_words(data_dir, byte, "12, 34!") == (None, "no word (letters a-z) was sampled")


def test_greedy_decoding_draws_one_sample(trained):
    """`--start=FILE:README.md --temperature=0` printed 10 identical samples: temperature 0 is
    greedy, so one sample is drawn (said once)."""
    readme = os.path.join(HERE, "README.md")
    out, err, result = run(trained, f"--start=FILE:{readme}", "--temperature=0",
                           "--max_new_tokens=30")
    assert len(result["tokens"]) == 1 and out.count(SEPARATOR) == 1
    assert err.count("temperature 0 is greedy decoding: the 10 samples would all be the same, "
                     "so one is drawn\n") == 1
    _, err, result = run(trained, "--start=x", "--temperature=0", "--num_samples=1",
                         "--max_new_tokens=5")
    assert "greedy" not in err and len(result["tokens"]) == 1  # one asked for: nothing to say


def test_real_words_with_gpt2_tokens(tmp_path, gpt2):
    from lab.real_words import real_words
    text = "But soft, what light through yonder window breaks? It is the east.\n"
    data_dir = tiny_data(tmp_path, [text * 30, text.upper() * 30] * 5, name="g",
                         tokenizer="gpt2")
    sampled = "But soft, yonder zebra breaks"
    share, words, distinct = reference_share(data_dir, gpt2, sampled)
    assert real_words(data_dir, gpt2, sampled) == ((share, distinct), words) and share == 0.8


def readme_snippet():
    """The python block after "Load a trained model in a notebook:" in README.md."""
    readme = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    assert "Load a trained model in a notebook:" in readme
    after = readme.split("Load a trained model in a notebook:")[1]
    return after.split("```python\n")[1].split("```")[0]


def test_the_readme_notebook_snippet_turns_text_into_tokens_and_back(trained):
    """The README's block runs as it is, in a fresh Python beside a trained out/, and prints a
    sample that starts with its prompt."""
    snippet = readme_snippet()
    assert "get_tokenizer(" in snippet and "tiktoken_encoding" not in snippet
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
    assert "README.md" in product and "sample.py" in product and "data.py" in product
    for name in product:
        text = open(os.path.join(HERE, name), encoding="utf-8").read()
        assert "../shared" not in text and "shared/tools" not in text, name


def test_sampling_reads_the_device_16_tokens_at_a_time_and_says_when_it_recomputes(
        tmp_path, monkeypatch):
    """sample.py used to call .item() on every token, a GPU sync each; now the stream copies
    16 tokens at a time. Past block_size every token recomputes the whole (cropped) context,
    and sample.py says so instead of slowing down in silence."""
    out_dir = make_checkpoint(tmp_path)
    reads = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("a read per token"))
    monkeypatch.setattr(torch.Tensor, "tolist",
                        lambda self: reads.append(self.numel()) or real_tolist(self))
    _, err, result = run(out_dir, "--start=ab", "--num_samples=1", "--max_new_tokens=40")
    assert len(result["tokens"][0]) == 40
    assert [n for n in reads if n > 1][:3] == [16, 16, 8]  # the stream's copies
    assert "past block_size (16 tokens) every new token recomputes the last 16" in err
    _, err, _ = run(out_dir, "--start=ab", "--num_samples=1", "--max_new_tokens=10")
    assert "recomputes" not in err
    # 2 + 15 tokens: the last one is sampled from 16 and never fed back, so nothing is recomputed
    _, err, _ = run(out_dir, "--start=ab", "--num_samples=1", "--max_new_tokens=15")
    assert "recomputes" not in err
