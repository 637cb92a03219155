"""A self-contained report of a set of runs: every figure (interactive), the findings, the manifests.

    workbench report data/runs/demo -o report.html
    workbench report data/runs/demo -o report.pdf --format pdf

``report_figures`` picks the figures a set of runs supports: losses against the noise
floor with every run's anomalies marked (and listed in a table), the heatmap and growth of
each run against the reference (repeats against each other), the precision/layout ladder,
element-wise snapshot differences, and the cost of determinism. The HTML file embeds
plotly.js once and works offline; the PDF is the same page with static SVG figures printed
by headless Chromium on A4: tables wrap their cells and preformatted text its lines to the
page's width, and each figure is drawn the page's width across and (unless it needs more)
half its height, so two figures share a page.
"""

from __future__ import annotations

import errno
import html
import json
import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.offline

from workbench import disk
from workbench.errors import ExportError
from workbench.figures.divergence import amplification_figure
from workbench.figures.elementwise import elementwise_figure
from workbench.figures.style import legend_height, legend_rows, resized
from workbench.studies import views
from workbench.studies.summary import StudySummary, summarise
from workbench.studies.workspace import Workspace
from workbench.words import counted

MAX_PAIRS = 8
"""Heatmap and growth figures for at most this many pairs, so a report of a large study stays readable."""
MAX_ANOMALY_ROWS = 40
"""Rows of the anomaly table shown; the loss figure marks them all."""
PRINT_WIDTH = 700
"""Pixels a figure of the PDF is wide: A4 less 12 mm margins is 186 mm, 703 CSS pixels at 96 per inch."""
PRINT_HALF_PAGE = 480
"""Most pixels a figure of the PDF is high when two share a page (A4 less margins is 273 mm, 1032 pixels,
less the gaps around them)."""
PRINT_FULL_PAGE = 1000
"""Most pixels a figure of the PDF is high when it needs a page of its own."""
PRINT_HEATMAP_ROWS = 100
"""A heatmap of more rows (sites) than this is printed a page high."""
PRINT_SIDE_LEGEND = 10
"""Most entries a legend beside a printed figure holds; a longer one goes above the plot."""


def comparison_pairs(ws: Workspace) -> list[tuple[str, str]]:
    """Pairs worth a heatmap: repeats against their first repeat, then every other run against the reference."""
    pairs: list[tuple[str, str]] = []
    for first, *rest in ws.roles.repeat_groups:
        pairs += [(first, other) for other in rest]
    pairs += [(ws.roles.reference, n) for n in ws.recorded if n != ws.roles.reference and n not in ws.roles.repeats]
    return pairs[:MAX_PAIRS]


def _table(frame: pd.DataFrame, *, index: bool = False, floats: Callable[[float], str] | None = None) -> str:
    """``frame`` as an HTML table whose cells wrap: names may break after their dots and underscores
    (``leaves_floor_at``, ``grad:embedding.word_embeddings.weight``), so a wide table fits the page."""
    table = frame.to_html(index=index, float_format=floats, border=0, classes="data", na_rep="NaN", escape=True)
    # in text only (tags hold neither), and not in numbers: 1.5e-03 stays whole (a browser breaks after a hyphen)
    return "".join(part if part.startswith("<") else
                   _NUMBER.sub(r'<span class="num">\g<0></span>', _BREAK_AFTER.sub(r"\1<wbr>", part))
                   for part in re.split(r"(<[^>]*>)", table))


_BREAK_AFTER = re.compile(r"(?<=[A-Za-z])([._])(?=[A-Za-z])")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?[eE][-+]\d+\b")
"""A number in exponent form, kept on one line."""


def _anomaly_html(found: pd.DataFrame) -> str:
    if found.empty:
        return "<p>no anomalies in any run</p>"
    shown = found[["run", "step", "rule", "site", "value"]].head(MAX_ANOMALY_ROWS)
    more = f"<p>... and {len(found) - len(shown)} more</p>" if len(found) > len(shown) else ""
    return _table(shown, floats=lambda x: f"{x:.4g}") + more


