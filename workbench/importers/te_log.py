"""Transformer Engine's debug statistics logs: read them, write them, import them as a run store.

Transformer Engine's debug tools (``nvdlfw_inspect`` with the ``LogTensorStats`` feature)
write one text file per rank, ``nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-<R>.log``,
with one line per logged value:

    2025-03-01 12:00:00,123 - INFO - decoder.1.mlp.fc1_activation_max \t\t\t\t iteration=000123 \t\t\t\t value=1.2346

that is ``<layer_name>_<tensor_name>_<stat> iteration=<int> value=<float>``. Other lines
(messages, other features' metrics) are skipped.

    table = read_te_log(["logs/nvdlfw_inspect_statistics_logs"])   # long table (importers.table)
    import_te_log(["logs/nvdlfw_inspect_statistics_logs"], "runs/te-a")  # a run store
    write_te_log("a.log", open_run("runs/a").records(), stats=("min", "max", "l2"))

Site mapping, reversible (a workbench site "kind:name" <-> TE layer name and tensor name):

    param:<module>.weight   <->  <module>, weight       act:<module>       <->  <module>, output
    grad:<module>.weight    <->  <module>, wgrad        act_grad:<module>  <->  <module>, gradient
    activation:<module>     <->  <module>, activation   dgrad:<module>     <->  <module>, dgrad
    any other kind:<name>   <->  <name>, workbench.<kind>   (biases, loss, optimizer state, updates)

TE's ``activation`` (a GEMM's input) and ``dgrad`` have no workbench kind; they are imported
as sites of kind ``activation`` and ``dgrad``. Sites TE has no tensor for get a tensor name
no TE feature writes (``workbench.exp_avg``), so other features' metrics, such as
``optimizer_exp_avg_num_zeros``, are never mistaken for them. Layer names lose ``module.`` and ``decoder.``
prefixes, so Megatron's ``decoder.layers.3.mlp.linear_fc1`` reads as ``layers.3.mlp.linear_fc1``.
Under pipeline parallelism each rank names its layers with local numbers: import such logs
one pipeline stage at a time.

Statistics: count <-> numel, sum <-> sum, sum_sq <-> l2_norm_square, min, max,
absmax <-> cur_amax, l2 <-> l2_norm; the workbench's nan, inf, zero, underflow and overflow
keep their names (TE's underflows%/overflows% count something else); TE statistics without
a workbench counterpart (mean, std, l1_norm, dynamic_range, ...) keep TE's names in the
table and count towards the fingerprint, but are not stored in a run store.

Precision: nvdlfw_inspect formats values with ``{:.4f}``, so a real TE log keeps four
decimals: values below 5e-5 read as 0 and a relative difference smaller than the rounding
is invisible. ``write_te_log`` writes the shortest exact form by default (``decimals=None``);
pass ``decimals=4`` to write what TE writes. Imports no torch.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from workbench.errors import ImportFormatError, LogNotFoundError
from workbench.importers.table import long_table, row_keys, write_run_from_table
from workbench.sites import SITE_KINDS, site_id, split_site, strip_wrappers
from workbench.store.records import RunRecords
from workbench.store.writer_lock import holding

FORMAT = "transformer_engine_debug_log"
TE_LOG_DIR = "nvdlfw_inspect_statistics_logs"
TE_LOG_GLOB = "nvdlfw_inspect*globalrank-*.log"
TE_TENSORS: tuple[str, ...] = ("activation", "weight", "output", "gradient", "wgrad", "dgrad")
DEFAULT_STATS: tuple[str, ...] = ("min", "max", "absmax", "l2")

_STAT_TO_TE = {"count": "numel", "sum": "sum", "sum_sq": "l2_norm_square", "min": "min", "max": "max",
               "absmax": "cur_amax", "l2": "l2_norm"}
_TE_TO_STAT = {te: stat for stat, te in _STAT_TO_TE.items()}
_WEIGHT_TENSOR = {"param": "weight", "grad": "wgrad"}  # kinds whose "<module>.weight" is a TE weight tensor
_MODULE_TENSOR = {"act": "output", "act_grad": "gradient"}
_TENSOR_KIND = {tensor: kind for kind, tensor in (*_WEIGHT_TENSOR.items(), *_MODULE_TENSOR.items())}
_OWN_TENSOR = "workbench."  # prefix of the tensor name of a site TE has no tensor for

_NUMBER = rb"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?))"
# One pass over the whole file. The optional prefix is the logging formatter's
# "<time> - <level> - "; anchoring at line starts keeps the scan fast (about 1 s per million lines).
_LINE = re.compile(rb"^(?:.* - )?(\S+)[ \t]+iteration=(\d+)[ \t]+value=(" + _NUMBER + rb")[ \t]*\r?$", re.M)
# The layer name is greedy, so a layer name containing "_output_" still splits at the last tensor name.
_TENSOR_NAMES = sorted({*TE_TENSORS, *(_OWN_TENSOR + k for k in SITE_KINDS)}, key=len, reverse=True)  # longest first
_KEY = re.compile(r"^(.+)_(" + "|".join(map(re.escape, _TENSOR_NAMES)) + r")_(.+)$")


def te_names(site: str) -> tuple[str, str]:
    """The TE (layer name, tensor name) of a workbench site (see the module docstring)."""
    kind, name = split_site(site)
    if kind in _WEIGHT_TENSOR and name.endswith(".weight"):
        return name.removesuffix(".weight"), _WEIGHT_TENSOR[kind]
    if kind in _MODULE_TENSOR:
        return name, _MODULE_TENSOR[kind]
    if kind in TE_TENSORS:
        return name, kind
    if kind in SITE_KINDS:
        return name, _OWN_TENSOR + kind
    raise ImportFormatError(f"site {site!r}: kind {kind!r} is neither a workbench site kind ({', '.join(SITE_KINDS)}) "
                     f"nor a Transformer Engine tensor ({', '.join(TE_TENSORS)})")


def site_of(layer_name: str, tensor_name: str) -> str:
    """The workbench site of a TE layer name and tensor name (the inverse of ``te_names``)."""
    name = strip_wrappers(layer_name).removeprefix("decoder.")
    kind = _TENSOR_KIND.get(tensor_name, tensor_name.removeprefix(_OWN_TENSOR))
    return site_id(kind, f"{name}.weight" if tensor_name in _WEIGHT_TENSOR.values() else name)


def te_log_path(root: str | Path, rank: int = 0) -> Path:
    """Where nvdlfw_inspect puts rank ``rank``'s statistics under its log folder ``root``."""
    return Path(root) / TE_LOG_DIR / f"nvdlfw_inspect_globalrank-{rank}.log"


