"""Figure functions: data in, traces and annotations out (no browser)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from tests.helpers.records import SITES, perturb, records
from workbench.analysis import compare
from workbench.analysis.cost import COLUMNS
from workbench.analysis.elementwise import elementwise_difference
from workbench.analysis.ladder import Ladder, ladder
from workbench.analysis.noise_floor import noise_floor
from workbench.errors import ArgumentError
from workbench.figures.cost import cost_figure
from workbench.figures.divergence import BITWISE_EQUAL, amplification_figure, divergence_heatmap, heatmap_matrix
from workbench.figures.elementwise import elementwise_figure
from workbench.figures.ladder import ladder_figure
from workbench.figures.style import PALETTE, apply_style, floor_band, for_paper, legend_rows, resized
from workbench.figures.trajectories import trajectory_figure
from workbench.store.manifest import Provenance
from workbench.studies.report import PRINT_HALF_PAGE, PRINT_WIDTH, _for_print

PROVENANCE = Provenance(runs=("a-1234", "b-5678"), configs=("L1 H64 fp32",), schema_version=1, revision="abcdef0123456")


def _annotation_texts(fig) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.text for a in fig.layout.annotations]


def test_heatmap_marks_first_divergence_and_frontier() -> None:
    a = records("a", steps=8)
    result = compare(a, perturb(a, "b", step=3, site="act:layers.0.mlp"))
    fig = divergence_heatmap(result, provenance=PROVENANCE)
    heat, frontier, first = fig.data
    assert heat.type == "heatmap" and set(heat.y) == set(SITES) and list(heat.x) == list(range(8))
    z = np.asarray(heat.z, dtype=float)
    row = list(heat.y).index("act:layers.0.mlp")
    assert (z[:, :3] == BITWISE_EQUAL).all() and z[row, 3] > BITWISE_EQUAL  # equal before step 3, not at it
    assert first.x == (3,) and first.y == ("act:layers.0.mlp",)
    assert dict(zip(frontier.y, frontier.x))["act:layers.0.mlp"] == 3
    assert "first divergence at step 3" in fig.layout.title.text
    assert first.name == "first divergence: step 3<br>act:layers.0.mlp"  # the legend names it
    assert any("a-1234" in t and "schema v1" in t and "abcdef012345" in t for t in _annotation_texts(fig))


@pytest.mark.parametrize("site", ["grad:embedding.word_embeddings.weight", "act_grad:layers.0"])
def test_heatmap_title_and_legend_name_the_first_divergence_and_nothing_covers_the_matrix(site: str) -> None:
    a = records("a", steps=20)
    result = compare(a, perturb(a, "b", step=15, site=site))
    screen = divergence_heatmap(result, provenance=PROVENANCE)
    assert screen.layout.title.text == "a vs b: first divergence at step 15"
    assert (screen.layout.legend.y, screen.layout.legend.yanchor) == (1.0, "bottom")  # above the plot, in the margin
    entries = [str(t.name) for t in screen.data if t.showlegend is not False and t.type != "heatmap"]
    assert entries[0] == "frontier (first divergent step per site)" and len(entries) == 2
    step, *lines = entries[1].split("<br>")  # the site broken at dots: the entry fits a paper's column
    assert step == "first divergence: step 15" and "".join(lines) == site and max(map(len, lines)) <= 30
    rows = len(screen.data[0].y)
    for fig in (screen, for_paper(screen, "column"), for_paper(screen, "page")):
        # the one annotation left is the footer: no label lies over the matrix's cells
        assert [a.name for a in fig.layout.annotations] == ["provenance"]
        (marker,) = [t for t in fig.data if str(t.name).startswith("first divergence")]
        assert (marker.x[0], marker.y[0]) == (15, list(fig.data[0].y)[list(fig.data[0].y).index(marker.y[0])])
    # the legend's rows each get their room under the title (tests/browser/test_figure_layout.py renders it)
    assert screen.layout.margin.t >= 44 + 22 * legend_rows(entries)
    assert list(screen.layout.yaxis.range) == [rows - 0.5, -0.5] and list(screen.layout.xaxis.range) == [-0.5, 19.5]


def test_heatmap_rows_follow_model_order_and_bins_keep_the_largest_difference() -> None:
    a = records("a", steps=50)
    result = compare(a, perturb(a, "b", step=47, site="grad:layers.0.mlp.linear_fc1.weight", later=False))
    matrix = heatmap_matrix(result)
    assert list(matrix.index[:2]) == ["param:embedding.word_embeddings.weight", "act:embedding"]  # embedding first
    fig = divergence_heatmap(result, max_columns=5, max_rows=4)
    z = np.asarray(fig.data[0].z, dtype=float)
    assert z.shape == (4, 5)
    assert (z > BITWISE_EQUAL).sum() == 1  # the one differing cell survives binning
    assert fig.data[0].x[-1] == 40  # bins start at steps 0, 10, ..., 40


def test_identical_runs_heatmap_and_amplification() -> None:
    a = records("a")
    result = compare(a, records("b"))  # same seed: identical
    heatmap = divergence_heatmap(result)
    assert "bitwise identical" in heatmap.layout.title.text
    assert len(heatmap.data) == 1
    assert [a.text for a in heatmap.layout.annotations] == ["bitwise identical:<br>every site, every step"]  # on it
    assert "nothing to amplify" in amplification_figure(result).layout.title.text


def test_amplification_fit_line_follows_the_growth() -> None:
    a = records("a", steps=12)
    b = a.stats.copy()
    fingerprints = a.fingerprints.copy()
    for step in range(4, 12):
        b.loc[{"step": step}] = a.stats.sel(step=step) * (1 + 1e-7 * 10 ** (0.5 * (step - 4)))
        fingerprints.loc[step] = fingerprints.loc[step] ^ 1
    from workbench.analysis import RunRecords

    fig = amplification_figure(compare(a, RunRecords("b", fingerprints, b, a.model)))
    fit = fig.data[-1]
    assert "decades/step" in fit.name and fig.layout.yaxis.type == "log"
    assert fit.name.startswith("growth: +0.5") and (min(fit.x), max(fit.x)) == (4, 11)


def test_amplification_fit_is_drawn_over_the_growth_phase_and_the_plateau_beside_it() -> None:
    a = records("a", steps=40)
    b = a.stats.copy()
    fingerprints = a.fingerprints.copy()
    for step in range(40):  # 1e-10 growing a decade every 3 steps until step 15, then flat
        b.loc[{"step": step}] = a.stats.sel(step=step) * (1 + 1e-10 * 10 ** (min(step, 15) / 3))
        fingerprints.loc[step] = fingerprints.loc[step] ^ 1
    from workbench.analysis import RunRecords

    fig = amplification_figure(compare(a, RunRecords("b", fingerprints, b, a.model)))
    fit, plateau = fig.data[-2], fig.data[-1]
    assert fit.name.startswith("growth: +0.33") and (min(fit.x), max(fit.x)) == (0, 15)
    assert plateau.name.startswith("saturates at step 15") and (min(plateau.x), max(plateau.x)) == (15, 39)
    assert max(fit.y) == pytest.approx(1e-5, rel=0.05) and list(plateau.y) == [pytest.approx(1e-5, rel=0.05)] * 25


def test_trajectory_with_reference_floor_and_difference_panel() -> None:
    steps = pd.RangeIndex(10, name="step")
    series = {"ref": pd.Series(np.linspace(5, 2, 10), index=steps),
              "other": pd.Series(np.linspace(5, 2, 10) + 1e-3, index=steps)}
    floor = (series["ref"] - 1e-4, series["ref"] + 1e-4)
    fig = trajectory_figure(series, reference="ref", floor=floor, quantity="loss", provenance=PROVENANCE)
    names = [t.name for t in fig.data]
    assert names.count("noise floor (repeats)") == 2 and "ref" in names and "other" in names
    diff = [t for t in fig.data if t.name == "other" and t.yaxis == "y2"][0]
    assert np.allclose(diff.y, 1e-3)
    assert fig.data[names.index("ref")].line.color == PALETTE[0]
    with pytest.raises(ArgumentError, match="reference"):
        trajectory_figure(series, reference="missing")


def test_the_difference_panel_shows_magnitudes_on_a_log_axis_small_and_large_alike() -> None:
    steps = pd.RangeIndex(6, name="step")
    ref = pd.Series(np.full(6, 2.0), index=steps)
    nan_later = ref.copy()
    nan_later[3:] = np.nan  # equal until a non-finite loss: not "equal at every step"
    series = {"ref": ref, "tiny": ref - np.array([0, 0, 1e-7, 1e-7, 2e-7, 4e-7]), "large": ref + 0.1,
              "same": ref.copy(), "nan later": nan_later}
    fig = trajectory_figure(series, reference="ref", floor=(ref - 1e-6, ref + 3e-6), provenance=PROVENANCE)
    lower = {t.name: t for t in fig.data if t.yaxis == "y2" and t.name in series}
    assert fig.layout.yaxis2.type == "log" and fig.layout.yaxis2.title.text == "|minus ref|"
    tiny = np.asarray(lower["tiny"].y, dtype=float)
    assert np.isnan(tiny[:2]).all() and np.allclose(tiny[2:], [1e-7, 1e-7, 2e-7, 4e-7])  # equal: a gap
    assert np.allclose(np.asarray(lower["large"].y, dtype=float), 0.1)
    assert np.isnan(np.asarray(lower["same"].y, dtype=float)).all()
    said = [t.name for t in fig.data if "equal to ref" in str(t.name)]  # in the legend, over no curve
    assert said == ["equal to ref at every step: same"]
    band = [t for t in fig.data if t.yaxis == "y2" and t.name == "noise floor (repeats)"][0]
    assert max(v for v in band.y if v is not None) == pytest.approx(3e-6)  # the larger side of the envelope
    signed = trajectory_figure(series, reference="ref", magnitude=False)
    assert signed.layout.yaxis2.type == "linear" and signed.layout.yaxis2.title.text == "minus ref"
    assert min([t for t in signed.data if t.yaxis == "y2" and t.name == "tiny"][0].y) == pytest.approx(-4e-7)


def test_thirteen_runs_have_thirteen_styles_in_both_panels_and_a_legend_that_fits() -> None:
    steps = pd.RangeIndex(10, name="step")
    names = [f"run{i}" for i in range(13)]
    series = {name: pd.Series(np.linspace(5, 2, 10) + i * 1e-3, index=steps) for i, name in enumerate(names)}
    floor = (series["run0"] - 1e-4, series["run0"] + 1e-4)
    fig = trajectory_figure(series, reference="run0", floor=floor, seed_spread=floor, provenance=PROVENANCE)
    style = {(t.name, t.yaxis): (t.line.color, t.line.dash) for t in fig.data if t.name in series}
    upper = [style[name, "y"] for name in names]
    assert len(set(upper)) == 13  # the palette has 8 colours: the next runs are dashed
    assert all(style[name, "y2"] == style[name, "y"] for name in names[1:])  # a run looks the same in both panels
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert set(names) <= set(legend) and len(legend) == 15  # every run and both bands
    plot_height = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert plot_height >= 20 * len(legend)  # plotly cuts a legend taller than the plot from an export
    printed = _for_print(fig)  # the report's PDF: half a page, unless the legend needs more
    assert printed.layout.height - printed.layout.margin.t - printed.layout.margin.b >= 20 * len(legend)
    assert trajectory_figure({"a": series["run0"]}).layout.title.text == "loss of 1 run"


def test_ladder_figure_draws_runs_and_noise_band() -> None:
    ref = records("ref")
    repeat = perturb(ref, "repeat", step=0, site=SITES[0], factor=1 + 1e-6)
    big = perturb(ref, "bf16", step=0, site=SITES[0], factor=1.01)
    result = ladder(ref, [big], floor=noise_floor([ref, repeat]))
    fig = ladder_figure(result, noise=ladder(ref, [repeat]))
    assert [t.name for t in fig.data].count("noise floor (repeats)") == 2
    run_trace = [t for t in fig.data if t.name == "bf16" and t.xaxis == "x"][0]
    assert list(run_trace.x) == ["embedding", "L0", "loss"]
    assert "bf16 ▲ emb, step 0" in _legend_entries(fig)


def test_trajectory_figure_draws_the_rounding_band_in_both_panels() -> None:
    steps = pd.Index(range(5), name="step")
    series = {"ref": pd.Series([1.0, 0.9, 0.8, 0.7, 0.6], index=steps),
              "tp2": pd.Series([1.0, 0.9 + 1e-7, 0.8 + 2e-7, 0.7, 0.6], index=steps)}
    band = (series["ref"] - 1e-6, series["ref"] + 1e-6)
    fig = trajectory_figure(series, reference="ref", rounding=band)
    drawn = [t for t in fig.data if t.name == "rounding band (band runs)"]
    assert [t.yaxis for t in drawn] == ["y", "y2"] and {t.legendgroup for t in drawn} == {"rounding"}
    assert "rounding band (band runs)" in _legend_entries(fig)


def test_ladder_figure_draws_the_rounding_band_and_says_each_runs_verdict() -> None:
    ref = records("ref")
    bands = [perturb(ref, f"band{i}", step=0, site=SITES[0], factor=1 + 1e-7 * (i + 1)) for i in range(2)]
    big = perturb(ref, "bug", step=0, site=SITES[0], factor=1.01)
    fig = ladder_figure(ladder(ref, [big]), rounding=ladder(ref, bands),
                        verdicts={"bug": "beyond rounding, step 0"})
    band = [t for t in fig.data if t.name == "rounding band (band runs)"]
    assert len(band) == 2 and band[0].legendgroup == "rounding"  # one band in each panel, in its own colour
    assert {t.fillcolor for t in band} == {"rgba(0, 158, 115, 0.20)"}
    assert "bug · beyond rounding, step 0" in _legend_entries(fig)
    assert "rounding band (band runs)" in _legend_entries(fig)


LAYER_SITES = ["param:embedding.word_embeddings.weight", "act:embedding",
               *[f"act:layers.{i}.{m}" for i in range(24) for m in ("self_attention", "mlp")],
               "act:final_layernorm", "act:output_layer", "loss:cross_entropy"]


def _legend_entries(fig: go.Figure) -> list[str]:
    return [str(t.name) for t in fig.data if t.showlegend is not False]


def _floor_ladder(sites: list[str] = SITES, site: str = "act:layers.0.mlp") -> tuple[Ladder, Ladder]:
    """A ladder of two runs against "ref" with the repeats' noise floor: "bf16" leaves it at step 2 in
    ``site``'s layer, "small" (1e-9) stays inside."""
    ref = records("ref", sites=sites)
    repeat = perturb(ref, "repeat", step=0, site=sites[0], factor=1 + 1e-6)
    runs = [perturb(ref, "bf16", step=2, site=site, factor=1.01),
            perturb(ref, "small", step=1, site=sites[0], factor=1 + 1e-9)]
    return ladder(ref, runs, floor=noise_floor([ref, repeat])), ladder(ref, [repeat])


