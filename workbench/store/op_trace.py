"""The operation-trace file: one JSON line per traced operation, beside a run store.

``RUN/op_traces/step_<K>/rank<R>.jsonl`` holds the operations rank R ran in step K under the
tracer (``workbench.runner.tracer``), in execution order. Each line is one ``TracedOperation``:

    {"seq": 12, "rank": 0, "tp_rank": 0, "phase": "forward", "microbatch": 0, "scope": "layers.0.mlp",
     "op": "mm", "occurrence": 3, "node": null, "source": "mlp.py:10 in forward",
     "inputs": [[[16, 64], "float32", "9f0c...", 0, true], ...], "outputs": [...]}

with each tensor written as [shape, dtype, fingerprint, non-finite count, defined] (a list, to
keep the lines short). This module owns that schema: the tracer writes through
``write_trace``, readers get ``TracedTensor`` objects back from ``read_trace``. Imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.errors import DamagedStoreError

COLUMNS = ["seq", "rank", "tp_rank", "phase", "microbatch", "scope", "op", "occurrence", "node", "source", "inputs",
           "outputs"]


@dataclass(frozen=True)
class TracedTensor:
    shape: tuple[int, ...]
    dtype: str
    fingerprint: str | None
    """64-bit BLAKE2b digest of the bytes, as 16 hex digits; None where it says nothing comparable."""
    nonfinite: int = 0
    defined: bool = True
    """False for uninitialised memory (``torch.empty``, a reused buffer): its bytes are junk."""

    def to_json(self) -> list[Any]:
        return [list(self.shape), self.dtype, self.fingerprint, self.nonfinite, self.defined]

    @classmethod
    def from_json(cls, value: Any, *, source: str) -> TracedTensor:
        if not isinstance(value, list) or len(value) < 4:
            raise DamagedStoreError(f"{source}: a traced tensor is {value!r}, where "
                                    "[shape, dtype, fingerprint, non-finite count, defined] belongs")
        return cls(tuple(int(n) for n in value[0]), str(value[1]), value[2], int(value[3]),
                   bool(value[4]) if len(value) > 4 else True)

    def without_fingerprint(self) -> TracedTensor:
        return TracedTensor(self.shape, self.dtype, None, self.nonfinite, self.defined)


@dataclass(frozen=True)
class TracedOperation:
    seq: int
    """Position in the rank's execution order."""
    rank: int
    tp_rank: int
    phase: str
    """'forward', 'backward' or 'step'."""
    microbatch: int
    scope: str
    """Canonical name of the module the operation ran in ('' outside any)."""
    op: str
    occurrence: int
    """How many operations of this (phase, scope, op) ran before it on this rank."""
    node: str | None = None
    """The autograd node a backward operation belongs to."""
    source: str | None = None
    """'file:line in function' of the Python code that issued it."""
    inputs: list[TracedTensor] = field(default_factory=list)
    outputs: list[TracedTensor] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        row["inputs"] = [t.to_json() for t in self.inputs]
        row["outputs"] = [t.to_json() for t in self.outputs]
        return row

    @classmethod
    def from_json(cls, row: Mapping[str, Any], *, source: str) -> TracedOperation:
        missing = [c for c in COLUMNS if c not in row and c not in ("node", "source")]
        if missing:
            raise DamagedStoreError(f"{source}: a traced operation lacks {', '.join(missing)}")
        return cls(seq=int(row["seq"]), rank=int(row["rank"]), tp_rank=int(row["tp_rank"]), phase=str(row["phase"]),
                   microbatch=int(row["microbatch"]), scope=str(row["scope"]), op=str(row["op"]),
                   occurrence=int(row["occurrence"]), node=row.get("node") or None, source=row.get("source") or None,
                   inputs=[TracedTensor.from_json(t, source=source) for t in row["inputs"]],
                   outputs=[TracedTensor.from_json(t, source=source) for t in row["outputs"]])


def write_trace(path: Path, operations: Iterable[TracedOperation]) -> Path:
    """Write ``operations`` as JSON lines to ``path`` (whole or not at all: through a temporary file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    with tmp.open("w") as f:
        for operation in operations:
            f.write(json.dumps(operation.to_json(), separators=(",", ":")) + "\n")
    tmp.replace(path)
    return path


def read_trace(files: Iterable[Path]) -> pd.DataFrame:
    """The operations of several ranks' trace files, one row per operation and rank (``COLUMNS``; inputs
    and outputs as lists of ``TracedTensor``), ordered by tensor-parallel rank, then execution order."""
    rows = []
    for path in files:
        with path.open() as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DamagedStoreError(f"{path}:{number}: not a JSON line ({err.msg})") from err
                rows.append(TracedOperation.from_json(row, source=f"{path}:{number}"))
    frame = pd.DataFrame([{c: getattr(op, c) for c in COLUMNS} for op in rows], columns=COLUMNS)
    return frame.sort_values(["tp_rank", "seq"], kind="stable", ignore_index=True)
