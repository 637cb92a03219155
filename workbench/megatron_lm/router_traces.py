"""Megatron's MoE router traces read as the recorder's routing sites.

``--moe-routing-trace-path DIR`` (megatron-core 0.19+, ``megatron/core/transformer/moe/router_trace.py``)
makes every rank append one JSON line per router call to ``DIR/router_trace_rank{R}.jsonl``:

    {"step": 0, "stage": "pre_dispatch", "block": "decoder", "layer": 3, "rank": 0,
     "num_tokens": 128, "topk": 2, "top_indices": [[12, 45], ...]}     [num_tokens, topk], global expert ids

``step`` is the 0-based iteration ``train_step`` passes to the tracer (the recorder's step); ``layer`` is the
layer's number on its pipeline stage; one line per micro-batch and layer, the tokens in the router's order
(sequence, then sample). Each line comes in as two sites of ``layers.L.mlp`` (L global):

    act:layers.L.mlp.tokens_per_expert   float32 [micro-batches, experts]: the tokens routed to each expert,
                                         counted as the recorder counts them, so a trace lines up with a
                                         recorded run of the same model
    act:layers.L.mlp.router/top_indices  int32 [micro-batches, tokens, topk]: which experts each token chose,
                                         bitwise (two runs whose counts agree can still route other tokens)

A rank's micro-batch is row ``replica * micro-batches per replica + k`` (the recorder's numbering: data
replicas hold consecutive shares of the global batch); ranks follow Megatron's default order (TP fastest, then
CP, EP and DP, PP last), and every rank of a tensor-parallel group routes the same tokens, so TP rank 0 is
read (with sequence parallelism each TP rank routes its own part of the sequence: all are read, each at its
tokens). The number of experts is the largest index seen + 1 unless given.

Foreign files are checked before they size anything: the rank files must be ranks 0 to N - 1; a line's ``rank``,
``num_tokens`` and ``topk`` must agree with its file and its ``top_indices``; expert ids must be below the model's
number of experts (``MAX_EXPERTS`` where it is not given), layers below ``MAX_LAYERS``, and the last step within
``importers.table.MAX_UNLOGGED_STEPS`` of the lines read. The sidecar files of hidden states, logits and router
weights are not read; MTP heads' records are skipped and named.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from workbench.errors import ImportFormatError
from workbench.importers.table import check_last_step
from workbench.recorder.placement import Placement
from workbench.sites import SITE_KINDS

_TRACE_FILE = re.compile(r"^router_trace_rank(\d+)\.jsonl$")

MAX_EXPERTS = 1 << 14
"""The most experts a trace is read for when the model's number is not given: the largest MoE models route to a
few hundred, and a damaged expert id must not size every line's counts."""
MAX_LAYERS = 1 << 14
"""The most layers a trace's layer numbers may name."""

LIMITS: tuple[str, ...] = (
    "router traces: a step after an evaluation also holds the evaluation's router calls, and a recomputed "
    "forward calls each router again (Megatron stamps them with the step): a step with more calls than most "
    "keeps its last ones, and is named in router_traces.irregular_steps",
)


def router_trace_files(trace_dir: Path) -> dict[int, Path]:
    """``DIR/router_trace_rank{R}.jsonl`` by global rank (DIR is ``--moe-routing-trace-path``)."""
    if not trace_dir.is_dir():
        return {}
    return {int(m.group(1)): path for path in sorted(trace_dir.iterdir()) if (m := _TRACE_FILE.match(path.name))}