def test_ladder_figure_marks_where_a_run_leaves_the_floor_without_writing_over_the_lines() -> None:
    result, noise = _floor_ladder()
    fig = ladder_figure(result, noise=noise, provenance=PROVENANCE)
    # no text in the plot area (notes over the lines, subplot titles where the paper legend goes): the footer only
    assert [a.name for a in fig.layout.annotations] == ["provenance"]
    legend = fig.layout.legend
    assert (legend.orientation, legend.y, legend.yanchor) == ("h", 1.0, "bottom")  # above the plot, in the margin
    assert legend.title.text == "▲ leaves the noise floor: layer, step"
    entries = _legend_entries(fig)
    assert entries == ["noise floor (repeats)", "bf16 ▲ L0, step 2", "small"]  # every run, the exit in its entry
    for run in ("bf16", "small"):  # and its line in each panel
        assert [t.xaxis for t in fig.data if t.legendgroup == run and t.mode != "markers"] == ["x", "x2"]
    left, right = [t for t in fig.data if t.legendgroup == "bf16" and t.mode != "markers"]
    marks = {t.xaxis: t for t in fig.data if t.name == "bf16 leaves the noise floor"}
    assert set(marks) == {"x", "x2"} and not any("small" in str(t.name) and t.mode == "markers" for t in fig.data)
    # each triangle sits on the run's own line: at the layer it leaves the floor in, and at the step
    assert marks["x"].x == ("L0",) and marks["x"].y[0] == left.y[list(left.x).index("L0")] > 0
    assert marks["x2"].x == (2,) and marks["x2"].y[0] == right.y[list(right.x).index(2)] > 0
    assert "act:layers.0.mlp" in marks["x"].hovertemplate


