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
``act:layers.0.mlp``, ``grad:output_layer.weight``. ``KINDS`` describes each kind (its phase, whether it
is parameter-sized, what it is computed from, why a run may lack it); ``SITE_KINDS`` lists them in the order
they happen within a step, which is the first key of a site's execution order. The per-layer views label a
site by its layer (``layer_label``: ``L3``, ``embedding``, ``loss``).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

_WRAPPER_PREFIX = "module."
_LOCAL_LAYER = re.compile(r"^decoder\.layers\.(\d+)(?=\.|$)")
_GLOBAL_LAYER = re.compile(r"^layers\.(\d+)(?=\.|$)")
_LOCAL_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)(?=\.|$)")


@dataclass(frozen=True)
class SiteKind:
    """What the workbench knows of one kind of site, in one place: adding a kind starts here."""

    name: str
    what: str
    phase: str
    """When in the step it is taken: ``forward``, ``backward``, ``reduction`` or ``optimizer``."""
    parameter_sized: bool
    """One site per parameter (the parameter side records it), rather than per module output."""
    computed_from: tuple[str, ...]
    """The kinds, of the same name, a site of this kind is computed from: where a difference at it can
    originate (the rest is ``chained``)."""
    why_missing: str
    """Why a recorded run may have no site of this kind (the manifest's ``kinds_missing``)."""
    default: bool = True
    """Recorded unless the config's ``record.kinds`` says otherwise."""

    @property
    def chained(self) -> bool:
        """Whether a site of this kind is computed from the site of its kind before it in execution order, where
        none of ``computed_from`` is recorded: every kind but the optimizer's (each parameter's moments and update
        are its own)."""
        return self.phase != "optimizer"


_KINDS = (
    SiteKind("param", "parameter value at the start of the step (the one the forward uses)", "forward", True, (),
             "no parameter of the model was found"),
    SiteKind("act", "output of a module in the forward pass", "forward", False, (),
             "no activation module of a GPT model was found"),
    SiteKind("loss", "per-token loss", "forward", False, (),
             "the model's output is not a per-token loss (call it with labels)"),
    SiteKind("act_grad", "gradient flowing into a module's output in the backward pass", "backward", False, (),
             "no activation that requires a gradient was found"),
    SiteKind("grad_local", "gradient before the data-parallel reduction", "reduction", True, (),
             "the gradient before the reduction is read only in config.finalize_model_grads_func, "
             "which the model's config does not set", default=False),
    SiteKind("grad", "gradient after the data-parallel reduction (what the optimizer reads)", "reduction", True,
             ("grad_local",), "no reduced gradient reached the recorder: pass the optimizer (its step is where "
             "they are read)"),
    SiteKind("exp_avg", "AdamW first moment after the step", "optimizer", True, ("grad", "param"),
             "no optimizer was passed, or it holds no Adam moments"),
    SiteKind("exp_avg_sq", "AdamW second moment after the step", "optimizer", True, ("grad", "param"),
             "no optimizer was passed, or it holds no Adam moments"),
    SiteKind("update", "parameter after the step minus parameter before it", "optimizer", True, ("grad", "param"),
             "no parameter of the model was found"),
)
KINDS: Mapping[str, SiteKind] = {kind.name: kind for kind in _KINDS}
"""Every site kind, in the order they happen within a step."""
SITE_KINDS: tuple[str, ...] = tuple(KINDS)
DEFAULT_KINDS: tuple[str, ...] = tuple(k.name for k in _KINDS if k.default)
PARAMETER_KINDS = frozenset(k.name for k in _KINDS if k.parameter_sized)


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


def layer_of(name: str) -> int | None:
    """Global layer number of a canonical name (``layers.3.mlp`` -> 3), or None outside the transformer layers."""
    match = _GLOBAL_LAYER.match(name)
    return int(match.group(1)) if match else None


# -- layer labels: the rows of the per-layer views (ladder, sources) -----------------------------------

_BEFORE_LAYERS = ("embedding",)
_AFTER_LAYERS = ("final_layernorm", "output_layer", "loss")
_LAYER_LABEL = re.compile(r"^L(\d+)$")


def layer_label(site: str) -> str:
    """``L<n>`` for a site inside transformer layer n, else its top-level module (``embedding`` ...)."""
    kind, name = split_site(site)
    layer = layer_of(name)
    if layer is not None:
        return f"L{layer}"
    return kind if kind == "loss" else name.split(".", 1)[0]


def labelled_layer(label: str) -> int | None:
    """The layer an ``L<n>`` label names; None for any other label (``embedding``, ``loss`` ...)."""
    match = _LAYER_LABEL.match(label)
    return int(match.group(1)) if match else None


def layer_order(labels: Sequence[str]) -> list[str]:
    """Labels in model order: embedding, L0, L1, ..., final norm, output layer, loss, then any others."""
    numbered = sorted({lb for lb in labels if labelled_layer(lb) is not None}, key=lambda lb: labelled_layer(lb) or 0)
    before = [lb for lb in _BEFORE_LAYERS if lb in labels]
    after = [lb for lb in _AFTER_LAYERS if lb in labels]
    rest = sorted(set(labels) - set(numbered) - set(before) - set(after))
    return before + numbered + after + rest
