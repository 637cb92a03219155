"""The markers ``tests/conftest.py`` sets: ``integration`` by folder, ``training`` by what a module imports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TESTS, pytest_collection_modifyitems


class Item:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.markers: list[str] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker.name)


@pytest.mark.parametrize("module, expected", [
    ("integration/test_resume.py", ["integration", "training"]),
    ("integration/test_live_reference.py", ["integration"]),  # runs as material for the workbench's own logic
    ("notebooks/test_notebooks.py", ["integration"]),
    ("browser/test_notebooks_in_jupyterlab.py", ["integration"]),
    ("unit/test_cpu_compat.py", ["training"]),  # imports torch
    ("unit/test_compare.py", []),
])
def test_each_test_gets_the_markers_of_its_folder_and_imports(module: str, expected: list[str]) -> None:
    item = Item(TESTS / module)
    pytest_collection_modifyitems([item])  # type: ignore[list-item]
    assert item.markers == expected
