"""``pretrain()`` from the megatron-core wheel: its build of the dataset helpers is skipped only where the
installed package has them built and nothing to build them with."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("megatron.core.datasets.utils")

import megatron.core.datasets.utils as dataset_utils  # noqa: E402

from workbench.megatron_lm.__main__ import keep_installed_dataset_helpers  # noqa: E402


def _refuse_make(*args, **kwargs):  # type: ignore[no-untyped-def]
    raise AssertionError(f"make was run: {args}")


def test_the_wheel_s_built_helpers_are_kept_and_make_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("megatron.core.datasets.helpers_cpp")
    if Path(dataset_utils.__file__).with_name("Makefile").exists():
        pytest.skip("a megatron-core checkout (a Makefile): built as Megatron-LM builds it")
    monkeypatch.setattr(dataset_utils, "compile_helpers", dataset_utils.compile_helpers)  # undone after the test
    keep_installed_dataset_helpers()
    monkeypatch.setattr(subprocess, "run", _refuse_make)
    dataset_utils.compile_helpers()  # as initialize.py's _compile_dependencies calls it, by module attribute


def test_a_checkout_with_a_makefile_still_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text("all:\n")
    original = dataset_utils.compile_helpers
    monkeypatch.setattr(dataset_utils, "__file__", str(tmp_path / "utils.py"))
    keep_installed_dataset_helpers()
    assert dataset_utils.compile_helpers is original
