"""The markers ``tests/conftest.py`` sets: ``integration`` by folder, ``releases`` by what a test can show about a
megatron-core release; and the groups of modules that pytest-xdist keeps on one worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TESTS, pytest_collection_modifyitems, trained_once_groups


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


def test_modules_that_share_a_trained_session_fixture_are_one_group(tmp_path: Path) -> None:
    modules = {"integration/test_a.py": "def test_x(runs: Runs) -> None: ...",
               "integration/test_b.py": "def test_y(tmp_path: Path, runs: Runs) -> None: ...",
               "notebooks/test_c.py": "def test_z(mini_demo: Path) -> None: ...\ndef test_w(user_runs: Path): ...",
               "browser/test_d.py": "@pytest.fixture\ndef server(mini_demo: Path): ...",  # through a fixture
               "integration/test_e.py": "def test_v(tmp_path: Path) -> None:  # the runs it trains itself\n"}
    for module, text in modules.items():
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(text)
    groups = trained_once_groups(tmp_path)
    a, b, c, d, e = (groups[f"tests/{module}"] for module in modules)
    assert a == b and c == d  # mini_demo's and user_runs' modules joined through notebooks/test_c.py
    assert len({a, c, e}) == 3 and e == "tests/integration/test_e.py"


def test_the_suites_groups_keep_each_trained_fixture_on_one_worker() -> None:
    groups = trained_once_groups()
    assert groups["tests/integration/test_analysis.py"] == groups["tests/integration/test_resume.py"]  # runs
    assert groups["tests/browser/test_notebooks_in_jupyterlab.py"] == groups["tests/integration/test_user_loop.py"]
    assert groups["tests/integration/test_failures.py"] == "tests/integration/test_failures.py"
