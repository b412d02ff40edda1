"""
The token data every script shares: the shard format, its validated reader, and the tokenizers.

A dataset is a directory data/<name>/ holding meta.json (tokenizer, vocab size, and the shards
with their size and sha256) and the shards it names, tagged per preparation (<name>.gen-1_train_
000000.bin, then gen-2: replacing meta.json switches readers from one complete set to the next in
one step). Only what meta.json names is read. A directory without meta.json holds llm.c /
modded-nanogpt FineWeb shards copied in by hand: its *_train_*.bin and *_val_*.bin, GPT-2 tokens.

A shard is in llm.c's layout: a header of 256 little-endian int32 ([0] = magic 20240520,
[1] = version, [2] = token count), then the tokens as uint16 (version 1, llm.c's) or uint32
(version 2, for vocabularies over 65,536). prepare.py writes datasets; train.py, sample.py,
compare.py and bench.py read them through this module. hold_lock keeps a second prepare.py out
of a dataset (and a second train.py out of an out_dir).

Also here: atomic_write (every file the project writes is written whole or not at all) and
load_checkpoint, the reader of train.py's ckpt.pt (sample.py and compare.py read it too).
"""
import contextlib
import errno
import glob
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
from filelock import FileLock, Timeout

DATA_ROOT = "data"
DEFAULT_DATASET = "shakespeare_byte"  # train.py's default: what `python prepare.py` writes
CHECKPOINT_FORMAT = "value-residual-gpt/2"  # train.py writes it; load_checkpoint checks it
DATASETS = ("shakespeare", "tinyshakespeare", "fineweb_edu")  # the built-in sources of prepare.py
MAGIC = 20240520          # llm.c's shard magic number
HEADER_INTS = 256         # header: 256 int32 = 1024 bytes; [0]=magic [1]=version [2]=token count
# version 1 is llm.c's uint16; 2 is ours for big vocabs
VERSIONS = {1: np.dtype("<u2"), 2: np.dtype("<u4")}


class DataError(ValueError):
    """A problem with the user's data or setup: one line naming the file and the fix."""


class OlderDataset(DataError):
    """A dataset folder in a layout an older prepare.py wrote: it is prepared again, not read."""


# -----------------------------------------------------------------------------
# tokenizers

class ByteTokenizer:
    """UTF-8 bytes plus one end-of-text id: no vocabulary file, nothing to download."""
    name, vocab_size, eot = "byte", 257, 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def encode_arrays(self, texts):  # the fast path the shard writer uses
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids):
        if isinstance(ids, np.ndarray):  # a whole shard: no Python loop
            return ids[(ids >= 0) & (ids < 256)].astype(np.uint8).tobytes().decode(
                "utf-8", errors="replace")
        return bytes(int(i) for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class TiktokenTokenizer:
    def __init__(self, enc):
        self.enc, self.name = enc, enc.name
        self.vocab_size, self.eot = enc.n_vocab, enc.eot_token

    def encode(self, text):
        # encode_ordinary: a literal "<|endoftext|>" in web text is just text, not a document break
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts):
        # one thread: parallelism comes from our process pool, so --workers means what it says
        return self.enc.encode_ordinary_batch(texts, num_threads=1)

    def encode_arrays(self, texts):
        return [np.asarray(ids, dtype=np.uint32) for ids in self.encode_batch(texts)]

    def decode(self, ids):
        if isinstance(ids, np.ndarray):  # a whole shard: no Python loop
            ids = ids[(ids >= 0) & (ids < self.vocab_size)].tolist()
        ids = [int(i) for i in ids if 0 <= i < self.vocab_size]
        try:
            return self.enc.decode(ids, errors="replace")
        except Exception:  # ids in the gaps between a vocab's specials: skip them one by one
            out = b""
            for i in ids:
                try:
                    out += self.enc.decode_single_token_bytes(i)
                except Exception:
                    pass
            return out.decode("utf-8", errors="replace")


def _tiktoken_encoding(name):
    # the only place that loads BPE files (tests swap it for an offline copy)
    import tiktoken
    return tiktoken.get_encoding(name)


def get_tokenizer(name):
    if name == "byte":
        return ByteTokenizer()
    try:
        import tiktoken
    except ImportError:
        raise DataError(f"tokenizer {name!r} needs tiktoken: pip install tiktoken, "
                        "or use --tokenizer=byte")
    if name not in tiktoken.list_encoding_names():
        raise DataError(f"unknown tokenizer {name!r}: choose byte or one of "
                        f"{', '.join(tiktoken.list_encoding_names())}")
    try:
        return TiktokenTokenizer(_tiktoken_encoding(name))
    except Exception as e:
        raise DataError(f"could not load tiktoken encoding {name!r} ({type(e).__name__}): "
                        f"tiktoken downloads its BPE files once on first use; connect once, "
                        f"or set TIKTOKEN_CACHE_DIR to a cache copied from "
                        f"a machine that has them, or use --tokenizer=byte") from None


