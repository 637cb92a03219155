"""Figures: pure functions from analysis results to ``plotly.graph_objects.Figure``, their style, and their export.

    from workbench.figures import divergence_heatmap, trajectory_figure, export_figures

Each name is imported from its module when first used, so that using one figure never imports the others'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._exports import lazy

if TYPE_CHECKING:
    from workbench.figures.cost import cost_figure
    from workbench.figures.divergence import amplification_figure, divergence_heatmap
    from workbench.figures.export import export_figures
    from workbench.figures.ladder import ladder_figure
    from workbench.figures.operations import operation_figure, replay_figure
    from workbench.figures.pairs import pairs_figure
    from workbench.figures.sources import sources_figure
    from workbench.figures.trajectories import trajectory_figure

_LAZY = {"amplification_figure": "workbench.figures.divergence", "cost_figure": "workbench.figures.cost",
         "divergence_heatmap": "workbench.figures.divergence", "export_figures": "workbench.figures.export",
         "ladder_figure": "workbench.figures.ladder", "operation_figure": "workbench.figures.operations",
         "pairs_figure": "workbench.figures.pairs", "replay_figure": "workbench.figures.operations",
         "sources_figure": "workbench.figures.sources", "trajectory_figure": "workbench.figures.trajectories"}
__getattr__ = lazy(__name__, _LAZY, globals())
__all__ = ["amplification_figure", "cost_figure", "divergence_heatmap", "export_figures", "ladder_figure",
           "operation_figure", "pairs_figure", "replay_figure", "sources_figure", "trajectory_figure"]
