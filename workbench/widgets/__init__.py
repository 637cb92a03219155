"""Widgets: ipywidgets that wire controls to figure functions, for JupyterLab.

    from workbench.widgets import DivergenceExplorer, TrajectoryWidget, LadderWidget, PairMatrixWidget,
        CostWidget, SourcesWidget, table

Each is imported from its module when first used (``workbench.widgets.explorer`` ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._exports import lazy

if TYPE_CHECKING:
    from workbench.widgets.cost import CostWidget
    from workbench.widgets.explorer import DivergenceExplorer
    from workbench.widgets.ladder import LadderWidget
    from workbench.widgets.pairs import PairMatrixWidget
    from workbench.widgets.sources import SourcesWidget
    from workbench.widgets.tables import table
    from workbench.widgets.trajectories import TrajectoryWidget

_LAZY = {"CostWidget": "workbench.widgets.cost", "DivergenceExplorer": "workbench.widgets.explorer",
         "LadderWidget": "workbench.widgets.ladder", "PairMatrixWidget": "workbench.widgets.pairs",
         "SourcesWidget": "workbench.widgets.sources", "table": "workbench.widgets.tables",
         "TrajectoryWidget": "workbench.widgets.trajectories"}
__getattr__ = lazy(__name__, _LAZY, globals())
__all__ = ["CostWidget", "DivergenceExplorer", "LadderWidget", "PairMatrixWidget", "SourcesWidget",
           "TrajectoryWidget", "table"]
