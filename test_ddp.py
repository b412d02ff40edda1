"""train.py under torchrun (2 CPU ranks, gloo) and with several processes: exact resume, Ctrl-C,
short shards, one run per out_dir."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import prepare
import shards
import train
from configurator import ConfigError

HERE = os.path.dirname(os.path.abspath(__file__))
# The rank script: train with the settings in argv[1]; write each rank's summary and the first
# training batch it drew (after a resume: the first batch of the resumed part).
RANK_SCRIPT = f"""
import json, os, sys
sys.path.insert(0, {HERE!r})
import train
cfg = dict(train.DEFAULTS, **json.loads(sys.argv[1]))
first = []
real_next = train.Batches.next
def recording_next(self):
    x, y = real_next(self)
    if not first and self.generator.initial_seed() != 1234:  # a training batch, not an eval one
        first.append(x[0].tolist())
    return x, y
train.Batches.next = recording_next
summary = train.train(cfg)
with open(os.path.join(sys.argv[2], "rank" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({{"status": summary["status"], "iter": summary["iter"], "first_x": first[0]}}, f)
sys.exit({{"done": 0, "interrupted": 130, "diverged": 1}}[summary["status"]])
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    text = "".join(f"KING {i % 7}:\nWhat say you of the {i % 13} ships upon the sea?\n\n" for i in range(400))
    docs = [text[i:i + 2000] for i in range(0, len(text), 2000)]
    return prepare.prepare(documents=docs, name="ddp_byte", out_root=str(tmp_path_factory.mktemp("data")),
                           quiet=True)


def tiny(data_dir, out_dir, **kw):
    return {**dict(dataset=data_dir, out_dir=str(out_dir), n_layer=2, n_head=2, n_embd=32, block_size=16,
                   batch_size=4, gradient_accumulation_steps=2, max_iters=20, lr_decay_iters=40,
                   warmup_iters=5, learning_rate=1e-2, eval_interval=10, eval_iters=2, log_interval=1,
                   device="cpu", dropout=0.1), **kw}


def torchrun(tmp_path, cfg, wait=True):
    script = tmp_path / "rank_script.py"
    script.write_text(RANK_SCRIPT)
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
            json.dumps(cfg), str(tmp_path)]
    process = subprocess.Popen(args, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    if wait:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output[-3000:]
    return process


def ranks(tmp_path):
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def losses(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [(r["iter"], r["loss"]) for r in map(json.loads, f) if r["kind"] == "train"]


def test_ddp_resume_equals_an_uninterrupted_run(data_dir, tmp_path):
    """Each rank restores its own data position and RNG: the resumed losses equal the straight
    run's (bitwise), and after the resume the two ranks still read different batches."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for d in (straight, resumed):
        d.mkdir()
    torchrun(straight, tiny(data_dir, straight / "out", max_iters=40))
    torchrun(resumed, tiny(data_dir, resumed / "out", max_iters=20))
    torchrun(resumed, tiny(data_dir, resumed / "out", max_iters=40, resume=True))
    assert losses(resumed / "out") == losses(straight / "out")
    rank0, rank1 = ranks(resumed)
    assert rank0["iter"] == rank1["iter"] == 40 and rank0["first_x"] != rank1["first_x"]
    # a checkpoint written by 2 ranks cannot be resumed by 1 process
    with pytest.raises(ConfigError, match="was written by 2 process"):
        train.train(dict(train.DEFAULTS, **tiny(data_dir, resumed / "out", max_iters=50, resume=True)))


def test_ctrl_c_under_torchrun_stops_every_rank_at_one_step(data_dir, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it, and torchrun forwards it
    again): both ranks stop after the same step, rank 0 saves, and --resume continues from there."""
    cfg = tiny(data_dir, tmp_path / "out", max_iters=100000, lr_decay_iters=100000, eval_interval=100000)
    process = torchrun(tmp_path, cfg, wait=False)
    log = tmp_path / "out" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.is_file() and log.read_text().count('"kind": "train"') >= 3):
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=120)  # no hang
    rank0, rank1 = ranks(tmp_path)
    assert rank0["status"] == rank1["status"] == "interrupted", output[-2000:]
    assert rank0["iter"] == rank1["iter"] > 0
    ckpt = train.load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    assert ckpt["iter_num"] == rank0["iter"] and len(ckpt["rank_states"]) == 2
    torchrun(tmp_path, dict(cfg, max_iters=rank0["iter"] + 3, resume=True))
    assert [i for i, _ in losses(tmp_path / "out")][-3:] == [rank0["iter"] + 1, rank0["iter"] + 2,
                                                             rank0["iter"] + 3]


def test_short_last_shard_is_skipped_and_all_short_is_an_error(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    sizes = {"train_000000": 300, "train_000001": 300, "train_000002": 20, "val_000000": 200}
    entries = []
    for i, (part, n) in enumerate(sizes.items()):
        file = f"d_{part}.bin"
        sha = shards.write_shard(str(data / file), np.arange(n) % 250, 257)
        entries.append({"file": file, "split": part.split("_")[0], "tokens": n,
                        "bytes": os.path.getsize(data / file), "sha256": sha})
    meta = {"tokenizer": "byte", "vocab_size": 257, "eot": 256, "dtype": "uint16", "shards": entries}
    (data / "meta.json").write_text(json.dumps(meta))
    train_shards = [shards.read_shard(p) for p in shards.list_shards(str(data), "train")]
    batches = train.Batches(train_shards, batch_size=4, block_size=16, seed=1)  # 65 tokens a step
    visited = []
    for _ in range(20):  # several wraparounds: shards 0, 1, 0, 1, ... never the 20-token one
        batches.next()
        visited.append(batches.shard)
    assert set(visited) == {0, 1}
    with pytest.raises(shards.DataError, match="every shard is shorter than the 641 tokens one batch needs"):
        train.Batches(train_shards, batch_size=8, block_size=16, seed=1, world=5)


def test_a_second_run_on_one_out_dir_is_refused_until_the_first_dies(data_dir, tmp_path):
    out = tmp_path / "out"
    args = [sys.executable, "train.py"] + [f"--{k}={v}" for k, v in tiny(data_dir, out).items()]
    first = subprocess.Popen(args[:-1] + ["--max_iters=100000", "--lr_decay_iters=100000"], cwd=HERE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "log.jsonl").is_file():
        time.sleep(0.1)
    second = subprocess.run(args + ["--overwrite"], cwd=HERE, capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and second.stderr.count("\n") == 1
    assert second.stderr.startswith(f"error: {out} is in use by another training run (pid {first.pid})")
    first.kill()  # kill -9: the OS drops its lock
    first.wait()
    third = subprocess.run(args + ["--overwrite", "--max_iters=2"], cwd=HERE, capture_output=True, text=True,
                           timeout=120)
    assert third.returncode == 0, third.stderr
