"""Each nondeterminism source alone: its first difference is where it acts, and nowhere earlier; all of
them off is a deterministic run, bit for bit; the manifest lists exactly the sources that were on."""

from __future__ import annotations

import fnmatch

import numpy as np
import pytest

from tests.helpers.training import Runs
from workbench.analysis.compare import compare
from workbench.determinism import SOURCES, sources_on
from workbench.store.reader import open_run

ALL_OFF = {f"nondeterminism.{name}": False for name in SOURCES}
DP3 = {"layout.dp": 3, "global_batch_size": 12, "eval.samples": 12}


def _alone(runs: Runs, source: str, **layout: object) -> object:
    suffix = "-dp3" if layout else ""
    return runs.get(f"source-{source}{suffix}", deterministic=False,
                    **{**ALL_OFF, f"nondeterminism.{source}": True, **layout})


def test_every_source_off_is_bitwise_a_deterministic_run(runs: Runs) -> None:
    off = open_run(runs.get("sources-off", deterministic=False, **ALL_OFF))
    assert compare(open_run(runs.get("base")).records(), off.records()).identical
    assert sources_on(off.attrs["determinism"]) == [] and off.attrs["determinism"]["deterministic"] is False


@pytest.mark.parametrize("source", ["embedding_atomics", "splitk_gemm", "attention_backward"])
def test_a_source_alone_first_changes_the_bits_where_it_acts(runs: Runs, source: str) -> None:
    run = open_run(_alone(runs, source))  # type: ignore[arg-type]
    result = compare(open_run(runs.get("base")).records(), run.records())
    assert result.first_step == 0  # every step runs the source; nothing before it differs
    assert any(fnmatch.fnmatchcase(str(result.first_site), p) for p in SOURCES[source].acts_at), result.first_site
    assert sources_on(run.attrs["determinism"]) == [source]
    assert len(run.attrs["determinism"]["emulated_nondeterminism"]) == 1


def test_the_data_parallel_association_needs_three_ranks_and_changes_the_reduced_gradients(runs: Runs) -> None:
    off = open_run(runs.get("sources-off-dp3", deterministic=False, **ALL_OFF, **DP3))
    run = open_run(_alone(runs, "dp_allreduce", **DP3))  # type: ignore[arg-type]
    result = compare(off.records(), run.records())
    assert result.first_step == 0 and str(result.first_site).startswith("grad:"), result.first_site
    assert sources_on(run.attrs["determinism"]) == ["dp_allreduce"]
    # every activation of step 0 precedes the reduction: none of them differs
    assert not any(result.frontier.get(site) == 0 for site in result.common_sites if site.startswith("act:"))


def test_the_study_attributes_each_difference_to_its_source(runs: Runs) -> None:
    from workbench.studies.summary import summarise
    from workbench.studies.workspace import Workspace

    alone = ["embedding_atomics", "attention_backward", "splitk_gemm"]  # the registry's order
    ws = Workspace.open(runs.get("base"), runs.get("sources-off", deterministic=False, **ALL_OFF),
                        *(_alone(runs, s) for s in alone))  # type: ignore[arg-type]
    roles = ws.roles
    assert roles.reference == "base" and set(roles.all_off_runs) == {"base", "sources-off"} and roles.others == []
    table = ws.attribution()
    assert table["source"].tolist() == alone
    assert table["where_it_acts"].tolist() == [True, True, True]
    assert table["first_step"].tolist() == [0, 0, 0] and np.isfinite(table["cost_percent"]).all()
    text = summarise(ws).text()
    assert "which source matters?" in text and "the workbench's emulation" in text
    assert "nondet[splitk_gemm]" in text and "nondet[all off]" in text  # the run table names the sources
    from workbench.studies.report import report_figures

    figure = report_figures(ws)["sources"]  # the report draws it too
    assert [row.split("<br>")[0] for row in figure.data[0].y] == [f"<b>{s}</b>" for s in alone]
