"""Tests for prepare.py and data.py's side of it: the plays' exact shards, the tokenizers, the
shard format and meta.json, the train/val split, --input, replacing a dataset without ever losing
it, and the command line. Run: python -m pytest -q tests/test_prepare.py"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import configurator
import data
import prepare
from configurator import ConfigError
from data import DataError

ROOT = Path(__file__).resolve().parent.parent  # the repository root
TEXT = "First Citizen:\nSpeak, speak. \u2014 na\u00efve caf\u00e9 \u6771\u4eac \U0001f3ad\n"
OLD = [f"old document {i}: " + "to be or not to be " * (1 + i % 4) for i in range(12)]
NEW = [f"NEW DOCUMENT {i}: " + "ALL THE WORLD'S A STAGE " * (1 + i % 3) for i in range(12)]


def make(root, documents, *argv):
    """prepare.prepare quietly into root with these --key=value settings: the dataset's folder."""
    cfg = configurator.parse_args(prepare.SETTINGS, [f"--out_root={root}", "--quiet", *argv], "")
    return prepare.prepare(cfg, documents)


def tokens(out_dir, split):
    """A split's tokens, all its shards, as data.load_dataset reads them."""
    shards, _ = data.load_dataset(str(out_dir))
    return np.concatenate(shards[split])


def documents_in(out_dir, split):
    """The texts of a byte-level split, cut at the end-of-text token in front of each."""
    ids = tokens(out_dir, split)
    return [bytes(part[1:].astype(np.uint8)).decode()
            for part in np.split(ids, np.flatnonzero(ids == 256))[1:]]


def files(folder):
    """Every file in folder with its bytes: to tell a dataset left byte for byte as it was."""
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


# ---------------------------------------------------------------- the plays

def test_the_plays_are_the_bytes_the_records_were_trained_on(tmp_path, monkeypatch, capsys):
    """`python prepare.py`: the 38 plays in corpus/ as bytes, in shards byte for byte those of
    the committed records, meta.json naming them, and the train.py command to run next."""
    monkeypatch.chdir(tmp_path)
    prepare.main([])
    out = tmp_path / "data" / "shakespeare_byte"
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["documents"], meta["train_tokens"], meta["val_tokens"]) == (38, 4_508_146,
                                                                             478_922)
    assert [(s["file"], s["split"], s["tokens"]) for s in meta["shards"]] == [
        ("shakespeare_byte_train_000000.bin", "train", 4_508_146),
        ("shakespeare_byte_val_000000.bin", "val", 478_922)]
    assert {s["split"]: hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()
            for s in meta["shards"]} == {
        "train": "5e7de43b92d5d97b6d2514f3bcf8d62ff9ea06127694c2d8aac4456f2c158d36",
        "val": "b76578d07dba4f1ec7f787f060300786c50ac597e5e689c05e6f6210733afb12"}
    assert os.listdir(tmp_path / "data") == ["shakespeare_byte"]
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith(f"wrote {os.path.join('data', 'shakespeare_byte')}: 4,508,146 "
                              f"train + 478,922 val tokens, byte (vocab 257)")
    assert said[-1] == "next: python train.py"


# ---------------------------------------------------------------- tokenizers

def test_byte_tokenizer_round_trip():
    """Each UTF-8 byte is its own id (a character may be several); the end-of-text id 256 has
    no text."""
    tok = data.get_tokenizer("byte")
    assert (tok.name, tok.vocab_size, tok.eot) == ("byte", 257, 256)
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8")) and len(ids) > len(TEXT)
    assert tok.decode(ids) == TEXT and tok.decode([256, *ids, 256]) == TEXT


def test_gpt2_known_ids_and_round_trip(gpt2):
    """GPT-2 through tiktoken: the published ids, a lossless round trip, and the ids of the
    model's padding rows (50,257 to 50,303) decode to nothing."""
    assert (gpt2.name, gpt2.vocab_size, gpt2.eot) == ("gpt2", 50257, 50256)
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.decode(gpt2.encode(TEXT)) == TEXT
    assert gpt2.decode([15496, 50257, 50303, 995]) == "Hello world"
    assert gpt2.encode("<|endoftext|>") != [gpt2.eot]  # a literal in a text is text


