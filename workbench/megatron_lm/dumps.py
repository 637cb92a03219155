"""Megatron-LM's tensor dumps read into a run store whose sites line up with a recorded run's.

Megatron-LM (``megatron.training``, megatron-core 0.17+) writes, every N iterations of its flags
``--save-{activations,dgrads,wgrads,params}-interval``, one ``torch.save`` file per model-parallel rank:

    {save}/{activations|dgrads|wgrads|params}/iter_{N:07d}/mp_rank_{tp:02d}[_{pp:03d}][_{ep:03d}].pth
    {"model_chunk{i}": {"<module>/input{k}" | "<module>/output{k}" | "<module>/<kwarg>": tensor}}   activations
    {"model_chunk{i}": {"<module>/output{k}" | "<module>/input{k}": gradient}}                       dgrads
    {"model_chunk{i}": {"<parameter>": tensor}}                                                    wgrads, params

``import_megatron_dumps(save_dir, run_dir)`` turns a folder of them into a run store:

* **When.** ``iter_N`` is 1-based: activations, dgrads and wgrads of ``iter_N`` were taken during step N-1;
  params after step N-1's update, so they are the parameters step N starts from (the recorder's ``param``
  at step N).
* **Names.** Each tensor gets the recorder's canonical site name (``workbench.sites``: global layer numbers
  from the pipeline split, global expert numbers, no wrapper prefixes):

      params  <parameter>                        param:<parameter>
      wgrads  <parameter> (main_grad, reduced)   grad:<parameter>
      activations <module>/output0               act:<module>, but
                  .../self_attention/linear_proj/output0     act:layers.N.self_attention  (what the attention
                  .../mlp/linear_fc2/output0                 act:layers.N.mlp              block and the MLP return)
      activations <module>/input{k}, /output{k>0}, /<kwarg>  act:<module>/input{k}, ...    (inputs kept apart)
      dgrads      <module>/output{k}, /input{k}  act_grad: the same names (the gradient of that tensor)

  A module's inputs come before its outputs in the forward's execution order (the order Megatron's hooks
  filled the file in), so the first differing site of two imports names the first module whose output
  differs while its inputs are equal; in the backward, a module's output gradient comes before its inputs'.
* **Shards.** The TP shards of a tensor are joined by the fingerprint's own rule: each element is keyed by
  its index in the full tensor (``Placement``), so the TP=2 shards of a column-parallel weight fingerprint
  exactly as the TP=1 weight does. Split over TP: the weights (and biases) of ``linear_qkv``, ``linear_fc1``,
  ``output_layer`` and ``word_embeddings`` along rows, of ``linear_proj`` and ``linear_fc2`` along columns;
  the outputs of the first group and the inputs of the second along features (with ``sequence_parallel``,
  the other activations along the sequence); anything else is a replica that TP rank 0 counts. With EP > 1,
  Megatron writes one file per EP rank: the experts' tensors are each rank's own, while the dense modules'
  are other data replicas (and non-expert wgrads are duplicated), so those are read from EP rank 0 only.
* **Tokens per expert** (``--save-tokens-per-expert-interval``: ``{save}/tokens_per_expert/rank{R}.jsonl``,
  one line per layer and iteration with each micro-batch's counts for the rank's local experts) come in as the
  recorder's MoE site ``act:layers.L.mlp.tokens_per_expert`` [micro-batches, experts], float32 as the
  recorder counts, at step ``iter`` - 1: ranks are placed in Megatron's default order (TP fastest, then EP,
  DP, PP), TP rank 0 of data-parallel replica 0 is read, each EP rank's experts at their global columns.
* **Router traces** (``--moe-routing-trace-path``, given as ``router_traces``) come in as the same
  ``tokens_per_expert`` site and ``act:layers.L.mlp.router/top_indices`` (``workbench.megatron_lm.router_traces``).
* **Statistics and fingerprints** are the recorder's (``workbench.recorder.kernels``); integer tensors
  (position ids) are taken as float64.
* **What a dump cannot show** goes into the manifest's ``imported.limits``: only the last micro-batch of each
  iteration (the hooks overwrite), one data-parallel replica, no context-parallel coordinate, and only the
  layers Megatron-LM hooks (linear layers and embeddings: not the norms, not the core attention).
* **Untrusted files.** Each file is read with ``workbench.untrusted.load_torch_tensors``: tensors only; a
  non-tensor argument that Megatron pickled into the dump is skipped (named in ``imported.skipped``), never
  built.

The import reads one file at a time and keeps only each site's statistics (13 numbers a step).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.errors import ImportFormatError
from workbench.importers.table import check_last_step, write_unlogged_scalars
from workbench.megatron_lm.router_traces import LIMITS as ROUTER_LIMITS
from workbench.megatron_lm.router_traces import layer_record, read_router_traces, router_trace_files
from workbench.recorder.kernels import accumulate, new_accumulators
from workbench.recorder.placement import Placement, activation_placement, whole
from workbench.sites import SITE_KINDS, canonical_name, layer_of, site_id, split_site
from workbench.statistics import PRECISION_LIMITS, assemble, pack_fingerprints
from workbench.store import layout
from workbench.store.manifest import ParallelLayout, RunManifest, new_run_id, store_attributes
from workbench.store.writer import SiteInfo, create_sites_group, create_store, set_status, write_site_rows
from workbench.store.writer_lock import holding
from workbench.untrusted import SkippedObject, load_torch_tensors

DUMP_KINDS: tuple[str, ...] = ("params", "activations", "dgrads", "wgrads")
"""The dump folders, in the order an iteration's files are read (the parameters first: their dtype is the
run's precision)."""
_SITE_KIND = {"params": "param", "activations": "act", "dgrads": "act_grad", "wgrads": "grad"}
_ITERATION = re.compile(r"^iter_(\d{7})$")
_RANK_FILE = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?\.pth$")
_CHUNK = re.compile(r"^model_chunk(\d+)$")
_LOCAL_LAYER = re.compile(r"(?:^|\.)decoder\.layers\.(\d+)(?=\.|/|$)")
_LOCAL_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)(?=\.|/|$)")
_KEY = re.compile(r"^(?P<module>[^/]+)/(?P<what>.+)$")

