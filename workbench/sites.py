"""Canonical site names: one name per logical tensor, whatever the layout.

A name follows the full model's structure, never a pipeline stage's local numbering or
a tensor-parallel shard, so runs with different TP/PP/DP layouts line up name for name:

    embedding.word_embeddings.weight
    layers.3.self_attention.linear_qkv.weight     (global layer 3, 0-based)
    final_layernorm.weight
    output_layer.weight
    layers.1.mlp.router.weight                    (a MoE layer's router)
    layers.1.mlp.experts.5.linear_fc1.weight      (expert 5 of the layer, whichever EP rank holds it)

Wrappers (Megatron's DDP, ``Float16Module``) add ``module.`` prefixes and the decoder
adds ``decoder.``; both are removed. Megatron numbers a rank's experts locally
(``experts.local_experts.K``); the name carries the global index, ``experts.E``, with
E = the rank's first expert + K. Imports nothing from torch.

A HybridModel (megatron-core 0.18+) gives each symbol of its ``hybrid_layer_pattern`` a Megatron
layer of its own: with ``"*-*-"`` (``*`` attention, ``-`` MLP) ``decoder.layers.0`` is attention, ``1``
MLP, ``2`` attention, ``3`` MLP, and ``config.num_layers`` is 4. Where the pattern, pipeline
separators ``|`` removed, is ``"*-"`` repeated, its names take the GPTModel spelling
(``hybrid_name``): Megatron layers 2n and 2n+1 are block n,

    decoder.layers.2n.input_layernorm / .self_attention...   -> layers.n.input_layernorm / .self_attention...
    decoder.layers.2n+1.pre_mlp_layernorm / .mlp...          -> layers.n.pre_mlp_layernorm / .mlp...
    decoder.layers.2n+1   (the MLP layer's output)           -> layers.n   (a GPT layer's output)
    decoder.layers.2n     (the attention layer's output)     -> layers.n.attention_residual
    decoder.final_norm                                       -> final_layernorm

so a HybridModel and a GPTModel of the same blocks share every name but
``layers.n.attention_residual`` (the residual stream between attention and MLP, which a GPT layer
computes without a module of its own). Any other pattern keeps Megatron's numbering, ``layers.i``
for the i-th symbol; ``final_norm`` is ``final_layernorm`` in every pattern.

A recorded *site* is a kind and a name, ``"kind:name"``: ``param:layers.0.mlp.linear_fc1.weight``,
``act:layers.0.mlp``, ``grad:output_layer.weight``. ``SITE_KINDS`` lists the kinds in the order
they happen within a step, which is the first key of a site's execution order.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Mapping, Sequence

_WRAPPER_PREFIX = "module."
_LOCAL_LAYER = re.compile(r"^decoder\.layers\.(\d+)(?=\.|$)")
_GLOBAL_LAYER = re.compile(r"^layers\.(\d+)(?=\.|$)")
_LOCAL_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)(?=\.|$)")


SITE_KINDS: tuple[str, ...] = (
    "param",       # parameter value at the start of the step (the one the forward uses)
    "act",         # output of a module in the forward pass
    "loss",        # per-token loss
    "act_grad",    # gradient flowing into a module's output in the backward pass
    "grad_local",  # gradient before the data-parallel reduction
    "grad",        # gradient after the data-parallel reduction (what the optimizer reads)
    "exp_avg",     # AdamW first moment after the step
    "exp_avg_sq",  # AdamW second moment after the step
    "update",      # parameter after the step minus parameter before it
)
DEFAULT_KINDS: tuple[str, ...] = tuple(k for k in SITE_KINDS if k != "grad_local")
PARAMETER_KINDS = frozenset({"param", "grad_local", "grad", "exp_avg", "exp_avg_sq", "update"})


def site_id(kind: str, name: str) -> str:
    return f"{kind}:{name}"


SiteFilter = str | Sequence[str] | Callable[[str], bool]
"""Which sites to take: a glob (``"act:layers.*"``), a list of globs, or a predicate over site ids."""


def site_matcher(sites: SiteFilter) -> Callable[[str], bool]:
    """A predicate over site ids from a glob, a list of globs, or a predicate."""
    if callable(sites):
        return sites
    patterns = [sites] if isinstance(sites, str) else list(sites)
    # cached: the recorder asks about the same few hundred sites at every micro-batch
    return functools.cache(lambda site: any(fnmatch.fnmatchcase(site, p) for p in patterns))


def split_site(site: str) -> tuple[str, str]:
    kind, _, name = site.partition(":")
    return kind, name


def strip_wrappers(name: str) -> str:
    while name.startswith(_WRAPPER_PREFIX):
        name = name[len(_WRAPPER_PREFIX):]
    return name


def canonical_name(local_name: str, global_layer: Mapping[int, int], first_expert: int = 0) -> str:
    """The canonical name of a parameter or module known locally as ``local_name``.

    ``global_layer`` maps this stage's local layer index to the global (0-based) one;
    ``first_expert`` is the global index of this rank's first local expert.
    """
    name = strip_wrappers(local_name)
    expert = _LOCAL_EXPERT.search(name)
    if expert:
        name = f"{name[:expert.start()]}.experts.{first_expert + int(expert.group(1))}{name[expert.end():]}"
    match = _LOCAL_LAYER.match(name)
    if match:
        local = int(match.group(1))
        if local not in global_layer:
            raise KeyError(f"local layer {local} of {local_name!r} has no global number")
        return f"layers.{global_layer[local]}{name[match.end():]}"
    if name.startswith("decoder."):
        return name[len("decoder."):]
    return name


def gpt_blocks(layer_pattern: str | None) -> int | None:
    """The number of GPT blocks of a HybridModel's ``hybrid_layer_pattern`` when it is ``"*-"`` repeated
    (pipeline separators ``|`` aside; MTP depths after ``/`` are not decoder layers), else None."""
    main = (layer_pattern or "").split("/")[0].replace("|", "")
    blocks = len(main) // 2
    return blocks if blocks and main == "*-" * blocks else None


def hybrid_name(name: str, layer_pattern: str | None) -> str:
    """The site name of a HybridModel's canonical ``name`` (Megatron's global layer numbering), by the rule
    in the module docstring."""
    if name == "final_norm" or name.startswith("final_norm."):
        name = "final_layernorm" + name[len("final_norm"):]
    match = _GLOBAL_LAYER.match(name)
    if match is None or gpt_blocks(layer_pattern) is None:
        return name
    layer, rest = int(match.group(1)), name[match.end():]
    if layer % 2 == 0 and not rest:
        rest = ".attention_residual"
    return f"layers.{layer // 2}{rest}"


def expert_of(name: str) -> int | None:
    """The global expert index of a canonical name inside an expert (``layers.1.mlp.experts.5...``), else None."""
    match = re.search(r"\.experts\.(\d+)(?=\.|$)", name)
    return int(match.group(1)) if match else None


def layer_of(site: str) -> int | None:
    """Global layer number of a site, or None for sites outside the transformer layers."""
    match = _GLOBAL_LAYER.match(site)
    return int(match.group(1)) if match else None
