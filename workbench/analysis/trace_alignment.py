"""The first operation at which two runs differ, from operation traces of one step.

    origin = first_operation(trace_a, trace_b)     # traces: open_run(run_dir).op_trace(step)
    origin.summary()

Pure: two tables of traced operations in (``workbench.store.op_trace.read_trace``: one row
per operation and rank, inputs and outputs as ``TracedTensor``), a small result out.

Within a run, operations are keyed by (phase, micro-batch, scope, op, occurrence) and merged
over tensor-parallel ranks. Across runs, the operation sequences of each (phase, micro-batch,
scope) are
aligned by name, and by input shapes when both runs have the same tensor-parallel size
(``difflib``'s longest matching blocks), so an operation one run has and the other has not
(a layout's extra view or collective) does not shift the rest. A tensor of an operation is
*comparable* when both runs hold it whole and with the same shape: the tensor-parallel
ranks of a run agree on it (a tensor split over ranks, or a partial sum before its
reduction, is not comparable), and so is uninitialised memory: an output marked undefined
(``torch.empty``, Megatron's global memory buffer) and, wherever its bytes are read again, the
same bytes as an input, unless some operation also computed those bytes (reused memory that
still holds an earlier tensor). Walking run A's operations in execution order:

* the first aligned operation whose comparable inputs are all equal and whose outputs
  differ is the **origin**;
* if an aligned operation's input differs first, the difference was made by an operation
  that is not aligned (it exists in one run only: a collective that one layout needs and
  the other does not, a change injected into one run) or whose inputs could not be
  compared (split over ranks). That operation, found as the last one before it whose output
  has the differing input's fingerprint, is the origin;
* every later aligned operation with a differing input is **downstream**.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pandas as pd

from workbench.errors import EmptyTraceError

if TYPE_CHECKING:  # the traces come read (store.op_trace): only their type here
    from workbench.store.op_trace import TracedTensor

Key = tuple[str, int, str, str, int]
"""(phase, micro-batch, scope, op, occurrence)"""
_KEY = ["phase", "microbatch", "scope", "op", "occurrence"]


@dataclass(frozen=True)
class Operation:
    run: str
    """'a', 'b' or 'both' (aligned)."""
    phase: str
    microbatch: int
    scope: str
    op: str
    occurrence: int
    source: str | None
    node: str | None

    def describe(self) -> str:
        where = self.scope or "(outside any module)"
        batch = f", micro-batch {self.microbatch}" if self.microbatch >= 0 else ""
        text = f"{self.phase} {self.op} #{self.occurrence} in {where}{batch}"
        if self.node:
            text += f" [{self.node}]"
        return text + (f" at {self.source}" if self.source else "")


class OriginVerdict(StrEnum):
    """What the comparison of two traces found."""

    IDENTICAL = "identical"
    """Every aligned operation has equal outputs."""
    ORIGIN = "origin"
    """An aligned operation with equal inputs and different outputs."""
    UNALIGNED = "unaligned"
    """An operation of one run only, or with inputs split over ranks, made the first difference."""
    UNTRACED = "untraced"
    """An input differs and no traced operation of the step made it: the state before the step differs."""


@dataclass(frozen=True)
class OperationOrigin:
    verdict: OriginVerdict
    origin: Operation | None
    first_affected: Operation | None
    """The first aligned operation with a differing input."""
    aligned: int
    only_a: int
    only_b: int
    downstream: int
    """Aligned operations after the origin whose inputs differ."""
    differing_inputs: list[int] = field(default_factory=list)
    operations: pd.DataFrame = field(default_factory=pd.DataFrame)
    """One row per aligned operation in run A's order: ``position``, phase, micro-batch, scope, op,
    occurrence (run A's), ``inputs`` and ``outputs`` ('equal', 'differ' or 'unknown': any differing
    tensor makes 'differ')."""

    @property
    def identical(self) -> bool:
        return self.verdict == OriginVerdict.IDENTICAL

    def summary(self) -> str:
        counts = f"{self.aligned} aligned operations, {self.only_a} only in A, {self.only_b} only in B"
        if self.identical:
            return f"every aligned operation has equal outputs ({counts})"
        assert self.origin is not None or self.first_affected is not None
        if self.verdict == OriginVerdict.UNTRACED:
            assert self.first_affected is not None
            return (f"an input of {self.first_affected.describe()} already differs and no traced operation of "
                    f"this step made it: the state before the step differs ({counts})")
        assert self.origin is not None
        which = {"a": " (only in run A)", "b": " (only in run B)", "both": ""}[self.origin.run]
        kind = "origin" if self.verdict == OriginVerdict.ORIGIN else "first difference made by"
        return (f"{kind}: {self.origin.describe()}{which}; {self.downstream} later operations have "
                f"differing inputs ({counts})")

    def to_dict(self) -> dict[str, Any]:
        def op(o: Operation | None) -> dict[str, Any] | None:
            return None if o is None else dict(o.__dict__)
        return {"verdict": str(self.verdict), "origin": op(self.origin), "first_affected": op(self.first_affected),
                "aligned": self.aligned, "only_a": self.only_a, "only_b": self.only_b,
                "downstream": self.downstream, "summary": self.summary()}


@dataclass
class _Merged:
    """One operation of one run, its tensors merged over tensor-parallel ranks."""

    seq: int
    row: dict[str, Any]
    inputs: list[tuple[tuple[int, ...], str | None]]
    outputs: list[tuple[tuple[int, ...], str | None]]


def _merge_tensors(per_rank: list[list[TracedTensor]]) -> list[tuple[tuple[int, ...], str | None]]:
    """(shape, fingerprint) per tensor; fingerprint None unless every rank holds the same bits."""
    if len({len(t) for t in per_rank}) != 1:
        return []
    merged = []
    for tensors in zip(*per_rank):
        shapes = {t.shape for t in tensors}
        prints = {t.fingerprint for t in tensors}
        same = len(shapes) == 1 and len(prints) == 1 and None not in prints
        merged.append((tensors[0].shape, tensors[0].fingerprint if same else None))
    return merged


def _without_undefined(trace: pd.DataFrame) -> pd.DataFrame:
    """The trace with the fingerprints of uninitialised memory removed, wherever those bytes appear."""
    outputs: list[TracedTensor] = [t for tensors in trace["outputs"] for t in tensors]
    # Bytes that some operation also produced as a defined value (memory reused by the allocator
    # still holds an earlier tensor) stay comparable: only junk nothing computed is removed.
    undefined = {t.fingerprint for t in outputs if not t.defined} - {t.fingerprint for t in outputs if t.defined}

    def clean(tensors: list[TracedTensor]) -> list[TracedTensor]:
        return [t.without_fingerprint() if t.fingerprint in undefined or not t.defined else t for t in tensors]
    return trace.assign(inputs=trace["inputs"].map(clean), outputs=trace["outputs"].map(clean))


def _merge(trace: pd.DataFrame, name: str) -> tuple[dict[Key, _Merged], list[Key]]:
    if trace.empty:
        raise EmptyTraceError(f"the operation trace of run {name} holds no operations")
    trace = _without_undefined(trace)
    merged: dict[Key, _Merged] = {}
    order: list[tuple[int, Key]] = []
    for key, group in trace.groupby(_KEY, sort=False):
        rows = group.sort_values("tp_rank").to_dict("records")
        first = rows[0]
        k: Key = (str(key[0]), int(key[1]), str(key[2]), str(key[3]), int(key[4]))
        merged[k] = _Merged(seq=int(first["seq"]), row=first,
                            inputs=_merge_tensors([r["inputs"] for r in rows]),
                            outputs=_merge_tensors([r["outputs"] for r in rows]))
        order.append((int(first["seq"]), k))
    return merged, [k for _, k in sorted(order)]


def _status(x: list[tuple[tuple[int, ...], str | None]], y: list[tuple[tuple[int, ...], str | None]]) -> list[str]:
    """'equal', 'differ' or 'unknown' per tensor position."""
    if len(x) != len(y):
        return ["unknown"] * max(len(x), len(y))
    out = []
    for (shape_x, fp_x), (shape_y, fp_y) in zip(x, y):
        if fp_x is None or fp_y is None or shape_x != shape_y:
            out.append("unknown")
        else:
            out.append("equal" if fp_x == fp_y else "differ")
    return out


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None  # JSON null reads back as NaN


def _operation(m: _Merged, run: str) -> Operation:
    r = m.row
    return Operation(run=run, phase=r["phase"], microbatch=int(r["microbatch"]), scope=r["scope"], op=r["op"],
                     occurrence=int(r["occurrence"]),
                     source=_text(r.get("source")), node=_text(r.get("node")))


def _align(ops_a: dict[Key, _Merged], order_a: list[Key], ops_b: dict[Key, _Merged],
           order_b: list[Key], *, by_shape: bool) -> dict[Key, Key]:
    """Run A's key -> run B's key of the same operation, matched per (phase, micro-batch, scope) by name,
    and by the shapes of the inputs when ``by_shape`` (same tensor-parallel size: shapes are comparable)."""
    def token(ops: dict[Key, _Merged], key: Key) -> str:
        return key[3] + (repr([shape for shape, _ in ops[key].inputs]) if by_shape else "")

    def groups(order: list[Key]) -> dict[tuple[str, int, str], list[Key]]:
        found: dict[tuple[str, int, str], list[Key]] = {}
        for key in order:
            found.setdefault(key[:3], []).append(key)
        return found

    in_b = groups(order_b)
    pairs: dict[Key, Key] = {}
    for group, keys_a in groups(order_a).items():
        keys_b = in_b.get(group, [])
        matcher = difflib.SequenceMatcher(None, [token(ops_a, k) for k in keys_a], [token(ops_b, k) for k in keys_b],
                                          autojunk=False)
        for block in matcher.get_matching_blocks():
            for i in range(block.size):
                pairs[keys_a[block.a + i]] = keys_b[block.b + i]
    return pairs


def _producer(ops: dict[Key, _Merged], order: list[Key], before: int, fingerprint: str) -> Key | None:
    """The last operation before ``before`` (a seq) with an output of this fingerprint."""
    for key in reversed(order):
        m = ops[key]
        if m.seq < before and any(fp == fingerprint for _, fp in m.outputs):
            return key
    return None


def first_operation(trace_a: pd.DataFrame, trace_b: pd.DataFrame) -> OperationOrigin:
    """Where two traces of the same step first differ (see the module docstring)."""
    ops_a, order_a = _merge(trace_a, "A")
    ops_b, order_b = _merge(trace_b, "B")
    same_tp = trace_a["tp_rank"].max() == trace_b["tp_rank"].max()
    pairs = _align(ops_a, order_a, ops_b, order_b, by_shape=bool(same_tp))
    aligned = [k for k in order_a if k in pairs]
    only_a, only_b = len(ops_a) - len(aligned), len(ops_b) - len(aligned)
    origin: Operation | None = None
    first_affected: Operation | None = None
    verdict = OriginVerdict.IDENTICAL
    downstream = 0
    differing: list[int] = []
    rows = []
    for position, key in enumerate(aligned):
        a, b = ops_a[key], ops_b[pairs[key]]
        inputs = _status(a.inputs, b.inputs)
        outputs = _status(a.outputs, b.outputs)
        rows.append((position, *key, _overall(inputs), _overall(outputs)))
        if "differ" in inputs:
            downstream += 1
            if first_affected is None:
                first_affected = _operation(a, "both")
                differing = [i for i, s in enumerate(inputs) if s == "differ"]
                if origin is None:
                    origin, verdict = _made_by(ops_a, order_a, ops_b, order_b, pairs, a, b, differing[0])
            continue
        if first_affected is None and origin is None and "differ" in outputs:
            origin, verdict = _operation(a, "both"), OriginVerdict.ORIGIN
    table = pd.DataFrame(rows, columns=["position", "phase", "microbatch", "scope", "op", "occurrence", "inputs",
                                        "outputs"])
    return OperationOrigin(verdict=verdict, origin=origin, first_affected=first_affected, aligned=len(aligned),
                           only_a=only_a, only_b=only_b, downstream=downstream, differing_inputs=differing,
                           operations=table)


def _overall(statuses: list[str]) -> str:
    """'differ' if any tensor differs, 'equal' if all are equal (or there are none), else 'unknown'."""
    if "differ" in statuses:
        return "differ"
    return "equal" if all(s == "equal" for s in statuses) else "unknown"


def _made_by(ops_a: dict[Key, _Merged], order_a: list[Key], ops_b: dict[Key, _Merged], order_b: list[Key],
             pairs: dict[Key, Key], a: _Merged, b: _Merged, index: int) -> tuple[Operation | None, OriginVerdict]:
    """The operation that made input ``index`` of the aligned pair (a, b) differ."""
    found = []
    paired_b = set(pairs.values())
    for ops, order, m, run in ((ops_a, order_a, a, "a"), (ops_b, order_b, b, "b")):
        fp = m.inputs[index][1]
        key = _producer(ops, order, m.seq, fp) if fp is not None else None
        if key is not None:
            aligned = key in pairs if run == "a" else key in paired_b
            found.append((aligned, _operation(ops[key], "both" if aligned else run)))
    unaligned = [op for is_aligned, op in found if not is_aligned]
    if unaligned:
        return unaligned[0], OriginVerdict.UNALIGNED
    if found:
        return found[0][1], OriginVerdict.UNALIGNED
    return None, OriginVerdict.UNTRACED
