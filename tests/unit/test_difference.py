"""The comparison primitives: the first (step, site) a mask holds, in step then execution order."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.difference import first_true


def test_the_first_hit_is_the_earliest_step_then_the_first_site_in_column_order() -> None:
    mask = pd.DataFrame(np.zeros((4, 3), dtype=bool), index=pd.Index([0, 2, 4, 6], name="step"),
                        columns=["param:w", "act:layers.0", "grad:w"])
    assert first_true(mask) is None
    mask.loc[6, "param:w"] = True
    mask.loc[4, "grad:w"] = True
    mask.loc[4, "act:layers.0"] = True
    hit = first_true(mask)
    assert hit is not None and (hit.step, hit.site, hit.count) == (4, "act:layers.0", 2)
    reordered = first_true(mask[["grad:w", "act:layers.0", "param:w"]])  # the columns are the execution order
    assert reordered is not None and reordered.site == "grad:w"
