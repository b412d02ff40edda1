"""Sample from a trained model: load its checkpoint, encode a prompt, generate, decode.

    python sample.py                                  # 10 samples from out/ckpt.pt
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
    out_dir=("out", "the run's folder: its ckpt.pt"),
    start=("", "the prompt; empty starts a fresh document (an end-of-text token)"),
    num_samples=(10, "samples to print", (1, None)),
    max_new_tokens=(500, "tokens generated per sample", (0, None)),
    temperature=(0.8, "1.0 = the model's distribution, lower = more conservative, 0 = greedy "
                      "(one sample)", (0.0, None)),
    top_k=(200, "keep only the k likeliest tokens (0: all)", (0, None)),
    seed=(1337, "the same seed gives the same text", (0, 2**63 - 1)),
    use_cache=(True, "KV cache; False recomputes the whole context for every token (nanoGPT's)"),
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (as train.py), float32, bfloat16, float16"),
)
USAGE = "python sample.py [--key=value ...]"


def sample(cfg):
    """Prints the samples, and on stderr the speed and the KV cache's bytes; returns the texts."""
    device, dtype, autocast = data.setup_device(cfg.device, cfg.dtype)
    ckpt = data.load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))  # on the CPU: AdamW's
    try:  # moments stay there, only the model goes to the device
        model = GPT.from_checkpoint(ckpt, device)
    except ValueError as e:  # another shape or another model.py than today's
        raise ConfigError(f"{cfg.out_dir}/ckpt.pt: {e}") from None
    tokenizer = data.get_tokenizer(ckpt["tokenizer"]["tokenizer"])
    print(f"{cfg.out_dir}/ckpt.pt: {model.config.value_mode}, step {ckpt['iter_num']}, val loss "
          f"{ckpt['val_loss'] or ckpt['best_val_loss']:.4f}", file=sys.stderr)
    ids = tokenizer.encode(cfg.start) if cfg.start else [tokenizer.eot]
    x = torch.tensor([ids], dtype=torch.long, device=device)

    torch.manual_seed(cfg.seed)  # one seed, the same text
    texts, t0 = [], time.perf_counter()
    for _ in range(1 if cfg.temperature == 0 else cfg.num_samples):  # greedy: one text only
        with autocast:  # made under autocast, the cache takes the compute dtype
            y = model.generate(x, cfg.max_new_tokens, cfg.temperature, cfg.top_k or None,
                               cfg.use_cache)
        texts.append(tokenizer.decode(y[0].tolist()))
        print(texts[-1] + "\n---------------", flush=True)

    # What it measured: the speed, and the cache's bytes against a vanilla cache's, which holds a
    # key and a value tensor per layer (SVFormer's holds one value tensor for all layers).
    seconds, n = time.perf_counter() - t0, len(texts) * cfg.max_new_tokens
    cache = model.new_kv_cache(1, dtype=getattr(torch, dtype))  # what generate fills
    vanilla = 2 * model.config.n_layer * cache.keys[0].nbytes
    print(f"{model.config.value_mode}, cache {'on' if cfg.use_cache else 'off'}, {device} {dtype}: "
          f"{n:,} tokens in {seconds:.2f} s, {n / max(seconds, 1e-9):.1f} tokens/s; a KV cache of "
          f"{model.config.block_size} positions holds {cache.nbytes():,} bytes ({len(cache.keys)} "
          f"key + {len(cache.values)} value tensors), a vanilla one {vanilla:,} (ratio "
          f"{cache.nbytes() / vanilla:.3f})", file=sys.stderr)
    return texts


def main(argv):
    cfg = parse_args(SETTINGS, argv, USAGE)
    if os.path.isfile(cfg.out_dir):  # the checkpoint named, not its run's folder
        raise ConfigError("--out_dir is the run's folder, not its ckpt.pt")
    sample(cfg)


if __name__ == "__main__":
    run_main(main)
