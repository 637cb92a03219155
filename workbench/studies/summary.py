"""A study folder summarised: its runs, where they differ, the noise floor, whether a change matters
(against the noise floor and the seed-to-seed spread) and the cost of determinism.

Opens every run under a folder as a ``Workspace`` (which also finds the reference and the
noise-floor runs) and hands their records to the analysis functions. ``workbench summary DIR`` and the demo print it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from workbench.analysis.findings import study_findings
from workbench.analysis.ladder import Ladder
from workbench.errors import RunNotFoundError
from workbench.store.reader import Skipped, find_runs, run_table
from workbench.studies.workspace import Workspace


@dataclass(frozen=True)
class StudySummary:
    runs: pd.DataFrame
    reference: str
    findings: list[str]
    floor_runs: list[str]
    ladder: Ladder | None
    """Every other run (precision, layout) against the reference, per layer, with the noise floor."""
    cost: pd.DataFrame
    scales: pd.DataFrame
    """Every other run's final held-out loss against the noise floor and the seed-to-seed spread."""
    scales_step: int | None = None
    sources: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Each nondeterminism source alone against the reference (``Workspace.attribution``); empty if none."""
    on_cpu: bool = False
    verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Bug or rounding: every other run against the reference's band runs (``Workspace.verdicts``); empty without
    band runs."""

    def text(self) -> str:
        lines = [self.runs.drop(columns=["path"]).to_string(index=False, float_format=lambda x: f"{x:.4f}"), "",
                 f"findings (reference {self.reference}):"]
        lines += [f"- {line}" for line in self.findings]
        for table in self.tables():
            lines += ["", f"{table.heading}:", table.frame.to_string(index=table.index, float_format=table.format)]
        return "\n".join(lines)

    def tables(self) -> list[SummaryTable]:
        """The tables beyond the runs and the findings, in reading order: the ladder, the last step by layer,
        whether a change matters, each nondeterminism source and the cost of determinism (those there are)."""
        floor = f"noise floor of {', '.join(self.floor_runs)}" if self.floor_runs else "no noise floor"
        tables = []
        if self.ladder is not None:
            ladder = self.ladder.summary.drop(columns=["identical", "floor_exit_site"]).rename(columns={
                "floor_exit_step": "leaves_floor_at", "floor_exit_layer": "leaves_floor_in",
                "growth": "growth_log10/step", "saturation_step": "saturates_at",
                "plateau": "plateau_rel_l2", "final_error": "final_rel_l2"})
            tables += [SummaryTable(f"precision and layout against {self.reference} ({floor}; statistics sum_sq, "
                                    "min, max)", ladder, _digits(3, "g")),
                       SummaryTable("relative L2 difference at the last step, median over each layer's sites",
                                    self.ladder.final_by_layer(), _digits(2, "e"), index=True)]
        if not self.verdicts.empty:
            tables.append(SummaryTable(
                f"bug or rounding? each change against {self.reference}'s rounding band (band runs x margin; "
                "tolerances: at the first site beyond, or the largest anywhere when within)", self.verdicts,
                _digits(3, "g")))
        if not self.scales.empty:
            tables.append(SummaryTable(
                f"does it matter? held-out validation loss after step {self.scales_step}, the difference from "
                f"{self.reference} against the noise floor and the seed-to-seed spread (ranges)", self.scales,
                _digits(3, "g")))
        if not self.sources.empty:
            sources = self.sources.drop(columns=["run", "floor_exit_site", "plateau"]).rename(columns={
                "where_it_acts": "where_it_acts?", "floor_exit_step": "leaves_floor_at",
                "growth": "growth_log10/step", "saturation_step": "saturates_at", "final_error": "final_rel_l2",
                "cost_percent": "cost_%", "cost_low": "low", "cost_high": "high"})
            tables.append(SummaryTable(
                f"which source matters? each alone against {self.reference} ({floor}); cost: tokens/s lost making it "
                "deterministic, against the runs with every source off (95% bootstrap interval)"
                + (" -- on this CPU a source is the workbench's emulation of it and its cost the emulation's"
                   if self.on_cpu else ""), sources, _digits(3, "g")))
        if not self.cost.empty:
            tables.append(SummaryTable("cost of deterministic mode (tokens/s, recorder excluded; 95% bootstrap "
                                       "interval)", self.cost, _digits(1, "f")))
        return tables


