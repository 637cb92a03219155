"""The verbs that draw: ``figure`` (one figure, from ``studies.views``), ``report`` (every figure a set of
runs supports, with the findings and the manifests)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from workbench.cli._common import ProgressPrinter, SkippedRuns, prefixed, terminal_safe, writable_file
from workbench.errors import ArgumentError

FIGURES = ("heatmap", "pairs", "trajectories", "ladder", "sources", "cost")


def register(verbs: argparse._SubParsersAction) -> None:
    for add in (_add_figure, _add_report):
        add(verbs)


def _add_figure(verbs: argparse._SubParsersAction) -> None:
    figure = verbs.add_parser("figure", help="one figure without a notebook, sized for a screen or a paper")
    figure.add_argument("kind", choices=FIGURES,
                        help="heatmap A B: where two runs diverge; pairs DIR: every pair of a folder; "
                        "trajectories RUN... or DIR: a scalar of each run; ladder DIR: precision and layout "
                        "changes per layer; sources DIR: which nondeterminism source matters (an attribution "
                        "study); cost DIR: what deterministic mode costs")
    figure.add_argument("runs", type=Path, nargs="+", help="run folders, or a folder of runs")
    figure.add_argument("-o", "--out", type=writable_file, required=True, help="the file: .png, .svg, .pdf or .html")
    figure.add_argument("--size", choices=("screen", "column", "page"), default="screen",
                        help="column: ~3.5 in wide, page: ~7 in (fonts 7-8 pt); screen: as in the notebooks")
    figure.add_argument("--data", type=writable_file, default=None, help="also write the plotted data as CSV")
    figure.add_argument("--stat", default="l2", help="heatmap, ladder, sources: the statistic (default l2)")
    figure.add_argument("--quantity", default="loss", help="trajectories: the scalar (default loss)")
    figure.set_defaults(func=_figure)


def _figure(args: argparse.Namespace) -> int:
    from workbench.figures.export import FORMATS, export_figures
    from workbench.figures.style import for_paper
    from workbench.statistics import STAT_NAMES
    from workbench.store.layout import SCALAR_FIELDS
    from workbench.studies import views
    from workbench.studies.workspace import Workspace

    fmt = args.out.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ArgumentError(f"-o {args.out}: the file's extension says the format, one of {', '.join(FORMATS)}")
    if args.stat not in STAT_NAMES:
        raise ArgumentError(f"--stat {args.stat!r}: no such statistic; one of {', '.join(STAT_NAMES)}")
    if args.quantity not in SCALAR_FIELDS:
        raise ArgumentError(f"--quantity {args.quantity!r}: no such per-step scalar; one of {', '.join(SCALAR_FIELDS)}")
    skipped = SkippedRuns()
    ws = Workspace.open(*args.runs, on_skip=skipped)
    names = [p.resolve().name for p in args.runs]
    named = names if all(n in ws.runs for n in names) else None  # run folders, not a folder of runs
    if args.kind == "heatmap":
        if len(names) != 2:
            raise ArgumentError(f"figure heatmap takes two runs (A B), not {len(names)}")
        view = views.heatmap(ws, names[0], names[1], args.stat)
    elif args.kind == "trajectories":  # named runs: the first is the reference; a folder: every run
        view = views.trajectories(ws, args.quantity, named)
    elif args.kind == "ladder":
        view = views.ladder(ws, named[1:] if named else None, stat=args.stat)
    elif args.kind == "sources":
        view = views.sources(ws, args.stat)
    else:
        view = views.pairs(ws) if args.kind == "pairs" else views.cost(ws)
    figure = for_paper(view.figure, args.size) if args.size != "screen" else view.figure
    (path,) = export_figures({args.out.stem: figure}, args.out.parent, [fmt])
    print(f"wrote {path}")
    if args.data is not None:
        args.data.parent.mkdir(parents=True, exist_ok=True)
        view.data.to_csv(args.data, index=view.indexed)
        print(f"wrote {args.data} (the plotted data)")
    sys.stdout.flush()
    skipped.say()
    return 0


def _add_report(verbs: argparse._SubParsersAction) -> None:
    report = verbs.add_parser("report", help="write a self-contained report (figures, findings, manifests)")
    report.add_argument("runs", type=Path, nargs="+", help="run folders, or folders of runs")
    report.add_argument("-o", "--output", type=writable_file, required=True, help="report file (.html or .pdf)")
    report.add_argument("--format", choices=["html", "pdf"], default=None,
                        help="default: from the output file's suffix")
    report.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from workbench.studies.report import write_report
    from workbench.studies.workspace import Workspace

    suffix = args.output.suffix.lower()
    if suffix not in ("", ".html", ".htm", ".pdf"):  # an HTML file named .docx is not what was asked for
        raise ArgumentError(f"report: {terminal_safe(str(args.output))}: a report is .html or .pdf (or a name "
                            f"without a suffix, with --format), not {terminal_safe(suffix)}")
    fmt = args.format or ("pdf" if suffix == ".pdf" else "html")
    if suffix and fmt != ("pdf" if suffix == ".pdf" else "html"):
        raise ArgumentError(f"report: --format {fmt} and a {suffix} file disagree")
    printer = ProgressPrinter()
    start = time.monotonic()
    skipped = SkippedRuns()
    path = write_report(Workspace.open(*args.runs, on_skip=skipped), args.output, fmt=fmt,
                        progress=prefixed(printer, "report: "))
    printer(f"report: wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in {time.monotonic() - start:.1f} s",
            final=True)
    skipped.say()
    return 0
