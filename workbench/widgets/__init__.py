"""Widgets: ipywidgets that wire controls to figure functions (``workbench.widgets.explorer``)."""