def report_figures(ws: Workspace) -> dict[str, go.Figure]:
    """Figures by file-safe name, in reading order."""
    figures = {"loss": views.trajectories(ws, "loss", title="loss of every run", anomalies=True).figure}
    for a, b in comparison_pairs(ws):
        result = ws.comparison(a, b, cells=True)
        figures[f"heatmap-{a}-vs-{b}"] = views.heatmap(ws, a, b).figure
        if not result.identical:
            figures[f"growth-{a}-vs-{b}"] = amplification_figure(
                result, provenance=ws.provenance([a, b]), relative=ws.relative_difference(a, b, "l2"))
        for step in sorted(set(ws.runs[a].snapshots()) & set(ws.runs[b].snapshots()))[:1]:
            differences = ws.snapshot_differences(a, b, step)
            if differences and not all(d.identical for d in differences.values()):
                figures[f"elementwise-{a}-vs-{b}-step{step}"] = elementwise_figure(
                    differences, step=step, a=a, b=b, provenance=ws.provenance([a, b]))
    if ws.roles.others:
        figures["ladder"] = views.ladder(ws).figure
    if not ws.cost().empty:
        figures["cost"] = views.cost(ws).figure
    if not ws.attribution().empty:
        figures["sources"] = views.sources(ws).figure
    return figures


def _page(summary: StudySummary, ws: Workspace, bodies: dict[str, str], head: str, *, printed: bool = False) -> str:
    """The report's HTML; ``printed`` (the PDF's page): every manifest open, as a page cannot be clicked."""
    # a finding's further lines (the environments that differ) kept as lines, not run into its first
    findings = "".join(f"<li>{'<br>'.join(html.escape(part.strip()) for part in line.splitlines())}</li>"
                       for line in summary.findings)
    tables = "".join(f"<h3>{html.escape(t.heading[:1].upper() + t.heading[1:])}</h3>"
                     f"{_table(t.frame, index=t.index, floats=t.format)}" for t in summary.tables())
    manifests = "".join(
        f"<details{' open' if printed else ''}><summary>{html.escape(name)} ({html.escape(run.run_id)})</summary>"
        f"<pre>{html.escape(json.dumps(run.attrs, indent=1, default=str))}</pre></details>"
        for name, run in ws.runs.items())
    figures = "".join(f'<section class="figure" id="{html.escape(name)}">{body}</section>'
                      for name, body in bodies.items())
    runs = _table(summary.runs.drop(columns=["path"]), floats=lambda x: f"{x:.4f}")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Divergence report</title>{head}
