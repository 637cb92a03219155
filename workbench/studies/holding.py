"""What a workspace holds in memory: every cache behind one lock, and the bytes it may fill in the background.

    held = Holding(budget=2 * 2**30)          # preloads may fill 2 GiB, the reads ahead as much again
    held.get("ladder", key, compute)          # computed once (outside the lock), then kept
    held.statistic("a", "l2", read, kept=2)   # the latest two statistics of a run kept, older ones dropped
    held.relative(("a", "b"), "l2", compute)  # a pair's relative difference, dropped with either statistic
    held.once("step_bins", key, compute, waiting)  # computed once when a view and the background ask at once
    held.follow("act:layers.0.mlp")           # the one site whose series are kept (``keep_series``)

Each cache is a plain dict by name; ``held.keys(name)`` lists what one holds. Nothing here reads a store: the
workspace hands in what computes or reads a value. The byte budget: what the preloads may still fill
(``reserve``), and what the reads ahead may (``room``, ``spend``), against which the relative differences count
as they are kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from typing import Any, TypeVar, cast

import pandas as pd
import xarray as xr

V = TypeVar("V")
KEPT_STATISTICS = 2
"""Statistics kept per run that reads one statistic at a time: the one shown and the one before it. Asking for a
third drops the oldest, with the relative differences computed from it (read again when asked for)."""
KEPT_MATRICES = 2
"""Heatmap matrices of a range of steps kept (the latest), each 8 bytes per site and step of its range."""


def _made_from(key: Hashable, run: str, stat: str) -> bool:
    """Whether a relative difference's key, ((a, b), statistic), is of ``stat`` and a pair with ``run``."""
    pair, made_of = cast(tuple[tuple[str, str], str], key)
    return run in pair and made_of == stat


