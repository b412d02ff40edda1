"""Tests for lab/plots.py: what each picture draws (on made-up results: no training needed)."""
import json
import os

import numpy as np
import pytest

from lab import plots
from lab.analysis import FLOOR

pytest.importorskip("matplotlib")


@pytest.fixture
def figures(monkeypatch):
    """Every figure plots.py closes, kept so a test can look at what was drawn."""
    plt = plots.pyplot()
    kept, real_close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig) or real_close(fig))
    return kept


def made_up_results(n_layer, names=("vanilla", "resformer", "svformer")):
    """compare.per_mode()'s shape: 3 seeds, 41 evaluations every 20 steps of 2,048 tokens,
    per-layer measures near their limits (similarity close to 1, entropy close to 0) with wide
    spreads."""
    rng = np.random.default_rng(n_layer)
    steps = [i * 20 for i in range(41)]
    results = {}
    for k, name in enumerate(names):
        curves = [[2.1 + 3 * np.exp(-i / 8) + 0.01 * k + 0.01 * rng.standard_normal()
                   for i in range(41)] for _ in range(3)]
        results[name] = {
            "seeds": [1, 2, 3], "steps": steps, "tokens": [s * 2048 for s in steps],
            "tokens_per_step": 2048, "curves": curves, "num_params": 100_000 + 1000 * k,
            "total_tokens": steps[-1] * 2048,
            "similarity": list(np.linspace(0.6, 0.97, n_layer)),
            "similarity_std": [0.1] * n_layer,
            "attention_entropy": list(np.linspace(0.05, 2, n_layer)),
            "attention_entropy_std": [0.3] * n_layer}
    return results


def inside(fig, *artists):
    """Are the artists wholly on the picture (drawn once, as savefig draws it)?"""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)  # a closed figure has lost its canvas
    canvas.draw()
    boxes = [artist.get_window_extent(canvas.get_renderer()) for artist in artists]
    return all(box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y0 >= 0
               and box.y1 <= fig.bbox.height for box in boxes)


def loss_picture(figures):
    return next(fig for fig in figures if fig.axes[0].get_ylabel() == "val loss (nats per token)")


