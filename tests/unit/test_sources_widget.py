"""The sources widget, driven as a user would: each source alone against the reference, the statistic and the
interval change what it shows, and it says so where a folder has no source runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import update_manifest
from workbench.widgets.sources import SourcesWidget

ALL_OFF = {"splitk_gemm": {"state": "off"}, "embedding_atomics": {"state": "off"}}


def _write(root: Path, name: str, *, on: str | None, **kwargs: object) -> None:
    run = write_synthetic_run(root / name, steps=10, sites=40, **kwargs)  # type: ignore[arg-type]
    sources = {**ALL_OFF, **({on: {"state": "on"}} if on else {})}
    update_manifest(run, deterministic=on is None and name == "base",
                    determinism={"deterministic": on is None and name == "base", "sources": sources})


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sources")
    _write(root, "base", on=None)
    _write(root, "off", on=None)
    _write(root, "split", on="splitk_gemm", diverge_at=(0, 0), initial_difference=1e-4)
    _write(root, "emb", on="embedding_atomics", diverge_at=(3, 5), initial_difference=1e-6)
    return root


def test_each_source_alone_against_the_reference(folder: Path, tmp_path: Path) -> None:
    widget = SourcesWidget(folder)
    assert widget.workspace is not None and widget.workspace.roles.reference == "base"
    assert sorted(widget.table["source"]) == ["embedding_atomics", "splitk_gemm"]
    rows = {row.split("<br>")[0]: row for row in widget.figure.data[0].y}
    assert "step 0" in rows["<b>splitk_gemm</b>"] and "step 3" in rows["<b>embedding_atomics</b>"]
    final = dict(zip(widget.table["source"], widget.table["final_error"], strict=True))
    assert final["splitk_gemm"] > final["embedding_atomics"] > 0  # the larger first difference stays larger
    widget.interval.value = 80.0
    assert "80%" in widget.figure.layout.annotations[1].text  # the cost panel's title names the interval
    assert widget.figure.layout.xaxis.title.text == "relative difference of l2, last step"
    widget.stat.value = "count"  # equal in every run: no final difference
    assert (widget.table["final_error"].fillna(0) == 0).all()
    assert widget.figure.layout.xaxis.title.text == "relative difference of count, last step"  # the axis follows
    widget.export_bar.folder.value = str(tmp_path / "out")
    widget.export_bar.formats.value = ("html",)
    assert sorted(p.name for p in widget.export()) == ["sources.csv", "sources.html"]


def test_a_folder_without_source_runs_says_how_to_make_them(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "a", steps=4, sites=4)
    write_synthetic_run(tmp_path / "b", steps=4, sites=4)
    widget = SourcesWidget(tmp_path)
    assert "sources.toml" in widget.status.value and widget.exported() is None
