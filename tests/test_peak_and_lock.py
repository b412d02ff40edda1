"""The GPU peak table (configurator.py; checkpoints are tested through train.py in test_train.py)
and shards.hold_lock, the lock train.py and prepare.py take."""
import pytest

from configurator import gpu_peak_flops
from shards import hold_lock


def test_gpu_peak_lookup():
    # torch's names for the Hopper parts: the NVL cards are slower than SXM, despite the substring
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3") == gpu_peak_flops("NVIDIA H200") == 989.4e12
    assert gpu_peak_flops("NVIDIA H100 NVL") == gpu_peak_flops("NVIDIA H200 NVL") == 835e12
    assert gpu_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_peak_flops("NVIDIA GH200 480GB") == 989.4e12
    assert (gpu_peak_flops("NVIDIA A10G") == 70e12
            and gpu_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12)
    assert gpu_peak_flops("Some Future GPU") is None


def test_a_lock_is_held_until_released(tmp_path):
    path = str(tmp_path / "x.lock")
    lock = hold_lock(path, ValueError("in use"))
    with pytest.raises(ValueError, match="^in use$"):
        hold_lock(path, ValueError("in use"))
    lock.release()
    hold_lock(path, ValueError("in use")).release()  # free again; the file stays, to be shared
    assert (tmp_path / "x.lock").exists()
