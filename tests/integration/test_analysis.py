"""compare and check on real CPU runs from the runner."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.training import LAYOUTS, Runs
from workbench.analysis import compare, golden_check
from workbench.store.reader import open_run


def test_deterministic_pair_is_identical_nondeterministic_pair_diverges_tp2_diverges(runs: Runs) -> None:
    base = open_run(runs.get("base")).records()
    assert compare(base, open_run(runs.get("base-repeat")).records()).identical
    nondet = compare(open_run(runs.get("nondet-a", deterministic=False)).records(),
                     open_run(runs.get("nondet-b", deterministic=False)).records())
    assert (nondet.first_step, nondet.first_site) == (0, "grad:embedding.word_embeddings.weight")
    assert nondet.origin_sites[0] == "grad:embedding.word_embeddings.weight"
    tp = compare(base, open_run(runs.get("tp2", **LAYOUTS["tp2"])).records())
    assert (tp.first_step, tp.first_site) == (0, "act:layers.0.self_attention")
    assert tp.origin_sites == ["act:layers.0.self_attention"]


def test_cli_compare_json_and_check_exit_codes(runs: Runs) -> None:
    def workbench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                              timeout=300)

    base, repeat = runs.get("base"), runs.get("base-repeat")
    nondet_a, nondet_b = runs.get("nondet-a", deterministic=False), runs.get("nondet-b", deterministic=False)
    result = json.loads(workbench("compare", str(nondet_a), str(nondet_b), "--json").stdout)
    assert result["identical"] is False and result["first_step"] == 0
    assert result["first_site"] == "grad:embedding.word_embeddings.weight"
    assert isinstance(result["origin_sites"], list) and result["common_steps"] == [0, 1, 2, 3]
    assert len(result["common_sites"]) > 100
    assert workbench("check", str(repeat), "--golden", str(base)).returncode == 0
    failing = workbench("check", str(nondet_b), "--golden", str(nondet_a), "--steps", "2")
    assert failing.returncode == 1 and "FAILED" in failing.stdout and "grad:embedding" in failing.stdout
    missing = workbench("compare", str(base), str(base.parent / "absent"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_golden_check_within_tolerance_on_a_layout_change(runs: Runs) -> None:
    base = open_run(runs.get("base")).records()
    dp = open_run(runs.get("dp2", **LAYOUTS["dp2"])).records()
    assert not golden_check(dp, base).passed          # not bitwise
    assert golden_check(dp, base, steps=1, rtol=1e-3).passed  # but within 1e-3 at step 0


def test_study_summary_of_a_folder_of_real_runs(runs: Runs, tmp_path: Path) -> None:
    study = tmp_path / "study"  # a folder of its own: the shared runs folder holds other modules' runs too
    for name, overrides in (("base", {}), ("base-repeat", {}), ("nondet-a", {"deterministic": False}),
                            ("nondet-b", {"deterministic": False}), ("tp2", LAYOUTS["tp2"])):
        shutil.copytree(runs.get(name, **overrides), study / name)
    result = subprocess.run([sys.executable, "-m", "workbench.cli", "summary", str(study)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "findings (reference base):" in out
    assert "tp2 vs base: first differ at step 0, site act:layers.0.self_attention" in out
    assert "cost of deterministic mode" in out and "L2 H64 TP1-PP1-DP1 fp32" in out