_COLUMN_PARALLEL = ("linear_qkv", "linear_fc1", "output_layer", "word_embeddings")
"""Modules whose weight rows and output features are split over TP ranks (their input is a replica)."""
_ROW_PARALLEL = ("linear_proj", "linear_fc2")
"""Modules whose weight columns and input features are split over TP ranks (their output is a replica)."""
_BLOCK_OUTPUTS = {"linear_proj": "self_attention", "linear_fc2": "mlp"}
"""A layer's linears whose output0 is what its attention block or MLP returns: the recorder's module site."""

LIMITS: tuple[str, ...] = (
    "the last micro-batch of each iteration only (Megatron-LM's hooks overwrite each micro-batch's tensors)",
    "one data-parallel replica (the files of expert-data-parallel rank 0); the data-parallel size is unknown",
    "no context-parallel coordinate",
    "only the modules Megatron-LM hooks (linear layers, embeddings and routers): no norms, no core attention",
    "dgrads are the gradients of data-parallel rank 0's share of the batch (not scaled by 1/dp)",
)


@dataclass(frozen=True)
class DumpFile:
    """One rank's file of one dump kind at one iteration."""

    kind: str
    iteration: int
    tp: int
    pp: int
    ep: int
    path: Path

    @property
    def step(self) -> int:
        """The step whose tensors it holds: params are the next step's start (see the module docstring)."""
        return self.iteration if self.kind == "params" else self.iteration - 1


@dataclass(frozen=True)
class DumpLayout:
    """The parallel split the files were written under, read off their names and contents."""

    tp: int
    pp: int
    ep: int
    layer_offsets: Mapping[tuple[int, int], int]
    """(pipeline rank, model chunk) -> the global number of that chunk's first layer."""
    experts_per_rank: int = 0
    sequence_parallel: bool = False

    @property
    def vp(self) -> int | None:
        chunks = {chunk for _, chunk in self.layer_offsets}
        return len(chunks) if len(chunks) > 1 else None

    def global_layers(self, pp: int, chunk: int, local: Iterable[int]) -> dict[int, int]:
        offset = self.layer_offsets.get((pp, chunk), 0)
        return {i: offset + i for i in local}


