"""Seconds per exported file (PNG, SVG, PDF) for a batch of six figures, by way of export.

    python benchmarks/export_time.py [--repeats 3] [--single-repeats 1] [--out DIR]

Six moderately sized figures (three 200x300 heatmaps, three line charts of 4 traces x 2000 points, 700x500
layout pixels, scale 2) are written as PNG, SVG and PDF (18 files) four ways:

* ``write_image``: plotly's ``fig.write_image`` once per file, a fresh Chromium each time;
* ``sync server``: kaleido's ``start_sync_server()``, one ``write_fig_from_object_sync`` per file, ``stop``;
* ``write_images``: plotly's batch ``plotly.io.write_images`` (one browser; per-file times are not visible,
  so only the total is shown);
* ``export_figures``: this workbench's ``workbench.figures.export.export_figures`` (one browser).

Per method: the median over repeats of the total for 18 files, of the wait before the first file (browser
start-up plus one render), and, per format, the median seconds per file after the first. Needs a Chromium.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from workbench.figures.export import export_figures, static_export_available

FORMATS = ("png", "svg", "pdf")
WIDTH, HEIGHT, SCALE = 700, 500, 2.0
Timing = tuple[float, float, dict[str, list[float]]]
"""Total seconds, seconds to the first file, and seconds per later file by format."""


def make_figures() -> dict[str, go.Figure]:
    rng = np.random.default_rng(0)
    figures: dict[str, go.Figure] = {}
    for i in range(3):
        figures[f"heatmap_{i}"] = go.Figure(go.Heatmap(z=rng.normal(size=(200, 300))),  # 200 rows x 300 columns
                                            layout={"title": f"heatmap {i}"})
        lines = go.Figure(layout={"title": f"lines {i}"})
        for trace in range(4):
            lines.add_scatter(y=rng.normal(size=2000).cumsum(), name=f"trace {trace}")
        figures[f"lines_{i}"] = lines
    return figures


def jobs(figures: dict[str, go.Figure], out: Path) -> list[tuple[go.Figure, Path]]:
    """Figure-major, format-minor: the order export_figures writes in."""
    out.mkdir(parents=True, exist_ok=True)
    return [(fig, out / f"{name}.{fmt}") for name, fig in figures.items() for fmt in FORMATS]


def timed_calls(calls: list[tuple[str, Callable[[], object]]], before: Callable[[], object] | None = None,
                after: Callable[[], object] | None = None) -> Timing:
    start = time.perf_counter()
    if before is not None:
        before()
    stamps: list[tuple[str, float]] = []
    try:
        for fmt, call in calls:
            call()
            stamps.append((fmt, time.perf_counter()))
    finally:
        if after is not None:
            after()
    return from_stamps(start, stamps, time.perf_counter())


def from_stamps(start: float, stamps: list[tuple[str, float]], end: float) -> Timing:
    per_format: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
    for (_, previous), (fmt, now) in zip(stamps, stamps[1:]):
        per_format[fmt].append(now - previous)
    return end - start, stamps[0][1] - start, per_format


def by_write_image(figures: dict[str, go.Figure], out: Path) -> Timing:
    # Every call starts its own browser, so "per later file" is the whole call, not a gap between renders.
    per_format: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
    start = time.perf_counter()
    first = 0.0
    for fig, path in jobs(figures, out):
        t0 = time.perf_counter()
        fig.write_image(path, width=WIDTH, height=HEIGHT, scale=SCALE)
        per_format[path.suffix[1:]].append(time.perf_counter() - t0)
        first = first or time.perf_counter() - start
    return time.perf_counter() - start, first, per_format


def by_sync_server(figures: dict[str, go.Figure], out: Path) -> Timing:
    import kaleido

    def write(fig: go.Figure, path: Path) -> None:
        spec = {"fig": fig.to_dict(), "path": path,
                "opts": {"format": path.suffix[1:], "width": WIDTH, "height": HEIGHT, "scale": SCALE}}
        kaleido.write_fig_from_object_sync(spec, cancel_on_error=True)

    calls: list[tuple[str, Callable[[], object]]] = [
        (path.suffix[1:], functools.partial(write, fig, path)) for fig, path in jobs(figures, out)
    ]
    return timed_calls(calls, before=lambda: kaleido.start_sync_server(mathjax=False, silence_warnings=True),
                       after=lambda: kaleido.stop_sync_server(silence_warnings=True))


def by_write_images(figures: dict[str, go.Figure], out: Path) -> Timing:
    pairs = jobs(figures, out)
    start = time.perf_counter()
    pio.write_images([fig for fig, _ in pairs], [path for _, path in pairs], width=WIDTH, height=HEIGHT, scale=SCALE)
    return time.perf_counter() - start, float("nan"), {fmt: [] for fmt in FORMATS}


def by_export_figures(figures: dict[str, go.Figure], out: Path) -> Timing:
    stamps: list[tuple[str, float]] = []
    start = time.perf_counter()
    export_figures(figures, out, FORMATS, scale=SCALE, width=WIDTH, height=HEIGHT,
                   progress=lambda line: stamps.append((line.rsplit(".", 1)[-1], time.perf_counter())))
    return from_stamps(start, stamps, time.perf_counter())


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the one-browser methods")
    parser.add_argument("--single-repeats", type=int, default=1, help="repeats of write_image (~3 s per file)")
    parser.add_argument("--out", type=Path, default=None, help="keep the files here (default: a temporary folder)")
    args = parser.parse_args()
    browser = static_export_available()
    if browser is None:
        raise SystemExit("No Chromium found: install it (apt-get install chromium) or set BROWSER_PATH.")
    out = args.out or Path(tempfile.mkdtemp(prefix="export-time-"))
    figures = make_figures()
    methods: list[tuple[str, Callable[[dict[str, go.Figure], Path], Timing], int]] = [
        ("export_figures", by_export_figures, args.repeats),
        ("sync server", by_sync_server, args.repeats),
        ("write_images", by_write_images, args.repeats),
        ("write_image", by_write_image, args.single_repeats),
    ]
    print(f"browser {browser}; {len(figures)} figures x {len(FORMATS)} formats = {len(figures) * len(FORMATS)} files, "
          f"{WIDTH}x{HEIGHT} at scale {SCALE:g}; medians over repeats")
    print(f"{'method':>15} {'repeats':>7} {'total s':>8} {'first s':>8} "
          + " ".join(f"{fmt + ' s/file':>11}" for fmt in FORMATS))
    for label, method, repeats in methods:
        runs = [method(figures, out / label.replace(" ", "_") / str(i)) for i in range(repeats)]
        totals = [total for total, _, _ in runs]
        firsts = [first for _, first, _ in runs]
        per_format = {fmt: [s for _, _, by_fmt in runs for s in by_fmt[fmt]] for fmt in FORMATS}
        print(f"{label:>15} {repeats:>7} {median(totals):>8.2f} {median(firsts):>8.2f} "
              + " ".join(f"{median(per_format[fmt]):>11.3f}" for fmt in FORMATS))


if __name__ == "__main__":
    main()
