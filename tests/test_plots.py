"""Tests for plots.py: what each picture draws (on made-up results, so no training is needed)."""
import json
import os

import numpy as np
import pytest
import torch

import compare
from lab import plots
import prepare
from model import GPT, GPTConfig
from shards import CHECKPOINT_FORMAT

pytest.importorskip("matplotlib")


@pytest.fixture
def figures(monkeypatch):
    """Every figure plots.py closes, kept so a test can look at what was drawn."""
    plt = plots.pyplot()
    kept, real_close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig) or real_close(fig))
    return kept


def made_up_results(n_layer, names=("vanilla", "resformer", "svformer")):
    """compare.per_mode()'s shape: 3 seeds, 41 evaluations of 40,960 tokens, per-layer measures
    near their limits (similarity close to 1, entropy close to 0) with wide spreads."""
    rng = np.random.default_rng(n_layer)
    tokens = [i * 40960 for i in range(41)]
    results = {}
    for k, name in enumerate(names):
        curves = [[2.1 + 3 * np.exp(-i / 8) + 0.01 * k + 0.01 * rng.standard_normal()
                   for i in range(41)] for _ in range(3)]
        results[name] = {
            "seeds": [1, 2, 3], "tokens": tokens, "curves": curves, "total_tokens": tokens[-1],
            "similarity": list(np.linspace(0.6, 0.97, n_layer)),
            "similarity_std": [0.1] * n_layer,
            "attention_entropy": list(np.linspace(0.05, 2, n_layer)),
            "attention_entropy_std": [0.3] * n_layer}
    return results


def made_up_maps(n_layer, names=("vanilla", "resformer", "svformer"), T=64):
    layers = sorted({0, n_layer // 2, n_layer - 1})
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    return {name: [(i + 1, uniform) for i in layers] for name in names}


def inside(fig, artist):
    """Is the artist wholly on the picture (drawn as savefig draws it)?"""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)  # a closed figure has lost its canvas
    canvas.draw()
    box = artist.get_window_extent(canvas.get_renderer())
    return box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y0 >= 0 and box.y1 <= fig.bbox.height


@pytest.mark.parametrize("n_layer", [2, 4, 16])
def test_attention_maps_fit_show_every_variant_and_a_colour_scale(tmp_path, figures, n_layer):
    """Issue 22: at 2 layers the title was cut at both edges, SVFormer was missing, and there
    was no colour scale."""
    plots.attention_maps(plots.pyplot(), str(tmp_path), made_up_maps(n_layer))
    fig = figures[-1]
    assert inside(fig, fig._suptitle), fig._suptitle.get_text()
    titles = [ax.get_title() for ax in fig.axes]
    assert f"svformer, layer {n_layer}" in titles and "vanilla, layer 1" in titles
    assert all(inside(fig, ax.title) for ax in fig.axes if ax.get_title())
    scales = [ax for ax in fig.axes if "attention weight" in ax.get_ylabel()]
    assert len(scales) == 1  # one colour bar for every map: they share vmin/vmax
    assert [t.get_text() for t in scales[0].get_yticklabels()][-1] == "1"


def test_attention_map_data_takes_every_variant_asked_for(tmp_path):
    data_dir = prepare.prepare(documents=["To be, or not to be.\n" * 40] * 10, name="t",
                               out_root=str(tmp_path), workers=1, quiet=True)
    grid, summaries = [], {}
    for mode in ("vanilla", "resformer", "svformer"):
        out_dir = tmp_path / mode
        os.makedirs(out_dir)
        model_args = dict(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=320,
                                    value_mode=mode).__dict__)
        torch.save({"format": CHECKPOINT_FORMAT, "model_args": model_args,
                    "model": GPT(GPTConfig(**model_args)).state_dict()}, out_dir / "ckpt.pt")
        grid.append(((mode, 1, ""), {"out_dir": str(out_dir), "dataset": data_dir,
                                     "block_size": 16}))
        summaries[mode, 1, ""] = {"status": "done"}
    maps = compare.attention_map_data(grid, summaries, ["vanilla", "resformer", "svformer"])
    assert list(maps) == ["vanilla", "resformer", "svformer"]
    assert [layer for layer, _ in maps["svformer"]] == [1, 2]
    assert maps["svformer"][0][1].shape == (16, 16)
    # a variant alone (no vanilla to pair with) still gets its maps
    assert list(compare.attention_map_data(grid, summaries, ["svformer"])) == ["svformer"]


@pytest.mark.parametrize("n_layer", [2, 4, 16])
def test_bands_stay_within_what_the_measure_can_be(tmp_path, figures, n_layer):
    """Issue 22: the +-1 std band of the similarity went above 1, the largest cosine."""
    plots.write_all(str(tmp_path), made_up_results(n_layer), {}, {})
    by_label = {ax.get_ylabel(): ax for fig in figures for ax in fig.axes}
    for label, (low, high) in (("how alike the tokens' hidden states are\n(mean pairwise cosine)",
                                (-1, 1)),
                               ("how widely attention is spread\n(entropy of attention received, "
                                "nats)", (0, np.inf))):
        ax = by_label[label]
        assert ax.get_xticks().tolist() == list(range(1, n_layer + 1))
        for band in ax.collections:
            y = np.concatenate([path.vertices[:, 1] for path in band.get_paths()])
            assert y.max() <= high + 1e-9 and y.min() >= low - 1e-9, label


