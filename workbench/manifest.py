"""The run manifest: what a run was, where, with what, and how it ended.

Built by the launcher before any rank starts (config, layout, precision, determinism
switches, library versions, host, git revision) and completed by rank 0 with what only
a running rank knows (device, CUDA and NCCL versions, emulated nondeterminism). Stored
as the run group's attributes. Imports no torch.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

from workbench import determinism
from workbench.config import RunConfig
from workbench.store.layout import Status
from workbench.store.manifest import RUNNER, ModelSignature, ParallelLayout, RunManifest, manifest_fields
from workbench.store.writer import now

_PACKAGES = ("workbench", "torch", "megatron-core", "transformer-engine", "zarr", "numpy", "xarray", "pandas")


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_revision(directory: Path | None = None) -> str | None:
    """The revision of the project checkout (with ``-dirty`` if it has changes), or None."""
    directory = directory or Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=directory,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("-dirty" if dirty else "")


def new_manifest(cfg: RunConfig, *, resumed: bool = False) -> dict[str, Any]:
    """The runner's manifest of ``cfg``: the typed fields every reader reads, and the config itself."""
    m = cfg.model
    info = RunManifest(
        run_id=f"{cfg.name}-{uuid.uuid4().hex[:8]}", name=cfg.name, producer=RUNNER,
        model=ModelSignature(num_layers=m.num_layers, hidden_size=m.hidden_size,
                             num_attention_heads=m.num_attention_heads, vocab_size=m.vocab_size,
                             seq_length=m.seq_length, num_experts=m.num_experts or None,
                             moe_topk=m.moe_topk if m.is_moe else None),
        layout=ParallelLayout(tp=cfg.layout.tp, pp=cfg.layout.pp, dp=cfg.layout.dp, ep=cfg.layout.ep,
                              sp=cfg.layout.sp, vp=cfg.layout.vp if cfg.layout.vp > 1 else None),
        precision=cfg.precision.value,
        deterministic=cfg.deterministic, seed=cfg.seed, determinism=determinism.describe(cfg.deterministic),
        config=cfg.to_dict())
    return {
        **manifest_fields(info),
        "config_hash": cfg.numerics_hash(),
        "fault": cfg.fault.describe(),
        "versions": library_versions(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "git_revision": git_revision(),
        "launcher": {"pid": os.getpid(), "host": socket.gethostname()},
        "started_at": now(),
        "status": Status.CREATED,
        "resumes": [],
    }