# -----------------------------------------------------------------------------
# the shard format: writing and reading

def shard_dtype(vocab_size):
    return VERSIONS[1] if vocab_size <= 1 << 16 else VERSIONS[2]  # ids up to 65535 fit in uint16


def write_shard(path, tokens, vocab_size):
    """Writes an llm.c-layout shard atomically (temp file, fsync, rename); returns its sha256."""
    dtype = shard_dtype(vocab_size)
    tokens = np.asarray(tokens)
    if not 0 < len(tokens) < 1 << 31:
        raise ValueError(f"{path}: a shard holds 1 to 2**31-1 tokens, not {len(tokens)}")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ValueError(f"{path}: token ids must be in [0, {vocab_size})")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, 1 if dtype == VERSIONS[1] else 2, len(tokens)
    body = np.ascontiguousarray(tokens, dtype=dtype)
    with atomic_write(path, fsync=True) as f:  # *.bin.tmp: list_shards never sees half a shard
        f.write(header.tobytes())
        f.write(memoryview(body))
    return hashlib.sha256(header.tobytes() + body.tobytes()).hexdigest()


def read_shard(path, vocab_size=None):
    """Token array of a shard (ours or llm.c's / modded-nanogpt's), memory-mapped and validated."""
    size = os.path.getsize(path)
    if size < HEADER_INTS * 4:
        raise DataError(f"{path}: {size} bytes is too short for a shard header: "
                        "delete it and re-run prepare.py")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        raise DataError(f"{path}: not a token shard (magic {header[0]}, expected {MAGIC}): "
                        "delete it and re-run prepare.py")
    if int(header[1]) not in VERSIONS:
        raise DataError(f"{path}: unknown shard version {header[1]} "
                        f"(this reader knows {sorted(VERSIONS)}): re-run prepare.py")
    dtype, n = VERSIONS[int(header[1])], int(header[2])
    if n <= 0:
        raise DataError(f"{path}: empty shard (header says {n} tokens): "
                        "delete it and re-run prepare.py")
    if size != HEADER_INTS * 4 + n * dtype.itemsize:
        raise DataError(f"{path}: header says {n:,} tokens but the file has {size:,} bytes, not "
                        f"{HEADER_INTS * 4 + n * dtype.itemsize:,} (truncated?): re-run prepare.py")
    tokens = np.memmap(path, dtype=dtype, mode="r", offset=HEADER_INTS * 4, shape=(n,))
    if vocab_size is not None and vocab_size < np.iinfo(dtype).max + 1:
        # cheap check, not a full scan: the max of 16 evenly spaced blocks of 64K tokens (all of a
        # shard up to 1M tokens, ~2 MB of reading otherwise); a bad id elsewhere is not caught here
        block = 1 << 16
        starts = np.linspace(0, max(n - block, 0), num=16, dtype=np.int64)
        top = max(int(tokens[s:s + block].max()) for s in starts)
        if top >= vocab_size:
            raise DataError(f"{path}: token id {top} >= vocab size {vocab_size}: "
                            f"the shard was made with another tokenizer; "
                            f"re-run prepare.py with the --tokenizer this model uses")
    return tokens


def hold_lock(path, refusal):
    """The file lock at path, held until .release(): prepare.py's on a dataset, train.py's on its
    out_dir. The OS drops it when the process dies, so a killed run never blocks the next one;
    while another process holds it, refusal (a one-line error) is raised."""
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise refusal from None
    return lock


def _prepare_hint(data_dir):
    """The prepare.py command that makes data_dir, when its name says (<dataset>_<tokenizer>)."""
    base = os.path.basename(os.path.normpath(data_dir))
    for tok in ("byte", "gpt2", "r50k_base", "p50k_base", "p50k_edit", "cl100k_base", "o200k_base",
                "o200k_harmony"):
        # tokenizer names contain "_" too: match them whole
        if base.endswith("_" + tok) and len(base) > len(tok) + 1:
            dataset = base[:-len(tok) - 1]
            args = ([] if dataset == "shakespeare"
                    else [f"--dataset={dataset}"] if dataset in DATASETS
                    else ["--input=<your text>", f"--dataset={dataset}"])
            args += [] if tok == "byte" else [f"--tokenizer={tok}"]
            root = os.path.dirname(os.path.normpath(data_dir))
            args += [] if os.path.normpath(root) == DATA_ROOT else [f"--out_root={root}"]
            return "python prepare.py" + "".join(" " + a for a in args)
    return "python prepare.py --help"


