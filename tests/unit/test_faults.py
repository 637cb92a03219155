"""runner.faults: the changed value, gradients flowing through an activation fault, and bad settings."""

from __future__ import annotations

import pytest
import torch

from workbench.config import FaultConfig
from workbench.errors import ConfigError
from workbench.runner.faults import _changed


def test_bit_flip_changes_one_element_and_keeps_the_gradient_path() -> None:
    leaf = torch.tensor([0.5, 0.25, -2.0], requires_grad=True)
    out = _changed(leaf * 1, FaultConfig(kind="bitflip", site="act:layers.0.mlp", index=1, bit=30))
    assert out[0] == 0.5 and out[2] == -2.0
    assert out[1] == 0.25 * 2.0**128 or not torch.isfinite(out[1])  # the top exponent bit: x 2^128 (or inf)
    assert out[1].view(torch.int32) ^ torch.tensor(0.25).view(torch.int32) == 1 << 30
    out.sum().backward()
    assert torch.equal(leaf.grad, torch.ones(3))  # the fault is a constant: gradients pass through


def test_scale_is_differentiated_as_a_scaling() -> None:
    leaf = torch.ones(4, requires_grad=True)
    (_changed(leaf * 1, FaultConfig(kind="scale", site="act:layers.0.mlp", factor=8.0)).sum()).backward()
    assert torch.equal(leaf.grad, torch.full((4,), 8.0))


def test_bad_bit_and_index_name_the_field() -> None:
    with pytest.raises(ConfigError, match="fault.bit = 20 does not exist in a 16-bit"):
        _changed(torch.ones(3, dtype=torch.bfloat16), FaultConfig(kind="bitflip", site="act:x.y", bit=20))
    with pytest.raises(ConfigError, match="fault.index = 5 is outside"):
        _changed(torch.ones(3), FaultConfig(kind="bitflip", site="act:x.y", index=5))
