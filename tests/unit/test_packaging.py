"""environment.yml stays in line with pyproject.toml; the README gives the two commands."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_installs_this_project_with_existing_extras() -> None:
    text = (ROOT / "environment.yml").read_text()
    python = re.search(r"-\s*python\s*(\S+)", text)
    assert python, "environment.yml must name python"
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert SpecifierSet(python.group(1).replace(" ", "")) == requires, "environment.yml follows requires-python"
    pip_lines = re.findall(r"-\s*(-e\s+\.\[[^\]]*\])", text)
    assert len(pip_lines) == 1, "the pip section installs the project itself"
    extras = re.search(r"\[([^\]]*)\]", pip_lines[0]).group(1).split(",")  # type: ignore[union-attr]
    declared = _pyproject()["project"]["optional-dependencies"]
    assert set(extras) <= set(declared)
    assert set(extras) == set(_makefile_list("EXTRAS")[0].split(","))


def _pins(environment: str) -> dict[str, Version]:
    lines = (ROOT / "constraints" / f"{environment}.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {canonicalize_name(name): Version(version) for name, version in pins}


def _makefile_list(name: str) -> list[str]:
    return re.search(rf"^{name} := (.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1).split()  # type: ignore[union-attr]


def _declared() -> dict[str, SpecifierSet]:
    project = _pyproject()["project"]
    requirements = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["train"]]
    return {canonicalize_name(r.name): r.specifier for r in requirements}


def test_the_library_declares_ranges_and_each_environment_pins_every_package() -> None:
    project = _pyproject()["project"]
    every = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    assert [r for r in every if "==" in r] == []
    for environment in ("floor", "current"):
        pins = _pins(environment)
        assert {"torch", "megatron-core", "numpy", "zarr", "psutil"} <= set(pins)
        for name, specifier in _declared().items():
            assert specifier.contains(pins[name], prereleases=True), (environment, name, pins[name], specifier)


def test_the_megatron_core_range_is_the_range_ci_tests() -> None:
    tested = sorted([_pins("floor")["megatron-core"], _pins("current")["megatron-core"],
                     *map(Version, _makefile_list("MEGATRON_OVERLAYS"))])
    specifier = _declared()["megatron-core"]
    assert all(specifier.contains(v) for v in tested)
    assert str(specifier) == f"<0.{tested[-1].minor + 1},>={tested[0]}" or \
        set(map(str, specifier)) == {f">={tested[0]}", f"<0.{tested[-1].minor + 1}"}
    assert {v.minor for v in tested} == set(range(tested[0].minor, tested[-1].minor + 1)), "a minor release untested"
    assert Version(_makefile_list("MEGATRON_OVERLAYS")[0]) > _pins("floor")["megatron-core"]


NVIDIA_CONTAINER = {"torch": "2.10.0a0+5e2a3b1.nv25.10", "megatron_core": "0.19.0rc0"}
"""Versions as NVIDIA's containers spell them: pre-releases with a local part, which sort below 2.10.0."""


@pytest.mark.parametrize("versions", [None, NVIDIA_CONTAINER], ids=["this environment", "NVIDIA's builds"])
def test_installing_workbench_train_beside_torch_and_megatron_changes_neither(
        versions: dict[str, str] | None, tmp_path: Path) -> None:
    """pip's dry run of workbench[train]'s requirements in an environment that has torch and megatron-core
    installs nothing (``--no-index``: it could not), with this environment's versions or with NVIDIA's."""
    import subprocess
    import sys

    env = dict(os.environ)
    if versions is not None:  # distributions found first on sys.path shadow the installed ones
        for name, version in versions.items():
            info = tmp_path / f"{name}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        env["PYTHONPATH"] = str(tmp_path)
    project = _pyproject()["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["train"]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet", "--report",
                           "-", *requirements], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["install"] == []


def test_the_overlay_is_the_megatron_core_imported() -> None:
    """``make test-range`` runs the recorder's tests with another megatron-core over the current environment."""
    import subprocess
    import sys

    overlay = os.environ.get("WORKBENCH_OVERLAY")
    if not overlay:
        pytest.skip("runs under make test-range (WORKBENCH_OVERLAY=version)")
    code = "import megatron.core, torch; print(megatron.core.__version__, torch.__version__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    # megatron-core 0.18 appends the git revision of the repository its files lie in: 0.18.2+507ee29
    assert Version(done.stdout.split()[0]).public == overlay


def test_readme_commands_and_ci_agree() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_torch_free_layers_import_without_torch() -> None:
    import subprocess
    import sys

    from tests.helpers.layers import TORCH_FREE, layer_modules

    modules = [m for layer in TORCH_FREE for m in layer_modules(layer)]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
            "bad = [m for m in ('torch', 'megatron') if m in sys.modules]\nprint(','.join(bad))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert len(modules) > 40
    assert done.stdout.strip() == "", f"these layers pulled in {done.stdout.strip()}"


def test_python_dash_m_workbench_is_the_workbench_command() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "workbench", "compare", str(ROOT / "absent"), str(ROOT)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("workbench: error:") and "no such run" in done.stderr
    assert "make lint" in (ROOT / ".ci" / "run").read_text()
