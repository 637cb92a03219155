"""Run configuration: frozen, keyword-only dataclasses loaded from TOML and validated.

A run is described by one ``RunConfig``; its sections (``model``, ``layout``, ``optim``,
``data``) are TOML tables. Every bad value raises ``ConfigError`` naming the field (as a
dotted path), the value, and what is allowed. This module imports no torch, so stores
can be read and configs checked on machines that never train.

    cfg = load_run_config("examples/tiny.toml")
    cfg2 = cfg.with_overrides({"layout.tp": 2, "precision": "bf16"})
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError
from workbench.names import MAX_NAME_BYTES, name_problem
from workbench.sites import DEFAULT_KINDS, PARAMETER_KINDS, SITE_KINDS, split_site


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class FaultKind(StrEnum):
    NONE = "none"
    BITFLIP = "bitflip"
    SCALE = "scale"
    LAYOUT_BUG = "layout_bug"


LAYOUT_BUGS: dict[str, str] = {
    "tp_partial_scale": "layer 1's attention projection (row-parallel) scales its partial sum by 1 + 2**-10 on TP "
                        "rank 1",
    "sp_norm_unreduced": "layer 1's pre-MLP norm weight not marked sequence_parallel: its gradient is never summed "
                         "over the TP ranks' sequence shards",
    "replica_not_updated": "the final norm's weight (replicated over TP) gets no gradient on TP rank 1, so only "
                           "rank 0 updates it",
    "tp_grad_averaged": "layer 0's MLP output weight (row-parallel) has its gradient halved on TP rank 1, as if "
                        "averaged over the TP ranks that each hold a different shard",
}
"""Layout bugs a run can carry on purpose (``fault.kind = "layout_bug"``), each of a kind Megatron-LM has had: the
bug-or-rounding corpus (docs/bug-or-rounding.md). Each needs TP >= 2 and PP = 1; ``sp_norm_unreduced`` needs
sequence parallelism."""


class CheckpointFormat(StrEnum):
    RUNNER = "runner"
    MEGATRON = "megatron"


class PositionEmbedding(StrEnum):
    LEARNED_ABSOLUTE = "learned_absolute"
    ROPE = "rope"


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name} = {value!r} is not allowed: {allowed}")


def flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested table's leaves under dotted keys (``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``), the keys
    ``RunConfig.with_overrides`` takes."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _is_int(value: object) -> bool:
    """A whole number, and not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(name: str, value: int) -> None:
    _require(_is_int(value) and value >= 1, name, value, "a whole number >= 1")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the GPT model (Megatron Core ``GPTModel`` with the local layer spec)."""

    num_layers: int = 4
    """Transformer layers; divisible by ``layout.pp``."""
    hidden_size: int = 256
    """Width of the residual stream; divisible by ``num_attention_heads``."""
    num_attention_heads: int = 4
    """Attention heads; divisible by ``layout.tp``."""
    ffn_hidden_size: int | None = None
    """MLP width; defaults to 4 x ``hidden_size``; divisible by ``layout.tp``."""
    vocab_size: int = 256
    """Vocabulary of the synthetic corpus; divisible by ``layout.tp``."""
    seq_length: int = 64
    """Tokens per sample."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of weight matrices."""
    position_embedding: PositionEmbedding = PositionEmbedding.ROPE
    """``rope`` or ``learned_absolute``."""
    num_experts: int = 0
    """0: a dense MLP in every layer; N >= 2: a Mixture-of-Experts MLP of N experts in every layer
    (Megatron's ``MoELayer``: top-k router with the load-balancing aux loss, ``allgather`` dispatcher)."""
    moe_topk: int = 2
    """Experts each token is routed to (MoE only); 1 to ``num_experts``."""
    moe_aux_loss_coeff: float = 0.01
    """Weight of the load-balancing aux loss (MoE only); 0 switches it off."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length"):
            _positive(f"model.{name}", getattr(self, name))
        if self.ffn_hidden_size is not None:
            _positive("model.ffn_hidden_size", self.ffn_hidden_size)
        _require(self.hidden_size % self.num_attention_heads == 0, "model.hidden_size",
                 self.hidden_size, f"a multiple of model.num_attention_heads ({self.num_attention_heads})")
        _require(isinstance(self.init_std, (int, float)) and self.init_std > 0, "model.init_std",
                 self.init_std, "a number > 0")
        object.__setattr__(self, "position_embedding",
                           _enum(PositionEmbedding, self.position_embedding, "model.position_embedding"))
        _require(isinstance(self.num_experts, int) and not isinstance(self.num_experts, bool)
                 and (self.num_experts == 0 or self.num_experts >= 2), "model.num_experts", self.num_experts,
                 "0 (dense) or a whole number >= 2")
        if self.num_experts:
            _require(_is_int(self.moe_topk) and 1 <= self.moe_topk <= self.num_experts, "model.moe_topk",
                     self.moe_topk, f"a whole number from 1 to model.num_experts ({self.num_experts})")
            _require(isinstance(self.moe_aux_loss_coeff, (int, float)) and self.moe_aux_loss_coeff >= 0,
                     "model.moe_aux_loss_coeff", self.moe_aux_loss_coeff, "a number >= 0")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size


@dataclass(frozen=True, kw_only=True)
class LayoutConfig:
    """How the model is split over processes: world size = tp x pp x dp.

    Expert parallelism does not add processes: as in Megatron, the experts of a MoE layer are
    split over ``ep`` of the data-parallel ranks (each rank keeps ``num_experts / ep`` of them).
    """

    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size (1F1B schedule when > 1)."""
    dp: int = 1
    """Data-parallel size (Megatron DDP grad buffers)."""
    ep: int = 1
    """Expert-parallel size (MoE only): a divisor of ``dp`` and of ``model.num_experts``."""
    sp: bool = False
    """Sequence parallelism (needs tp > 1): norms, dropout and residuals on a TP rank's share of the sequence."""
    vp: int = 1
    """Virtual pipeline stages per pipeline rank (interleaved 1F1B when > 1; needs pp > 1)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "vp"):
            _positive(f"layout.{name}", getattr(self, name))
        _require(self.vp == 1 or self.pp > 1, "layout.vp", self.vp, "1 with layout.pp = 1 (virtual stages split "
                 "each pipeline rank's layers)")
        _require(isinstance(self.sp, bool), "layout.sp", self.sp, "true or false")
        _require(not self.sp or self.tp > 1, "layout.sp", self.sp, "false with layout.tp = 1 (sequence parallelism "
                 "splits the sequence over the tensor-parallel ranks)")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def summary(self) -> str:
        return f"TP{self.tp}-PP{self.pp}-DP{self.dp}" + (f"-VP{self.vp}" if self.vp > 1 else "") + \
            ("-SP" if self.sp else "") + (f"-EP{self.ep}" if self.ep > 1 else "")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Megatron's optimizer (``get_megatron_optimizer``: Adam with decoupled weight decay, fp32 main parameters
    under bf16 and fp16) with warm-up and cosine decay, gradient clipping and (fp16) loss scaling; optionally
    the distributed optimizer and Megatron DDP's overlapped communication, as large runs train."""

    lr: float = 3e-3
    """Peak learning rate, reached at the end of warm-up."""
    min_lr: float = 3e-4
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = 5
    """Linear warm-up steps from 0 to ``lr``."""
    weight_decay: float = 0.01
    """Decoupled weight decay on weight matrices (not on biases or norms)."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip_grad: float = 1.0
    """Clip the global gradient L2 norm to this value; 0 disables clipping."""
    initial_loss_scale: float = 2.0**16
    """fp16 only: starting dynamic loss scale."""
    loss_scale_window: int = 50
    """fp16 only: steps without overflow before the loss scale doubles."""
    use_distributed_optimizer: bool = False
    """Megatron's distributed optimizer (ZeRO-1): each data-parallel rank reduces, updates and keeps the
    optimizer state of its own shard of every gradient buffer, then the updated parameters are gathered."""
    overlap_grad_reduce: bool = False
    """Megatron DDP starts each bucket's gradient reduction as soon as its gradients are ready, during the
    backward pass of the last micro-batch."""
    overlap_param_gather: bool = False
    """With the distributed optimizer: the updated parameters are gathered during the next forward pass
    (bucket by bucket, in its pre-hooks), not at the end of the step."""

    def __post_init__(self) -> None:
        for name in ("lr", "beta1", "beta2", "eps", "initial_loss_scale"):
            value = getattr(self, name)
            _require(isinstance(value, (int, float)) and value > 0, f"optim.{name}", value, "a number > 0")
        for name in ("min_lr", "weight_decay", "clip_grad"):
            value = getattr(self, name)
            _require(isinstance(value, (int, float)) and value >= 0, f"optim.{name}", value, "a number >= 0")
        _require(self.min_lr <= self.lr, "optim.min_lr", self.min_lr, f"at most optim.lr ({self.lr})")
        _require(self.beta1 < 1 and self.beta2 < 1, "optim.beta1/beta2", (self.beta1, self.beta2),
                 "numbers in (0, 1)")
        _require(_is_int(self.warmup_steps) and self.warmup_steps >= 0, "optim.warmup_steps",
                 self.warmup_steps, "a whole number >= 0")
        _positive("optim.loss_scale_window", self.loss_scale_window)
        for name in ("use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"):
            _require(isinstance(getattr(self, name), bool), f"optim.{name}", getattr(self, name), "true or false")
        _require(not self.overlap_param_gather or self.use_distributed_optimizer, "optim.overlap_param_gather",
                 self.overlap_param_gather, "false without optim.use_distributed_optimizer (only the distributed "
                 "optimizer gathers parameters)")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The synthetic corpus: a sparse Markov chain over the vocabulary (no downloads)."""

    seed: int = 0
    """Seed of the corpus; the same seed gives the same samples on every machine."""
    branching: int = 4
    """Successors per token; the corpus entropy grows with it (ln(vocab) is no structure)."""

    def __post_init__(self) -> None:
        _require(_is_int(self.seed) and 0 <= self.seed < 2**63, "data.seed", self.seed,
                 "a whole number from 0 to 2**63 - 1")
        _positive("data.branching", self.branching)


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """A held-out validation loss: forward only, on samples of the corpus no training step uses."""

    every: int = 10
    """Evaluate after every this many steps (and after the last); 0 never. It changes no training number."""
    samples: int = 16
    """Held-out samples per evaluation (the same ones every time); a multiple of micro_batch_size x layout.dp."""

    def __post_init__(self) -> None:
        _require(isinstance(self.every, int) and not isinstance(self.every, bool) and self.every >= 0, "eval.every",
                 self.every, "a whole number >= 0 (0 = no validation loss)")
        _positive("eval.samples", self.samples)

    def after(self, step: int, total_steps: int) -> bool:
        """Whether to evaluate once step ``step`` (0-based) has updated the model."""
        return self.every > 0 and ((step + 1) % self.every == 0 or step + 1 == total_steps)


