"""What every verb shares: argument types that refuse bad input while parsing, one-line errors, progress
output, and printing names from run stores with their control characters escaped."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

DEFAULT_RUNS_DIR = Path("data/runs")

_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))} | {
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def terminal_safe(text: str) -> str:
    """``text`` with its control characters (C0, DEL, C1) escaped as ``\\x1b``, ``\\n`` ...: a run name
    or a site name from a store cannot move the cursor, recolour the terminal or start a new line."""
    return text.translate(_ESCAPES)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other error of the command (``--help`` as usual)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"workbench: error: {terminal_safe(message)} (see `{self.prog} --help`)\n")


def whole(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum`` (argparse names the option in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a whole number >= {minimum}")
        return value
    return parse


def finite(minimum: float, *, inclusive: bool) -> Callable[[str], float]:
    """An argparse ``type``: a finite number >= ``minimum`` (``inclusive``) or > it."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value >= minimum if inclusive else value > minimum)):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a finite number "
                                             f"{'>=' if inclusive else '>'} {minimum:g}")
        return value
    return parse


def output_problem(path: Path, *, folder: bool) -> str | None:
    """Why ``path`` cannot be written (as a folder with ``folder``, else as a file); None when it can.
    The nearest existing ancestor must be a writable folder; nothing is created to find out."""
    if folder and os.path.lexists(path) and not path.is_dir():
        return f"{path} is a file, not a folder; name a folder, or move the file away"
    if not folder and path.is_dir():
        return f"{path} is a folder, not a file; name a file (in it, for instance)"
    start = path if folder else path.parent
    ancestor = next((p for p in (start, *start.parents) if os.path.lexists(p)), Path.cwd())
    if not ancestor.is_dir():
        return f"{path} lies under {ancestor}, which is a file, not a folder; choose a path outside it"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{path} cannot be written: {ancestor} is not writable by this user; choose a writable folder"
    return None


def run_location(text: str) -> str | Path:
    """An argparse ``type``: a run to read, a local path or a URL that fsspec reads (``s3://bucket/runs/a``,
    ``memory://runs/a``), kept as written (a ``Path`` would fold its ``//``)."""
    return text if "://" in text and not text.startswith("file://") else Path(text.removeprefix("file://"))


def writable_dir(text: str) -> Path:
    """An argparse ``type``: an output folder that can be created (or exists)."""
    if problem := output_problem(Path(text), folder=True):
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


def writable_file(text: str) -> Path:
    """An argparse ``type``: an output file that can be written (created or replaced)."""
    if problem := output_problem(Path(text), folder=False):
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


class ProgressPrinter:
    """Progress on one line on a terminal; a line every few seconds in a log."""

    def __init__(self, stream=None, interval_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
        self._stream, self._interval = stream or sys.stderr, interval_s  # sys.stderr now, not at import
        self._tty = self._stream.isatty()
        self._last = 0.0

    def __call__(self, message: str, *, final: bool = False) -> None:
        now = time.monotonic()
        if self._tty:
            end = "\n" if final else ""
            self._stream.write(f"\r\033[K{terminal_safe(message)}{end}")  # our own control of the line only
            self._stream.flush()
        elif final or now - self._last >= self._interval:
            self._stream.write(terminal_safe(message) + "\n")
            self._stream.flush()
            self._last = now


def print_safe(text: str) -> None:
    """Print ``text`` line by line, each with its control characters escaped (``terminal_safe``)."""
    print("\n".join(terminal_safe(line) for line in text.split("\n")))


def prefixed(printer: ProgressPrinter, prefix: str) -> Callable[[str], None]:
    """A progress callback that prints each message after ``prefix``."""
    return lambda message: printer(prefix + message)


class SkippedRuns:
    """The folders a folder-wide verb skipped (``on_skip``), said after its output, one line each."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, path: Path, err: Exception) -> None:
        self.lines.append(f"workbench: skipped {path}: {err}")

    def say(self) -> None:
        for line in self.lines:
            print(terminal_safe(line), file=sys.stderr)