def _tick_room(fig: go.Figure) -> list[float]:
    """Pixels to spare between each pair of neighbouring layer names (width estimated at 0.62 em a character)
    at ``fig``'s width; the plot starts at least 70 px in (plotly pushes the margin for the y tick labels)."""
    axis, font = fig.layout.xaxis, fig.layout.font.size
    plot = (fig.layout.width or 700) - max(fig.layout.margin.l, 70) - fig.layout.margin.r
    per_category = plot * (axis.domain[1] - axis.domain[0]) / len(axis.categoryarray)
    shown = [list(axis.categoryarray).index(v) for v in axis.tickvals]
    widths = [0.62 * font * len(text) for text in axis.ticktext]
    return [(b - a) * per_category - (wa + wb) / 2
            for a, b, wa, wb in zip(shown, shown[1:], widths, widths[1:], strict=False)]


@pytest.mark.parametrize("sites", [SITES, LAYER_SITES], ids=["1 layer", "24 layers"])
def test_ladder_layer_names_stand_upright_apart_and_clear_of_the_footer_at_every_size(sites: list[str]) -> None:
    result, noise = _floor_ladder(sites)
    provenance = Provenance(runs=("ref", "bf16", "small"), configs=tuple(f"L24 H256 TP{i}-PP1-DP1 fp32 det seed1234"
                                                                          for i in (1, 2, 4)),
                            schema_version=3, revision="abcdef0123456")
    screen = ladder_figure(result, noise=noise, provenance=provenance)
    layers = list(result.final_by_layer().columns)
    for fig in (screen, resized(screen, PRINT_WIDTH, PRINT_HALF_PAGE), for_paper(screen, "column"),
                for_paper(screen, "page")):
        axis, font = fig.layout.xaxis, fig.layout.font.size
        assert axis.tickangle == 0 and list(axis.categoryarray) == layers  # upright; every layer on the axis
        assert set(axis.tickvals) <= set(layers) and len(axis.tickvals) <= 8
        assert min(_tick_room(fig)) >= 1, (fig.layout.width, _tick_room(fig))  # no name runs into the next
        # under the plot: a line of names, the axis title's lines, then the footer (anchored at its bottom)
        (footer,) = [a for a in fig.layout.annotations if a.name == "provenance"]
        footer_height = 1.3 * footer.font.size * (footer.text.count("<br>") + 1)
        title_lines = max(str(a.title.text).count("<br>") + 1 for a in (fig.layout.xaxis, fig.layout.xaxis2))
        assert -footer.yshift - footer_height >= 1.3 * font * (1 + title_lines) + 10, fig.layout.width
    if len(layers) <= 8:  # all of them, short
        assert list(screen.layout.xaxis.ticktext) == ["emb", "L0", "loss"]