def test_token_axes_read_in_units(tmp_path, figures):
    """Issue 22: the token axis showed a '1e6' offset instead of readable units."""
    plots.write_all(str(tmp_path), made_up_results(4), {}, {})
    loss = next(fig for fig in figures if fig.axes[0].get_ylabel() == "val loss (nats per token)")
    for ax in loss.axes:
        shown = ax.xaxis.get_major_formatter()
        assert [shown(x, 0) for x in (0, 800_000, 1_638_400, 2e9)] == ["0", "800k", "1.64M", "2B"]
    assert plots.token_units(1.6e6) == "1.6M"


def test_the_loss_axis_starts_where_curves_compare_and_lambdas_show_their_start(tmp_path,
                                                                                figures):
    """The first evaluations (loss ~5 here) would squash the part a class should look at."""
    results = made_up_results(4)
    results["resformer"]["mixing"] = {f"transformer.h.{i}.attn.value_lambdas": [0.6, 0.4]
                                      for i in (1, 2, 3)}
    results["resformer"]["escape"] = [[20, 409600], [40, 819200], None]
    plots.write_all(str(tmp_path), results, {}, {}, escape_loss=2.9)
    loss = next(fig for fig in figures if fig.axes[0].get_ylabel() == "val loss (nats per token)")
    first = max(np.mean(r["curves"], axis=0)[1] for r in results.values())  # about 4.8
    low, high = loss.axes[0].get_ylim()
    assert high < first - 0.3 and low < min(np.min(r["curves"]) for r in results.values())
    marks = [line for line in loss.axes[0].lines if line.get_marker() == "v"]
    assert [(list(m.get_xdata()), list(m.get_ydata())) for m in marks] == [([614400], [2.9])]
    labels = [t.get_text() for t in loss.axes[0].get_legend().get_texts()]
    assert "resformer (left the plateau on 2 of 3 seeds)" in labels and "vanilla" in labels
    assert labels.count("leaves the plateau (mean step of the seeds that left)") == 1
    lambdas = next(fig for fig in figures if fig.axes[0].get_ylabel() == "learned value")
    assert any(list(line.get_ydata()) == [0.5, 0.5] for line in lambdas.axes[0].lines)


def test_the_difference_panel_is_not_squashed_by_the_first_evaluations(tmp_path, figures):
    """resformer starts 2.0 below vanilla and settles 0.02 below: the panel shows the 0.02."""
    results = made_up_results(4, names=("vanilla", "resformer"))
    results["resformer"]["curves"] = [[v - (2.0 if i < 2 else 0.02) for i, v in enumerate(c)]
                                      for c in results["vanilla"]["curves"]]
    plots.write_all(str(tmp_path), results, {}, {})
    loss = next(fig for fig in figures if fig.axes[0].get_ylabel() == "val loss (nats per token)")
    low, high = loss.axes[1].get_ylim()
    assert -0.03 < low < -0.02 and 0 < high < 0.01


def test_without_vanilla_the_loss_picture_has_no_difference_panel(tmp_path, figures):
    plots.write_all(str(tmp_path), made_up_results(4, ("resformer", "svformer")), {},
                    made_up_maps(4, ("resformer", "svformer")))
    loss = next(fig for fig in figures if fig.axes[0].get_ylabel() == "val loss (nats per token)")
    assert len(loss.axes) == 1
    texts = [ax.get_title() + ax.get_ylabel() for fig in figures for ax in fig.axes]
    assert not any("vanilla" in t for t in texts)
    assert (tmp_path / "attention_maps.png").is_file()


def test_a_run_with_one_training_record_is_drawn(tmp_path, figures):
    """Issue 22: a training curve with one record drew nothing (a line needs two points)."""
    run = tmp_path / "run"
    run.mkdir()
    records = [{"kind": "config", "tokens_per_step": 2048},
               {"kind": "eval", "iter": 0, "tokens": 0, "val_loss": 5.6},
               {"kind": "train", "iter": 800, "loss": 2.1},
               {"kind": "eval", "iter": 800, "tokens": 800 * 2048, "val_loss": 2.2}]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plots.plot_logs([str(run)], str(tmp_path / "runs.png"))
    ax = figures[-1].axes[0]
    train, val = ax.get_lines()
    assert train.get_xydata().tolist() == [[800 * 2048, 2.1]]
    assert train.get_marker() not in (None, "", "None")  # a single point is visible
    assert ax.xaxis.get_major_formatter()(1_638_400, 0) == "1.64M"


def test_loss_against_size_draws_every_variant_with_its_fitted_line(tmp_path, figures):
    sweep = {}
    for n_layer, n in zip((2, 4, 8, 16), (1e5, 2e5, 4e5, 8e5)):
        sweep[f"n_layer={n_layer}"] = {
            name: {"num_params": int(n), "seeds": [1, 2, 3],
                   "val_loss": [5 - 0.2 * np.log(n * scale) + d for d in (-0.01, 0, 0.01)],
                   "val_loss_mean": 5 - 0.2 * np.log(n * scale)}
            for name, scale in (("vanilla", 1.0), ("resformer", 1.25))}
    path = plots.size_figure(plots.pyplot(), str(tmp_path), sweep)
    assert os.path.isfile(path) and path.endswith("params.png")
    ax = figures[-1].axes[0]
    assert ax.get_xscale() == "log" and len(ax.lines) == 2
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == "vanilla" and "20.0% fewer parameters" in labels[1]
    # the fitted line goes through the means
    assert ax.lines[1].get_ydata()[0] == pytest.approx(5 - 0.2 * np.log(1.25e5))