def test_tokenizer_errors_are_one_line(monkeypatch):
    """An unknown name, or a BPE file tiktoken cannot load (no network): one line naming the
    byte tokenizer."""
    with pytest.raises(DataError) as e:
        data.get_tokenizer("gpt3")
    assert str(e.value) == ("cannot load the tokenizer 'gpt3' (ValueError): use byte, or gpt2 "
                            "(tiktoken downloads it once)")

    def offline(name):
        raise ConnectionError("no network")
    import tiktoken
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(DataError) as e:
        data.get_tokenizer("gpt2")
    assert str(e.value) == ("cannot load the tokenizer 'gpt2' (ConnectionError): use byte, or "
                            "gpt2 (tiktoken downloads it once)")


# ---------------------------------------------------------------- shards and meta.json

def test_shards_and_meta_json(tmp_path, capsys):
    """A dataset folder holds meta.json and exactly the shards it names, each in llm.c's layout:
    256 int32 of header (magic, version 1 = uint16, token count, zeros), then the tokens."""
    docs = [f"document {i}: " + "to be or not to be " * (i + 1) for i in range(30)]
    out = make(tmp_path, docs, "--dataset=mini")
    assert out == str(tmp_path / "mini_byte") and capsys.readouterr() == ("", "")  # --quiet
    meta = json.loads((tmp_path / "mini_byte" / "meta.json").read_text())
    assert {k: v for k, v in meta.items() if k not in ("shards", "train_tokens", "val_tokens")} \
        == {"name": "mini_byte", "tokenizer": "byte", "vocab_size": 257, "eot": 256,
            "documents": 30, "val_fraction": 0.1, "seed": 1337}
    # every byte, and an end-of-text token in front of each document
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(d) for d in docs) + len(docs)
    assert [(s["file"], s["split"]) for s in meta["shards"]] == [
        ("mini_byte_train_000000.bin", "train"), ("mini_byte_val_000000.bin", "val")]
    assert set(os.listdir(out)) == {"meta.json", *(s["file"] for s in meta["shards"])}
    for s in meta["shards"]:
        raw = (tmp_path / "mini_byte" / s["file"]).read_bytes()
        header = np.frombuffer(raw[:1024], dtype="<i4")
        assert list(header[:3]) == [20240520, 1, s["tokens"]] and not header[3:].any()
        assert len(raw) == 1024 + 2 * s["tokens"] and s["tokens"] == meta[f"{s['split']}_tokens"]


def test_a_vocabulary_over_65536_ids_writes_uint32(tmp_path, monkeypatch):
    """A tokenizer with more ids than uint16 holds: llm.c's uint32 layout (magic 20240801,
    version 7), read back as the same ids."""
    big = SimpleNamespace(name="big", vocab_size=100_000, eot=99_999, decode=None,
                          encode=lambda text: [70_000 + ord(c) for c in text])
    monkeypatch.setattr(data, "get_tokenizer", lambda name: big)
    out = make(tmp_path, ["abc" * 10], "--dataset=x")
    raw = (Path(out) / "x_big_train_000000.bin").read_bytes()
    n = int(np.frombuffer(raw[8:12], dtype="<i4")[0])
    assert list(np.frombuffer(raw[:8], dtype="<i4")) == [20240801, 7] and len(raw) == 1024 + 4 * n
    ids = np.concatenate([tokens(out, "train"), tokens(out, "val")])
    assert ids.dtype == np.uint32 and ids.tolist() == [99_999] + [70_000 + ord(c) for c in
                                                                 "abc" * 10]


def test_an_llmc_shard_written_by_hand_is_read(tmp_path):
    """A shard exactly as llm.c's fineweb.py writes it (header 20240520, 1, n; uint16 ids)."""
    ids = np.array([50256, 15496, 995, 13], dtype="<u2")
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240520, 1, len(ids)
    path = tmp_path / "fineweb_val_000000.bin"
    path.write_bytes(header.tobytes() + ids.tobytes())
    assert data.read_shard(str(path)).tolist() == ids.tolist()


