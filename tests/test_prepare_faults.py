"""Crash safety of prepare.py: it writes a dataset's shards into a folder of their own inside
<name>/ and then meta.json, whole, over the old one: the switch. So a run that fails at any file
operation, runs out of disk, is interrupted or is killed leaves the old dataset as it was (or,
once switched, the new one), never a mix; a failed run removes its folder, and the next run
removes what a killed one left.
Run: OMP_NUM_THREADS=1 pytest -q tests/test_prepare_faults.py"""
import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

import configurator
import data
import prepare

HERE = Path(__file__).resolve().parent.parent  # the repository root
OLD_DOCS = [f"old document {i}: " + "to be or not to be " * (1 + i % 4) for i in range(40)]
NEW_DOCS = [f"NEW DOCUMENT {i}: " + "ALL THE WORLD'S A STAGE " * (1 + i % 3) for i in range(40)]


class Crash(OSError):
    """The injected failure: an OSError, as a full disk or a pulled drive raises."""


def make(root, docs, **given):
    cfg = configurator.defaults(prepare.SETTINGS, dataset="d", shard_size=500,
                                out_root=str(root), quiet=True)
    vars(cfg).update(given)
    return prepare.prepare(cfg, docs)


def load(data_dir):
    """(train tokens, val tokens) as train.py reads them, or None where it finds no dataset."""
    try:
        meta = data.load_meta(str(data_dir))
        return tuple(np.concatenate([data.read_shard(p, meta["vocab_size"])
                                     for p in data.list_shards(str(data_dir), split)])
                     for split in ("train", "val"))
    except data.DataError:
        return None


def same(a, b):
    return a is not None and b is not None and all(np.array_equal(x, y) for x, y in zip(a, b))


def files(folder):
    """Every file under folder with its bytes: to tell a dataset left byte for byte as it was."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()} if folder.is_dir() else None


def named_files(folder):
    """meta.json and the shards it names, with their bytes: the dataset a reader sees."""
    if not (Path(folder) / "meta.json").exists():
        return None
    names = ["meta.json"] + [s["file"] for s in data.load_meta(str(folder))["shards"]]
    return {n: (Path(folder) / n).read_bytes() for n in names if (Path(folder) / n).exists()}


def only_the_named_set(data_dir):
    """True when data_dir holds meta.json and exactly the shards meta.json names, each with the
    sha256 meta.json records for it."""
    shards = data.load_meta(str(data_dir))["shards"]
    found = {p.relative_to(data_dir).as_posix() for p in Path(data_dir).rglob("*") if p.is_file()}
    return found == {s["file"] for s in shards} | {"meta.json"} and all(
        hashlib.sha256((Path(data_dir) / s["file"]).read_bytes()).hexdigest() == s["sha256"]
        for s in shards)


def tmp_folders(root, name="d_byte"):
    """The shard folders in root/name/ that its meta.json does not name: a run's, not finished."""
    data_dir = Path(root) / name
    named = ({os.path.dirname(s["file"]) for s in data.load_meta(str(data_dir))["shards"]}
             if (data_dir / "meta.json").exists() else set())
    return sorted(p.name for p in data_dir.glob("shards-*") if p.name not in named)


# ---------------------------------------------------------------- in-process failures

@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
@pytest.mark.parametrize("where", ["tokenizing", "writing"])
def test_an_error_mid_run_keeps_the_old_dataset(tmp_path, monkeypatch, where, error):
    """An error or Ctrl-C (KeyboardInterrupt) in the middle, with shards of the new set already in
    the tmp folder: it propagates, the old dataset is byte-identical, no tmp folder is left."""
    before = files(make(tmp_path, OLD_DOCS))
    in_tmp = []  # the new run's shards when it fails

    def fail():
        in_tmp.append(sum(len(list((tmp_path / "d_byte" / f).glob("*.bin")))
                          for f in tmp_folders(tmp_path)))
        raise error("in the middle")

    class Boom(str):  # a document that fails as it is tokenized
        def encode(self, *args, **kwargs):
            fail()
    docs = NEW_DOCS * 7  # more than one batch of 256: the first batch is written before the boom
    if where == "tokenizing":
        docs = docs + [Boom("x")]
    else:
        real, written = data.write_shard, []

        def third_fails(*args):
            if len(written) == 2:
                fail()
            written.append(args[0])
            return real(*args)
        monkeypatch.setattr(data, "write_shard", third_fails)
    with pytest.raises(error, match="in the middle"):
        make(tmp_path, docs)
    assert in_tmp and in_tmp[0] >= 2, in_tmp
    assert files(tmp_path / "d_byte") == before
    assert sorted(os.listdir(tmp_path)) == ["d_byte"]


