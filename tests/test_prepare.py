"""Tests for prepare.py and data.py's side of it: the tokenizers, the shard format and meta.json,
the reader's checks, the train/val split, the sources (the plays, your files, FineWeb, stopped
and resumed) and the command line. Crash safety (the tmp folder, full disks, kills) is in
test_prepare_faults.py.  Run: OMP_NUM_THREADS=1 pytest -q tests/test_prepare.py"""
import hashlib
import io
import json
import lzma
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import configurator
import data
import prepare
from configurator import ConfigError
from data import DataError

HERE = Path(__file__).resolve().parent.parent  # the repository root
# read-only test data (GPT-2 BPE ranks, Tiny Shakespeare): ../shared/data, see ../shared/README.md
SHARED = HERE.parent / "shared" / "data"


def make(root, documents=None, **given):
    """prepare() with the defaults and the given settings, quietly, into root/<name>/."""
    cfg = configurator.defaults(prepare.SETTINGS, out_root=str(root), quiet=True, **given)
    return prepare.prepare(cfg, documents)


def split_docs(tokens, eot):
    """Token array -> list of documents (each started by an EOT)."""
    cuts = np.flatnonzero(np.asarray(tokens) == eot)
    return [tokens[a + 1:b] for a, b in zip(cuts, list(cuts[1:]) + [len(tokens)])]


def read_split(out_dir, split, vocab_size):
    return np.concatenate([data.read_shard(p, vocab_size)
                           for p in data.list_shards(str(out_dir), split)])


def text_of(tokens):
    return bytes(np.asarray(tokens).astype(np.uint8)).decode()


TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
        "All:\nSpeak, speak. — naïve café 東京 🎭\n")


# ---------------------------------------------------------------- tokenizers

def test_byte_round_trip():
    """Bytes are their own ids, 256 is the end-of-text token and decoding skips it."""
    tok = data.get_tokenizer("byte")
    assert (tok.name, tok.vocab_size, tok.eot) == ("byte", 257, 256)
    ids = tok.encode(TEXT)
    assert ids[:5] == list(b"First") and max(ids) < 256 and len(ids) == len(TEXT.encode("utf-8"))
    assert tok.decode(ids) == TEXT
    assert tok.decode([256] + ids + [256]) == TEXT  # EOT is skipped
    assert [list(a) for a in tok.encode_batch(["ab", "c"])] == [[97, 98], [99]]


def test_gpt2_known_ids_and_round_trip(gpt2):
    """GPT-2 through the offline copy: the published ids, a lossless round trip, and a literal
    "<|endoftext|>" in a text is text, not a document break."""
    assert (gpt2.vocab_size, gpt2.eot) == (50257, 50256)
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" the quick brown fox") == [262, 2068, 7586, 21831]
    assert gpt2.decode(gpt2.encode(TEXT)) == TEXT
    assert ([list(a) for a in gpt2.encode_batch(["Hello world", TEXT])]
            == [[15496, 995], gpt2.encode(TEXT)])
    assert gpt2.decode([15496, 99999, -1, 995]) == "Hello world"  # out-of-range ids are skipped
    assert gpt2.encode("<|endoftext|>") != [50256]


def test_tiktoken_decodes_in_one_call_and_skips_ids_between_special_tokens(monkeypatch):
    """Decoding (sample.py's real-words count reads up to 10M training tokens) is one call into
    tiktoken's Rust core, not a Python loop per token; an id with no bytes of its own (between
    an encoding's ordinary and special tokens) is skipped, not an error."""
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding(name="gap", pat_str=r".", special_tokens={"<|endoftext|>": 300},
                            mergeable_ranks={bytes([i]): i for i in range(256)})  # 256-299: none
    tok = data.TiktokenTokenizer(enc)
    singles = []
    real_single = enc.decode_single_token_bytes
    monkeypatch.setattr(enc, "decode_single_token_bytes",
                        lambda i: singles.append(i) or real_single(i), raising=False)
    assert tok.decode(list(b"hello") * 1000) == "hello" * 1000 and singles == []
    assert tok.decode([104, 105, 270, 300, -1, 301]) == "hi<|endoftext|>"  # 270: between; 301: past


