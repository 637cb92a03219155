"""Notebook tables: three significant digits, dashes for gaps, headers that wrap, no row count as an index."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.widgets.tables import table


def test_a_summary_reads_at_three_digits_with_dashes_for_gaps_and_no_row_numbers() -> None:
    frame = pd.DataFrame({"run": ["bf16", "tp2"], "final_error": [0.0059581234, 1.23456789e-9],
                          "first_step": pd.array([0, None], dtype="Int64"), "plateau": [np.nan, 12345.678]})
    html = table(frame)._repr_html_()
    assert "0.00596" in html and "1.23e-09" in html and "12,346" in html
    assert "0.0059581234" not in html and "12345.678" not in html  # no digits the numbers do not have
    assert "final error" in html and "first step" in html  # headers wrap at their words
    assert html.count("–") == 2  # the missing step and the missing plateau
    assert 'class="row_heading' not in html  # a RangeIndex is not shown
    assert list(frame.columns) == ["run", "final_error", "first_step", "plateau"]  # the frame is unchanged
    text = repr(table(frame))  # a text output: the same numbers under the frame's own names
    assert "final_error" in text and "0.00596" in text and "12,346" in text and "0.0059581234" not in text


def test_a_meaningful_index_is_kept() -> None:
    frame = pd.DataFrame({"tokens_per_s": [1234.5678]}, index=pd.Index(["det"], name="config"))
    html = table(frame)._repr_html_()
    assert "det" in html and "1,235" in html
