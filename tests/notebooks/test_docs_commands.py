"""The front page's commands run as printed: the one-minute tour's ``workbench`` lines, on the miniature demo
(whose runs have the demo's names) in place of data/runs/demo."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from workbench.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _tour_commands() -> list[str]:
    tour = README.read_text().split("## A one-minute tour", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", tour, re.S)
    return [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()
            if line.startswith("workbench ")]


def test_the_tour_has_its_commands() -> None:
    assert [shlex.split(c)[1] for c in _tour_commands()] == ["ls", "compare", "check"]


@pytest.mark.parametrize("command", _tour_commands())
def test_each_tour_command_runs_as_printed(command: str, mini_demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [arg.replace("data/runs/demo", str(mini_demo)) for arg in shlex.split(command)[1:]]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert printed.strip()
    if argv[0] == "compare":
        assert "first differ" in printed or "first divergent" in printed, printed