def test_tokenizer_errors(monkeypatch):
    """A BPE file that cannot be loaded, and an unknown encoding: one line naming the way out."""
    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(data, "tiktoken_encoding", offline)
    with pytest.raises(DataError, match="TIKTOKEN_CACHE_DIR.*--tokenizer=byte"):
        data.get_tokenizer("gpt2")
    with pytest.raises(DataError, match="unknown tokenizer 'gpt3'"):
        data.get_tokenizer("gpt3")


# ---------------------------------------------------------------- shards and meta.json

def test_header_and_meta(tmp_path):
    """A dataset folder: meta.json and exactly the two shards it names, each in llm.c's layout
    (magic, version 1 = uint16, token count, zeros), with the sha256 meta.json records."""
    docs = [f"document {i}: " + "to be or not to be " * (i + 1) for i in range(30)]
    out = make(tmp_path, docs, dataset="mini")
    assert out == str(tmp_path / "mini_byte")
    meta = json.loads((tmp_path / "mini_byte" / "meta.json").read_text())
    assert set(meta) == {"name", "source", "tokenizer", "vocab_size", "eot", "documents",
                         "val_fraction", "seed", "train_tokens", "val_tokens",
                         "shards", "seconds", "created"}
    assert ((meta["name"], meta["tokenizer"], meta["vocab_size"], meta["eot"], meta["documents"])
            == ("mini_byte", "byte", 257, 256, 30))
    assert (meta["val_fraction"], meta["seed"]) == (0.1, 1337)
    # every byte, plus one EOT in front of each document
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(d) for d in docs) + len(docs)
    assert meta["source"] and meta["seconds"] >= 0
    time.strptime(meta["created"], "%Y-%m-%dT%H:%M:%SZ")
    folder = os.path.dirname(meta["shards"][0]["file"])  # this preparation's own folder
    assert [(s["file"], s["split"]) for s in meta["shards"]] == [
        (f"{folder}/mini_byte_train_000000.bin", "train"),
        (f"{folder}/mini_byte_val_000000.bin", "val")]
    assert sorted(os.listdir(out)) == sorted(["meta.json", folder])
    assert sorted(os.listdir(os.path.join(out, folder))) == ["mini_byte_train_000000.bin",
                                                            "mini_byte_val_000000.bin"]
    for s in meta["shards"]:
        raw = (tmp_path / "mini_byte" / s["file"]).read_bytes()
        header = np.frombuffer(raw[:1024], dtype="<i4")
        assert list(header[:3]) == [20240520, 1, s["tokens"]] and not header[3:].any()
        assert len(raw) == 1024 + 2 * s["tokens"]
        assert hashlib.sha256(raw).hexdigest() == s["sha256"]
        assert s["tokens"] == meta[f"{s['split']}_tokens"]
    assert data.load_meta(out)["vocab_size"] == 257


def test_big_vocab_uses_uint32(tmp_path):
    """Vocabularies over 65,536 ids: uint32 tokens under llm.c's own uint32 header (its
    dev/data/data_common.py, "llama-3": magic 20240801, version 7), so llm.c reads ours and we
    read its shards."""
    path = str(tmp_path / "x_train_000000.bin")
    data.write_shard(path, [0, 70_000, 99_999], vocab_size=100_000)
    assert list(np.fromfile(path, dtype="<i4", count=3)) == [20240801, 7, 3]
    t = data.read_shard(path, vocab_size=100_000)
    assert t.dtype == np.uint32 and list(t) == [0, 70_000, 99_999]


