"""The CPU emulations of nondeterminism sources: the right gradient and value, summed in the order drawn."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from workbench.recorder import nondeterminism as nd


def test_the_order_of_three_or_more_parts_changes_the_sum_and_blocks_come_in_threes() -> None:
    parts = [torch.tensor([1e16], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
             torch.tensor([-1e16], dtype=torch.float64)]
    assert nd._sum_in_order(parts, [0, 1, 2]).item() == 0.0  # 1e16 + 1 rounds to 1e16
    assert nd._sum_in_order(parts, [0, 2, 1]).item() == 1.0
    for length, most in ((32, 8), (9, 8), (4, 8), (2, 8), (100, 16)):
        blocks = nd._blocks(length, most)
        covered = [i for b in blocks for i in range(b.start, b.stop)]
        assert covered == list(range(length)) and all(b.stop - b.start <= most for b in blocks)
        assert len(blocks) >= min(3, length)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain attention on Megatron's layouts: [s, b, n, hn] in, [s, b, n * hn] out."""
    sq, b, n, hn = q.shape
    scores = torch.einsum("qbnh,kbnh->bnqk", q, k) * scale
    probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    return torch.einsum("bnqk,kbnh->qbnh", probs, v).reshape(sq, b, n * hn)


def _grads(order: object | None, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    if order is not None:
        monkeypatch.setattr(nd, "_random_order", order)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 2, 2, 4, generator=gen, requires_grad=True) for _ in range(3))
    mask = torch.ones(12, 12, dtype=torch.bool).triu(1)[None, None]
    scale = 1 / math.sqrt(4)
    context = nd._ReorderedAttentionBackward.apply(_attention(q, k, v, mask, scale), q, k, v, mask, scale)
    context.backward(torch.randn(context.shape, generator=gen))
    return [t.grad for t in (q, k, v)]  # type: ignore[misc]


def test_the_emulated_attention_backward_is_the_gradient_summed_in_the_drawn_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 2, 2, 4, generator=gen, requires_grad=True) for _ in range(3))
    mask = torch.ones(12, 12, dtype=torch.bool).triu(1)[None, None]
    _attention(q, k, v, mask, 0.5).backward(torch.randn(12, 2, 8, generator=gen))
    reference = [t.grad for t in (q, k, v)]
    emulated = _grads(None, monkeypatch)
    for ours, theirs in zip(emulated, reference, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    forward = _grads(lambda n: torch.arange(n), monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(forward, _grads(lambda n: torch.arange(n), monkeypatch),
                                                 strict=True))
    backward = _grads(lambda n: torch.arange(n).flip(0), monkeypatch)
    assert not all(torch.equal(a, b) for a, b in zip(forward, backward, strict=True))


def test_the_emulated_split_k_gemm_is_the_product_in_k_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    x, weight, bias = torch.randn(5, 3, 64, generator=gen), torch.randn(32, 64, generator=gen), torch.randn(32)
    for skip in (True, False):
        module = SimpleNamespace(weight=weight, bias=bias, skip_bias_add=skip)
        plain = x @ weight.t() + (0 if skip else bias)
        out, returned_bias = nd._splitk_hook(module, (x,), (plain.clone().requires_grad_(), bias if skip else None))
        torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)
        assert (returned_bias is bias) == skip
    module = SimpleNamespace(weight=weight, bias=None, skip_bias_add=True)
    values = []
    for order in (torch.arange, lambda n: torch.arange(n).flip(0)):
        monkeypatch.setattr(nd, "_random_order", order)
        values.append(nd._splitk_hook(module, (x,), (x @ weight.t(), None))[0])
    assert not torch.equal(values[0], values[1])  # four chunks of 16, added in two orders


def test_a_loops_emulations_are_named_sources_and_run_on_the_cpu_only() -> None:
    from workbench.errors import ArgumentError
    from workbench.recorder.session import _emulated

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ArgumentError, match="emulate='atomics' is no nondeterminism source; the sources are "
                                            "embedding_atomics"):
        _emulated([model], ["atomics"], {}, on_gpu=False)
    with pytest.raises(ArgumentError, match="on a GPU the sources are real"):
        _emulated([model], ["embedding_atomics"], {}, on_gpu=True)
    with pytest.raises(ArgumentError, match="nothing in this model to emulate them in"):
        _emulated([model], ["embedding_atomics"], {}, on_gpu=False)  # no Megatron embedding: never named on
