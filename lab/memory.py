"""python -m lab.memory [preset.py ...] [--key=value ...]: the batch train.py fits to each class
of GPU our users meet, for vanilla and value embeddings (the mode with the most parameters), from
train.py's own estimate (measured on this CPU in bfloat16, the same bytes as a T4's float16). The
table in the README and config/gpt2_124m.py is what this prints: estimates until measured on
the GPU itself (bench.py --gpu_check compares its peak memory with the estimate)."""
import sys

import torch

import compare
import train
from configurator import ConfigError, parse_args, run_main
from model import GPT, GPTConfig

# GiB free as a training process sees it (torch.cuda.mem_get_info) after CUDA's own context
GPUS = {"T4 (16 GB)": 14.5, "24 GB (L4, A10G, RTX 3090/4090)": 22.0, "A100 40 GB": 38.5,
        "80 GB (A100, H100)": 78.0}


def main(argv):
    cfg = parse_args(compare.SETTINGS, argv, "python -m lab.memory [preset.py ...] [--key=value]")
    print(f"batch_size x micro-steps per step at block_size {cfg.block_size} ({cfg.batch_size} x "
          f"{cfg.gradient_accumulation_steps or 1} asked; estimates)\n\n| mode | "
          + " | ".join(GPUS) + " |\n" + "|---" * (len(GPUS) + 1) + "|")
    for mode in ("vanilla", "value_embed"):
        config = GPTConfig.from_dict({**vars(cfg), "value_mode": mode, "vocab_size": 50304})
        torch.manual_seed(0)
        model, cells = GPT(config), []
        for free in GPUS.values():
            try:
                (batch, accum, need), _ = train.fit_memory(model, cfg, 1, "cpu",
                                                           "bfloat16", free=free * 2**30)
                cells.append(f"{batch} x {accum} ({need / 2**30:.1f} GiB)")
            except ConfigError:
                cells.append("does not fit")
        print(f"| {mode} ({model.num_params() / 1e6:.0f}M) | " + " | ".join(cells) + " |")




if __name__ == "__main__":
    sys.argv[0] = "lab.memory"
    run_main(main)
