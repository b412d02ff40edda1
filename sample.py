"""Sample from a trained model: load its checkpoint, encode a prompt, generate with the KV cache,
decode. The text streams to stdout; what was measured goes to stderr.

    python sample.py                                  # 10 samples from out/ckpt.pt
    python sample.py --start="ROMEO:" --num_samples=3 --max_new_tokens=200
"""
import codecs
import os
import re
import sys
import time

import numpy as np
import torch

import data
from configurator import POSITIVE, ConfigError, at_least, between, parse_args, run_main, \
    setup_device
from model import GPT

SETTINGS = dict(
    out_dir=("out", "read out_dir/ckpt.pt"),
    start=("", "prompt text, or FILE:path to read it from a file; empty starts a fresh document"),
    num_samples=(10, "samples to print", POSITIVE),
    max_new_tokens=(500, "tokens generated per sample", at_least(0)),
    temperature=(0.8, "1.0 = the model's distribution, lower = more conservative, 0 = greedy "
                      "(one sample)", at_least(0.0)),
    top_k=(200, "keep only the k likeliest tokens (None: all)", POSITIVE),
    seed=(1337, "the same seed gives the same text", between(0, 2**64 - 1)),  # torch.manual_seed's
    use_cache=(True, "KV cache; False recomputes the whole context for every token (nanoGPT's)"),
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (as train.py), float32, bfloat16, float16"),
)
USAGE = "usage: python sample.py [--key=value ...]"


def sample(cfg, out=sys.stdout, err=sys.stderr):
    """Streams num_samples samples (temperature 0: one) to out, a report to err; returns numbers."""
    if os.path.isfile(cfg.out_dir):  # the checkpoint (or the log) named, not its run's folder
        folder = os.path.dirname(cfg.out_dir) or "."
        raise ConfigError(f"--out_dir is the run's folder: use --out_dir={folder}"
                          if os.path.isfile(os.path.join(folder, "ckpt.pt")) else
                          f"--out_dir={cfg.out_dir} is a file: name a run's folder (with ckpt.pt)")
    device, dtype, autocast = setup_device(cfg.device, cfg.dtype)
    ckpt = data.load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"), map_location=device)
    model = GPT.from_checkpoint(ckpt, device)
    tokenizer = data.get_tokenizer(ckpt["tokenizer"]["tokenizer"])
    print(f"loaded {cfg.out_dir}/ckpt.pt: {model.config.value_mode}, step {ckpt['iter_num']}, "
          f"val loss {ckpt.get('val_loss') or ckpt['best_val_loss']:.4f} there (fixed-window)", file=err)

    # The prompt: --start, or FILE:path; empty starts a fresh document (an end-of-text token).
    text = cfg.start or ""
    if text.startswith("FILE:"):
        if not os.path.isfile(text[5:]):
            raise ConfigError(f"no prompt file {text[5:]} (from --start={text})")
        text = open(text[5:], encoding="utf-8").read()
    ids = tokenizer.encode(text) if text else [tokenizer.eot]
    block_size = model.config.block_size
    if len(ids) > block_size:  # learned positions stop at block_size: keep the prompt's end
        print(f"prompt is {len(ids)} tokens, longer than block_size {block_size}: keeping its "
              f"last {block_size}", file=err)
        ids, text = ids[-block_size:], tokenizer.decode(ids[-block_size:])
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    if len(ids) + cfg.max_new_tokens > block_size + 1:  # the last new token is never fed back
        print(f"past {block_size} tokens (block_size: the learned positions end there) every "
              f"new token recomputes the last {block_size}, as slow as without a cache", file=err)

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
                    prompt, cfg.max_new_tokens, cfg.temperature, cfg.top_k, cache)):
                pending.append(token)  # still on the device: reading it would wait for the GPU
                if len(pending) == 16 or i == cfg.max_new_tokens - 1:  # so: 16 at a time
                    ids = torch.cat(pending, dim=1)[0].tolist()
                    new += ids
                    print(utf8.decode(tokenizer.token_bytes(ids)), end="", file=out, flush=True)
                    pending = []
            seconds += time.perf_counter() - t0  # with the prompt's prefill and the printing
        print(utf8.decode(b"", final=True) + "\n---------------", file=out, flush=True)
        samples.append(new)

    # What it measured: speed, the cache's bytes against a vanilla cache's, real words.
    n = sum(map(len, samples))
    print(f"{model.config.value_mode}, cache {'on' if cfg.use_cache else 'off'}, {device} "
          f"{dtype}: {n:,} tokens in {seconds:.2f} s, {n / max(seconds, 1e-9):.1f} tokens/s",
          file=err)
    # A vanilla cache holds a key and a value tensor per layer; SVFormer's one value in all.
    cache_dtype = cache.keys[0].dtype if cache else getattr(torch, dtype)
    cache_bytes = model.kv_cache_bytes(1, block_size, cache_dtype)
    vanilla = model.kv_cache_bytes(1, block_size, cache_dtype, value_tensors=model.config.n_layer)
    print(f"KV cache{' (off; on, it would take)' if not cache else ''}: {cache_bytes:,} bytes "
          f"for {block_size} positions ({model.config.n_layer} key + "
          f"{model.config.n_value_tensors} value tensors); a vanilla cache: {vanilla:,} bytes "
          f"(ratio {cache_bytes / vanilla:.3f})", file=err)
    share = real_words(ckpt, tokenizer, samples, err)
    return {"tokens": samples, "tokens_per_sec": n / max(seconds, 1e-9),
            "cache_bytes": cache_bytes, "vanilla_bytes": vanilla, "real_words": share}


def real_words(ckpt, tokenizer, samples, err):
    """The share of sampled words (runs of letters) found in the training text, or None and why."""
    data_dir = data.dataset_dir(ckpt["config"]["dataset"])
    words = lambda text: re.findall(r"[a-z]+", text.lower())
    found = words(" ".join(tokenizer.decode([t for t in s if t != tokenizer.eot])
                           for s in samples))
    now = os.path.isdir(data_dir) and data.load_meta(data_dir)["tokenizer"]  # False: no folder
    why = None
    if now is False:
        why = f"the training text ({data_dir}) is not here"
    elif now != tokenizer.name:
        why = f"{data_dir} now holds {now} tokens, not the model's {tokenizer.name} tokens"
    elif not found:
        why = "no word (letters a-z) was sampled"
    if why:
        print(f"real words: not counted: {why}", file=err)
        return None
    known, left = set(), 10_000_000
    for path in data.list_shards(data_dir, "train"):  # up to 10M tokens of it, in all
        tokens = np.asarray(data.read_shard(path)[:left])
        left -= len(tokens)
        known.update(words(tokenizer.decode(tokens[tokens != tokenizer.eot])))
    share, distinct = (sum(w in known for w in ws) / len(ws) for ws in (found, set(found)))
    print(f"real words: {share:.1%} of the {len(found):,} sampled words occur in the training "
          f"text of {data_dir} ({distinct:.1%} of the distinct ones)", file=err)
    return share


def main(argv):
    sample(parse_args(SETTINGS, argv, USAGE, "sample.py"))


if __name__ == "__main__":
    run_main(main)
