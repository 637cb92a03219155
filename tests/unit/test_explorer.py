"""The divergence explorer on long runs: a store that reads one statistic at a time (schema 3, 512 sites and
more) and one that keeps them all in one chunk (schema 2)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workbench.figures.divergence import divergence_heatmap, heatmap_matrix
from workbench.statistics import STAT_NAMES
from workbench.store.reader import Run, open_run
from workbench.store.synthetic import write_synthetic_run
from workbench.widgets.explorer import DivergenceExplorer


def sent(values: Any) -> np.ndarray:
    """What a FigureWidget holds: a typed array as sent to the browser (``widgets.common.show``), or a list."""
    if isinstance(values, dict) and "bdata" in values:
        shape = [int(n) for n in str(values.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).reshape(shape)
    return np.asarray(values)


@pytest.mark.parametrize("schema_version", [2, 3])
def test_a_new_statistic_is_drawn_from_what_was_read_ahead_and_no_whole_statistic_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schema_version: int) -> None:
    a = write_synthetic_run(tmp_path / "a", steps=150, sites=600, seed=4, schema_version=schema_version)
    b = write_synthetic_run(tmp_path / "b", steps=150, sites=600, seed=4, diverge_at=(70, 5),
                            schema_version=schema_version)
    explorer = DivergenceExplorer(tmp_path, reference="a", other="b")
    ws = explorer.workspace
    assert ws is not None and open_run(a).reads_statistics_apart == (schema_version == 3)
    assert ws.preloaded(timeout=300)  # the other statistics' step bins, read in the background
    assert explorer.selected is not None
    site = explorer.selected[0]
    reads: list[tuple[str, object]] = []
    statistic = Run.statistic
    monkeypatch.setattr(Run, "statistic", lambda self, name, steps=None, **kw: (
        reads.append((name, steps)), statistic(self, name, steps, **kw))[1])

    explorer.stat.value = "max"
    assert reads == []  # neither the heatmap nor the site's detail read the statistic again
    # schema 3: no statistic held whole, nor the fingerprints; schema 2: every statistic, read in one pass
    held = ws.holding.keys("statistics")
    assert held == (set() if schema_version == 3 else {(n, s) for n in "ab" for s in STAT_NAMES})
    assert ws.holding.keys("records") == (set() if schema_version == 3 else {"a", "b"})
    assert ws.holding.keys("matrices") == set()  # a view of every step holds step bins, not the full matrix
    result = ws.comparison("a", "b")
    values = (open_run(a).statistic("max"), open_run(b).statistic("max"))
    expected = divergence_heatmap(result, "max", matrix=heatmap_matrix(result, "max", values=values))
    np.testing.assert_array_equal(sent(explorer.heatmap.data[0].z), np.asarray(expected.data[0].z))
    detail = {t.name: sent(t.y) for t in explorer.detail.data if t.name in ("a", "b") and t.yaxis in (None, "y")}
    for name, run_values in zip("ab", values, strict=True):
        np.testing.assert_array_equal(detail[name], run_values.sel(site=site).to_numpy())

    reads.clear()
    explorer.steps.value = (20, 100)  # a range of steps: its rows alone, read when asked and dropped
    assert reads == ([("max", (20, 100))] * 2 if schema_version == 3 else [])  # schema 2: held already
    assert ws.holding.keys("matrices") == {("a", "b", "max", 20, 100)}
    matrix = ws.holding.peek("matrices", ("a", "b", "max", 20, 100))
    assert matrix.columns.tolist() == list(range(20, 101))
    np.testing.assert_array_equal(matrix.to_numpy(), heatmap_matrix(result, "max", values=values).loc[
        matrix.index, 20:100].to_numpy())  # the same cells as the whole matrix's
    assert sent(explorer.heatmap.data[0].x).tolist() == list(range(20, 101))
    if schema_version == 3:
        assert ws.holding.keys("statistics") == set()


def test_a_clicked_sites_other_statistics_are_read_ahead_and_its_series_kept_not_the_statistic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, at in (("a", None), ("b", (70, 5))):
        write_synthetic_run(tmp_path / name, steps=150, sites=600, seed=4, diverge_at=at)
    explorer = DivergenceExplorer(tmp_path, reference="a", other="b")
    ws = explorer.workspace
    assert ws is not None and ws.preloaded(timeout=300)
    other = next(s for s in ws.runs["a"].site_names() if explorer.selected and s != explorer.selected[0])
    explorer.show_site(other, 80)  # read now (both runs' l2), then its other statistics in the background
    assert ws.preloaded(timeout=300)
    assert ws.holding.keys("statistics") == set()
    assert {(n, s) for n, s, kept_site in ws.holding.keys("series") if kept_site == other} == {
        (n, s) for n in "ab" for s in STAT_NAMES}
    reads: list[str] = []
    statistic = Run.statistic
    monkeypatch.setattr(Run, "statistic", lambda self, name, steps=None, **kw: (
        reads.append(name), statistic(self, name, steps, **kw))[1])
    explorer.stat.value = "absmax"
    assert reads == []  # step bins and the clicked site's series, both read ahead
    detail = {t.name: sent(t.y) for t in explorer.detail.data if t.name in ("a", "b") and t.yaxis in (None, "y")}
    np.testing.assert_array_equal(detail["b"], open_run(tmp_path / "b").statistic("absmax").sel(site=other).to_numpy())


def test_the_trajectory_widget_reads_a_sites_other_statistics_ahead(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.widgets.trajectories import SITE_STATISTIC, TrajectoryWidget

    paths = [write_synthetic_run(tmp_path / name, steps=150, sites=600, seed=4, diverge_at=at)
             for name, at in (("a", None), ("b", (70, 5)))]
    widget = TrajectoryWidget(tmp_path, runs=["a", "b"], quantity=SITE_STATISTIC, stat="l2")
    ws = widget.workspace
    assert ws is not None and ws.preloaded(timeout=300)
    site = widget.site.value
    reads: list[str] = []
    statistic = Run.statistic
    monkeypatch.setattr(Run, "statistic", lambda self, name, steps=None, **kw: (
        reads.append(name), statistic(self, name, steps, **kw))[1])
    widget.stat.value = "max"
    assert reads == []  # read ahead for this site, and not kept whole
    assert not any(stat == "max" for _, stat in ws.holding.keys("statistics"))
    for name, path in zip("ab", paths, strict=True):
        np.testing.assert_array_equal(widget.plotted[name].to_numpy(),
                                      open_run(path).statistic("max").sel(site=site).to_numpy())
    reads.clear()  # the reads just above
    other = next(s for s in widget.site.options if s != site)
    widget.site.value = other  # another site: read when chosen, and its other statistics read ahead
    assert ws.preloaded(timeout=300)
    held = {stat for _, stat in ws.holding.keys("statistics")}
    assert held == {"l2", "max"}  # the two shown, kept whole: nothing else
    # each other statistic of each run read once (the two held are taken from memory)
    assert sorted(reads) == sorted(2 * [s for s in STAT_NAMES if s != "l2"])
    reads.clear()
    widget.stat.value = "min"
    assert reads == [] and not any(key[2] == site for key in ws.holding.keys("series"))  # the earlier site's dropped


def test_a_statistic_the_background_is_computing_is_waited_for_not_read_again(tmp_path: Path) -> None:
    # The view holds the workspace's foreground, and the background's reads pause for it file by file: a view
    # that waited on those very bins with the foreground held would wait forever. It lets the background run.
    import contextlib
    import threading

    from workbench.figures.divergence import StepBins

    write_synthetic_run(tmp_path / "a", steps=150, sites=600, seed=4)
    write_synthetic_run(tmp_path / "b", steps=150, sites=600, seed=4, diverge_at=(70, 5))
    explorer = DivergenceExplorer(tmp_path, reference="a", other="b")
    ws = explorer.workspace
    assert ws is not None and ws.preloaded(timeout=300)
    key = ("a", "b", "max")
    ws.holding.drop("step_bins", unless=lambda held: held != key)
    computed: list[object] = []
    begun, view_waits = threading.Event(), threading.Event()
    behind = ws.ahead.behind_background

    @contextlib.contextmanager
    def behind_and_said():  # type: ignore[no-untyped-def]
        with behind():
            view_waits.set()
            yield

    ws.ahead.behind_background = behind_and_said  # type: ignore[method-assign]

    def compute() -> StepBins:  # a read-ahead task under way when the view begins
        begun.set()
        view_waits.wait(timeout=5)  # (never set without behind_background: then the reads below wait forever)
        values = tuple(ws.peek_stat_values(n, "max", pause=ws.ahead.pause) for n in "ab")  # pausing for the view
        return StepBins.of_values(ws.comparison("a", "b"), values)  # type: ignore[arg-type]

    background = threading.Thread(target=lambda: computed.append(ws.holding.once(
        "step_bins", key, compute, contextlib.nullcontext)), daemon=True)
    background.start()
    assert begun.wait(timeout=60)
    view = threading.Thread(target=lambda: setattr(explorer.stat, "value", "max"), daemon=True)
    view.start()
    view.join(timeout=60)
    assert not view.is_alive(), "the view and the background waited for each other"
    background.join(timeout=60)
    assert computed and computed[0][1]  # the background computed the bins ...
    assert ws.holding.peek("step_bins", key) is computed[0][0]  # ... and the view drew them, computing none


def _click(explorer: DivergenceExplorer, trace: int, step: int, site: str) -> None:
    """The message plotly's widget sends from the browser when a point of trace ``trace`` is clicked."""
    explorer.heatmap._js2py_pointsCallback = {
        "event_type": "plotly_click", "device_state": None, "selector": None,
        "points": {"trace_indexes": [trace], "point_indexes": [0], "xs": [step], "ys": [site]}}


