"""Crash safety of prepare.py (issue 14): a re-prepare that fails at any file operation, or is
killed at any moment, leaves the old complete dataset or the new one, never a mix or nothing; the
next run removes what it left.  Run: pytest -q test_prepare_faults.py"""
import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import prepare
import shards

HERE = Path(__file__).parent.parent  # the repository root
OLD_DOCS = [f"old document {i}: " + "to be or not to be " * (1 + i % 4) for i in range(40)]
NEW_DOCS = [f"NEW DOCUMENT {i}: " + "ALL THE WORLD'S A STAGE " * (1 + i % 3) for i in range(40)]


class Crash(OSError):
    """The injected failure: an OSError, as a full disk or a pulled drive raises."""


def load(data_dir):
    """(train tokens, val tokens) as train.py reads them, or None where it finds no dataset."""
    try:
        meta = shards.load_meta(data_dir)
        return tuple(np.concatenate([shards.read_shard(p, meta["vocab_size"])
                                     for p in shards.list_shards(data_dir, split)])
                     for split in ("train", "val"))
    except shards.DataError:
        return None


def same(a, b):
    return a is not None and b is not None and all(np.array_equal(x, y) for x, y in zip(a, b))


def only_the_named_set(data_dir):
    """True when data_dir holds meta.json, the lock, and exactly the shards meta.json names."""
    named = {s["file"] for s in shards.load_meta(data_dir)["shards"]}
    found = {p.relative_to(data_dir).as_posix() for p in Path(data_dir).rglob("*")}
    return found == named | {"meta.json", "prepare.lock"}


def make(root, docs):
    return prepare.prepare(dataset="d", documents=docs, shard_size=500, out_root=root, workers=1,
                           quiet=True)


def to_older_layout(data_dir, layout):
    """Rewrites a dataset as an older prepare.py wrote it: before generation tags (untagged shard
    names, no sizes or generation in meta.json), or before meta.json recorded the input."""
    meta = json.loads((data_dir / "meta.json").read_text())
    del meta["input"]
    if layout == "untagged":
        for shard in meta["shards"]:
            base = shard["file"].replace(".gen-1_", "_")
            os.replace(data_dir / shard["file"], data_dir / base)
            shard["file"] = base
            del shard["bytes"]
        del meta["generation"]
    (data_dir / "meta.json").write_text(json.dumps(meta))


def inject(monkeypatch, fail_at, die):
    """Makes call number fail_at (from 0) of os.replace / os.remove / os.rmdir raise Crash, and, if
    die, every later call too (the process is as good as dead). Returns the calls made."""
    calls = []
    for name in ("replace", "remove", "rmdir"):
        def fake(*args, _real=getattr(os, name), _name=name, **kwargs):
            calls.append(f"{_name}({os.path.basename(args[0])})")
            if len(calls) - 1 == fail_at or (die and len(calls) - 1 > fail_at):
                raise Crash(f"injected at call {len(calls) - 1}: {calls[-1]}")
            return _real(*args, **kwargs)
        monkeypatch.setattr(os, name, fake)
    return calls


@pytest.mark.parametrize("layout", ["untagged", "no_input"])
def test_an_older_layout_is_one_line_saying_to_prepare_it_again(tmp_path, layout):
    data_dir = tmp_path / "d_byte"
    make(tmp_path, OLD_DOCS)
    to_older_layout(data_dir, layout)
    said = (f"{data_dir} was prepared by an older version of prepare.py: delete it, then run "
            f"python prepare.py --input=<your text> --dataset=d --out_root={tmp_path}")
    with pytest.raises(shards.OlderDataset, match=f"^{re.escape(said)}$"):  # what readers say
        shards.load_meta(data_dir)
    with pytest.raises(shards.OlderDataset, match=f"^{re.escape(said)}$"):  # and prepare.py
        make(tmp_path, NEW_DOCS)
    shutil.rmtree(data_dir)
    assert same(load(make(tmp_path, NEW_DOCS)), load(make(tmp_path / "again", NEW_DOCS)))


