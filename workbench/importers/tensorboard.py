"""TensorBoard event files of per-site statistics: write them, and read them as a long table.

    write_tensorboard("tb/a", open_run("runs/a").records(), stats=("min", "max", "l2"))
    table = read_tensorboard("tb/a")              # long table (workbench.importers.table)
    records = records_from_table(table, "a")      # RunRecords, ready for workbench.analysis.compare

One scalar per (site, statistic) per step, tagged ``"<site>/<stat>"`` (``"act:layers.3.mlp/l2"``),
one event per scalar, as ``SummaryWriter.add_scalar`` writes them. Reading uses what users
use, ``EventAccumulator``, once every record of the files has passed ``importers.event_file``'s checks
(``EventAccumulator`` itself stops at a damaged record without a word), with two things to know:

* By default ``EventAccumulator`` keeps at most 10,000 points per scalar tag and silently
  drops the rest by reservoir sampling; ``read_tensorboard`` passes
  ``size_guidance={"scalars": 0}`` (keep every point).
* TensorBoard stores a scalar as float32 (``simple_value``). A relative difference below
  float32's resolution (about 6e-8) can vanish, so a comparison of TensorBoard logs may
  find a divergence later than the float64 run stores do.

Without TensorFlow installed, TensorBoard checks each record's CRC in pure Python, so
reading costs tens of microseconds per scalar. The ``tensorboard`` package is imported only
inside these functions; without it they raise ``UnsupportedError``. Imports no torch.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.errors import ImportFormatError, LogNotFoundError, UnsupportedError
from workbench.importers.event_file import check_event_files
from workbench.importers.table import long_table, row_keys
from workbench.importers.te_log import DEFAULT_STATS
from workbench.store.records import RunRecords

TAG_SEPARATOR = "/"


def _require_tensorboard(action: str) -> None:
    """Raise ``UnsupportedError``, saying how to get it, when the tensorboard package is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UnsupportedError(f"{action} needs the tensorboard package, which is not installed; "
                               "run `pip install tensorboard`")


def scalar_accumulator(logdir: Path) -> Any:
    """An ``EventAccumulator`` holding every scalar of the event files in ``logdir``, loaded once those files'
    records have passed ``event_file.check_event_files``: a damaged file is refused, never read in part."""
    _require_tensorboard("reading TensorBoard files")
    from google.protobuf.message import DecodeError
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = check_event_files(logdir)
    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    try:
        accumulator.Reload()
    except (DecodeError, ValueError, TypeError) as err:  # records whose CRCs hold but whose bytes are no Event
        names, reason = ", ".join(p.name for p in files), " ".join(str(err).split())[:120]
        raise ImportFormatError(f"{logdir}: a record of {names} is intact but not a TensorBoard event ({reason}); "
                                "these are not event files TensorBoard wrote") from None
    return accumulator


def tag(site: str, stat: str) -> str:
    return f"{site}{TAG_SEPARATOR}{stat}"


def write_tensorboard(logdir: str | os.PathLike[str], records: RunRecords,
                      stats: Sequence[str] = DEFAULT_STATS) -> Path:
    """Write ``records``' ``stats`` as TensorBoard scalars into a new event file in ``logdir``; returns ``logdir``."""
    _require_tensorboard("writing TensorBoard files")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    table = long_table(records, stats)
    row_tags = row_keys(table, tag)  # [row]
    Path(logdir).mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(logdir), max_queue_size=1024, flush_secs=120)
    wall_time = time.time()
    for name, step, value in zip(row_tags, table["step"].tolist(), table["value"].tolist()):
        writer.add_event(Event(wall_time=wall_time, step=step,
                               summary=Summary(value=[Summary.Value(tag=name, simple_value=value)])))
    writer.close()
    return Path(logdir)


def read_tensorboard(logdir: str | os.PathLike[str]) -> pd.DataFrame:
    """The ``"<site>/<stat>"`` scalars of the event files in ``logdir`` as a long table.

    Scalars whose tag has no ``/`` are not per-site statistics and are skipped (listed in
    ``table.attrs["skipped_tags"]``). Values are float32 widened to float64 (see the module docstring).
    """
    path = Path(logdir)
    if not path.is_dir():
        raise LogNotFoundError(f"{path}: no such folder; pass the folder that holds the events.out.tfevents.* files")
    accumulator = scalar_accumulator(path)
    tags = [str(t) for t in accumulator.Tags()["scalars"]]  # in order of first appearance
    per_site = [t for t in tags if TAG_SEPARATOR in t]
    if not per_site:
        found = f"only the scalars {', '.join(tags[:5])}" if tags else "no scalars"
        raise ImportFormatError(f"{path}: {found}; expected per-site statistics tagged '<kind>:<name>/<stat>' "
                                "as write_tensorboard writes them")
    steps, values, site_codes, stat_codes = [], [], [], []
    sites: dict[str, int] = {}
    stat_names: dict[str, int] = {}
    for name in per_site:
        events = accumulator.Scalars(name)
        site, _, stat = name.rpartition(TAG_SEPARATOR)
        steps.append(np.fromiter((e.step for e in events), dtype=np.int64, count=len(events)))
        values.append(np.fromiter((e.value for e in events), dtype=np.float64, count=len(events)))
        site_codes.append(np.full(len(events), sites.setdefault(site, len(sites)), dtype=np.int64))
        stat_codes.append(np.full(len(events), stat_names.setdefault(stat, len(stat_names)), dtype=np.int64))
    table = pd.DataFrame({
        "step": np.concatenate(steps),
        "site": pd.Categorical.from_codes(np.concatenate(site_codes), categories=list(sites)),
        "stat": pd.Categorical.from_codes(np.concatenate(stat_codes), categories=list(stat_names)),
        "value": np.concatenate(values),
    })
    table.attrs["files"] = [str(p) for p in sorted(path.glob("*tfevents*"))]
    table.attrs["skipped_tags"] = [t for t in tags if TAG_SEPARATOR not in t]
    return table
