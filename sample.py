"""Sample from a trained model: text streams to stdout; speed, cache bytes, real words to stderr."""
import os
import sys
import time

import torch

import shards
from configurator import ConfigError, parse_args, plural, run_main, setup_device
from model import GPT

SETTINGS = dict(
    out_dir=("out", "read out_dir/ckpt.pt"),
    start=("", "prompt text, or FILE:path to read it from a file; empty starts from end-of-text"),
    num_samples=(10, "samples to print"),
    max_new_tokens=(500, "tokens generated per sample"),
    temperature=(0.8, "1.0 = the model's distribution, lower = more conservative, 0 = greedy"),
    top_k=(200, "keep only the k likeliest tokens (None: all)"),
    top_p=(None, "keep the smallest set of tokens whose probability reaches p (None: all)"),
    seed=(1337, "the same seed gives the same text"),
    use_cache=(True, "KV cache; False recomputes the whole context for every token (nanoGPT's)"),
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (bfloat16 on capable GPUs, else float32), float32, bfloat16, float16"),
)
USAGE = "usage: python sample.py [--key=value ...]"
SEPARATOR = "---------------"


def training_data(ckpt, tokenizer, err):
    """The training data's directory if it is here and still in the model's tokens; else None."""
    data_dir = shards.dataset_dir(ckpt["config"]["dataset"]) if "config" in ckpt else None
    if data_dir is None or not os.path.isdir(data_dir):
        return None  # sampling away from the data: nothing to compare with
    meta = shards.load_meta(data_dir)
    if meta["tokenizer"] != tokenizer.name:
        print(f"note: {data_dir} now holds {meta['tokenizer']} tokens, but this model was "
              f"trained on {tokenizer.name} tokens: decoding with {tokenizer.name}, as the "
              f"checkpoint records; real words not counted", file=err)
        return None
    then, now = ckpt["data"], shards.data_identity(data_dir, meta)
    if then["sha256"] != now["sha256"]:
        print(f"note: {data_dir} changed since this model trained on it ({shards.describe(then)}; "
              f"now {shards.describe(now)}): real words are counted against the data there now",
              file=err)
    return data_dir


class StreamDecoder:
    """Token ids in, text out; ids that decode to a split character wait for the rest of it."""

    def __init__(self, tokenizer):
        self.tokenizer, self.pending = tokenizer, []

    def push(self, token):
        self.pending.append(token)
        waiting = self.tokenizer.decode(self.pending).endswith("\ufffd") and len(self.pending) < 8
        return "" if waiting else self.flush()

    def flush(self):
        text, self.pending = self.tokenizer.decode(self.pending), []
        return text


