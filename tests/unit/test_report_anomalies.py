"""Anomalies in the workspace and the report: found per run (with or without site records), marked and listed."""

from __future__ import annotations

from pathlib import Path

from workbench.store import synthetic
from workbench.store.synthetic import STEP_SCALARS as SCALARS
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import ScalarWriter
from workbench.studies.report import _page, report_figures
from workbench.studies.summary import summarise
from workbench.studies.views import anomaly_marks
from workbench.studies.workspace import Workspace


def test_anomalies_of_every_run_are_marked_on_the_loss_and_listed(tmp_path: Path) -> None:
    synthetic.write_synthetic_run(tmp_path / "a", steps=30, sites=6)
    synthetic.write_synthetic_run(tmp_path / "b", steps=30, sites=6, seed=1)
    writer = ScalarWriter(tmp_path / "b", flush_every=1)
    writer.append(20, {**SCALARS, "loss": float("nan")})  # b's loss turns NaN at step 20
    writer.close()
    write_synthetic_run(tmp_path / "scalars-only", steps=30)  # no site records: its scalars are judged
    ws = Workspace.open(tmp_path)
    found = ws.anomalies("b")
    assert list(zip(found["step"], found["rule"], found["site"])) == [(20, "nonfinite", "scalar:loss")]
    assert ws.anomalies("b") is found  # cached
    assert ws.anomalies("a").empty and ws.anomalies("scalars-only").empty
    table = anomaly_marks(ws)
    assert list(table.columns[:3]) == ["run", "step", "rule"] and list(table["run"]) == ["b"]
    loss = report_figures(ws)["loss"]
    marker = [t for t in loss.data if t.name == "anomaly: nonfinite"][0]
    assert marker.x == (20,) and "b: step 20" in marker.text[0]
    page = _page(summarise(ws), ws, {}, "")
    listed = page[page.index("<h2>Anomalies</h2>"):page.index("<h2>Figures</h2>")]
    assert "<td>nonfinite</td>" in listed and "<td>scalar:loss</td>" in listed and "<td>20</td>" in listed
