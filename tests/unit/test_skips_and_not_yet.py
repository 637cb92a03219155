"""Folder-wide verbs name each folder they skip, after their output; a run that has not flushed a step is "not
yet" (exit 75) on every reading verb, never bad input or an empty answer; a golden file holds a step or is
refused. The stores are put in the states the probes met them in directly, never by racing a writer."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.errors import NOT_YET
from workbench.store import layout
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import set_status

BROKEN = {
    "zarr-v2": lambda run: (run / "run.zarr" / ".zgroup").write_text('{"zarr_format": 2}'),
    "no-zarr-json": lambda run: None,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two readable runs, a zarr v2 store and a ``run.zarr`` without its ``zarr.json``."""
    root = tmp_path_factory.mktemp("runs")
    write_synthetic_run(root / "a", steps=6, sites=4, seed=1)
    write_synthetic_run(root / "b", steps=6, sites=4, seed=1, diverge_at=(3, 1))
    for name, damage in BROKEN.items():
        (root / name / "run.zarr").mkdir(parents=True)
        damage(root / name)
    return root


@pytest.mark.parametrize("verb", [["ls"], ["summary"], ["report", "-o", "{tmp}/r.html"],
                                  ["figure", "trajectories", "-o", "{tmp}/t.html"]])
def test_folder_wide_verbs_name_each_folder_they_skip_after_their_output(
        folder: Path, verb: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = verb[:2] if verb[0] == "figure" else verb[:1]  # `figure KIND RUNS... -o FILE`
    argv = [*head, str(folder), *[part.format(tmp=tmp_path) for part in verb[len(head):]]]
    assert main(argv) == 0
    captured = capsys.readouterr()
    skipped = [line for line in captured.err.splitlines() if line.startswith("workbench: skipped")]
    assert sorted(line.split()[2].rstrip(":") for line in skipped) == \
        [str(folder / "no-zarr-json"), str(folder / "zarr-v2")], captured.err
    assert all(len(line) > len("workbench: skipped ") + len(str(folder)) + 12 for line in skipped)  # a reason
    assert captured.err.rstrip().splitlines()[-len(skipped):] == skipped  # after everything else
    if verb[0] == "ls":
        assert [line.split()[0] for line in captured.out.splitlines()[1:]] == ["a", "b"], captured.out


@pytest.fixture
def starting(tmp_path: Path) -> Path:
    """A run in the state of its first flush: created by a launcher that is alive (this process), no step done."""
    run = write_synthetic_run(tmp_path / "starting", steps=8, sites=4, written=0, status=None)
    set_status(run, layout.Status.RUNNING, launcher={"pid": os.getpid(), "host": socket.gethostname()})
    return run


@pytest.mark.parametrize("verb", [
    ["compare", "{run}", "{ref}"], ["compare", "{ref}", "{run}", "--json"], ["check", "{run}", "--golden", "{ref}"],
    ["anomalies", "{run}"], ["golden", "{run}", "--out", "{tmp}/g.json"],
    ["verdict", "{run}", "{ref}"], ["verdict", "{run}", "{ref}", "--json"], ["resume-check", "{run}", "{ref}"],
])
def test_a_run_before_its_first_flush_is_not_yet_on_every_reading_verb(
        starting: Path, folder: Path, tmp_path: Path, verb: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = [part.format(run=starting, ref=folder / "a", tmp=tmp_path) for part in verb]
    assert main(argv) == NOT_YET
    captured = capsys.readouterr()
    assert captured.err.startswith("workbench: not yet: ") and len(captured.err.splitlines()) == 1, captured.err
    if "--json" in verb:
        answer = json.loads(captured.out)
        assert answer["status"] == "not yet" and answer["exit_code"] == NOT_YET
    else:
        assert captured.out == ""
    assert not (tmp_path / "g.json").exists()


def test_a_golden_file_is_never_written_from_a_run_without_steps(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    ended = write_synthetic_run(tmp_path / "ended", steps=8, written=0, status=layout.Status.FAILED)
    assert main(["golden", str(ended), "--out", str(tmp_path / "g.json")]) == 2
    assert "no recorded step" in capsys.readouterr().err and not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("document", [
    {"format": "workbench-golden-values", "version": 1, "steps": [], "scalars": {"loss": []}},
    {"lm loss": {"start_step": 1, "end_step": 0, "step_interval": 1, "values": {}}},
])
def test_check_refuses_a_golden_file_that_holds_no_step(folder: Path, tmp_path: Path, document: dict[str, object],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.analysis.golden_values import WORKBENCH_FORMAT

    if "format" in document:
        document["format"] = WORKBENCH_FORMAT
    golden = tmp_path / "empty.json"
    golden.write_text(json.dumps(document))
    assert main(["check", str(folder / "a"), "--golden", str(golden)]) == 2
    assert "holds no value of any step" in capsys.readouterr().err


def test_a_widget_opens_a_folder_with_an_unreadable_store_and_names_it(folder: Path) -> None:
    import ipywidgets as widgets

    from workbench.widgets.common import open_workspace

    status = widgets.HTML()
    workspace = open_workspace(folder, status)
    assert workspace is not None and sorted(workspace.names) == ["a", "b"]
    assert "skipped 2 unreadable" in status.value and "zarr-v2" in status.value and "no-zarr-json" in status.value