def test_elementwise_and_cost_figures() -> None:
    a = np.arange(64, dtype=np.float32)
    b = a.copy()
    b[3] = np.nextafter(b[3], np.float32(100))
    fig = elementwise_figure({"grad:x": elementwise_difference(a, b)}, step=2, a="r0", b="r1")
    hist = fig.data[0]
    assert list(hist.x) == ["0", "1"] and list(hist.y) == [63, 1]
    assert fig.data[1].orientation == "h" and fig.data[1].x[0] > 0
    cost = pd.DataFrame([["L4 fp32", 100.0, 110.0, 10.0, 5.0, 15.0, 20, 20]], columns=COLUMNS)
    fig = cost_figure(cost)
    assert [t.name for t in fig.data[:2]] == ["deterministic", "default"]
    tax = fig.data[2]
    assert tax.y[0] == 10.0 and tax.error_y.array[0] == 5.0 and tax.error_y.arrayminus[0] == 5.0


def test_the_heatmap_matrix_block_by_block_is_the_cell_by_cell_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    import workbench.figures.divergence as divergence
    from workbench.figures.divergence import DIFFERS_ONLY_IN_BITS

    a = records("a", steps=9)
    result = compare(a, perturb(a, "b", step=2, site="act:layers.0.mlp"))
    rel = result.relative_difference.sel(stat="l2").copy()
    rel[4, 0], rel[5, 1], rel[6, 2] = 0.0, np.nan, 1e-30  # unseen by the statistic, undefined, below the scale
    monkeypatch.setattr(divergence, "_BLOCK_CELLS", 25)  # 10 sites: 2 steps a block, the last one short
    matrix = heatmap_matrix(result, relative=rel)
    for site in matrix.index:
        for step in matrix.columns:
            value, equal = float(rel.sel(step=step, site=site)), bool(result.equal.loc[step, site])
            expected = (BITWISE_EQUAL if equal else DIFFERS_ONLY_IN_BITS if value == 0 else
                        0.0 if not np.isfinite(value) else float(np.clip(np.log10(value), DIFFERS_ONLY_IN_BITS, 0)))
            assert matrix.loc[site, step] == expected, (site, step)
    with pytest.raises(KeyError, match="not sites both runs recorded"):
        heatmap_matrix(result, sites=[*SITES[:2], "act:layers.9.mlp"], relative=rel)


