"""The run manifest as one typed record: what every reader reads, whoever produced the store.

A store's manifest is its Zarr group's attributes. Producers differ (the workbench's runner,
a researcher's own Megatron Core loop, importers of other tools' logs), so readers never read
a producer's configuration class: they read ``RunManifest``, parsed here from the attributes
with a clear error naming any field that is missing or of the wrong type.

    info = parse_manifest(attrs, source="RUN/run.zarr")
    info.model.summary(), info.layout.summary(), info.precision, info.deterministic

A field a producer could not know is absent (None), never faked. Schema v1 stores (the
runner's only) carry their facts in ``config`` and are read the same way. Imports no torch.

Every producer writes a new store's manifest with ``store_attributes``: the typed record, when
the run started, its status, and the producer's further facts (the environment's, the
runner's config hash, an importer's notes). ``runner_manifest`` is the runner's.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import math
import os
import platform
import socket
import subprocess
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import determinism
from workbench.errors import ArgumentError, DamagedStoreError
from workbench.names import check_name
from workbench.store.layout import SCALARS_LOGGED, Status

if TYPE_CHECKING:
    from workbench.config import RunConfig

_PACKAGES = ("workbench", "torch", "megatron-core", "transformer-engine", "zarr", "numpy", "xarray", "pandas")

RUNNER = "workbench runner"
"""``producer`` of stores the workbench's own runner trains."""
USER_LOOP = "user loop"
"""``producer`` of stores a researcher's own training loop records (``workbench.recorder.record``)."""
MEGATRON_LM_PRETRAIN = "megatron-lm pretrain()"
"""``producer`` of stores of Megatron-LM's own loop, recorded by ``python -m workbench.megatron_lm``."""


@dataclass(frozen=True, kw_only=True)
class ModelSignature:
    """The shape of the model a run trained: runs of different signatures cannot be compared."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    seq_length: int
    parameters: int | None = None
    """Parameter count of the full model, where the producer knew it."""
    num_experts: int | None = None
    """Experts per MoE layer; None for a dense model."""
    moe_topk: int | None = None
    """Experts each token is routed to (MoE only)."""

    def summary(self) -> str:
        moe = f" E{self.num_experts}top{self.moe_topk}" if self.num_experts else ""
        return f"L{self.num_layers} H{self.hidden_size}{moe}"

    def shape(self) -> dict[str, int]:
        """The fields two comparable runs share (the parameter count follows from them)."""
        shape = {"num_layers": self.num_layers, "hidden_size": self.hidden_size,
                 "num_attention_heads": self.num_attention_heads, "vocab_size": self.vocab_size,
                 "seq_length": self.seq_length}
        if self.num_experts:  # a dense model's signature stays what it was before experts existed
            shape.update(num_experts=self.num_experts, moe_topk=self.moe_topk or 0)
        return shape


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """How the work was split: tensor, pipeline, data parallel; virtual pipeline, sequence,
    context and expert parallelism where present."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    vp: int | None = None
    sp: bool = False
    cp: int = 1
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def summary(self) -> str:
        text = f"TP{self.tp}-PP{self.pp}-DP{self.dp}"
        extras = [f"VP{self.vp}" if self.vp else "", "SP" if self.sp else "", f"CP{self.cp}" if self.cp > 1 else "",
                  f"EP{self.ep}" if self.ep > 1 else ""]
        return "-".join([text, *[e for e in extras if e]])


