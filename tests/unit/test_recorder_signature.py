"""What record(...) writes as a user loop's model signature: a MoE model says so (never a dense "repeat")."""

from __future__ import annotations

from types import SimpleNamespace

from workbench.recorder.session import _signature


def _config(**moe: object) -> SimpleNamespace:
    return SimpleNamespace(num_layers=2, hidden_size=64, num_attention_heads=4, **moe)


MODEL = SimpleNamespace(vocab_size=128, max_sequence_length=32)


def test_a_moe_user_loop_records_its_experts_and_top_k() -> None:
    signature = _signature(MODEL, _config(num_moe_experts=4, moe_router_topk=2), parameters=1000)
    assert (signature.num_experts, signature.moe_topk) == (4, 2)
    assert "E4top2" in signature.summary()


def test_a_dense_model_and_a_moe_model_of_one_shape_do_not_pair() -> None:
    dense = _signature(MODEL, _config(num_moe_experts=None, moe_router_topk=2), parameters=1000)
    moe = _signature(MODEL, _config(num_moe_experts=4, moe_router_topk=2), parameters=1000)
    assert (dense.num_experts, dense.moe_topk) == (None, None)
    assert dense.shape() != moe.shape()
    assert dense.shape() == _signature(MODEL, _config(), parameters=1000).shape()
