"""Update latency of the widgets on a 10,000-step x 1,000-site pair of runs.

    python benchmarks/widget_latency.py [--dir /tmp/workbench-scale] [--steps 10000] [--sites 1000]

Uses (and, the first time, writes) the synthetic pair of ``benchmarks/scale.py``. Times the
Python side of each interaction (filters, binning, figure build, FigureWidget update;
median of ``--repeats``); the browser's own rendering is not included. Each widget reads
every statistic of its runs in the background once it is open (``Workspace.preload``), then
computes the other statistics' views (``Workspace.read_ahead``); the benchmark says when that
ended, then times a new statistic the first time and when cached. The first import of the
widgets (plotly's widget module and what it imports, once per kernel) is timed on its own.
Then the trajectory, ladder, cost and pair-matrix widgets: each one's opening, when
its background read ended, and each control's change (wall time of the change, first time
and median of the repeats).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from scale import ensure_pair  # type: ignore[import-not-found]


def timed(action: Callable[[], None], explorer, repeats: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeats):
        action()
        samples.append(explorer.last_update_s)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/workbench-scale"))
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--sites", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    a, b, _ = ensure_pair(args.dir, args.steps, args.sites)

    start = time.perf_counter()
    import plotly.graph_objects as go

    go.FigureWidget  # noqa: B018 - imported on first use: plotly's widget module and what it imports
    from workbench.widgets.explorer import DivergenceExplorer
    print(f"import the widgets (once per kernel): {time.perf_counter() - start:.2f} s")

    start = time.perf_counter()
    explorer = DivergenceExplorer(a.parent, reference=a.name, other=b.name)
    print(f"open the folder and show the first heatmap: {time.perf_counter() - start:.2f} s")
    waited = time.perf_counter()
    explorer.workspace.preloaded()  # type: ignore[union-attr]
    print(f"every statistic read, and the other statistics' views computed, in the background "
          f"{time.perf_counter() - start:.2f} s after opening "
          f"(waited {time.perf_counter() - waited:.2f} s more)")
    rows = []
    start = time.perf_counter()
    explorer.stat.value = "max"
    rows.append(("statistic, first time (read ahead in the background)", time.perf_counter() - start))
    stats = iter(["l2", "max"] * args.repeats)
    rows.append(("statistic, cached", timed(lambda: setattr(explorer.stat, "value", next(stats)), explorer,
                                            args.repeats)))
    globs = iter(["*mlp*", "*"] * args.repeats)
    rows.append(("site glob", timed(lambda: setattr(explorer.site_glob, "value", next(globs)), explorer,
                                    args.repeats)))
    kinds = iter([("act", "grad"), tuple(explorer.kinds.options)] * args.repeats)
    rows.append(("kinds", timed(lambda: setattr(explorer.kinds, "value", next(kinds)), explorer, args.repeats)))
    top = explorer.layers.max
    layers = iter([(2, 5), (0, top)] * args.repeats)
    rows.append(("layer range", timed(lambda: setattr(explorer.layers, "value", next(layers)), explorer,
                                      args.repeats)))
    steps = iter([(3_000, 6_000), (0, args.steps - 1)] * args.repeats)
    rows.append(("step range", timed(lambda: setattr(explorer.steps, "value", next(steps)), explorer, args.repeats)))
    site = explorer.workspace.records(a.name).sites[500]  # type: ignore[union-attr]
    clicks = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        explorer.show_site(site, 5_000)
        clicks.append(time.perf_counter() - start)
    rows.append(("click a cell (site trajectories)", statistics.median(clicks)))
    print(f"\n{args.steps} steps x {args.sites} sites, median of {args.repeats} (Python side):")
    for label, seconds in rows:
        print(f"  {label:<48} {1000 * seconds:8.0f} ms")
    other_widgets(a, b, site, args)


def changes(control, values: list, repeats: int) -> tuple[float, float]:  # type: ignore[no-untyped-def, type-arg]
    """(first change, median of the later ones) in seconds, alternating ``values``."""
    samples = []
    for i in range(1 + repeats):
        start = time.perf_counter()
        control.value = values[i % len(values)]
        samples.append(time.perf_counter() - start)
    return samples[0], statistics.median(samples[1:])


def other_widgets(a: Path, b: Path, site: str, args: argparse.Namespace) -> None:
    from workbench.widgets.cost import CostWidget
    from workbench.widgets.ladder import LadderWidget
    from workbench.widgets.pairs import PairMatrixWidget
    from workbench.widgets.trajectories import SITE_STATISTIC, TrajectoryWidget

    rows: list[tuple[str, float, float | None]] = []
    for label, make in (("trajectories", lambda: TrajectoryWidget(a.parent, runs=[a.name, b.name])),
                        ("ladder", lambda: LadderWidget(a.parent, runs=[b.name])),
                        ("cost", lambda: CostWidget(a.parent)),
                        ("pair matrix", lambda: PairMatrixWidget(a.parent))):
        start = time.perf_counter()
        widget = make()
        rows.append((f"{label}: open", time.perf_counter() - start, None))
        if getattr(widget, "workspace", None) is not None:
            widget.workspace.preloaded()
            rows.append((f"{label}: background work done after opening", time.perf_counter() - start, None))
        if label == "trajectories":
            rows.append(("trajectories: quantity -> site statistic",
                         *changes(widget.quantity, [SITE_STATISTIC, "loss"], args.repeats)))
            widget.quantity.value = SITE_STATISTIC
            other = widget.site.options[len(widget.site.options) // 3]
            rows.append(("trajectories: site", *changes(widget.site, [site, other], args.repeats)))
            rows.append(("trajectories: statistic", *changes(widget.stat, ["max", "l2"], args.repeats)))
            rows.append(("trajectories: relative difference",
                         *changes(widget.difference, ["relative", "absolute"], args.repeats)))
            rows.append(("trajectories: step range",
                         *changes(widget.steps, [(3_000, 6_000), (0, args.steps - 1)], args.repeats)))
        elif label == "ladder":
            rows.append(("ladder: statistic", *changes(widget.stat, ["max", "l2"], args.repeats)))
            top = widget.layers.max
            rows.append(("ladder: layer range", *changes(widget.layers, [(2, 5), (0, top)], args.repeats)))
        elif label == "cost":
            rows.append(("cost: warm-up", *changes(widget.warmup, [5, 2], args.repeats)))
            rows.append(("cost: interval", *changes(widget.interval, [90.0, 95.0], args.repeats)))
    print(f"\nother widgets, {args.steps} steps x {args.sites} sites (wall time; first change, then the median "
          f"of {args.repeats}):")
    for label, first, later in rows:
        median = f"{1000 * later:8.0f} ms" if later is not None else ""
        print(f"  {label:<48} {1000 * first:8.0f} ms {median}")


if __name__ == "__main__":
    main()
