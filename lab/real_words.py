"""python -m lab.real_words OUT_DIR [SAMPLES.txt]: the share of sampled words (runs of letters a-z,
any case) that occur in the training text of OUT_DIR's checkpoint, a cheap look at whether
samples are words or noise: `python sample.py > samples.txt` first (or pipe it in)."""
import os
import re
import sys

import numpy as np

import data
from configurator import ConfigError, run_main


def words(text):
    return re.findall(r"[a-z]+", text.lower())


def real_words(data_dir, tokenizer, text, most=10_000_000):
    """(share of the words, share of the distinct words) of text found in the first `most`
    tokens of data_dir's training shards; None and why where it cannot be said."""
    now = os.path.isdir(data_dir) and data.load_meta(data_dir)["tokenizer"]  # False: no folder
    found = words(text)
    why = (f"the training text ({data_dir}) is not here" if now is False else
           f"{data_dir} now holds {now} tokens, not the model's {tokenizer.name} tokens"
           if now != tokenizer.name else "no word (letters a-z) was sampled" if not found else None)
    if why:
        return None, why
    known, left = set(), most
    for path in data.list_shards(data_dir, "train"):  # up to `most` tokens of it, in all
        tokens = np.asarray(data.read_shard(path)[:left])
        left -= len(tokens)
        known.update(words(tokenizer.decode(tokens[tokens != tokenizer.eot])))
    return tuple(sum(w in known for w in ws) / len(ws) for ws in (found, set(found))), len(found)


def main(argv):
    if len(argv) not in (1, 2):
        raise ConfigError("usage: python -m lab.real_words OUT_DIR [SAMPLES.txt] (or samples "
                          "piped in)")
    ckpt = data.load_checkpoint(os.path.join(argv[0], "ckpt.pt"))
    text = open(argv[1], encoding="utf-8").read() if len(argv) == 2 else sys.stdin.read()
    data_dir = data.dataset_dir(ckpt["config"]["dataset"])
    shares, said = real_words(data_dir, data.get_tokenizer(ckpt["tokenizer"]), text)
    print(f"real words: not counted: {said}" if shares is None else
          f"real words: {shares[0]:.1%} of the {said:,} sampled words occur in the training "
          f"text of {data_dir} ({shares[1]:.1%} of the distinct ones)")


if __name__ == "__main__":
    sys.argv[0] = "lab.real_words"
    run_main(main)
