"""The replica check's hash (``recorder.replicas.bits_hash``): equal copies hash equal, a copy one bit apart or
with two elements swapped does not."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from workbench.recorder.replicas import Parting, bits_hash  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_equal_copies_hash_equal_and_a_changed_one_does_not(dtype: torch.dtype) -> None:
    x = torch.randn(64, 33, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert int(bits_hash(x)) == int(bits_hash(x.clone()))
    flipped = x.clone()
    words = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    flipped.view(-1).view(words)[100] ^= 1  # the last bit of one element
    assert not torch.equal(flipped, x) and int(bits_hash(flipped)) != int(bits_hash(x))
    swapped = x.clone().view(-1)
    swapped[[3, 4]] = swapped[[4, 3]]
    assert int(bits_hash(swapped.view_as(x))) != int(bits_hash(x))


def test_zeros_and_a_tensor_of_no_elements_hash() -> None:
    assert int(bits_hash(torch.zeros(5))) != int(bits_hash(torch.zeros(6)))  # the count shows: each word is + 1
    assert int(bits_hash(torch.zeros(0))) == 0


def test_a_parting_says_where_for_the_manifest() -> None:
    assert Parting(2, "grad:final_layernorm.weight", 1).to_dict() == \
        {"step": 2, "site": "grad:final_layernorm.weight", "tp_rank": 1}
