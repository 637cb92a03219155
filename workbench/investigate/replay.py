"""Replay: rerun a run's own config from its nearest checkpoint before step K, recording everything.

    result = replay("data/runs/demo/fault", step=30)          # -> data/runs/demo/fault/replays/step_000030
    print(result.check.summary())                              # reproduced bitwise, or where it departs

The replay is a new run store (inside the original's folder unless ``out`` says otherwise)
with the original's config, except what it records: every kind of site, every site, every
step from the checkpoint through K, and full-tensor snapshots of every site at step K. It
starts from the original's last complete checkpoint at or before K (a copy of it, so the
replay folder stands alone), or from step 0 when there is none: initialisation is a
function of the seed and the data a function of the step, so step 0 is a checkpoint too.
Its manifest says what it replays (``replay``). With ``trace`` step K also runs under the
operation tracer (``workbench bisect`` uses that).

Imports no torch: training happens in the launched worker processes.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import disk
from workbench.analysis.replay_check import ReplayCheck, replay_check
from workbench.config import RunConfig
from workbench.errors import ArgumentError
from workbench.runner.launch import ProgressFn, launch
from workbench.sites import PARAMETER_KINDS, SITE_KINDS
from workbench.store import layout
from workbench.store.manifest import runner_manifest
from workbench.store.reader import Run, open_run
from workbench.store.writer import create_store, update_manifest
from workbench.store.writer_lock import LOCK_FILE, writing
from workbench.untrusted import check_checkpoint_folder


@dataclass(frozen=True)
class Replay:
    original: Path
    run_dir: Path
    step: int
    from_step: int
    """The checkpoint the replay started from (0: the initialisation)."""
    from_checkpoint: bool
    seconds: float
    """Wall time of the replay, from the checkpoint through step K with full recording."""
    check: ReplayCheck

    def summary(self) -> str:
        start = f"checkpoint at step {self.from_step}" if self.from_checkpoint else "step 0 (initialisation)"
        return (f"replayed {self.original.name} from {start} through step {self.step} in {self.seconds:.1f} s "
                f"into {self.run_dir}\n{self.check.summary()}")

    def to_dict(self) -> dict[str, Any]:
        return {"original": str(self.original), "run_dir": str(self.run_dir), "step": self.step,
                "from_step": self.from_step, "from_checkpoint": self.from_checkpoint, "seconds": self.seconds,
                "check": self.check.to_dict()}


def nearest_checkpoint(run: Run, step: int) -> int | None:
    """The last complete checkpoint at or before ``step`` (the state before that step), or None."""
    steps = [s for s in run.paths.checkpoint_steps() if s <= step]
    return steps[-1] if steps else None


def replay_config(cfg: RunConfig, *, step: int, from_step: int) -> RunConfig:
    """``cfg`` recording every site on steps [from_step, step], with snapshots of every site at ``step`` (under
    the distributed optimizer of every site but the parameter-sized ones, which the recorder cannot yet
    snapshot from its uneven shards)."""
    snapshots = [f"{kind}:*" for kind in SITE_KINDS if kind not in PARAMETER_KINDS] \
        if cfg.optim.use_distributed_optimizer else ["*"]
    return cfg.with_overrides({
        "name": f"{cfg.name}-replay-{step}",
        "record.enabled": True, "record.kinds": list(SITE_KINDS), "record.sites": ["*"], "record.every": 1,
        "record.ranges": [[from_step, step + 1]], "record.snapshot_steps": [step], "record.snapshot_sites": snapshots,
        "checkpoint_every": 0,
    }, source="replay")


def default_replay_dir(run: Run, step: int) -> Path:
    return run.path / "replays" / f"step_{step:06d}"


def _check_replay_place(run_dir: Path, original: Run) -> None:
    """Refuse a folder that is the original run's or one around it, or a file."""
    target, source = run_dir.resolve(), original.path.resolve()
    if target == source or target in source.parents:
        raise ArgumentError(f"{run_dir}: a replay cannot be written over or around the run it replays "
                          f"({original.path}); choose another --out")
    if run_dir.exists() and not run_dir.is_dir():
        raise ArgumentError(f"{run_dir} is a file; --out names the replay's folder")


