"""A failing rank stops the whole run; a run killed with SIGKILL leaves a readable store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.training import tiny_config
from workbench.errors import LaunchError, UnsupportedError
from workbench.runner.launch import launch
from workbench.runner.worker import FAIL_AT_ENV
from workbench.store.reader import open_run


def _worker_pids(run_dir: Path) -> list[int]:
    """The processes writing to the run's rank logs: its ranks, whether started as their own processes or forked
    by the zygote (``workbench.runner.zygote``), whose command line is the zygote's."""
    logs = str(run_dir / "logs") + os.sep
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "fd" / "1").startswith(logs):
                pids.append(int(proc.name))
        except OSError:  # ended, or not ours to read
            pass
    return pids


def test_a_failing_rank_stops_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAIL_AT_ENV, "1:2")
    run_dir = tmp_path / "fails"
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"rank 1 .*failed[\s\S]*injected failure on rank 1 at step 2"):
        launch(tiny_config("fails", **{"layout.dp": 2, "steps": 50}), run_dir)
    assert time.monotonic() - start < 600  # a hang guard, not a speed: the run planned 50 steps
    deadline = time.monotonic() + 60
    while _worker_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _worker_pids(run_dir) == []
    run = open_run(run_dir)
    assert run.status == "failed"
    assert run.attrs["error"]["rank"] == 1
    assert run.steps_completed <= 2


def _start_run(tmp_path: Path, name: str, steps: int, *, total: int, batch: int, layers: int, seq: int,
               extra: str = "", stderr: bool = False) -> tuple[subprocess.Popen[bytes], Path]:
    """``workbench run`` of a small DP=2 config in the background, once it has written ``steps`` steps
    (``stderr``: its standard error piped, for the test to read)."""
    cfg_path = tmp_path / f"{name}.toml"
    cfg_path.write_text(
        f'name = "{name}"\nsteps = {total}\nglobal_batch_size = {2 * batch}\nmicro_batch_size = {batch}\n{extra}'
        f"[model]\nnum_layers = {layers}\nhidden_size = 32\nnum_attention_heads = 2\nvocab_size = 64\n"
        f"seq_length = {seq}\n[layout]\ndp = 2\n"
        '[record]\ncompile = false\nkinds = ["param", "act", "grad"]\n')
    launcher = subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(cfg_path), "--out", str(tmp_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE if stderr else subprocess.DEVNULL)
    run_dir = tmp_path / name
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if _steps_written(run_dir) >= steps:
            return launcher, run_dir
        time.sleep(0.2)
    launcher.kill()
    pytest.fail(f"the run did not write {steps} steps in 120 s")


def _steps_written(run_dir: Path) -> int:
    """Steps the run has written so far; 0 before its store exists (the store appears whole, see
    ``test_a_store_being_created_is_never_seen_half_made``)."""
    if not (run_dir / "run.zarr").exists():
        return 0
    return open_run(run_dir).steps_completed


def test_the_rank_that_failed_on_its_own_is_named_not_the_one_that_lost_its_peer(tmp_path: Path) -> None:
    from workbench.runner.launch import _Rank, _root_cause

    logs = {0: "Traceback (most recent call last):\nRuntimeError: [gloo] Connection closed by peer [127.0.0.1]:1",
            1: "Traceback (most recent call last):\nRuntimeError: injected failure on rank 1 at step 2"}
    ranks = []
    for rank, text in logs.items():
        (tmp_path / f"rank{rank}.log").write_text(text + "\n")
        ranks.append(_Rank(rank, None, tmp_path / f"rank{rank}.log"))  # type: ignore[arg-type]
    assert _root_cause(ranks).rank == 1
    assert _root_cause(ranks[:1]).rank == 0  # only consequential errors: the first is named


def test_the_rank_at_fault_is_named_when_its_peer_exits_first(tmp_path: Path) -> None:
    """The race seen under load: the rank that lost its peer exits first; the one at fault is still writing
    its error. The launcher waits for it instead of stopping it before it has written its traceback."""
    from workbench.runner.launch import _ProgressReader, _Rank, _watch

    scripts = {0: "import sys; print('Traceback (most recent call last):\\nRuntimeError: Connection reset by peer');"
                  " sys.exit(1)",
               1: "import sys, time; time.sleep(3); print('Traceback (most recent call last):\\n"
                  "RuntimeError: injected failure on rank 1'); sys.exit(1)"}
    ranks = []
    for rank, script in scripts.items():
        log = tmp_path / f"rank{rank}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        ranks.append(_Rank(rank, process, log))
    failed = _watch(ranks, _ProgressReader(ranks[0].log, None))
    assert failed is not None and failed.rank == 1
    assert all(r.process.poll() is not None for r in ranks)