def test_preparing_again_replaces_the_dataset(tmp_path):
    """The same name again: the new set replaces the old whole (none of the old shards are left,
    though the old set had more), and the next run of the same process works too."""
    new = load(make(tmp_path / "reference", NEW_DOCS))
    out = make(tmp_path, OLD_DOCS, shard_size=100)
    assert len(data.list_shards(out, "train")) > 20
    assert make(tmp_path, NEW_DOCS) == out
    assert same(load(out), new) and only_the_named_set(out)
    assert sorted(os.listdir(tmp_path)) == ["d_byte", "reference"]
    make(tmp_path, OLD_DOCS)
    assert not same(load(out), new) and only_the_named_set(out)


def test_a_dead_runs_folder_is_removed_by_the_next_run(tmp_path, capsys):
    """A killed run's shard folder inside d_byte/ (with shards, or a stream's progress.json) and
    stray files there are removed by the next run that completes; other datasets stay."""
    make(tmp_path, OLD_DOCS)
    for leftover in ("shards-dead1", "shards-dead2"):
        (tmp_path / "d_byte" / leftover).mkdir()
        data.write_shard(str(tmp_path / "d_byte" / leftover / "d_byte_train_000000.bin"),
                         [1, 2, 3], 257)
    (tmp_path / "d_byte" / "shards-dead2" / "progress.json").write_text("{}")
    (tmp_path / "d2_byte").mkdir()
    make(tmp_path, NEW_DOCS)
    assert sorted(os.listdir(tmp_path)) == ["d2_byte", "d_byte"] and tmp_folders(tmp_path) == []
    assert only_the_named_set(tmp_path / "d_byte")
    assert same(load(tmp_path / "d_byte"), load(make(tmp_path / "reference", NEW_DOCS)))
    assert capsys.readouterr() == ("", "")  # --quiet: quietly


