"""
train.py's checkpoint plumbing (runtime.py writes and reads the file itself): what --resume takes
from a checkpoint (its settings, changed only where given; the data it trained on), and
Checkpoint, which writes one at a step boundary with every rank's data position and RNG states,
which restore_rank_state puts back on resuming.
"""
import dataclasses
import errno
import os

import torch
import torch.distributed as dist

import shards
from configurator import ACTIONS, TRAIN_SETTINGS, ConfigError, defaults_of
from model import GPTConfig
from runtime import CHECKPOINT_FORMAT, DiskFull, load_checkpoint, save_checkpoint

DEFAULTS = defaults_of(TRAIN_SETTINGS)
# the settings that shape the weights: a resumed run cannot change them (dropout it can)
MODEL_KEYS = {f.name for f in dataclasses.fields(GPTConfig)} - {"dropout", "vocab_size"}


def resolve_resume(cfg, given, ckpt_path):
    """--resume: the checkpoint's settings, changed only where given (each change announced).
    given: the keys set on the command line or by a preset (None: every key of cfg)."""
    ckpt = load_checkpoint(ckpt_path)
    # the actions (resume, overwrite, new_data) are this command's, never the checkpoint's
    saved = {**DEFAULTS, **{k: v for k, v in ckpt["config"].items() if k not in ACTIONS},
             **{k: cfg[k] for k in ACTIONS}}
    given = set(cfg) if given is None else set(given)
    changes = {k: (saved.get(k), cfg[k])
               for k in given - set(ACTIONS) if saved.get(k) != cfg[k]}
    shape = {k: v for k, v in changes.items() if k in MODEL_KEYS}
    if shape:
        shown = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in shape.items())
        raise ConfigError(f"cannot resume {ckpt_path}: the model differs ({shown}); "
                          f"a run keeps its model shape: "
                          f"drop those settings, or start a new run with another --out_dir")
    return {**saved, **{k: b for k, (_, b) in changes.items()}, "resume": True}, ckpt, changes


def check_resume_data(ckpt_path, ckpt, data, cfg, changes):
    """A resume goes on with the data the checkpoint trained on, unless the user says otherwise
    (--new_data, or another --dataset); tokens of another tokenizer never fit the model."""
    then = ckpt.get("data")  # checkpoints of older versions record none: nothing to compare
    if then is None or then["sha256"] == data["sha256"]:
        return None
    if then["tokenizer"] != data["tokenizer"]:
        raise ConfigError(f"cannot resume {ckpt_path}: its model reads {then['tokenizer']} "
                          f"tokens, {data['dir']} holds {data['tokenizer']} tokens: resume on "
                          f"data prepared with --tokenizer={then['tokenizer']}")
    if not cfg["new_data"] and "dataset" not in changes:
        raise ConfigError(f"cannot resume {ckpt_path}: it trained on {then['dir']} "
                          f"({shards.describe(then)}), but {data['dir']} now holds other data "
                          f"({shards.describe(data)}): prepare the original data again, "
                          f"or go on with this data with --new_data")
    return (f"resume: the data changed: {then['dir']} ({shards.describe(then)}) -> "
            f"{data['dir']} ({shards.describe(data)})")


# ---- writing a checkpoint, and restoring every rank's state ----

class Checkpoint:
    """out_dir/ckpt.pt, written by rank 0 at a step boundary with everything an exact resume needs:
    weights, AdamW, the run's fixed record (settings, data, tokenizer) and every rank's data
    position and RNG states. It remembers which step the file on disk holds, for a full disk."""

    def __init__(self, path, saved_iter, device_type, record):
        self.path, self.saved_iter, self.record = path, saved_iter, record
        self.device_type = device_type

    def save(self, iter_num, best_val_loss, model, optimizer, batches, rank, world):
        """Every rank calls it (the ranks' states are gathered); rank 0 writes."""
        states, mine = [None] * world, rank_state(batches, self.device_type)
        if world > 1:
            dist.all_gather_object(states, mine)
        else:
            states[0] = mine
        if rank != 0:
            return
        try:
            save_checkpoint(self.path, {
                "format": CHECKPOINT_FORMAT, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), **self.record,
                "iter_num": iter_num, "best_val_loss": best_val_loss, "rank_states": states})
        except DiskFull:
            raise self.no_space(f"saving {self.path}") from None
        self.saved_iter = iter_num

    def no_space(self, doing):
        """The one-line error for a full disk: what failed, and which checkpoint is whole."""
        kept = (f"the checkpoint of step {self.saved_iter} is kept (free some space, then add "
                f"--resume)" if self.saved_iter is not None
                else "the ckpt.pt already there is unchanged" if os.path.exists(self.path)
                else "no checkpoint was saved")
        return DiskFull(errno.ENOSPC, f"no space left on device while {doing}; {kept}")


def rank_state(batches, device_type):
    """This rank's data position and RNG states, as of now (a step boundary)."""
    return {"data": batches.state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None}


def restore_rank_state(ckpt, ckpt_path, batches, rank, world, device_type):
    """This rank's data position and RNGs, from the checkpoint (written by as many ranks)."""
    if len(ckpt["rank_states"]) != world:
        raise ConfigError(f"{ckpt_path} was written by {len(ckpt['rank_states'])} process(es); "
                          f"resume it with the same number (torchrun --nproc_per_node)")
    state = ckpt["rank_states"][rank]
    batches.load_state(state["data"])
    torch.set_rng_state(state["torch"])
    if device_type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"])
