"""
Sample from a trained model: load its checkpoint, encode a prompt, generate, decode.

    python sample.py                                 # 10 samples from out/ckpt.pt
    python sample.py --start="ROMEO:" --num_samples=3 --max_new_tokens=200
"""
import os
import sys
import time

import torch

import data
from configurator import ConfigError, parse_args, run_main
from model import GPT

SETTINGS = dict(
    out_dir=("out", "the run's folder, with its ckpt.pt"),
    start=("", "the prompt (empty: a fresh document)"),
    num_samples=(10, "samples to print", 1),
    max_new_tokens=(500, "tokens generated per sample", 0),
    temperature=(0.8, "1.0: the model's odds, lower: safer, 0: the likeliest, every sample "
                      "the same", 0.0),
    top_k=(200, "keep only the k likeliest tokens (0: all)", 0),
    seed=(1337, "the same seed gives the same text", 0, 2**63 - 1),
    use_cache=(True, "the KV cache (False: the whole context again for each token)"),
    device=("auto", "auto, cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto, float32, bfloat16 or float16"),
)
USAGE = "python sample.py [--key=value ...]"


def sample(cfg):
    """Prints the samples, and on stderr the speed and the KV cache's size."""
    device, dtype, autocast = data.setup_device(cfg.device, cfg.dtype)
    # The checkpoint loads on the CPU, and only the model goes on to the device.
    ckpt = data.load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))
    try:
        model = GPT.from_checkpoint(ckpt, device)
    except ValueError as e:  # a model.py other than today's trained it
        raise ConfigError(f"{cfg.out_dir}/ckpt.pt: {e}") from None
    tokenizer = data.get_tokenizer(ckpt["tokenizer"])
    print(f"{cfg.out_dir}/ckpt.pt: {model.config.value_mode}, step {ckpt['iter_num']}, val "
          f"loss {ckpt['val_loss']:.4f}", file=sys.stderr)
    ids = tokenizer.encode(cfg.start) if cfg.start else [tokenizer.eot]
    x = torch.tensor([ids], dtype=torch.long, device=device)

    torch.manual_seed(cfg.seed)
    texts, t0 = [], time.perf_counter()
    for _ in range(cfg.num_samples):
        with autocast:  # so the cache is made in the dtype the model computes in
            y = model.generate(x, cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.use_cache)
        texts.append(tokenizer.decode(y[0].tolist()))
        print(texts[-1] + "\n---------------", flush=True)

    # The speed, and the cache's size against a vanilla cache's, which holds a key and
    # a value tensor per layer; SVFormer's holds one value tensor for all its layers.
    seconds, n = time.perf_counter() - t0, len(texts) * cfg.max_new_tokens
    cache = model.new_kv_cache(1, dtype=getattr(torch, dtype))  # what generate fills
    vanilla = 2 * model.config.n_layer * cache.keys[0].nbytes
    print(f"{model.config.value_mode}, cache {'on' if cfg.use_cache else 'off'}, {device} "
          f"{dtype}: {n:,} tokens in {seconds:.2f} s, {n / max(seconds, 1e-9):.1f} tokens/s; "
          f"a KV cache of {model.config.block_size} positions holds {cache.nbytes():,} bytes "
          f"({len(cache.keys)} key + {len(cache.values)} value tensors), a vanilla one "
          f"{vanilla:,} (ratio {cache.nbytes() / vanilla:.3f})", file=sys.stderr)
    return texts


def main(argv):
    sample(parse_args(SETTINGS, argv, USAGE))


if __name__ == "__main__":
    run_main(main)
