"""Megatron-LM's own TensorBoard scalars as a run: a team's existing runs beside recorded ones.

    import_megatron_tensorboard("tb/", "runs/megatron-a", name="megatron-a")

Megatron-LM's ``training.py`` writes per-iteration scalars tagged ``lm loss``, ``grad-norm``,
``learning-rate``, ``loss-scale``, ``iteration-time``, ``num-zeros``, ... with the 1-based
iteration as the TensorBoard step. They become the store's per-step scalars (iteration ``k``
is step ``k - 1``; ``lm loss validation`` is the held-out ``val_loss``; ``tokens_per_s`` from
``--tokens-per-step`` and the iteration time where given); every other scalar tag is kept in
the manifest's ``imported.other_tags`` by name. The store has no per-site records (Megatron-LM
logs none), so it appears in ``ls``, the trajectory figures, the noise floor of scalars and
the cost chart, not in site comparisons.
TensorBoard keeps scalars as float32. Imports no torch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from workbench.analysis.golden_values import MEGATRON_METRICS
from workbench.errors import ImportFormatError, LogNotFoundError
from workbench.importers.table import SCALAR_ROWS_AT_ONCE, check_last_step
from workbench.importers.tensorboard import scalar_accumulator
from workbench.store import layout
from workbench.store.manifest import RunManifest, new_run_id, store_attributes
from workbench.store.writer import ScalarWriter, create_store, set_status
from workbench.store.writer_lock import holding

FORMAT = "megatron-lm tensorboard"
TENSORBOARD_METRICS = {**MEGATRON_METRICS, "lm loss validation": "val_loss"}
"""Megatron-LM's TensorBoard tags and the store scalars they are; ``evaluate_and_print_results`` writes
``lm loss validation`` at the iteration after whose update it evaluated, which is the store's step ``k - 1``."""


def read_megatron_scalars(logdir: str | os.PathLike[str]) -> tuple[dict[str, dict[int, float]], list[str]]:
    """Per store scalar, {iteration: value}; and the other scalar tags found."""
    path = Path(logdir)
    if not path.is_dir():
        raise LogNotFoundError(f"{path}: no such folder; pass the folder that holds Megatron-LM's "
                               "events.out.tfevents.* files (its --tensorboard-dir)")
    accumulator = scalar_accumulator(path)
    tags = [str(t) for t in accumulator.Tags()["scalars"]]
    values = {TENSORBOARD_METRICS[t]: {int(e.step): float(e.value) for e in accumulator.Scalars(t)}
              for t in tags if t in TENSORBOARD_METRICS}
    if "loss" not in values:
        found = ", ".join(tags[:6]) if tags else "no scalars"
        raise ImportFormatError(f"{path}: no 'lm loss' scalar ({found}); expected the TensorBoard logs "
                                "Megatron-LM's training loop writes")
    return values, [t for t in tags if t not in TENSORBOARD_METRICS]


@holding("workbench import-megatron", "run_dir")
def import_megatron_tensorboard(logdir: str | os.PathLike[str], run_dir: str | os.PathLike[str], *,
                                name: str | None = None, tokens_per_step: int | None = None) -> Path:
    """Write a run store (scalars only) from Megatron-LM's TensorBoard logs in ``logdir``; returns its folder."""
    values, other_tags = read_megatron_scalars(logdir)
    iterations = sorted({k for series in values.values() for k in series})
    if iterations[0] < 1:
        raise ImportFormatError(f"{logdir}: iteration {iterations[0]}; Megatron-LM counts iterations from 1")
    check_last_step(iterations[-1] - 1, sum(map(len, values.values())),
                    f"{logdir}: the event of iteration {iterations[-1]:,}")
    run_dir = Path(run_dir)
    steps = iterations[-1]
    run_name = name or run_dir.name
    info = RunManifest(run_id=new_run_id(run_name), name=run_name, producer=f"import: {FORMAT}")
    files = sorted(str(p) for p in Path(logdir).glob("*tfevents*"))
    create_store(run_dir, store_attributes(info, status=layout.Status.CREATED, imported={
        "format": FORMAT, "files": files, "other_tags": other_tags, "iterations": len(iterations),
        "note": "TensorBoard stores scalars as float32"}), steps)
    writer = ScalarWriter(run_dir, flush_every=max(1, min(steps, SCALAR_ROWS_AT_ONCE)))
    for step in range(steps):  # every step written, NaN where not logged (Megatron logs every --log-interval)
        row: dict[str, float] = {f: (0 if t.startswith("int") else math.nan) for f, t in layout.SCALAR_FIELDS.items()}
        for scalar, series in values.items():
            row[scalar] = series.get(step + 1, math.nan)
        if tokens_per_step and np.isfinite(row["step_time"]) and row["step_time"] > 0:
            row["tokens_per_s"] = tokens_per_step / row["step_time"]
        writer.append(step, row)
    writer.close()
    set_status(run_dir, layout.Status.COMPLETE)
    return run_dir
