"""A researcher's own Megatron Core loop (tests/integration/user_loop.py), recorded with ``record``:
no workbench config, no workbench model; read back by every reader and verb."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.helpers.training import USER_LOOP as LOOP_SCRIPT
from tests.helpers.training import train_user_loop
from workbench.analysis.compare import compare
from workbench.cli import main as cli
from workbench.store.manifest import USER_LOOP
from workbench.store.reader import list_runs, open_run
from workbench.store.writer_lock import writing

README = Path(__file__).resolve().parents[2] / "README.md"
GUIDE = README.parent / "docs" / "record-your-training.md"
ALL_KINDS = {"param", "act", "act_grad", "grad", "loss", "exp_avg", "exp_avg_sq", "update"}


def test_every_kind_is_recorded_from_a_tp2_loop_that_calls_finalize_model_grads_itself(user_runs: Path) -> None:
    run = open_run(user_runs / "tp2")
    assert set(run.site_table()["kind"]) == ALL_KINDS
    assert run.status == "complete" and run.steps_completed == 4
    assert run.scalars["loss"].notna().all() and (run.scalars["step_time"] > 0).all()
    info = run.manifest
    assert info.producer == USER_LOOP and info.layout.tp == 2 and info.layout.world_size == 2
    assert info.model is not None and (info.model.num_layers, info.model.hidden_size, info.model.vocab_size) == \
        (2, 32, 128)
    assert info.precision == "fp32" and info.deterministic is True and info.seed == 1234
    assert info.user_config is not None and info.user_config["tp"] == 2
    assert run.attrs["determinism"]["transformer_config"]["deterministic_mode"] is True
    assert "kinds_missing" not in run.attrs


def test_two_runs_of_the_loop_are_bitwise_identical_one_with_a_validation_loss(user_runs: Path) -> None:
    evaluated, plain = open_run(user_runs / "tp2"), open_run(user_runs / "tp2-again")
    val = evaluated.scalars["val_loss"]  # every 2nd step, inside run.evaluating()
    assert val[[1, 3]].notna().all() and val[[0, 2]].isna().all() and plain.scalars["val_loss"].isna().all()
    assert val[3] != evaluated.scalars["loss"][3]
    # the held-out forward passes were neither recorded nor did they change a training number
    assert compare(evaluated.records(), plain.records()).identical


def test_the_loop_under_torchrun_records_what_its_forked_ranks_record(user_runs: Path, tmp_path: Path) -> None:
    # The other tests fork the loop's ranks from a process that imported torch and Megatron Core already
    # (tests/helpers/training.py); a researcher starts it with torchrun: the records must be the same, bit for bit.
    train_user_loop(tmp_path / "torchrun", "--tp", "2", "--eval-every", "0", torchrun=True)
    assert compare(open_run(user_runs / "tp2-again").records(), open_run(tmp_path / "torchrun").records()).identical


def test_a_one_bit_change_is_found_at_its_step_and_module(user_runs: Path) -> None:
    result = compare(open_run(user_runs / "tp2").records(), open_run(user_runs / "tp2-flip").records())
    assert (result.first_step, result.first_site) == (2, "act:layers.1.mlp")


def test_a_pipeline_parallel_loop_with_1f1b_logs_the_loss_from_its_last_stage(user_runs: Path) -> None:
    run = open_run(user_runs / "pp2")
    assert run.manifest.layout.pp == 2
    assert set(run.site_table()["kind"]) == ALL_KINDS
    assert run.scalars["loss"].notna().all()  # logged on rank 1 only, stored by rank 0
    assert run.scalars["val_loss"][[1, 3]].notna().all()  # so is the validation loss


def test_the_verbs_work_on_a_folder_of_user_runs(user_runs: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert len(list_runs(user_runs)) == 4
    assert cli(["ls", str(user_runs)]) == 0
    assert cli(["compare", str(user_runs / "tp2"), str(user_runs / "tp2-flip")]) == 0
    assert cli(["check", str(user_runs / "tp2-again"), "--golden", str(user_runs / "tp2")]) == 0
    assert cli(["check", str(user_runs / "tp2-flip"), "--golden", str(user_runs / "tp2")]) == 1
    golden = tmp_path / "golden.json"
    assert cli(["golden", str(user_runs / "tp2"), "--out", str(golden)]) == 0  # what a CI commits
    assert cli(["check", str(user_runs / "tp2-again"), "--golden", str(golden)]) == 0
    assert cli(["check", str(user_runs / "tp2-flip"), "--golden", str(golden)]) == 1  # its weights after step 2
    assert cli(["summary", str(user_runs)]) == 0
    assert cli(["report", str(user_runs), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "first divergent step: 2" in out
    assert (tmp_path / "report").is_file()  # one self-contained HTML file


def test_a_loop_that_raises_leaves_a_failed_store(tmp_path: Path) -> None:
    # under torchrun itself, as a researcher starts it (most tests fork the ranks: tests/helpers/training.py)
    result = train_user_loop(tmp_path / "fails", "--raise-at", "2", ranks=1, ok=False, torchrun=True)
    assert result.returncode != 0
    run = open_run(tmp_path / "fails")
    assert run.status == "failed"
    assert "the loop failed at step 2" in run.attrs["error"]["message"]
    assert run.steps_completed == 2
    assert run.recorded_steps_completed == 2  # one process: its site rows need no reduction, none is lost


def test_kinds_asked_for_and_never_seen_are_a_warning_and_in_the_manifest(tmp_path: Path) -> None:
    result = train_user_loop(tmp_path / "no-opt", "--no-optimizer", ranks=1)
    missing = open_run(tmp_path / "no-opt").attrs["kinds_missing"]
    assert set(missing) == {"grad", "exp_avg", "exp_avg_sq"}
    assert "never saw" in result.stderr and "grad" in missing and "optimizer" in missing["grad"]


@pytest.mark.parametrize("page", [README, GUIDE], ids=["README", "guide"])
def test_the_readme_snippet_is_the_tested_loop(page: Path) -> None:
    snippet = re.search(r"```python\n(.*?)```", page.read_text().split("Record your own", 1)[1], re.S)
    assert snippet is not None
    loop = [line.strip() for line in LOOP_SCRIPT.read_text().splitlines()]
    position = 0
    for line in (raw.split("#")[0].strip() for raw in snippet.group(1).splitlines()):
        if not line or "..." in line or line.startswith(("import", "from")):
            continue
        assert line in loop[position:], f"{page.name}'s line not in the tested loop (in order): {line}"
        position = loop.index(line, position) + 1
    json.dumps(snippet.group(1))  # the snippet is text, not a template


def test_the_distributed_optimizer_not_handed_to_record_is_refused_in_one_line(tmp_path: Path) -> None:
    result = train_user_loop(tmp_path / "zero1", "--ddp", "use_distributed_optimizer", "--no-optimizer", ok=False)
    refusals = [line.split("ArgumentError: ", 1)[1] for line in result.stderr.splitlines()
                if "workbench.errors.ArgumentError: " in line]
    assert result.returncode != 0 and refusals, result.stderr[-3000:]  # torchrun stops the other rank at the first
    assert refusals[0].startswith("record() needs the optimizer under Megatron's distributed optimizer "
                                  "(use_distributed_optimizer): ") and refusals[0].endswith("nothing was written")
    assert not (tmp_path / "zero1").exists()  # refused before anything was written


def test_overlapped_reduction_records_the_same_numbers_and_names_grad_local_missing(tmp_path: Path) -> None:
    kinds = "param,act,act_grad,grad_local,grad,loss,exp_avg,exp_avg_sq,update"
    train_user_loop(tmp_path / "dp2", "--kinds", kinds, "--steps", "2", "--eval-every", "0")
    train_user_loop(tmp_path / "dp2-overlap", "--kinds", kinds, "--steps", "2", "--eval-every", "0",
                    "--ddp", "overlap_grad_reduce")
    plain, overlapped = open_run(tmp_path / "dp2"), open_run(tmp_path / "dp2-overlap")
    assert plain.manifest.layout.dp == 2 and overlapped.manifest.layout.dp == 2
    # This loop calls finalize_model_grads itself, so neither run can read grad_local; the overlapped one names
    # the reason that holds whatever the loop does.
    assert "finalize_model_grads_func" in plain.attrs["kinds_missing"]["grad_local"]
    missing = overlapped.attrs["kinds_missing"]
    assert list(missing) == ["grad_local"] and missing["grad_local"].startswith("overlap_grad_reduce: ")
    assert set(overlapped.site_table()["kind"]) == set(kinds.split(",")) - {"grad_local"}
    recorded, expected = overlapped.fingerprints(), plain.fingerprints()
    assert list(recorded.columns) == list(expected.columns) and len(recorded.columns) > 50
    assert recorded.equals(expected)  # the gradients the optimizer reads, whether or not reduced in the backward


def test_record_into_a_folder_another_process_writes_is_refused_on_every_rank(tmp_path: Path) -> None:
    with writing(tmp_path / "busy", writer="workbench run"):
        result = train_user_loop(tmp_path / "busy", "--steps", "1", ok=False)
    refusals = [line.split("RunFolderBusy: ", 1)[1] for line in result.stderr.splitlines() if "RunFolderBusy: " in line]
    assert result.returncode != 0 and refusals, result.stderr[-3000:]
    assert f"is being written by workbench run (pid {os.getpid()} on " in refusals[0]
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["writer.lock"]  # nothing written
