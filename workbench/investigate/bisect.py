"""Bisect two runs from step to site to operation, and write the answer into a small report.

    result = bisect("data/runs/demo/det-r0", "data/runs/demo/fault")
    print(result.summary())       # step 33 -> act:layers.2.mlp -> forward copy_ in layers.2.mlp at faults.py:53

1. **Step and site** from the stores: the first step at which a fingerprint differs, and
   the first site in execution order (``analysis.compare``).
2. **Operation**: both runs are replayed from their nearest checkpoint before that step
   with the step under the operation tracer, and ``analysis.trace_alignment.first_operation``
   names the first operation whose inputs are equal and whose outputs differ (or the
   one-run-only operation that made the first difference), with its module path and
   source line.

The replays and the report (``bisect.json``, ``bisect.md`` and, when operations were traced,
``operations.html``: the operation figure, plotly.js inline) go into ``out``. Pipeline-
parallel runs stop at step and site: their operation order across stages is not traced; so do
expert-parallel runs, whose ranks run different experts.
Imports no torch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import disk
from workbench.analysis.compare import compare
from workbench.analysis.trace_alignment import OperationOrigin, first_operation
from workbench.errors import ArgumentError
from workbench.investigate.replay import Replay, replay
from workbench.names import inside
from workbench.runner.launch import ProgressFn
from workbench.store.reader import Run, open_run
from workbench.store.writer_lock import writing


@dataclass(frozen=True)
class Bisect:
    a: str
    b: str
    step: int | None
    """The bisected step: the first divergent one, or the one asked for."""
    site: str | None
    """The first differing site at that step (execution order)."""
    origin_sites: list[str]
    operation: OperationOrigin | None
    skipped: str | None
    """Why the operation level was not run (identical runs, pipeline parallelism)."""
    replays: list[Replay]
    seconds: float
    out: Path
    note: str | None = None
    """Set when the replays found an earlier first step than the stores (which skipped steps)."""

    def summary(self) -> str:
        if self.step is None:
            return f"{self.a} and {self.b} are bitwise identical at every common step: nothing to bisect"
        lines = [f"bisect {self.a} vs {self.b}",
                 f"  step:      {self.step} (first step whose fingerprints differ)"
                 + (f"; {self.note}" if self.note else ""),
                 f"  site:      {self.site} (first in execution order; origin sites: "
                 f"{', '.join(self.origin_sites) or 'none'})"]
        if self.operation is not None:
            lines.append(f"  operation: {self.operation.summary()}")
        else:
            lines.append(f"  operation: not traced: {self.skipped}")
        for r in self.replays:
            verdict = ("reproduced it bitwise" if r.check.reproduced else
                       f"departed from it: first differs at step {r.check.first_step}, {r.check.first_site}")
            lines.append(f"  replay of {r.original.name} from its step-{r.from_step} checkpoint: {verdict} "
                         f"({r.seconds:.1f} s)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "step": self.step, "site": self.site, "origin_sites": self.origin_sites,
                "operation": self.operation.to_dict() if self.operation is not None else None,
                "skipped": self.skipped, "note": self.note, "replays": [r.to_dict() for r in self.replays],
                "seconds": self.seconds}


def default_bisect_dir(a: Run, b: Run) -> Path:
    """Inside the reference's run folder, beside its replays: derived runs are never among the runs."""
    return a.path / "bisect" / f"{a.name}-vs-{b.name}"


