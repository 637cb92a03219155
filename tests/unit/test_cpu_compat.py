"""The CPU compatibility layer maps megatron-core's CUDA-only call sites to the CPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

PROBE = """
import torch
from workbench.runner import cpu_compat
assert not cpu_compat.is_installed()
assert cpu_compat.install_if_needed() is True
cpu_compat.install()  # idempotent
assert torch.zeros(2, device="cuda").device.type == "cpu"
assert torch.empty(3, device=torch.device("cuda", 0)).device.type == "cpu"
assert torch.ones(2).cuda().device.type == "cpu"
assert torch.ones(2).to("cuda").device.type == "cpu"
assert torch.zeros(1, device=torch.cuda.current_device()).device.type == "cpu"
torch.cuda.synchronize()
torch.cuda.manual_seed(5); a = torch.rand(3)
torch.cuda.manual_seed(5); b = torch.rand(3)
assert torch.equal(a, b)
state = torch.cuda.get_rng_state(); c = torch.rand(2); torch.cuda.set_rng_state(state)
assert torch.equal(c, torch.rand(2))
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed
# Megatron's optimizers check the CUDA type names (clip_grads, Float16OptimizerWithFloat16Params, the distributed
# optimizer): a tensor's type() reads as on a GPU; a conversion by name stays a conversion.
assert torch.ones(2).type() == "torch.cuda.FloatTensor"
assert torch.ones(2, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
assert torch.nn.Parameter(torch.ones(2, dtype=torch.float16)).type() == "torch.cuda.HalfTensor"
assert torch.ones(2).type(torch.float64).dtype == torch.float64
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the layer is only for machines without a GPU")
def test_layer_maps_cuda_call_sites_to_cpu() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_layer_is_not_installed_where_cuda_works(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.runner import cpu_compat

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_compat.install_if_needed() is False
    with pytest.raises(RuntimeError, match="must not be installed"):
        cpu_compat.install()
    assert not cpu_compat.is_installed()