def test_a_click_on_a_cell_on_the_frontier_or_in_the_site_list_shows_that_site(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "a", steps=12, sites=40, seed=4)
    write_synthetic_run(tmp_path / "b", steps=12, sites=40, seed=4, diverge_at=(5, 7))
    explorer = DivergenceExplorer(tmp_path, reference="a", other="b")
    heard: list[str] = []
    explorer.site_listeners.append(lambda site, stat, runs: heard.append(site))
    names = [trace.name for trace in explorer.heatmap.data]
    assert names[0] == "difference" and len(names) >= 2  # the heatmap, the frontier above it
    first = explorer.selected
    assert first is not None and first[1] == 5
    # the list: the sites that differ, in the order they first do, the first divergent site on top
    values = [value for _, value in explorer.site_list.options]
    assert values[0] == first[0] and explorer.site_list.value == first[0]
    assert explorer.site_list.options[0][0].startswith("step 5: ")
    steps = [int(label.split(":")[0].removeprefix("step ")) for label, _ in explorer.site_list.options]
    assert steps == sorted(steps) and steps[-1] > 5 and len(values) == 40
    other = values[-1]
    _click(explorer, 0, 9, other)  # a heatmap cell
    assert explorer.selected == (other, 9) and f"{other} " in explorer.detail.layout.title.text
    assert "clicked at step 9" in explorer.detail.layout.title.text and explorer.site_list.value == other
    _click(explorer, 1, 5, first[0])  # the frontier's point over a cell
    assert explorer.selected == first and explorer.site_list.value == first[0]
    explorer.site_list.value = values[1]  # no click at all
    assert explorer.selected is not None and explorer.selected[0] == values[1]
    assert heard == [other, first[0], values[1]]


def test_a_filter_that_leaves_the_detail_s_site_out_moves_the_detail_to_a_shown_site(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "a", steps=12, sites=40, seed=4)
    write_synthetic_run(tmp_path / "b", steps=12, sites=40, seed=4, diverge_at=(5, 7))
    explorer = DivergenceExplorer(tmp_path, reference="a", other="b")
    assert explorer.selected is not None
    shown = explorer.selected[0]
    others = [value for _, value in explorer.site_list.options if value != shown and ":" in value]
    kept = others[0].split(":", 1)[1]
    explorer.site_glob.value = f"*{kept}"  # a glob that leaves the detail's site out
    listed = [value for _, value in explorer.site_list.options]
    assert shown not in listed and explorer.selected is not None and explorer.selected[0] in listed
    assert explorer.selected[0] in explorer.detail.layout.title.text