def test_resized_wraps_the_footer_to_the_figure_s_width_and_grows_the_bottom_margin_for_it() -> None:
    provenance = Provenance(runs=tuple(f"run-{i}-0123456789" for i in range(6)),
                            configs=("L2 H64 TP1-PP1-DP1 fp32 det seed1234", "L2 H64 TP2-PP1-DP1 fp32 det seed1234"),
                            schema_version=2, revision="abcdef0123456")
    fig = trajectory_figure({"a": pd.Series([1.0, 2.0])}, reference="a", provenance=provenance)
    small = resized(fig, 500, 400)
    (before,) = [a for a in fig.layout.annotations if a.name == "provenance"]
    (after,) = [a for a in small.layout.annotations if a.name == "provenance"]
    assert (small.layout.width, small.layout.height) == (500, 400) and fig.layout.width is None  # a copy
    lines = after.text.split("<br>")
    assert len(lines) > before.text.count("<br>") + 1  # wrapped
    assert max(len(line) for line in lines) <= (500 - 16) / (0.62 * after.font.size)  # 8 px in from either edge
    assert after.xshift == -small.layout.margin.l + 8  # from the figure's left edge, not the plot's
    assert after.text.replace("<br>", " ").split() == before.text.replace("<br>", " ").split()  # every word kept
    extra = len(lines) - before.text.count("<br>") - 1
    assert small.layout.margin.b > fig.layout.margin.b and after.yshift == -small.layout.margin.b + 8 and extra > 0