@pytest.mark.parametrize("file", ["a shard", "meta.json"])
@pytest.mark.parametrize("first", [True, False], ids=["first", "again"])
def test_full_disk_is_one_line_and_keeps_the_old_dataset(tmp_path, monkeypatch, first, file):
    """The disk fills up while a file is written (ENOSPC from its write, half of it on disk): one
    DataError line naming the folder, the old dataset byte-identical, no file of the run left."""
    before = files(make(tmp_path, OLD_DOCS)) if not first else None
    real_open, hit = open, []

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, b):
            self.f.write(b[:len(b) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    def opener(fails):
        def fake_open(path, mode="r", *args, **kwargs):
            f = real_open(path, mode, *args, **kwargs)
            if "w" in mode and fails(str(path)):
                hit.append(str(path))
                return FullDisk(f)
            return f
        return fake_open
    if file == "a shard":  # the second shard of the run: the first is whole on disk by then
        seen = []
        monkeypatch.setattr(data, "open", opener(
            lambda p: p.endswith(".bin.tmp") and (seen.append(p) or len(seen) == 2)), raising=False)
    else:
        monkeypatch.setattr(data, "open", opener(lambda p: p.endswith("meta.json.tmp")),
                            raising=False)
    with pytest.raises(SystemExit) as e:  # as `python prepare.py` ends
        configurator.run_main(lambda argv: make(tmp_path, NEW_DOCS))
    message = e.value.code
    assert message.startswith("error: no space left on device") and "\n" not in message, message
    assert len(hit) == 1 and not os.path.exists(hit[0])
    if first:
        assert os.listdir(tmp_path) == []
    else:
        assert files(tmp_path / "d_byte") == before and os.listdir(tmp_path) == ["d_byte"]


def inject(monkeypatch, fail_at, how, report):
    """Makes call number fail_at (from 0) of the file operations prepare.py and data.py make
    (open for writing, mkdir, rename, replace, remove, unlink, rmdir: shutil.rmtree's and
    os.makedirs' too) fail. how="kill": the process sends itself SIGKILL there (having written
    the calls so far to report), as a kill -9 or a power cut would stop it; "die": that call and
    every later one raise Crash (its except clauses run, and fail too); "once": that call only
    raises Crash. Returns the calls made."""
    calls = []

    def count(name, target):
        calls.append(f"{name}({os.path.basename(str(target))})")
        if len(calls) - 1 == fail_at and how == "kill":
            report.write_text(json.dumps(calls))
            os.kill(os.getpid(), signal.SIGKILL)
        if len(calls) - 1 == fail_at or (how == "die" and len(calls) - 1 > fail_at):
            raise Crash(f"injected at call {len(calls) - 1}: {calls[-1]}")
    for name in ("mkdir", "rename", "replace", "remove", "unlink", "rmdir"):
        def fake(*args, _real=getattr(os, name), _name=name, **kwargs):
            count(_name, args[0])
            return _real(*args, **kwargs)
        monkeypatch.setattr(os, name, fake)
    for module in (data, prepare):
        def fake_open(path, mode="r", *args, **kwargs):
            if "w" in mode:
                count("open", path)
            return open(path, mode, *args, **kwargs)
        monkeypatch.setattr(module, "open", fake_open, raising=False)
    return calls


def faulty_run(root, fail_at, how, report):
    """make(root, NEW_DOCS) with a fault injected, in a forked process that then ends (so its
    leftovers are a dead run's, as after a crash). Returns (0 finished, 1 Crash, -9 killed; the
    calls)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 2
        try:
            with pytest.MonkeyPatch.context() as m:
                calls = inject(m, fail_at, how, report)
                try:
                    make(root, NEW_DOCS)
                    code = 0
                except Crash:
                    code = 1
            report.write_text(json.dumps(calls))
        except BaseException:
            report.write_text(json.dumps(["unexpected error:\n" + traceback.format_exc()]))
            code = 2
        finally:
            os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    calls = json.loads(report.read_text())
    assert code in (0, -signal.SIGKILL if how == "kill" else 1), calls[-1] if calls else code
    return code, calls


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("how", ["kill", "die", "once"], ids=["killed", "dies", "fails_once"])
def test_fault_at_every_file_operation(tmp_path, how):
    """A re-prepare killed (SIGKILL), or failing, at its k-th file operation, for every k: data.py
    reads the old dataset byte for byte, or the new one whole (never a mix, never none); a run
    that fails (and lives) leaves no folder of its own; and the next run removes what a dead
    one left and holds the new set only."""
    new = load(make(tmp_path / "reference", NEW_DOCS))
    make(tmp_path / "pristine", OLD_DOCS)
    old = named_files(tmp_path / "pristine" / "d_byte")
    assert not same(load(tmp_path / "pristine" / "d_byte"), new)
    outcomes = []
    for k in range(200):  # fail at call 0, 1, ... until a run makes fewer than k + 1 calls
        root = tmp_path / f"k{k}"
        shutil.copytree(tmp_path / "pristine", root)
        code, calls = faulty_run(root, k, how, tmp_path / "calls.json")
        where = (f"fault at call {k} ({calls[k] if k < len(calls) else 'none'}) of {calls}; "
                 f"on disk: {state(root)}")
        got = root / "d_byte"
        loaded = load(got)  # as train.py reads it (a set a kill left aside is put back first)
        outcome = ("old" if named_files(got) == old else
                   "new" if same(loaded, new) else "NEITHER")  # (what a reader sees)
        outcomes.append(outcome)
        assert outcome in ("old", "new"), where
        if code == 0:  # the fault fell on nothing, or on removing the replaced set: new
            assert outcome == "new", where
            if len(calls) == k:
                break
        if code == 1 and how == "once":
            assert tmp_folders(root) == [], f"{where}: left {tmp_folders(root)}"
        make(root, NEW_DOCS)  # the next run (another process's): cleans up, holds the new set
        assert same(load(root / "d_byte"), new) and only_the_named_set(root / "d_byte"), where
        assert os.listdir(root) == ["d_byte"], f"{where}: {os.listdir(root)}"
        shutil.rmtree(root)
    # every operation was hit, the switch's second rename too: faults before the switch keep the
    # old set, after it the new one
    assert "replace(meta.json.tmp)" in calls, calls
    assert len(calls) > 15 and outcomes.count("old") > 10 and outcomes.count("new") > 3, outcomes


# ---------------------------------------------------------------- real kills, real Ctrl-C

# prepare.py as a program, its shard writes 20 ms slower: time to kill it while it writes
SLOW_PREPARE = ("import runpy, sys, time; sys.path.insert(0, sys.argv.pop(1)); import data; "
                "write = data.write_shard; "
                "data.write_shard = lambda *a: (time.sleep(0.02), write(*a))[1]; "
                "sys.argv[0] = 'prepare.py'; "
                "runpy.run_path(sys.path[0] + '/prepare.py', run_name='__main__')")


def write_book(path, seed, size=200_000):
    rng, words, parts, n = random.Random(seed), "now is the winter of our discontent".split(), [], 0
    while n < size:
        parts.append(" ".join(rng.choices(words, k=rng.randint(20, 200))) + "\n\n")
        n += len(parts[-1])
    path.write_text("".join(parts))


def book_settings(root, text):
    return [f"--input={root / text}", "--dataset=book", f"--out_root={root}",
            "--shard_size=10000", "--quiet"]


def prepare_book(root, text):
    cfg = configurator.parse_args(prepare.SETTINGS, book_settings(root, text), "")
    return prepare.prepare(cfg)


def slow_prepare(root, source, **popen):
    # SIGINT's default handler back: a shell's background job (and so a pytest started as one)
    # passes SIGINT on ignored, and then a test's Ctrl-C would never arrive
    return subprocess.Popen([sys.executable, "-c", SLOW_PREPARE, str(HERE),
                             *book_settings(root, source)],
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            **popen)


def state(root):
    """What is on disk, in a few words (for the failure message)."""
    return ", ".join(f"{e}/ ({len(os.listdir(root / e))} files)" if (root / e).is_dir() else e
                     for e in sorted(os.listdir(root)))


def kill_when(root, moment):
    """Starts a re-prepare of new.txt over root/book, and sends it SIGKILL at moment: a number of
    seconds, or a condition on the folders. Returns (moment reached?, exit code)."""
    proc = slow_prepare(root, "new.txt", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, meta_inode = time.time(), os.stat(root / "book_byte" / "meta.json").st_ino
    conditions = {
        "tmp folder made": lambda: bool(tmp_folders(root, "book_byte")),
        "5 new shards": lambda: sum(len(list((root / "book_byte" / f).glob("*.bin")))
                                    for f in tmp_folders(root, "book_byte")) >= 5,
        "switched": lambda: os.stat(root / "book_byte" / "meta.json").st_ino != meta_inode,
    }
    reached = False
    while proc.poll() is None and time.time() - t0 < 60:
        try:
            reached = (time.time() - t0 >= moment if isinstance(moment, float)
                       else conditions[moment]())
        except FileNotFoundError:  # book/ is being replaced this instant
            reached = False
        if reached:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.001)
    return reached, proc.wait()


def test_sigkill_while_re_preparing(tmp_path):
    """prepare.py killed (SIGKILL) at moments before, during and after writing: the old dataset
    byte for byte, or the new one; the dead run's tmp folder stays until the next run, which
    removes it and completes."""
    pristine, reference = tmp_path / "pristine", tmp_path / "reference"
    for root, text in ((pristine, "old.txt"), (reference, "new.txt")):
        root.mkdir()
        write_book(root / "old.txt", seed=1)
        write_book(root / "new.txt", seed=2)  # what the killed runs prepare
        prepare_book(root, text)
    old, new = named_files(pristine / "book_byte"), load(reference / "book_byte")
    assert not same(load(pristine / "book_byte"), new)
    assert len(data.list_shards(str(reference / "book_byte"), "train")) > 10
    seen = []
    for i, moment in enumerate([0.05, 0.3, "tmp folder made", "5 new shards", "switched"]):
        root = tmp_path / f"kill{i}"
        shutil.copytree(pristine, root)
        reached, code = kill_when(root, moment)
        got = root / "book_byte"
        loaded = load(got)  # as train.py reads it (a set a kill left aside is put back first)
        what = ("old" if named_files(got) == old else "new" if same(loaded, new) else "NEITHER")
        left = tmp_folders(root, "book_byte")
        seen.append(f"{moment}: {'killed' if reached else f'exit {code}'}, {what}, "
                    f"tmp {left}: {state(root)}")
        assert what != "NEITHER", seen[-1]
        prepare_book(root, "new.txt")  # the next run cleans up and completes
        assert same(load(root / "book_byte"), new) and only_the_named_set(root / "book_byte"), seen[-1]
        assert tmp_folders(root, "book_byte") == [], seen[-1]
        shutil.rmtree(root)
    print("\n".join(seen))
    # a kill mid-write: the old set, and the dead run's tmp folder left for the next run
    mid_write = r"5 new shards: killed, old, tmp \['shards-\w+'\]"
    assert any(re.match(mid_write, s) for s in seen), seen


def test_ctrl_c_exits_130_and_keeps_the_old_set(tmp_path):
    """Ctrl-C while shards are being written: exit 130 without a traceback, the old dataset byte
    for byte, and the tmp folder removed."""
    write_book(tmp_path / "old.txt", seed=1)
    write_book(tmp_path / "new.txt", seed=2)
    prepare_book(tmp_path, "old.txt")
    old = files(tmp_path / "book_byte")
    proc = slow_prepare(tmp_path, "new.txt", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)
    t0 = time.time()
    while not tmp_folders(tmp_path, "book_byte") and time.time() - t0 < 60:
        time.sleep(0.001)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("prepare.py finished before the Ctrl-C arrived")
    assert (proc.returncode, out, err) == (130, "", "")
    assert files(tmp_path / "book_byte") == old
    assert tmp_folders(tmp_path, "book_byte") == []