@dataclass(frozen=True, kw_only=True)
class RunManifest:
    """What a run was; every field but the first three may be unknown (None)."""

    run_id: str
    name: str
    producer: str
    model: ModelSignature | None = None
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    precision: str | None = None
    deterministic: bool | None = None
    """Whether the process ran in deterministic mode; the switches one by one are in ``determinism``."""
    seed: int | None = None
    determinism: Mapping[str, Any] = field(default_factory=dict)
    user_config: Mapping[str, Any] | None = None
    """The producer's own configuration, opaque (Megatron-LM's args, a user's dict)."""
    config: Mapping[str, Any] | None = None
    """The workbench runner's ``RunConfig`` as a mapping; None for any other producer."""
    config_hash: str | None = None
    """The runner's ``RunConfig.numerics_hash``: equal for two runs of one configuration."""
    resumes: tuple[int, ...] = ()
    """The steps the run was resumed at from a checkpoint (``workbench run --resume``)."""
    fault: str | None = None
    """The injected fault (``FaultConfig.describe``); None for a run without one."""
    replay: Mapping[str, Any] | None = None
    """For a replay (``workbench replay``/``bisect``): the replayed step and where it started from."""
    started_from: Mapping[str, Any] | None = None
    """For a run started from another's checkpoint: that run, its id and the step."""
    runtime: Mapping[str, Any] = field(default_factory=dict)
    """Where it ran: device, backend and the environment's fingerprint (``workbench.environment``: CPU vector
    ISA, threads, versions, determinism variables, GPU and topology); empty where the producer did not say."""
    perturbation: Mapping[str, Any] | None = None
    """For a band run (``record(..., perturb=...)``): what rounding noise was added, of which precision, where
    (``workbench.recorder.rounding``); None for an ordinary run."""
    revision: str | None = None
    """The git revision of the code that made the run (its working directory's), where the producer said."""
    replicas_parted: Mapping[str, Any] | None = None
    """Where a parameter replicated over the TP ranks first differed between them (``step``, ``site``, ``tp_rank``;
    ``workbench.recorder.replicas``); None where the copies agreed, or nobody compared them."""

    def __post_init__(self) -> None:  # every producer's name, whatever file or flag it came from
        check_name(self.name, "run name", error=ArgumentError)

    def configuration(self) -> str:
        """The run's configuration apart from its determinism switch and name ("L4 H128 TP1-PP1-DP1 fp32")."""
        parts = [self.model.summary() if self.model else "model ?", self.layout.summary(), self.precision or "?"]
        return " ".join(parts)

    def summary(self) -> str:
        mode = {True: "det", False: "nondet", None: "det?"}[self.deterministic]
        switched = (self.config or {}).get("nondeterminism") or {}
        named = self.determinism.get("sources")
        if self.deterministic is False and isinstance(switched, Mapping) and any(v is not None for v in
                                                                                 switched.values()) \
                and isinstance(named, Mapping):  # sources switched one by one: say which were on
            on = [n for n, state in named.items() if isinstance(state, Mapping) and state.get("state") == "on"]
            mode += f"[{'+'.join(on) or 'all off'}]"
        seed = f" seed{self.seed}" if self.seed is not None else ""
        return f"{self.configuration()} {mode}{seed}"


@dataclass(frozen=True)
class Provenance:
    """Where a figure's or a table's runs came from: printed under every exported figure."""

    runs: tuple[str, ...]
    """Run ids."""
    configs: tuple[str, ...]
    """One-line config summaries, one per distinct config."""
    schema_version: int
    revision: str | None
    """Code revision (git) the runs were made with."""

    def lines(self) -> tuple[str, str]:
        """Two lines of text: the runs; their configs, the store schema and the code revision."""
        revision = ", ".join(part[:12] for part in (self.revision or "unknown").split(", "))  # one per revision
        configs = "; ".join(self.configs[:3]) + (" ..." if len(self.configs) > 3 else "")
        runs = ", ".join(self.runs[:6]) + (f" and {len(self.runs) - 6} more" if len(self.runs) > 6 else "")
        return f"runs: {runs}", f"config: {configs} · store schema v{self.schema_version} · revision {revision}"


