"""The reference a run follows while it trains (``--against REF``, ``record(..., against=REF)``), opened from disk:
a run folder or a golden-values file. Imports no torch: the launcher checks the reference before any rank starts.

    live = load_reference("data/runs/ci/reference")     # a reference store: every site's fingerprint
    live = load_reference("golden.json", rtol=1e-6)     # a golden file: the weights' fingerprint, the scalars
"""

from __future__ import annotations

import os
from pathlib import Path

from workbench.analysis.golden_values import parse_golden_values
from workbench.analysis.live import LiveReference
from workbench.errors import IncomparableRunsError
from workbench.store.golden_file import read_golden_document
from workbench.store.reader import open_run


def load_reference(path: str | os.PathLike[str], *, rtol: float | None = None) -> LiveReference:
    """The reference at ``path``: a run folder (its store's records, read lazily), or a golden-values JSON file
    (the workbench's or Megatron-LM's)."""
    path = Path(path)
    if path.is_file() or path.suffix == ".json":
        return LiveReference.of_golden(parse_golden_values(read_golden_document(path), str(path)), rtol=rtol)
    run = open_run(path)
    if not run.has_sites:
        raise IncomparableRunsError(f"{path}: no per-site records to follow while training (an imported or "
                                    "unrecorded run); check the run against it afterwards: workbench check RUN "
                                    f"--golden {path}")
    return LiveReference.of_run(run.records(), run_id=run.run_id, rtol=rtol)

