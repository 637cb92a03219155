"""The markers ``tests/conftest.py`` sets: ``integration`` by folder, ``releases`` by what a test can show about a
megatron-core release."""

from __future__ import annotations

import pytest

from tests.conftest import TESTS, pytest_collection_modifyitems


class Item:
    def __init__(self, module: str, name: str = "test_x", fixturenames: tuple[str, ...] = ()) -> None:
        self.path = TESTS / module
        self.name = name
        self.nodeid = f"tests/{module}::{name}"
        self.fixturenames = fixturenames
        self.markers: list[pytest.MarkDecorator] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker)

    def names(self) -> list[str]:
        return [m.name for m in self.markers]


@pytest.mark.parametrize("module, name, expected", [
    ("integration/test_resume.py", "test_x", ["integration", "releases"]),  # checkpoint formats
    ("integration/test_live_reference.py", "test_x", ["integration"]),  # the workbench's own logic
    ("integration/test_parallel_dimensions.py", "test_the_virtual_pipeline_reorders_the_schedule_only",
     ["integration", "releases"]),  # one test of a module
    ("integration/test_parallel_dimensions.py", "test_moe_sites_agree_between_layouts", ["integration"]),
    ("notebooks/test_notebooks.py", "test_x", ["integration"]),
    ("browser/test_notebooks_in_jupyterlab.py", "test_x", ["integration"]),
    ("unit/test_cpu_compat.py", "test_x", ["releases"]),  # imports Megatron Core's layer
    ("unit/test_kernels.py", "test_x", []),  # torch alone: the same torch in both environments
    ("unit/test_compare.py", "test_x", []),
])
def test_each_test_gets_the_markers_of_its_folder_and_release(module: str, name: str, expected: list[str]) -> None:
    item = Item(module, name)
    pytest_collection_modifyitems([item])  # type: ignore[list-item]
    assert item.names() == expected
