"""environment.yml stays in line with pyproject.toml; the README gives the two commands."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_installs_this_project_with_existing_extras() -> None:
    text = (ROOT / "environment.yml").read_text()
    python = re.search(r"-\s*python=(\d+\.\d+)", text)
    assert python, "environment.yml must pin python"
    requires = _pyproject()["project"]["requires-python"]
    assert f">={python.group(1)}" in requires
    pip_lines = re.findall(r"-\s*(-e\s+\.\[[^\]]*\])", text)
    assert len(pip_lines) == 1, "the pip section installs the project itself"
    extras = re.search(r"\[([^\]]*)\]", pip_lines[0]).group(1).split(",")  # type: ignore[union-attr]
    declared = _pyproject()["project"]["optional-dependencies"]
    assert set(extras) <= set(declared)
    assert set(extras) == set(re.search(r'-e "\.\[([^\]]*)\]"', (ROOT / "Makefile").read_text())
                              .group(1).split(","))  # type: ignore[union-attr]


def test_torch_and_megatron_are_pinned() -> None:
    train = _pyproject()["project"]["optional-dependencies"]["train"]
    assert "torch==2.13.0" in train
    assert "megatron-core==0.16.1" in train


def test_readme_commands_and_ci_agree() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_torch_free_layers_import_without_torch() -> None:
    import subprocess
    import sys

    from tests.unit.test_layers import TORCH_FREE, layer_modules

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
