"""Every Python block of `docs/` and the README runs as printed, on the miniature demo (whose runs have the demo's
names) in place of data/runs/demo; a page's blocks run in order, in one namespace, as a reader types them. A block
that cannot run here says why in the comment before it (``<!-- not run: REASON -->``), and is counted, not run."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")


def _blocks(page: Path) -> list[tuple[str, str | None]]:
    """Each Python block of ``page`` and, for one that cannot run, the reason its comment gives."""
    text = page.read_text()
    found = []
    for match in re.finditer(r"```python\n(.*?)```", text, re.S):
        before = NOT_RUN.search(text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1] + "\n")
        found.append((match[1], before[1] if before else None))
    return found


EXAMPLES = {page.relative_to(ROOT).as_posix(): blocks for page in PAGES if (blocks := _blocks(page))}


def test_every_block_that_is_not_run_says_why() -> None:
    reasons = [reason for blocks in EXAMPLES.values() for _, reason in blocks if reason is not None]
    assert all(len(reason) > 20 for reason in reasons) and len(reasons) < sum(map(len, EXAMPLES.values()))


@pytest.mark.parametrize("page", sorted(p for p, blocks in EXAMPLES.items() if any(r is None for _, r in blocks)))
def test_each_python_block_runs_as_printed(page: str, mini_demo: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data" / "runs").mkdir(parents=True)
    (tmp_path / "data" / "runs" / "demo").symlink_to(mini_demo)
    monkeypatch.chdir(tmp_path)  # data/runs/demo, as the page writes it, is the miniature demo
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for number, (code, reason) in enumerate(EXAMPLES[page], start=1):
        if reason is None:
            exec(compile(code, f"{page}, block {number}", "exec"), namespace)  # noqa: S102 - the docs' own code
    assert os.getcwd() == str(tmp_path)
