from __future__ import annotations

import pytest

from workbench.sites import (
    DEFAULT_KINDS,
    PARAMETER_KINDS,
    canonical_name,
    gpt_blocks,
    hybrid_name,
    layer_of,
    strip_wrappers,
)


def test_wrappers_and_decoder_are_removed() -> None:
    assert strip_wrappers("module.module.embedding.word_embeddings.weight") == "embedding.word_embeddings.weight"
    assert canonical_name("module.decoder.final_layernorm.weight", {}) == "final_layernorm.weight"


def test_local_layers_get_global_numbers() -> None:
    # Stage 2 of a PP=2 run with 4 layers holds global layers 2 and 3 as local 0 and 1.
    name = canonical_name("module.decoder.layers.1.mlp.linear_fc1.weight", {0: 2, 1: 3})
    assert name == "layers.3.mlp.linear_fc1.weight"
    assert layer_of(name) == 3
    # A layer module itself (no trailing attribute) is renumbered too.
    assert canonical_name("decoder.layers.0", {0: 2}) == "layers.2"
    assert layer_of("layers.2") == 2
    assert layer_of("output_layer.weight") is None


def test_unknown_local_layer_is_an_error() -> None:
    with pytest.raises(KeyError, match="local layer 5"):
        canonical_name("decoder.layers.5.mlp.linear_fc1.weight", {0: 0})


def test_a_hybrid_model_of_attention_mlp_pairs_takes_the_gpt_spelling() -> None:
    # "*-*-": Megatron layers 0 and 1 are block 0, 2 and 3 block 1
    assert gpt_blocks("*-*-") == 2 and gpt_blocks("*-|*-") == 2 and gpt_blocks("*-*-/*-") == 2
    qkv = "self_attention.linear_qkv.weight"
    assert hybrid_name(f"layers.2.{qkv}", "*-*-") == f"layers.1.{qkv}"
    assert hybrid_name("layers.3.pre_mlp_layernorm", "*-*-") == "layers.1.pre_mlp_layernorm"
    assert hybrid_name("layers.3", "*-*-") == "layers.1"
    assert hybrid_name("layers.2", "*-*-") == "layers.1.attention_residual"
    assert hybrid_name("final_norm.weight", "*-*-") == "final_layernorm.weight"
    assert hybrid_name("output_layer.weight", "*-*-") == "output_layer.weight"


def test_any_other_hybrid_pattern_keeps_megatron_numbering() -> None:
    for pattern in ("**--", "*-*", "M-*-", "", None):
        assert gpt_blocks(pattern) is None
        assert hybrid_name("layers.3.mlp", pattern) == "layers.3.mlp"
        assert hybrid_name("layers.2", pattern) == "layers.2"
    assert hybrid_name("final_norm", "M-*-") == "final_layernorm"


def test_every_kind_is_computed_from_kinds_that_happen_before_it() -> None:
    from workbench.sites import KINDS, SITE_KINDS

    assert SITE_KINDS == tuple(KINDS) and "grad_local" not in DEFAULT_KINDS and "param" in PARAMETER_KINDS
    for position, kind in enumerate(KINDS.values()):
        assert kind.why_missing and kind.phase in ("forward", "backward", "reduction", "optimizer"), kind.name
        assert all(SITE_KINDS.index(source) < position for source in kind.computed_from), kind.name


def test_layer_labels_name_their_layer() -> None:
    from workbench.sites import labelled_layer, layer_label

    assert labelled_layer(layer_label("act:layers.12.mlp")) == 12
    assert [labelled_layer(label) for label in ("embedding", "loss", "L", "Lx", "L3a")] == [None] * 5
