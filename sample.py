"""Sample from a trained model: load its checkpoint, encode a prompt, generate with the KV cache,
decode. The text streams to stdout; what was measured goes to stderr.

    python sample.py                                  # 10 samples from out/ckpt.pt
    python sample.py --start="ROMEO:" --num_samples=3 --max_new_tokens=200
"""
import codecs
import os
import sys
import time

import torch

import data
from configurator import ConfigError, parse_args, run_main
from model import GPT

SETTINGS = dict(
    out_dir=("out", "the run's folder: its ckpt.pt"),
    start=("", "prompt text, or FILE:path to read it from a file; empty starts a fresh document"),
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


def sample(cfg, out=sys.stdout, err=sys.stderr):
    """Streams num_samples samples (temperature 0: one) to out, a report to err; returns numbers."""
    if os.path.isfile(cfg.out_dir):  # the checkpoint named, not its run's folder
        raise ConfigError(f"--out_dir is the run's folder: use --out_dir="
                          f"{os.path.dirname(cfg.out_dir) or '.'}")
    device, dtype, autocast = data.setup_device(cfg.device, cfg.dtype)
    ckpt = data.load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))  # on the CPU: AdamW's
    try:  # moments stay there, only the model goes to the device
        model = GPT.from_checkpoint(ckpt, device)
    except ValueError as e:  # another shape or another model.py than today's
        raise ConfigError(f"{cfg.out_dir}/ckpt.pt: {e}") from None
    tokenizer = data.get_tokenizer(ckpt["tokenizer"]["tokenizer"])
    print(f"loaded {cfg.out_dir}/ckpt.pt: {model.config.value_mode}, step {ckpt['iter_num']}, "
          f"val loss {ckpt.get('val_loss') or ckpt['best_val_loss']:.4f} there", file=err)

    # The prompt: --start, or FILE:path; empty starts a fresh document (an end-of-text token).
    text = cfg.start
    if text.startswith("FILE:"):
        if not os.path.isfile(text[5:]):
            raise ConfigError(f"no prompt file {text[5:]} (from --start={text})")
        text = open(text[5:], encoding="utf-8").read()
    ids = tokenizer.encode(text) if text else [tokenizer.eot]
    block_size = model.config.block_size
    if len(ids) > block_size:  # the model sees at most block_size tokens: keep the prompt's end
        print(f"prompt is {len(ids)} tokens, longer than block_size {block_size}: keeping its "
              f"last {block_size}", file=err)
        ids, text = ids[-block_size:], tokenizer.decode(ids[-block_size:])
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    if len(ids) + cfg.max_new_tokens > block_size + 1:  # the last new token is never fed back
        print(f"past block_size ({block_size} tokens) every new token recomputes the last "
              f"{block_size}, as slow as without a cache", file=err)

    # One sample at a time, so each streams as it is made; one seed makes the run repeatable.
    torch.manual_seed(cfg.seed)
    samples, seconds, cache = [], 0.0, None
    if cfg.temperature == 0 and cfg.num_samples > 1:  # the likeliest token each time: one text
        print(f"temperature 0 is greedy decoding: the {cfg.num_samples} samples would all be the "
              f"same, so one is drawn", file=err)
    for _ in range(1 if cfg.temperature == 0 else cfg.num_samples):
        print(text, end="", file=out, flush=True)
        # A character may span tokens: the incremental decoder holds its bytes until it is whole.
        utf8, new, pending = codecs.getincrementaldecoder("utf-8")(errors="replace"), [], []
        with autocast:  # made under autocast, the cache takes the compute dtype
            cache = model.new_kv_cache(1) if cfg.use_cache else False
            t0 = time.perf_counter()
            for i, token in enumerate(model.generate_tokens(
                    prompt, cfg.max_new_tokens, cfg.temperature, cfg.top_k or None, cache)):
                pending.append(token)  # still on the device: reading it would wait for the GPU
                if len(pending) == 16 or i == cfg.max_new_tokens - 1:  # so: 16 at a time
                    ids = torch.cat(pending, dim=1)[0].tolist()
                    new += ids
                    print(utf8.decode(tokenizer.token_bytes(ids)), end="", file=out, flush=True)
                    pending = []
            seconds += time.perf_counter() - t0  # with the prompt's prefill and the printing
        print(utf8.decode(b"", final=True) + "\n---------------", file=out, flush=True)
        samples.append(new)

    # What it measured: the speed, and the cache's bytes against a vanilla cache's, which holds a
    # key and a value tensor per layer (SVFormer's holds one value tensor for all layers).
    n = sum(map(len, samples))
    print(f"{model.config.value_mode}, cache {'on' if cfg.use_cache else 'off'}, {device} "
          f"{dtype}: {n:,} tokens in {seconds:.2f} s, {n / max(seconds, 1e-9):.1f} tokens/s",
          file=err)
    cache = cache or model.new_kv_cache(1, dtype=getattr(torch, dtype))  # what it would hold
    vanilla = 2 * model.config.n_layer * cache.keys[0].nbytes
    print(f"KV cache{' (off; on, it would take)' if not cfg.use_cache else ''}: "
          f"{cache.nbytes():,} bytes for {block_size} positions ({len(cache.keys)} key + "
          f"{len(cache.values)} value tensors); a vanilla cache: {vanilla:,} bytes (ratio "
          f"{cache.nbytes() / vanilla:.3f})", file=err)
    return {"tokens": samples, "tokens_per_sec": n / max(seconds, 1e-9),
            "cache_bytes": cache.nbytes(), "vanilla_bytes": vanilla}


def main(argv):
    sample(parse_args(SETTINGS, argv, USAGE))


if __name__ == "__main__":
    run_main(main)
