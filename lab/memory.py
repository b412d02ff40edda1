"""python -m lab.memory [preset.py ...] [--key=value ...] [--gpu_memory=GB]: for a preset's
variants on this GPU (or a card of GB gigabytes; without one, four common cards), the batch_size x
gradient_accumulation_steps that keeps the preset's tokens a step and fits, with the peak memory
of a training step and of lab.evaluate's pass. Estimates, from what a forward keeps for the
backward on this CPU at a short length (bfloat16's bytes are float16's, as a T4 keeps), checked
by bench.py --gpu_check on a GPU. A resume keeps its batch: resume on the run's own card."""
import itertools
import sys

import torch

import compare
import data
from configurator import ConfigError, parse_args, run_main
from lab.evaluate import LOGITS_AT_ONCE
from lab.grid import parse_modes
from model import GPT, GPTConfig

# GiB a training process finds free (torch.cuda.mem_get_info) on each card, after CUDA's own
CARDS = {16: 14.5, 24: 22.0, 40: 38.5, 80: 78.0}
NAMES = {16: "16 GB (T4)", 24: "24 GB (L4, A10G, RTX 3090/4090)", 40: "40 GB (A100)",
         80: "80 GB (A100, H100)"}
HEADROOM = 0.9  # of the free memory: the caching allocator's fragments and other buffers
SETTINGS = {**compare.SETTINGS,
            "gpu_memory": (0, "a card of this many GB (0: this GPU; without one, the four cards "
                              "of 16, 24, 40 and 80 GB)", 0)}


def step_peak(model, block_size, dtype="bfloat16"):
    """A training step's peak bytes as a function of its tokens. The peak comes in the backward at
    the loss: 12 bytes a parameter (weights, AdamW's moments), what the forward keeps for the
    backward (16-bit copies of the weights once), the logits training_step holds until it returns,
    and the float gradients of the logits and their log-softmax (8 bytes a logit). The gradients
    come later, as the activations go: at least 16 bytes a parameter, and the token table's
    gradient twice more (from the head and from the embedding, then summed)."""
    T = min(block_size, 64)

    def saved(batch):  # the bytes a forward of batch x T tokens keeps for the backward
        kept = {}

        def keep(t):  # each storage once; the weights stay in memory anyway
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() * (
                not isinstance(t, torch.nn.Parameter))
            return t
        x = torch.zeros(batch, T, dtype=torch.long)
        with torch.random.fork_rng(devices=[]), data.setup_device("cpu", dtype)[2], \
                torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            model(x, x)
        return sum(kept.values())
    kept_by_1, kept_by_2 = saved(1), saved(2)
    params = sum(p.numel() for p in model.parameters())
    fixed = 12 * params + max(2 * kept_by_1 - kept_by_2, 0)
    logits = 8 + (4 if dtype == "float32" else 2)  # bytes a logit: gradients, and the logits
    per_token = (kept_by_2 - kept_by_1) / T + logits * model.config.vocab_size
    least = 16 * params + 8 * model.transformer.wte.weight.numel()
    return lambda tokens: max(fixed + per_token * tokens, least)


def measured_peak(step, device):
    """Peak bytes tensors held in step() beyond those before: CUDA's count, or torch.profiler's."""
    if device.startswith("cuda"):  # (counted as the allocations are queued: no need to wait)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        return torch.cuda.max_memory_allocated(device) - before
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as profile:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in profile.profiler.kineto_results.events()
                    if e.name() == "[memory]")  # an allocation's bytes, a free's negative
    return max(itertools.accumulate((nbytes for _, nbytes in events), initial=0))


def fit(model, cfg, free):
    """(batch_size, micro-steps, training bytes, evaluation bytes): the preset's batch halved, its
    micro-steps doubled, until a step fits HEADROOM of free bytes; None where none fits."""
    peak = step_peak(model, cfg.block_size)
    batch, accum = cfg.batch_size, cfg.gradient_accumulation_steps or 1
    while peak(batch * cfg.block_size) > HEADROOM * free and batch % 2 == 0:
        batch, accum = batch // 2, accum * 2
    need = peak(batch * cfg.block_size)
    # the whole-split pass (lab.evaluate): the weights and their 16-bit copies, the batch's hidden
    # states and one layer's activations, and one chunk of logits with its float copies
    evaluation = (6 * sum(p.numel() for p in model.parameters())
                  + batch * cfg.block_size * model.config.n_embd * 4 * 6 + 10 * LOGITS_AT_ONCE)
    return None if need > HEADROOM * free else (batch, accum, need, evaluation)


def main(argv):
    argv = [a for a in argv if a.partition("=")[0] not in ("--resume", "--overwrite")]  # (train's)
    cfg = parse_args(SETTINGS, argv, "python -m lab.memory [preset.py ...] [--gpu_memory=GB]")
    if cfg.gpu_memory:
        cards = {f"{cfg.gpu_memory} GB": CARDS.get(cfg.gpu_memory, 0.93 * cfg.gpu_memory - 0.5)}
    elif torch.cuda.is_available():
        cards = {torch.cuda.get_device_name(): torch.cuda.mem_get_info()[0] / 2**30}
    else:
        cards = {NAMES[gb]: free for gb, free in CARDS.items()}
    accum = cfg.gradient_accumulation_steps or 1
    print(f"batch_size x gradient_accumulation_steps that fit, "
          f"{cfg.batch_size * cfg.block_size * accum:,} tokens a step as the preset asks "
          f"({cfg.batch_size} x {accum} at block_size {cfg.block_size}); each cell: the training "
          f"step's peak, then the whole-split pass's (estimates)\n\n| variant | "
          + " | ".join(cards) + " |\n" + "|---" * (len(cards) + 1) + "|")
    try:  # the preset's data says its vocabulary; without it, bytes' or GPT-2's
        vocab = data.padded_vocab(data.load_meta(data.dataset_dir(cfg.dataset)))
    except data.DataError:
        vocab = 320 if cfg.dataset.endswith("_byte") else 50304
    for name, overrides in parse_modes(cfg.modes):
        try:
            config = GPTConfig.from_dict({**vars(cfg), **overrides, "vocab_size": vocab})
        except ValueError as e:
            raise ConfigError(str(e)) from None
        torch.manual_seed(0)
        model, cells = GPT(config), []
        for free in cards.values():
            fitted = fit(model, cfg, free * 2**30)
            cells.append("does not fit" if fitted is None else
                         f"{fitted[0]} x {fitted[1]} ({fitted[2] / 2**30:.1f}, "
                         f"{fitted[3] / 2**30:.1f} GiB)")
        print(f"| {name} ({model.num_params() / 1e6:.0f}M) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.argv[0] = "lab.memory"
    run_main(main)
