"""Bug or rounding in a user's own loop (tests/integration/user_loop.py): a reference at TP=1, its band runs
(``record(..., perturb="fp32")``), a correct TP=2 run and a TP=2 run with a layout bug of the corpus; the
verdicts as ``workbench verdict`` gives them. The whole corpus is ``make corpus`` (benchmarks/rounding_corpus.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.training import train_user_loop
from workbench.analysis.compare import compare
from workbench.cli import main as cli
from workbench.store.reader import open_run

STEPS = ("--steps", "4", "--eval-every", "0")
BAND = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bug-or-rounding")
    train_user_loop(root / "ref", *STEPS, ranks=1)
    for i in range(BAND + 1):  # the last one is held out of the band
        train_user_loop(root / ("held-out" if i == BAND else f"band{i}"), *STEPS, "--perturb", "fp32", ranks=1)
    for i in range(2):  # the loop's nondeterministic repeats, emulated on the CPU: they join the band
        train_user_loop(root / f"nondet{i}", *STEPS, "--emulate", "embedding_atomics", ranks=1)
    train_user_loop(root / "tp2", *STEPS, "--tp", "2")
    train_user_loop(root / "tp2-bug", *STEPS, "--tp", "2", "--bug", "tp_partial_scale")
    train_user_loop(root / "tp2-replica", *STEPS, "--tp", "2", "--bug", "replica_not_updated")
    return root


def verdict(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = cli(["verdict", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_band_run_says_what_rounding_it_carries(runs: Path) -> None:
    info = open_run(runs / "band0").manifest
    assert info.perturbation is not None and info.perturbation["precision"] == "fp32"
    assert info.perturbation["relative_size"] == 2.0 ** -24 and info.perturbation["modules"] > 10
    assert open_run(runs / "ref").manifest.perturbation is None
    assert not compare(open_run(runs / "ref").records(), open_run(runs / "band0").records()).identical


def test_a_correct_layout_and_a_held_out_band_run_are_within_rounding(runs: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    band = [str(runs / f"band{i}") for i in range(BAND)]
    code, result = verdict(capsys, str(runs / "tp2"), str(runs / "ref"), "--band", *band)
    assert (code, result["verdict"]) == (0, "within rounding"), result
    assert result["band_runs"] == [f"band{i}" for i in range(BAND)] and result["worst_ratio"] <= 1
    code, result = verdict(capsys, str(runs / "held-out"), str(runs / "ref"), "--band", *band)
    assert (code, result["verdict"]) == (0, "within rounding"), result


def test_a_layout_bug_is_beyond_rounding_where_compare_against_a_correct_run_finds_it(
        runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # without --band: the band runs are found beside the reference (the held-out one among them)
    code, result = verdict(capsys, str(runs / "tp2-bug"), str(runs / "ref"))
    assert (code, result["verdict"]) == (1, "beyond rounding"), result
    assert sorted(result["band_runs"]) == sorted([*(f"band{i}" for i in range(BAND)), "held-out", "nondet0",
                                                  "nondet1"])
    found = compare(open_run(runs / "tp2").records(), open_run(runs / "tp2-bug").records())
    assert (result["first_step"], result["first_site"]) == (found.first_step, found.first_site) == \
        (0, "act:layers.1.self_attention")  # the module whose row-parallel partial sum the bug scales
    assert result["first_ratio"] > 10
    assert cli(["verdict", str(runs / "tp2-bug"), str(runs / "ref")]) == 1
    assert "beyond rounding from step 0: look at act:layers.1.self_attention" in capsys.readouterr().out


def test_a_loops_emulated_nondeterminism_is_named_and_its_runs_are_the_floor(runs: Path) -> None:
    # whether two such runs differ is a draw here (the embedding's gradient rows are reordered, and this loop's
    # 32 tokens a micro-batch rarely hold one token three times): the emulation's effect is tests/unit's
    from workbench.studies.workspace import Workspace

    a = open_run(runs / "nondet0")
    assert a.manifest.deterministic is False and a.manifest.determinism["sources"]["embedding_atomics"]["state"] == \
        "on" and "random order" in a.manifest.determinism["emulated_nondeterminism"][0]
    assert open_run(runs / "ref").manifest.determinism["emulated_nondeterminism"] == []
    assert Workspace.open(runs).roles.floor_runs == ["ref", "nondet0", "nondet1"]


def test_a_replica_updated_on_one_rank_only_is_named_with_its_rank(runs: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # the final norm's weight is recorded from TP rank 0; rank 1's copy gets no gradient: without the replicas'
    # hashes the first site beyond rounding would be the output layer's activation at step 1
    assert open_run(runs / "tp2").manifest.replicas_parted is None
    assert open_run(runs / "tp2-replica").manifest.replicas_parted == \
        {"step": 0, "site": "grad:final_layernorm.weight", "tp_rank": 1}
    code, result = verdict(capsys, str(runs / "tp2-replica"), str(runs / "ref"))
    assert (code, result["first_step"], result["first_site"], result["parted_tp_rank"]) == \
        (1, 0, "grad:final_layernorm.weight", 1)


def test_a_reference_without_a_band_is_refused_in_one_line(runs: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["verdict", str(runs / "tp2"), str(runs / "ref"), "--band", str(runs / "band0")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a rounding band needs at least two band runs of ref" in err
    assert cli(["verdict", str(runs / "tp2"), str(tmp_path / "nothing")]) == 2
