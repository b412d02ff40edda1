"""
Sample from a trained model, streaming tokens as they are generated.

    python sample.py                                  # out/ckpt.pt, 10 samples from end-of-text
    python sample.py --start="ROMEO:" --num_samples=3 --max_new_tokens=200 --top_p=0.9
    python sample.py --start=FILE:prompt.txt --temperature=0   # greedy continuation of a file
    python sample.py --use_cache=False                # recompute the whole context every token

The tokenizer is the one the training data was prepared with (recorded in the checkpoint).
stdout gets only the text; the speed, the KV cache's size (against a vanilla cache of the
same length: the SVFormer saving) and the share of sampled words that occur in the training
text go to stderr.
"""
import dataclasses
import os
import sys
import time

import torch

import shards
from configurator import ConfigError, parse_args, plural, run_main, setup_device
from model import GPT, kv_cache_bytes

SETTINGS = dict(
    out_dir=("out", "read out_dir/ckpt.pt"),
    start=("", "prompt text, or FILE:path to read it from a file; empty starts from end-of-text"),
    num_samples=(10, "samples to print"),
    max_new_tokens=(500, "tokens generated per sample"),
    temperature=(0.8, "1.0 = the model's distribution, lower = more conservative, 0 = greedy"),
    top_k=(200, "keep only the k likeliest tokens (None: all)"),
    top_p=(None, "keep the smallest set of tokens whose probability reaches p (None: all)"),
    seed=(1337, "the same seed gives the same text"),
    use_cache=(True,
        "KV cache; False recomputes the whole context for every token (nanoGPT's way)"),
    device=("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (bfloat16 on capable GPUs, else float32), float32, bfloat16, float16"),
)
USAGE = "usage: python sample.py [--key=value ...]"
SEPARATOR = "---------------"


def read_prompt(start):
    """The prompt text: --start itself, or the contents of the file named by --start=FILE:path."""
    if start is None:  # --start=None
        return ""
    if not start.startswith("FILE:"):
        return start
    path = start[len("FILE:"):]
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no prompt file {path} (from --start=FILE:{path})")
    with open(path, encoding="utf-8") as f:
        return f.read()


def load_model(out_dir, device):
    """(model in eval mode, tokenizer, the checkpoint's record of its data) from out_dir/ckpt.pt."""
    ckpt = shards.load_checkpoint(os.path.join(out_dir, "ckpt.pt"), map_location=device)
    if "tokenizer" not in ckpt:
        raise ValueError(f"{out_dir}/ckpt.pt records no tokenizer: "
                         "re-train it with this version of train.py")
    trained_on = {"dataset": (ckpt.get("config") or {}).get("dataset"), "data": ckpt.get("data")}
    return (GPT.from_checkpoint(ckpt, device), shards.get_tokenizer(ckpt["tokenizer"]["tokenizer"]),
            trained_on)


def training_data(trained_on, tokenizer, err):
    """The directory of the data the model trained on, if it is here and still in the model's
    tokens (else None, saying why when it matters)."""
    if not trained_on["dataset"]:
        return None
    data_dir = shards.dataset_dir(trained_on["dataset"])
    if not os.path.isdir(data_dir):
        return None  # sampling away from the data: nothing to compare with
    meta = shards.load_meta(data_dir)
    if meta["tokenizer"] != tokenizer.name:
        print(f"note: {data_dir} now holds {meta['tokenizer']} tokens, but this model was "
              f"trained on {tokenizer.name} tokens: decoding with {tokenizer.name}, as the "
              f"checkpoint records; real words not counted", file=err)
        return None
    then, now = trained_on["data"], shards.data_identity(data_dir, meta)
    if then and then["sha256"] != now["sha256"]:
        print(f"note: {data_dir} changed since this model trained on it ({shards.describe(then)}; "
              f"now {shards.describe(now)}): real words are counted against the data there now",
              file=err)
    return data_dir


def check_settings(cfg):
    if cfg["num_samples"] < 1 or cfg["max_new_tokens"] < 0:
        raise ConfigError("--num_samples must be >= 1 and --max_new_tokens >= 0")
    if cfg["temperature"] < 0:
        raise ValueError(f"--temperature must be >= 0 (0 is greedy), got {cfg['temperature']}")
    if cfg["top_k"] is not None and cfg["top_k"] < 1:
        raise ValueError(f"--top_k must be >= 1 or None, got {cfg['top_k']}")
    top_p = cfg["top_p"]
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not 0 < top_p <= 1):
        raise ValueError(f"--top_p must be a number in (0, 1] or None, got {top_p!r}")


class StreamDecoder:
    """Token ids in, printable text out. A multi-byte character can be split across tokens
    (always possible with bytes, sometimes with BPE): while the decoded text ends in the
    replacement character, hold the ids back a few tokens in case the next ones complete it."""

    def __init__(self, tokenizer):
        self.tokenizer, self.pending = tokenizer, []

    def push(self, token):
        self.pending.append(token)
        text = self.tokenizer.decode(self.pending)
        if text.endswith("\ufffd") and len(self.pending) < 8:
            return ""
        self.pending = []
        return text

    def flush(self):
        text, self.pending = self.tokenizer.decode(self.pending), []
        return text


