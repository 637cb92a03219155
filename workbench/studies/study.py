"""Studies: a matrix of run configs (and explicit runs) expanded from one TOML file.

    name = "layouts"
    base = "tiny.toml"               # a run config, relative to this file
    repeats = 2                      # every run twice (same seed: repeats of one config)

    [overrides]                      # dotted config keys changed in the base for every run
    "model.num_layers" = 2

    [matrix]                         # cartesian product of dotted config keys
    precision = ["fp32", "bf16"]
    "layout.tp" = [1, 2]

    [[runs]]                         # explicit runs: a name, overrides, optional resume
    name = "resumed"
    resume_at = 20                   # run to step 20, stop, resume from the checkpoint
    repeats = 1

    [[runs]]
    name = "tp1-from-tp2"
    start_from = { run = "tp2", step = 10 }   # another (earlier) run's checkpoint, at this run's layout

``expand_study`` is pure; ``run_study`` launches each planned run in turn, skipping runs
whose store is already complete with the same config.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.config import RunConfig, flatten, load_run_config, read_toml
from workbench.errors import ConfigError, NotARunError, RunNotFoundError, UnsupportedError
from workbench.names import check_name, inside
from workbench.store import layout
from workbench.store.layout import Status
from workbench.store.writer_lock import writing


@dataclass(frozen=True, kw_only=True)
class PlannedRun:
    config: RunConfig
    resume_at: int | None = None
    """Stop after this many steps, then resume from the last checkpoint (a resume study)."""
    start_from: tuple[str, int] | None = None
    """(run, step): start from that earlier run's checkpoint at this run's layout (``launch(start_from=)``)."""

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(frozen=True, kw_only=True)
class Study:
    name: str
    runs: tuple[PlannedRun, ...]


_STUDY_KEYS = {"name", "base", "overrides", "repeats", "matrix", "runs"}
_RUN_KEYS = {"name", "repeats", "resume_at", "start_from"}


def _label(key: str, value: Any) -> str:
    leaf = key.rsplit(".", 1)[-1]
    if key == "deterministic":
        return "det" if value else "nondet"
    if isinstance(value, bool):
        return leaf if value else f"no{leaf}"
    if isinstance(value, str):
        return value
    return f"{leaf}{value}"


def _repeat_names(name: str, repeats: int) -> Iterator[str]:
    if repeats == 1:
        yield name
    else:
        yield from (f"{name}-r{i}" for i in range(repeats))


def _positive_int(value: Any, field: str, source: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{source}: {field} = {value!r} is not allowed: a whole number >= 1")
    return value


def _start_from(value: Any, earlier: list[PlannedRun], where: str) -> tuple[str, int] | None:
    """A run's ``start_from = { run = NAME, step = K }``: an earlier run of the study with a checkpoint at K."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != {"run", "step"}:
        raise ConfigError(f"{where}: start_from = {value!r} is not allowed: a table {{ run = NAME, step = K }}")
    source = next((p for p in earlier if p.name == value["run"]), None)
    if source is None:
        raise ConfigError(f"{where}: start_from.run = {value['run']!r} names no earlier run of the study")
    step = _positive_int(value["step"], "start_from.step", where)
    every = source.config.checkpoint_every
    if not every or step % every or step >= source.config.steps:
        raise ConfigError(f"{where}: start_from.step = {step}: {source.name} saves no checkpoint there "
                          f"(checkpoint_every = {every}, steps = {source.config.steps})")
    return source.name, step


