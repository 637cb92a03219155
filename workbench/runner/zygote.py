"""Rank processes forked from one that has already imported them: the CPU runner's start-up, paid once.

A rank of the CPU runner spends about 2.7 s of CPU importing torch, Megatron Core and the workbench before it
trains a tiny model for about a second (``docs/performance.md``). The launcher therefore starts, once per
launcher process and environment, a *zygote*: ``python -m workbench.runner.zygote``, which imports what a rank
imports and then waits. For each rank the launcher sends it one line (the worker's arguments, the rank's whole
environment and its log file) and the zygote forks: the child starts a session of its own, points stdin at
``/dev/null`` and stdout and stderr at the log, takes the rank's environment and thread count, and runs
``workbench.runner.worker.main`` as the worker's ``__main__`` would (or, when the request names a Python file,
runs that file as ``python FILE ARGS`` would: the tests start researchers' own loops this way). The zygote
answers each request with the child's pid, and each child's end with its exit code (negative: the signal), which
``ForkedRank`` turns into the ``Popen``-like ``poll``, ``wait`` and ``returncode`` the launcher watches.

Only on the CPU: a CUDA context does not survive a fork, so a GPU launch starts each rank as its own process, as
before. ``WORKBENCH_FORK_RANKS=0`` turns the zygote off anywhere. The zygote imports and does nothing else
before it forks (one thread, no process group, no OpenMP team), and what differs between runs (the determinism
switches, the thread count, the rank) is read after the fork: the environment variables a rank reads at import
time are the zygote's, so the launcher starts another zygote when any other variable changes
(``import_environment``). When the launcher ends, the zygote sees its requests close, stops its children's
sessions and exits; each rank also ends when its parent does (``worker._exit_when_orphaned``).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

ENABLE_ENV = "WORKBENCH_FORK_RANKS"
"""``0``: start every rank as its own process, even on the CPU."""

PER_RUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
           "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Variables a rank reads after its start (``dist.init_process_group``, the thread count the child sets)."""
PER_RUN_PREFIXES = ("WORKBENCH_", "PYTEST_", "NCCL_", "NVTE_", "CUBLAS_", "CUDA_DEVICE_MAX_CONNECTIONS",
                    "TORCH_ALLOW_TF32")
"""Likewise: the workbench's own test hooks, pytest's per-test variables, and the determinism switches (read when
a kernel or a communicator is made; on the CPU, by nothing)."""