@dataclass
class _Accumulated:
    """Each site's statistics and fingerprint lanes at each step, as the files are read."""

    precision: str | None = None
    sums: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    order: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    shape: dict[str, tuple[int, ...]] = field(default_factory=dict)
    shaped_by: dict[str, Path] = field(default_factory=dict)
    """The file whose piece of a site first gave its full shape (every other piece must agree with it)."""
    dtype: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def find_dumps(save_dir: str | Path, *, ep: int | None = None, required: bool = True) -> list[DumpFile]:
    """Every dump file under ``save_dir`` (Megatron-LM's ``--save`` folder, or one of its dump folders), in
    iteration order. A file name with one rank suffix is read as the pipeline rank unless ``ep`` > 1 says it is
    the expert rank. ``ImportFormatError`` for a folder without dumps or an iteration that lacks a rank's file."""
    root = Path(save_dir)
    if not root.is_dir():
        raise ImportFormatError(f"{root}: not a folder (Megatron-LM's --save folder, which holds activations/, "
                                "dgrads/, wgrads/ or params/)")
    folders = [(kind, root / kind) for kind in DUMP_KINDS if (root / kind).is_dir()]
    if not folders and root.name in DUMP_KINDS:
        folders = [(root.name, root)]
    files = [file for kind, folder in folders for file in _files_of(kind, folder, ep)]
    if not files and not required:
        return []
    if not files:
        raise ImportFormatError(f"{root}: no Megatron-LM tensor dumps (expected {'/, '.join(DUMP_KINDS)}/ "
                                "holding iter_NNNNNNN/mp_rank_NN.pth, from --save-*-interval)")
    _check_complete(files)
    return sorted(files, key=lambda f: (f.step, DUMP_KINDS.index(f.kind), f.pp, f.ep, f.tp))


def _files_of(kind: str, folder: Path, ep: int | None) -> Iterator[DumpFile]:
    for iteration_dir in sorted(folder.iterdir()):
        match = _ITERATION.match(iteration_dir.name)
        if not match or not iteration_dir.is_dir():
            continue
        for path in sorted(iteration_dir.iterdir()):
            name = _RANK_FILE.match(path.name)
            if name is None:
                raise ImportFormatError(f"{path}: not a dump file of Megatron-LM's naming "
                                        "(mp_rank_TT[_PPP][_EEE].pth)")
            tp, first, second = int(name.group(1)), name.group(2), name.group(3)
            if second is not None:
                pp, expert = int(first), int(second)
            elif first is not None and (ep or 1) > 1:
                pp, expert = 0, int(first)
            else:
                pp, expert = int(first or 0), 0
            yield DumpFile(kind, int(match.group(1)), tp, pp, expert, path)


def _check_complete(files: list[DumpFile]) -> None:
    """Every (kind, iteration) has the file of every rank the folder shows."""
    ranks = {(f.tp, f.pp, f.ep) for f in files}
    sizes = tuple(max(r[i] for r in ranks) + 1 for i in range(3))
    expected = {(t, p, e) for t in range(sizes[0]) for p in range(sizes[1]) for e in range(sizes[2])}
    by_dump: dict[tuple[str, int], set[tuple[int, int, int]]] = {}
    for f in files:
        by_dump.setdefault((f.kind, f.iteration), set()).add((f.tp, f.pp, f.ep))
    for (kind, iteration), present in sorted(by_dump.items()):
        missing = sorted(expected - present)
        if missing:
            t, p, e = missing[0]
            raise ImportFormatError(f"{kind}/iter_{iteration:07d}: the file of TP rank {t}, PP rank {p}, EP rank "
                                    f"{e} is missing ({len(missing)} of {len(expected)} files), so its tensors "
                                    "cannot be joined; copy the dump again")