@pytest.mark.parametrize("die", [True, False], ids=["dies", "fails_once"])
def test_fault_at_every_file_operation(tmp_path, monkeypatch, capsys, die):
    new = load(make(tmp_path / "reference", NEW_DOCS))
    old = load(make(tmp_path / "pristine", OLD_DOCS))
    assert not same(old, new)
    outcomes = []
    for k in range(200):  # fail at call 0, 1, ... until a run makes fewer than k + 1 calls
        root = tmp_path / f"k{k}"
        shutil.copytree(tmp_path / "pristine", root)
        with monkeypatch.context() as m:
            calls = inject(m, k, die)
            try:
                make(root, NEW_DOCS)
                failed = False
            except Crash:
                failed = True
        got = load(root / "d_byte")
        where = f"fault at call {k} ({calls[k] if k < len(calls) else 'none'})"
        assert same(got, old) or same(got, new), f"{where}: neither the old nor the new dataset"
        outcomes.append("new" if same(got, new) else "old")
        if not failed:  # k is past the last call: the run completed
            assert len(calls) == k and outcomes[-1] == "new" and only_the_named_set(root / "d_byte")
            break
        # the next run removes what this one left, says so in one line, and holds the new set only
        left = not only_the_named_set(root / "d_byte")
        capsys.readouterr()
        make(root, NEW_DOCS)
        said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("removed")]
        assert len(said) == int(left), f"{where}: {said}"
        assert same(load(root / "d_byte"), new) and only_the_named_set(root / "d_byte"), where
        shutil.rmtree(root)
    # every operation was hit: some faults came before the switch, some after it
    assert len(calls) > 10 and outcomes.count("old") > 3 and outcomes.count("new") > 3, outcomes


def test_second_run_on_the_same_dataset_is_refused(tmp_path):
    out = make(tmp_path, OLD_DOCS)
    lock = prepare.lock_dataset(out)  # as another prepare.py process holds it
    try:
        with pytest.raises(shards.DataError, match="being prepared by another prepare.py run"):
            make(tmp_path, NEW_DOCS)
    finally:
        lock.release()
    assert same(load(out), load(make(tmp_path / "again", OLD_DOCS)))  # untouched


@pytest.mark.parametrize("first", [True, False], ids=["first", "again"])
def test_full_disk_is_one_line_and_removes_what_the_run_wrote(tmp_path, monkeypatch, first):
    """A full disk mid-write: the run's own files go (with the folder, if it made it), the old
    dataset stays, and the error names the folder."""
    if not first:
        old = load(make(tmp_path, OLD_DOCS))
    real_write, written = prepare.write_shard, []

    def fills_the_disk(path, tokens, vocab_size):
        if written:  # the second shard does not fit
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(path)
        return real_write(path, tokens, vocab_size)

    monkeypatch.setattr(prepare, "write_shard", fills_the_disk)
    with pytest.raises(shards.DataError) as error:
        make(tmp_path, NEW_DOCS)
    assert str(error.value) == (
        f"no space left on device while writing {tmp_path / 'd_byte'}: this run's files are "
        f"removed{', the dataset there is unchanged' if not first else ''}; free some space, "
        f"or prepare under another --out_root")
    assert written and not os.path.exists(written[0])
    if first:
        assert os.listdir(tmp_path) == []
    else:
        assert same(load(tmp_path / "d_byte"), old) and only_the_named_set(tmp_path / "d_byte")


# ---------------------------------------------------------------- real kills

def write_book(path, seed, size=3_000_000):
    rng, words, parts, n = random.Random(seed), "now is the winter of our discontent".split(), [], 0
    while n < size:
        parts.append(" ".join(rng.choices(words, k=rng.randint(20, 200))) + "\n\n")
        n += len(parts[-1])
    path.write_text("".join(parts))


def state(data_dir):
    """What is on disk, in a few words (for the failure message)."""
    entries = sorted(os.listdir(data_dir))
    return ", ".join(f"{e}/ ({len(os.listdir(data_dir / e))} files)" if (data_dir / e).is_dir()
                     else e for e in entries)


