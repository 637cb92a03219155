"""workbench.investigate.replay refuses what it must not do, before anything is launched or deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.errors import ArgumentError
from workbench.investigate.replay import replay
from workbench.store import synthetic
from workbench.store.manifest import RUNNER
from workbench.store.synthetic import write_synthetic_run


@pytest.fixture
def original(tmp_path: Path) -> Path:
    return write_synthetic_run(tmp_path / "runs" / "orig", steps=12, written=8, status="stopped", name="synthetic",
                               producer=RUNNER)  # as if the runner had stopped it after step 7


@pytest.fixture(autouse=True)
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("replay launched a run although it should have refused")
    monkeypatch.setattr("workbench.investigate.replay.launch", refuse)


def test_a_folder_that_is_not_a_replay_is_never_overwritten(original: Path, tmp_path: Path) -> None:
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("years of work")
    with pytest.raises(ArgumentError, match="not a replay"):
        replay(original, 3, out=thesis, overwrite=True)
    assert (thesis / "thesis.tex").read_text() == "years of work"
    for folder in (original, original.parent):  # the run itself, or a folder holding it
        with pytest.raises(ArgumentError, match="over or around the run"):
            replay(original, 3, out=folder, overwrite=True)
        assert (original / "run.zarr").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArgumentError, match="is a file"):
        replay(original, 3, out=tmp_path / "file")


def test_steps_the_original_did_not_complete_and_foreign_runs_are_refused(original: Path, tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="has not completed step 9"):
        replay(original, 9)
    with pytest.raises(ArgumentError, match="is not a step of synthetic: it trains steps 0..11"):
        replay(original, 12)
    made_up = synthetic.write_synthetic_run(tmp_path / "made-up", steps=4, sites=2)
    with pytest.raises(ArgumentError, match="a synthetic run"):
        replay(made_up, 1)