def dump_layout(files: list[DumpFile], *, sequence_parallel: bool = False) -> DumpLayout:
    """The layout of ``files``: sizes from the file names, the pipeline's layer split from the number of
    layers each rank's chunks hold in the first iteration (Megatron's interleaved order where chunks are
    several, which needs an even split)."""
    if not files:  # tokens-per-expert logs alone
        return DumpLayout(tp=1, pp=1, ep=1, layer_offsets={(0, 0): 0}, sequence_parallel=sequence_parallel)
    first = min(f.iteration for f in files)
    kind = next(k for k in DUMP_KINDS if any(f.kind == k for f in files))
    counts: dict[tuple[int, int], int] = {}
    experts = 0
    for f in files:
        if f.kind != kind or f.iteration != first or f.tp != 0 or f.ep != 0:
            continue
        for chunk, keys in _chunks(_load(f)[0], f.path):
            layers = _indices(_LOCAL_LAYER, keys)
            counts[(f.pp, chunk)] = max(layers) + 1 if layers else 0
            local_experts = _indices(_LOCAL_EXPERT, keys)
            experts = max(experts, max(local_experts) + 1 if local_experts else 0)
    pp = max(f.pp for f in files) + 1
    chunks = sorted({c for _, c in counts})
    offsets: dict[tuple[int, int], int] = {}
    if len(chunks) <= 1:
        total = 0
        for stage in range(pp):
            offsets[(stage, 0)] = total
            total += counts.get((stage, 0), 0)
    else:
        sizes = set(counts.values())
        if len(sizes) != 1:
            raise ImportFormatError(f"the virtual pipeline's chunks hold unequal numbers of layers "
                                    f"({dict(sorted(counts.items()))}): the global layer numbers cannot be told "
                                    "from the files")
        per_chunk = sizes.pop()
        offsets = {(stage, chunk): chunk * pp * per_chunk + stage * per_chunk for stage, chunk in counts}
    return DumpLayout(tp=max(f.tp for f in files) + 1, pp=pp, ep=max(f.ep for f in files) + 1,
                      layer_offsets=offsets, experts_per_rank=experts, sequence_parallel=sequence_parallel)


def _indices(pattern: re.Pattern[str], keys: Iterable[Any]) -> set[int]:
    """The numbers ``pattern``'s first group finds in ``keys`` (local layers, local experts)."""
    return {int(m.group(1)) for key in keys if (m := pattern.search(str(key)))}


def _load(f: DumpFile) -> tuple[Any, list[str]]:
    return load_torch_tensors(f.path, damaged=ImportFormatError)


def _chunks(content: Any, path: Path) -> list[tuple[int, Mapping[str, Any]]]:
    """The model chunks of one file's dict, checked to be Megatron-LM's layout of keys."""
    if not isinstance(content, Mapping) or not content:
        raise ImportFormatError(f"{path}: not a Megatron-LM dump (a dict of model_chunkN -> tensors expected, "
                                f"found {type(content).__name__})")
    chunks = []
    for key, value in content.items():
        match = _CHUNK.match(str(key))
        if match is None or not isinstance(value, Mapping):
            raise ImportFormatError(f"{path}: not a Megatron-LM dump: its key {str(key)[:60]!r} is not "
                                    "model_chunkN holding a dict of tensors")
        chunks.append((int(match.group(1)), value))
    return chunks


# -- names and placements --------------------------------------------------------------------------------------


def site_name(kind: str, key: str, global_layer: Mapping[int, int], first_expert: int = 0) -> str:
    """The site of one dump entry (see the module docstring): ``kind`` a dump kind, ``key`` its key."""
    site_kind = _SITE_KIND[kind]
    if kind in ("params", "wgrads"):
        return site_id(site_kind, canonical_name(key, global_layer, first_expert))
    match = _KEY.match(key)
    if match is None:
        raise ImportFormatError(f"{key!r}: not a module's input, output or argument (MODULE/inputK, "
                                "MODULE/outputK or MODULE/ARGUMENT)")
    module, what = canonical_name(match.group("module"), global_layer, first_expert), match.group("what")
    if what != "output0":
        return site_id(site_kind, f"{module}/{what}")
    parent, _, leaf = module.rpartition(".")
    block = _BLOCK_OUTPUTS.get(leaf)
    if block is not None and parent.endswith(f".{block}") and layer_of(parent) is not None \
            and parent.count(".") == 2:
        return site_id(site_kind, parent)
    return site_id(site_kind, module)


