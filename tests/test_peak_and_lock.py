"""The GPU peak table (configurator.py, behind the MFU of train.py's log and bench.py's column)
and the lock on a training run's folder (train.locked: fcntl.flock on out_dir itself, no lock
file; checkpoints are tested through train.py in test_train.py)."""
import os
import signal
import subprocess
import sys

import pytest

import configurator
import train
from configurator import gpu_peak_flops

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root


def test_gpu_peak_lookup():
    # torch's names for the Hopper parts: the NVL cards are slower than SXM, despite the substring
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3") == gpu_peak_flops("NVIDIA H200") == 989.4e12
    assert gpu_peak_flops("NVIDIA H100 NVL") == gpu_peak_flops("NVIDIA H200 NVL") == 835e12
    assert gpu_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_peak_flops("NVIDIA GH200 480GB") == 989.4e12
    assert (gpu_peak_flops("NVIDIA A10G") == 70e12
            and gpu_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12)
    assert gpu_peak_flops("Some Future GPU") is None


def run_cfg(out_dir):
    return str(out_dir)


def test_a_run_folder_is_locked_while_its_run_is_open(tmp_path):
    """A second locked() on the same out_dir is refused (one line naming the folder) while
    the first is open, and allowed after; the lock leaves no file behind."""
    out = tmp_path / "run"
    with train.locked(run_cfg(out), 0):
        assert os.path.isdir(out)  # made
        with pytest.raises(configurator.ConfigError) as e:
            with train.locked(run_cfg(out), 0):
                pass
        assert str(e.value).startswith(f"{out} is in use by another training run")
        assert "\n" not in str(e.value)
        # torchrun's other processes share rank 0's folder: they take no lock
        with train.locked(run_cfg(out), 1):
            pass
        with train.locked(run_cfg(tmp_path / "other"), 0):  # another folder: its own lock
            pass
    with train.locked(run_cfg(out), 0):  # free again
        pass
    assert os.listdir(out) == []


def test_the_lock_is_released_when_the_run_fails(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        with train.locked(run_cfg(out), 0):
            raise KeyboardInterrupt  # Ctrl-C in the middle of a run
    with train.locked(run_cfg(out), 0):
        pass
    assert os.listdir(out) == []


HOLDER = """
import sys, time
import configurator, train
run = train.locked(sys.argv[1], 0)
run.__enter__()
print("holding", flush=True)
time.sleep(120)
"""


def test_another_process_holds_the_lock_until_it_dies(tmp_path):
    """The lock is the OS's: a run in another process keeps the folder, and when that process is
    killed (no chance to clean up) the folder is free at once, with no stale lock file to delete."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=HERE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        with pytest.raises(configurator.ConfigError, match="in use by another training run"):
            with train.locked(run_cfg(out), 0):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with train.locked(run_cfg(out), 0):
        pass
    assert os.listdir(out) == []
