"""Synthetic run stores with a known answer: for benchmarks, widget latency and tests at scale.

    write_synthetic_run(dir / "a", steps=10_000, sites=1_000, seed=0)
    write_synthetic_run(dir / "b", steps=10_000, sites=1_000, seed=0, diverge_at=(4_000, 317))

Both stores are real run stores written through ``workbench.store.writer``; only the
numbers are made up. Sites follow the execution order of a GPT decoder (parameters,
activations, activation gradients backwards, gradients, optimizer state, updates), 50 per
layer. Two runs with the same ``seed`` are bitwise identical; ``diverge_at=(step, index)``
makes the site at ``index`` of the execution order and every later one differ from
``step`` on, and every site from ``step + 1`` on, with a relative difference that starts
at ``initial_difference`` and grows by ``growth`` decades per step, the way a rounding
difference spreads through training. ``sites=0`` writes the scalars only; ``written=k`` only the first k steps,
with ``status=None`` as a run partway through leaves them. The one synthetic writer: the tests, the benchmarks
and the run-store contract use it. Imports no torch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from workbench.config import RecordConfig, RunConfig
from workbench.errors import ArgumentError
from workbench.sites import site_id
from workbench.statistics import STAT_NAMES
from workbench.store import layout
from workbench.store.manifest import runner_manifest
from workbench.store.writer import ScalarWriter, SiteInfo, create_sites_group, create_store, set_status, write_site_rows

_PARAMETERS = ("input_layernorm.weight", "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
               "self_attention.linear_proj.weight", "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight",
               "mlp.linear_fc2.weight", "mlp.linear_fc2.bias")
_MODULES = ("input_layernorm", "self_attention", "pre_mlp_layernorm", "mlp", "")
SITES_PER_LAYER = 5 * len(_PARAMETERS) + 2 * len(_MODULES)
_BLOCK = 512  # recorded steps generated and written at once (a multiple of the store's step chunk)


def synthetic_sites(count: int) -> list[SiteInfo]:
    """``count`` sites of a decoder with enough layers, in execution order."""
    layers = max(1, math.ceil(count / SITES_PER_LAYER))

    def module(layer: int, suffix: str) -> str:
        return f"layers.{layer}" + (f".{suffix}" if suffix else "")

    order: list[tuple[str, str, int]] = []
    order += [("param", module(layer, p), layer) for layer in range(layers) for p in _PARAMETERS]
    order += [("act", module(layer, m), layer) for layer in range(layers) for m in _MODULES]
    order += [("act_grad", module(layer, m), layer) for layer in reversed(range(layers)) for m in reversed(_MODULES)]
    for kind in ("grad", "exp_avg", "exp_avg_sq", "update"):
        order += [(kind, module(layer, p), layer) for layer in reversed(range(layers)) for p in _PARAMETERS]
    return [SiteInfo(site=site_id(kind, name), kind=kind, name=name, layer=layer, order=i, shape="[256, 256]",
                     dtype="float32", numel=65536)
            for i, (kind, name, layer) in enumerate(order[:count])]


STEP_SCALARS = {"grad_norm": 1.0, "lr": 1e-3, "loss_scale": 1.0, "step_time": 0.1, "tokens_per_s": 10_000.0,
                "recorder_time": 0.0, "skipped": 0}
"""One synthetic step's scalars but its loss (``synthetic_loss``)."""


def synthetic_loss(steps: int) -> np.ndarray:
    """The loss of each of a synthetic run's ``steps``: from 6 down towards 1."""
    return 5.0 * np.exp(-np.arange(steps) / (steps / 3)) + 1.0