@dataclass(frozen=True, kw_only=True)
class NondeterminismConfig:
    """Sources of nondeterminism switched one by one (``workbench.determinism.SOURCES``); a source left out
    follows the device's default for ``deterministic = false`` (on a GPU the fast defaults, on the CPU the
    embedding emulation alone). ``deterministic = true`` turns every source off."""

    embedding_atomics: bool | None = None
    """The word-embedding gradient accumulated with atomics (CPU: in a random order)."""
    attention_backward: bool | None = None
    """The attention backward's dQ / dK / dV accumulation (GPU: Transformer Engine / flash attention)."""
    splitk_gemm: bool | None = None
    """Split-K GEMMs (GPU: cuBLAS; CPU: the MLP's first GEMM as K-chunks summed in a random order)."""
    dp_allreduce: bool | None = None
    """The data-parallel all-reduce's association of the ranks' contributions (needs layout.dp >= 3)."""
    torch_algorithms: bool | None = None
    """torch's own nondeterministic kernels (GPU only)."""
    fused_cross_entropy: bool | None = None
    """Megatron's fused cross-entropy (GPU only)."""
    moe_token_combine: bool | None = None
    """MoE only: expert outputs added back into token order with atomics (CPU: in a random order; on a GPU
    this is torch's ``scatter_add_``, switched with ``torch_algorithms``)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            _require(value is None or isinstance(value, bool), f"nondeterminism.{f.name}", value, "true or false")

    def requested(self) -> dict[str, bool]:
        """The sources this table names, on (true) or off (false)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True, kw_only=True)