def dataset_dir(name):
    """The directory of train.py's --dataset: a name means data/<name>; a path (with a /) itself."""
    if os.sep in name or (os.altsep and os.altsep in name):
        return name
    return os.path.join(DATA_ROOT, name)


def prepared_datasets(root):
    """Names of the datasets prepared under root (the directories holding a meta.json)."""
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "meta.json")))


def _no_data(data_dir, problem):
    """The one-line error for a dataset that isn't there: how to make it, and what there is."""
    root = os.path.dirname(os.path.normpath(data_dir)) or "."
    names = prepared_datasets(root)
    have = (f"prepared in {root}/: {', '.join(names)}; pick one with --dataset=NAME" if names
            else f"nothing is prepared in {root}/ yet")
    return DataError(f"{problem}: run {_prepare_hint(data_dir)} ({have})")


def list_shards(data_dir, split):
    """Paths of one split's shards ("train" or "val"), in order: those meta.json names, each
    checked against its recorded size; without meta.json, every *_<split>_*.bin (llm.c's)."""
    if not os.path.exists(os.path.join(data_dir, "meta.json")):
        # not prepare.py's generation-tagged shards: without meta.json they are a killed run's
        paths = sorted(p for p in glob.glob(os.path.join(data_dir, f"*_{split}_*.bin"))
                       if ".gen-" not in os.path.basename(p))
        if not paths:
            raise _no_data(data_dir, f"no {split} shards in {data_dir}")
        return paths
    meta, paths = load_meta(data_dir), []
    for shard in meta["shards"]:
        if shard["split"] != split:
            continue
        path = os.path.join(data_dir, *shard["file"].split("/"))
        expected = shard["bytes"]
        if not os.path.exists(path):
            raise DataError(f"{path} is missing, though {data_dir}/meta.json names it: "
                            f"run {_prepare_hint(data_dir)} again")
        if os.path.getsize(path) != expected:
            raise DataError(f"{path} has {os.path.getsize(path):,} bytes, not the {expected:,} "
                            f"meta.json records (damaged?): run {_prepare_hint(data_dir)} again")
        paths.append(path)
    if not paths:
        raise _no_data(data_dir, f"{data_dir}/meta.json names no {split} shards")
    return paths


def load_meta(data_dir):
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        # no meta.json: llm.c / modded-nanogpt FineWeb shards copied in by hand,
        # which are GPT-2 tokens
        return {"tokenizer": "gpt2", "vocab_size": 50257, "eot": 50256, "assumed": True}
    try:
        with open(path) as f:
            meta = json.load(f)
        named = [s | {"file": str(s["file"]), "split": str(s["split"]), "tokens": int(s["tokens"])}
                 for s in meta["shards"]]
        meta |= {"vocab_size": int(meta["vocab_size"]), "eot": int(meta["eot"]), "shards": named}
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: unreadable meta.json ({e}): re-run prepare.py") from None
    # this layout: generation-tagged shards with their sizes, and the input recorded
    if "generation" not in meta or "input" not in meta:
        raise OlderDataset(f"{data_dir} was prepared by an older version of prepare.py: delete "
                           f"it, then run {_prepare_hint(data_dir)}")
    return meta


def prepare_default(data_dir):
    """The default dataset's first use: `python prepare.py` as a program, once (train.py and
    compare.py both call this; compare.py before it starts runs side by side, which would
    otherwise race for prepare.lock)."""
    if os.path.exists(os.path.join(data_dir, "meta.json")):
        return
    print(f"{data_dir} is not prepared yet: running python prepare.py (once, offline)", flush=True)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prepare.py")
    if subprocess.run([sys.executable, script]).returncode != 0:
        raise DataError("python prepare.py failed (see above); run it yourself to see why")


def data_identity(data_dir, meta):
    """What a checkpoint records of the data it trained on, so a resume can tell when the data
    changed: the directory, tokenizer, token counts, prepare.py's generation, and one sha256 over
    the shards' own (as meta.json records them; llm.c's shards: their names and sizes)."""
    if "shards" in meta:
        parts = [f"{s['split']}:{s.get('sha256') or s['tokens']}" for s in meta["shards"]]
    else:
        parts = [f"{os.path.basename(p)}:{os.path.getsize(p)}"
                 for split in ("train", "val") for p in list_shards(data_dir, split)]
    return {"dir": data_dir, "tokenizer": meta["tokenizer"], "generation": meta.get("generation"),
            "train_tokens": meta.get("train_tokens"), "val_tokens": meta.get("val_tokens"),
            "sha256": hashlib.sha256("\n".join(parts).encode()).hexdigest()}


