"""The determinism switches: the one place that says what deterministic mode sets, source by source.

Deterministic mode applies what Megatron's ``--deterministic-mode`` applies: the
``deterministic_mode`` flag of ``TransformerConfig`` (indexed embedding, no
nondeterministic TE attention), ``NCCL_ALGO=Ring``, ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``,
``CUBLAS_WORKSPACE_CONFIG=:4096:8``, ``torch.use_deterministic_algorithms(True)`` and no
fused cross-entropy. Nondeterministic mode leaves the fast defaults; on a CPU, whose
kernels are deterministic, the runner emulates GPU atomics (see
``workbench.recorder.nondeterminism``) and the manifest says so.

Each of these is a named *source* (``SOURCES``): on a GPU its real knob, on the CPU an
emulation where there is one (a change of accumulation order drawn from ``os.urandom``).
``resolve`` turns a run's ``deterministic`` flag and its ``[nondeterminism]`` table into one
state per source: ``on``, ``off``, or ``unavailable`` (asked for, but nothing on this device
implements it: never recorded as on). ``deterministic = true`` turns every source off;
``deterministic = false`` without a table is the fast defaults on a GPU and the embedding
emulation alone on the CPU.

The environment variables must be in place before CUDA and NCCL initialise, so the
launcher puts them in each rank's environment; ``apply_in_process`` does the rest inside
the rank. Importing this module does not import torch.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

NUMERICS_ENV_VARS: tuple[str, ...] = (
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NVLS_ENABLE",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
)
"""Variables recorded in every manifest because they can change the numbers."""


class SourceState(StrEnum):
    ON = "on"
    OFF = "off"
    UNAVAILABLE = "unavailable"
    """Asked for, but nothing on this device implements it (its library is absent, or the CPU has no emulation)."""


@dataclass(frozen=True)
class Source:
    """One source of nondeterminism: its GPU knob, its CPU emulation, and where it first changes bits."""

    name: str
    gpu: str
    """The knob on a GPU, and what it decides."""
    cpu: str | None
    """The CPU emulation (``workbench.recorder.nondeterminism``), or None where the CPU has none."""
    acts_at: tuple[str, ...]
    """Site patterns (``fnmatch``) the emulation changes first: no earlier site differs."""
    env: tuple[str, str] | None = None
    """The environment variable a GPU rank sets to turn the source off, and its value."""
    gpu_default: bool = True
    """On in a nondeterministic GPU run whose table does not name it (today's fast defaults)."""
    cpu_default: bool = False
    """On in a nondeterministic CPU run whose table does not name it."""
    needs: str | None = None
    """A module without which the GPU knob has nothing to act on (the source is then unavailable)."""
    gpu_knob: bool = True
    """False where a GPU has no knob of this source's own (another source's switches it there)."""
    moe_only: bool = False
    """Only a Mixture-of-Experts model has the operation (off in a dense run)."""


SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("embedding_atomics",
           gpu="Megatron's deterministic_mode off: the word-embedding backward adds the gradient rows of repeated "
               "tokens with atomics",
           cpu="the word-embedding weight gradient's rows added (index_add_) in a random order",
           acts_at=("grad_local:embedding.word_embeddings.weight", "grad:embedding.word_embeddings.weight"),
           cpu_default=True),
    Source("attention_backward",
           gpu="NVTE_ALLOW_NONDETERMINISTIC_ALGO unset: Transformer Engine's fused / flash attention backward may "
               "accumulate dQ, dK, dV with atomics",
           cpu="each layer's core-attention backward: dQ summed over key blocks and dK, dV over query blocks "
               "(8 positions a block) in a random order",
           acts_at=("act_grad:layers.*.input_layernorm", "grad*:layers.*.self_attention.linear_qkv.*"),
           env=("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0"), needs="transformer_engine"),
    Source("splitk_gemm",
           gpu="CUBLAS_WORKSPACE_CONFIG unset: cuBLAS may choose split-K GEMMs whose partial sums are reduced in "
               "an order that depends on the workspace",
           cpu="each layer's MLP linear_fc1 forward GEMM as K-chunks of 16 columns summed in a random order",
           acts_at=("act:layers.*.mlp",), env=("CUBLAS_WORKSPACE_CONFIG", ":4096:8")),
    Source("dp_allreduce",
           gpu="NCCL_ALGO unset: NCCL may choose tree or NVLS algorithms, whose association of the ranks' "
               "gradient contributions differs from the ring's",
           cpu="the data-parallel gradient all-reduce sums the ranks' contributions in a random association "
               "(needs layout.dp >= 3: a sum of two commutes exactly)",
           acts_at=("grad:*",), env=("NCCL_ALGO", "Ring")),
    Source("torch_algorithms",
           gpu="torch.use_deterministic_algorithms(False): torch's own kernels (index_add, scatter_add, embedding "
               "backward) may use atomics",
           cpu=None, acts_at=()),
    Source("fused_cross_entropy",
           gpu="TransformerConfig.cross_entropy_loss_fusion on: Megatron's fused vocab-parallel cross-entropy",
           cpu=None, acts_at=(), gpu_default=False),
    Source("moe_token_combine",
           gpu="switched by torch_algorithms on a GPU: Megatron's unpermute adds the expert outputs back into token "
               "order with scatter_add_ (atomics) where torch's deterministic algorithms are off",
           cpu="each MoE layer's unpermute: the expert outputs added back into token order (index_add_) in a random "
               "order (changes bits where three or more outputs meet in one token: moe_topk >= 3)",
           acts_at=("act:layers.*.mlp",), gpu_default=False, cpu_default=True,
           gpu_knob=False, moe_only=True),
)}
"""Every source by name; ``deterministic = true`` turns them all off."""

