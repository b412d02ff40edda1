"""docs/value_residual.ipynb runs top to bottom (with tiny settings in its parameters cell), so
it cannot rot. Needs the test extras (tests/requirements.txt: nbclient, ipykernel, matplotlib)."""
import os

import pytest

import prepare
from configurator import defaults

nbformat = pytest.importorskip("nbformat", reason="pip install -r tests/requirements.txt")
nbclient = pytest.importorskip("nbclient", reason="pip install -r tests/requirements.txt")
pytest.importorskip("ipykernel", reason="pip install -r tests/requirements.txt")
pytest.importorskip("matplotlib", reason="pip install -r tests/requirements.txt")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "docs", "value_residual.ipynb")


def test_the_notebook_runs_and_shows_every_result(tmp_path):
    docs = [f"ROMEO:\nBut soft, what light through yonder window breaks, line {i}.\n" * 6
            for i in range(30)]
    data = prepare.prepare(defaults(prepare.SETTINGS, name="t", out_root=str(tmp_path / "data"),
                                    quiet=True), documents=docs)
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
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    images = sum("image/png" in o.get("data", {}) for o in outputs)
    assert images == 3  # the cache bars, the curves, the attention maps
    assert "value = lambda_1 * first_value + lambda_2 * v" in text  # the switch of the modes
    assert "value = (1 - lam) * v + lam * table" in text
    assert "ours (2 x 16, 32 tokens)" in text  # the cache's label says the settings it ran at
    assert text.count("    iter ") >= 2  # train.py's progress, streamed as it trains
    assert "value_embed  total" in text and "active per token" in text  # what came after
    assert "SVFormer / vanilla = 0.542" in text  # (L + 1) / (2L) at GPT-2 small's L = 12
    assert text.count("val loss over the whole validation split") == 2
    assert "left the plateau" in text and "real words:" in text
    assert (tmp_path / "runs" / "resformer" / "ckpt.pt").exists()