class RecordConfig:
    """What the recorder records per step: which kinds of site, which sites, how often, and snapshots."""

    enabled: bool = True
    """Record per-site statistics and fingerprints (the per-step scalars are always recorded)."""
    kinds: tuple[str, ...] = DEFAULT_KINDS
    """Kinds of site: param, act, loss, act_grad, grad_local, grad, exp_avg, exp_avg_sq, update."""
    sites: tuple[str, ...] = ("*",)
    """Glob patterns over site ids ("kind:name"); a site is recorded if any pattern matches."""
    every: int = 1
    """Record every N-th step (step 0 included)."""
    ranges: tuple[tuple[int, int], ...] = ()
    """Only steps in these [start, stop) ranges; empty means all steps."""
    snapshot_steps: tuple[int, ...] = ()
    """Steps at which full tensors of ``snapshot_sites`` are written to the store (always recorded)."""
    snapshot_sites: tuple[str, ...] = ()
    """Glob patterns over site ids whose full tensors are snapshotted."""
    compile: bool = True
    """Compute statistics in one fused pass (a native C++ kernel on CPU, ``torch.compile`` on GPU);
    false: plain eager torch calls (slower, no compiler needed)."""

    def __post_init__(self) -> None:
        _require(isinstance(self.enabled, bool), "record.enabled", self.enabled, "true or false")
        _require(isinstance(self.compile, bool), "record.compile", self.compile, "true or false")
        for kind in self.kinds:
            _require(kind in SITE_KINDS, "record.kinds", kind, f"one of {', '.join(SITE_KINDS)}")
        for name in ("sites", "snapshot_sites"):
            patterns = getattr(self, name)
            _require(all(isinstance(p, str) and p for p in patterns), f"record.{name}", patterns,
                     "a list of non-empty glob patterns such as \"act:layers.*\"")
        _positive("record.every", self.every)
        for pair in self.ranges:
            _require(len(pair) == 2 and 0 <= pair[0] < pair[1], "record.ranges", pair,
                     "pairs [start, stop) with 0 <= start < stop")
        _require(all(_is_int(s) and s >= 0 for s in self.snapshot_steps), "record.snapshot_steps",
                 self.snapshot_steps, "whole numbers >= 0")

    def recorded_steps(self, total_steps: int) -> list[int]:
        """The steps (of ``total_steps``) at which sites are recorded."""
        if not self.enabled:
            return []
        steps = set(range(0, total_steps, self.every))
        if self.ranges:
            steps = {s for s in steps if any(a <= s < b for a, b in self.ranges)}
        return sorted(steps | {s for s in self.snapshot_steps if s < total_steps})


