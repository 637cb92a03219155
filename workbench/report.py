"""A self-contained report of a set of runs: every figure (interactive), the findings, the manifests.

    workbench report data/runs/demo -o report.html
    workbench report data/runs/demo -o report.pdf --format pdf

``report_figures`` picks the figures a set of runs supports: losses against the noise
floor with every run's anomalies marked (and listed in a table), the heatmap and growth of
each run against the reference (repeats against each other), the precision/layout ladder,
element-wise snapshot differences, and the cost of determinism. The HTML file embeds
plotly.js once and works offline; the PDF is the same page with static SVG figures printed
by headless Chromium.
"""

from __future__ import annotations

import html
import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.offline

from workbench.analysis.anomalies import COLUMNS as ANOMALY_COLUMNS
from workbench.errors import ExportError
from workbench.figures.divergence import amplification_figure, divergence_heatmap
from workbench.figures.studies import cost_figure, elementwise_figure, ladder_figure, sources_figure
from workbench.figures.trajectories import trajectory_figure
from workbench.study_report import StudySummary, summarise
from workbench.workspace import Workspace

MAX_PAIRS = 8
"""Heatmap and growth figures for at most this many pairs, so a report of a large study stays readable."""
MAX_ANOMALY_ROWS = 40
"""Rows of the anomaly table shown; the loss figure marks them all."""


def comparison_pairs(ws: Workspace) -> list[tuple[str, str]]:
    """Pairs worth a heatmap: repeats against their first repeat, then every other run against the reference."""
    pairs: list[tuple[str, str]] = []
    for first, *rest in ws.repeat_groups:
        pairs += [(first, other) for other in rest]
    pairs += [(ws.reference, n) for n in ws.recorded if n != ws.reference and n not in ws.repeats]
    return pairs[:MAX_PAIRS]


def anomaly_table(ws: Workspace) -> pd.DataFrame:
    """``Workspace.anomalies`` of every run in one table, with a leading ``run`` column."""
    tables = [ws.anomalies(name).assign(run=name) for name in ws.names]
    tables = [t for t in tables if not t.empty]  # pandas warns about concatenating empty tables
    if not tables:
        return pd.DataFrame(columns=["run", *ANOMALY_COLUMNS])
    return pd.concat(tables, ignore_index=True)[["run", *ANOMALY_COLUMNS]]


def _anomaly_text(found: pd.DataFrame) -> str:
    if found.empty:
        return "no anomalies in any run"
    shown = found[["run", "step", "rule", "site", "value"]].head(MAX_ANOMALY_ROWS)
    more = f"\n... and {len(found) - len(shown)} more" if len(found) > len(shown) else ""
    return shown.to_string(index=False, float_format=lambda x: f"{x:.4g}") + more


def report_figures(ws: Workspace) -> dict[str, go.Figure]:
    """Figures by file-safe name, in reading order."""
    figures = {"loss": trajectory_figure(ws.scalar("loss"), reference=ws.reference, floor=ws.scalar_floor("loss"),
                                         provenance=ws.provenance(), title="loss of every run",
                                         anomalies=anomaly_table(ws))}
    for a, b in comparison_pairs(ws):
        result = ws.comparison(a, b)
        figures[f"heatmap-{a}-vs-{b}"] = divergence_heatmap(result, provenance=ws.provenance([a, b]))
        if not result.identical:
            figures[f"growth-{a}-vs-{b}"] = amplification_figure(result, provenance=ws.provenance([a, b]))
        for step in sorted(set(ws.runs[a].snapshots()) & set(ws.runs[b].snapshots()))[:1]:
            differences = ws.snapshot_differences(a, b, step)
            if differences and not all(d.identical for d in differences.values()):
                figures[f"elementwise-{a}-vs-{b}-step{step}"] = elementwise_figure(
                    differences, step=step, a=a, b=b, provenance=ws.provenance([a, b]))
    if ws.others:
        figures["ladder"] = ladder_figure(ws.ladder(ws.others), noise=ws.noise_ladder(),
                                          provenance=ws.provenance([ws.reference, *ws.others]))
    cost = ws.cost()
    if not cost.empty:
        figures["cost"] = cost_figure(cost, provenance=ws.provenance())
    sources = ws.attribution()
    if not sources.empty:
        figures["sources"] = sources_figure(sources, on_cpu=ws.on_cpu, provenance=ws.provenance())
    return figures


