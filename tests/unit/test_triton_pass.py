"""The Triton statistics kernel without a GPU: its cases run by Triton's interpreter (``triton_interpreted.py``,
in a process of its own), every kernel built for sm_80 and sm_90, and a kernel that cannot be built said once.
Where torch ships without Triton (the CPU wheel of the floor environment) the GPU path is neither imported nor
tested."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from workbench.recorder import kernels  # noqa: E402

CASES = Path(__file__).with_name("triton_interpreted.py")


def test_the_kernel_s_cases_under_triton_s_interpreter(tmp_path: Path) -> None:
    import triton

    if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 7):
        pytest.skip(f"Triton {triton.__version__}'s interpreter cannot loop over a range that starts at a program id "
                    "(3.7's can); the kernels build with it all the same (the test below)")
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("WORKBENCH_TEST_TIMES", "WORKBENCH_TEST_PHASE")}  # its time is this test's
    environment.update({"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--basetemp", str(tmp_path / "t"), str(CASES)], env=environment, capture_output=True,
                          text=True, timeout=600, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    cases = len(re.findall(r"^def test_", CASES.read_text(), re.M))
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) >= cases and "skipped" not in done.stdout, done.stdout[-3000:]


def test_a_kernel_that_cannot_be_built_says_so_once_and_the_compiled_pass_reads_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.recorder.triton_pass import KernelBuildError

    class Unbuildable:
        @staticmethod
        def takes(x: torch.Tensor) -> bool:
            return True

        @staticmethod
        def accumulate(*args: Any, **kwargs: Any) -> bool:
            raise KernelBuildError("PTXASError: ptxas fatal : Value 'sm_120' is not defined for option 'gpu-name'")

    Unbuildable.KernelBuildError = KernelBuildError  # type: ignore[attr-defined]
    monkeypatch.setattr(kernels, "_triton_pass", lambda: Unbuildable)
    monkeypatch.setattr(kernels, "_on_device", lambda x: True)  # as a CUDA tensor would be
    monkeypatch.setattr(kernels, "BUILD_FAILURES", {})
    x = torch.randn(10)
    acc, lanes = kernels.new_accumulators(torch.device("cpu"))
    with pytest.warns(RuntimeWarning, match="triton float32 statistics kernel could not be built.*sm_120"):
        assert not kernels._on_gpu(x, kernels.identity_coords(x.shape), 1e-38, 1e38, acc, lanes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not kernels._on_gpu(x, kernels.identity_coords(x.shape), 1e-38, 1e38, acc, lanes)
    assert list(kernels.BUILD_FAILURES) == ["triton float32"]


@pytest.mark.parametrize("capability", [80, 90])
def test_every_kernel_builds_for_sm_80_and_sm_90_without_a_gpu(capability: int, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.recorder import triton_pass

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # built here, not taken from an earlier build's cache

    for kind in sorted(set(triton_pass.KINDS.values())):
        for built in triton_pass.build(kind, capability):
            ptx = built.asm["ptx"]
            assert built.asm["cubin"] and f"sm_{capability}" in ptx
            # a gradient's division is IEEE-rounded, as on the CPU ('/' in Triton is div.full: 2 ulp)
            assert "div.full.f32" not in ptx and "div.approx.f32" not in ptx
            assert ".ftz" not in ptx  # subnormals are values (and the underflow count), not zeros