@dataclass(frozen=True, kw_only=True)
class FaultConfig:
    """A fault injected on purpose, to try anomaly detection, replay and bisect on a known cause."""

    kind: FaultKind = FaultKind.NONE
    """``none``, ``bitflip`` (flip one bit of one element) or ``scale`` (multiply the tensor by ``factor``)."""
    site: str = ""
    """``act:<module>`` (a module's output in the forward pass, e.g. ``act:layers.1.mlp``) or
    ``grad:<parameter>`` (a parameter's reduced gradient, e.g. ``grad:layers.1.mlp.linear_fc1.weight``)."""
    step: int = 0
    """The step at which the fault happens (once)."""
    index: int = 0
    """Bit flip: flat index of the element in the rank's local tensor (the first micro-batch's output)."""
    bit: int = 30
    """Bit flip: the bit, 0 = least significant; 30 is the top exponent bit of an fp32 number."""
    factor: float = 1000.0
    """Scale: the factor."""
    bug: str = ""
    """Layout bug: which (``LAYOUT_BUGS``); it acts from step 0 on, wherever the bug is."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _enum(FaultKind, self.kind, "fault.kind"))
        if self.kind is FaultKind.NONE:
            return
        if self.kind is FaultKind.LAYOUT_BUG:
            _require(self.bug in LAYOUT_BUGS, "fault.bug", self.bug, f"one of {', '.join(LAYOUT_BUGS)}")
            return
        kind, name = split_site(self.site)
        _require(kind in ("act", "grad") and name != "", "fault.site", self.site,
                 "\"act:<module>\" such as \"act:layers.1.mlp\" or \"grad:<parameter>\"")
        for field_name in ("step", "index"):
            value = getattr(self, field_name)
            _require(_is_int(value) and value >= 0, f"fault.{field_name}", value, "a whole number >= 0")
        _require(_is_int(self.bit) and 0 <= self.bit < 32, "fault.bit", self.bit, "a whole number in [0, 32)")
        _require(isinstance(self.factor, (int, float)) and self.factor == self.factor, "fault.factor", self.factor,
                 "a number")

    def describe(self) -> str:
        if self.kind is FaultKind.NONE:
            return "none"
        if self.kind is FaultKind.LAYOUT_BUG:
            return f"layout bug {self.bug}: {LAYOUT_BUGS[self.bug]}"
        what = f"flip bit {self.bit} of element {self.index}" if self.kind is FaultKind.BITFLIP \
            else f"multiply by {self.factor:g}"
        return f"{what} of {self.site} at step {self.step}"


PERTURB_PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
"""The roundings a band run can carry (``RunConfig.perturb``; ``analysis.rounding.UNIT_ROUNDOFF``)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run: model, layout, precision, determinism, schedule and data."""

    name: str
    """Run name: letters, digits, '-', '_' and '.'; names the run's folder."""
    model: ModelConfig = field(default_factory=ModelConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    nondeterminism: NondeterminismConfig = field(default_factory=NondeterminismConfig)
    precision: Precision = Precision.FP32
    """fp32, bf16, fp16 (dynamic loss scaling) or fp8 (GPU with Transformer Engine only)."""
    deterministic: bool = True
    """Apply Megatron's deterministic mode; false leaves fast (GPU) or emulated (CPU) nondeterminism."""
    perturb: str | None = None
    """A band run: add one rounding of this precision (fp32, bf16, fp16, fp8) to every module's output and its
    gradient (``workbench.recorder.rounding``); a few such runs of a reference are the band ``workbench verdict``
    holds a layout or precision change to. None (the default): an ordinary run."""
    seed: int = 1234
    """Seed of the initialisation; the same seed gives the same weights for every layout."""
    steps: int = 40
    """Optimizer steps."""
    global_batch_size: int = 16
    """Samples per step; divisible by micro_batch_size x layout.dp."""
    micro_batch_size: int = 2
    """Samples per forward pass."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (and at step 0); 0 saves none."""
    checkpoint_format: CheckpointFormat = CheckpointFormat.RUNNER
    """``runner``: the runner's files (parameters and optimizer by name); ``megatron``: besides them the model's
    sharded state dict through Megatron's ``dist_checkpointing`` (torch_dist), which a run at another layout
    loads resharded by Megatron (``--start-from``) and Megatron-LM can read."""
    flush_every: int = 10
    """Write recorded steps to the store at least this often; bounds what a crash loses."""

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and name_problem(self.name) is None and
                 all(c.isalnum() or c in "-_." for c in self.name), "name", self.name,
                 "one folder's name of letters, digits, '-', '_' and '.', not '.' or '..', at most "
                 f"{MAX_NAME_BYTES} bytes")
        object.__setattr__(self, "precision", _enum(Precision, self.precision, "precision"))
        object.__setattr__(self, "checkpoint_format", _enum(CheckpointFormat, self.checkpoint_format,
                                                            "checkpoint_format"))
        _require(isinstance(self.deterministic, bool), "deterministic", self.deterministic, "true or false")
        _require(self.perturb is None or self.perturb in PERTURB_PRECISIONS, "perturb", self.perturb,
                 f"absent, or one of {', '.join(PERTURB_PRECISIONS)}")
        _require(_is_int(self.seed) and 0 <= self.seed < 2**63, "seed", self.seed, "a whole number from 0 to 2**63 - 1")
        for name in ("steps", "global_batch_size", "micro_batch_size", "flush_every"):
            _positive(name, getattr(self, name))
        _require(self.steps <= MAX_STEPS, "steps", self.steps,
                 f"at most {MAX_STEPS:,} (a run's store holds a row per step; Megatron's longest runs take ~10**6)")
        _require(_is_int(self.checkpoint_every) and self.checkpoint_every >= 0, "checkpoint_every",
                 self.checkpoint_every, "a whole number >= 0 (0 = no checkpoints)")
        m, lay = self.model, self.layout
        if self.fault.kind is FaultKind.LAYOUT_BUG:
            _require(lay.tp >= 2 and lay.pp == 1 and (lay.sp or self.fault.bug != "sp_norm_unreduced"), "fault.bug",
                     self.fault.bug, "a layout bug in a run with layout.tp >= 2 and layout.pp = 1 (and layout.sp "
                     "for sp_norm_unreduced)")
        per_step = self.micro_batch_size * lay.dp
        _require(self.global_batch_size % per_step == 0, "global_batch_size", self.global_batch_size,
                 f"a multiple of micro_batch_size x layout.dp = {per_step}")
        _require(m.num_layers % lay.pp == 0, "layout.pp", lay.pp,
                 f"a divisor of model.num_layers ({m.num_layers})")
        _require(m.num_layers % (lay.pp * lay.vp) == 0, "layout.vp", lay.vp,
                 f"a divisor of model.num_layers / layout.pp ({m.num_layers // lay.pp})")
        _require(lay.vp == 1 or self.num_microbatches % lay.pp == 0, "layout.vp", lay.vp,
                 f"1 unless layout.pp ({lay.pp}) divides the micro-batches per step ({self.num_microbatches}): "
                 "the interleaved schedule runs them in groups of pp")
        _require(lay.vp == 1 or self.eval.every == 0 or (self.eval.samples // per_step) % lay.pp == 0,
                 "eval.samples", self.eval.samples, f"a multiple of micro_batch_size x layout.dp x layout.pp = "
                 f"{per_step * lay.pp} with layout.vp > 1 (the interleaved schedule runs micro-batches in groups "
                 "of pp)")
        for name, size in (("num_attention_heads", m.num_attention_heads), ("vocab_size", m.vocab_size),
                           ("ffn_hidden_size", m.ffn_size)):
            _require(size % lay.tp == 0, "layout.tp", lay.tp, f"a divisor of model.{name} ({size})")
        _require(self.eval.every == 0 or self.eval.samples % per_step == 0, "eval.samples", self.eval.samples,
                 f"a multiple of micro_batch_size x layout.dp = {per_step}")
        _require(all(s < self.steps for s in self.record.snapshot_steps), "record.snapshot_steps",
                 self.record.snapshot_steps, f"steps below steps ({self.steps})")
        _require(self.fault.kind is FaultKind.NONE or self.fault.step < self.steps, "fault.step", self.fault.step,
                 f"a step below steps ({self.steps})")
        _require(not lay.sp or m.seq_length % lay.tp == 0, "layout.sp", lay.sp,
                 f"false unless layout.tp ({lay.tp}) divides model.seq_length ({m.seq_length})")
        _require(not (m.is_moe and lay.tp > 1 and not lay.sp), "layout.sp", lay.sp,
                 "true for a MoE model with layout.tp > 1 (Megatron's MoELayer refuses TP without sequence "
                 "parallelism)")
        if lay.ep > 1:
            _require(m.is_moe, "layout.ep", lay.ep, "1 for a dense model (set model.num_experts for experts to split)")
            _require(lay.dp % lay.ep == 0, "layout.ep", lay.ep,
                     f"a divisor of layout.dp ({lay.dp}): Megatron builds the expert groups out of the data-parallel "
                     "ranks")
            _require(m.num_experts % lay.ep == 0, "layout.ep", lay.ep,
                     f"a divisor of model.num_experts ({m.num_experts})")
        switched_on = [name for name, on in self.nondeterminism.requested().items() if on]
        _require(not (self.deterministic and switched_on), f"nondeterminism.{(switched_on or [''])[0]}", True,
                 "false or absent: deterministic = true turns every source off (set deterministic = false to "
                 "switch sources on one by one)")
        _require(not (self.nondeterminism.moe_token_combine and not m.is_moe), "nondeterminism.moe_token_combine",
                 True, "false or absent for a dense model (model.num_experts = 0)")
        sharded = [p for p in self.record.snapshot_sites if any(fnmatch.fnmatchcase(kind, split_site(p)[0])
                                                                 for kind in PARAMETER_KINDS)]
        _require(not (self.optim.use_distributed_optimizer and self.record.snapshot_steps and sharded),
                 "record.snapshot_sites", list(self.record.snapshot_sites), "activation sites only with "
                 f"optim.use_distributed_optimizer ({sharded[0] if sharded else ''} names parameter-sized sites, "
                 "which the recorder cannot yet snapshot from the distributed optimizer's uneven shards)")
        _require(not (self.nondeterminism.dp_allreduce and lay.dp < 3), "nondeterminism.dp_allreduce", True,
                 f"false with layout.dp = {lay.dp}: a sum of two contributions commutes exactly, so the "
                 "association changes nothing below 3 data-parallel ranks")

    def source_states(self, *, on_gpu: bool) -> dict[str, Any]:
        """Each nondeterminism source's state in this run (``workbench.determinism.resolve``)."""
        from workbench.determinism import resolve

        return resolve(self.deterministic, self.nondeterminism.requested(), on_gpu=on_gpu,
                       moe=self.model.is_moe)

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.layout.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.model.seq_length

    def summary(self) -> str:
        m = self.model
        mode = "det" if self.deterministic else "nondet"
        moe = f" E{m.num_experts}top{m.moe_topk}" if m.is_moe else ""
        return (f"L{m.num_layers} H{m.hidden_size}{moe} {self.layout.summary()} {self.precision.value} "
                f"{mode} seed{self.seed}")

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> RunConfig:
        return _build(cls, data, prefix="", source=source)

    def with_overrides(self, overrides: Mapping[str, Any], *, source: str = "overrides") -> RunConfig:
        """A copy with dotted keys replaced, e.g. ``{"layout.tp": 2, "precision": "bf16"}``."""
        data = self.to_dict()
        for key, value in overrides.items():
            node = data
            *parents, leaf = key.split(".")
            for part in parents:
                if not isinstance(node.get(part), dict):
                    raise ConfigError(f"{source}: {key!r} does not name a config field")
                node = node[part]
            if leaf not in node:
                raise ConfigError(f"{source}: {key!r} does not name a config field")
            node[leaf] = value
        return RunConfig.from_dict(data, source=source)

    def numerics_hash(self, *, seed: bool = True, layout: bool = True) -> str:
        """Hash of everything that shapes the numbers (the name excluded): equal configs, equal hash.
        Without ``seed``: equal for runs that differ only in their initialisation seed; without ``layout``,
        for runs that differ only in how the work is split (the same model and training; the distributed
        optimizer and overlapped communication count as the layout)."""
        data = self.to_dict()
        data.pop("name")
        if not seed:
            data.pop("seed")
        layout_fields = data.pop("layout")
        data.pop("flush_every")
        data.pop("checkpoint_every")
        data.pop("checkpoint_format")
        data.pop("record")
        data.pop("eval")  # evaluating changes no training number
        if data["perturb"] is None:  # ordinary runs keep the hash they had before band runs existed
            data.pop("perturb")
        switched = {k: v for k, v in data.pop("nondeterminism").items() if v is not None}
        if switched:  # runs without a [nondeterminism] table keep the hash they had before it existed
            data["nondeterminism"] = switched
        if not self.model.is_moe:  # dense runs keep the hash they had before experts existed
            for key in ("num_experts", "moe_topk", "moe_aux_loss_coeff"):
                data["model"].pop(key)
        if self.layout.ep == 1:
            layout_fields.pop("ep")
        if not self.layout.sp:
            layout_fields.pop("sp")
        if self.layout.vp == 1:
            layout_fields.pop("vp")
        # How the optimizer's work and communication are split over the data-parallel ranks is part of the
        # layout; runs without them keep the hash they had before they existed.
        sharing = {flag: data["optim"].pop(flag) for flag in ("use_distributed_optimizer", "overlap_grad_reduce",
                                                             "overlap_param_gather")}
        if any(sharing.values()):
            layout_fields["optimizer"] = {flag: on for flag, on in sharing.items() if on}
        if layout:
            data["layout"] = layout_fields
        if data["fault"]["kind"] == FaultKind.NONE.value:
            data.pop("fault")  # runs without a fault keep the hash they had before faults existed
        elif not data["fault"]["bug"]:
            data["fault"].pop("bug")  # nor do the faults that are no layout bug, before layout bugs existed
        text = json.dumps(data, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


_SECTIONS: dict[str, type] = {"model": ModelConfig, "layout": LayoutConfig, "optim": OptimConfig,
                              "data": DataConfig, "record": RecordConfig, "eval": EvalConfig, "fault": FaultConfig,
                              "nondeterminism": NondeterminismConfig}


def _enum(kind: type[StrEnum], value: object, name: str) -> Any:
    try:
        return kind(str(value)) if isinstance(value, str) else kind(value)  # type: ignore[arg-type]
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)  # type: ignore[attr-defined]
        raise ConfigError(f"{name} = {value!r} is not allowed: one of {allowed}") from None


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, StrEnum):
        return value.value
    return value