def test_llmc_shard_written_by_hand(tmp_path):
    """A folder of llm.c / modded-nanogpt shards, no meta.json: read as GPT-2 tokens."""
    tokens = np.array([50256, 15496, 995, 13], dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)  # exactly what llm.c's fineweb.py write_datafile does
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(tmp_path / "fineweb_val_000000.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    (path,) = data.list_shards(str(tmp_path), "val")
    assert path.endswith("fineweb_val_000000.bin")
    meta = data.load_meta(str(tmp_path))
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot"]) == ("gpt2", 50257, 50256)
    assert list(data.read_shard(path, meta["vocab_size"])) == list(tokens)


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


@pytest.mark.parametrize("case, message", [
    ("magic", "is not a token shard"), ("version", "is not a token shard"),
    ("count", "header says 13 tokens but the file has 1,048 bytes"),
    ("empty", "header says 0 tokens"), ("vocab", "token id 300 >= vocab size 257"),
    ("short", "is not a token shard")])
def test_corrupt_shards(tmp_path, case, message):
    """Every broken header, a truncated body and an id the model cannot read: one DataError
    naming the file."""
    path = str(tmp_path / "x_train_000000.bin")
    data.write_shard(path, list(b"hello, shard"), vocab_size=257)
    assert bytes(data.read_shard(path, 257).astype(np.uint8)) == b"hello, shard"
    corrupt(path, case)
    with pytest.raises(DataError, match=message) as e:
        data.read_shard(path, vocab_size=257)
    assert str(e.value).startswith(path) and "\n" not in str(e.value)


def test_unreadable_meta_json(tmp_path):
    """A meta.json cut short or missing its shards: one line saying to prepare it again."""
    out = make(tmp_path, ["a", "b"], dataset="d")
    meta = Path(out) / "meta.json"
    text = meta.read_text()
    for broken in (text[:len(text) // 2], json.dumps({"vocab_size": 257})):
        meta.write_text(broken)
        with pytest.raises(DataError, match=r"meta.json is unreadable .*run prepare.py again"):
            data.list_shards(out, "train")


def test_dataset_dir_and_missing_data(tmp_path):
    """--dataset: a name is data/<name>, a path is itself; a missing dataset is one line that
    says how to make one."""
    assert data.dataset_dir("shakespeare_byte") == os.path.join("data", "shakespeare_byte")
    assert data.dataset_dir(os.path.join("runs", "x")) == os.path.join("runs", "x")
    (tmp_path / "not_prepared").mkdir()
    for folder in (tmp_path / "missing", tmp_path / "not_prepared"):
        with pytest.raises(DataError) as e:
            data.list_shards(str(folder), "train")
        assert str(e.value) == (f"no train shards in {folder}: make them with python prepare.py "
                                f"(its --help says how), or name another --dataset")


def test_reader_trusts_only_what_meta_names(tmp_path):
    """Only the shards meta.json names are read, in its order; a named one gone is one line."""
    docs = [f"doc {i} " * 9 for i in range(20)]
    out = make(tmp_path, docs, dataset="d", shard_size=50)
    named = data.list_shards(out, "train")
    assert len(named) > 2 and [os.path.relpath(p, out) for p in named] == \
        [s["file"] for s in data.load_meta(out)["shards"] if s["split"] == "train"]
    # shards no meta.json names (a stray copy) are never read
    data.write_shard(os.path.join(os.path.dirname(named[0]), "d_byte_train_000099.bin"),
                     [1, 2, 3], 257)
    assert data.list_shards(out, "train") == named
    os.remove(named[1])
    with pytest.raises(DataError, match=r"_000001.bin is missing, though .*meta.json names it"):
        data.list_shards(out, "train")


# ---------------------------------------------------------------- the split

def test_by_document_whole_documents_one_per_run(tmp_path):
    """With at least 1/val_fraction documents, val is whole documents: one picked in each run of
    10 (val_fraction 0.1), the same for the same seed, another for another seed."""
    docs = [f"doc {i} says " + "la " * (i % 7) + f"end {i}." for i in range(100)]
    val = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        val[name] = text_of(read_split(make(tmp_path, docs, dataset=name, seed=seed),
                                       "val", 257))
    assert val["a"] == val["b"] != val["c"]
    val_docs = [text_of(d) for d in split_docs(read_split(tmp_path / "a_byte", "val", 257), 256)]
    assert len(val_docs) == 10 and set(val_docs) < set(docs)  # whole documents, 10% of them
    assert sorted(docs.index(d) // 10 for d in val_docs) == list(range(10))  # one per run
    train_docs = [text_of(d) for d in split_docs(read_split(tmp_path / "a_byte", "train", 257),
                                                 256)]
    assert train_docs == [d for d in docs if d not in val_docs]  # the rest, in order


def tails(docs, val_fraction):
    """What by_tail means: each document's tokens (an EOT first), its last val_fraction (at least
    one token) to val, the rest to train."""
    train, val = [], []
    for d in docs:
        ids = [256] + list(d.encode("utf-8"))
        cut = len(ids) - max(1, int(len(ids) * val_fraction))
        train += ids[:cut]
        val += ids[cut:]
    return train, val


@pytest.mark.parametrize("n_docs", [1, 9])
def test_by_tail_for_fewer_documents(tmp_path, n_docs):
    """With fewer than 1/val_fraction documents (one text file, say), val is the last
    val_fraction of each one's tokens."""
    docs = [f"document {i}: " + "words of the play " * (20 * i + 3) for i in range(n_docs)]
    out = make(tmp_path, docs, dataset="d")
    train, val = tails(docs, 0.1)
    assert list(read_split(out, "train", 257)) == train and list(read_split(out, "val", 257)) == val


def test_the_threshold_between_the_two_splits(tmp_path):
    """9 documents at val_fraction 0.1 are split by their tails (val holds no document start);
    10 are split by document (val holds one whole one)."""
    docs = [f"play {i}: " + "exit, pursued by a bear. " * (i + 2) for i in range(10)]
    nine = read_split(make(tmp_path, docs[:9], dataset="nine"), "val", 257)
    ten = read_split(make(tmp_path, docs, dataset="ten"), "val", 257)
    assert 256 not in nine
    assert list(ten).count(256) == 1 and text_of(ten[1:]) in docs


@pytest.mark.parametrize("docs", [["only one short document"], ["one", "two"],
                                  ["a", "b", "c", "d"], ["x"]])
def test_val_split_never_empty(tmp_path, docs):
    """Even a tiny val_fraction of tiny documents leaves a token on each side."""
    out = make(tmp_path, docs, dataset="d", val_fraction=0.001)
    train, val = read_split(out, "train", 257), read_split(out, "val", 257)
    assert len(train) and len(val) and len(train) + len(val) == sum(map(len, docs)) + len(docs)


def test_empty_documents_are_skipped_not_split(tmp_path):
    """Empty documents (an empty file in a folder) are left out before the split is chosen: 9
    texts and an empty one are split by their tails for every seed (by document, the val pick
    could fall on the empty one and leave val empty); and any number of empty documents in a
    row does not end the reading."""
    texts = [f"file {i} has plenty of text in it. " * 50 for i in range(9)]
    train, val = tails(texts, 0.1)
    for seed in range(20):
        out = make(tmp_path, texts + [""], dataset="d", seed=seed)
        assert list(read_split(out, "val", 257)) == val, seed
        assert list(read_split(out, "train", 257)) == train, seed
    out = make(tmp_path, [""] * 300 + ["the only words"], dataset="e")
    meta = data.load_meta(out)  # (documents: those read, the empty ones too)
    assert meta["documents"] == 301 and meta["train_tokens"] + meta["val_tokens"] == 15


@pytest.mark.parametrize("size", [200_000])
def test_single_file_val_share(tmp_path, size):
    """One text file: its last val_fraction of tokens are val, for any val_fraction."""
    rng = random.Random(size)
    words = "thou art more lovely and temperate rough winds do shake the darling buds".split()
    text = ""
    while len(text) < size:
        text += " ".join(rng.choices(words, k=rng.randint(3, 12))) + "\n"
    (tmp_path / "one.txt").write_text(text)
    for val_fraction in (0.1, 0.05, 0.5):
        out = make(tmp_path, input=str(tmp_path / "one.txt"), dataset=f"v{val_fraction}",
                   val_fraction=val_fraction)
        meta = data.load_meta(out)
        total = len(text.encode()) + 1  # every byte, and one EOT
        assert meta["train_tokens"] + meta["val_tokens"] == total and meta["documents"] == 1
        assert meta["val_tokens"] == int(total * val_fraction)


def test_empty_or_too_small_input(tmp_path):
    """No text, or not enough for both splits: one DataError line, and no dataset folder."""
    (tmp_path / "empty.txt").write_text("")
    for documents, given in (([], {}), (["", ""], {}),
                             (None, {"input": str(tmp_path / "empty.txt")})):
        with pytest.raises(DataError, match="too little text for a train and a val split") as e:
            make(tmp_path, documents, dataset="d", **given)
        assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="no input files match"):
        make(tmp_path, input=str(tmp_path / "nothing*.txt"))
    assert os.listdir(tmp_path) == ["empty.txt"]  # a refused first preparation leaves no folder


# ---------------------------------------------------------------- sources

def test_local_non_utf8_input(tmp_path, capsys):
    """Bytes that are not UTF-8 become U+FFFD, with a warning naming the file."""
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_bytes(b"caf\xc3\xa9 ok\n\nbad \xff\xfe bytes\n")
    (tmp_path / "texts" / "b.txt").write_text("second file\n")
    out = make(tmp_path, input=str(tmp_path / "texts"))
    assert out == str(tmp_path / "texts_byte")
    err = capsys.readouterr().err
    assert err == (f"warning: {tmp_path / 'texts' / 'a.txt'}: some bytes are not UTF-8; replaced "
                   f"with U+FFFD\n")
    tokens = np.concatenate([read_split(out, "train", 257), read_split(out, "val", 257)])
    text = data.get_tokenizer("byte").decode(tokens)
    assert "bad \ufffd\ufffd bytes" in text and "café" in text and "second file" in text


def test_directory_input_reads_txt_and_md(tmp_path, capsys):
    """A folder: its *.txt and *.md files (any case, in subfolders), one document each, with a
    note on what it skips."""
    (tmp_path / "notes" / "sub").mkdir(parents=True)
    (tmp_path / "notes" / "a.txt").write_text("alpha\n")
    (tmp_path / "notes" / "sub" / "b.MD").write_text("# beta\n")
    (tmp_path / "notes" / "c.json").write_text('{"gamma": 1}')
    (tmp_path / "notes" / "sub" / "d.png").write_bytes(b"\x89PNG delta")
    out = make(tmp_path, input=str(tmp_path / "notes"))
    assert capsys.readouterr().err == (f"note: {tmp_path / 'notes'}: reading its 2 *.txt and *.md "
                                       f"files, skipping 2 others\n")
    tokens = np.concatenate([read_split(out, "train", 257), read_split(out, "val", 257)])
    text = data.get_tokenizer("byte").decode(tokens)
    assert "alpha" in text and "# beta" in text and "gamma" not in text and "delta" not in text
    assert data.load_meta(out)["documents"] == 2


def test_file_and_glob_input(tmp_path):
    """--input=a file is one document; a glob reads the files it matches (** recursive), in
    order; each dataset is named after its input."""
    (tmp_path / "poems" / "old").mkdir(parents=True)
    (tmp_path / "poems" / "b.txt").write_text("second sonnet\n")
    (tmp_path / "poems" / "old" / "a.txt").write_text("first sonnet\n")
    (tmp_path / "poems" / "c.md").write_text("not matched\n")
    out = make(tmp_path, input=str(tmp_path / "poems" / "b.txt"))
    assert out == str(tmp_path / "b_byte") and data.load_meta(out)["documents"] == 1
    out = make(tmp_path, input=str(tmp_path / "poems" / "**" / "*.txt"))
    assert out == str(tmp_path / "poems_byte")
    meta = data.load_meta(out)
    assert meta["documents"] == 2 and meta["source"].endswith("(2 files)")
    train, val = tails(["second sonnet\n", "first sonnet\n"], 0.1)  # sorted: poems/b before old/
    assert list(read_split(out, "train", 257)) == train and list(read_split(out, "val", 257)) == val


def test_tiny_shakespeare_as_input_in_gpt2_ids(tmp_path, gpt2, gpt2_encoding):
    """nanoGPT's Tiny Shakespeare (input.txt) given with --input, in GPT-2 tokens: the whole file
    as one document, nanoGPT's 338,025 tokens, the last 10% of them val."""
    if not (SHARED / "tinyshakespeare.txt").exists():
        pytest.skip(f"needs {SHARED / 'tinyshakespeare.txt'}")
    shutil.copy(SHARED / "tinyshakespeare.txt", tmp_path / "input.txt")
    out = make(tmp_path, input=str(tmp_path / "input.txt"), tokenizer="gpt2")
    assert out == str(tmp_path / "input_gpt2")
    text = (SHARED / "tinyshakespeare.txt").read_text(encoding="utf-8")
    ids = [50256] + gpt2_encoding.encode_ordinary(text)
    assert len(ids) == 338025 + 1  # nanoGPT's count, and one EOT in front
    train, val = read_split(out, "train", 50257), read_split(out, "val", 50257)
    assert list(np.concatenate([train, val])) == ids and len(val) == int(len(ids) * 0.1)


class FakeHub:
    """urllib's urlopen for the hub's shards (each a small real shard, written in folder), which
    breaks off after `fail_after` files: the connection lost half way through the next one."""

    def __init__(self, folder, fail_after=None):
        self.folder, self.fail_after, self.asked = folder, fail_after, []

    def __call__(self, request, timeout=None):  # it ignores Range, as a server may
        self.asked.append(request.full_url.rsplit("/", 1)[1])
        path = str(self.folder / "served.bin")
        data.write_shard(path, np.arange(1000) + len(self.asked), 50257)
        payload = open(path, "rb").read()
        broken = self.fail_after is not None and len(self.asked) > self.fail_after

        class Response(io.BytesIO):
            def read(self, n=-1):
                if broken and self.tell() >= 500:
                    raise ConnectionResetError("reset by peer")
                return super().read(min(n, 500) if broken else n)
        return Response(payload)


def test_fineweb_downloads_whole_shards_and_goes_on_after_a_lost_connection(tmp_path,
                                                                            monkeypatch, capsys):
    """python -m lab.fineweb fetches the val shard and N train shards (the speedrun's, already
    GPT-2 tokens); a connection lost half way keeps the files finished before it, leaves no half
    file, and the same command again fetches only the rest; train.py reads the folder as it is
    (llm.c's shards, no meta.json: GPT-2 tokens), of the val shard only its first VAL_TOKENS."""
    from lab import fineweb
    out = tmp_path / "data" / "fineweb_edu_gpt2"
    hub = FakeHub(tmp_path, fail_after=2)
    monkeypatch.setattr(fineweb.urllib.request, "urlopen", hub)
    monkeypatch.setattr(fineweb, "VAL_TOKENS", 300)
    with pytest.raises(DataError, match=r"could not download finewebedu_train_000002.bin "
                                        r"\(reset by peer\): the 2 files before it are kept"):
        fineweb.download(str(out), train_shards=3)
    assert sorted(os.listdir(out)) == ["finewebedu_train_000001.bin", "finewebedu_val_000000.bin"]
    hub.fail_after, hub.asked = None, []
    fineweb.download(str(out), train_shards=3)
    assert hub.asked == ["finewebedu_train_000002.bin", "finewebedu_train_000003.bin"]
    assert "next: python train.py --dataset=fineweb_edu_gpt2" in capsys.readouterr().out
    assert len(data.list_shards(str(out), "train")) == 3 and data.load_meta(str(out))[
        "tokenizer"] == "gpt2"
    served = np.arange(1000) + 1  # the first file asked for: the val shard, its first 300 tokens
    assert list(data.read_shard(str(out / "finewebedu_val_000000.bin"))) == list(served[:300])
    assert list(data.read_shard(str(out / "finewebedu_train_000003.bin"))) == list(served + 1)
    with pytest.raises(ConfigError, match="takes only --train_shards=N"):
        fineweb.main(["3"])


def test_the_shipped_plays_are_normalised(tmp_path):
    """The default dataset: the 38 plays in corpus/, clean text, one document each, 3 of them
    whole in val, and shards byte for byte those of the previous prepare.py."""
    with lzma.open(prepare.PLAYS, "rt", encoding="utf-8") as f:
        plays = f.read().split("\f")
    assert len(plays) == 38
    for text in plays:
        for markup in ("**", "_", "#", "\\[", "&amp;", "  \n", "\f"):
            assert markup not in text
    titles = [t.split("\n", 1)[0] for t in plays]
    assert {"Hamlet", "Macbeth", "The Tempest", "Othello"} <= set(titles)
    assert len(set(titles)) == len(plays)
    hamlet = plays[titles.index("Hamlet")]
    assert "BERNARDO:\nWho's there?\n\nFRANCISCO:\nNay, answer me" in hamlet
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet
    assert "\nEnter HORATIO and MARCELLUS\n" in hamlet and "[Aside]" in hamlet
    out = make(tmp_path)  # the defaults: python prepare.py
    assert out == str(tmp_path / data.DEFAULT_DATASET)
    meta = data.load_meta(out)
    assert [(s["split"], s["sha256"]) for s in meta["shards"]] == [
        ("train", "5e7de43b92d5d97b6d2514f3bcf8d62ff9ea06127694c2d8aac4456f2c158d36"),
        ("val", "b76578d07dba4f1ec7f787f060300786c50ac597e5e689c05e6f6210733afb12")]
    for s in meta["shards"]:
        assert hashlib.sha256((Path(out) / s["file"]).read_bytes()).hexdigest() == s["sha256"]
    assert meta["documents"] == 38
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(t.encode()) for t in plays) + 38
    val_plays = [text_of(d) for d in split_docs(read_split(out, "val", 257), 256)]
    train_plays = [text_of(d) for d in split_docs(read_split(out, "train", 257), 256)]
    # 3 whole plays (seed 1337: the fourth run of 10 has 8 plays, and its pick fell past them)
    assert len(val_plays) == 3 and set(val_plays) < set(plays)
    assert train_plays == [p for p in plays if p not in val_plays]


# ---------------------------------------------------------------- the command line

def run_prepare(*args, cwd):
    return subprocess.run([sys.executable, str(HERE / "prepare.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(r, message):
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: ") and message in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("args, message", [
    (["--bogus=1"], "error: unrecognized arguments: --bogus=1"),
    (["--val_fraction=abc"], "error: --val_fraction=abc: must be float, like 0.1"),
    (["--val_fraction=2"], "error: --val_fraction=2.0: must be between 0.001 and 0.5"),
    (["--shard_size=1.5"], "error: --shard_size=1.5: must be int, like 100000000"),
    (["--quiet=maybe"], "error: --quiet=maybe: must be bool, like False"),
    (["--input", "poems.txt"], "error: poems.txt: prepare.py takes only --key=value settings "
                               "(your text: --input=poems.txt)"),
    (["poems.txt"], "error: poems.txt: prepare.py takes only --key=value settings (your text: "
                    "--input=poems.txt)"),
    (["--dataset=imdb"], "error: --dataset=imdb: use shakespeare, or give "
                         "your text with --input=PATH"),
    # nanoGPT's file is --input=input.txt; FineWeb-Edu comes tokenized (python -m lab.fineweb)
    (["--dataset=tinyshakespeare"], "error: --dataset=tinyshakespeare: use shakespeare"),
    (["--dataset=fineweb_edu"], "error: FineWeb-Edu comes tokenized already: python -m lab."),
    (["--tokenizer=gpt3"], "error: unknown tokenizer 'gpt3'"),
    (["--input=missing.txt"], "error: no input files match missing.txt"),
    (["--input=nothing*.txt"], "error: no input files match nothing*.txt"),
    (["--name=x"], "error: unrecognized arguments: --name=x"),  # the folder is its dataset's
    (["--workers=2"], "error: unrecognized arguments: --workers=2")])
def test_cli_errors_are_one_line(tmp_path, args, message):
    """A bad setting or a missing input: `error: ...`, one line, exit 1, nothing written."""
    assert_one_line_error(run_prepare(*args, cwd=tmp_path), message)
    assert os.listdir(tmp_path) == []


def test_cli_refused_first_preparation_leaves_nothing(tmp_path):
    """An empty input file on the command line: one line, and no dataset or tmp folder made."""
    (tmp_path / "empty.txt").write_text("")
    r = run_prepare("--input=empty.txt", cwd=tmp_path)
    assert_one_line_error(r, "error: empty.txt (1 file): too little text for a train and a val "
                             "split (0 + 0 tokens)")
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
            if p.is_file()] == ["empty.txt"]
    assert not (tmp_path / "data").exists() or os.listdir(tmp_path / "data") == []


def test_cli_help_lists_every_setting(tmp_path):
    """--help: the usage, then every setting with its meaning and default."""
    r = run_prepare("--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("usage: " + prepare.USAGE)
    words = " ".join(r.stdout.split())  # the meanings are wrapped
    for key, (default, meaning, *_) in prepare.SETTINGS.items():
        assert f"--{key} " in r.stdout and " ".join(f"{meaning} ({default})".split()) in words
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args, dataset", [
    ([], None),  # the default dataset: plain `python train.py`
    (["--input=poems.txt"], "poems_byte"),
    (["--input=poems.txt", "--dataset=x"], "x_byte"),
    (["--input=poems.txt", "--dataset=x", "--out_root=elsewhere"], "elsewhere/x_byte")])
def test_cli_prints_the_train_command(tmp_path, monkeypatch, args, dataset):
    """The last line is the train.py command for this dataset, and train.py's --dataset finds it."""
    (tmp_path / "poems.txt").write_text("Shall I compare thee to a summer's day?\n\n" * 50)
    r = run_prepare(*args, cwd=tmp_path)  # tmp_path/data/ is the default out_root
    assert r.returncode == 0 and r.stderr == "", r.stderr
    first, last = r.stdout.splitlines()
    where = (dataset if dataset and "/" in dataset
             else os.path.join("data", dataset or data.DEFAULT_DATASET))
    assert first.startswith(f"wrote {where}: ")
    assert last == "next: python train.py" + (f" --dataset={dataset}" if dataset else "")
    monkeypatch.chdir(tmp_path)
    data_dir = data.dataset_dir(dataset or data.DEFAULT_DATASET)
    meta = data.load_meta(data_dir)
    for split in ("train", "val"):
        assert len(read_split(data_dir, split, 257)) == meta[f"{split}_tokens"] > 0


def test_cli_quiet_prints_nothing(tmp_path):
    """--quiet (train.py's first-use run): no output at all, and the dataset is made."""
    (tmp_path / "poems.txt").write_text("Shall I compare thee to a summer's day?\n\n" * 50)
    r = run_prepare("--input=poems.txt", "--quiet", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert data.load_meta(str(tmp_path / "data" / "poems_byte"))["train_tokens"] > 0


def test_train_py_without_the_plays_names_the_command_that_makes_them(tmp_path, monkeypatch):
    """train.py prepares nothing itself (nanoGPT's order: prepare, then train): where the default
    dataset is missing it stops in one line that names python prepare.py, exit 1."""
    monkeypatch.chdir(tmp_path)
    result = subprocess.run([sys.executable, str(HERE / "train.py"), "--max_iters=0"],
                            capture_output=True, text=True)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == ("error: no train shards in data/shakespeare_byte: make them with "
                             "python prepare.py (its --help says how), or name another --dataset\n")
    assert os.listdir(tmp_path) == []  # nothing made: no out/, no data/


# ---------------------------------------------------------------- replacing a dataset

def test_preparing_the_same_name_again_replaces_it(tmp_path):
    """Issue 22 (--input=mytexts, then --input='mytexts/*.md', the same name): the second run
    replaces the dataset whole, nothing of the first is left in it, and no tmp folder beside."""
    texts = tmp_path / "mytexts"
    texts.mkdir()
    for i in range(3):
        (texts / f"play{i}.txt").write_text(f"Speak, speak, number {i}.\n\n" * 2000)
    (texts / "notes.md").write_text("# notes\n\nA short file.\n")
    assert run_prepare("--input=mytexts", "--shard_size=1000", cwd=tmp_path).returncode == 0
    out = tmp_path / "data" / "mytexts_byte"
    assert len(data.list_shards(str(out), "train")) > 10
    r = run_prepare("--input=mytexts/*.md", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == \
        "next: python train.py --dataset=mytexts_byte" and r.stderr == ""
    assert r.stdout.splitlines()[0] == f"replaced {os.path.join('data', 'mytexts_byte')}, which held " \
        "mytexts (4 files)"  # said at the moment it happens
    now = len((texts / "notes.md").read_bytes()) + 1  # every byte, and an EOT
    assert data.load_meta(str(out))["train_tokens"] + data.load_meta(str(out))["val_tokens"] == now
    assert len(data.list_shards(str(out), "train")) == 1
    r = run_prepare("--input=mytexts", "--quiet", cwd=tmp_path)  # --quiet: not a word
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert data.load_meta(str(out))["source"] == "mytexts (4 files)"
    run_prepare("--input=mytexts/*.md", cwd=tmp_path)
    meta = data.load_meta(str(out))
    assert meta["source"] == "mytexts/*.md (1 file)"  # not "1 files"
    assert meta["documents"] == 1
    assert meta["train_tokens"] + meta["val_tokens"] == len((texts / "notes.md").read_bytes()) + 1
    assert sorted(os.listdir(out)) == sorted({"meta.json"} | {os.path.dirname(s["file"])
                                              for s in meta["shards"]})
    assert os.listdir(tmp_path / "data") == ["mytexts_byte"]


def test_a_directory_without_texts_says_which_files_it_reads(tmp_path):
    """A folder with no *.txt or *.md file: one line saying which files a folder gives."""
    (tmp_path / "pictures").mkdir()
    (tmp_path / "pictures" / "a.png").write_bytes(b"\x89PNG")
    r = run_prepare("--input=pictures", cwd=tmp_path)
    assert_one_line_error(r, "error: no input files match pictures: give a UTF-8 text file, a "
                             "folder (its *.txt and *.md files are read), or a glob")
