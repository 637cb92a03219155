"""Training for the tests: the tiny runner config, runs trained once per session, the layouts they are
trained at, and a researcher's own loop (``tests/integration/user_loop.py``) run on forked ranks or torchrun."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from workbench.config import RunConfig
from workbench.runner import zygote as zygotes
from workbench.runner.launch import _free_port as free_port  # the port the runner's launcher would take

TINY: dict[str, Any] = {
    "name": "tiny",
    "steps": 4,
    "global_batch_size": 8,
    "micro_batch_size": 2,
    "checkpoint_every": 1,
    "flush_every": 2,
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128, "seq_length": 32},
    "optim": {"lr": 0.01, "min_lr": 0.001, "warmup_steps": 2},
    # Eager statistics: each rank process would otherwise compile the kernel first
    # (test_recorder checks that the compiled path gives the same fingerprints).
    "record": {"compile": False},
}


def tiny_config(name: str, **overrides: Any) -> RunConfig:
    return RunConfig.from_dict(TINY).with_overrides({"name": name, **overrides})


NAMED: dict[str, dict[str, Any]] = {
    # A repeat that computes its validation loss after every step (the base run only after the last):
    # evaluating must change no training number, so the two are still bitwise repeats.
    "base-repeat": {"eval.every": 1},
}


def shared_dir(factory: pytest.TempPathFactory) -> Path:
    """A folder every pytest-xdist worker of this session sees (the workers' temporary folders share a parent),
    so that what one worker trains the others reuse; without xdist, the session's own temporary folder."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def held(lock: Path, deadline_s: float = 1800.0) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` across processes, polling for it for up to ``deadline_s``."""
    with open(lock, "a") as handle:
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - start > deadline_s:
                    raise TimeoutError(f"{lock} still held by another worker after {deadline_s:.0f} s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def made_once(folder: Path, make: Callable[[Path], object]) -> Path:
    """``folder``, made by ``make(folder)`` unless a process of this session (another pytest-xdist worker, or
    this one) has made it already: the first to ask makes it while the others wait. A failed make leaves
    nothing behind, so the next request makes it again (and fails as loudly)."""
    done = folder.parent / f"{folder.name}.made"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with held(folder.parent / f"{folder.name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            try:
                make(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder


class Runs:
    """Trains each named config once per session (with its ``NAMED`` overrides), whichever pytest-xdist worker
    asks first; later requests, from any worker, reuse the run folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, name: str, **overrides: Any) -> Path:
        from workbench.runner.launch import launch

        config = tiny_config(name, **{**NAMED.get(name, {}), **overrides})
        return made_once(self.root / name, lambda folder: launch(config, folder))


LAYOUTS = {
    "tp2": {"layout.tp": 2},
    "pp2": {"layout.pp": 2},
    "dp2": {"layout.dp": 2},
    "tp2pp2": {"layout.tp": 2, "layout.pp": 2},
}
"""The parallel layouts the integration tests train beside the TP=1 PP=1 DP=1 ``base`` run."""

USER_LOOP = Path(__file__).parents[1] / "integration" / "user_loop.py"
"""A researcher's own Megatron Core loop, recorded with ``workbench.recorder.record``."""


def train_user_loop(run_dir: Path, *args: str, ranks: int = 2, ok: bool = True,
                    torchrun: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``user_loop.py`` on ``ranks`` processes (gloo); with ``ok``, assert it succeeded. With ``torchrun``
    (and whenever ranks are not forked: ``WORKBENCH_FORK_RANKS=0``) under torchrun itself, as a researcher starts
    it; otherwise its ranks are forked by the runner's zygote with the environment torchrun gives them, which
    spares each rank's import of torch and Megatron Core (``run_forked``)."""
    if torchrun or not zygotes.enabled():
        result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 str(ranks), str(USER_LOOP), str(run_dir), *args], capture_output=True, text=True,
                                timeout=900)
    else:
        result = run_forked(USER_LOOP, [str(run_dir), *args], ranks)
    if ok:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


FAILED_PEERS_S = 30.0
"""How long the other ranks have to end on their own after one fails, before they are stopped."""


def run_forked(script: Path | None, argv: list[str], ranks: int, timeout_s: float = 900.0, *,
               module: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGV`` (or ``python -m MODULE ARGV``) on ``ranks`` ranks forked by the runner's zygote, in
    this process's environment with ``env`` over it, each with the variables
    ``torchrun --standalone`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, a free local
    ``MASTER_PORT``, ``OMP_NUM_THREADS=1`` unless set). As torchrun does, when a rank fails the others are stopped
    (after ``FAILED_PEERS_S`` to end on their own) and the exit code is 1; the ranks' output, rank by rank, is
    both ``stdout`` and ``stderr`` of the result."""
    zygote = zygotes.Zygote.shared(os.environ)
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="ranks-"))
    started = []
    for rank in range(ranks):
        variables = {**os.environ, **(env or {}), "RANK": str(rank), "WORLD_SIZE": str(ranks),
                     "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        variables.setdefault("OMP_NUM_THREADS", "1")
        started.append(zygote.start(argv, variables, logs / f"rank{rank}.log", script=script, module=module))
    deadline, failed_at, timed_out = time.monotonic() + timeout_s, None, False
    while True:
        codes = [rank.poll() for rank in started]
        if all(code is not None for code in codes):
            break
        if failed_at is None and any(code not in (None, 0) for code in codes):
            failed_at = time.monotonic()
        now = time.monotonic()
        timed_out = now > deadline
        if timed_out or failed_at is not None and now > failed_at + FAILED_PEERS_S:
            for rank in started:
                if rank.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(rank.pid, signal.SIGKILL)
                    rank.wait(timeout=60)
            break
        time.sleep(0.1)
    codes = [rank.poll() for rank in started]
    output = "".join((logs / f"rank{rank}.log").read_text(errors="replace") for rank in range(ranks))
    shutil.rmtree(logs, ignore_errors=True)
    command = [str(script) if script else f"-m {module}", *argv]
    if timed_out:
        raise subprocess.TimeoutExpired(command, timeout_s, output=output)
    return subprocess.CompletedProcess(command, 0 if all(c == 0 for c in codes) else 1, output, output)
