"""Fixtures the test files share: GPT-2's tokenizer from the developers' offline copy."""
from pathlib import Path

import pytest

import data

# read-only test data (GPT-2 BPE ranks, Tiny Shakespeare): ../shared/data, see ../shared/README.md
SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


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
    """The GPT-2 tokenizer, its BPE file from the offline copy (data.tiktoken_encoding swapped)."""
    monkeypatch.setattr(data, "tiktoken_encoding", lambda name: gpt2_encoding)
    return data.get_tokenizer("gpt2")