def _leaf_module(key: str) -> str:
    """The module a parameter or an entry belongs to (its last module name)."""
    module = key.split("/")[0]
    parts = module.split(".")
    return parts[-2] if "/" not in key and len(parts) > 1 else parts[-1]


def placement(kind: str, key: str, shape: tuple[int, ...], *, tp_rank: int, dump: DumpLayout) -> Placement:
    """Where one rank's tensor sits in the full tensor (the fingerprint's index), by the split rules of the
    module docstring."""
    tp, leaf = dump.tp, _leaf_module(key)
    what = key.partition("/")[2]
    if kind in ("params", "wgrads") or what in ("weight", "bias"):  # a parameter, or one passed as an argument
        parameter = what or key.rsplit(".", 1)[-1]
        dim = 0 if leaf in _COLUMN_PARALLEL and parameter in ("weight", "bias") else \
            (len(shape) - 1 if leaf in _ROW_PARALLEL and parameter == "weight" else None)
        return _split(shape, dim, tp_rank, tp)
    if what == "output1":  # the bias a Megatron linear returns apart: a column-parallel one is split
        return _split(shape, 0 if leaf in _COLUMN_PARALLEL else None, tp_rank, tp)
    linear = leaf in _COLUMN_PARALLEL or leaf in _ROW_PARALLEL
    if not linear or len(shape) < 2 or not what.startswith(("input", "output")):
        return whole(shape, contributes=tp_rank == 0)
    split_features = tp > 1 and ((leaf in _COLUMN_PARALLEL and what == "output0") or
                                 (leaf in _ROW_PARALLEL and what == "input0"))
    split_sequence = tp > 1 and dump.sequence_parallel and not split_features
    return activation_placement(shape, sample_offset=0, global_batch=shape[1],
                                feature_shard=(tp_rank, tp) if split_features else None, tp_rank=tp_rank,
                                seq_shard=(tp_rank, tp) if split_sequence else None)


def _split(shape: tuple[int, ...], dim: int | None, rank: int, size: int) -> Placement:
    if dim is None or size == 1 or not shape:
        return whole(shape, contributes=rank == 0)
    full, offsets = list(shape), [0] * len(shape)
    full[dim] *= size
    offsets[dim] = rank * shape[dim]
    return Placement(full_shape=tuple(full), dims=tuple(range(len(shape))), offsets=tuple(offsets))


def _position(kind: str, name: str, index: int) -> tuple[int, int]:
    """Where a site sits in its kind's execution order: by global layer (embedding before, final norm and
    output layer after), then the order Megatron's hooks filled the file in; the backward runs the other way."""
    layer = layer_of(name)
    rank = layer if layer is not None else (-1 if name.startswith("embedding") else 1 << 30)
    return (-rank, index) if kind == "act_grad" else (rank, index)


# -- the import ---------------------------------------------------------------------------------------------------


