"""Damaging a run store's files, and the reading verbs run on the damage in a process with a memory limit.

    worker = VerbWorker(memory_bytes=4 << 30)
    damage(store, mutation)                       # one of ``mutations()``, drawn by hypothesis
    outcome = worker.run(["compare", str(store), str(pristine)])
    assert outcome.answered, outcome               # a result, or one line that says what is wrong

The verbs run in one long-lived process (imports paid once) whose address space is limited: a verb that
believes a damaged file's claims and allocates for them fails there, not in the test process. A verb that
dies, hangs or raises is reported with what it printed.
"""

from __future__ import annotations

import json
import os
import re
import resource
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

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
        """A result (exit 0 or 1, something printed), or bad input said in one line (exit 2, or 3: not yet)."""
        if self.rc in (0, 1):
            return bool(self.out.strip()) and "Traceback" not in self.out + self.err
        if self.rc in (2, 3):  # progress lines may come first (a long import says how far it got)
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


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)
"""What a damaged ``zarr.json`` may hold where a value was: any JSON, huge and negative numbers included."""


@st.composite
def mutations(draw: st.DrawFn) -> dict[str, Any]:
    """One damage to one file of a store, as data (``damage`` applies it): which file (an index into its sorted
    files), and what: a JSON value replaced or removed, the file cut, bytes flipped, garbage, the file removed,
    or replaced by a link to the same file of another store."""
    action = draw(st.sampled_from(["json", "json", "json", "truncate", "flip", "garbage", "remove", "link"]))
    mutation: dict[str, Any] = {"file": draw(st.integers(0, 10_000)), "action": action}
    if action == "json":
        mutation.update(path=draw(st.lists(st.integers(0, 50), min_size=1, max_size=6)),
                        value=draw(JSON_VALUES), delete=draw(st.booleans()))
    elif action == "truncate":
        mutation.update(keep=draw(st.floats(0, 1)))
    elif action == "flip":
        mutation.update(at=draw(st.lists(st.floats(0, 1), min_size=1, max_size=8)))
    elif action == "garbage":
        mutation.update(data=draw(st.binary(max_size=256)))
    return mutation


def damage(store: Path, mutation: dict[str, Any], elsewhere: Path) -> str:
    """Apply ``mutation`` to a file of ``store`` (a link points at the same file under ``elsewhere``); what was
    done, in words."""
    files = sorted(p for p in store.rglob("*") if p.is_file() and not p.is_symlink())
    path = files[mutation["file"] % len(files)]
    action = mutation["action"]
    relative = path.relative_to(store).as_posix()
    if action == "json" and path.name.endswith(".json"):
        try:
            document = json.loads(path.read_text())
        except ValueError:
            document = None
        if document is not None:
            where = _replace(document, mutation["path"], mutation["value"], mutation["delete"])
            path.write_text(json.dumps(document))
            return f"{relative}: {where}"
        action = "flip"
    if action in ("flip", "truncate", "garbage"):  # a JSON damage of a file that is no JSON: flipped bytes
        return f"{relative}: {_damage_bytes(path, {'at': [0.5], **mutation, 'action': action})}"
    if action == "remove":
        path.unlink()
        return f"{relative}: removed"
    path.unlink()
    path.symlink_to(elsewhere / relative)
    return f"{relative}: a link to the same file of another store"


def _replace(document: Any, steps: list[int], value: Any, delete: bool) -> str:
    """Walk ``document`` down ``steps`` (each an index into the keys or items there) and replace, or delete, what
    the walk ends on; the path taken, in words."""
    node, key, trail = document, None, []
    for step in steps:
        children = list(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else []
        if not children:
            break
        child_key = children[step % len(children)]
        if key is not None:
            trail.append(str(key))
        parent, key = node, child_key
        node = node[child_key]
    if key is None:
        return "nothing to replace"
    trail.append(str(key))
    if delete and isinstance(parent, dict):
        del parent[key]
        return f"{'.'.join(trail)} removed"
    parent[key] = value
    return f"{'.'.join(trail)} = {json.dumps(value)[:80]}"


NUMBERS = st.sampled_from(["1e309", "-1e309", "nan", "inf", "-0", "0", "9" * 400, "-1", "1e-400", "0x10", "1_0"])
"""What a damaged log may hold where a number was."""


@st.composite
def file_mutations(draw: st.DrawFn) -> dict[str, Any]:
    """One damage to a file another program wrote (a log, an event file), as data (``damage_file`` applies
    it): a line replaced, removed or repeated, a number replaced by an extreme one, the file cut, bytes flipped,
    or garbage."""
    action = draw(st.sampled_from(["line", "drop", "repeat", "number", "number", "truncate", "flip", "garbage"]))
    mutation: dict[str, Any] = {"action": action, "line": draw(st.integers(0, 10_000))}
    if action == "line":
        mutation["text"] = draw(st.text(max_size=80))
    elif action == "number":
        mutation.update(number=draw(NUMBERS), which=draw(st.integers(0, 20)))
    elif action == "repeat":
        mutation["times"] = draw(st.integers(2, 50))
    elif action == "truncate":
        mutation["keep"] = draw(st.floats(0, 1))
    elif action == "flip":
        mutation["at"] = draw(st.lists(st.floats(0, 1), min_size=1, max_size=8))
    else:
        mutation["data"] = draw(st.binary(max_size=256))
    return mutation


def damage_file(path: Path, mutation: dict[str, Any]) -> str:
    """Apply ``mutation`` to the file at ``path``; what was done, in words."""
    data, action = path.read_bytes(), mutation["action"]
    lines = data.split(b"\n")
    index = mutation["line"] % len(lines)
    if action == "line":
        lines[index] = mutation["text"].encode("utf-8", "surrogatepass")
    elif action == "drop":
        del lines[index]
    elif action == "repeat":
        lines[index:index + 1] = [lines[index]] * mutation["times"]
    elif action == "number":
        numbers = list(re.finditer(rb"-?\d+(\.\d+)?(e-?\d+)?", lines[index]))
        if numbers:
            found = numbers[mutation["which"] % len(numbers)]
            lines[index] = lines[index][:found.start()] + mutation["number"].encode() + lines[index][found.end():]
    if action in ("line", "drop", "repeat", "number"):
        path.write_bytes(b"\n".join(lines))
        return f"{path.name}: line {index + 1}: {action}"
    return f"{path.name}: {_damage_bytes(path, mutation)}"


def _damage_bytes(path: Path, mutation: dict[str, Any]) -> str:
    """The file cut, its bytes flipped, or replaced by garbage (``mutation["action"]``); what was done."""
    data = path.read_bytes()
    if mutation["action"] == "truncate":
        path.write_bytes(data[: int(mutation["keep"] * len(data))])
        return f"cut to {int(mutation['keep'] * len(data))} of {len(data)} bytes"
    if mutation["action"] == "flip":
        buffer = bytearray(data) or bytearray(b"\0")
        for at in mutation["at"]:
            buffer[min(len(buffer) - 1, int(at * len(buffer)))] ^= 0xFF
        path.write_bytes(bytes(buffer))
        return "bytes flipped"
    path.write_bytes(mutation["data"])
    return f"replaced by {len(mutation['data'])} bytes of garbage"
