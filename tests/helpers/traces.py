"""Made-up operation traces, built in execution order as the tracer records them."""

from __future__ import annotations

import pandas as pd

from workbench.store.op_trace import TracedTensor


def T(fp: str | None, shape: tuple[int, ...] = (4,), *, defined: bool = True) -> TracedTensor:
    return TracedTensor(shape, "float32", fp, 0, defined)


class Trace:
    """Builds a trace in execution order; occurrences are counted as the tracer counts them."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.counts: dict[tuple, int] = {}

    def op(self, scope: str, op: str, inputs: list, outputs: list, *, phase: str = "forward", mb: int = 0,
           tp_rank: int = 0, source: str | None = None) -> Trace:
        key = (tp_rank, phase, scope, op)
        self.rows.append({"seq": sum(1 for r in self.rows if r["tp_rank"] == tp_rank), "rank": tp_rank,
                          "tp_rank": tp_rank, "phase": phase, "microbatch": mb, "scope": scope, "op": op,
                          "occurrence": self.counts.get(key, 0), "node": None, "source": source,
                          "inputs": inputs, "outputs": outputs})
        self.counts[key] = self.counts.get(key, 0) + 1
        return self

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def common_trace(t: Trace) -> Trace:
    return t.op("embedding", "embedding", [T("tok"), T("w")], [T("e")]).op("layers.0", "add", [T("e"), T("e")],
                                                                           [T("h")])
