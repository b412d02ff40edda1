"""Fixtures the test files share: GPT-2's tokenizer from the developers' offline copy, a small
byte-level dataset of made-up plays, the tiny model's settings, and compare.py's runs trained in
this process."""
import contextlib
import traceback
from pathlib import Path

import pytest

import configurator
import data
import prepare

# read-only test data (GPT-2 BPE ranks, Tiny Shakespeare): ../shared/data, see ../shared/README.md
SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# A model small enough that a run of ten steps takes a fraction of a second.
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4",
        "--eval_iters=2", "--log_interval=5", "--warmup_iters=2", "--device=cpu"]
# Made-up plays: 24 documents of a few thousand bytes, so 2 or 3 are held out whole.
PLAYS = ["".join(f"KING {i % 7}:\nWhat say you, my lord {d}, of the {i % 13} ships?\n\n"
                 for i in range(60 + 3 * d)) for d in range(24)]


@pytest.fixture(scope="session")
def gpt2_encoding():
    """GPT-2's BPE from the developers' offline copy (tiktoken cannot download it here)."""
    if not (SHARED / "gpt2.tiktoken").exists():
        pytest.skip(f"needs {SHARED / 'gpt2.tiktoken'} (tiktoken cannot download GPT-2 offline)")
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT,
                             mergeable_ranks=load_tiktoken_bpe(str(SHARED / "gpt2.tiktoken")),
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


@pytest.fixture
def gpt2(monkeypatch, gpt2_encoding):
    """The GPT-2 tokenizer, its BPE file from the offline copy (tiktoken.get_encoding swapped)."""
    import tiktoken
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: gpt2_encoding)
    return data.get_tokenizer("gpt2")


@pytest.fixture(scope="session")
def plays(tmp_path_factory):
    """The made-up plays as prepare.py makes a dataset of them: its folder's path."""
    root = tmp_path_factory.mktemp("data")
    cfg = configurator.parse_args(prepare.SETTINGS, [f"--out_root={root}", "--dataset=plays",
                                                     "--quiet"], "")
    return prepare.prepare(cfg, documents=PLAYS)


class Finished:
    """What run_grid reads of a process that has ended: poll() and returncode."""

    def __init__(self, returncode):
        self.returncode = returncode

    def poll(self):
        return self.returncode


def run_in_process(args, stdout, **_):
    """lab.runs.launch's stand-in: `python train.py ...`, `-m lab.nudged ...` or `-m
    lab.evaluate ...` run to its end in this process, its output into the run's train.out, its
    exit status as configurator.run_main would give it."""
    import train
    from lab import evaluate, nudged
    program, argv = (args[2], args[3:]) if args[1] == "-m" else ("train", args[2:])
    main = {"train": train.main, "lab.nudged": nudged.main, "lab.evaluate": evaluate.main}[program]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stdout):
        try:
            main(argv)
            return Finished(0)
        except configurator.UserError as e:
            print(f"error: {e}")
            return Finished(1)
        except KeyboardInterrupt:
            return Finished(130)
        except Exception:
            traceback.print_exc()
            return Finished(1)


@pytest.fixture
def in_process(monkeypatch):
    """compare.py's runs trained in this process: seconds, not a Python with torch per run."""
    from lab import runs
    monkeypatch.setattr(runs, "launch", run_in_process)
