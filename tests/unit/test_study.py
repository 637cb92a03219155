from __future__ import annotations

from pathlib import Path

import pytest

from workbench.config import RunConfig
from workbench.errors import ConfigError
from workbench.studies.study import expand_study, load_study

EXAMPLES = Path(__file__).resolve().parents[2] / "workbench" / "examples"
BASE = RunConfig(name="base", checkpoint_every=10, steps=40)


def test_matrix_times_repeats() -> None:
    study = expand_study({"name": "s", "repeats": 2,
                          "matrix": {"precision": ["fp32", "bf16"], "layout": {"tp": [1, 2]}}}, BASE)
    names = [r.name for r in study.runs]
    assert len(names) == 8
    assert "bf16-tp2-r1" in names
    run = next(r for r in study.runs if r.name == "bf16-tp2-r1")
    assert run.config.layout.tp == 2 and run.config.precision.value == "bf16"
    assert run.config.seed == BASE.seed


def test_explicit_runs_with_resume() -> None:
    study = expand_study({"runs": [{"name": "nd", "deterministic": False, "repeats": 2},
                                   {"name": "res", "resume_at": 20, "layout": {"dp": 2}}]}, BASE)
    assert [r.name for r in study.runs] == ["nd-r0", "nd-r1", "res"]
    assert study.runs[0].config.deterministic is False
    assert study.runs[2].resume_at == 20 and study.runs[2].config.layout.dp == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"runs": [{"name": "a"}, {"name": "a"}]}, "used twice"),
        ({"runs": [{"deterministic": False}]}, "needs a name"),
        ({"runs": [{"name": "a", "resume_at": 50}]}, "resume_at"),
        ({"matrix": {"precision": []}}, "non-empty list"),
        ({"matrix": {"precision": ["fp9"]}}, "precision"),
        ({"colour": 1}, "unknown field 'colour'"),
        ({"overrides": {"model": {"colour": 1}}, "runs": [{"name": "a"}]}, "model.colour"),
        ({"overrides": 3, "runs": [{"name": "a"}]}, "overrides must be a table"),
        ({"runs": [{"name": "a", "start_from": {"run": "b", "step": 10}}]}, "no earlier run"),
        ({"runs": [{"name": "b"}, {"name": "a", "start_from": {"run": "b", "step": 5}}]}, "saves no checkpoint"),
        ({"runs": [{"name": "b"}, {"name": "a", "start_from": "b"}]}, "a table"),
        ({}, "plans no runs"),
    ],
)
def test_bad_studies(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        expand_study(data, BASE)


def test_demo_study_covers_what_the_demo_promises() -> None:
    study = load_study(EXAMPLES / "demo.toml")
    configs = {r.name: r.config for r in study.runs}
    assert {"det-r0", "det-r1", "nondet-r0", "nondet-r1", "bf16", "tp2", "pp2", "dp2", "resumed"} <= set(configs)
    assert configs["det-r0"] == configs["det-r1"].with_overrides({"name": "det-r0"})
    assert not configs["nondet-r0"].deterministic
    assert configs["tp2"].layout.tp == 2 and configs["pp2"].layout.pp == 2 and configs["dp2"].layout.dp == 2
    assert next(r for r in study.runs if r.name == "resumed").resume_at is not None
    # the band the layout and precision runs are judged against, bug or rounding: fp32's, and bf16's for bf16
    assert [configs[f"band-r{i}"].perturb for i in range(6)] == ["fp32"] * 6 and configs["bf16"].perturb is None
    assert configs["band-bf16-r0"].perturb == "bf16" and configs["band-r0"].numerics_hash() != \
        configs["det-r0"].numerics_hash()


def test_overrides_change_the_base_of_every_run() -> None:
    study = expand_study({"overrides": {"model": {"num_experts": 4}, "steps": 20},
                          "runs": [{"name": "a"}, {"name": "b", "layout": {"dp": 2, "ep": 2}}]}, BASE)
    assert [r.config.model.num_experts for r in study.runs] == [4, 4] and study.runs[0].config.steps == 20
    assert study.runs[1].config.layout.ep == 2


def test_the_moe_demo_pairs_each_configuration() -> None:
    configs = {r.name: r.config for r in load_study(EXAMPLES / "demo_moe.toml").runs}
    assert all(c.model.is_moe and c.model.moe_topk >= 3 for c in configs.values())  # >= 3 outputs meet per token
    assert {(c.layout.ep, c.deterministic) for c in configs.values() if c.perturb is None} == \
        {(1, True), (1, False), (2, True), (2, False)}
    assert [configs[f"band-r{i}"].perturb for i in range(4)] == ["fp32"] * 4  # the band EP=2 is judged against
    dense = {r.name: r.config for r in load_study(EXAMPLES / "demo.toml").runs}
    assert {(c.layout.dp, c.deterministic) for c in dense.values() if c.layout.dp == 2} == {(2, True), (2, False)}


def test_the_parallel_study_starts_a_run_from_another_layouts_checkpoint() -> None:
    runs = {r.name: r for r in load_study(EXAMPLES / "parallel.toml").runs}
    assert runs["tp2-sp"].config.layout.sp and runs["pp2-vp2"].config.layout.vp == 2
    started = runs["tp1-from-tp2"]
    assert started.start_from == ("tp2", 10) and started.config.layout.tp == 1
    assert list(runs).index("tp2") < list(runs).index("tp1-from-tp2")


def test_a_study_asking_for_an_emulation_its_config_excludes_is_refused_before_any_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU, the emulated data-parallel all-reduce replaces Megatron DDP's one all-reduce per bucket: with the
    distributed optimizer (a reduce-scatter) there is nothing to replace. The study says so naming the run, the
    source and the setting, and no run starts, not even the ones it could emulate."""
    from workbench.errors import UnsupportedError
    from workbench.runner import launch
    from workbench.studies.study import run_study

    monkeypatch.setattr(launch, "_has_gpu", lambda: False)  # what a CPU emulates (on a GPU nothing is emulated)
    base = BASE.with_overrides({"deterministic": False, "layout.dp": 4})
    study = expand_study({"name": "zero1", "runs": [
        {"name": "plain", "nondeterminism": {"dp_allreduce": True}},
        {"name": "sharded", "nondeterminism": {"dp_allreduce": True}, "optim": {"use_distributed_optimizer": True}},
        {"name": "sp", "layout": {"tp": 2, "sp": True}, "nondeterminism": {"splitk_gemm": True}}]}, base)
    with pytest.raises(UnsupportedError) as err:
        run_study(study, tmp_path / "out", lambda *args: None)
    message = str(err.value)
    assert "\n" not in message
    assert "sharded: nondeterminism source dp_allreduce" in message
    assert "optim.use_distributed_optimizer = true" in message and "(and 1 more)" in message
    assert not (tmp_path / "out").exists()


def test_the_distributed_optimizer_is_part_of_the_layout_in_the_numerics_hash() -> None:
    sharded = BASE.with_overrides({"layout.dp": 2, "optim.use_distributed_optimizer": True,
                                   "optim.overlap_grad_reduce": True})
    plain = BASE.with_overrides({"layout.dp": 2})
    assert sharded.numerics_hash() != plain.numerics_hash()
    assert sharded.numerics_hash(layout=False) == plain.numerics_hash(layout=False) == BASE.numerics_hash(layout=False)
    with pytest.raises(ConfigError, match="optim.overlap_param_gather"):
        BASE.with_overrides({"optim.overlap_param_gather": True})


def test_parameter_snapshots_under_the_distributed_optimizer_are_refused_by_the_config() -> None:
    """The recorder refuses them in every rank once training starts; the config says it before any run."""
    with pytest.raises(ConfigError, match="record.snapshot_sites.*grad:\\*embeddings\\*.*distributed optimizer"):
        BASE.with_overrides({"layout.dp": 2, "optim.use_distributed_optimizer": True, "record.snapshot_steps": [1],
                             "record.snapshot_sites": ["act:layers.0.mlp", "grad:*embeddings*"]})
    BASE.with_overrides({"layout.dp": 2, "optim.use_distributed_optimizer": True, "record.snapshot_steps": [1],
                         "record.snapshot_sites": ["act:layers.0.mlp"]})  # activations: taken whole


def _busy_for_another_writer(folder: Path) -> str | None:
    """The refusal another thread (a writer like any other) meets at ``folder``, or None if it gets in."""
    import threading

    from workbench.store.writer_lock import RunFolderBusy, acquire

    refusal: list[str | None] = [None]

    def probe() -> None:
        try:
            acquire(folder, writer="probe").release()
        except RunFolderBusy as err:
            refusal[0] = str(err)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return refusal[0]


def test_a_sweep_holds_its_study_folder_and_each_run_from_its_check_through_its_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.runner import launch
    from workbench.studies.study import run_study

    seen: list[tuple[str, bool, str | None, str | None]] = []

    def fake_launch(config: RunConfig, run_dir: Path, *, resume: bool = False, **options: object) -> None:
        seen.append((run_dir.name, resume, _busy_for_another_writer(run_dir), _busy_for_another_writer(run_dir.parent)))

    monkeypatch.setattr(launch, "launch", fake_launch)
    monkeypatch.setattr(launch, "_has_gpu", lambda: True)
    study = expand_study({"name": "locks", "runs": [{"name": "a"}, {"name": "res", "resume_at": 20}]}, BASE)
    run_study(study, tmp_path / "out", lambda *args: None)
    assert [(name, resume) for name, resume, _, _ in seen] == [("a", False), ("res", False), ("res", True)]
    for _, _, run_busy, study_busy in seen:
        assert run_busy is not None and "workbench sweep (locks)" in run_busy, run_busy
        assert study_busy is not None and "workbench sweep (locks)" in study_busy, study_busy
    assert _busy_for_another_writer(tmp_path / "out") is None  # given back at the end


def test_a_second_sweep_of_a_study_folder_is_refused_before_it_launches_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from workbench.runner import launch
    from workbench.store.writer_lock import RunFolderBusy, writing
    from workbench.studies.study import run_study

    launched: list[Path] = []
    monkeypatch.setattr(launch, "launch", lambda config, run_dir, **options: launched.append(run_dir))
    monkeypatch.setattr(launch, "_has_gpu", lambda: True)
    study = expand_study({"name": "twice", "runs": [{"name": "a"}, {"name": "b"}]}, BASE)
    holding, done = threading.Event(), threading.Event()

    def first_sweep() -> None:
        with writing(tmp_path / "out", writer="workbench sweep (twice)"):
            holding.set()
            done.wait(60)

    first = threading.Thread(target=first_sweep)
    first.start()
    holding.wait(60)
    try:
        with pytest.raises(RunFolderBusy, match=r"out is being written by workbench sweep \(twice\)"):
            run_study(study, tmp_path / "out", lambda *args: None)
    finally:
        done.set()
        first.join()
    assert launched == [] and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["writer.lock"]
