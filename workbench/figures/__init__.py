"""Figures: pure functions from analysis results to ``plotly.graph_objects.Figure``, their style, and their export.

Each module is imported on its own (``from workbench.figures.export import export_figures``); this package
imports nothing so that importing one figure module never pulls in the others.
"""
