"""A study folder summarised: its runs, where they differ, the noise floor and the cost of determinism.

Opens every run under a folder (I/O lives here, not in ``workbench.analysis``) and hands
their records to the analysis functions. ``workbench study DIR`` and the demo print it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.analysis.cost import ThroughputSample, determinism_cost
from workbench.analysis.findings import study_findings
from workbench.analysis.growth import noise_floor
from workbench.analysis.ladder import Ladder, ladder
from workbench.config import RunConfig
from workbench.errors import NoSitesError, RunNotFoundError
from workbench.store.reader import Run, find_runs, list_runs, open_run

_REPEAT = re.compile(r"^(?P<base>.+)-r\d+$")


@dataclass(frozen=True)
class StudySummary:
    runs: pd.DataFrame
    reference: str
    findings: list[str]
    floor_runs: list[str]
    ladder: Ladder | None
    """Every other run (precision, layout) against the reference, per layer, with the noise floor."""
    cost: pd.DataFrame

    def text(self) -> str:
        lines = [self.runs.drop(columns=["path"]).to_string(index=False, float_format=lambda x: f"{x:.4f}"), "",
                 f"findings (reference {self.reference}):"]
        lines += [f"- {line}" for line in self.findings]
        if self.ladder is not None:
            floor = f"noise floor of {', '.join(self.floor_runs)}" if self.floor_runs else "no noise floor"
            table = self.ladder.summary.drop(columns=["identical", "floor_exit_site"]).rename(columns={
                "floor_exit_step": "leaves_floor_at", "floor_exit_layer": "leaves_floor_in",
                "growth": "growth_log10/step", "final_error": "final_rel_l2"})
            lines += ["", f"precision and layout against {self.reference} ({floor}; statistics sum_sq, min, max):",
                      table.to_string(index=False, float_format=lambda x: f"{x:.3g}"), "",
                      "relative L2 difference at the last step, median over each layer's sites:",
                      self.ladder.final_by_layer().to_string(float_format=lambda x: f"{x:.2e}")]
        if not self.cost.empty:
            lines += ["", "cost of deterministic mode (tokens/s, recorder excluded; 95% bootstrap interval):",
                      self.cost.to_string(index=False, float_format=lambda x: f"{x:.1f}")]
        return "\n".join(lines)


def configuration(cfg: RunConfig) -> str:
    """A configuration apart from its determinism switch and name."""
    m = cfg.model
    return f"L{m.num_layers} H{m.hidden_size} {cfg.layout.summary()} {cfg.precision.value}"


def _reference(runs: dict[str, Run]) -> str:
    if "det-r0" in runs:
        return "det-r0"
    plain = [n for n, r in runs.items() if r.config.deterministic and r.config.layout.world_size == 1
             and r.config.precision.value == "fp32"]
    return plain[0] if plain else next(iter(runs))


def summarise_study(directory: str | Path) -> StudySummary:
    folders = find_runs(directory)
    if not folders:
        raise RunNotFoundError(f"{directory}: no runs here; create some with `workbench sweep STUDY.toml`")
    runs = {folder.name: open_run(folder) for folder in folders}
    records = {}
    for name, run in runs.items():
        try:
            records[name] = run.records()
        except NoSitesError:
            continue
    reference = _reference(runs)
    findings = study_findings(records, reference) if reference in records else []
    repeats: dict[str, list[str]] = {}
    for name in records:
        match = _REPEAT.match(name)
        if match and not runs[name].config.deterministic:
            repeats.setdefault(match["base"], []).append(name)
    floor_runs = max(repeats.values(), key=len, default=[])
    # The reference is one more sample of the same computation when only determinism differs.
    if floor_runs and reference in records and \
            configuration(runs[reference].config) == configuration(runs[floor_runs[0]].config):
        floor_runs = [reference, *floor_runs]
    floor = noise_floor([records[n] for n in floor_runs]) if len(floor_runs) >= 2 else None
    others = [rec for name, rec in records.items()
              if name != reference and name not in floor_runs and not _REPEAT.match(name) and not rec.resumes]
    comparisons = ladder(records[reference], others, floor=floor) if reference in records and others else None
    samples = [ThroughputSample(configuration(run.config), run.config.deterministic,
                                run.scalars.tokens_per_s.to_numpy()) for run in runs.values()]
    return StudySummary(runs=list_runs(directory), reference=reference, findings=findings,
                        floor_runs=floor_runs if floor is not None else [], ladder=comparisons,
                        cost=determinism_cost(samples))