def write_te_log(path: str | Path, records: RunRecords, stats: Sequence[str] = DEFAULT_STATS,
                 decimals: int | None = None) -> Path:
    """Write ``records``' ``stats`` in TE's log format (see the module docstring); returns the path.

    ``decimals=None`` writes each value's shortest exact form, so reading it back gives the same
    float64 bits; ``decimals=4`` rounds as nvdlfw_inspect does.
    """
    table = long_table(records, stats)
    key = row_keys(table, lambda site, stat: "_".join((*te_names(site), _STAT_TO_TE.get(stat, stat))))  # [row]
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    fmt = repr if decimals is None else f"{{:.{decimals}f}}".format
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        out.write(f"{stamp} - INFO - Default logging to file enabled at {path.parent}\n")
        out.writelines(f"{stamp} - INFO - {k} \t\t\t\t iteration={s:06d} \t\t\t\t value={fmt(v)}\n"
                       for k, s, v in zip(key, table["step"].tolist(), table["value"].tolist()))
    return path


def te_log_files(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The log files named by ``paths``: files as given, folders searched for every rank's log."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[Path] = []
    for item in map(Path, items):
        if item.is_file():
            files.append(item)
        elif item.is_dir():
            folder = item / TE_LOG_DIR if (item / TE_LOG_DIR).is_dir() else item
            found = sorted(folder.glob(TE_LOG_GLOB), key=_rank)
            if not found:
                raise LogNotFoundError(f"{item}: no {TE_LOG_GLOB} in this folder; pass the folder "
                                       f"nvdlfw_inspect logs to, its {TE_LOG_DIR}/, or the log files")
            files += found
        else:
            raise LogNotFoundError(f"{item}: no such file or folder; pass Transformer Engine debug logs "
                                   f"({TE_LOG_DIR}/nvdlfw_inspect_globalrank-<R>.log)")
    if not files:
        raise LogNotFoundError("no log files given; pass at least one Transformer Engine debug log")
    return files


def _rank(path: Path) -> tuple[int, str]:
    match = re.search(r"globalrank-(\d+)", path.name)
    return (int(match.group(1)) if match else -1, path.name)


def read_te_log(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """The statistics in TE debug logs as a long table (``workbench.importers.table``).

    ``paths``: log files or folders (every rank's log inside, in rank order). Rows keep the
    files' order. Lines that are not statistics are skipped; metric names in the statistics
    line format that name no known tensor (other features' metrics) are listed in
    ``table.attrs["skipped_keys"]``.
    """
    files = te_log_files(paths)
    parts = [_read_one(f) for f in files]
    frames = [frame for frame, _ in parts]
    table = frames[0] if len(frames) == 1 else pd.DataFrame({
        "step": np.concatenate([f["step"].to_numpy() for f in frames]),
        # pd.concat would turn categories that differ between files into plain objects
        "site": union_categoricals([f["site"] for f in frames]),
        "stat": union_categoricals([f["stat"] for f in frames]),
        "value": np.concatenate([f["value"].to_numpy() for f in frames]),
    })
    table.attrs["files"] = [str(f) for f in files]
    table.attrs["skipped_keys"] = sorted({k for _, skipped in parts for k in skipped})
    return table


def _read_one(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """One log's long table (categorical site and stat) and the metric names it could not map."""
    matches = _LINE.findall(path.read_bytes())
    if not matches:
        raise ImportFormatError(f"{path}: no statistics lines ('<layer>_<tensor>_<stat> iteration=<n> "
                                "value=<x>'); pass the nvdlfw_inspect_statistics_logs files that the "
                                "LogTensorStats feature writes, not the main nvdlfw_inspect log")
    # three comprehensions, not zip(*matches): unpacking a million-tuple argument list is several times slower
    keys, iterations, values = [m[0] for m in matches], [m[1] for m in matches], [m[2] for m in matches]
    key_code, unique_keys = pd.factorize(np.asarray(keys, dtype=object))
    # Only the few distinct metric names are split into layer, tensor and statistic.
    sites, stats, skipped = [], [], []
    for raw in unique_keys:
        key = raw.decode("utf-8", errors="replace")
        match = _KEY.match(key)
        if match is None:
            skipped.append(key)
            sites.append("")
            stats.append("")
            continue
        layer, tensor, stat = match.groups()
        sites.append(site_of(layer, tensor))
        stats.append(_TE_TO_STAT.get(stat, stat))
    keep = ~np.isin(key_code, [i for i, s in enumerate(sites) if not s])  # [row]
    if not keep.any():
        raise ImportFormatError(f"{path}: {len(matches)} metric lines, but none names a tensor statistic "
                                f"(<layer>_<tensor>_<stat> with tensor one of {', '.join(TE_TENSORS)}); "
                                f"first metric: {skipped[0]!r}")
    site_index, site_names = pd.factorize(np.asarray(sites, dtype=object))  # per unique key
    stat_index, stat_names = pd.factorize(np.asarray(stats, dtype=object))
    code = key_code[keep]
    table = pd.DataFrame({
        "step": np.fromstring(b" ".join(iterations), dtype=np.int64, sep=" ")[keep],
        "site": pd.Categorical.from_codes(site_index[code], categories=list(site_names)),
        "stat": pd.Categorical.from_codes(stat_index[code], categories=list(stat_names)),
        "value": np.array([float(v) for v in values])[keep],
    })
    table["site"] = table["site"].cat.remove_unused_categories()
    table["stat"] = table["stat"].cat.remove_unused_categories()
    return table, skipped


@holding("workbench import-te", "run_dir")
def import_te_log(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], run_dir: str | Path, *,
                  name: str | None = None) -> Path:
    """Write a run store at ``run_dir`` from TE debug logs; returns the run folder.

    Steps are the logged iterations; sites in order of first appearance at the first logged
    iteration; statistics the log lacks are NaN; the fingerprint of a (step, site) is a hash
    of its logged values (``workbench.importers.table``), as the manifest's ``imported``
    section says. ``name`` defaults to the folder's name.
    """
    table = read_te_log(paths)
    imported = {"format": FORMAT, "files": [str(Path(f).resolve()) for f in table.attrs["files"]],
                "skipped_metrics": table.attrs["skipped_keys"]}
    return write_run_from_table(table, run_dir, name=name, imported=imported)