def kill_when(root, moment):
    """Starts a re-prepare of new.txt over root/book, and sends it SIGKILL at moment: a number of
    seconds, or a condition on the dataset directory. Returns (moment reached?, exit code)."""
    args = [sys.executable, str(HERE / "prepare.py"), f"--input={root / 'new.txt'}", "--name=book",
            f"--out_root={root}", "--shard_size=100000", "--workers=1", "--overwrite"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, meta_inode = time.time(), os.stat(root / "book" / "meta.json").st_ino
    conditions = {
        "new shards started": lambda: len(list((root / "book").glob("*.gen-2_*.bin"))) >= 1,
        "10 new shards": lambda: len(list((root / "book").glob("*.gen-2_*.bin"))) >= 10,
        "meta.json switched": lambda: os.stat(root / "book" / "meta.json").st_ino != meta_inode,
    }
    reached = False
    while proc.poll() is None and time.time() - t0 < 30:
        try:
            reached = (time.time() - t0 >= moment if isinstance(moment, float)
                       else conditions[moment]())
        except FileNotFoundError:  # meta.json is being replaced this instant
            reached = False
        if reached:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    return reached, proc.wait()


def test_sigkill_while_re_preparing(tmp_path):
    pristine, reference = tmp_path / "pristine", tmp_path / "reference"
    for root, text in ((pristine, "old.txt"), (reference, "new.txt")):
        root.mkdir()
        write_book(root / "old.txt", seed=1)
        write_book(root / "new.txt", seed=2)  # what the killed runs prepare
        prepare.prepare(input=str(root / text), name="book", out_root=root, shard_size=100_000,
                        workers=1, quiet=True)
    old, new = load(pristine / "book"), load(reference / "book")
    assert not same(old, new) and len(shards.list_shards(reference / "book", "train")) > 20
    seen = []
    for i, moment in enumerate([0.3, 0.6, 0.9, "new shards started", "10 new shards",
                                "meta.json switched"]):
        root = tmp_path / f"kill{i}"
        shutil.copytree(pristine, root)
        reached, code = kill_when(root, moment)
        got = load(root / "book")
        what = "new" if same(got, new) else "old" if same(got, old) else "NEITHER"
        ending = "killed" if reached else f"exit {code}"
        seen.append(f"{moment}: {ending}, {what}: {state(root / 'book')}")
        assert what != "NEITHER", seen[-1]
        prepare.prepare(input=str(root / "new.txt"), name="book", out_root=root, shard_size=100_000,
                        workers=1, quiet=True, overwrite=True)  # the next run cleans up, completes
        assert same(load(root / "book"), new) and only_the_named_set(root / "book"), seen[-1]
        shutil.rmtree(root)
    print("\n".join(seen))
    assert any(s.startswith("10 new shards: killed, old") for s in seen), seen  # a mid-write kill


def test_ctrl_c_exits_130_and_keeps_the_old_set(tmp_path):
    write_book(tmp_path / "old.txt", seed=1)
    write_book(tmp_path / "new.txt", seed=2)
    prepare.prepare(input=str(tmp_path / "old.txt"), name="book", out_root=tmp_path,
                    shard_size=100_000, workers=1, quiet=True)
    old = load(tmp_path / "book")
    args = [sys.executable, str(HERE / "prepare.py"), f"--input={tmp_path / 'new.txt'}",
            "--name=book", f"--out_root={tmp_path}", "--shard_size=100000", "--workers=1",
            "--overwrite"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not list(tmp_path.glob("book/*.gen-2_*.bin")) and time.time() - t0 < 30:
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    if proc.returncode == 0:
        pytest.skip("prepare.py finished before the Ctrl-C arrived")
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == "interrupted: nothing half-written is in use; run it again"
    assert same(load(tmp_path / "book"), old)
    assert only_the_named_set(tmp_path / "book")  # its half-written shards are gone too
