"""The cards' 16-bit peak FLOP/s, by name: MFU, the share of its peak a card reaches (bench.py,
the GPU check), is the model's FLOPs at the measured speed over it."""
import re

import torch

# Dense 16-bit peak FLOP/s by card; longer names first ("H100 NVL" is no H100).
PEAK_FLOPS = {"H100 NVL": 835e12, "H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12,
              "A100": 312e12, "A10G": 70e12, "A10": 125e12, "L40S": 362e12, "L4": 121e12,
              "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12}


def peak_flops(device, dtype):
    """A GPU's 16-bit peak FLOP/s by its name, matched as whole words (an L40 is no L4);
    None on a CPU, in float32 or for a card not listed."""
    card = torch.cuda.get_device_name(device) if device.startswith("cuda") else ""
    return next((flops for name, flops in PEAK_FLOPS.items() if dtype != "float32" and
                 re.search(rf"(?<!\w){re.escape(name)}(?!\w)", card)), None)