def _require(attrs: Mapping[str, Any], name: str, kind: type | tuple[type, ...], source: str,
             *, optional: bool = False) -> Any:
    if name not in attrs or attrs[name] is None:
        if optional:
            return None
        raise DamagedStoreError(f"{source}: the manifest lacks the field {name!r}; rewrite the run or restore "
                                "the field")
    value = attrs[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DamagedStoreError(f"{source}: the manifest field {name!r} is {type(value).__name__} {value!r}, where "
                                f"a {names} belongs; rewrite the run or restore the field")
    return value


_LARGEST_SIZE = 2**31 - 1
"""Largest layer count, width, vocabulary, sequence or parallel size a manifest may state."""
_LARGEST_COUNT = 2**63 - 1
"""Largest parameter count, seed or step a manifest may state (what an int64 holds)."""


def _in_range(value: Any, name: str, low: float, high: float, source: str) -> Any:
    """``value`` (None passes), or ``DamagedStoreError`` naming the field when it lies outside [low, high]."""
    if value is not None and not low <= value <= high:
        raise DamagedStoreError(f"{source}: the manifest field {name!r} is {value!r}, outside [{low:g}, {high:g}]; "
                                "rewrite the run or restore the field")
    return value


def _model(value: Any, source: str) -> ModelSignature | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise DamagedStoreError(f"{source}: the manifest field 'model' is {type(value).__name__}, where a mapping "
                                "belongs")
    where = f"{source} (model)"
    fields = {n: _in_range(_require(value, n, int, where), n, 1, _LARGEST_SIZE, where) for n in
              ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")}
    extra = {n: _in_range(_require(value, n, int, where, optional=True), n, 0, _LARGEST_COUNT, where)
             for n in ("parameters", "num_experts", "moe_topk")}
    if not extra["num_experts"]:  # a dense model (a runner config says num_experts = 0)
        extra.update(num_experts=None, moe_topk=None)
    return ModelSignature(**fields, **extra)


def parse_layout(value: Any, source: str) -> ParallelLayout:
    """The typed layout of a manifest's ``layout`` mapping (schema v1 or v2; TP=PP=DP=1 when absent)."""
    if value is None:
        return ParallelLayout()
    if not isinstance(value, Mapping):
        raise DamagedStoreError(f"{source}: the manifest field 'layout' is {type(value).__name__}, where a mapping "
                                "belongs")
    where = f"{source} (layout)"
    sizes = {n: _in_range(_require(value, n, int, where, optional=True), n, 1, _LARGEST_SIZE, where)
             for n in ("tp", "pp", "dp", "cp", "ep", "vp")}
    vp = sizes.pop("vp")
    return ParallelLayout(**{n: v for n, v in sizes.items() if v is not None}, vp=vp,
                          sp=bool(_require(value, "sp", bool, where, optional=True)))


def parse_manifest(attrs: Mapping[str, Any], *, source: str) -> RunManifest:
    """The typed manifest of a store's attributes (schema v1 or v2); ``DamagedStoreError`` naming
    ``source`` and the field when one is missing, of the wrong type or out of range. The producer's
    further facts that readers use (``FACTS``) are checked here too, so that no reader meets a bad one."""
    check_facts(attrs, source)
    run_id = _require(attrs, "run_id", str, source)
    name = check_name(_require(attrs, "name", str, source), "name", f"{source} (manifest)", DamagedStoreError)
    config = _require(attrs, "config", Mapping, source, optional=True)
    if config is not None:  # every field's type and range, as the runner would take it
        from workbench.config import RunConfig

        RunConfig.from_dict(config, source=f"{source} (manifest config)")
    if "producer" in attrs:  # schema v2: the facts stand on their own
        producer = _require(attrs, "producer", str, source)
        model = _model(attrs.get("model"), source)
        deterministic = _require(attrs, "deterministic", bool, source, optional=True)
        seed = _in_range(_require(attrs, "seed", int, source, optional=True), "seed", 0, _LARGEST_COUNT, source)
    else:  # schema v1: the runner's config holds them
        if config is None:
            raise DamagedStoreError(f"{source}: the manifest lacks the field 'config' (and, a schema v1 store, "
                                    "has no 'producer'); rewrite the run or restore the field")
        producer = RUNNER
        model = _model({k: v for k, v in _require(config, "model", Mapping, f"{source} (config)").items()}, source)
        deterministic = _require(config, "deterministic", bool, f"{source} (config)", optional=True)
        seed = _require(config, "seed", int, f"{source} (config)", optional=True)
    return RunManifest(
        run_id=run_id, name=name, producer=producer, model=model, layout=parse_layout(attrs.get("layout"), source),
        precision=_require(attrs, "precision", str, source, optional=True), deterministic=deterministic, seed=seed,
        determinism=_require(attrs, "determinism", Mapping, source, optional=True) or {},
        user_config=_require(attrs, "user_config", Mapping, source, optional=True), config=config,
        config_hash=attrs.get("config_hash"), resumes=tuple(attrs.get("resumes") or ()),  # FACTS checked them
        fault=None if attrs.get("fault") in (None, "none") else attrs["fault"], replay=attrs.get("replay"),
        started_from=attrs.get("started_from"), runtime=attrs.get("runtime") or {},
        perturbation=attrs.get("perturbation"), revision=attrs.get("git_revision"),
        replicas_parted=attrs.get("replicas_parted"))


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _whole(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _finite(low: float, *, above: bool = False) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and \
        (v > low if above else v >= low)


def _steps(v: Any) -> bool:
    return isinstance(v, list) and all(_whole(0, _LARGEST_COUNT)(step) for step in v)


def _mapping(**fields: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A mapping whose named fields, where present and not None, pass their checks."""
    return lambda v: isinstance(v, Mapping) and all(check(v[n]) for n, check in fields.items()
                                                    if v.get(n) is not None)


_PID = _whole(1, 2**31 - 1)
FACTS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "kind": (_text, "a non-empty string"),
    "schema_version": (_whole(1, 2**31 - 1), "a whole number >= 1"),
    "status": (lambda v: isinstance(v, str) and v in set(Status), f"one of {', '.join(Status)}"),
    "started_at": (lambda v: isinstance(v, str), "a string (an ISO time)"),
    "ended_at": (lambda v: isinstance(v, str), "a string (an ISO time)"),
    "resumes": (_steps, "a list of step numbers >= 0"),
    "steps_planned": (_whole(0, _LARGEST_COUNT), "a whole number >= 0"),
    "config_hash": (lambda v: isinstance(v, str), "a string"),
    "fault": (lambda v: isinstance(v, str), "a string"),
    "git_revision": (lambda v: isinstance(v, str), "a string"),
    "host": (lambda v: isinstance(v, str), "a string"),
    "platform": (lambda v: isinstance(v, str), "a string"),
    "kinds_missing": (_mapping(), "a mapping of site kind to why it was never seen"),
    SCALARS_LOGGED: (lambda v: isinstance(v, bool), "true or false"),
    "versions": (_mapping(), "a mapping of package to version"),
    "runtime": (_mapping(), "a mapping"),
    "error": (_mapping(), "a mapping"),
    "launcher": (_mapping(pid=_PID, host=lambda v: isinstance(v, str)),
                 "a mapping with a pid (1 to 2**31 - 1) and a host (a string)"),
    "heartbeat": (_mapping(at=_finite(0.0), every_s=_finite(0.0, above=True)),
                  "a mapping with 'at' (epoch seconds) and 'every_s' (> 0)"),
    "user_config_hash": (lambda v: isinstance(v, str), "a string"),
    "replicas_parted": (lambda v: _mapping(step=_whole(0, _LARGEST_COUNT), site=lambda s: isinstance(s, str),
                                           tp_rank=_whole(0, _LARGEST_SIZE))(v)
                        and all(v.get(n) is not None for n in ("step", "site", "tp_rank")),
                        "a mapping with the step >= 0, the site and the TP rank"),
    "perturbation": (_mapping(precision=lambda v: isinstance(v, str), relative_size=_finite(0.0, above=True)),
                     "a mapping with the precision and the relative size (> 0) of the noise"),
    "started_from": (_mapping(run=lambda v: isinstance(v, str), run_id=lambda v: isinstance(v, str),
                              step=_whole(0, _LARGEST_COUNT)), "a mapping with the run, its id and a step >= 0"),
    "replay": (_mapping(step=_whole(0, _LARGEST_COUNT), from_step=_whole(0, _LARGEST_COUNT)),
               "a mapping with the replayed step >= 0"),
    "diverged": (_mapping(step=_whole(0, _LARGEST_COUNT), site=lambda v: isinstance(v, str),
                          reference=lambda v: isinstance(v, str)),
                 "a mapping with the step >= 0, the site and the reference"),
}
"""The producer's further facts that readers use, and what each must be where present: checked when a
manifest is parsed, so that a reader never meets a field of the wrong type (a pid past the OS's range,
a resume step that is a string). Any other field is the producer's own and passes unread."""


def check_facts(attrs: Mapping[str, Any], source: str) -> None:
    """``DamagedStoreError`` naming the first of ``FACTS`` that is present (not None) and wrong."""
    for name, (valid, what) in FACTS.items():
        value = attrs.get(name)
        if value is not None and not valid(value):
            raise DamagedStoreError(f"{source}: the manifest field {name!r} is {type(value).__name__} "
                                    f"{_shown(value)}, where {what} belongs; rewrite the run or restore the field")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def manifest_fields(info: RunManifest) -> dict[str, Any]:
    """The attributes that ``parse_manifest`` reads back as ``info`` (schema v2)."""
    layout = {"tp": info.layout.tp, "pp": info.layout.pp, "dp": info.layout.dp, "cp": info.layout.cp,
              "ep": info.layout.ep, "sp": info.layout.sp, "vp": info.layout.vp, "world_size": info.layout.world_size}
    model = None
    if info.model is not None:
        model = {**info.model.shape(), "parameters": info.model.parameters}
    out: dict[str, Any] = {"run_id": info.run_id, "name": info.name, "producer": info.producer, "model": model,
                           "layout": layout, "precision": info.precision, "deterministic": info.deterministic,
                           "seed": info.seed, "determinism": dict(info.determinism),
                           "user_config": dict(info.user_config) if info.user_config is not None else None}
    if info.config is not None:
        out["config"] = dict(info.config)
    facts = {"config_hash": info.config_hash, "fault": info.fault, "replay": info.replay,
             "started_from": info.started_from, "runtime": info.runtime or None, "perturbation": info.perturbation}
    out.update({name: dict(v) if isinstance(v, Mapping) else v for name, v in facts.items() if v is not None})
    if info.resumes:
        out["resumes"] = list(info.resumes)
    return out


def now() -> str:
    """A manifest's timestamp: UTC, to the second."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_run_id(name: str) -> str:
    """A run id: the run's name and 8 random hex digits."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def store_attributes(info: RunManifest, *, status: Status, **facts: Any) -> dict[str, Any]:
    """The attributes of a new store: ``info``'s fields, when it started, its status, no resume yet,
    and the producer's further ``facts`` (each a field of its own)."""
    return {"resumes": [], **manifest_fields(info), "started_at": now(), "status": status, **facts}


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_revision(directory: Path | None = None) -> str | None:
    """The revision of the checkout at ``directory`` (default: this project's), with ``-dirty`` if it has
    changes; None outside a git checkout."""
    directory = directory or Path(__file__).resolve().parent.parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=directory,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("-dirty" if dirty else "")


def environment_facts(directory: Path | None = None) -> dict[str, Any]:
    """Where and with what a run is produced: library versions, host, platform, git revision of
    ``directory``, and the producing process."""
    host = socket.gethostname()
    return {"versions": library_versions(), "host": host, "platform": platform.platform(),
            "git_revision": git_revision(directory), "launcher": {"pid": os.getpid(), "host": host}}


def runner_manifest(cfg: RunConfig, *, producer: str = RUNNER, **facts: Any) -> dict[str, Any]:
    """The attributes of a new store the workbench's runner trains ``cfg`` into (or another ``producer``
    writes as if it had: a synthetic store), with the producer's further ``facts``."""
    m = cfg.model
    info = RunManifest(
        run_id=new_run_id(cfg.name), name=cfg.name, producer=producer,
        model=ModelSignature(num_layers=m.num_layers, hidden_size=m.hidden_size,
                             num_attention_heads=m.num_attention_heads, vocab_size=m.vocab_size,
                             seq_length=m.seq_length, num_experts=m.num_experts or None,
                             moe_topk=m.moe_topk if m.is_moe else None),
        layout=ParallelLayout(tp=cfg.layout.tp, pp=cfg.layout.pp, dp=cfg.layout.dp, ep=cfg.layout.ep,
                              sp=cfg.layout.sp, vp=cfg.layout.vp if cfg.layout.vp > 1 else None),
        precision=cfg.precision.value,
        deterministic=cfg.deterministic, seed=cfg.seed, determinism=determinism.describe(cfg.deterministic),
        config=cfg.to_dict())
    return store_attributes(info, status=Status.CREATED, config_hash=cfg.numerics_hash(), fault=cfg.fault.describe(),
                            **environment_facts(), **facts)
