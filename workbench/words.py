"""Counts in sentences: ``counted(1, "run")`` is "1 run", ``counted(2, "run")`` "2 runs"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, the noun plural unless ``n`` is 1 (``plural``, or ``noun`` + "s")."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