def sample(cfg, out=None, err=None):
    """Stream samples to out (stdout), a report to err (stderr); return its numbers for tests."""
    out, err = out or sys.stdout, err or sys.stderr
    if cfg["num_samples"] < 1 or cfg["max_new_tokens"] < 0:
        raise ConfigError("--num_samples must be >= 1 and --max_new_tokens >= 0")
    if cfg["temperature"] < 0:
        raise ValueError(f"--temperature must be >= 0 (0 is greedy), got {cfg['temperature']}")
    if cfg["top_k"] is not None and cfg["top_k"] < 1:
        raise ValueError(f"--top_k must be >= 1 or None, got {cfg['top_k']}")
    top_p = cfg["top_p"]
    if top_p is not None and not (type(top_p) in (int, float) and 0 < top_p <= 1):  # (not bool)
        raise ValueError(f"--top_p must be a number in (0, 1] or None, got {top_p!r}")
    device, dtype, autocast = setup_device(cfg["device"], cfg["dtype"])
    ckpt = shards.load_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"), map_location=device)
    model = GPT.from_checkpoint(ckpt, device)
    print(f"loaded {cfg['out_dir']}/ckpt.pt: {model.config.value_mode}, step {ckpt['iter_num']} "
          f"of max_iters {ckpt['config']['max_iters']}, best val loss "
          f"{ckpt['best_val_loss']:.4f} (fixed-window estimate)", file=err)
    tokenizer = shards.get_tokenizer(ckpt["tokenizer"]["tokenizer"])
    data_dir = training_data(ckpt, tokenizer, err)
    del ckpt  # the model holds the weights now
    config, block_size = model.config, model.config.block_size

    # The prompt: --start or FILE:path; empty starts a fresh document, too long keeps the end.
    text = cfg["start"] or ""  # --start=None is empty too
    if text.startswith("FILE:"):
        path = text[len("FILE:"):]
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no prompt file {path} (from --start=FILE:{path})")
        with open(path, encoding="utf-8") as f:
            text = f.read()
    ids = tokenizer.encode(text) if text else [tokenizer.eot]
    if len(ids) > block_size:
        print(f"prompt is {len(ids)} tokens, longer than block_size {block_size}: "
              f"keeping its last {block_size}", file=err)
        ids, text = ids[-block_size:], tokenizer.decode(ids[-block_size:])
    x = torch.tensor([ids], dtype=torch.long, device=device)

    # One sample at a time (batch 1) so each can stream; seeding once makes the run repeatable.
    torch.manual_seed(cfg["seed"])
    results, seconds, cache = [], 0.0, None
    for _ in range(cfg["num_samples"]):
        print(text, end="", file=out, flush=True)
        new, decoder = [], StreamDecoder(tokenizer)
        with autocast:  # a fresh cache per sample, made in autocast to take the compute dtype
            cache = model.new_kv_cache(1) if cfg["use_cache"] else None
            t0 = time.perf_counter()
            for t in model.generate_tokens(x, cfg["max_new_tokens"], cfg["temperature"],
                                           cfg["top_k"], cfg["top_p"], cfg["use_cache"], cache):
                new.append(t.item())
                print(decoder.push(new[-1]), end="", file=out, flush=True)
            print(decoder.flush() + "\n" + SEPARATOR, file=out, flush=True)
            seconds += time.perf_counter() - t0  # includes the prompt's prefill and the printing
        results.append(new)

    n_new = sum(len(new) for new in results)
    tokens_per_sec = n_new / seconds if seconds > 0 else float("nan")
    print(f"{config.value_mode}, cache {'on' if cfg['use_cache'] else 'off'}, {device} {dtype}: "
          f"{plural(n_new, 'token')} in {seconds:.2f} s, {tokens_per_sec:.1f} tokens/s", file=err)
    # The cache is preallocated for a full block: its real bytes against a vanilla cache's.
    what = "KV cache" if cache else "KV cache off; on, it would take"
    cache_dtype = cache.keys[0].dtype if cache else getattr(torch, dtype)
    cache_bytes = cache.nbytes() if cache else model.kv_cache_bytes(1, block_size, cache_dtype)
    # a vanilla cache holds a value tensor per layer: 2 * n_layer tensors of the same size
    vanilla_bytes = cache_bytes // (config.n_layer + config.n_value_tensors) * 2 * config.n_layer
    print(f"{what}: {cache_bytes:,} bytes for {block_size} positions ({config.n_layer} key + "
          f"{config.n_value_tensors} value tensors, {str(cache_dtype).removeprefix('torch.')}); "
          f"a vanilla cache: {vanilla_bytes:,} bytes (ratio {cache_bytes / vanilla_bytes:.3f})",
          file=err)
    if config.learnable_lambda:  # what training made of the 0.5 / 0.5 start, layer by layer
        lambdas = [block.attn.value_lambdas.tolist() for block in model.transformer.h[1:]]
        print("learned lambdas (lambda_1 on V_1 / lambda_2 on V_n), layers 2-"
              f"{config.n_layer}: " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in lambdas), file=err)
    share = distinct = None
    if data_dir:  # how many of the sampled words are words of the training text
        report, share, distinct = shards.real_words(data_dir, tokenizer, results)
        print(report, file=err)
    return {"tokens": results, "tokens_per_sec": tokens_per_sec, "cache_bytes": cache_bytes,
            "vanilla_bytes": vanilla_bytes, "real_words": share, "distinct_real_words": distinct}


def main(argv, out=None, err=None):
    return sample(parse_args(SETTINGS, argv, USAGE), out, err)


if __name__ == "__main__":
    run_main(main)