def _build(cls: type, data: Mapping[str, Any], *, prefix: str, source: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'config'} must be a table, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{source}: unknown field '{prefix}{unknown[0]}'; "
                          f"allowed: {', '.join(prefix + n for n in fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        section = _SECTIONS.get(name) if cls is RunConfig else None
        if section is not None:
            kwargs[name] = _build(section, value, prefix=f"{prefix}{name}.", source=source)
            continue
        expected = str(fields[name].type)
        if expected.startswith("tuple"):
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                raise ConfigError(f"{source}: {prefix}{name} = {value!r} is not allowed: a list")
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        if expected == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if expected in ("int", "int | None", "bool") and isinstance(value, float):
            raise ConfigError(f"{source}: {prefix}{name} = {value!r} is not allowed: a whole number")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    except TypeError as err:
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'config'}: {err}") from None


MAX_STEPS = 10**8
"""The most steps a run config may plan."""


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, turning a missing file or a syntax error into ``ConfigError``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:  # TOML is UTF-8
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {err.start}: {err.object[err.start:err.start + 1]!r}); "
                          "a TOML config is UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None


def load_run_config(path: str | Path) -> RunConfig:
    """Load and validate a run config from a TOML file."""
    return RunConfig.from_dict(read_toml(path), source=str(path))