def test_room_below_the_plot_moves_the_footer_down_and_a_two_line_axis_title_gets_its_line_on_paper() -> None:
    plain = apply_style(go.Figure(go.Scatter(x=[1, 2], y=[1, 2])), title="t", provenance=PROVENANCE)
    roomy = apply_style(go.Figure(go.Scatter(x=[1, 2], y=[1, 2])), title="t", provenance=PROVENANCE, room_below=20)
    (footer,) = [a for a in roomy.layout.annotations if a.name == "provenance"]
    assert roomy.layout.margin.b == plain.layout.margin.b + 20 and footer.yshift == -roomy.layout.margin.b + 8
    two_lines = go.Figure(plain).update_xaxes(title="step<br>(median of layers)")
    for size in ("column", "page"):
        font = for_paper(plain, size).layout.font.size
        assert for_paper(two_lines, size).layout.margin.b - for_paper(plain, size).layout.margin.b == \
            pytest.approx(1.5 * font, abs=1)  # a title's line and its leading (tests/browser/test_figure_layout.py)


def test_a_footer_too_long_for_the_default_width_is_wrapped_and_keeps_every_word() -> None:
    provenance = Provenance(runs=tuple(f"run-{i}-0123456789" for i in range(6)),
                            configs=("L2 H64 TP1-PP1-DP1 fp32 det seed1234", "L2 H64 TP2-PP1-DP1 fp32 det seed1234",
                                     "L2 H64 TP1-PP2-DP1 fp32 det seed1234"), schema_version=2, revision="abcdef012345")
    fig = trajectory_figure({"a": pd.Series([1.0, 2.0])}, reference="a", provenance=provenance)
    (note,) = [a for a in fig.layout.annotations if a.name == "provenance"]
    lines = note.text.split("<br>")
    assert len(lines) > 2 and max(len(line) for line in lines) <= (700 - 16) / (0.62 * note.font.size)
    assert note.text.replace("<br>", " ").split() == " ".join(provenance.lines()).split()
    short = trajectory_figure({"a": pd.Series([1.0, 2.0])}, reference="a", provenance=PROVENANCE)
    assert fig.layout.margin.b > short.layout.margin.b  # the extra lines get room
    assert note.yshift == -fig.layout.margin.b + 8


