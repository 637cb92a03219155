"""Update latency and memory of the widgets on a 10,000-step x 1,000-site pair of runs, store layouts side by side.

    python benchmarks/widget_latency.py [--dir /tmp/workbench-scale] [--steps 10000] [--sites 1000]
                                        [--variants 2:zarr 3:zarr 3:direct] [--code . /tmp/before]

Uses (and, the first time, writes) the synthetic pair of ``benchmarks/scale.py`` in each store layout, and
measures each variant (``SCHEMA:READER``) in a fresh process of its own, one after the other, then prints them
side by side. Schema 2: every statistic of 64 steps in one chunk; 3: one statistic per chunk, in shards.
Reader ``zarr``: every array read through zarr-python (``store.chunk_files`` switched off in that process);
``direct``: the store's own arrays read from their chunk files (``layout.read``, the default). ``2:zarr`` is
the code before schema 3, ``3:direct`` the code now. ``--code``: measure each variant with the ``workbench``
package of each checkout named (``git worktree add /tmp/before REV``), one after the other, side by side in one
run (default: this checkout alone). Memory: the process's
resident memory after the widgets' imports, after opening the explorer and its background work, and at the
end of the interactions below (the explorer's session alone; the other widgets follow). Times the
Python side of each interaction (filters, binning, figure build, FigureWidget update;
median of ``--repeats``); the browser's own rendering is not included. Each widget reads
every statistic of its runs in the background once it is open (``Workspace.preload``), then
computes the other statistics' views (``Workspace.read_ahead``); the benchmark times a new statistic chosen
as that runs, says when it ended, then times a new statistic the first time and when cached. The first
import of the widgets (plotly's widget module and what it imports, once per kernel) is timed on its own.
Then the trajectory, ladder, cost and pair-matrix widgets: each one's opening, when
its background read ended, and each control's change (wall time of the change, first time
and median of the repeats); the trajectory widget's statistic changes once the chosen site's other
statistics are read ahead (``Workspace.read_site_ahead``, schema 3), and the benchmark says how long that took.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from scale import ensure_pair, pair_parser  # type: ignore[import-not-found]


def timed(action: Callable[[], None], explorer, repeats: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeats):
        action()
        samples.append(explorer.last_update_s)
    return statistics.median(samples)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


ROWS: list[tuple[str, float, float | None]] = []
"""(what, first or only, median of the later ones or None): what a measuring process prints as JSON."""


def row(label: str, first: float, later: float | None = None) -> None:
    ROWS.append((label, first, later))


def main() -> None:
    parser = pair_parser(__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["2:zarr", "3:zarr", "3:direct"],
                        help="SCHEMA:READER, READER zarr or direct")
    parser.add_argument("--code", nargs="+", type=Path, default=[Path(__file__).resolve().parents[1]],
                        help="checkouts whose workbench package each variant is measured with (default: this one)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a measuring process, of this variant
    args = parser.parse_args()
    if args.measure is None:
        compare_layouts(args)
        return
    measure(args)
    sys.stdout.write(json.dumps(ROWS) + "\n")


def _variant(text: str) -> tuple[int, str]:
    schema, _, reader = text.partition(":")
    if not schema.isdigit() or reader not in ("zarr", "direct"):
        raise SystemExit(f"--variants: {text!r} is not SCHEMA:READER with READER zarr or direct")
    return int(schema), reader


def compare_layouts(args: argparse.Namespace) -> None:
    for variant in args.variants:
        ensure_pair(args.dir, args.steps, args.sites, _variant(variant)[0])
    results = {}
    columns = [(variant, code) for variant in args.variants for code in args.code]
    for variant, code in columns:
        command = [sys.executable, __file__, "--dir", str(args.dir), "--steps", str(args.steps), "--sites",
                   str(args.sites), "--repeats", str(args.repeats), "--measure", variant]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
        results[variant, code] = json.loads(done.stdout.strip().splitlines()[-1])
    labels = [row[0] for row in results[columns[0]]]
    named = {code: (_revision(code) if len(args.code) > 1 else "") for code in args.code}
    header = "".join(f"{'schema ' + v.replace(':', ', ') + named[c]:>30}" for v, c in columns)
    sys.stdout.write(f"{args.steps} steps x {args.sites} sites; each variant measured in a process of its own "
                     f"(first, then median of {args.repeats} later changes where two figures)\n")
    sys.stdout.write(f"{'':<58}{header}\n")
    for i, label in enumerate(labels):
        cells = []
        for column in columns:
            _, first, later = results[column][i] if i < len(results[column]) else (label, float("nan"), None)
            unit = "MB" if label.startswith("memory") else "ms"
            scale = 1 if unit == "MB" else 1000
            cell = f"{scale * first:.0f}" + (f" / {scale * later:.0f}" if later is not None else "") + f" {unit}"
            cells.append(f"{cell:>30}")
        sys.stdout.write(f"{label:<58}{''.join(cells)}\n")


def _revision(code: Path) -> str:
    """`` @ REV`` of a checkout: its commit, and ``+`` if its files differ from it."""
    head = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(code), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    return f" @ {head.stdout.strip() or code.name}{'+' if dirty.stdout.strip() else ''}"


def measure(args: argparse.Namespace) -> None:
    schema, reader = _variant(args.measure)
    a, b, _ = ensure_pair(args.dir, args.steps, args.sites, schema)
    start = time.perf_counter()
    import plotly.graph_objects as go

    go.FigureWidget  # noqa: B018 - imported on first use: plotly's widget module and what it imports
    from workbench.widgets.explorer import DivergenceExplorer
    row("import the widgets (once per kernel)", time.perf_counter() - start)
    if reader == "zarr":
        from workbench.store import chunk_files

        chunk_files.read_selection = lambda node, selection, **_: None  # every read through zarr-python
    imported = rss_mb()
    row("memory: the process once the widgets are imported (MB)", imported)

    site = explorer_session(DivergenceExplorer, a, b, args, imported)
    gc.collect()  # the explorer is gone: the other widgets start from the imports' memory
    other_widgets(a, b, site, args)


def explorer_session(explorer_class: type, a: Path, b: Path, args: argparse.Namespace, imported: float) -> str:
    """Open the explorer and change each control; the site it clicked."""
    start = time.perf_counter()
    explorer = explorer_class(a.parent, reference=a.name, other=b.name)
    row("explorer: open the folder and show the first heatmap", time.perf_counter() - start)
    changed = time.perf_counter()
    explorer.stat.value = "min"
    row("explorer: a new statistic, chosen as the background runs", time.perf_counter() - changed)
    row("explorer: ... its first figure (the heatmap)", explorer.last_update_s)
    explorer.workspace.preloaded()  # type: ignore[union-attr]
    row("explorer: background reads and views done after opening", time.perf_counter() - start)
    row("memory: explorer opened, background done (+MB per run)", (rss_mb() - imported) / 2)
    start = time.perf_counter()
    explorer.stat.value = "max"
    row("explorer: a statistic not shown before", time.perf_counter() - start)
    start = time.perf_counter()
    explorer.stat.value = "absmax"
    row("explorer: another statistic not shown before", time.perf_counter() - start)
    stats = iter(["l2", "max"] * args.repeats)
    row("explorer: statistic, back and forth", timed(lambda: setattr(explorer.stat, "value", next(stats)),
                                                      explorer, args.repeats))
    globs = iter(["*mlp*", "*"] * args.repeats)
    row("explorer: site glob", timed(lambda: setattr(explorer.site_glob, "value", next(globs)), explorer,
                                     args.repeats))
    kinds = iter([("act", "grad"), tuple(explorer.kinds.options)] * args.repeats)
    row("explorer: kinds", timed(lambda: setattr(explorer.kinds, "value", next(kinds)), explorer, args.repeats))
    top = explorer.layers.max
    layers = iter([(2, 5), (0, top)] * args.repeats)
    row("explorer: layer range", timed(lambda: setattr(explorer.layers, "value", next(layers)), explorer,
                                       args.repeats))
    steps = iter([(3_000, 6_000), (0, args.steps - 1)] * args.repeats)
    row("explorer: step range", timed(lambda: setattr(explorer.steps, "value", next(steps)), explorer,
                                      args.repeats))
    site = explorer.workspace.runs[a.name].site_names()[500]  # type: ignore[union-attr]
    clicks = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        explorer.show_site(site, 5_000)
        clicks.append(time.perf_counter() - start)
    row("explorer: click a cell (site trajectories)", statistics.median(clicks))
    explorer.workspace.preloaded()  # type: ignore[union-attr]  # what the clicks started in the background
    row("memory: the explorer's session at its end (+MB per run)", (rss_mb() - imported) / 2)
    return str(site)


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

    for label, make in (("trajectories", lambda: TrajectoryWidget(a.parent, runs=[a.name, b.name])),
                        ("ladder", lambda: LadderWidget(a.parent, runs=[b.name])),
                        ("cost", lambda: CostWidget(a.parent)),
                        ("pair matrix", lambda: PairMatrixWidget(a.parent))):
        gc.collect()
        held = rss_mb()
        start = time.perf_counter()
        widget = make()
        row(f"{label}: open", time.perf_counter() - start)
        if getattr(widget, "workspace", None) is not None:
            widget.workspace.preloaded()
            row(f"{label}: background work done after opening", time.perf_counter() - start)
            row(f"memory: {label} opened, background done (+MB per run)", (rss_mb() - held) / 2)
        if label == "trajectories":
            row("trajectories: quantity -> site statistic",
                         *changes(widget.quantity, [SITE_STATISTIC, "loss"], args.repeats))
            widget.quantity.value = SITE_STATISTIC
            other = widget.site.options[len(widget.site.options) // 3]
            row("trajectories: site", *changes(widget.site, [site, other], args.repeats))
            start = time.perf_counter()
            widget.workspace.preloaded()
            row("trajectories: the site's other statistics read ahead, done after", time.perf_counter() - start)
            row("trajectories: statistic", *changes(widget.stat, ["max", "l2"], args.repeats))
            row("trajectories: relative difference",
                         *changes(widget.difference, ["relative", "|difference|"], args.repeats))
            row("trajectories: step range",
                         *changes(widget.steps, [(3_000, 6_000), (0, args.steps - 1)], args.repeats))
        elif label == "ladder":
            row("ladder: statistic", *changes(widget.stat, ["max", "l2"], args.repeats))
            top = widget.layers.max
            row("ladder: layer range", *changes(widget.layers, [(2, 5), (0, top)], args.repeats))
        elif label == "cost":
            row("cost: warm-up", *changes(widget.warmup, [5, 2], args.repeats))
            row("cost: interval", *changes(widget.interval, [90.0, 95.0], args.repeats))
        del widget


if __name__ == "__main__":
    main()
