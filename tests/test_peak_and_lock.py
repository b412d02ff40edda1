"""The GPU peak table (train.py's, behind the MFU of its log and bench.py's column) and the lock
on a training run's folder (train.lock: fcntl.flock on out_dir/.lock, a file opened for writing,
which NFS and Lustre take too; where a file system takes no locks, a warning, never a
traceback); checkpoints are tested through train.py in test_train.py."""
import errno
import fcntl
import os
import signal
import subprocess
import sys

import pytest

import configurator
import train
from train import gpu_peak_flops

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root


def test_gpu_peak_lookup():
    # torch's names for the Hopper parts: the NVL cards are slower than SXM, despite the substring
    peak = lambda name: gpu_peak_flops(name, "bfloat16")  # noqa: E731
    assert peak("NVIDIA H100 80GB HBM3") == peak("NVIDIA H200") == 989.4e12
    assert peak("NVIDIA H100 NVL") == peak("NVIDIA H200 NVL") == 835e12
    assert peak("NVIDIA H100 PCIe") == 756e12
    assert peak("NVIDIA GH200 480GB") == 989.4e12
    assert peak("NVIDIA A10G") == 70e12 and peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak("NVIDIA L40") is None and peak("NVIDIA RTX A1000") is None  # whole words only
    assert peak("Some Future GPU") is None and gpu_peak_flops("NVIDIA H100", "float32") is None


@pytest.fixture(autouse=True)
def no_locks_left():
    yield
    for held in train.LOCKS.values():
        held.close()
    train.LOCKS.clear()


def test_a_run_folder_is_locked_while_its_run_holds_it(tmp_path):
    """A second lock on the same out_dir from another process is refused (one line naming the
    folder); the same process takes it again (its earlier run is over); another folder has its
    own lock."""
    out = tmp_path / "run"
    train.lock(str(out))
    assert os.listdir(out) == [".lock"]
    other = subprocess.run([sys.executable, "-c", f"import train; train.lock({str(out)!r})"],
                           cwd=HERE, capture_output=True, text=True, timeout=60)
    assert other.returncode == 1 and f"{out} is in use by another training run" in other.stderr
    train.lock(str(out))  # this process again: fine
    train.lock(str(tmp_path / "other"))
    train.LOCKS.pop(os.path.realpath(out)).close()  # what train() does at its end
    again = subprocess.run([sys.executable, "-c", f"import train; train.lock({str(out)!r})"],
                           cwd=HERE, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr


HOLDER = """
import sys, time
import train
train.lock(sys.argv[1])
print("holding", flush=True)
time.sleep(120)
"""


def test_another_process_holds_the_lock_until_it_dies(tmp_path):
    """The lock is the OS's: a run in another process keeps the folder, and when that process is
    killed (no chance to clean up) the folder is free at once: the lock file left is not a lock."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=HERE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        with pytest.raises(configurator.ConfigError, match="in use by another training run"):
            train.lock(str(out))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    train.lock(str(out))


def test_a_file_system_without_locks_is_a_warning_not_a_traceback(tmp_path, monkeypatch, capsys):
    """NFS without lockd answers flock with ENOLCK (and a read-only folder lock with EBADF, the
    old traceback): the run goes on, saying in one line not to train two runs there at once."""
    def no_locks(f, how):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    train.lock(str(tmp_path / "nfs"))
    assert capsys.readouterr().err == (f"warning: {tmp_path / 'nfs'} cannot be locked here (No "
                                       f"locks available): do not train two runs into it at "
                                       f"once\n")