def test_sigkill_leaves_every_flushed_step_readable(tmp_path: Path) -> None:
    launcher, run_dir = _start_run(tmp_path, "long", 20, total=2000, batch=2, layers=2, seq=16,
                                   extra="flush_every = 5\n")
    for pid in [launcher.pid, *_worker_pids(run_dir)]:
        os.kill(pid, signal.SIGKILL)
    launcher.wait()
    time.sleep(0.5)
    run = open_run(run_dir)
    assert run.status == "interrupted"
    n = run.steps_completed
    assert 20 <= n < 2000
    assert n % 5 == 0  # whole flushes only
    assert np.isfinite(run.scalars.loss).all() and len(run.scalars) == n
    assert run.dataset()["loss"].sizes["step"] == n
    recorded = run.recorded_steps_completed
    assert recorded >= 5 and recorded % 5 == 0
    sites = run.sites()
    assert sites.sizes["step"] == recorded
    assert np.isfinite(sites.stats.sel(stat="sum").to_numpy()).all()


def test_orphaned_ranks_exit_when_the_launcher_dies(tmp_path: Path) -> None:
    launcher, run_dir = _start_run(tmp_path, "orphan", 1, total=5000, batch=1, layers=1, seq=8)
    assert _worker_pids(run_dir)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 15
    while _worker_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _worker_pids(run_dir) == []


def test_fp8_without_a_gpu_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="fp8.*no GPU"):
        launch(tiny_config("fp8", precision="fp8"), tmp_path / "fp8")
    assert not (tmp_path / "fp8").exists()