def read_router_traces(files: Mapping[int, Path], *, tp: int, pp: int, layer_offsets: Mapping[tuple[int, int], int],
                       sequence_parallel: bool = False, experts: int | None = None) -> dict[str, Any]:
    """The routing sites of every rank's trace (see the module docstring), as ``{"pieces": iterator of (step, site,
    tensor, placement, order), "experts", "irregular_steps", "skipped", "bytes"}``; ``layer_offsets`` maps
    (pipeline rank, chunk 0) to the stage's first global layer. Every number a line holds is checked before
    anything is sized by it (``_check_line``): ``ImportFormatError`` naming the file, the line and the field."""
    world = _world(files)
    if world % (tp * pp):
        raise ImportFormatError(f"router traces: {world} rank files cannot be split into TP={tp}, PP={pp}")
    replicas = world // (tp * pp)
    calls: dict[tuple[int, int, int], list[torch.Tensor]] = {}  # (rank, step, global layer) -> micro-batches
    skipped: dict[str, str] = {}
    lines, last_step, last_where = 0, -1, ""
    for rank, path in sorted(files.items()):
        tp_rank, pp_rank = rank % tp, rank // (tp * replicas)
        if tp_rank and not sequence_parallel:
            continue  # the same tokens as TP rank 0
        with path.open("rb") as trace:  # a line at a time: a trace may be far larger than memory
            for number, line in enumerate(trace, 1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                entry = _entry(line, where)
                if entry.get("block") != "decoder" or "mtp_idx" in entry:
                    skipped.setdefault(f"router traces: block {repr(entry.get('block'))[:40]}", "not a decoder layer")
                    continue
                _check_line(entry, where, rank=rank, experts=experts)
                lines += 1
                if entry["step"] > last_step:
                    last_step, last_where = entry["step"], where
                layer = layer_offsets.get((pp_rank, 0), 0) + entry["layer"]
                calls.setdefault((rank, entry["step"], layer), []).append(entry["top_indices"])
    if not calls:
        raise ImportFormatError("router traces: no decoder layer's router call in "
                                f"{', '.join(str(p) for p in files.values())}")
    check_last_step(last_step, lines, f"{last_where}: \"step\"")
    count = experts or 1 + max(int(t.max()) for ts in calls.values() for t in ts if t.numel())
    per_rank = Counter(len(ts) for ts in calls.values()).most_common(1)[0][0]
    irregular = sorted({step for (_, step, _), ts in calls.items() if len(ts) != per_rank})
    return {"pieces": _pieces(calls, count=count, per_rank=per_rank, replicas=replicas, tp=tp,
                              sequence_parallel=sequence_parallel),
            "experts": count, "irregular_steps": irregular, "skipped": skipped,
            "bytes": sum(path.stat().st_size for path in files.values())}


def _pieces(calls: Mapping[tuple[int, int, int], list[torch.Tensor]], *, count: int, per_rank: int, replicas: int,
            tp: int, sequence_parallel: bool) -> Iterator[tuple[int, str, torch.Tensor, Placement, tuple[int, ...]]]:
    """Each call's two sites, one at a time: a call's counts [1, experts] are made when it is taken, never all at
    once."""
    rows = replicas * per_rank
    for (rank, step, layer), micro_batches in sorted(calls.items()):
        tp_rank, replica, pp_rank = rank % tp, (rank // tp) % replicas, rank // (tp * replicas)
        for k, indices in enumerate(micro_batches[-per_rank:]):  # an evaluation's calls come first
            row = replica * per_rank + k
            order = (SITE_KINDS.index("act"), layer, 1 << 20, pp_rank)
            if tp_rank == 0:
                counts = torch.bincount(indices.reshape(-1).long(), minlength=count).to(torch.float32).unsqueeze(0)
                yield (step, f"act:layers.{layer}.mlp.tokens_per_expert", counts,
                       Placement(full_shape=(rows, count), dims=(0, 1), offsets=(row, 0)), order)
            share = indices.shape[0]
            tokens = share * (tp if sequence_parallel else 1)
            yield (step, f"act:layers.{layer}.mlp.router/top_indices", indices.unsqueeze(0),
                   Placement(full_shape=(rows, tokens, indices.shape[1]), dims=(0, 1, 2),
                             offsets=(row, tp_rank * share if sequence_parallel else 0, 0)),
                   (order[0], layer, (1 << 20) + 1, pp_rank))


def _world(files: Mapping[int, Path]) -> int:
    """The number of ranks, checked: Megatron's tracer writes a file for every rank, 0 to world - 1."""
    world = len(files)
    beyond = sorted(rank for rank in files if rank >= world)
    if beyond:
        missing = sorted(set(range(world)) - set(files))
        raise ImportFormatError(f"{files[beyond[0]]}: rank {beyond[0]:,}, but the folder holds {world} rank files, "
                                f"and Megatron writes one for every rank from 0 (rank {missing[0]} is missing): copy "
                                "every rank's trace into the folder, or remove the stray file")
    return world


def _check_line(entry: dict[str, Any], where: str, *, rank: int, experts: int | None) -> None:
    """A decoder line's numbers checked against the model's (``experts`` when known), the file's own rank and the
    line's own ``top_indices``; ``ImportFormatError`` naming ``where`` and the field."""
    indices: torch.Tensor = entry["top_indices"]
    bound = experts or MAX_EXPERTS
    if indices.numel() and int(indices.max()) >= bound:
        said = f"{experts} (the model's: --experts, or the dumps' expert layers)" if experts else \
            f"the {MAX_EXPERTS:,} a trace is read for without --experts"
        raise ImportFormatError(f"{where}: \"top_indices\" routes to expert {int(indices.max()):,} of {said}; "
                                "the line is damaged, or pass the model's number of experts")
    if entry["layer"] >= MAX_LAYERS:
        raise ImportFormatError(f"{where}: \"layer\" {entry['layer']:,}: more than the {MAX_LAYERS:,} layers of "
                                "any model; the line is damaged")
    for field, expected in (("rank", rank), ("num_tokens", indices.shape[0]), ("topk", indices.shape[1])):
        if field in entry and entry[field] != expected and not (field == "topk" and not indices.shape[0]):
            raise ImportFormatError(f"{where}: \"{field}\" is {str(entry[field])[:40]}, but the line's file and "
                                    f"\"top_indices\" say {expected}; the line is damaged")


def _whole(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < 2**31


def layer_record(line: str | bytes, where: str, *, step: str, first_step: int, rows: str, expected: str,
                 empty: bool = False) -> dict[str, Any]:
    """One JSON line of Megatron's per-layer logs, checked: ``step`` a whole number >= ``first_step``,
    ``layer`` >= 0, ``rows`` a rectangle of whole numbers >= 0 (no rows at all where ``empty``);
    ``ImportFormatError`` naming ``where`` and the ``expected`` record otherwise."""
    try:
        entry = json.loads(line)
    except ValueError as err:
        raise ImportFormatError(f"{where}: not a JSON line ({err})") from None
    table = entry.get(rows) if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or not _whole(entry.get(step), first_step) or \
            not _whole(entry.get("layer"), 0) or not isinstance(table, list) or not (table or empty) or \
            not all(isinstance(r, list) and r for r in table) or len({len(r) for r in table}) > 1 or \
            not all(_whole(i, 0) for r in table for i in r):
        raise ImportFormatError(f"{where}: not a {expected} expected)")
    return entry


def _entry(line: bytes, where: str) -> dict[str, Any]:
    """One line of a router trace (``top_indices`` [num_tokens, topk] expert ids), with ``top_indices`` as an
    int32 tensor."""
    entry = layer_record(line, where, step="step", first_step=0, rows="top_indices", empty=True,
                         expected='router-trace record ({"step": N >= 0, "block", "layer": L >= 0, "top_indices": '
                         '[[expert ids] per token]}')
    rows = entry["top_indices"]
    entry["top_indices"] = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), len(rows[0]) if rows else 0)
    return entry
