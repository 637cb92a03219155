"""A run keeps its colour whichever runs a figure draws, in every figure of a folder (adding `fault` to the
trajectories turned bf16 from pink to blue)."""

from __future__ import annotations

import pytest

from workbench.figures.style import PALETTE, run_styles
from workbench.store.synthetic import write_synthetic_run
from workbench.studies import views
from workbench.studies.workspace import Workspace


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("colours")
    for i, name in enumerate(["a", "b", "c", "d"]):
        write_synthetic_run(root / name, steps=6, sites=4, seed=1, diverge_at=(2, 1) if i else None)
    return Workspace.open(root)


def _colours(figure) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {str(t.name): t.line.color for t in figure.data if t.type == "scatter" and t.line.color and t.name}


def test_a_run_keeps_its_colour_whichever_runs_are_drawn(ws: Workspace) -> None:
    two = _colours(views.trajectories(ws, "loss", ["a", "c"]).figure)
    three = _colours(views.trajectories(ws, "loss", ["a", "b", "c"]).figure)
    assert two["c"] == three["c"] and two["a"] == three["a"]
    assert len({three[n] for n in ("a", "b", "c")}) == 3


def test_thirteen_runs_get_thirteen_colours() -> None:
    styles = run_styles([f"run{i}" for i in range(13)])
    assert len({s["color"] for s in styles.values()}) == 13 and {s["dash"] for s in styles.values()} == {"solid"}
    assert len(PALETTE) == len(set(PALETTE)) >= 13