@holding("workbench import-megatron-dumps", "run_dir")
def import_megatron_dumps(save_dir: str | Path, run_dir: str | Path, *, name: str | None = None,
                          ep: int | None = None, sequence_parallel: bool = False, precision: str | None = None,
                          router_traces: str | Path | None = None, experts: int | None = None,
                          tp: int | None = None, pp: int | None = None,
                          progress: Callable[[str], None] | None = None) -> Path:
    """Write a run store from the Megatron-LM dumps under ``save_dir`` (see the module docstring); returns its
    folder. ``precision`` (default: the parameters' or activations' dtype) sets the underflow and overflow
    limits; ``router_traces`` is a ``--moe-routing-trace-path`` folder to read too, ``experts`` the number of
    experts it routes to (default: the dumps' experts where they hold expert layers, else the largest index seen
    + 1); ``tp`` and ``pp`` give the layout where no dump file tells it (router traces or tokens-per-expert logs
    alone); ``progress`` is told about each iteration read (default: a line on stderr)."""
    save_dir, run_dir = Path(save_dir), Path(run_dir)
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    tokens = tokens_per_expert_files(save_dir) if save_dir.is_dir() else {}
    traces = router_trace_files(Path(router_traces)) if router_traces is not None else {}
    if router_traces is not None and not traces:
        raise ImportFormatError(f"{router_traces}: no router traces (router_trace_rankR.jsonl, from "
                                "--moe-routing-trace-path)")
    files = find_dumps(save_dir, ep=ep, required=not tokens and not traces)
    dump = dump_layout(files, sequence_parallel=sequence_parallel)
    if files and (tp, pp) != (None, None) and (tp or dump.tp, pp or dump.pp) != (dump.tp, dump.pp):
        raise ImportFormatError(f"{save_dir}: the dumps were written at TP={dump.tp}, PP={dump.pp}, not the "
                                f"TP={tp or dump.tp}, PP={pp or dump.pp} given")
    if not files:
        if (pp or 1) > 1:
            raise ImportFormatError(f"{save_dir}: with PP={pp} the layer numbers in the logs are each stage's own, "
                                    "and without the dumps the stages' first layers are unknown: import the logs "
                                    "with the run's dumps (any one kind, e.g. --save-params-interval)")
        dump = DumpLayout(tp=tp or 1, pp=1, ep=ep or 1, layer_offsets={(0, 0): 0},
                          sequence_parallel=sequence_parallel)
    found = _Accumulated(precision=precision)
    start, total_bytes, iterations = time.perf_counter(), 0, sorted({f.iteration for f in files})
    for i, iteration in enumerate(iterations):
        batch = [f for f in files if f.iteration == iteration]
        size = sum(f.path.stat().st_size for f in batch)
        for f in batch:
            _read(f, dump, found)
        total_bytes += size
        elapsed = time.perf_counter() - start
        say(f"iter_{iteration:07d} ({i + 1}/{len(iterations)}): {len(batch)} files, {size / 1e6:.1f} MB; "
            f"{total_bytes / 1e6 / max(elapsed, 1e-9):.0f} MB/s so far")
    if tokens:
        size = _read_tokens_per_expert(tokens, dump, found)
        say(f"tokens_per_expert: {len(tokens)} rank logs, {size / 1e6:.1f} MB")
    routing = None
    if traces:
        model_experts = experts or dump.experts_per_rank * dump.ep or None  # given, or the dumps' expert layers
        read = read_router_traces(traces, tp=dump.tp, pp=dump.pp, layer_offsets=dump.layer_offsets,
                                  sequence_parallel=sequence_parallel, experts=model_experts)
        for step, site, value, where, order in read["pieces"]:
            _add(found, step, site, value, where, order)
        found.skipped.update(read["skipped"])
        routing = {"files": len(traces), "folder": str(router_traces), "experts": read["experts"],
                   "irregular_steps": read["irregular_steps"]}
        say(f"router traces: {len(traces)} rank files, {read['bytes'] / 1e6:.1f} MB, {read['experts']} experts")
    _write(run_dir, name or run_dir.name, save_dir, files, dump, found, tokens=len(tokens), routing=routing)
    return run_dir


def _read(f: DumpFile, dump: DumpLayout, found: _Accumulated) -> None:
    content, skipped_classes = _load(f)
    site_kind = _SITE_KIND[f.kind]
    for chunk, entries in _chunks(content, f.path):
        local = _indices(_LOCAL_LAYER, entries)
        global_layer = dump.global_layers(f.pp, chunk, local)
        for index, (key, value) in enumerate(entries.items()):
            key = str(key)
            expert = _LOCAL_EXPERT.search(key) is not None
            if f.ep != 0 and not expert:
                continue  # another data replica (activations) or a duplicate (wgrads): EP rank 0's counts
            if not isinstance(value, torch.Tensor):
                if value is not None:
                    what = value.asked_for if isinstance(value, SkippedObject) else type(value).__name__
                    found.skipped.setdefault(f"{f.kind}: {key}", what)
                continue
            site = site_name(f.kind, key, global_layer, f.ep * dump.experts_per_rank)
            _accumulate(found, f, dump, site, site_kind, key, value, index)
    del content, skipped_classes


def _accumulate(found: _Accumulated, f: DumpFile, dump: DumpLayout, site: str, site_kind: str, key: str,
                value: torch.Tensor, index: int) -> None:
    if found.precision is None and value.is_floating_point() and f.kind in ("params", "activations"):
        found.precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(value.dtype, "fp32")
    where = placement(f.kind, key, tuple(value.shape), tp_rank=f.tp, dump=dump)
    name = split_site(site)[1]
    _add(found, f.step, site, value, where, (SITE_KINDS.index(site_kind), *_position(site_kind, name, index), f.pp),
         source=f.path)