class Holding:
    """The caches of one workspace, behind one lock, and the bytes the background may still fill."""

    def __init__(self, budget: int) -> None:
        self.lock = threading.Lock()
        self._preload = budget
        """Bytes the preloads may still fill (``reserve``)."""
        self._ahead = budget
        """Bytes the reads ahead may still fill (``spend``); the relative differences count against them."""
        self._caches: dict[str, dict[Hashable, Any]] = {}
        self._recent: dict[str, list[str]] = {}
        """Per run whose statistics are kept ``kept`` at a time: the statistics held, oldest first."""
        self._followed: str | None = None
        self._computing: dict[Hashable, threading.Event] = {}

    def _cache(self, name: str) -> dict[Hashable, Any]:
        return self._caches.setdefault(name, {})

    def keys(self, name: str) -> set[Hashable]:
        """What the cache ``name`` holds."""
        with self.lock:
            return set(self._cache(name))

    def peek(self, name: str, key: Hashable) -> Any:
        """The value held under ``key``, or None."""
        with self.lock:
            return self._cache(name).get(key)

    def get(self, name: str, key: Hashable, compute: Callable[[], V]) -> V:
        """The value under ``key``, computed outside the lock when missing (two threads asking at once may both
        compute it: the first one stored is kept, so that every caller sees the same object)."""
        with self.lock:
            cache = self._cache(name)
            if key in cache:
                return cache[key]  # type: ignore[no-any-return]
        value = compute()
        with self.lock:
            return self._cache(name).setdefault(key, value)  # type: ignore[no-any-return]

    def latest(self, name: str, key: Hashable, compute: Callable[[], V], *, kept: int, keep: bool = True) -> V:
        """``get`` that keeps the latest ``kept`` values of ``name`` only (the one asked for last is the latest);
        with ``keep=False`` a value not held is computed and not kept."""
        with self.lock:
            cache = self._cache(name)
            if key in cache:
                cache[key] = cache.pop(key)
                return cache[key]  # type: ignore[no-any-return]
        value = compute()
        if keep:
            with self.lock:
                cache = self._cache(name)
                cache[key] = value
                for old in list(cache)[:-kept]:
                    del cache[old]
        return value

    def drop(self, name: str, unless: Callable[[Any], bool]) -> None:
        """Drop the values of ``name`` whose key fails ``unless``."""
        with self.lock:
            self._caches[name] = {k: v for k, v in self._cache(name).items() if unless(k)}

    # -- statistics and the relative differences made from them --------------------------------------------

    def statistic(self, run: str, stat: str, read: Callable[[], xr.DataArray], *,
                  kept: int | None = None) -> xr.DataArray:
        """A run's (step, site) values of ``stat``, read once; with ``kept``, only the latest ``kept`` of the run's
        statistics stay, and dropping one drops the relative differences made from it."""
        values = self.get("statistics", (run, stat), read)
        if kept is not None:
            with self.lock:
                recent = self._recent.setdefault(run, [])
                if stat in recent:
                    recent.remove(stat)
                recent.append(stat)
                while len(recent) > kept:
                    old = recent.pop(0)
                    self._cache("statistics").pop((run, old), None)
                    relative = self._cache("relative")
                    for key in [k for k in relative if _made_from(k, run, old)]:
                        relative.pop(key, None)
        return values

    def relative(self, pair: tuple[str, str], stat: str, compute: Callable[[], xr.DataArray]) -> xr.DataArray:
        """The relative difference of ``stat`` of a pair of runs, computed once and kept (until a statistic it was
        made from is dropped)."""
        return self.get("relative", (pair, stat), compute)

    def relative_bytes(self) -> int:
        """Memory held by the relative differences."""
        with self.lock:
            return sum(int(r.nbytes) for r in self._cache("relative").values())

    # -- the background's budget ----------------------------------------------------------------------------

    def room(self) -> bool:
        """Whether the reads ahead may read more: their budget, less the relative differences held, is not spent."""
        return self._ahead - self.relative_bytes() > 0

    def reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` from the preloads' budget if they fit; whether they did."""
        with self.lock:
            if nbytes > self._preload:
                return False
            self._preload -= nbytes
            return True

    def spend(self, nbytes: int) -> None:
        """Count ``nbytes`` a read ahead kept."""
        with self.lock:
            self._ahead -= nbytes

    # -- values a view and the background may ask for at once ------------------------------------------------

    def once(self, name: str, key: Hashable, compute: Callable[[], V],
             waiting: Callable[[], AbstractContextManager[None]]) -> tuple[V, bool]:
        """The value under ``key``, computed by one caller only: another that asks meanwhile waits for it (inside
        ``waiting()``, which lets the background run while a view waits for it) rather than computing it again.
        Also whether this call computed it."""
        with self.lock:
            cache = self._cache(name)
            if key in cache:
                return cache[key], False
            under_way = self._computing.get(key)
            if under_way is None:
                done = self._computing[key] = threading.Event()
        if under_way is not None:
            with waiting():
                under_way.wait()
            with self.lock:
                if key in self._cache(name):
                    return self._cache(name)[key], False
            return self.once(name, key, compute, waiting)  # the other caller failed: try it here
        try:
            value = compute()
            with self.lock:
                self._cache(name)[key] = value
            return value, True
        finally:
            with self.lock:
                del self._computing[key]
            done.set()

    # -- the followed site's series --------------------------------------------------------------------------

    def follow(self, site: str) -> None:
        """Make ``site`` the one whose series ``keep_series`` keeps, dropping another site's."""
        with self.lock:
            if self._followed != site:
                series = self._cache("series")
                self._caches["series"] = {k: v for k, v in series.items() if k[2] == site}  # type: ignore[index]
            self._followed = site

    def followed(self) -> str | None:
        with self.lock:
            return self._followed

    def keep_series(self, run: str, stat: str, site: str, series: pd.Series) -> bool:
        """Keep ``series`` of ``site`` if it is the site followed; whether it was."""
        with self.lock:
            if self._followed != site:
                return False
            self._cache("series")[(run, stat, site)] = series
            return True