DETERMINISTIC_ENV: dict[str, str] = {s.env[0]: s.env[1] for s in SOURCES.values() if s.env is not None}
"""Environment of a deterministic rank (Megatron's deterministic mode and its CI): every source's variable."""


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def resolve(deterministic: bool, requested: Mapping[str, bool | None] | None = None, *, on_gpu: bool,
            present: Callable[[str], bool] = _importable, moe: bool = False) -> dict[str, SourceState]:
    """Each source's state in a run: ``requested`` (the config's ``[nondeterminism]`` table, None for a source
    it does not name) over the device's defaults; every source off in deterministic mode, and the MoE sources
    off in a dense model (``moe`` False)."""
    requested = dict(requested or {})
    unknown = sorted(set(requested) - set(SOURCES))
    if unknown:
        raise ValueError(f"no nondeterminism source {unknown[0]!r}; the sources are {', '.join(SOURCES)}")
    states = {}
    for name, source in SOURCES.items():
        wanted = requested.get(name)
        on = False if deterministic or (source.moe_only and not moe) else (
            wanted if wanted is not None else (source.gpu_default if on_gpu else source.cpu_default))
        can = (source.gpu_knob and (source.needs is None or present(source.needs))) if on_gpu \
            else source.cpu is not None
        states[name] = SourceState.OFF if not on else SourceState.ON if can else SourceState.UNAVAILABLE
    return states


def emulation_conflicts(cfg: Any) -> list[str]:
    """What stops the CPU emulation of a source that ``cfg`` (a ``RunConfig``) switches on: one line per
    source, naming the source and the setting it cannot be emulated with; empty when every emulation can run.
    The runner's emulations check the same things on the model once it is built; this says it before any run
    starts, from the config alone."""
    states = cfg.source_states(on_gpu=False)
    on = {name for name, state in states.items() if state is SourceState.ON}
    o, conflicts = cfg.optim, []
    if "dp_allreduce" in on:
        settings = [f"optim.{flag} = true" for flag in ("use_distributed_optimizer", "overlap_grad_reduce")
                    if getattr(o, flag)]
        if settings:
            conflicts.append(f"nondeterminism source dp_allreduce cannot be emulated with {' and '.join(settings)} "
                             "(its emulation replaces Megatron DDP's one all-reduce per bucket, which those "
                             "replace by a reduce-scatter or start during the backward)")
    if "splitk_gemm" in on and cfg.layout.sp:
        conflicts.append("nondeterminism source splitk_gemm cannot be emulated with layout.sp = true (its "
                         "emulated GEMM does not split the sequence)")
    return conflicts


def live_sources(fast: Mapping[str, bool], *, on_gpu: bool,
                 present: Callable[[str], bool] = _importable) -> dict[str, SourceState]:
    """Each source's state in a process that set its knobs itself (a researcher's own loop): ``fast`` says, per
    source, whether its knob is in the fast, nondeterministic position. On a GPU such a source is on (or
    unavailable without the library it needs); on a CPU unavailable, since nothing emulates it there."""
    states = {}
    for name, source in SOURCES.items():
        if not fast.get(name, False):
            states[name] = SourceState.OFF
        elif on_gpu and (source.needs is None or present(source.needs)):
            states[name] = SourceState.ON
        else:
            states[name] = SourceState.UNAVAILABLE
    return states


