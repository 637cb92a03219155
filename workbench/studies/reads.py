"""What a workspace reads for its views: whole runs ahead of them (``preload``), and one site's statistic over
steps, per run, which the explorer's detail and the trajectory widget draw, kept for the one site followed and read
ahead for its other statistics. ``Workspace.preload``, ``.site_series``, ``.read_site_ahead``, ``.keep_site_series``
and ``.site_band`` forward here; the workspace's holding keeps what is read, its ``ahead`` reads in the background.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

import pandas as pd
import xarray as xr

from workbench.studies.reading_ahead import Pause

if TYPE_CHECKING:
    from workbench.studies.workspace import Workspace


def preload(ws: Workspace, names: Iterable[str]) -> list[str]:
    """Read every statistic of the recorded runs among ``names`` into memory in the background, one pass over each
    store, while they fit in the holding's budget together; the runs being read. Only for stores that keep every
    statistic in one chunk, where reading one costs as much as reading all."""
    started = []
    for name in dict.fromkeys(names):
        run = ws.runs.get(name)
        if run is None or ws.ahead.loading(name) or name not in ws.recorded or run.reads_statistics_apart:
            continue
        if ws.holding.reserve(run.stats_nbytes) and ws.ahead.load(name, partial(_load_all, ws, name)):
            started.append(name)
    return started


def _load_all(ws: Workspace, name: str) -> None:
    try:
        stats = ws.records(name).stats.load()
    except Exception:  # noqa: BLE001 - a damaged store: stat_values reads it again and raises in the caller
        return
    for stat in stats["stat"].to_numpy().tolist():
        ws.holding.get("statistics", (name, str(stat)), partial(stats.sel(stat=stat).copy))


def site_series(ws: Workspace, site: str, stat: str, names: Iterable[str] | None, *,
                keep_statistic: bool) -> dict[str, pd.Series]:
    """The series kept for ``site`` (``keep_site_series``), else from ``stat_values``; with
    ``keep_statistic=False`` a statistic not held is read and dropped instead, and the series kept when ``site`` is
    the one followed."""
    series = {}
    for name in ws.recorded if names is None else names:
        kept = ws.holding.peek("series", (name, stat, site))
        if kept is not None:
            series[name] = kept
            continue
        values = ws.stat_values(name, stat) if keep_statistic else ws.peek_stat_values(name, stat)
        if site in values.indexes["site"]:
            series[name] = values.sel(site=site).to_series()
            if not keep_statistic:
                ws.holding.keep_series(name, stat, site, series[name])
    return series


def read_site_ahead(ws: Workspace, site: str, names: Iterable[str], stats: Iterable[str]) -> None:
    """Each of ``stats`` of ``site`` in the runs among ``names`` that read statistics apart, in the background:
    each statistic read once and dropped, the site's series kept, so that another statistic's series reads nothing.
    For one site at a time: a later call drops the earlier site's series and the reads still queued for it."""
    chosen = [n for n in dict.fromkeys(names) if n in ws.recorded and ws.runs[n].reads_statistics_apart]
    ws.holding.follow(site)

    def task(name: str, stat: str, pause: Pause) -> int:
        if ws.holding.followed() != site or ws.holding.peek("series", (name, stat, site)) is not None:
            return 0
        return keep_site_series(ws, site, stat, {name: ws.peek_stat_values(name, stat, pause=pause)})

    ws.read_ahead([partial(task, name, stat) for stat in stats for name in chosen])


def keep_site_series(ws: Workspace, site: str, stat: str, values: dict[str, xr.DataArray]) -> int:
    """Keep ``site``'s series of ``stat`` from runs' (step, site) ``values`` read for other work, if ``site`` is the
    one followed; the bytes kept."""
    kept = 0
    for name, run_values in values.items():
        if site in run_values.indexes["site"]:
            series = run_values.sel(site=site).to_series()
            if not ws.holding.keep_series(name, stat, site, series):
                return kept
            kept += int(series.nbytes)
    return kept


def envelope(series: dict[str, pd.Series]) -> tuple[pd.Series, pd.Series] | None:
    """(min, max) per step over the runs' series that have a value there; None without any series."""
    table = pd.DataFrame(series)
    return (table.min(axis=1), table.max(axis=1)) if not table.empty else None