def write_synthetic_run(run_dir: str | Path, *, steps: int = 12, sites: int = 0, seed: int = 0,
                        diverge_at: tuple[int, int] | None = None, initial_difference: float = 1e-7,
                        growth: float = 0.01, name: str | None = None,
                        schema_version: int = layout.SCHEMA_VERSION, written: int | None = None,
                        status: str | None = layout.Status.COMPLETE, producer: str = "synthetic") -> Path:
    """Write one synthetic run store (see the module docstring) in the layout of ``schema_version``; returns its
    folder. ``sites=0``: scalars only. ``written``: only the first ``written`` steps' rows, as a run partway
    through writes them; ``status`` the status it ends with (None: as created). ``producer`` the manifest's: any
    other than ``synthetic`` (``runner``, for a test of what only the runner's runs allow) writes the store as
    that producer would, without the synthetic facts."""
    written = steps if written is None else written
    if steps < 1 or sites < 0 or not 0 <= written <= steps:
        raise ArgumentError(f"need steps >= 1, sites >= 0 and 0 <= written <= steps, got steps={steps}, "
                            f"sites={sites}, written={written}")
    if diverge_at is not None and not (0 <= diverge_at[0] < steps and 0 <= diverge_at[1] < sites):
        raise ArgumentError(f"diverge_at={diverge_at} lies outside {steps} steps x {sites} sites")
    run_dir = Path(run_dir)
    cfg = RunConfig(name=name or run_dir.name, steps=steps, record=RecordConfig(compile=False))
    facts = {"seed": seed, "diverge_at": list(diverge_at) if diverge_at else None,
             "initial_difference": initial_difference, "growth": growth}
    manifest = runner_manifest(cfg, producer=producer, **({"synthetic": facts} if producer == "synthetic" else {}))
    create_store(run_dir, manifest, steps, schema_version=schema_version)
    if sites:
        _write_sites(run_dir, steps, written, synthetic_sites(sites), seed, diverge_at, initial_difference, growth)
    writer = ScalarWriter(run_dir, flush_every=max(written, 1))
    loss = synthetic_loss(steps)
    for step in range(written):
        writer.append(step, {"loss": loss[step], **STEP_SCALARS})
    writer.close()
    if status is not None:
        set_status(run_dir, status)
    return run_dir


def _write_sites(run_dir: Path, steps: int, written: int, site_infos: list[SiteInfo], seed: int,
                 diverge_at: tuple[int, int] | None, initial_difference: float, growth: float) -> None:
    """The sites group, and the rows of the first ``written`` steps."""
    create_sites_group(run_dir, list(range(steps)), site_infos)

    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-3, 1, size=len(site_infos))  # [site] typical magnitude of each tensor
    for start in range(0, written, _BLOCK):
        stop = min(written, start + _BLOCK)
        block_rng = np.random.default_rng([seed, start])  # the same numbers whatever else differs
        shape = (stop - start, len(site_infos))
        fingerprints = block_rng.integers(0, 2**63, size=shape, dtype=np.int64).astype(np.uint64)
        drift = 1.0 + 0.1 * np.sin(np.arange(start, stop) / 500.0)[:, None]  # [step, 1] slow training drift
        values = scale[None, :] * drift * (1.0 + 0.01 * block_rng.standard_normal(shape))  # [step, site]
        if diverge_at is not None:
            differs = _differs(np.arange(start, stop), len(site_infos), diverge_at)
            age = np.maximum(np.arange(start, stop) - diverge_at[0], 0)[:, None]
            relative = np.where(differs, initial_difference * 10.0 ** (growth * age), 0.0)
            values = values * (1.0 + np.minimum(relative, 0.5))
            fingerprints = np.where(differs, fingerprints ^ np.uint64(0x9E3779B97F4A7C15), fingerprints)
        write_site_rows(run_dir, start, _stats(values), fingerprints)


def _differs(step_numbers: np.ndarray, n_sites: int, diverge_at: tuple[int, int]) -> np.ndarray:
    """bool [step, site]: where a run diverging at ``diverge_at`` differs."""
    first_step, first_site = diverge_at
    site_index = np.arange(n_sites)[None, :]
    at_first = (step_numbers[:, None] == first_step) & (site_index >= first_site)
    return at_first | (step_numbers[:, None] > first_step)


def _stats(values: np.ndarray) -> np.ndarray:
    """float64 [step, site, stat] statistics of a tensor of 65,536 elements with RMS ``values``."""
    n = 65536.0
    stats = np.zeros((*values.shape, len(STAT_NAMES)))
    column = {name: i for i, name in enumerate(STAT_NAMES)}
    stats[..., column["count"]] = n
    stats[..., column["sum"]] = values * 0.01 * n
    stats[..., column["sum_sq"]] = values**2 * n
    stats[..., column["min"]] = -4.0 * values
    stats[..., column["max"]] = 4.0 * values
    stats[..., column["absmax"]] = 4.0 * values
    stats[..., column["l2"]] = values * math.sqrt(n)
    return stats