def describe(data):
    """'generation 2: 8,718 train + 641 val tokens' from data_identity()."""
    if data.get("train_tokens") is None:  # llm.c's shards: no counts recorded
        return f"shards {data['sha256'][:12]}"
    return (f"generation {data['generation']}: {data['train_tokens']:,} train + "
            f"{data['val_tokens']:,} val tokens")


# -----------------------------------------------------------------------------
# writing any file whole, and reading a checkpoint

class DiskFull(OSError):
    """The disk filled up under a write: the scripts print it as one line."""


def disk_full(error):
    """Whether error, or one it arose from, is the OS saying the disk (or quota) is full."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False


def no_space(error, saved_iter, ckpt_path, log_path):
    """A full disk's one line: what failed, and which checkpoint is whole (other errors pass)."""
    if not disk_full(error):
        return error
    kept = (f"the checkpoint of step {saved_iter} is kept (free some space, then add --resume)"
            if saved_iter is not None else "the ckpt.pt already there is unchanged"
            if os.path.exists(ckpt_path) else "no checkpoint was saved")
    doing = f"saving {ckpt_path}" if isinstance(error, DiskFull) else f"writing {log_path}"
    return DiskFull(error.errno, f"no space left on device while {doing}; {kept}")


@contextlib.contextmanager
def atomic_write(path, mode="wb", fsync=False):
    """with atomic_write(path) as f: write to path.tmp, then rename it over path, so a reader (or
    a crash) sees the old file or the new one, never half of one; any failure removes path.tmp,
    and a full disk is DiskFull."""
    tmp = path + ".tmp"
    try:
        with open(tmp, mode) as f:
            yield f
            if fsync:  # on disk before it takes the name (shards, meta.json)
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if disk_full(e):
            raise DiskFull(errno.ENOSPC, f"no space left on device while writing {path}") from None
        raise


def load_checkpoint(path, map_location="cpu"):
    """train.py's checkpoint dict (weights without torch.compile's prefix), or a one-line error."""
    import torch  # here: prepare.py uses this module without torch
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}: train one first, "
                                f"e.g. python train.py --out_dir={os.path.dirname(path) or '.'}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} is not a readable torch checkpoint "
                         f"({type(e).__name__})") from None
    if isinstance(ckpt, dict) and str(ckpt.get("format")).startswith("value-residual-gpt/") \
            and ckpt["format"] != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} was written by an older version of train.py: retrain it")
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a checkpoint of this project "
                         f"(expected format {CHECKPOINT_FORMAT})")
    ckpt["model"] = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    return ckpt


# -----------------------------------------------------------------------------
# real words: how much of a sample is words of the training text (sample.py reports it)

WORD = re.compile(r"[A-Za-z]+")
WORD_SCAN_TOKENS = 10_000_000  # the vocabulary comes from at most this many training tokens


def words(text):
    """A text's words for the real-words share: runs of ASCII letters, lowercased."""
    return [w.lower() for w in WORD.findall(text)]


def training_vocabulary(data_dir, tokenizer, limit=WORD_SCAN_TOKENS):
    """(set of the words in a dataset's training text, tokens read): the train shards decoded with
    the dataset's tokenizer, end-of-text tokens left out, at most `limit` tokens."""
    vocabulary, seen = set(), 0
    for path in list_shards(data_dir, "train"):
        tokens = np.asarray(read_shard(path)[:limit - seen])
        seen += len(tokens)
        vocabulary.update(words(tokenizer.decode(tokens[tokens != tokenizer.eot])))
        if seen >= limit:
            break
    return vocabulary, seen


def real_word_share(text, vocabulary):
    """(share of the text's words that are in vocabulary, number of words, the same share among
    its distinct words: repeating one real word scores high on the first, not on the last)."""
    found, distinct = words(text), set(words(text))
    share = lambda ws: sum(w in vocabulary for w in ws) / len(ws) if ws else float("nan")
    return share(found), len(found), share(distinct)


def real_words(data_dir, tokenizer, samples):
    """(the report line, the share of real words, the share among distinct words) for samples
    given as lists of token ids."""
    vocabulary, scanned = training_vocabulary(data_dir, tokenizer)
    text = "\n".join(tokenizer.decode([t for t in s if t != tokenizer.eot]) for s in samples)
    share, n_words, distinct = real_word_share(text, vocabulary)
    scope = "" if scanned < WORD_SCAN_TOKENS else f" (its first {scanned:,} tokens)"
    if not n_words:
        return "real words: the samples hold no words", share, distinct
    return (f"real words: {share:.1%} of the {n_words:,} sampled words occur in the training text "
            f"of {data_dir}{scope}\nreal words among the distinct words: {distinct:.1%} "
            f"(repeating a few real words scores high above, not here)", share, distinct)