def expand_study(data: Mapping[str, Any], base: RunConfig, *, source: str = "study") -> Study:
    unknown = sorted(set(data) - _STUDY_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown field {unknown[0]!r}; allowed: {', '.join(sorted(_STUDY_KEYS))}")
    name = check_name(data.get("name", base.name), "name", source)
    overrides_all = data.get("overrides", {})
    if not isinstance(overrides_all, Mapping):
        raise ConfigError(f"{source}: overrides must be a table of config keys and values")
    base = base.with_overrides(flatten(overrides_all), source=f"{source} overrides")
    repeats = _positive_int(data.get("repeats", 1), "repeats", source)
    planned: list[PlannedRun] = []
    matrix = flatten(data.get("matrix", {}))
    for key, values in matrix.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{source}: matrix.{key} must be a non-empty list of values")
    if matrix:
        keys = list(matrix)
        for combo in itertools.product(*(matrix[k] for k in keys)):
            overrides = dict(zip(keys, combo))
            label = "-".join(_label(k, v) for k, v in overrides.items())
            for run_name in _repeat_names(label, repeats):
                cfg = base.with_overrides({**overrides, "name": run_name}, source=f"{source} matrix")
                planned.append(PlannedRun(config=cfg))
    for i, entry in enumerate(data.get("runs", [])):
        where = f"{source} runs[{i}]"
        if "name" not in entry:
            raise ConfigError(f"{where}: every run needs a name")
        overrides = {k: v for k, v in flatten(entry).items() if k.split(".")[0] not in _RUN_KEYS}
        resume_at = entry.get("resume_at")
        for run_name in _repeat_names(entry["name"], _positive_int(entry.get("repeats", repeats), "repeats", where)):
            cfg = base.with_overrides({**overrides, "name": run_name}, source=where)
            if resume_at is not None:
                _positive_int(resume_at, "resume_at", where)
                if not cfg.checkpoint_every or resume_at >= cfg.steps:
                    raise ConfigError(f"{where}: resume_at = {resume_at} needs checkpoint_every > 0 and "
                                      f"resume_at < steps ({cfg.steps})")
            planned.append(PlannedRun(config=cfg, resume_at=resume_at,
                                      start_from=_start_from(entry.get("start_from"), planned, where)))
    names = [p.name for p in planned]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{source}: run name {duplicates[0]!r} is used twice; give each run its own name")
    if not planned:
        raise ConfigError(f"{source}: the study plans no runs; add a [matrix] table or [[runs]] entries")
    return Study(name=name, runs=tuple(planned))


def load_study(path: str | os.PathLike[str]) -> Study:
    path = Path(path)
    data = read_toml(path)
    if "base" not in data:
        raise ConfigError(f"{path}: a study needs base = \"RUN_CONFIG.toml\" (relative to the study file)")
    base = load_run_config(path.parent / data["base"])
    return expand_study(data, base, source=str(path))


def is_complete(run_dir: Path, cfg: RunConfig) -> bool:
    """True when ``run_dir`` already holds a complete run of exactly this config."""
    from workbench.store.reader import open_run

    try:
        run = open_run(run_dir)
    except (RunNotFoundError, NotARunError):
        return False
    return (run.status == Status.COMPLETE and run.manifest.config_hash == cfg.numerics_hash()
            and run.steps_completed == cfg.steps)


Reporter = Callable[[int, int, PlannedRun, str], None]
"""(index, total, run, message) -> None: how a study reports progress."""


def run_study(study: Study, out_dir: str | os.PathLike[str], report: Reporter) -> list[Path]:
    """Launch every planned run of ``study`` into ``out_dir/<run name>``; return the run folders."""
    from workbench.determinism import emulation_conflicts
    from workbench.runner.launch import _has_gpu

    if not _has_gpu():  # every emulation this study needs must run, or none of its runs starts
        refused = [f"{planned.name}: {line}" for planned in study.runs for line in emulation_conflicts(planned.config)]
        if refused:
            raise UnsupportedError(f"study {study.name} cannot run on this CPU: {refused[0]}"
                                   + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""))
    out = Path(out_dir)
    folders = []
    total = len(study.runs)
    # One sweep per study folder, refused before it launches anything; each run's own lock is held from its
    # completeness check through a stop and its resume, so no writer comes in between.
    with writing(out, writer=f"workbench sweep ({study.name})"):
        for index, planned in enumerate(study.runs, start=1):
            run_dir = inside(out, out / planned.name, "run folder")
            folders.append(run_dir)
            with writing(run_dir, writer=f"workbench sweep ({study.name})"):
                _run_planned(planned, run_dir, out, functools.partial(report, index, total, planned))
    return folders


def _run_planned(planned: PlannedRun, run_dir: Path, out: Path, report: Callable[[str], None]) -> None:
    """One planned run of a study into ``run_dir``: skipped if complete, else launched (and resumed)."""
    from workbench.runner.launch import launch

    if is_complete(run_dir, planned.config):
        report("already complete, skipped")
        return
    if planned.start_from is not None:
        name, step = planned.start_from
        launch(planned.config, run_dir, overwrite=True, progress=report,
               start_from=layout.RunPaths(out / name).checkpoint(step))
    elif planned.resume_at is None:
        launch(planned.config, run_dir, overwrite=True, progress=report)
    else:
        launch(planned.config, run_dir, overwrite=True, stop_after=planned.resume_at, progress=report)
        report(f"stopped after step {planned.resume_at}; resuming from checkpoint")
        launch(planned.config, run_dir, resume=True, progress=report)
    report("complete")