def bisect(a_path: str | Path, b_path: str | Path, *, step: int | None = None, out: str | Path | None = None,
           overwrite: bool = False, progress: ProgressFn | None = None) -> Bisect:
    """Step, site and operation at which runs ``a`` and ``b`` first differ (see the module docstring)."""
    started = time.perf_counter()
    a, b = open_run(a_path), open_run(b_path)
    if a.path.resolve() == b.path.resolve():
        raise ArgumentError(f"{a.path} is given twice; bisect needs two different runs")
    result = compare(a.records(), b.records())
    if step is None:
        step = result.first_step
    elif step not in result.common_steps:
        raise ArgumentError(f"--step {step} is not a step both runs recorded "
                          f"({result.common_steps[0]}..{result.common_steps[-1]})")
    out_dir = Path(out) if out is not None else default_bisect_dir(a, b)
    # one bisect of a pair at a time: its folder holds both replays and the verdict (each replay's own run
    # folder is locked by the replay)
    with writing(out_dir, writer="workbench bisect"):
        if step is None:
            return _finish(Bisect(a=a.name, b=b.name, step=None, site=None, origin_sites=[], operation=None,
                                  skipped="the runs are identical", replays=[], seconds=time.perf_counter() - started,
                                  out=out_dir))
        first = result.first_difference([step])
        site = None if first is None else first.site
        origins = result.origin_sites if step == result.first_step else []
        skipped = None
        if a.manifest.layout.pp > 1 or b.manifest.layout.pp > 1:
            skipped = "operation tracing supports PP = 1 only (stages run their operations in different processes)"
        elif a.manifest.layout.ep > 1 or b.manifest.layout.ep > 1:
            skipped = ("operation tracing supports EP = 1 only: the expert-parallel ranks run different experts' "
                       "operations, and the trace of one rank does not hold the others'")
        replays: list[Replay] = []
        operation = None
        note = None
        if skipped is None:
            replays = _traced_replays(a, b, step, out_dir, overwrite=overwrite, progress=progress)
            if not set(range(step)) <= set(result.common_steps):
                # The stores skipped steps before this one; the replays recorded every step from their
                # checkpoints, so they can tell whether the runs parted earlier.
                earlier = compare(open_run(replays[0].run_dir).records(), open_run(replays[1].run_dir).records())
                if earlier.first_step is not None and earlier.first_step < step:
                    note = (f"the stores first differ at recorded step {step}; the replays, which record every step, "
                            f"first differ at step {earlier.first_step}")
                    step, site, origins = earlier.first_step, earlier.first_site, earlier.origin_sites
                    replays = _traced_replays(a, b, step, out_dir, overwrite=True, progress=progress)
            operation = first_operation(open_run(replays[0].run_dir).op_trace(step),
                                        open_run(replays[1].run_dir).op_trace(step))
        return _finish(Bisect(a=a.name, b=b.name, step=step, site=site, origin_sites=origins, operation=operation,
                              skipped=skipped, replays=replays, seconds=time.perf_counter() - started, out=out_dir,
                              note=note))


def _traced_replays(a: Run, b: Run, step: int, out_dir: Path, *, overwrite: bool,
                    progress: ProgressFn | None) -> list[Replay]:
    replays = []
    for run, name in zip((a, b), (a.name, b.name if b.name != a.name else f"{b.name}-b")):
        if progress:
            progress(f"replaying {run.name} through step {step} with the operation tracer")
        folder = inside(out_dir, out_dir / name, "replay folder")  # a name from a manifest: never a path
        replays.append(replay(run.path, step, out=folder, trace=True, overwrite=overwrite, progress=progress))
    return replays


def _finish(result: Bisect) -> Bisect:
    files = {"bisect.json": json.dumps(result.to_dict(), indent=1)}
    text = f"# Bisect\n\n```\n{result.summary()}\n```\n"
    if result.operation is not None:
        from workbench.figures.operations import operation_figure

        title = f"{result.a} vs {result.b}: operations of step {result.step}"
        files["operations.html"] = operation_figure(result.operation, title=title).to_html(include_plotlyjs=True)
        text += "\nThe operations of the step, in order, by module: `operations.html`.\n"
    files["bisect.md"] = text
    for name, content in files.items():  # each whole or not at all: a full disk leaves no empty file
        data = content.encode("utf-8")
        with disk.written(result.out / name, needed=len(data)) as partial:
            partial.write_bytes(data)
    return result