@pytest.mark.parametrize("case, message", [
    ("short", " is missing or not a whole token shard: prepare the data again"),
    ("magic", " is missing or not a whole token shard: prepare the data again"),
    ("empty", " is missing or not a whole token shard: prepare the data again"),
    ("truncated", " is missing or not a whole token shard: prepare the data again")])
def test_a_corrupt_shard_is_one_line_naming_it(tmp_path, case, message):
    path = tmp_path / "x_train_000000.bin"
    prepare.write_shard(str(path), list(b"hello, shard") + [300], 301)
    raw = path.read_bytes()
    path.write_bytes({"short": raw[:100], "magic": bytes(4) + raw[4:], "empty": b"",
                      "truncated": raw[:-2]}[case])
    with pytest.raises(DataError) as e:
        data.read_shard(str(path))
    assert str(e.value).startswith(str(path)) and message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_broken_or_missing_dataset_is_one_line(tmp_path):
    """meta.json cut short, a shard it names gone, a folder without meta.json: one line each,
    naming the file and the command that makes it anew."""
    out = Path(make(tmp_path, [TEXT * 5], "--dataset=d"))
    meta = (out / "meta.json").read_text()
    (out / "meta.json").write_text(meta[:len(meta) // 2])
    with pytest.raises(DataError) as e:
        data.load_dataset(str(out))
    assert str(e.value) == f"{out / 'meta.json'} is unreadable: prepare the data again"
    (out / "meta.json").write_text(meta)
    (out / "d_byte_val_000000.bin").unlink()
    with pytest.raises(DataError) as e:
        data.load_dataset(str(out))
    assert str(e.value) == (f"{out / 'd_byte_val_000000.bin'} is missing or not a whole token "
                            f"shard: prepare the data again")
    (out / "meta.json").unlink()
    with pytest.raises(DataError) as e:
        data.load_dataset(str(out))
    assert str(e.value) == f"no dataset in {out}: make one with python prepare.py"


# ---------------------------------------------------------------- the split

def test_enough_documents_hold_out_whole_ones_one_in_each_run(tmp_path):
    """With at least 1/val_fraction documents, val is whole documents: one drawn in each run of
    10 (val_fraction 0.1), the same for the same seed; train is the rest, in order."""
    docs = [f"doc {i} says " + "la " * (i % 7) + f"end {i}." for i in range(30)]
    val = {seed: documents_in(make(tmp_path, docs, f"--dataset=s{seed}", f"--seed={seed}"), "val")
           for seed in (1, 2)}
    assert documents_in(make(tmp_path, docs, "--dataset=again", "--seed=1"), "val") == val[1]
    assert val[1] != val[2]
    assert sorted(docs.index(d) // 10 for d in val[1]) == [0, 1, 2]
    assert documents_in(tmp_path / "s1_byte", "train") == [d for d in docs if d not in val[1]]


@pytest.mark.parametrize("n_docs, val_fraction, runs", [(10, 0.1, [10]), (7, 0.3, [4, 3])])
def test_the_split_is_stratified_never_empty(tmp_path, n_docs, val_fraction, runs):
    """Each run of 1/val_fraction documents (3.33 rounds to runs of 4 and 3) holds out exactly
    one of them for every seed: val is never empty, as a draw per document could leave it."""
    docs = [f"play {i}: " + "exit, pursued by a bear. " * 3 for i in range(n_docs)]
    starts, picks = np.cumsum([0] + runs), set()
    for seed in range(8):
        val = documents_in(make(tmp_path, docs, "--dataset=d", "--overwrite", f"--seed={seed}",
                                f"--val_fraction={val_fraction}"), "val")
        assert [np.searchsorted(starts, docs.index(d), "right") - 1 for d in val] == \
            list(range(len(runs))), seed
        picks.update(val)
    assert len(picks) > len(runs)  # the draw depends on the seed


@pytest.mark.parametrize("n_docs", [1, 9])
def test_fewer_documents_hold_out_each_ones_tail(tmp_path, n_docs):
    """With fewer than 1/val_fraction documents (one text file, say), val is the last
    val_fraction of each one's tokens; empty documents are skipped, so 9 texts and an empty one
    are still split by their tails."""
    docs = [f"document {i}: " + "words of the play " * (20 * i + 3) for i in range(n_docs)]
    out = make(tmp_path, [""] + docs + [""], "--dataset=d")
    train, val = [], []
    for d in docs:
        ids = [256, *d.encode()]
        train += ids[:len(ids) - int(len(ids) * 0.1)]
        val += ids[len(ids) - int(len(ids) * 0.1):]
    assert tokens(out, "train").tolist() == train and tokens(out, "val").tolist() == val
    assert data.load_meta(out)["documents"] == n_docs


@pytest.mark.parametrize("documents", [[], ["", ""], "an empty file"])
def test_too_little_text_is_one_line_and_leaves_nothing(tmp_path, documents):
    (tmp_path / "empty.txt").write_text("")
    given = [f"--input={tmp_path / 'empty.txt'}"] if documents == "an empty file" else []
    with pytest.raises(DataError) as e:
        make(tmp_path / "data", None if given else documents, "--dataset=d", *given)
    assert str(e.value) == "too little text for a train split: give more"
    assert os.listdir(tmp_path / "data") == []


# ---------------------------------------------------------------- --input

def test_an_input_file_is_one_document_named_after_it(tmp_path):
    """--input=poems.txt: data/poems_byte/ (--dataset names it otherwise), the whole file one
    document, its last tenth val."""
    (tmp_path / "poems.txt").write_text(TEXT * 20, encoding="utf-8")
    out = make(tmp_path, None, f"--input={tmp_path / 'poems.txt'}")
    assert out == str(tmp_path / "poems_byte") and data.load_meta(out)["documents"] == 1
    ids = [256, *(TEXT * 20).encode()]
    assert tokens(out, "val").tolist() == ids[-int(len(ids) * 0.1):]
    assert tokens(out, "train").tolist() + tokens(out, "val").tolist() == ids
    named = make(tmp_path, None, f"--input={tmp_path / 'poems.txt'}", "--dataset=verse")
    assert named == str(tmp_path / "verse_byte")


@pytest.mark.parametrize("given, message", [
    ("missing.txt", "missing.txt: no such file (a UTF-8 text file)"),
    ("latin1.txt", "latin1.txt is not UTF-8 text (byte 3): convert it first, e.g. iconv -f "
                   "latin1 -t utf-8"),
    ("texts", "texts: no such file (a UTF-8 text file)"),  # a folder is no longer read
    ("texts/*.txt", "*.txt: no such file (a UTF-8 text file)")])  # nor a glob
def test_bad_input_is_one_line(tmp_path, given, message):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("words\n")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9".encode("latin1"))
    with pytest.raises(DataError) as e:
        make(tmp_path / "data", None, f"--input={tmp_path / given}")
    assert str(e.value).endswith(message) and "\n" not in str(e.value)
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------- replacing a dataset

def test_the_same_name_again_is_replaced_only_with_overwrite(tmp_path, monkeypatch, capsys):
    """Without --overwrite: the old dataset kept byte for byte, said in one line (so the README's
    command, run twice, goes on to train); with it, the new one replaces the old whole (none of
    the old one's many shards left), no temporary folder."""
    out = make(tmp_path, OLD, "--dataset=d")
    (Path(out) / "d_byte_train_000001.bin").write_bytes(b"an old shard the new one lacks")
    before = files(out)
    capsys.readouterr()
    assert make(tmp_path, NEW, "--dataset=d") == out
    assert capsys.readouterr().err == f"{out} is there already: kept (--overwrite makes it anew)\n"
    assert files(out) == before
    assert make(tmp_path, NEW, "--dataset=d", "--overwrite", "--quiet=false") == out
    first, last = capsys.readouterr().out.splitlines()
    assert first.startswith(f"replaced {out}: ")
    assert last == f"next: python train.py --dataset={out}"  # out_root is not data/
    meta = data.load_meta(out)
    assert set(os.listdir(out)) == {"meta.json", *(s["file"] for s in meta["shards"])}
    assert sorted(documents_in(out, "train") + documents_in(out, "val")) == sorted(NEW)
    assert os.listdir(tmp_path) == ["d_byte"]


@pytest.mark.parametrize("error", [OSError, KeyboardInterrupt])
def test_an_error_while_writing_keeps_the_old_dataset(tmp_path, monkeypatch, error):
    """An error or Ctrl-C with the first shard of the new dataset written (into a folder of its
    own beside the old one): the old dataset byte for byte and readable, no temporary folder."""
    out = make(tmp_path, OLD, "--dataset=d")
    before, real, written = files(out), prepare.write_shard, []

    def second_fails(path, *args):
        written.append(path)
        if len(written) == 2:
            raise error("in the middle")
        return real(path, *args)
    monkeypatch.setattr(prepare, "write_shard", second_fails)
    with pytest.raises(error, match="in the middle"):
        make(tmp_path, NEW, "--dataset=d", "--overwrite")
    assert os.path.basename(os.path.dirname(written[0])).startswith(".d_byte.new-")
    assert files(out) == before and os.listdir(tmp_path) == ["d_byte"]
    assert sorted(documents_in(out, "train") + documents_in(out, "val")) == sorted(OLD)


@pytest.mark.parametrize("error", [KeyboardInterrupt, PermissionError])
def test_an_error_as_the_new_folder_is_made_leaves_no_temporary_folder(tmp_path, monkeypatch,
                                                                        error):
    """Ctrl-C, or a file system that refuses chmod, just after the new dataset's folder is made
    and before a shard is written: the folder goes too."""
    def fails(path, mode):
        raise error
    monkeypatch.setattr(os, "chmod", fails)
    with pytest.raises(error):
        make(tmp_path, NEW, "--dataset=d")
    assert os.listdir(tmp_path) == []


def test_a_failure_after_the_old_one_is_renamed_aside_puts_it_back(tmp_path, monkeypatch):
    """The rename of the new dataset into place fails, the old one already aside: the old one
    is renamed back, byte for byte, and no temporary folder is left."""
    out = make(tmp_path, OLD, "--dataset=d")
    before, real, out_there = files(out), os.replace, []

    def second_fails(src, dst):  # the first renames the old one aside, the second the new in
        out_there.append(os.path.exists(out))
        if len(out_there) == 2:
            raise OSError("the rename failed")
        return real(src, dst)
    # The shards are only touched, so that prepare.py's two renames are the only os.replace calls.
    monkeypatch.setattr(prepare, "write_shard", lambda path, ids, vocab_size: Path(path).touch())
    monkeypatch.setattr(os, "replace", second_fails)
    with pytest.raises(OSError, match="the rename failed"):
        make(tmp_path, NEW, "--dataset=d", "--overwrite")
    assert out_there[:2] == [True, False] and files(out) == before  # A third put it back.
    assert os.listdir(tmp_path) == ["d_byte"]


def test_the_next_run_tidies_what_a_killed_one_left(tmp_path, capsys):
    """A prepare.py killed on its way leaves its new folder half written, and, killed between
    its two renames, the old dataset aside with no data/<name>/: the next prepare.py of that
    name puts the old one back (kept, without --overwrite) and removes every leftover folder."""
    out = Path(make(tmp_path, OLD, "--dataset=d"))
    before = files(out)
    for leftover in (".d_byte.new-1a2b", ".d_byte.new-3c4d", ".d_byte.old-5e6f"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "d_byte_train_000000.bin").write_bytes(b"half a shard")
    (tmp_path / ".other.new-7a8b").mkdir()  # another dataset's: not this run's to touch
    (tmp_path / ".d_byte.old-9c0d").mkdir()
    os.replace(out, tmp_path / ".d_byte.old-9c0d" / "d_byte")  # killed between the renames
    capsys.readouterr()
    assert make(tmp_path, NEW, "--dataset=d") == str(out)
    assert files(out) == before and sorted(os.listdir(tmp_path)) == [".other.new-7a8b", "d_byte"]
    assert capsys.readouterr().err == (f"{out}: put back (a killed prepare.py had set it aside)\n"
                                       f"{out} is there already: kept (--overwrite makes it "
                                       f"anew)\n")


# ---------------------------------------------------------------- the command line

def test_settings_that_belong_to_another_command(tmp_path, monkeypatch, capsys):
    """FineWeb-Edu names lab.fineweb, another name without --input asks for the text, and
    --help lists every setting with its meaning and default; nothing is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        prepare.main(["--dataset=fineweb_edu"])
    assert str(e.value).endswith("(FineWeb-Edu: python -m lab.fineweb)")
    with pytest.raises(ConfigError, match=r"^--dataset=imdb: use shakespeare, or give your text"):
        prepare.main(["--dataset=imdb"])
    with pytest.raises(SystemExit) as e:
        prepare.main(["--help"])
    assert e.value.code == 0
    shown = capsys.readouterr().out
    for key, (default, meaning, *_) in prepare.SETTINGS.items():
        assert f"  --{key}={default}  {meaning}\n" in shown
    assert os.listdir(tmp_path) == []


def test_the_program_refuses_a_plain_argument_and_names_the_next_command(tmp_path):
    """As a program: a plain argument is one line naming --input, exit 1, nothing written; a
    text prepared ends on the train.py command that trains on it."""
    (tmp_path / "poems.txt").write_text(TEXT * 20, encoding="utf-8")
    refused = subprocess.run([sys.executable, str(ROOT / "prepare.py"), "poems.txt"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (refused.returncode, refused.stdout, refused.stderr) == (1, "", (
        "error: poems.txt: prepare.py takes only --key=value settings (your text: "
        "--input=poems.txt)\n"))
    assert os.listdir(tmp_path) == ["poems.txt"]
    done = subprocess.run([sys.executable, str(ROOT / "prepare.py"), "--input=poems.txt"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    first, last = done.stdout.splitlines()
    assert first.startswith(f"wrote {os.path.join('data', 'poems_byte')}: ")
    assert last == "next: python train.py --dataset=poems_byte"


def test_ctrl_c_while_replacing_leaves_the_old_dataset_or_the_new_one(tmp_path):
    """Ctrl-C (SIGINT) while `prepare.py --overwrite` writes a big new dataset: exit 130 without
    a traceback, and data/book_byte/ is the old dataset byte for byte or the new one whole."""
    make(tmp_path / "data", OLD, "--dataset=book")
    out, before = tmp_path / "data" / "book_byte", files(tmp_path / "data" / "book_byte")
    new = "".join(f"{i}: now is the winter of our discontent made glorious summer\n"
                  for i in range(50_000))
    (tmp_path / "book.txt").write_text(new)
    # SIGINT's default handler back: a shell's background job (as pytest may be) ignores it
    proc = subprocess.Popen([sys.executable, str(ROOT / "prepare.py"), "--input=book.txt",
                             "--overwrite"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.time()  # the moment to press Ctrl-C: the new dataset's first shard is written
    while proc.poll() is None and time.time() - t0 < 60 and not any(
            (tmp_path / "data").glob(".book_byte.new-*/*")):
        time.sleep(0.001)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("prepare.py finished before the Ctrl-C landed")
    assert (proc.returncode, err) == (130, "")
    if files(out) != before:
        ids = np.concatenate([tokens(out, "train"), tokens(out, "val")])
        assert np.array_equal(ids, [256, *np.frombuffer(new.encode(), np.uint8)])
    assert not [n for n in os.listdir(tmp_path / "data") if n.startswith(".book_byte.new-")]
