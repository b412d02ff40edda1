"""docs/value_residual.ipynb runs top to bottom (with tiny settings in its parameters cell), so
it cannot rot. Needs matplotlib (requirements.txt) and the test extras (tests/requirements.txt)."""
import json
import os
import re

import pytest

import model
import prepare
from configurator import parse_args
from lab.tables import label

nbformat = pytest.importorskip("nbformat", reason="pip install -r tests/requirements.txt")
nbclient = pytest.importorskip("nbclient", reason="pip install -r tests/requirements.txt")
pytest.importorskip("ipykernel", reason="pip install -r tests/requirements.txt")
pytest.importorskip("matplotlib", reason="pip install -r requirements.txt")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "docs", "value_residual.ipynb")

NUMBER_WORDS = {w: n for n, w in enumerate(
    "zero one two three four five six seven eight nine ten".split())}
# A cell's last expression that Jupyter displays as Out[n] when it is a number: 0.4333, 42,
# np.float64(0.43), tensor(0.43, grad_fn=<MulBackward0>), nan
BARE_NUMBER = re.compile(r"(?:[\w.]+\()?[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?(?:,[^()]*)?\)?"
                         r"|[-+]?(?:nan|inf)", re.IGNORECASE)


def stray_numbers(nb):
    """(cell index, text) of every displayed value that is a bare number: a function's return
    value left as a cell's last expression, shown beside what the cell printed."""
    return [(i, o["data"]["text/plain"]) for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.outputs if o["output_type"] == "execute_result"
            and BARE_NUMBER.fullmatch(o["data"].get("text/plain", "").strip())]


def test_the_text_counts_the_value_modes_right():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    counts = [(m.group(0), m.group(1).lower()) for c in nb.cells if c.cell_type == "markdown"
              for m in re.finditer(r"\b(\w+) value modes\b", c.source, re.IGNORECASE)]
    counts = [(said, int(n) if n.isdigit() else NUMBER_WORDS[n]) for said, n in counts
              if n.isdigit() or n in NUMBER_WORDS]
    assert counts, "the notebook no longer says how many value modes there are"
    assert all(n == len(model.VALUE_MODES) for _, n in counts), \
        (counts, f"model.VALUE_MODES has {len(model.VALUE_MODES)}: {', '.join(model.VALUE_MODES)}")


def test_no_committed_output_is_a_stray_number():
    assert stray_numbers(nbformat.read(NOTEBOOK, as_version=4)) == []


def test_the_pictures_the_notebook_and_the_readme_show_are_committed_files():
    """The gap along training is linked, not pasted in: what a reader sees is the committed
    picture, which the size-curve command of docs/RESULTS.md redraws from its records."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for folder, text in (("docs", "".join(c.source for c in nb.cells)),
                         ("", open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())):
        shown = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
        assert "results/size_curve/loss.png" in " ".join(shown), folder
        assert all(os.path.isfile(os.path.join(ROOT, folder, path)) for path in shown), shown


def test_the_number_pattern_finds_what_jupyter_shows():
    assert all(BARE_NUMBER.fullmatch(t) for t in ("0.43333333333333335", "42", "-1e-05", "nan",
                                                  "np.float64(0.43)", "tensor(0.4333)",
                                                  "tensor(0.43, grad_fn=<MulBackward0>)"))
    assert not any(BARE_NUMBER.fullmatch(t) for t in ("<Figure size 700x260 with 1 Axes>",
                                                      "(0.4, 0.5)", "[1, 2]", "'0.4'"))


def test_the_notebook_runs_and_shows_every_result(tmp_path):
    docs = [f"ROMEO:\nBut soft, what light through yonder window breaks, line {i}.\n" * 6
            for i in range(30)]
    data = prepare.prepare(parse_args(prepare.SETTINGS, ["--dataset=t", "--quiet",
                                                         f"--out_root={tmp_path / 'data'}"], ""),
                           documents=docs)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    parameters = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1
    parameters[0].source = (f"MAX_ITERS = 8\nLEARNING_RATE = 3e-3\nN_LAYER, N_EMBD = 2, 16\n"
                            f"BATCH_SIZE, BLOCK_SIZE = 4, 32\nSEED = 1\nDATASET = {data!r}\n"
                            f"OUT_ROOT = {str(tmp_path / 'runs')!r}\n")
    # the kernel draws inline, as in Jupyter, whatever backend the tests' environment names
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": os.path.join(ROOT, "docs")}}
                                ).execute()
    finally:
        os.environ.pop("MPLBACKEND")
    assert stray_numbers(nb) == []  # every result is printed; no cell ends in a bare value
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    images = sum("image/png" in o.get("data", {}) for o in outputs)
    assert images == 4  # the cache bars, the curves, the attention maps, the "less data" one
    assert "value = lambda_1 * first_value + lambda_2 * v" in text  # the switch of the modes
    assert "value = (1 - lam) * v + lam * e.to(v.dtype)" in text
    assert "ours (2 x 16, 32 tokens)" in text  # the cache's label says the settings it ran at
    assert text.count("    iter ") >= 2  # train.py's progress, streamed as it trains
    assert "value_embed  total" in text and "active per token" in text  # what came after
    # ... and the size-curve campaign's committed table: every mean final loss, lowest first,
    # then (where vanilla's sizes lie near one line) each variant read off that line
    with open(os.path.join(ROOT, "docs", "results", "size_curve", "results.json")) as f:
        table = json.load(f)
    curve, modes = table["vanilla_curve"], table["modes"]
    ladder = sorted([*curve["sizes"], *curve["placed"]], key=lambda n: modes[n]["val_loss_mean"])
    printed = [line.split()[0] for line in text.splitlines() if line.endswith(" parameters")]
    assert printed == [f"{modes[n]['val_loss_mean']:.4f}" for n in ladder]
    assert "learned λ_n, from 0.5" in text
    mix = modes["resformer:lambda_1=2:lambda_2=1"]  # ... and its "less data", seed by seed
    shares = [c / modes["vanilla"]["total_tokens"] for c in mix["crossing_tokens"] if c]
    assert f"each seed's own crossing, averaged: {sum(shares) / len(shares):.0%}" in text
    if curve["poor"]:
        assert "The line through" not in text and "vanilla itself" not in text
    else:
        assert f"  vanilla itself: {1 + curve['vanilla_reading']:.2f}, as its own point" in text
        for name, p in curve["placed"].items():
            assert f"{label(name)}: {1 + p['larger']:.2f}" in text
    assert "SVFormer / vanilla = 0.542" in text  # (L + 1) / (2L) at GPT-2 small's L = 12
    assert text.count("val loss over the whole validation split") == 2
    assert "left the plateau" in text and "real words:" in text
    assert (tmp_path / "runs" / "resformer" / "ckpt.pt").exists()