def import_environment(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of ``env`` a rank may read while it imports: a zygote serves a rank only if theirs match."""
    return tuple(sorted((key, value) for key, value in env.items()
                        if key not in PER_RUN and not key.startswith(PER_RUN_PREFIXES)))


def enabled(env: Mapping[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(ENABLE_ENV, "1") != "0"


# -- the launcher's side -----------------------------------------------------------------------------------


class ZygoteGone(RuntimeError):
    """The zygote ended before it answered."""


class Zygote:
    """The launcher's handle on one zygote process (``Zygote.shared`` keeps one per environment)."""

    _shared: Zygote | None = None
    _shared_lock = threading.Lock()

    def __init__(self, env: Mapping[str, str]) -> None:
        self.key = import_environment(env)
        self._process = subprocess.Popen([sys.executable, "-m", "workbench.runner.zygote"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         env={**env, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        self._lock = threading.Lock()
        self._started: list[int] = []
        self._codes: dict[int, int] = {}
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    @classmethod
    def shared(cls, env: Mapping[str, str]) -> Zygote:
        """This process's zygote for ``env``, started (or restarted, for another environment) when needed."""
        with cls._shared_lock:
            current = cls._shared
            if current is None or not current.alive() or current.key != import_environment(env):
                if current is not None:
                    current.close()
                current = cls._shared = Zygote(env)
                atexit.register(current.close)
            return current

    def alive(self) -> bool:
        return self._process.poll() is None

    def _read(self) -> None:
        assert self._process.stdout is not None
        for raw in self._process.stdout:
            message = json.loads(raw)
            with self._changed:
                if "started" in message:
                    self._started.append(int(message["started"]))
                else:
                    self._codes[int(message["ended"])] = int(message["code"])
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def start(self, argv: list[str], env: Mapping[str, str], log: Path, timeout_s: float = 600.0,
              script: Path | None = None, module: str | None = None) -> ForkedRank:
        """Fork one rank: ``workbench.runner.worker`` with ``argv`` (or the Python file ``script``, run as its
        ``__main__`` as ``python SCRIPT ARGV...`` would, or the module ``module`` as ``python -m MODULE
        ARGV...`` would), in ``env``, writing to ``log``."""
        request = json.dumps({"argv": argv, "env": dict(env), "log": str(log), "cwd": os.getcwd(),
                              "script": None if script is None else str(Path(script).resolve()),
                              "module": module}) + "\n"
        with self._lock:  # one request at a time: the answers come in order
            with self._changed:
                count = len(self._started)
            try:
                assert self._process.stdin is not None
                self._process.stdin.write(request.encode())
                self._process.stdin.flush()
            except (BrokenPipeError, OSError) as err:
                raise ZygoteGone(f"the rank zygote ended (exit code {self._process.poll()})") from err
            deadline = time.monotonic() + timeout_s
            with self._changed:
                while len(self._started) == count:
                    if not self.alive() or time.monotonic() > deadline:
                        raise ZygoteGone(f"the rank zygote did not start a rank (exit code {self._process.poll()})")
                    self._changed.wait(0.5)
                return ForkedRank(self, self._started[count])

    def code(self, pid: int) -> int | None:
        """The exit code of rank ``pid`` if it has ended; -9 if the zygote ended without saying."""
        with self._changed:
            if pid in self._codes:
                return self._codes[pid]
        if not self.alive() and not self._reader.is_alive():
            with self._changed:
                return self._codes.get(pid, -signal.SIGKILL)
        return None

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                code = self.code(pid)
                if code is not None:
                    return code
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._changed.wait(0.5 if left is None else min(left, 0.5))

    def close(self) -> None:
        """End the zygote (its ranks are stopped by their launcher, or end with it)."""
        if self._process.poll() is None:
            try:
                assert self._process.stdin is not None
                self._process.stdin.close()
                self._process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()


class ForkedRank:
    """A rank the zygote forked, watched like a ``subprocess.Popen``: its session id is its pid."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.wait_for(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
        return self.returncode


# -- the zygote's side -------------------------------------------------------------------------------------


def _run_rank(request: dict[str, Any]) -> int:
    """In the forked child: become the rank and run the worker; the exit code."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import torch

    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    from workbench.runner import worker

    script, module = request.get("script"), request.get("module")
    sys.argv = [script or worker.__file__, *request["argv"]]
    code = 0
    try:
        if script:  # as the interpreter runs a file: its folder first on the path
            sys.path.insert(0, os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
        elif module:  # as `python -m MODULE`: the module's file is argv[0] (run_module sets it)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            worker.main(request["argv"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
    except BaseException:  # as the interpreter would: the traceback on stderr, exit code 1
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads, as at interpreter exit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    return code


def _send(out: IO[bytes], message: dict[str, int]) -> None:
    out.write((json.dumps(message) + "\n").encode())
    out.flush()


PRELOAD = ("torch", "torch.distributed", "workbench.runner.worker", "workbench.runner.trainer",
           "workbench.runner.checkpoint", "workbench.recorder.recorder", "megatron.core.models.gpt",
           "megatron.core.models.gpt.gpt_layer_specs", "megatron.core.distributed", "megatron.core.optimizer",
           "megatron.core.pipeline_parallel", "megatron.core.dist_checkpointing")
"""What a rank of the CPU runner imports before it trains (a module a release lacks is skipped)."""


def serve() -> None:
    """The zygote: import what a rank imports, then fork one rank per request line on stdin until it closes.
    Import warnings are not shown: the ranks' logs would otherwise lose them to the launcher's terminal."""
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in PRELOAD:
            try:
                importlib.import_module(module)
            except ImportError:
                pass
    requests, out = sys.stdin.buffer, sys.stdout.buffer
    children: set[int] = set()
    pending = b""
    while True:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send(out, {"ended": pid, "code": os.waitstatus_to_exitcode(status)})
        readable, _, _ = select.select([requests], [], [], 0.1)
        if not readable:
            continue
        chunk = os.read(requests.fileno(), 1 << 16)
        if not chunk:  # the launcher is gone: so are its ranks
            for pid in children:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _run_rank(request)
                finally:
                    os._exit(code)
            children.add(pid)
            _send(out, {"started": pid})


if __name__ == "__main__":
    serve()