def _check_replay_folder(run_dir: Path, original: Run, *, overwrite: bool) -> None:
    """Refuse a folder that holds anything but an earlier replay; remove an earlier replay if asked (the
    folder's lock, held by this replay, stays)."""
    if not run_dir.exists() or not any(p.name != LOCK_FILE for p in run_dir.iterdir()):
        return
    existing = layout.resolve_run_dir(run_dir)
    if existing is None or open_run(existing).manifest.replay is None:
        raise ArgumentError(f"{run_dir} exists and is not a replay; choose another --out (a replay never "
                          "overwrites anything else)")
    if not overwrite:
        raise ArgumentError(f"{run_dir} already holds a replay; pass --overwrite to replace it or --out to "
                          "choose another folder")
    layout.clear_run_folder(run_dir)


def replay(run_path: str | Path, step: int, *, out: str | Path | None = None, trace: bool = False,
           overwrite: bool = False, progress: ProgressFn | None = None) -> Replay:
    """Replay the run at ``run_path`` through ``step`` and check it against the original."""
    original = open_run(run_path)
    for key, what in (("replay", "itself a replay"), ("imported", "an imported run"),
                      ("synthetic", "a synthetic run")):
        if original.attrs.get(key):
            raise ArgumentError(f"{original.path} is {what}; only a run trained by the workbench can be replayed")
    cfg = original.config  # ForeignRunError for a run another producer made
    if not isinstance(step, int) or not 0 <= step < cfg.steps:
        raise ArgumentError(f"--step {step!r} is not a step of {original.name}: it trains steps 0..{cfg.steps - 1}")
    if step >= original.steps_completed:
        raise ArgumentError(f"{original.name} has not completed step {step} (it wrote steps "
                          f"0..{original.steps_completed - 1}, status {original.status}); nothing to compare with")
    checkpoint = nearest_checkpoint(original, step)
    if checkpoint is not None:  # a file that would run code, or a damaged one: refused before anything is made
        layout.checkpoint_meta(original.paths.checkpoint(checkpoint))
        check_checkpoint_folder(original.paths.checkpoint(checkpoint))
    from_step = checkpoint if checkpoint is not None else 0
    run_dir = Path(out) if out is not None else default_replay_dir(original, step)
    _check_replay_place(run_dir, original)
    with writing(run_dir, writer="workbench replay"):  # held through the launch, which takes it again
        _check_replay_folder(run_dir, original, overwrite=overwrite)
        replay_cfg = replay_config(cfg, step=step, from_step=from_step)
        paths = layout.RunPaths(run_dir)
        if checkpoint is not None:
            try:
                create_store(run_dir, runner_manifest(replay_cfg), replay_cfg.steps)
                shutil.copytree(original.paths.checkpoint(checkpoint), paths.checkpoint(checkpoint))
            except OSError as err:  # a full disk before any rank starts: what was begun goes
                layout.clear_run_folder(run_dir)
                raise disk.no_room(err, run_dir) if disk.is_no_room(err) else err from None
        # The manifest says "replay" before any rank starts, so a replay that fails is never taken for a run.
        facts = {"of": str(original.path), "of_run_id": original.run_id, "step": step, "from_step": from_step,
                 "from_checkpoint": checkpoint is not None, "traced": trace}
        started = time.perf_counter()
        launch(replay_cfg, run_dir, resume=checkpoint is not None, stop_after=step + 1, progress=progress,
               trace_step=step if trace else None, manifest={"replay": facts})
        seconds = time.perf_counter() - started
        update_manifest(run_dir, replay={**facts, "seconds": seconds})
    return Replay(original=original.path, run_dir=run_dir, step=step, from_step=from_step,
                  from_checkpoint=checkpoint is not None, seconds=seconds,
                  check=_checked(original, open_run(run_dir), from_step=from_step, step=step))


def _checked(original: Run, replayed: Run, *, from_step: int, step: int) -> ReplayCheck:
    """``analysis.replay_check`` of the two runs' records and scalars: an original without site records is compared
    by its scalars alone."""
    return replay_check(original.records_or_none(), replayed.records_or_none(), original.scalars, replayed.scalars,
                        from_step=from_step, to_step=step, deterministic=original.config.deterministic)