@dataclass(frozen=True)
class SummaryTable:
    """One table of a study's summary, for ``StudySummary.text`` and the report alike."""

    heading: str
    """What the table shows, one sentence in lower case."""
    frame: pd.DataFrame
    format: Callable[[float], str]
    """How its floats are written."""
    index: bool = False
    """Whether its index is a column of its own (the run, by layer)."""


def _digits(count: int, kind: str) -> Callable[[float], str]:
    return lambda x: f"{x:.{count}{kind}}"


def summarise_study(directory: str | Path, on_skip: Skipped | None = None) -> StudySummary:
    """The findings of a folder of runs (what ``workbench summary DIR`` prints): each run's role, the pairs that
    differ and where, the noise floor of the repeats, and what determinism cost. A run that cannot be read is
    handed to ``on_skip`` and left out, if given."""
    if not find_runs(directory, unreadable=True):
        raise RunNotFoundError(f"{directory}: no runs here; create some with `workbench sweep STUDY.toml`")
    return summarise(Workspace.open(directory, on_skip=on_skip))


def summarise(ws: Workspace) -> StudySummary:
    """The summary of the runs of a workspace."""
    records = {name: ws.records(name) for name in ws.recorded}
    reference = ws.roles.reference
    band = set(ws.roles.band_runs)  # judged as a band below, not a finding each
    findings = study_findings({n: r for n, r in records.items() if n not in band}, reference, ws.roles.repeat_groups,
                              comparison=lambda a, b: ws.comparison(a, b, records=records.__getitem__),
                              runtimes={name: run.manifest.runtime for name, run in ws.runs.items()},
                              configs={name: run.manifest.config for name, run in ws.runs.items()
                                       if run.manifest.config is not None}) \
        if reference in records else []
    comparisons = ws.ladder(ws.roles.others) if reference in records and ws.roles.others else None
    step, scales = ws.scales("val_loss")
    roles = ws.roles
    if band:
        findings.append(f"{len(band)} band runs of {reference} (rounding noise added: {', '.join(sorted(band))}) "
                        "make the band the changes are judged against")
    verdicts = ws.verdicts() if reference in records else pd.DataFrame()
    if reference in records and roles.others and not roles.band_runs:
        findings.append(f"bug or rounding: no band runs of {reference} here, so no change is judged against its "
                        "rounding; add a few (a study's run with perturb = \"fp32\" and repeats = 6, or "
                        "record(..., perturb=\"fp32\") in a loop)")
    return StudySummary(runs=run_table(list(ws.runs.values())), reference=reference, findings=findings,
                        floor_runs=ws.roles.floor_runs, ladder=comparisons, cost=ws.cost(), scales=scales,
                        scales_step=step, sources=ws.attribution() if reference in records else pd.DataFrame(),
                        on_cpu=ws.on_cpu, verdicts=verdicts)


def cost_summary(workspaces: list[Workspace]) -> str:
    """The determinism tax per configuration over several studies (``Workspace.cost``), as ``workbench demo``
    prints it after the studies' summaries."""
    cost = pd.concat([ws.cost() for ws in workspaces], ignore_index=True)
    table = cost[["config", "deterministic_tokens_per_s", "default_tokens_per_s", "tax_percent", "ci_low", "ci_high"]]
    on_cpu = any(ws.on_cpu for ws in workspaces)
    return (f"cost of deterministic mode per configuration, {'both' if len(workspaces) == 2 else 'all'} studies "
            "(tokens/s; 95% bootstrap interval"
            + ("; on this CPU the nondeterministic side differs only by the emulated atomics" if on_cpu else "")
            + "):\n" + table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
