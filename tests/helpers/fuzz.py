"""The reading verbs run on damaged files in a process with a memory limit (the damage:
``workbench.testing.damage``).

    worker = VerbWorker(memory_bytes=4 << 30)
    damage(store, mutation, elsewhere)            # one of ``mutations()``, drawn by hypothesis
    outcome = worker.run(["compare", str(store), str(pristine)])
    assert outcome.answered, outcome               # a result, or one line that says what is wrong

The verbs run in one long-lived process (imports paid once) whose address space is limited: a verb that
believes a damaged file's claims and allocates for them fails there, not in the test process. A verb that
dies, hangs or raises is reported with what it printed.
"""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import NOT_YET

ROOT = Path(__file__).resolve().parents[2]

_WORKER = r"""
import io, json, sys, traceback
stdout, stderr = sys.stdout, sys.stderr
from workbench.cli import main
for line in sys.stdin:
    argv = json.loads(line)
    out, err = io.BytesIO(), io.BytesIO()
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(err, encoding="utf-8", write_through=True)
    try:
        result = {"rc": main(argv)}
    except BaseException as error:
        result = {"rc": None, "raised": f"{type(error).__name__}: {error}"[:1000],
                  "traceback": traceback.format_exc()[-3000:]}
    finally:
        for wrapper in (sys.stdout, sys.stderr):
            wrapper.flush()
            wrapper.detach()  # the bytes stay readable
        sys.stdout, sys.stderr = stdout, stderr
    result.update(out=out.getvalue().decode("utf-8", "replace")[-3000:],
                  err=err.getvalue().decode("utf-8", "replace")[-3000:])
    stdout.write(json.dumps(result) + "\n")
    stdout.flush()
"""


@dataclass
class Outcome:
    argv: list[str]
    rc: int | None
    out: str = ""
    err: str = ""
    raised: str = ""
    traceback: str = ""

    @property
    def answered(self) -> bool:
        """A result (exit 0 or 1, something printed), or bad input said in one line (exit 2, or ``NOT_YET``: a run
        that has not recorded yet)."""
        if self.rc in (0, 1):
            return bool(self.out.strip()) and "Traceback" not in self.out + self.err
        if self.rc in (2, NOT_YET):  # progress lines may come first (a long import says how far it got)
            lines = self.err.strip().splitlines()
            return bool(lines) and lines[-1].startswith("workbench: ") and "Traceback" not in self.err \
                and not any(line.startswith(("workbench: ", " ", "\t")) for line in lines[:-1])
        return False


class VerbWorker:
    """A process that runs ``workbench`` verbs in turn, its address space limited to ``memory_bytes``."""

    def __init__(self, memory_bytes: int = 4 << 30, timeout_s: float = 120.0) -> None:
        self.memory_bytes, self.timeout_s = memory_bytes, timeout_s
        self.process: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        limit = self.memory_bytes

        def limited() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1"}
        return subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env, preexec_fn=limited)

    def run(self, argv: list[str]) -> Outcome:
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(argv) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:  # it died (the memory limit, a crash) or hung
            self.close()
            return Outcome(argv, None, raised="the verb's process died or ran past "
                                              f"{self.timeout_s:.0f} s (memory limit {self.memory_bytes >> 20} MiB)")
        found: dict[str, Any] = json.loads(line)
        return Outcome(argv, found.pop("rc"), **found)

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