def _mount_tmpfs(where: Path, size_kib: int) -> bool:
    """A small tmpfs at ``where`` (root only); False where mounting is not allowed."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
                          capture_output=True)
    return done.returncode == 0


_NO_SPACE_HOOK = '''
import errno, pathlib
_write = pathlib.Path.write_bytes
def _full(self, data):
    if "step_000003" in str(self):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))
    return _write(self, data)
pathlib.Path.write_bytes = _full
'''
"""A ``sitecustomize`` for the ranks where no tmpfs can be mounted: the checkpoint of step 3 meets a full disk."""


@pytest.mark.parametrize("disk", ["tmpfs", "injected"])
def test_a_full_disk_during_a_checkpoint_ends_the_run_failed_with_every_step_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disk: str) -> None:
    run_dir = tmp_path / "full"
    checkpoints = run_dir / "checkpoints"
    # step 0's checkpoint (~0.95 MB) fits in 1.4 MB, step 3's (~1.9 MB, with Adam's moments) does not
    mounted = disk == "tmpfs" and _mount_tmpfs(checkpoints, 1400)
    if disk == "tmpfs" and not mounted:
        pytest.skip("mounting a tmpfs is not allowed here (not root); the injected full disk stands in")
    if not mounted:
        hook = tmp_path / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(_NO_SPACE_HOOK)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]))
    try:
        with pytest.raises(LaunchError, match="writing the checkpoint failed on rank 0") as failure:
            launch(tiny_config("full", **{"steps": 6, "checkpoint_every": 3, "flush_every": 10}), run_dir)
        assert "No space left on device" in str(failure.value)
        assert list(checkpoints.iterdir()) == [checkpoints / "step_000000"]  # no partial checkpoint, no .partial
        run = open_run(run_dir)
        assert run.status == "failed"
        assert "No space left on device" in run.attrs["error"]["excerpt"]
        # the steps before the checkpoint, though fewer than flush_every, were flushed before the run ended
        assert run.steps_completed == 3
        assert run.recorded_steps_completed == 3 and run.fingerprints().index.tolist() == [0, 1, 2]
    finally:
        if mounted:
            subprocess.run(["umount", str(checkpoints)], check=True)


def test_a_full_disk_during_megatron_s_checkpoint_is_named_as_such(tmp_path: Path) -> None:
    """Megatron's collective save wraps each rank's error in DCP's ``CheckpointException``: the message is
    the rank's own (the disk is full), not the wrapper's."""
    run_dir = tmp_path / "full"
    checkpoints = run_dir / "checkpoints"
    if not _mount_tmpfs(checkpoints, 64):  # smaller than Megatron's part of step 0's checkpoint
        pytest.skip("mounting a tmpfs is not allowed here (not root)")
    try:
        with pytest.raises(LaunchError, match="writing the checkpoint failed on rank 0") as failure:
            launch(tiny_config("full", **{"steps": 2, "checkpoint_format": "megatron"}), run_dir)
        assert "No space left on device" in str(failure.value), str(failure.value)
        assert list(checkpoints.iterdir()) == []
        assert open_run(run_dir).status == "failed"
    finally:
        subprocess.run(["umount", str(checkpoints)], check=True)


def test_a_rendezvous_port_taken_before_rank_0_binds_it_is_replaced(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # _free_port frees the port it found before rank 0 binds it: another launch on the machine can take it
    # in between (two suites side by side: EADDRINUSE in rank 0). The launch starts its ranks again.
    import socket

    from workbench.runner import launch as launch_module

    blocker = socket.socket()
    blocker.bind(("0.0.0.0", 0))
    blocker.listen()
    ports = [blocker.getsockname()[1]]
    real_free_port = launch_module._free_port
    monkeypatch.setattr(launch_module, "_free_port", lambda: ports.pop() if ports else real_free_port())
    said: list[str] = []
    try:
        run_dir = launch(tiny_config("port", **{"layout.dp": 2, "steps": 2}), tmp_path / "port", progress=said.append)
    finally:
        blocker.close()
    assert open_run(run_dir).status == "complete"
    assert any("rendezvous port was taken" in line for line in said), said


def _partial_files(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "run.zarr").rglob("*.partial"))


def _cut_short_write(run_dir: Path) -> None:
    """A process killed as it writes the store, between Zarr's writing its temporary file and renaming it (Zarr
    removes that file on an ``Exception`` only; a kill leaves it)."""
    script = ("import os, sys, zarr, zarr.storage._local as local\n"
              "local._move_with_retry = lambda *args, **kwargs: os._exit(9)  # killed at the rename\n"
              "array = zarr.open_array(sys.argv[1], mode='r+')\n"
              "array[0] = array[0]\n")
    done = subprocess.run([sys.executable, "-c", script, str(run_dir / "run.zarr" / "scalars" / "loss")],
                          capture_output=True, timeout=60)
    assert done.returncode == 9, done.stderr


def test_sigterm_says_it_stopped_the_run_and_resume_removes_a_cut_short_write(tmp_path: Path) -> None:
    launcher, run_dir = _start_run(tmp_path, "preempted", 12, total=2000, batch=1, layers=1, seq=8,
                                   extra="flush_every = 4\ncheckpoint_every = 4\n", stderr=True)
    launcher.send_signal(signal.SIGTERM)  # a scheduler's preemption
    _, err = launcher.communicate(timeout=120)
    text = err.decode()
    assert launcher.returncode == 128 + signal.SIGTERM, text
    assert text.strip().splitlines()[-1] == ("workbench: stopped by SIGTERM; every rank was stopped (the same "
                                             "command with --resume continues from its latest checkpoint)"), text
    assert "Traceback" not in text and _worker_pids(run_dir) == []
    _cut_short_write(run_dir)
    assert _partial_files(run_dir)
    latest = max(int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*"))
    resumed = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(tmp_path / "preempted.toml"),
                              "--out", str(tmp_path), "--resume", "--stop-after", str(latest + 2)],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _partial_files(run_dir) == []
    assert open_run(run_dir).steps_completed == latest + 2


def test_a_second_ctrl_c_ends_at_once_without_a_traceback(tmp_path: Path) -> None:
    launcher, run_dir = _start_run(tmp_path, "impatient", 4, total=2000, batch=1, layers=1, seq=8, stderr=True)
    launcher.send_signal(signal.SIGINT)
    time.sleep(0.2)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130 and "Traceback" not in err.decode() and "Exception ignored" not in err.decode()
    deadline = time.monotonic() + 30  # each rank ends with its launcher
    while _worker_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _worker_pids(run_dir) == []
