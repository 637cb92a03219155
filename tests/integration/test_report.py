"""``workbench report``: a self-contained HTML (and PDF) report of real runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main
from workbench.figures.export import static_export_available


def test_html_report_has_figures_findings_and_manifests(mini_demo: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert main(["report", str(mini_demo), "-o", str(out)]) == 0
    text = out.read_text()
    assert 'src="https://cdn' not in text and text.count("Plotly.newPlot") >= 5  # plotly.js inline, figures live
    for figure_id in ("loss", "heatmap-det-r0-vs-det-r1", "heatmap-nondet-r0-vs-nondet-r1", "heatmap-det-r0-vs-tp2",
                      "growth-det-r0-vs-tp2", "ladder", "cost"):
        assert text.count(f'id="{figure_id}"') == 1 and f'id="{figure_id}-plot"' in text, figure_id
    assert "repeats det-r0 vs det-r1: bitwise identical" in text
    assert "resume check of resumed (resumed at step 4)" in text
    assert "<br>the runs differ in: " in text  # tp2's environment, on its own line under its finding
    assert "det-r0-" in text and "&quot;config_hash&quot;" in text  # manifests, escaped
    assert "<h2>Summary</h2>" not in text and text.count(">run_<wbr>id</th>") == 1  # the runs table once
    assert "Precision and layout against det-r0" in text and "<h2>Anomalies</h2><table" in text
    assert "wrote" in capsys.readouterr().err


@pytest.mark.skipif(static_export_available() is None, reason="no Chromium (apt-get install chromium)")
def test_pdf_report(mini_demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.pdf"
    assert main(["report", str(mini_demo / "det-r0"), str(mini_demo / "tp2"), "-o", str(out)]) == 0
    data = out.read_bytes()
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF") and data.count(b"/Type /Page") >= 2


def test_report_of_a_missing_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope"), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("workbench: error:") and "make demo" in err and len(err.splitlines()) == 1