def _band_pieces(trace: go.Scatter) -> list[tuple[list[object], list[float]]]:
    """The closed polygons of a band trace (plotly fills each stretch between None on its own)."""
    pieces: list[tuple[list[object], list[float]]] = [([], [])]
    for x, y in zip(trace.x, trace.y, strict=True):
        if x is None:
            pieces.append(([], []))
        else:
            pieces[-1][0].append(x)
            pieces[-1][1].append(y)
    return pieces


def test_a_log_band_with_zeros_is_closed_polygons_reaching_below_its_smallest_value() -> None:
    # repeats bitwise equal at two layers (low 0), and a layer where even the widest repeat is 0 (high 0)
    layers = ["emb", "L0", "L1", "L2", "ln_f", "out"]
    fig = make_subplots(rows=1, cols=1)
    floor_band(fig, layers, [1e-7, 0.0, 0.0, 0.0, 4e-8, 2e-8], [3e-7, 2e-7, 1e-7, 0.0, 6e-8, 5e-8], log=True)
    pieces = _band_pieces(fig.data[0])
    assert [xs for xs, _ in pieces] == [["emb", "L0", "L1", "L1", "L0", "emb"], ["ln_f", "out", "out", "ln_f"]]
    ys = [y for _, piece in pieces for y in piece]
    assert all(np.isfinite(ys)) and min(ys) == pytest.approx(2e-9)  # a decade below the smallest positive
    assert pieces[0][1] == pytest.approx([1e-7, 2e-9, 2e-9, 1e-7, 2e-7, 3e-7])


def test_a_linear_band_skips_missing_steps_and_stays_one_polygon() -> None:
    fig = make_subplots(rows=1, cols=1)
    floor_band(fig, [0, 5, 10, 15], [1.0, np.nan, 0.0, 2.0], [2.0, np.nan, 1.0, 3.0])
    (xs, ys), = _band_pieces(fig.data[0])
    assert xs == [0, 10, 15, 15, 10, 0] and ys == [1.0, 0.0, 2.0, 3.0, 1.0, 2.0]
    assert fig.data[0].line.width == 0
    one_run = make_subplots(rows=1, cols=1)
    floor_band(one_run, [0, 1], [1.0, 2.0], [1.0, 2.0])
    assert one_run.data[0].line.dash == "dot"


