"""One writer per run folder (``workbench/store/writer_lock.py``): a second writer is refused naming the holder,
a killed holder blocks nobody, nothing lands inside a run store, and a filesystem that cannot lock is said so."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.errors import ArgumentError
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer_lock import LOCK_FILE, RunFolderBusy, acquire, writing

SPAWN = multiprocessing.get_context("spawn")


def _hold(run_dir: str, ready: str) -> None:
    acquire(run_dir, writer="workbench run", rank=0)
    Path(ready).touch()
    time.sleep(600)  # until killed


def _wait_for(path: Path, deadline_s: float = 120.0) -> None:
    start = time.monotonic()
    while not path.exists():
        assert time.monotonic() - start < deadline_s, f"{path} never appeared"
        time.sleep(0.05)


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holder_blocks_nobody(tmp_path: Path) -> None:
    holder = SPAWN.Process(target=_hold, args=(str(tmp_path / "run"), str(tmp_path / "ready")))
    holder.start()
    try:
        _wait_for(tmp_path / "ready")
        with pytest.raises(RunFolderBusy) as refused:
            acquire(tmp_path / "run", writer="record() (user loop)")
        line = str(refused.value)
        assert "\n" not in line and f"is being written by workbench run (pid {holder.pid} on " in line
        assert "global rank 0" in line
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # as a crash or an out-of-memory kill would
        holder.join(timeout=120)
    with writing(tmp_path / "run", writer="workbench run --resume") as lock:  # the dead holder's lock is gone
        assert lock.run_dir == (tmp_path / "run").absolute()
    acquire(tmp_path / "run", writer="workbench run").release()  # and released at the block's end


def _race(run_dir: str, who: str, rounds: int, log: str) -> None:
    """Each round: try to take the folder's lock; the holder writes its name into the folder's file, creates the
    run store in the folder (named after itself) and writes the file again, and notes its win."""
    from workbench.store.synthetic import write_synthetic_run

    for round_ in range(rounds):
        folder = Path(run_dir) / f"round{round_}"
        try:
            with writing(folder, writer=who):
                (folder / "written-by").write_text(who)
                write_synthetic_run(folder, steps=4, sites=2, name=who)
                (folder / "written-by").write_text(who)
                assert (folder / "written-by").read_text() == who, "another writer wrote while this one held it"
                with open(log, "a") as out:
                    out.write(f"{round_} {who}\n")
        except RunFolderBusy:
            pass


def test_two_writers_racing_for_many_folders_never_write_one_at_the_same_time(tmp_path: Path) -> None:
    """At the level of the lock and of the store's creation: each round's store is whole and the winner's."""
    from workbench.store.reader import open_run

    rounds = 20
    racers = [SPAWN.Process(target=_race, args=(str(tmp_path), who, rounds, str(tmp_path / "wins.log")))
              for who in ("a", "b")]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=300)
    assert [racer.exitcode for racer in racers] == [0, 0]
    wins = (tmp_path / "wins.log").read_text().split("\n")[:-1]
    # Each round has a winner, and whoever won alone wrote the folder's file: a loser never writes.
    assert len(wins) >= rounds and {int(w.split()[0]) for w in wins} == set(range(rounds))
    for round_ in range(rounds):
        winner = (tmp_path / f"round{round_}" / "written-by").read_text()
        run = open_run(tmp_path / f"round{round_}")
        assert winner in ("a", "b") and run.name == winner and run.status == "complete"
        assert len(run.fingerprints()) == 4  # whole: every step's row, one writer's