def _page(summary: StudySummary, ws: Workspace, bodies: dict[str, str], head: str) -> str:
    findings = "".join(f"<li>{html.escape(line)}</li>" for line in summary.findings)
    manifests = "".join(
        f"<details><summary>{html.escape(name)} ({html.escape(run.run_id)})</summary>"
        f"<pre>{html.escape(json.dumps(run.manifest, indent=1, default=str))}</pre></details>"
        for name, run in ws.runs.items())
    figures = "".join(f'<section class="figure" id="{html.escape(name)}">{body}</section>'
                      for name, body in bodies.items())
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Divergence report</title>{head}
<style>
body {{ font-family: "DejaVu Sans", Arial, sans-serif; max-width: 1150px; margin: 2em auto; color: #222; }}
pre {{ font-size: 11px; background: #f6f6f6; padding: 0.6em; overflow-x: auto; }}
section.figure {{ margin: 1.5em 0; page-break-inside: avoid; }}
li {{ margin: 0.3em 0; }}
</style></head><body>
<h1>Divergence report</h1>
<h2>Runs</h2><pre>{html.escape(summary.runs.drop(columns=["path"]).to_string(index=False))}</pre>
<h2>Findings (reference {html.escape(summary.reference)})</h2><ul>{findings}</ul>
<h2>Summary</h2><pre>{html.escape(summary.text())}</pre>
<h2>Anomalies</h2><pre>{html.escape(_anomaly_text(anomaly_table(ws)))}</pre>
<h2>Figures</h2>{figures}
<h2>Manifests</h2>{manifests}
</body></html>
"""


def write_report(ws: Workspace, out: str | Path, *, fmt: str = "html",
                 progress: Callable[[str], None] | None = None) -> Path:
    """Write the report of ``ws`` to ``out`` as ``html`` or ``pdf``; returns the path."""
    if fmt not in ("html", "pdf"):
        raise ExportError(f"report format {fmt!r} is not one of html, pdf")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda message: None)
    say("analysing the runs")
    summary = summarise(ws)
    figures = report_figures(ws)
    say(f"{len(figures)} figures")
    if fmt == "html":
        head = f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        bodies = {name: fig.to_html(full_html=False, include_plotlyjs=False, div_id=name)
                  for name, fig in figures.items()}
        out.write_text(_page(summary, ws, bodies, head), encoding="utf-8")
        return out
    from workbench.figures.export import export_figures

    with tempfile.TemporaryDirectory() as tmp:
        written = export_figures(figures, tmp, ["svg"], scale=1.0, progress=say)
        bodies = {path.stem: path.read_text(encoding="utf-8") for path in written}
        page = Path(tmp) / "report.html"
        page.write_text(_page(summary, ws, bodies, ""), encoding="utf-8")
        say("printing to PDF")
        _print_pdf(page, out)
    return out


def _print_pdf(page: Path, out: Path) -> None:
    from workbench.figures.export import static_export_available

    browser = static_export_available()
    if browser is None:
        raise ExportError("a PDF report needs Chrome or Chromium (Debian/Ubuntu: apt-get install chromium, or set "
                          "BROWSER_PATH); the HTML report (--format html) needs none")
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-pdf-header-footer",
               f"--print-to-pdf={out.resolve()}", page.resolve().as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    if done.returncode != 0 or not out.is_file():
        raise ExportError(f"Chromium could not print the report to {out}: {done.stderr.strip()[-300:]}")
