"""Regenerates the README's figures from the demo's runs with the project's own export.

    python docs/make_images.py          # after `make demo`; writes docs/images/heatmap.png and bisect.png
    python docs/make_images.py --sheet RUNS
        # every figure of the report on the runs in RUNS, and the pair matrix, at a paper's column and page
        # width, in docs/images/sheet/ (the figures docs/figures.md shows)

    python docs/make_images.py --report RUNS
        # the report on the runs in RUNS (`workbench report`), its first screen in Chromium at 1200 x 1500:
        # docs/images/report-first-page.png, and its figure of every run's loss: report-loss.png

docs/images/explorer.png is the screenshot the browser test saves, after it clicks a heatmap cell
(build/test-artifacts/explorer-in-jupyterlab.png) after driving the explorer in JupyterLab.
bisect.png reads the operation traces the demo's investigation left in data/runs/demo/fault/bisect.
"""

import sys
from pathlib import Path

from workbench.analysis.trace_alignment import first_operation
from workbench.figures.divergence import divergence_heatmap
from workbench.figures.export import export_figures
from workbench.figures.operations import operation_figure
from workbench.store.reader import open_run
from workbench.studies.workspace import Workspace

if sys.argv[1:2] == ["--sheet"]:
    from workbench.figures.style import for_paper
    from workbench.studies import views
    from workbench.studies.report import report_figures

    ws = Workspace.open(sys.argv[2])
    chosen = {name: figure for name, figure in report_figures(ws).items()
              if not name.startswith(("heatmap-", "growth-", "elementwise-")) or "nondet-r0-vs-nondet-r1" in name}
    chosen["pairs"] = views.pairs(ws).figure
    sized = {f"{name}-{size}": for_paper(figure, size) for name, figure in chosen.items() for size in ("column", "page")}
    print(export_figures(sized, Path(__file__).parent / "images" / "sheet", ["png"], scale=1.5))
    sys.exit(0)

if sys.argv[1:2] == ["--report"]:
    import shutil
    import tempfile

    from playwright.sync_api import sync_playwright

    from workbench.cli import main

    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.html"
        main(["report", sys.argv[2], "-o", str(report)])
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1200, "height": 1500})
            page.goto(report.as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
            page.screenshot(path=str(Path(__file__).parent / "images" / "report-first-page.png"))
            page.locator("#loss").screenshot(path=str(Path(__file__).parent / "images" / "report-loss.png"))
            browser.close()
    sys.exit(0)

ws = Workspace.open("data/runs/demo")
pair = ("nondet-r0", "nondet-r1")
figure = divergence_heatmap(ws.comparison(*pair), provenance=ws.provenance(pair))
images = Path(__file__).parent / "images"
print(export_figures({"heatmap": figure}, images, ["png"], scale=1.5, width=1000, height=700))

bisect = Path("data/runs/demo/fault/bisect")
reference, fault = open_run(bisect / "det-r0"), open_run(bisect / "fault")
step = fault.attrs["replay"]["step"]
operations = first_operation(reference.op_trace(step), fault.op_trace(step))
figure = operation_figure(operations, title=f"det-r0 vs fault: every operation of step {step}",
                          provenance=ws.provenance(["det-r0", "fault"]))
print(export_figures({"bisect": figure}, images, ["png"], scale=1.2))
