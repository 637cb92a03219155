"""The markers ``tests/conftest.py`` sets: ``integration`` by folder, ``releases`` by what a test can show about a
megatron-core release, and one ``xdist_group`` per module, joined through the session fixtures that train."""

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
        return [m.name for m in self.markers if m.name != "xdist_group"]

    def group(self) -> str:
        return next(m.args[0] for m in self.markers if m.name == "xdist_group")


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


def test_modules_that_share_a_trained_session_fixture_are_one_group() -> None:
    items = [Item("integration/test_a.py", fixturenames=("runs",)), Item("integration/test_b.py", "t", ("runs",)),
             Item("notebooks/test_c.py", "t1", ("mini_demo",)), Item("notebooks/test_c.py", "t2", ("user_runs",)),
             Item("integration/test_d.py", "t", ("user_runs", "tmp_path")), Item("integration/test_e.py")]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    a, b, c1, c2, d, e = (item.group() for item in items)
    assert a == b and c1 == c2 == d  # mini_demo and user_runs joined through notebooks/test_c.py
    assert len({a, c1, e}) == 3 and e == "tests/integration/test_e.py"