<style>{_STYLE}</style></head><body>
<h1>Divergence report</h1>
<h2>Runs</h2>{runs}
<h2>Findings (reference {html.escape(summary.reference)})</h2><ul>{findings}</ul>
{tables}
<h2>Anomalies</h2>{_anomaly_html(views.anomaly_marks(ws))}
<h2>Figures</h2>{figures}
<h2>Manifests</h2>{manifests}
</body></html>
"""


_STYLE = """
@page { size: A4; margin: 12mm; }
body { font-family: "DejaVu Sans", Arial, sans-serif; max-width: 1150px; margin: 2em auto; color: #222; }
h3 { font-size: 1em; font-weight: 600; margin: 1.2em 0 0.4em; }
li { margin: 0.3em 0; overflow-wrap: anywhere; }
pre { font-size: 11px; background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; overflow-wrap: anywhere; }
table.data { border-collapse: collapse; font-size: 12px; margin: 0.3em 0 0.8em; }
table.data th, table.data td { padding: 2px 8px; border-bottom: 1px solid #e2e2e2; text-align: left;
                               vertical-align: top; overflow-wrap: break-word; }
table.data th { background: #f0f0f0; }
span.num { white-space: nowrap; }
section.figure { margin: 1em 0; break-inside: avoid; page-break-inside: avoid; }
section.figure > svg { display: block; max-width: 100%; height: auto; }
@media print {
  body { margin: 0; max-width: none; font-size: 12px; }
  h2, h3 { break-after: avoid; page-break-after: avoid; }
  table.data { font-size: 10px; }
  section.figure { margin: 0.3em 0; }
}
"""
"""Tables and text wrap within the page (no box scrolls: a scroll bar would be printed)."""


def _for_print(fig: go.Figure) -> go.Figure:
    """``fig`` at the width of the page and half its height (two to a page); one that needs more than ~600 px
    (a heatmap of many layers, its labels 14 px apart) keeps its height, up to a page. Wider figures keep their
    width and are scaled to the page; a heatmap of more than ``PRINT_HEATMAP_ROWS`` rows takes a page. A side
    legend of more than ``PRINT_SIDE_LEGEND`` entries goes above the plot, in rows, the figure taller by them:
    beside the plot it left a 700 px page 2.7 in for the data (the loss of 23 runs)."""
    height = fig.layout.height or 520
    height = min(height, PRINT_HALF_PAGE) if height <= 600 else min(height, PRINT_FULL_PAGE)
    sites = max((len(t.z) for t in fig.data if t.type == "heatmap" and t.z is not None), default=0)
    if sites > PRINT_HEATMAP_ROWS:  # a page of its own: 307 sites in 2 in were lines, not rows
        height = PRINT_FULL_PAGE
    width = max(fig.layout.width or 0, PRINT_WIDTH)
    entries = [str(t.name) for t in fig.data if t.showlegend is not False and t.name]
    if fig.layout.legend.orientation != "h" and len(entries) > PRINT_SIDE_LEGEND:
        fig = go.Figure(fig)
        grown = round(legend_rows(entries, 0.9 * width) * 22)
        fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom"),
                          title=dict(yref="container", y=1.0, yanchor="top", pad=dict(t=14)),
                          margin=dict(t=(fig.layout.margin.t or 60) + grown, r=30))
        return resized(fig, width, min(height + grown, PRINT_FULL_PAGE))
    # never below the height its legend needs (a loss figure of 13 runs): plotly cuts the legend, not the plot
    return resized(fig, width, min(max(height, legend_height(fig)), PRINT_FULL_PAGE))


def write_report(ws: Workspace, out: str | Path, *, fmt: str = "html",
                 progress: Callable[[str], None] | None = None) -> Path:
    """Write the report of ``ws`` to ``out`` as ``html`` or ``pdf``; returns the path."""
    if fmt not in ("html", "pdf"):
        raise ExportError(f"report format {fmt!r} is not one of html, pdf")
    out = Path(out)
    say = progress or (lambda message: None)
    say("analysing the runs")
    summary = summarise(ws)
    figures = report_figures(ws)
    say(counted(len(figures), "figure"))
    if fmt == "html":
        head = f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        # the plot's own id apart from its section's (the section's is the figure's anchor): one element per id
        bodies = {name: fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"{name}-plot")
                  for name, fig in figures.items()}
        text = _page(summary, ws, bodies, head).encode("utf-8")
        with disk.written(out, needed=len(text)) as partial:  # a full disk leaves no 0-byte report
            partial.write_bytes(text)
        return out
    from workbench.figures.export import export_figures

    with tempfile.TemporaryDirectory() as tmp:
        printed = {name: _for_print(fig) for name, fig in figures.items()}
        written = export_figures(printed, tmp, ["svg"], scale=1.0, progress=say)
        bodies = {path.stem: path.read_text(encoding="utf-8") for path in written}
        page = Path(tmp) / "report.html"
        page.write_text(_page(summary, ws, bodies, "", printed=True), encoding="utf-8")
        say("printing to PDF")
        with disk.written(out) as partial:  # no browser or a full disk: no folder made for it stays
            _print_pdf(page, partial, out)
    return out


def _print_pdf(page: Path, out: Path, shown: Path) -> None:
    """Print ``page`` to ``out`` with Chromium; errors name ``shown`` (the file the user asked for)."""
    from workbench.figures.export import static_export_available

    browser = static_export_available()
    if browser is None:
        raise ExportError("a PDF report needs Chrome or Chromium (Debian/Ubuntu: apt-get install chromium, or set "
                          "BROWSER_PATH); the HTML report (--format html) needs none")
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-pdf-header-footer",
               f"--print-to-pdf={out.resolve()}", page.resolve().as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    if "No space left on device" in done.stderr:
        raise OSError(errno.ENOSPC, "No space left on device", str(shown))
    if done.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
        raise ExportError(f"Chromium could not print the report to {shown}: {done.stderr.strip()[-300:]}")
