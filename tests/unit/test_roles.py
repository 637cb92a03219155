"""studies.roles: the roles of a folder's runs, a pure function of typed manifests; and the workspace that
holds them beside its caches."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.helpers.manifests import info
from workbench.store import synthetic
from workbench.studies.roles import find_roles, repeat_key
from workbench.studies.workspace import Workspace


def test_roles_come_from_the_manifests_alone() -> None:
    infos = {"z-det": info("z-det"), "a-det-again": info("a-det-again"),
             "nd1": info("nd1", deterministic=False), "nd2": info("nd2", deterministic=False),
             "bf16": info("bf16", precision="bf16"), "tp2": info("tp2", tp=2), "seed2": info("seed2", seed=2),
             "resumed": info("resumed", resumes=(2,)), "fault": info("fault", fault="bitflip at step 1"),
             "replay": info("replay", replay={"step": 1, "from_step": 0})}
    roles = find_roles(infos, infos)
    assert roles.reference == "a-det-again"  # deterministic, fp32, one process, repeated; then by name
    assert roles.repeat_groups == [["a-det-again", "z-det"], ["nd1", "nd2"]]
    assert roles.repeat_of("z-det") == "a-det-again" and roles.repeat_of("bf16") is None
    assert roles.floor_runs == ["a-det-again", "nd1", "nd2"]  # the reference differs only in determinism
    assert roles.nondeterministic_repeats == ["nd1", "nd2"]
    assert roles.divergence_pair() == ("nd1", "nd2")
    assert roles.seed_runs == ["a-det-again", "seed2", "z-det"]
    assert roles.resumed == ["resumed"] and roles.faulted == ["fault"]
    assert roles.precision_runs == ["bf16"] and roles.layout_runs == ["tp2"]
    assert set(roles.others) == {"bf16", "tp2"}  # the replay repeats nothing and is no other change either
    assert [repeat_key(infos[n]) for n in ("resumed", "fault", "replay")] == [None, None, None]


def test_runs_of_other_code_are_never_repeats_and_band_runs_are_a_role_of_their_own() -> None:
    loop = {"tp": 2, "lr": 1e-3, "run_dir": "/runs/a", "save": "ckpt"}
    infos = {"a": info("a", user_config=loop, revision="abc"),
             "a-again": info("a-again", user_config={**loop, "run_dir": "/runs/a-again", "save": "other",
                                                     "eval_every": 2, "log_interval": 5}, revision="abc"),
             "bugged": info("bugged", user_config={**loop, "bug": "tp_partial_scale"}, revision="abc"),
             "later": info("later", user_config=loop, revision="def"),
             "p1": info("p1", user_config=loop, revision="abc", perturbation={"precision": "fp32"}),
             "p2": info("p2", user_config=loop, revision="abc", perturbation={"precision": "fp32"})}
    roles = find_roles(infos, infos)
    # where it writes, what it is called and how often it evaluates or logs are no code; a flag of the loop's and
    # the revision are
    assert roles.repeat_groups == [["a", "a-again"]]
    assert roles.band_runs == ["p1", "p2"] and repeat_key(infos["p1"]) is None
    assert roles.reference == "a" and set(roles.others) == {"bugged", "later"}


def test_a_folder_of_nondeterministic_repeats_alone_names_each_floor_run_once() -> None:
    infos = {name: info(name, deterministic=False) for name in ("e1", "e2")}
    roles = find_roles(infos, infos)
    assert roles.reference == "e1" and roles.floor_runs == ["e1", "e2"]


def test_a_run_without_records_is_never_the_reference_while_one_with_records_exists() -> None:
    infos = {"a": info("a"), "b": info("b", precision="bf16")}
    assert find_roles(infos, ["b"]).reference == "b"
    assert find_roles(infos, []).reference == "a"  # nothing recorded: the preference among all runs


def test_the_typed_fields_are_read_from_the_store(tmp_path: Path) -> None:
    import json

    run = synthetic.write_synthetic_run(tmp_path / "r", steps=4, sites=3)
    meta = run / "run.zarr" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"].update(resumes=[2], fault="none", started_from={"run": "x", "run_id": "x-1", "step": 1})
    meta.write_text(json.dumps(doc))
    parsed = Workspace.open(run).runs["r"].manifest
    assert parsed.resumes == (2,) and parsed.fault is None and parsed.started_from == {"run": "x", "run_id": "x-1",
                                                                                        "step": 1}


@pytest.fixture
def two_runs(tmp_path: Path) -> Workspace:
    synthetic.write_synthetic_run(tmp_path / "a", steps=8, sites=4)
    synthetic.write_synthetic_run(tmp_path / "b", steps=8, sites=4, seed=1)
    return Workspace.open(tmp_path)


def test_an_empty_selection_selects_no_run(two_runs: Workspace) -> None:
    assert two_runs.scalar("loss", []) == {}
    assert two_runs.site_series(two_runs.records("a").sites[0], "l2", []) == {}
    assert two_runs.provenance([]).runs == ()
    assert set(two_runs.scalar("loss")) == {"a", "b"}  # no selection: every run


def test_threads_asking_for_one_comparison_get_one_object(two_runs: Workspace) -> None:
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(two_runs.comparison("a", "b"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 and all(c is seen[0] for c in seen)
