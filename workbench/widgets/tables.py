"""Tables styled for a notebook: a study's summary as a researcher reads it, not as pandas prints it.

    from workbench.widgets.tables import table
    table(ws.ladder(ws.roles.precision_runs).summary)

Numbers to three significant digits (whole numbers up to a million, exponents beyond), a missing value as a dash,
headers wrapped at their words, long names wrapped in their cell, and no row numbers when the index is only
a count: nothing is cut off at the notebook's width, and nothing claims seven digits it does not have.
"""

from __future__ import annotations

import pandas as pd
from pandas.io.formats.style import Styler

DIGITS = 3
"""Significant digits a table shows of a float."""

_STYLES = [
    {"selector": "th", "props": "max-width: 8em; white-space: normal; text-align: left; font-size: 0.85em;"},
    {"selector": "td", "props": "white-space: nowrap; font-size: 0.85em; padding: 2px 8px;"},
]
_LONG_TEXT = [{"selector": "td", "props": "white-space: normal; overflow-wrap: anywhere; min-width: 10em; "
                                         "max-width: 18em;"}]
"""Cells of a column of long names (sites): wrapped inside the cell at a space where there is one, inside a name
only where it would not fit (``word-break: break-all`` broke "word_embeddings" where a line had room)."""


def number(x: float, digits: int = DIGITS) -> str:
    """A float as a table shows it: ``digits`` significant digits between 0.001 and 1,000, whole numbers with
    thousands separators up to a million (a throughput), an exponent beyond."""
    size = abs(x)
    if x == 0 or 1e-3 <= size < 1e3:
        return f"{x:.{digits}g}"
    if 1e3 <= size < 1e6:
        return f"{x:,.0f}"
    return f"{x:.{digits - 1}e}"


class Table:
    """A frame as a notebook shows it (HTML, styled) and as a terminal or a text output shows it (the same
    numbers, the frame's own column names)."""

    def __init__(self, frame: pd.DataFrame, digits: int = DIGITS) -> None:
        self.frame, self.digits = frame, digits

    @property
    def styler(self) -> Styler:
        shown = self.frame.rename(columns=lambda c: str(c).replace("_", " "))
        floats = [c for c in shown.columns if pd.api.types.is_float_dtype(shown[c])]
        styler = shown.style.format({c: lambda x: number(x, self.digits) for c in floats}, na_rep="–")
        styler = styler.set_table_styles(_STYLES)
        long = [c for c in shown.columns if shown[c].dtype == object or pd.api.types.is_string_dtype(shown[c])
                if shown[c].astype(str).str.len().max() > 24]
        if long:  # per column: more specific than the table's own rule for every cell
            styler = styler.set_table_styles({c: _LONG_TEXT for c in long}, overwrite=False)
        return styler.hide(axis="index") if isinstance(self.frame.index, pd.RangeIndex) else styler

    def _repr_html_(self) -> str:
        return str(self.styler.to_html())

    def __repr__(self) -> str:
        floats = {c: (lambda x: "–" if pd.isna(x) else number(x, self.digits)) for c in self.frame.columns
                  if pd.api.types.is_float_dtype(self.frame[c])}
        return str(self.frame.to_string(formatters=floats, na_rep="–",  # type: ignore[arg-type]
                                        index=not isinstance(self.frame.index, pd.RangeIndex)))


def table(frame: pd.DataFrame, *, digits: int = DIGITS) -> Table:
    """``frame`` styled for a notebook (the frame itself is not changed)."""
    return Table(frame, digits)