def _add(found: _Accumulated, step: int, site: str, value: torch.Tensor, where: Placement,
         order: tuple[int, int, int, int], *, source: Path | None = None) -> None:
    """One piece of a site's tensor at a step, into its accumulators (a replica that does not count: only its
    shape). With the dump file ``source``: ``ImportFormatError`` naming both files when the piece makes a tensor
    of another shape than the site's first piece from a dump file made (ranks' shards that disagree, or a tensor
    whose shape changes between steps). Counts and router traces, whose shapes may vary, are not checked."""
    if site not in found.order:
        found.order[site] = order
        found.shape[site], found.dtype[site] = where.full_shape, str(value.dtype).removeprefix("torch.")
    if source is None:
        pass
    elif site not in found.shaped_by:
        found.shaped_by[site] = source
    elif where.full_shape != found.shape[site]:
        raise ImportFormatError(f"{source}: its piece of {site} {tuple(value.shape)} makes a tensor of shape "
                                f"{where.full_shape}, where {found.shaped_by[site]} made {found.shape[site]}: "
                                "the files do not belong to one run")
    if not where.contributes:
        return
    x = value if value.is_floating_point() and value.element_size() in (2, 4, 8) else value.double()
    acc, lanes = found.sums.get((step, site)) or new_accumulators(torch.device("cpu"))
    found.sums[(step, site)] = (acc, lanes)
    tiny, largest = PRECISION_LIMITS[found.precision or "fp32"]
    accumulate(x, where.coords(torch.device("cpu")), tiny, largest, acc, lanes)


# -- tokens per expert ------------------------------------------------------------------------------------------

_TPE_FILE = re.compile(r"^rank(\d+)\.jsonl$")


def tokens_per_expert_files(save_dir: Path) -> dict[int, Path]:
    """``{save}/tokens_per_expert/rank{R}.jsonl`` (``--save-tokens-per-expert-interval``), by global rank."""
    folder = save_dir / "tokens_per_expert"
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): path for path in sorted(folder.iterdir()) if (m := _TPE_FILE.match(path.name))}


