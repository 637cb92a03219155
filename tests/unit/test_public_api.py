"""What a user's editor and ``help()`` show of the names they call: real signatures, docstrings."""

from __future__ import annotations

import inspect

import pytest

import workbench


def test_record_shows_its_keywords() -> None:
    pytest.importorskip("torch")
    from workbench.recorder import TrainingRun, record

    parameters = inspect.signature(record).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    run_options = [name for name in inspect.signature(TrainingRun.__init__).parameters if name != "self"]
    assert list(parameters) == run_options  # every option of the run, by name, in one order
    assert all(f"``{name}``" in (record.__doc__ or "") for name in run_options if name != "run_dir")


def test_every_exported_name_says_what_it_is() -> None:
    for name in workbench.__all__:
        assert (getattr(workbench, name).__doc__ or "").strip(), name


def test_a_workspace_given_a_path_says_how_to_open_one() -> None:
    from workbench.errors import ArgumentError
    from workbench.studies.workspace import Workspace

    with pytest.raises(ArgumentError, match=r"not str; to open the folder, Workspace\.open\('data/runs/demo'\)"):
        Workspace("data/runs/demo")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="a dict of other values"):
        Workspace({"a": "data/runs/demo/a"})  # type: ignore[dict-item]


def test_the_notebooks_import_only_public_names() -> None:
    import json
    import re
    from pathlib import Path

    public = {"workbench", "workbench.widgets", "workbench.figures"}
    imports = []
    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                imports += [(path.name, m.group(1), m.group(2)) for m in
                            re.finditer(r"^\s*from (workbench[\w.]*) import (.+)$", "".join(cell["source"]), re.M)]
                assert not re.search(r"^\s*import workbench\.", "".join(cell["source"]), re.M), path.name
    assert imports and all(module in public for _, module, _ in imports), \
        [f"{name}: from {module}" for name, module, _ in imports if module not in public]


@pytest.mark.parametrize("package", ["workbench.widgets", "workbench.figures"])
def test_every_widget_and_figure_exported_says_what_it_is(package: str) -> None:
    import importlib

    module = importlib.import_module(package)
    for name in module.__all__:
        assert (getattr(module, name).__doc__ or "").strip(), f"{package}.{name}"