def test_the_heatmap_matrix_from_the_two_runs_values_is_the_one_from_their_relative_difference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import workbench.figures.divergence as divergence

    a = records("a", steps=9)
    b = perturb(a, "b", step=2, site="act:layers.0.mlp")
    result = compare(a, b)
    x, y = a.stats.sel(stat="max").copy(), b.stats.sel(stat="max").copy()
    x[4, 0], y[4, 0] = 0.0, 0.0  # equal zeros, then NaN against a number, then both NaN, then inf against -inf
    x[5, 1], x[6, 2], y[6, 2], x[7, 3], y[7, 3] = np.nan, np.nan, np.nan, np.inf, -np.inf
    monkeypatch.setattr(divergence, "_BLOCK_CELLS", 25)  # 10 sites: 2 steps a block, the last one short
    for steps in (None, (3, 7)):
        expected = heatmap_matrix(result, "max", steps=steps, relative=result.relative("max", (x, y)))
        matrix = heatmap_matrix(result, "max", steps=steps, values=(x, y))
        pd.testing.assert_frame_equal(matrix, expected)
    # a run that recorded steps the other did not: rows are found by step, not by position
    later = heatmap_matrix(result, "max", steps=(3, 7), values=(x.isel(step=slice(1, None)), y))
    pd.testing.assert_frame_equal(later, heatmap_matrix(result, "max", steps=(3, 7), values=(x, y)))
    with pytest.raises(KeyError, match="not sites both runs recorded"):
        heatmap_matrix(result, sites=[*SITES[:2], "act:layers.9.mlp"], values=(x, y))


@pytest.mark.parametrize("max_columns", [400, 7, 4])
def test_the_heatmap_drawn_from_its_step_bins_is_the_one_drawn_from_the_whole_matrix(max_columns: int) -> None:
    from workbench.figures.divergence import StepBins

    a = records("a", steps=30)
    b = perturb(a, "b", step=12, site="act:layers.0.mlp", later=False)
    b = perturb(b, "b", step=27, site=SITES[-1], later=False)
    result = compare(a, b)
    assert result.frontier[SITES[-1]] == 27  # in the last bin, after its first step
    full = heatmap_matrix(result)
    bins = StepBins.of(full, max_columns)
    assert bins.matrix.shape[1] <= max_columns and bins.last_step == 29
    assert bins.matrix.shape[1] < 30 or max_columns == 400
    chosen = list(full.index[1::2])
    for rows, binned in ((list(full.index), bins), (chosen, bins.rows(chosen))):
        whole = divergence_heatmap(result, matrix=full.loc[rows], max_columns=max_columns)
        drawn = divergence_heatmap(result, overview=binned, max_columns=max_columns)
        assert drawn.to_dict() == whole.to_dict()


@pytest.mark.parametrize("max_columns", [400, 4, 3])
@pytest.mark.parametrize("block_cells", [1 << 16, 25])
def test_step_bins_from_the_two_runs_values_are_those_of_the_whole_matrix(
        max_columns: int, block_cells: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import workbench.figures.divergence as divergence
    from workbench.figures.divergence import StepBins

    a = records("a", steps=11)
    b = perturb(a, "b", step=2, site="act:layers.0.mlp")
    b = perturb(b, "b", step=9, site=SITES[-1], later=False)  # a difference alone in a late bin
    result = compare(a, b)
    x, y = a.stats.sel(stat="max").copy(), b.stats.sel(stat="max").copy()
    x[4, 0], y[4, 0] = 0.0, 0.0  # equal zeros, then NaN against a number, then both NaN, then inf against -inf
    x[5, 1], x[6, 2], y[6, 2], x[7, 3], y[7, 3] = np.nan, np.nan, np.nan, np.inf, -np.inf
    y[8, 4] = x[8, 4]  # fingerprints differ, the statistic does not: "bits only"
    monkeypatch.setattr(divergence, "_BLOCK_CELLS", block_cells)
    full = heatmap_matrix(result, "max", values=(x, y))
    assert {BITWISE_EQUAL, -17.0, 0.0} <= set(np.unique(full.to_numpy()))  # equal, bits only, undefined cells
    expected = StepBins.of(full, max_columns)
    # the other run's sites in another order and an extra step in front: found by name and step
    shuffled = y.isel(site=list(range(len(SITES)))[::-1])
    for other in (y, shuffled):
        bins = StepBins.of_values(result, (x.isel(step=slice(0, None)), other), max_columns)
        pd.testing.assert_frame_equal(bins.matrix, expected.matrix)
        assert (bins.width, bins.last_step) == (expected.width, expected.last_step)
    with pytest.raises(KeyError, match="not sites both runs recorded"):
        StepBins.of_values(result, (x, y.isel(site=slice(1, None))), max_columns)