def _read_tokens_per_expert(files: dict[int, Path], dump: DumpLayout, found: _Accumulated) -> int:
    """Each rank's counts as ``act:layers.L.mlp.tokens_per_expert`` [micro-batches, experts] (float32, as the
    recorder counts), at the step before ``iter``. Ranks follow Megatron's default order (TP fastest, then EP,
    DP, PP; no CP): TP rank 0 of data-parallel replica 0 is read, each EP rank's local experts at their global
    columns. Returns the bytes read."""
    world = max(files) + 1
    tp, ep, pp = dump.tp, dump.ep, dump.pp
    if world % (tp * ep * pp):
        raise ImportFormatError(f"tokens_per_expert/: {world} rank files cannot be split into TP={tp}, EP={ep}, "
                                f"PP={pp}")
    if dump.vp:
        raise ImportFormatError("tokens_per_expert/ with a virtual pipeline: its local layer numbers cannot be "
                                "told apart by chunk")
    dp = world // (tp * ep * pp)
    for rank, path in sorted(files.items()):
        tp_rank, ep_rank, dp_rank, pp_rank = rank % tp, (rank // tp) % ep, (rank // (tp * ep)) % dp, \
            rank // (tp * ep * dp)
        if tp_rank or dp_rank:
            continue
        for number, line in enumerate(_text_lines(path), 1):
            if not line.strip():
                continue
            entry = _tpe_entry(line, f"{path}:{number}")
            if entry.get("block") != "decoder":
                found.skipped.setdefault(f"tokens_per_expert: block {entry.get('block')!r}", "not a decoder layer")
                continue
            counts = torch.tensor(entry["tpe"], dtype=torch.float32)
            layer = dump.layer_offsets.get((pp_rank, 0), 0) + int(entry["layer"])
            local = counts.shape[1]
            where = Placement(full_shape=(counts.shape[0], local * ep), dims=(0, 1), offsets=(0, ep_rank * local))
            _add(found, int(entry["iter"]) - 1, f"act:layers.{layer}.mlp.tokens_per_expert", counts, where,
                 (SITE_KINDS.index("act"), layer, 1 << 20, pp_rank))
    return sum(path.stat().st_size for path in files.values())


def _text_lines(path: Path) -> Iterator[str]:
    """The lines of ``path``, read one at a time; ``ImportFormatError`` naming the line that is not UTF-8 text."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ImportFormatError(f"{path}:{number}: not UTF-8 text; a tokens-per-expert log is JSON "
                                        "lines") from None


def _tpe_entry(line: str, where: str) -> dict[str, Any]:
    """One line of a tokens-per-expert log, checked: ``iter`` >= 1, ``layer`` >= 0, ``tpe`` a rectangle of
    counts (one row per micro-batch)."""
    return layer_record(line, where, step="iter", first_step=1, rows="tpe",
                        expected='tokens-per-expert record ({"iter": N >= 1, "block", "layer": L >= 0, "tpe": '
                        '[[counts] per micro-batch]}')


def _site_info(site: str, order: int, found: _Accumulated) -> SiteInfo:
    kind, name = split_site(site)
    layer = layer_of(name)
    return SiteInfo(site=site, kind=kind, name=name, layer=-1 if layer is None else layer, order=order,
                    shape="x".join(map(str, found.shape[site])), dtype=found.dtype[site],
                    numel=int(np.prod(found.shape[site], dtype=np.int64)))


def _write(run_dir: Path, name: str, save_dir: Path, files: list[DumpFile], dump: DumpLayout,
           found: _Accumulated, *, tokens: int = 0, routing: dict[str, Any] | None = None) -> None:
    if not found.order:
        raise ImportFormatError(f"{save_dir}: the dumps hold no tensors")
    sites = sorted(found.order, key=lambda s: (found.order[s], s))
    steps = sorted({step for step, _ in found.sums})
    check_last_step(steps[-1], len(steps), f"{save_dir}: the last iter_N folder's")  # a damaged iter_N name
    info = RunManifest(run_id=new_run_id(name), name=name, producer="import: megatron-lm dumps",
                       layout=ParallelLayout(tp=dump.tp, pp=dump.pp, vp=dump.vp, ep=dump.ep,
                                             sp=dump.sequence_parallel),
                       precision=found.precision)
    kinds = {kind: sorted({f.iteration for f in files if f.kind == kind}) for kind in DUMP_KINDS}
    create_store(run_dir, store_attributes(info, status=layout.Status.CREATED, imported={
        "format": "megatron-lm tensor dumps", "files": len(files), "save_dir": str(save_dir),
        "iterations": {kind: its for kind, its in kinds.items() if its}, "tokens_per_expert_logs": tokens,
        "steps": "activations, dgrads and wgrads of iter_N at step N-1; params of iter_N at step N",
        "limits": [*LIMITS, *(ROUTER_LIMITS if routing else ())], "skipped": dict(sorted(found.skipped.items())),
        **({"router_traces": routing} if routing else {})}), steps[-1] + 1)
    infos = [_site_info(site, i, found) for i, site in enumerate(sites)]
    create_sites_group(run_dir, steps, infos)
    column = {site: j for j, site in enumerate(sites)}
    for first in range(0, len(steps), layout.SITE_STEP_CHUNK):
        block = steps[first:first + layout.SITE_STEP_CHUNK]
        sums = np.zeros((len(block), len(sites), 8))
        maxes = np.full((len(block), len(sites), 3), -np.inf)
        lanes = np.zeros((len(block), len(sites), 2), dtype=np.int64)
        for row, step in enumerate(block):
            for site, j in column.items():
                entry = found.sums.get((step, site))
                if entry is not None:
                    acc, lane = entry
                    sums[row, j], maxes[row, j], lanes[row, j] = acc[:8].numpy(), acc[8:].numpy(), lane.numpy()
        write_site_rows(run_dir, first, assemble(sums, maxes), pack_fingerprints(lanes))
    write_unlogged_scalars(run_dir, steps[-1] + 1)
    set_status(run_dir, layout.Status.COMPLETE)
