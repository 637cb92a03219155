"""Reading ahead, with a drawn view first: what a workspace reads in the background while a researcher looks.

    ahead = ReadAhead()
    ahead.load("det-r0", target)                 # one thread per run: every statistic of an older store, once
    ahead.run([task, ...], room=held.room, spend=held.spend)   # then the views a widget may show next
    with ahead.foreground():                     # a view being drawn: the background waits for it
        ...
    ahead.finished(timeout=60)

A task is a callable given ``pause``, which it passes to every read it makes (``Run.statistic(..., pause=pause)``):
the read calls it before each file, and it blocks while a view is being drawn, so that the view's reads have the
cores and the disk. The priority is passed in, never set in the store's reader behind its back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

Pause = Callable[[], None]
"""What a background read calls before each file it reads: returns once no view is being drawn."""
Task = Callable[[Pause], int]
"""A view computed ahead (kept where the workspace holds it); returns the bytes it keeps beyond the relative
differences, which the holding counts itself."""


class ReadAhead:
    """The workspace's background: runs read whole, tasks run one after another, a drawn view first."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._drawing = 0
        """Views being drawn (``foreground``)."""
        self._loading: dict[str, threading.Thread] = {}
        self._ahead: list[threading.Thread] = []

    def load(self, name: str, target: Callable[[], None]) -> bool:
        """Read run ``name`` in a thread of its own (``target``), once; whether this call started it."""
        if name in self._loading:
            return False
        thread = threading.Thread(target=target, name=f"preload-{name}", daemon=True)
        self._loading[name] = thread
        thread.start()
        return True

    def loading(self, name: str) -> bool:
        return name in self._loading

    def wait_loaded(self, name: str) -> None:
        """Wait for ``load``'s read of ``name``, if one was started."""
        thread = self._loading.get(name)
        if thread is not None:
            thread.join()

    def run(self, tasks: Iterable[Task], *, room: Callable[[], bool], spend: Callable[[int], None]) -> None:
        """Run ``tasks`` one after another in a thread, once the runs ``load`` reads are in, while ``room()``; each
        waits for the views being drawn before it starts (and, through ``pause``, before each file it reads). A
        task that fails is skipped: its view fails again, with its message, when it is asked for."""
        tasks = list(tasks)

        def work() -> None:
            for thread in list(self._loading.values()):
                thread.join()
            for task in tasks:
                self.pause()
                if not room():
                    return
                try:
                    spend(task(self.pause))
                except Exception:  # noqa: BLE001, S112 - see the docstring
                    continue

        thread = threading.Thread(target=work, name="read-ahead", daemon=True)
        self._ahead.append(thread)
        thread.start()

    def pause(self) -> None:
        """Return once no view is being drawn."""
        with self._idle:
            self._idle.wait_for(lambda: self._drawing == 0)

    @contextmanager
    def foreground(self) -> Iterator[None]:
        """A view being drawn: the background waits, before its next task and before each file its task reads."""
        with self._idle:
            self._drawing += 1
        try:
            yield
        finally:
            with self._idle:
                self._drawing -= 1
                self._idle.notify_all()

    @contextmanager
    def behind_background(self) -> Iterator[None]:
        """A view that waits for the background's work lets it run meanwhile (outside ``foreground`` this changes
        nothing: the background runs already)."""
        with self._idle:
            stepped_back = self._drawing > 0
            if stepped_back:
                self._drawing -= 1
                self._idle.notify_all()
        try:
            yield
        finally:
            if stepped_back:
                with self._idle:
                    self._drawing += 1

    def finished(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout`` seconds each) for the runs being read and the tasks; whether all have ended."""
        threads = [*self._loading.values(), *self._ahead]
        for thread in threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in threads)