@pytest.mark.parametrize("inside", ["other/run.zarr", "other/run.zarr/sites/deeper"])
def test_a_run_folder_inside_a_run_store_is_refused_before_anything_is_made(tmp_path: Path, inside: str) -> None:
    (tmp_path / "other" / "run.zarr").mkdir(parents=True)
    (tmp_path / "other" / "run.zarr" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    with pytest.raises(ArgumentError, match=r"lies inside the run store .*other/run\.zarr"):
        acquire(tmp_path / inside, writer="workbench run")
    assert sorted(p.name for p in (tmp_path / "other" / "run.zarr").iterdir()) == ["zarr.json"]


def test_a_filesystem_that_cannot_lock_is_refused_not_written_unlocked(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(ArgumentError, match="its filesystem cannot lock writer.lock .*No locks available"):
        acquire(tmp_path / "run", writer="workbench run")


def test_the_lock_file_names_its_holder_and_survives_its_release(tmp_path: Path) -> None:
    with writing(tmp_path / "run", writer="record() (user loop)", rank=0):
        text = (tmp_path / "run" / LOCK_FILE).read_text()
        assert '"writer": "record() (user loop)"' in text and f'"pid": {os.getpid()}' in text
    assert (tmp_path / "run" / LOCK_FILE).exists()


def test_a_writer_of_this_process_holds_its_folder_again_and_only_the_outer_hold_lets_go(tmp_path: Path) -> None:
    """A replay holds its folder and launches the run, which takes the same lock: nested holds, one process."""
    outer = acquire(tmp_path / "run", writer="workbench replay")
    inner = acquire(tmp_path / "run", writer="workbench run --resume")
    inner.release()
    inner.release()  # twice is once
    assert not _free_for_another_process(tmp_path / "run")  # the outer hold still keeps others out
    outer.release()
    assert _free_for_another_process(tmp_path / "run")


def test_two_threads_of_one_process_are_two_writers(tmp_path: Path) -> None:
    """The operating system's lock is the process's: a notebook's second thread writing the same folder is
    refused like another process, naming the holding thread, and is let in once the first lets go."""
    holder = acquire(tmp_path / "run", writer="record() (user loop)")
    refusals: list[str] = []

    def second_writer() -> None:
        try:
            acquire(tmp_path / "run", writer="workbench import-te").release()
        except RunFolderBusy as err:
            refusals.append(str(err))

    threads = [threading.Thread(target=second_writer, name=f"writer-{i}") for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(refusals) == 8 and all("record() (user loop) (this process, thread 'MainThread')" in r
                                      for r in refusals), refusals
    holder.release()
    other = threading.Thread(target=second_writer)
    other.start()
    other.join()
    assert len(refusals) == 8  # free now: taken and given back without a refusal
    assert _free_for_another_process(tmp_path / "run")


def test_threads_racing_for_one_folder_let_exactly_one_in_at_a_time(tmp_path: Path) -> None:
    inside, most, refused = [0], [0], [0]
    counting = threading.Lock()

    def writer() -> None:
        for _ in range(200):
            try:
                lock = acquire(tmp_path / "run", writer="probe")
            except RunFolderBusy:
                with counting:
                    refused[0] += 1
                continue
            with counting:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.0002)
            with counting:
                inside[0] -= 1
            lock.release()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1 and refused[0] > 0 and inside[0] == 0


def _try(run_dir: str, result: str) -> None:
    try:
        acquire(run_dir, writer="probe").release()
        Path(result).write_text("free")
    except RunFolderBusy:
        Path(result).write_text("busy")


def _free_for_another_process(run_dir: Path) -> bool:
    result = run_dir.parent / "probe.txt"
    result.unlink(missing_ok=True)
    probe = SPAWN.Process(target=_try, args=(str(run_dir), str(result)))
    probe.start()
    probe.join(timeout=120)
    return result.read_text() == "free"


def test_an_import_into_a_folder_another_process_writes_is_refused_before_it_writes(tmp_path: Path) -> None:
    from workbench.importers import import_te_log

    holder = SPAWN.Process(target=_hold, args=(str(tmp_path / "run"), str(tmp_path / "ready")))
    holder.start()
    try:
        _wait_for(tmp_path / "ready")
        with pytest.raises(RunFolderBusy, match="is being written by workbench run"):
            import_te_log(Path(__file__).parents[2] / "data" / "examples" / "te_debug", tmp_path / "run")
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_FILE]  # nothing written
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(timeout=120)


@contextlib.contextmanager
def _held_by_another_thread(folder: Path, writer: str = "workbench run") -> Iterator[None]:
    """``folder``'s lock, held by another thread (for the lock, another writer like any other) until the block
    ends."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with writing(folder, writer=writer):
            holding.set()
            done.wait(120)

    holder = threading.Thread(target=hold, name="the-other-writer")
    holder.start()
    assert holding.wait(120)
    try:
        yield
    finally:
        done.set()
        holder.join()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


EXAMPLES = Path(__file__).resolve().parents[2] / "data" / "examples"


def _upgrade(tmp_path: Path, folder: Path) -> None:
    from workbench.store.upgrade import upgrade_store

    upgrade_store(folder)


def _import_megatron(tmp_path: Path, folder: Path) -> None:
    from workbench.importers.megatron_tb import import_megatron_tensorboard

    import_megatron_tensorboard(EXAMPLES / "megatron_tb", folder)


def _import_dumps(tmp_path: Path, folder: Path) -> None:
    from tests.helpers.dumps import full_tensors, write_dumps
    from workbench.megatron_lm.dumps import import_megatron_dumps

    import_megatron_dumps(write_dumps(tmp_path / "save", 1, full_tensors()), folder, progress=lambda line: None)


def _replay(tmp_path: Path, folder: Path) -> None:
    from workbench.investigate.replay import replay
    from workbench.store.manifest import RUNNER

    original = write_synthetic_run(tmp_path / "orig", steps=12, written=8, status="stopped", producer=RUNNER)
    replay(original, 3, out=folder)


def _resume(tmp_path: Path, folder: Path) -> None:
    from tests.helpers.training import tiny_config
    from workbench.runner.launch import launch

    launch(tiny_config("held"), folder, resume=True)


def _bisect(tmp_path: Path, folder: Path) -> None:
    from workbench.investigate.bisect import bisect

    a = write_synthetic_run(tmp_path / "a", steps=6, sites=4, seed=1)
    b = write_synthetic_run(tmp_path / "b", steps=6, sites=4, seed=1, diverge_at=(2, 1))
    bisect(a, b, out=folder)


WRITERS = {"upgrade": _upgrade, "import-megatron": _import_megatron, "import-megatron-dumps": _import_dumps,
           "replay": _replay, "run --resume": _resume, "bisect": _bisect}
"""Writers whose lock the tests above do not take already: each given a folder another writer holds."""


@pytest.mark.parametrize("verb", sorted(WRITERS))
def test_every_writer_is_refused_a_folder_another_writer_holds_before_it_writes(
        tmp_path: Path, verb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workbench.runner.launch._spawn", lambda *args: pytest.fail("a run was launched"))
    folder = tmp_path / "held"
    if verb == "upgrade":
        write_synthetic_run(folder, steps=8, sites=4, schema_version=2)
    before = _files(folder) if folder.exists() else []
    with _held_by_another_thread(folder), pytest.raises(RunFolderBusy, match="is being written by workbench run"):
        WRITERS[verb](tmp_path, folder)
    assert _files(folder) == sorted({*before, LOCK_FILE}), f"{verb} wrote into a folder it did not hold"
