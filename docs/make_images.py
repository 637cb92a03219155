"""Regenerates the README's figure from the demo's runs with the project's own export.

    python docs/make_images.py          # after `make demo`; writes docs/images/heatmap.png

docs/images/explorer.png is the screenshot the browser test saves
(build/test-artifacts/explorer-in-jupyterlab.png) after driving the explorer in JupyterLab.
"""

from pathlib import Path

from workbench.figures.divergence import divergence_heatmap
from workbench.figures.export import export_figures
from workbench.workspace import Workspace

ws = Workspace.open("data/runs/demo")
pair = ("nondet-r0", "nondet-r1")
figure = divergence_heatmap(ws.comparison(*pair), provenance=ws.provenance(pair))
print(export_figures({"heatmap": figure}, Path(__file__).parent / "images", ["png"], scale=1.5, width=1000,
                     height=700))