def sample(cfg, out=None, err=None):
    """Print num_samples samples to out (streaming; default stdout), a speed and cache report to
    err (default stderr). Returns {"tokens": [new ids per sample], "tokens_per_sec", "cache_bytes",
    "vanilla_bytes"} for tests and scripts."""
    out, err = out or sys.stdout, err or sys.stderr
    check_settings(cfg)
    device, dtype, autocast = setup_device(cfg["device"], cfg["dtype"])
    model, tokenizer, trained_on = load_model(cfg["out_dir"], device)
    config = model.config
    data_dir = training_data(trained_on, tokenizer, err)

    # The prompt: empty starts a fresh document (end-of-text);
    # too long keeps what the model can see.
    text = read_prompt(cfg["start"])
    ids = tokenizer.encode(text) if text else [tokenizer.eot]
    if len(ids) > config.block_size:
        print(f"prompt is {len(ids)} tokens, longer than block_size {config.block_size}: "
              f"keeping its last {config.block_size}", file=err)
        ids = ids[-config.block_size:]
        text = tokenizer.decode(ids)
    x = torch.tensor([ids], dtype=torch.long, device=device)

    # One sample at a time (batch 1) so each can stream;
    # seeding once makes the whole run repeatable.
    torch.manual_seed(cfg["seed"])
    results, n_new, seconds, cache = [], 0, 0.0, None
    for _ in range(cfg["num_samples"]):
        out.write(text)
        out.flush()
        new = []
        with autocast:
            # a fresh cache per sample; made inside autocast so it takes the dtype
            # the model computes in
            cache = model.new_kv_cache(1) if cfg["use_cache"] else None
            t0 = time.perf_counter()
            tokens = model.generate_tokens(x, cfg["max_new_tokens"], cfg["temperature"],
                                           cfg["top_k"], cfg["top_p"],
                                           use_cache=cfg["use_cache"], kv_cache=cache)
            decoder = StreamDecoder(tokenizer)
            for t in tokens:
                new.append(t.item())
                out.write(decoder.push(new[-1]))
                out.flush()
            out.write(decoder.flush())
            seconds += time.perf_counter() - t0  # includes the prompt's prefill and the printing
        n_new += len(new)
        results.append(new)
        out.write("\n" + SEPARATOR + "\n")
        out.flush()

    # The report: speed, then the cache's real bytes against what a vanilla cache would hold.
    tokens_per_sec = n_new / seconds if seconds > 0 else float("nan")
    print(f"{config.value_mode}, cache {'on' if cfg['use_cache'] else 'off'}, {device} {dtype}: "
          f"{plural(n_new, 'token')} in {seconds:.2f} s, {tokens_per_sec:.1f} tokens/s", file=err)
    # The cache is preallocated for a full block, so its bytes are for block_size positions.
    length, cache_dtype = config.block_size, (cache.keys[0].dtype if cache is not None
                                              else getattr(torch, dtype))
    cache_bytes = (cache.nbytes() if cache is not None
                   else model.kv_cache_bytes(1, length, cache_dtype))
    vanilla = dataclasses.replace(config, value_mode="vanilla", learnable_lambda=False)
    vanilla_bytes = kv_cache_bytes(vanilla, 1, length, cache_dtype)
    n_values = config.n_value_tensors
    what = "KV cache" if cache is not None else "KV cache off; on, it would take"
    print(f"{what}: {cache_bytes:,} bytes for {length} positions "
          f"({config.n_layer} key + {n_values} value tensors, "
          f"{str(cache_dtype).removeprefix('torch.')}); a vanilla cache: {vanilla_bytes:,} bytes "
          f"(ratio {cache_bytes / vanilla_bytes:.3f})", file=err)
    if config.learnable_lambda:  # what training made of the 0.5 / 0.5 start, layer by layer
        lambdas = [block.attn.value_lambdas.tolist() for block in model.transformer.h[1:]]
        print("learned lambdas (lambda_1 on V_1 / lambda_2 on V_n), layers 2-"
              f"{config.n_layer}: " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in lambdas), file=err)
    share = None
    if data_dir:  # how many of the sampled words are words of the training text
        vocabulary, scanned = shards.training_vocabulary(data_dir, tokenizer)
        text = "\n".join(tokenizer.decode([t for t in new if t != tokenizer.eot])
                         for new in results)
        share, n_words = shards.real_word_share(text, vocabulary)
        scope = ("" if scanned < shards.WORD_SCAN_TOKENS
                 else f" (its first {scanned:,} tokens)")
        print(f"real words: {share:.1%} of the {n_words:,} sampled words occur in the "
              f"training text of {data_dir}{scope}" if n_words else
              "real words: the samples hold no words", file=err)
    return {"tokens": results, "tokens_per_sec": tokens_per_sec, "cache_bytes": cache_bytes,
            "vanilla_bytes": vanilla_bytes, "real_words": share}


def main(argv, out=None, err=None):
    return sample(parse_args(SETTINGS, argv, USAGE), out, err)


if __name__ == "__main__":
    run_main(main)
