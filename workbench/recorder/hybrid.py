"""A HybridModel stack spec from Megatron Core's local modules (megatron-core 0.18+), for a machine without
Transformer Engine.

    from megatron.core.models.hybrid.hybrid_model import HybridModel
    from workbench.recorder import hybrid_local_spec

    model = HybridModel(config=config, hybrid_stack_spec=hybrid_local_spec(), vocab_size=vocab,
                        max_sequence_length=seq, hybrid_layer_pattern="*-*-")    # config.num_layers = 4

The shipped ``hybrid_stack_spec`` is built of Transformer Engine modules. This one takes the
submodules of ``get_gpt_layer_local_spec`` and splits them: an attention layer (``*``) holds the
GPT layer's ``input_layernorm`` and ``self_attention``, an MLP layer (``-``) its
``pre_mlp_layernorm`` and ``mlp``. A pattern ``"*-"`` repeated is then a GPTModel's computation,
and its sites take the GPT spelling (``workbench.sites``). ``HybridStack`` builds its final norm
with ``TENorm`` whatever the spec says; without a GPU ``workbench.runner.cpu_compat.install()``
maps it to Megatron's torch norm.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from workbench.errors import ArgumentError


class _NoLocalLayer(torch.nn.Module):
    """The layer of a pattern symbol this spec has no local modules for (Mamba, GDN, MoE, MLA, DSA)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ArgumentError("hybrid_local_spec() builds attention ('*') and MLP ('-') layers only; "
                            "the hybrid_layer_pattern has another symbol")


def hybrid_local_spec(**local_options: Any) -> Any:
    """A ``ModuleSpec`` of ``HybridStack`` for attention and MLP layers of Megatron's local modules;
    ``local_options`` go to ``get_gpt_layer_local_submodules`` (``normalization``, ``qk_layernorm``)."""
    try:
        from megatron.core.models.hybrid.hybrid_block import HybridStack, HybridStackSubmodules
    except ImportError as error:
        raise ArgumentError("hybrid_local_spec() needs megatron-core 0.18 or later (megatron.core.models.hybrid)"
                            ) from error
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_submodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    gpt = get_gpt_layer_local_submodules(**local_options)
    attention = TransformerLayerSubmodules(input_layernorm=gpt.input_layernorm, self_attention=gpt.self_attention,
                                           self_attn_bda=gpt.self_attn_bda)
    mlp = TransformerLayerSubmodules(pre_mlp_layernorm=gpt.pre_mlp_layernorm, mlp=gpt.mlp, mlp_bda=gpt.mlp_bda)
    # every other layer kind (0.18 has no mla_layer) fails to build instead of defaulting to IdentityOp
    unsupported = {f.name: ModuleSpec(module=_NoLocalLayer) for f in dataclasses.fields(HybridStackSubmodules)
                   if f.name.endswith("_layer")}
    return ModuleSpec(module=HybridStack, submodules=HybridStackSubmodules(**{
        **unsupported, "attention_layer": ModuleSpec(module=TransformerLayer, submodules=attention),
        "mlp_layer": ModuleSpec(module=MLPLayer, submodules=mlp)}))
