"""python -m lab.nudged --nudge=N [train.py's settings]: train.py itself, with each initial weight
moved one float32 step up or down (by coins seeded with N) as the model is built. The same run,
rounded differently: what another CPU or thread count does to it (compare.py's noise floor).
Run from the project's folder, as compare.py's runs are."""
import math
import sys

import torch

import train
from configurator import ConfigError, run_main


def nudge(model, coins_seed):
    """Each parameter one float32 step towards +inf or -inf, by a seeded coin per number."""
    coins = torch.Generator().manual_seed(coins_seed)
    for p in model.parameters():
        up = torch.rand(p.shape, generator=coins) < 0.5
        p.data = torch.nextafter(p.data, torch.where(up, math.inf, -math.inf))


def main(argv):
    given = [a for a in argv if a.startswith("--nudge=")]
    if len(given) != 1 or not given[0][8:].isdigit() or int(given[0][8:]) < 1:
        raise ConfigError("python -m lab.nudged takes --nudge=N (a coin seed, 1 or more) and "
                          "train.py's settings")
    build, coins_seed = train.GPT, int(given[0][8:])

    def nudged_gpt(config):  # train.py builds its model by GPT(config): this one is nudged
        model = build(config)
        nudge(model, coins_seed)
        return model
    train.GPT = nudged_gpt
    try:
        return train.main([a for a in argv if a not in given])
    finally:  # train.py's own GPT again (a caller in this process may train on)
        train.GPT = build


if __name__ == "__main__":
    sys.argv[0] = "lab.nudged"
    run_main(main)