def legend_of(ax):
    """The legend's entries, each as one line (save() wraps long ones)."""
    return [t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("n_layer", [2, 4, 16])
def test_bands_stay_within_what_the_measure_can_be(tmp_path, figures, n_layer):
    """Issue 22: the +-1 std band of the similarity went above 1, the largest cosine."""
    plots.write_all(str(tmp_path), made_up_results(n_layer))
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


def test_the_loss_picture_is_against_steps_and_token_axes_read_in_units(tmp_path, figures):
    """The loss picture's x-axis is steps, the tokens of one step in its label; where an axis is
    in tokens it reads in units, not with matplotlib's '1e6' offset (issue 22)."""
    results = made_up_results(4)
    plots.write_all(str(tmp_path), results)
    loss = loss_picture(figures)
    assert loss.axes[-1].get_xlabel() == "step (2,048 tokens each)"
    assert list(loss.axes[0].lines[0].get_xdata()) == results["vanilla"]["steps"][1:]  # not 0
    shown = plots.token_units
    assert [shown(x, 0) for x in (0, 800_000, 1_638_400, 2e9)] == ["0", "800k", "1.64M", "2B"]


def test_the_loss_axis_starts_where_curves_compare_and_mixing_shows_its_start(tmp_path,
                                                                              figures):
    """The first evaluations (loss ~5 here) would squash the part a class should look at; the
    plateau triangles have one legend entry; the learned mixing weights' picture marks 0.5."""
    results = made_up_results(4)
    results["resformer"]["mixing"] = {f"transformer.h.{i}.attn.value_lambdas": [0.6, 0.4]
                                      for i in (1, 2, 3)}
    results["resformer"]["escape"] = [[20, 40960], [40, 81920], None]
    paths = plots.write_all(str(tmp_path), results, escape_loss=2.9)
    assert os.path.join(str(tmp_path), "mixing.png") in paths
    assert not (tmp_path / "lambdas.png").exists()
    loss = loss_picture(figures)
    first = max(np.mean(r["curves"], axis=0)[1] for r in results.values())  # about 4.8
    low, high = loss.axes[0].get_ylim()
    assert high < first - 0.3 and low < min(np.min(r["curves"]) for r in results.values())
    marks = [line for line in loss.axes[0].lines if line.get_marker() == "v"]
    assert [(list(m.get_xdata()), list(m.get_ydata())) for m in marks] == [([30], [2.9])]
    labels = legend_of(loss.axes[0])
    assert "ResFormer (left the plateau on 2 of 3 seeds)" in labels and "vanilla" in labels
    assert labels.count("leaves the plateau: the first evaluation below the dotted line (2.9), "
                        "mean over the seeds that left") == 1
    mixing = next(fig for fig in figures if fig.axes[0].get_ylabel() == "learned value")
    assert any(list(line.get_ydata()) == [0.5, 0.5] for line in mixing.axes[0].lines)
    assert [list(line.get_ydata()) for line in mixing.axes[0].lines[:2]] == [[0.6] * 3, [0.4] * 3]
    assert legend_of(mixing.axes[0])[:2] == ["ResFormer: lambda_1", "ResFormer: lambda_2"]


def test_the_difference_panel_is_not_squashed_by_the_first_evaluations(tmp_path, figures):
    """resformer and svformer start 2.0 below vanilla and settle 0.02 below: the panel shows
    the 0.02 (one early outlier on each curve)."""
    results = made_up_results(4)
    for name in ("resformer", "svformer"):
        results[name]["curves"] = [[v - (2.0 if i < 2 else 0.02) for i, v in enumerate(c)]
                                   for c in results["vanilla"]["curves"]]
    plots.write_all(str(tmp_path), results)
    low, high = loss_picture(figures).axes[1].get_ylim()
    assert -0.03 < low < -0.02 and 0 < high < 0.01


def test_the_difference_panel_is_not_flattened_by_one_outlier(tmp_path, figures):
    """One evaluation mid-run 1.0 above vanilla (a loss spike), the rest 0.02 below: the
    panel's range comes from the 2nd-98th percentile of the gaps, so the 0.02 stays readable."""
    results = made_up_results(4, names=("vanilla", "resformer"))
    results["resformer"]["curves"] = [[v + (1.0 if i == 20 else -0.02) for i, v in enumerate(c)]
                                      for c in results["vanilla"]["curves"]]
    plots.write_all(str(tmp_path), results)
    bottom = loss_picture(figures).axes[1]
    low, high = bottom.get_ylim()
    assert -0.03 < low < -0.02 and 0 < high < 0.01
    gap = bottom.lines[0].get_ydata()  # the spike is still drawn, off the panel
    assert max(gap) == pytest.approx(1.0)


def test_without_vanilla_the_loss_picture_has_no_difference_panel(tmp_path, figures):
    plots.write_all(str(tmp_path), made_up_results(4, ("resformer", "svformer")))
    loss = loss_picture(figures)
    assert len(loss.axes) == 1
    texts = [ax.get_title() + ax.get_ylabel() for fig in figures for ax in fig.axes]
    assert not any("vanilla" in t for t in texts)


def test_shrunk_runs_keep_their_curves_inside_the_picture(tmp_path, figures):
    """A run shrunk for a quick look: 3 evaluations (steps 0, 1, 2) whose loss never gets below
    the escape line. The top panel's range holds every curve drawn, mean and band; the escape
    line, far below, does not stretch it."""
    results = made_up_results(4, names=("vanilla", "resformer"))
    for k, r in enumerate(results.values()):
        r.update(seeds=[1, 2], steps=[0, 1, 2], tokens=[0, 64, 128], tokens_per_step=64,
                 curves=[[5.6, 5.5 - 0.01 * k + d, 5.45 - 0.01 * k + d] for d in (0, 0.02)],
                 escape=[None, None])
    plots.write_all(str(tmp_path), results, escape_loss=2.9)
    top = loss_picture(figures).axes[0]
    low, high = top.get_ylim()
    drawn = np.concatenate([line.get_ydata() for line in top.lines]
                           + [path.vertices[:, 1] for band in top.collections
                              for path in band.get_paths()])
    assert low <= drawn.min() and drawn.max() <= high, (low, high, drawn)
    assert low > 5.0  # not stretched down to the escape line at 2.9
    assert "ResFormer (left the plateau on 0 of 2 seeds)" in legend_of(top)


def test_titles_fit_the_pictures(tmp_path, figures):
    """No title is cut at the picture's edge: the per-layer measures' long titles wrap."""
    plots.write_all(str(tmp_path), made_up_results(4))
    entropy = next(fig for fig in figures if "entropy" in fig.axes[0].get_ylabel())
    assert "\n" in entropy.axes[0].get_title()  # wrapped, not one long line
    for fig in figures:
        titles = [ax.title for ax in fig.axes if ax.get_title()]
        assert titles and inside(fig, *titles), [t.get_text() for t in titles]


def test_labels_read_as_a_class_reads_them():
    """The pictures name a variant in words; the tables keep the exact name."""
    assert plots.label("resformer:lambda_1=2:lambda_2=1") == "ResFormer, λ = 2"
    assert plots.label("svformer_kv1") == "SVFormer, 1 KV head"
    assert plots.label("svformer_kv2") == "SVFormer, 2 KV heads"
    assert plots.label("value_embed") == "value embeddings"
    assert plots.label("resformer_learnable") == "ResFormer, learned λ"
    assert plots.label("vanilla:n_embd=24") == "vanilla, n_embd = 24"
    assert plots.label("resformer:max_iters=170", "85% of the tokens") == (
        "ResFormer, 85% of the tokens")  # the note replaces the settings
    assert plots.label("not_a_mode") == "not_a_mode"


def test_the_loss_legend_names_the_variants_in_words(tmp_path, figures):
    names = ("vanilla", "resformer:lambda_1=2:lambda_2=1", "svformer_kv1", "value_embed",
             "resformer:max_iters=34")
    results = made_up_results(4, names=names)
    results["resformer:max_iters=34"]["note"] = "85% of the tokens"
    plots.write_all(str(tmp_path), results)
    loss = loss_picture(figures)
    expected = ["vanilla", "ResFormer, λ = 2", "SVFormer, 1 KV head", "value embeddings",
                "ResFormer, 85% of the tokens"]
    assert legend_of(loss.axes[0]) == expected
    # the difference panel: all but vanilla, and what its thin lines are
    assert legend_of(loss.axes[1]) == expected[1:] + ["thin lines: each seed"]


def write_log(run_dir, evals, partial=""):
    """A log.jsonl as train.py writes it while it trains (partial: a line being written)."""
    os.makedirs(run_dir, exist_ok=True)
    records = [{"kind": "config", "iter": 0, "tokens_per_step": 64}] + [
        {"kind": "eval", "iter": step, "tokens": 64 * step, "val_loss": loss}
        for step, loss in evals]
    with open(os.path.join(run_dir, "log.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + partial)


def test_the_live_picture_cuts_the_seeds_to_the_step_all_reached(tmp_path, figures):
    """live_loss draws loss.png from the logs of runs still training: vanilla's seed 1 at step
    40 and seed 2 at step 20 give a curve to step 20 (their mean); a run with one evaluation is
    not drawn yet, nor one without a log; a line being written is skipped."""
    root = str(tmp_path)
    curves = {("vanilla", 1): [(0, 5.5), (10, 4.0), (20, 3.0), (30, 2.8), (40, 2.6)],
              ("vanilla", 2): [(0, 5.5), (10, 4.2), (20, 3.2)],
              ("resformer", 1): [(0, 5.5), (10, 3.9), (20, 2.9), (30, 2.7)],
              ("resformer", 2): [(0, 5.5)],  # one evaluation: nothing to draw yet
              ("svformer", 1): None}  # not started
    grid = []
    for (name, seed), evals in curves.items():
        run_dir = os.path.join(root, f"{name}_seed{seed}")
        if evals is not None:
            write_log(run_dir, evals, partial='{"kind": "eval", "iter": 5' if seed == 1 else "")
        grid.append(((name, seed, ""), {"out_dir": run_dir}))
    assert plots.live_loss(root, grid, escape_loss=2.9) == os.path.join(root, "loss.png")
    assert os.path.isfile(os.path.join(root, "loss.png"))
    assert not os.path.exists(os.path.join(root, "loss.live.png"))  # renamed into place
    top, bottom = loss_picture(figures).axes
    vanilla, resformer = top.lines[:2]
    assert list(vanilla.get_xdata()) == [10, 20]  # cut to seed 2's step 20 (step 0 not drawn)
    assert list(vanilla.get_ydata()) == pytest.approx([4.1, 3.1])
    assert list(resformer.get_xdata()) == [10, 20, 30]  # only its seed 1 has 2+ evaluations
    # on the steps drawn (to 20) no vanilla seed has left the plateau yet (below 2.9)
    assert legend_of(top)[:2] == ["vanilla (left the plateau on 0 of 2 seeds)", "ResFormer"]
    assert "SVFormer" not in " ".join(legend_of(top))
    # the difference panel pairs resformer's seed 1 with vanilla's, on the steps both have
    assert list(bottom.lines[0].get_ydata()) == pytest.approx([-0.1, -0.1])
    # nothing logged yet: no picture, no error
    empty = tmp_path / "empty"
    empty.mkdir()
    assert plots.live_loss(str(empty), [(("vanilla", 1, ""), {"out_dir": str(empty / "v")})]) \
        is None
    assert not (empty / "loss.png").exists()


def test_the_live_picture_leaves_out_the_papers_protocol_runs(tmp_path, figures):
    """Under --tune every variant trains again at vanilla's best lr (the paper's protocol): the
    live picture, like the final one, shows the variants at their own lr, not a mean of both."""
    root = str(tmp_path)
    grid = []
    for point, loss in (("", 3.0), ("paper", 2.0)):
        for name in ("vanilla", "resformer"):
            run_dir = os.path.join(root, f"{point}_{name}_seed1")
            write_log(run_dir, [(0, 5.5), (10, loss), (20, loss - 0.1)])
            grid.append(((name, 1, point), {"out_dir": run_dir}))
    plots.live_loss(root, grid)
    top = loss_picture(figures).axes[0]
    assert list(top.lines[0].get_ydata()) == pytest.approx([3.0, 2.9])


def test_the_size_curve_places_each_variant_on_vanillas_line(tmp_path, figures):
    """size_curve.png: vanilla's line loss = 5 - 0.2 ln N through 3 sizes, ResFormer (150k
    parameters) at the loss of a 300k vanilla: '+100% larger', an arrow from 150k to 300k; the
    less-data variant named by its note."""
    results = {}
    for name, n in (("vanilla:n_embd=8", 1e5), ("vanilla", 2e5), ("vanilla:n_embd=24", 4e5)):
        results[name] = {"num_params": int(n), "seeds": [1, 2],
                         "val_loss": [5 - 0.2 * np.log(n) + d for d in (-0.01, 0.01)]}
    results["resformer"] = {"num_params": 150_000, "seeds": [1, 2],
                            "val_loss": [5 - 0.2 * np.log(3e5) + d for d in (-0.02, 0.02)]}
    results["resformer:max_iters=170"] = {"num_params": 150_000, "seeds": [1, 2],
                                          "val_loss": [5 - 0.2 * np.log(4.5e5)] * 2,
                                          "note": "85% of the tokens"}
    for r in results.values():
        r["val_loss_mean"] = float(np.mean(r["val_loss"]))
    path = plots.curve_figure(plots.pyplot(), str(tmp_path), results)
    assert path == os.path.join(str(tmp_path), "size_curve.png") and os.path.isfile(path)
    ax = figures[-1].axes[0]
    assert legend_of(ax) == ["vanilla, 3 sizes (dots: seeds)",
                             "ResFormer: as good as a vanilla model 100% larger",
                             "ResFormer, 85% of the tokens: as good as a vanilla model 200% larger"]
    line = ax.lines[0]
    assert line.get_ydata()[0] == pytest.approx(5 - 0.2 * np.log(line.get_xdata()[0]))
    arrow = ax.texts[0]  # annotate: from the variant's own parameters to the matched ones
    assert arrow.xy == pytest.approx((3e5, results["resformer"]["val_loss_mean"]), rel=1e-6)
    assert arrow.xyann == pytest.approx((1.5e5, results["resformer"]["val_loss_mean"]))
    assert ax.xaxis.get_major_formatter()(3e5, 0) == "300k"
    assert not any("floor" in text for text in legend_of(ax))  # no floor trained: no band


def test_a_size_curve_that_bends_draws_the_points_and_reads_nothing_off(tmp_path, figures):
    """Vanilla's largest size no lower than the middle one: the table reads nothing off a line
    the points do not follow, so neither does the picture (no arrow, no 'as good as')."""
    results = size_results()
    results["vanilla:n_embd=24"]["val_loss"] = list(results["vanilla"]["val_loss"])
    results["vanilla:n_embd=24"]["val_loss_mean"] = results["vanilla"]["val_loss_mean"]
    plots.curve_figure(plots.pyplot(), str(tmp_path), results)
    ax = figures[-1].axes[0]
    labels = legend_of(ax)
    assert labels[0].startswith("vanilla, 3 sizes (grey dots: seeds): not on one line (R² ") and labels[0].endswith(
        "so no reading") and labels[1:] == ["ResFormer"]
    assert not ax.texts  # no arrow
    joined = ax.lines[0]
    assert list(joined.get_xdata()) == [1e5, 2e5, 4e5]
    assert list(joined.get_ydata()) == pytest.approx(
        [results[n]["val_loss_mean"] for n in ("vanilla:n_embd=8", "vanilla", "vanilla:n_embd=24")])


def test_the_size_curve_draws_the_noise_floor_as_a_band_along_the_line(tmp_path, figures):
    """With the floor trained, the line carries a grey band of ±floor: a variant inside it is
    within what rounding alone does."""
    results = size_results()
    results[FLOOR] = {**results["vanilla"], "seeds": [1], "paired": {"differences": [-0.03]},
                      "note": "nudged one rounding step: the noise floor"}
    plots.curve_figure(plots.pyplot(), str(tmp_path), results)
    ax = figures[-1].axes[0]
    assert "rounding floor (±0.030)" in legend_of(ax)
    band = next(c for c in ax.collections if c.get_label() == "rounding floor (±0.030)")
    line = ax.lines[0]
    for x, (low, high) in band_edges(band).items():
        on_line = 5 - 0.2 * np.log(x)  # the fitted line, the band's middle at every x
        assert (low, high) == pytest.approx((on_line - 0.03, on_line + 0.03), abs=1e-6)
    assert len(band_edges(band)) >= len(line.get_xdata())
    assert not any("noise floor" in text for text in legend_of(ax))  # never placed as a variant
    # ResFormer on the line at its own size: within a floor worth exp(0.03 / 0.2) - 1 = 16%
    assert ("ResFormer: as good as a vanilla model 0% smaller (within the rounding floor)"
            in legend_of(ax))
    resformer = results["resformer"]  # now at a 300k vanilla's loss: 100% larger, beyond it
    resformer["val_loss"] = [5 - 0.2 * np.log(3e5)] * 2
    resformer["val_loss_mean"] = resformer["val_loss"][0]
    plots.curve_figure(plots.pyplot(), str(tmp_path), results)
    assert "ResFormer: as good as a vanilla model 100% larger" in legend_of(figures[-1].axes[0])


def test_the_lr_search_marks_a_best_at_the_grids_edge(tmp_path, figures):
    """A U-curve whose lowest point is an end of the grid is not an optimum: its ring is dashed
    and the legend says so; a bracketed best reads 'best'."""
    search = {"vanilla": {1e-3: [2.5, 2.6], 2e-3: [2.2, 2.3], 4e-3: [2.4, 2.5]},
              "resformer": {1e-3: [2.5, 2.6], 2e-3: [2.3, 2.4], 4e-3: [2.1, 2.2]}}
    plots.lr_figure(plots.pyplot(), str(tmp_path), search)
    labels = legend_of(figures[-1].axes[0])
    assert "vanilla: best 0.002" in labels
    assert "ResFormer: lowest at the grid's edge, 0.004 (not bracketed)" in labels
    assert (tmp_path / "lr_search.png").is_file()


# ---- the noise floor, units, seeds, the live picture's marks, legends (issue: pictures say
# what they show) ----

def with_floor(results, offsets):
    """results plus analysis.FLOOR's runs: vanilla's curves on its first seeds, each moved by
    offsets[seed index][step index] (what rounding alone did)."""
    base = results["vanilla"]
    results[FLOOR] = {**base, "seeds": base["seeds"][:len(offsets)],
                      "curves": [list(np.array(c) + np.array(d))
                                 for c, d in zip(base["curves"], offsets)],
                      "note": "nudged one rounding step: the noise floor"}
    return results


def band_edges(collection):
    """{x: (lowest y, highest y)} of a fill_between's outline."""
    edges = {}
    for x, y in np.concatenate([path.vertices for path in collection.get_paths()]):
        low, high = edges.get(x, (y, y))
        edges[x] = (min(low, y), max(high, y))
    return edges


def test_the_noise_floor_is_a_grey_band_in_the_difference_panel_not_a_line(tmp_path, figures):
    """FLOOR (vanilla nudged one rounding step) is vanilla again: no line of its own on top, nor
    in the per-layer pictures; in the difference panel a band from -|d| to +|d| around 0, d =
    FLOOR's curve minus vanilla's on the same seed, the largest |d| of its seeds at each step
    (seed 1 moved +0.004 on even evaluations, +0.001 on odd ones, seed 2 -0.002 on all). The
    panel's range holds the band although ResFormer's gap (-0.001) is smaller."""
    results = made_up_results(4, names=("vanilla", "resformer"))
    results["resformer"]["curves"] = [[v - 0.001 for v in c] for c in results["vanilla"]["curves"]]
    with_floor(results, [[0.004 if i % 2 == 0 else 0.001 for i in range(41)], [-0.002] * 41])
    plots.write_all(str(tmp_path), results)
    top, bottom = loss_picture(figures).axes
    assert legend_of(top) == ["vanilla", "ResFormer"]
    assert len([line for line in top.lines if len(line.get_xdata()) > 1]) == 2
    bands = [c for c in bottom.collections if c.get_label().startswith(plots.FLOOR_LABEL)]
    assert len(bands) == 1
    assert "rounding alone, around 0 (vanilla nudged one float32 step): another CPU, not another "\
           "seed " \
           "(2 seeds, at most ±0.004)" \
        in legend_of(bottom)
    edges = band_edges(bands[0])
    steps = results["vanilla"]["steps"]
    assert sorted(edges) == steps[1:]  # step 0 is not drawn, as on top
    for i, step in enumerate(steps[1:], 1):
        half = 0.004 if i % 2 == 0 else 0.002
        assert edges[step] == pytest.approx((-half, half)), step
    low, high = bottom.get_ylim()
    assert low < -0.004 and high > 0.004
    for fig in figures:  # the per-layer pictures list the variants, not the floor
        for ax in fig.axes:
            if ax.get_legend() and ax is not bottom:
                assert not any("noise floor" in t or "nudge" in t for t in legend_of(ax))


def test_each_seeds_difference_is_drawn_thin_beside_the_bold_mean(tmp_path, figures):
    """With 2+ seeds the difference panel shows the spread: one thin line per seed, the mean
    bold; with one seed only the mean, and the title says 'one seed'."""
    results = made_up_results(4, names=("vanilla", "resformer"))
    results["resformer"]["curves"] = [[v + d for v in c] for c, d in
                                      zip(results["vanilla"]["curves"], (-0.03, -0.01, 0.01))]
    plots.write_all(str(tmp_path), results)
    bottom = loss_picture(figures).axes[1]
    drawn = [line for line in bottom.lines if len(line.get_xdata()) > 2]
    bold, *thin = drawn
    assert list(bold.get_ydata()) == pytest.approx([-0.01] * 40)
    assert bold.get_linewidth() >= 2 and all(line.get_linewidth() < 2 for line in thin)
    assert sorted(round(line.get_ydata()[0], 6) for line in thin) == [-0.03, -0.01, 0.01]
    assert "thin = each seed" in bottom.get_title()


def test_the_loss_axes_say_nats_per_byte_or_per_token(tmp_path, figures):
    """The loss is in nats per byte for the byte tokenizer: every axis that shows a loss says
    which (write_all's unit; 'token' where a caller does not say)."""
    results = made_up_results(4)
    plots.write_all(str(tmp_path), results, unit="byte")
    top, bottom = figures[0].axes
    assert top.get_ylabel() == "val loss (nats per byte)"
    assert bottom.get_ylabel() == "minus vanilla (nats per byte)"
    plt = plots.pyplot()
    plots.lr_figure(plt, str(tmp_path), {"vanilla": {1e-3: [2.5], 2e-3: [2.2], 4e-3: [2.4]}},
                    unit="byte")
    plots.curve_figure(plt, str(tmp_path), size_results(), unit="byte")
    for fig in figures[-2:]:
        assert "nats per byte" in fig.axes[0].get_ylabel(), fig.axes[0].get_ylabel()
    plots.write_all(str(tmp_path), results)
    assert figures[-3].axes[0].get_ylabel() == "val loss (nats per token)"


def test_one_seed_is_not_promised_a_band(tmp_path, figures):
    """One seed has no min-max band: the title says 'one seed' and none is drawn; with 3 seeds
    the title names the band."""
    results = made_up_results(4, names=("vanilla", "resformer"))
    for r in results.values():
        r["seeds"], r["curves"] = r["seeds"][:1], r["curves"][:1]
    plots.write_all(str(tmp_path), results)
    top, bottom = loss_picture(figures).axes
    assert "one seed" in top.get_title() and "band" not in top.get_title()
    assert not top.collections
    assert "one seed" in bottom.get_title() and "thin" not in bottom.get_title()
    plots.write_all(str(tmp_path), made_up_results(4))
    assert "mean over 3 seeds, band = min-max" in loss_picture(figures[3:]).axes[0].get_title()


def test_the_live_picture_carries_the_final_pictures_marks(tmp_path, figures):
    """While the runs train the picture already has the plateau triangles (each run's first
    evaluation below escape_loss, on the steps drawn), the unit, and the noise floor's band once
    its run has evaluations (not a line of its own)."""
    root = str(tmp_path)
    logs = {("vanilla", 1): [(0, 5.5), (10, 3.0), (20, 2.8), (30, 2.6)],
            ("vanilla", 2): [(0, 5.5), (10, 3.1), (20, 2.95), (30, 2.7)],
            ("resformer", 1): [(0, 5.5), (10, 2.85), (20, 2.7), (30, 2.5)],
            (FLOOR, 1): [(0, 5.5), (10, 3.01), (20, 2.79), (30, 2.6)]}
    grid = []
    for (name, seed), evals in logs.items():
        run_dir = os.path.join(root, f"{name.replace(':', '-')}_seed{seed}")
        write_log(run_dir, evals)
        grid.append(((name, seed, ""), {"out_dir": run_dir}))
    plots.live_loss(root, grid, escape_loss=2.9, unit="byte")
    top, bottom = loss_picture_in(figures, "byte").axes
    marks = [line for line in top.lines if line.get_marker() == "v"]
    assert [(list(m.get_xdata()), list(m.get_ydata())) for m in marks] == [([25], [2.9]),
                                                                         ([10], [2.9])]
    assert legend_of(top) == ["vanilla", "ResFormer",
                              "leaves the plateau: the first evaluation below the dotted line (2.9), "
                              "mean over the seeds that left"]
    assert top.get_xlabel() == "" and bottom.get_xlabel() == "step (64 tokens each)"
    band, = [c for c in bottom.collections if c.get_label().startswith(plots.FLOOR_LABEL)]
    assert band_edges(band)[30] == pytest.approx((-0.0, 0.0), abs=1e-12)
    assert band_edges(band)[10] == pytest.approx((-0.01, 0.01))


def loss_picture_in(figures, unit):
    return next(fig for fig in figures if fig.axes[0].get_ylabel() == f"val loss (nats per {unit})")


def size_results():
    """curve_figure's input: vanilla at 3 sizes on loss = 5 - 0.2 ln N, ResFormer on it."""
    results = {name: {"num_params": int(n), "seeds": [1, 2],
                      "val_loss": [5 - 0.2 * np.log(n) + d for d in (-0.01, 0.01)]}
               for name, n in (("vanilla:n_embd=8", 1e5), ("vanilla", 2e5),
                               ("vanilla:n_embd=24", 4e5), ("resformer", 1.5e5))}
    for r in results.values():
        r["val_loss_mean"] = float(np.mean(r["val_loss"]))
    return results


def test_legends_sit_outside_the_axes_and_read_from_the_back_of_a_room(tmp_path, figures):
    """No legend covers a line: each sits beside its axes (its box does not overlap the axes'
    box) and wholly on the picture; legend, tick and label text is 10 points or more."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    results = with_floor(made_up_results(4), [[0.003] * 41])
    results["resformer"]["mixing"] = {f"transformer.h.{i}.attn.value_lambdas": [0.6, 0.4]
                                      for i in (1, 2, 3)}
    results["resformer"]["escape"] = [[20, 40960], [40, 81920], None]
    plt = plots.pyplot()
    plots.write_all(str(tmp_path), results, escape_loss=2.9)
    plots.lr_figure(plt, str(tmp_path), {"vanilla": {1e-3: [2.5], 2e-3: [2.2], 4e-3: [2.4]}})
    plots.curve_figure(plt, str(tmp_path), size_results())
    with_legend = 0
    for fig in figures:
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.canvas.draw()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None:
                continue
            with_legend += 1
            box, area = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert not box.overlaps(area), (ax.get_title(), box, area)
            assert inside(fig, legend), ax.get_title()
            texts = (legend.get_texts() + ax.get_yticklabels() + [ax.yaxis.label])
            assert min(t.get_fontsize() for t in texts) >= 10, ax.get_title()
    assert with_legend == 7  # loss (2), entropy, similarity, mixing, lr, size curve


@pytest.mark.parametrize("stalled", [False, True])
def test_the_other_seeds_are_drawn_as_their_lowest_and_highest_difference(tmp_path, figures,
                                                                           stalled):
    """One seed with a calibration: two dashed lines in the variant's colour at the other seeds'
    lowest and highest difference at every evaluation (the band results.json calls `band`). A
    single seed far below the rest (vanilla stalled on the plateau) runs below the axis, and
    the legend says how far it went; without one, the axis holds both lines whole."""
    results = made_up_results(4, names=("vanilla", "resformer"))
    for r in results.values():
        r["seeds"], r["curves"] = [1], r["curves"][:1]
    gaps = np.array([[-0.02 - 0.01 * k] * 41 for k in range(10)])  # -0.02 .. -0.11
    if stalled:
        gaps[0] = -0.6
    results["resformer"]["calibration"] = {"steps": results["vanilla"]["steps"],
                                           "curves": gaps.tolist(), "final": list(gaps[:, -1])}
    plots.write_all(str(tmp_path), results)
    top, bottom = loss_picture(figures).axes
    color = next(line.get_color() for line in bottom.lines if line.get_label() == "ResFormer")
    dashed = [line for line in bottom.lines if line.get_linestyle() == "--"
              and line.get_color() == color and len(line.get_xdata())]
    assert sorted(tuple(line.get_ydata()) for line in dashed) == [
        tuple(gaps.min(0)[1:]), tuple(gaps.max(0)[1:])]  # step 0 is not drawn, as on top
    low, high = bottom.get_ylim()
    said = [t for t in legend_of(bottom) if "other seeds" in t]
    assert said[0].startswith("ResFormer: lowest and highest of 10 other seeds")
    if stalled:
        assert low > -0.6 and low < -0.11  # the next-lowest seed is on the picture
        assert said[0].endswith("the lowest runs below the axis, -0.60 at worst")
    else:
        assert low < -0.11 and high > -0.02 and "below the axis" not in said[0]