def fast_knobs(env: Mapping[str, str | None], *, deterministic_mode: bool, torch_deterministic: bool,
               fused_cross_entropy: bool) -> dict[str, bool]:
    """Per source, whether a process's knob is in the fast position (its variable not at the value
    deterministic mode sets; Megatron's and torch's flags off; the fused cross-entropy on)."""
    fast = {name: env.get(s.env[0]) != s.env[1] for name, s in SOURCES.items() if s.env is not None}
    fast.update(embedding_atomics=not deterministic_mode, torch_algorithms=not torch_deterministic,
                fused_cross_entropy=fused_cross_entropy)
    return fast


def required_env(deterministic: bool, sources: Mapping[str, SourceState] | None = None) -> dict[str, str]:
    """The variables a rank sets: each source's where it is not on (with ``sources``, a GPU rank's), else
    every one in deterministic mode and none otherwise (a CPU rank's: no CPU kernel reads them)."""
    if sources is None:
        return dict(DETERMINISTIC_ENV) if deterministic else {}
    return {s.env[0]: s.env[1] for s in SOURCES.values() if s.env is not None and sources[s.name] is not SourceState.ON}


def rank_environment(deterministic: bool, base: dict[str, str] | None = None, *,
                     sources: Mapping[str, SourceState] | None = None) -> dict[str, str]:
    """The environment for one rank: ``base`` with ``required_env`` set and the other switches removed, so
    that an inherited switch does not turn a nondeterministic source off."""
    env = dict(os.environ if base is None else base)
    wanted = required_env(deterministic, sources)
    for key in DETERMINISTIC_ENV:
        if key in wanted:
            env[key] = wanted[key]
        else:
            env.pop(key, None)
    return env


def transformer_config_flags(deterministic: bool, sources: Mapping[str, SourceState] | None = None) -> dict[str, Any]:
    """Keyword arguments of Megatron's ``TransformerConfig`` that deterministic mode (or the embedding and
    fused cross-entropy sources) fix."""
    if sources is None:
        flags: dict[str, Any] = {"deterministic_mode": deterministic}
        if deterministic:
            flags["cross_entropy_loss_fusion"] = False
        return flags
    flags = {"deterministic_mode": sources["embedding_atomics"] is not SourceState.ON}
    fused = sources["fused_cross_entropy"] is SourceState.ON
    if deterministic or fused:
        flags["cross_entropy_loss_fusion"] = fused
    return flags


def apply_in_process(deterministic: bool, sources: Mapping[str, SourceState] | None = None) -> None:
    """Set the in-process switches (torch's deterministic algorithms) for this rank."""
    import torch

    on = sources["torch_algorithms"] is SourceState.ON if sources is not None else not deterministic
    torch.use_deterministic_algorithms(not on)


def describe(deterministic: bool, emulated_nondeterminism: list[str] | None = None, *,
             sources: Mapping[str, SourceState] | None = None, on_gpu: bool = False) -> dict[str, Any]:
    """The manifest's record of every switch, of the environment that affects numerics and (with ``sources``,
    as a rank knows them) of each source's state and what it does on this device."""
    record = {
        "deterministic": deterministic,
        "transformer_config": transformer_config_flags(deterministic, sources),
        "torch_use_deterministic_algorithms": sources["torch_algorithms"] is not SourceState.ON
        if sources is not None else deterministic,
        "required_env": required_env(deterministic, sources if on_gpu else None),
        "env": {key: os.environ.get(key) for key in NUMERICS_ENV_VARS},
        "emulated_nondeterminism": list(emulated_nondeterminism or []),
    }
    if sources is not None:
        record["sources"] = {name: {"state": str(state.value), "does": SOURCES[name].gpu if on_gpu else
                                    SOURCES[name].cpu or "nothing: CPU kernels are deterministic"}
                             for name, state in sources.items()}
    return record


def sources_on(record: Mapping[str, Any]) -> list[str] | None:
    """The sources that were on in a run, from its manifest's ``determinism`` record; for a run recorded
    before sources were named, inferred from its switch (nondeterministic CPU runs then emulated the embedding
    atomics alone); None when the record does not say."""
    named = record.get("sources")
    if isinstance(named, Mapping):
        return [n for n, state in named.items() if isinstance(state, Mapping) and state.get("state") == "on"]
    if record.get("deterministic") is True:
        return []
    emulated = record.get("emulated_nondeterminism")
    if isinstance(emulated, list) and emulated:
        return ["embedding_atomics"] if any("word_embeddings" in str(e) for e in emulated) else None
    return None
