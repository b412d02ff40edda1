"""python -m lab.evaluate --out_dir=DIR [--batch_size=N]: a run's loss over every token of its
validation split, each once, from DIR/ckpt.pt: printed, and written into DIR/log.jsonl as its
"final" entry (compare.py's number for a run; it runs this right after train.py, in the run's own
slot). Memory-safe on any GPU: the windows go through the model batch_size at a time (the run's
own batch by default, which trained in this memory), and the logits are made and scored
LOGITS_AT_ONCE at a time, never a whole batch's (at GPT-2's 50,304 ids, 32 x 1,024 tokens of
logits would be 6.1 GiB in float32, and as much again for the loss's log-softmax)."""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import data
from configurator import parse_args, run_main
from model import GPT

SETTINGS = dict(
    out_dir=("out", "the run's folder: its ckpt.pt and log.jsonl"),
    batch_size=(0, "windows a forward pass (0: the run's own batch_size)", 0),
    device=("", "where to compute (empty: the run's own --device)"),
)
LOGITS_AT_ONCE = 2**25  # 128 MiB of float32 logits a chunk: one chunk for byte-level runs


@torch.no_grad()
def split_loss(model, shards, batch_size, autocast):
    """(mean loss, tokens) over every token of a split once: each shard cut into consecutive
    windows of block_size (its last one shorter), batch_size windows a forward pass (those of
    one length together); the cross-entropy summed a chunk of tokens at a time."""
    T, device = model.config.block_size, model.lm_head.weight.device
    chunk = max(1, LOGITS_AT_ONCE // model.config.vocab_size)  # tokens whose logits fit at once
    windows = [(tokens, s, min(T, len(tokens) - 1 - s))
               for tokens in shards for s in range(0, len(tokens) - 1, T)]
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, tokens: on the device
    for i in range(0, len(windows), batch_size):
        batch = windows[i:i + batch_size]
        for n in sorted({n for _, _, n in batch}):  # rows of one length together
            rows = torch.stack([data.window(t, s, n) for t, s, m in batch if m == n]).to(device)
            with autocast:
                hidden = model.hidden_states(rows[:, :-1]).flatten(0, 1)
            targets = rows[:, 1:].flatten()
            for j in range(0, len(targets), chunk):
                with autocast:
                    logits = model.lm_head(hidden[j:j + chunk])
                sums[0] += F.cross_entropy(logits.float(), targets[j:j + chunk], reduction="sum")
            sums[1] += len(targets)
    return (sums[0] / sums[1]).item(), int(sums[1].item())


def evaluate(out_dir, batch_size=0, device=""):
    """The run in out_dir scored on its whole validation split; its log gets the "final" entry."""
    t0, ckpt = time.time(), data.load_checkpoint(os.path.join(out_dir, "ckpt.pt"))
    run = ckpt["config"]
    device, _, autocast = data.setup_device(device or run["device"], run["dtype"])
    model = GPT.from_checkpoint(ckpt, device)
    shards, _ = data.load_dataset(run["dataset"])
    loss, n = split_loss(model, shards["val"], batch_size or run["batch_size"], autocast)
    final = {"iter": ckpt["iter_num"], "kind": "final", "val_loss_full": loss, "val_tokens": n,
             "seconds": time.time() - t0}
    # The log as train.py wrote it, with this step's final entry (an earlier one replaced).
    # (Read here, not with lab.runs' reader, so that the code of a run imports no table code.)
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        entries = [e for e in map(json.loads, f)
                   if e["kind"] != "final" or e["iter"] != final["iter"]]
    data.write_log(out_dir, entries + [final])
    print(f"val loss over the whole validation split ({n:,} tokens): {loss:.4f} ({out_dir}, "
          f"step {final['iter']})", flush=True)
    return final


def main(argv):
    cfg = parse_args(SETTINGS, argv, "python -m lab.evaluate --out_dir=DIR [--batch_size=N]")
    evaluate(cfg.out_dir, cfg.batch_size, cfg.device)


if __name__ == "__main__":
    sys.argv[0] = "lab.evaluate"
    run_main(main)
