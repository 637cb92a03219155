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
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from workbench.errors import ImportFormatError, LogNotFoundError
from workbench.importers.table import MAX_UNLOGGED_STEPS, check_last_step, long_table, row_keys, write_run_from_table
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

MAX_LINE_BYTES = 1 << 20
"""The longest line a log may hold (a statistics line is about a hundred bytes): a longer one is refused."""
_BLOCK_BYTES = 1 << 20  # text read at a time: one block of the file is in memory, never the whole of it
_STEP_DIGITS = 18  # every iteration of at most 18 digits fits an int64

_NUMBER = rb"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?))"
# One pass over each block of lines. The optional prefix is the logging formatter's
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
    """One log's long table (categorical site and stat) and the metric names it could not map.

    The file is read a block of whole lines at a time; each line's numbers go into compact arrays (a code per
    metric name, 20 bytes a line), so memory follows the statistics, not the text."""
    names: dict[bytes, int] = {}  # metric name -> its code, in order of first appearance
    codes, steps, values = array("i"), array("q"), array("d")  # [line], grown as the blocks are read
    for first, block in _blocks(path):
        matches = _LINE.findall(block)
        if not matches:
            continue
        # three comprehensions, not zip(*matches): unpacking a long tuple argument list is several times slower
        keys, iterations, numbers = [m[0] for m in matches], [m[1] for m in matches], [m[2] for m in matches]
        if max(map(len, iterations)) > _STEP_DIGITS:
            _refuse_line(path, first, block, lambda m: len(m.group(2).lstrip(b"0")) > _STEP_DIGITS,
                         f"its iteration has more than {_STEP_DIGITS} digits")
        key_code, unique_keys = pd.factorize(np.asarray(keys, dtype=object))
        known = np.fromiter((names.setdefault(k, len(names)) for k in unique_keys), dtype=np.int32,
                            count=len(unique_keys))
        codes.frombytes(known[key_code].tobytes())
        steps.frombytes(np.fromstring(b" ".join(iterations), dtype=np.int64, sep=" ").tobytes())
        values.frombytes(np.array([float(v) for v in numbers]).tobytes())
    if not codes:
        raise ImportFormatError(f"{path}: no statistics lines ('<layer>_<tensor>_<stat> iteration=<n> "
                                "value=<x>'); pass the nvdlfw_inspect_statistics_logs files that the "
                                "LogTensorStats feature writes, not the main nvdlfw_inspect log")
    # Only the few distinct metric names are split into layer, tensor and statistic.
    sites, stats, skipped = [], [], []
    for raw in names:
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
    mapped = [i for i, site in enumerate(sites) if site]  # the metric names that are tensor statistics
    if not mapped:
        raise ImportFormatError(f"{path}: {len(codes)} metric lines, but none names a tensor statistic "
                                f"(<layer>_<tensor>_<stat> with tensor one of {', '.join(TE_TENSORS)}); "
                                f"first metric: {skipped[0]!r}")
    key_code = np.frombuffer(codes, dtype=np.int32)  # [line], views of the arrays, not copies
    step = np.frombuffer(steps, dtype=np.int64)
    value = np.frombuffer(values, dtype=np.float64)
    if len(mapped) < len(sites):
        keep = np.isin(key_code, mapped)  # [line]
        key_code, step, value = key_code[keep], step[keep], value[keep]
    last = int(np.max(step))
    if last >= len(step) + MAX_UNLOGGED_STEPS:
        where = _line_of(path, lambda m: int(m.group(2).lstrip(b"0") or b"0") == last)
        check_last_step(last, len(step), f"{path}:{where}: the iteration")
    # Categories of the mapped names only, each of which some kept line names: none unused, none to drop.
    site_index, site_names = pd.factorize(np.asarray([sites[i] for i in mapped], dtype=object))
    stat_index, stat_names = pd.factorize(np.asarray([stats[i] for i in mapped], dtype=object))
    site_of_key, stat_of_key = np.full(len(sites), -1, dtype=np.int32), np.full(len(sites), -1, dtype=np.int32)
    site_of_key[mapped], stat_of_key[mapped] = site_index, stat_index
    table = pd.DataFrame({
        "step": step,
        "site": pd.Categorical.from_codes(site_of_key[key_code], categories=list(site_names)),
        "stat": pd.Categorical.from_codes(stat_of_key[key_code], categories=list(stat_names)),
        "value": value,
    }, copy=False)
    return table, skipped


def _blocks(path: Path) -> Iterator[tuple[int, bytes]]:
    """(the number of its first line, a block of whole lines) for the text of ``path``, about ``_BLOCK_BYTES`` at
    a time; ``ImportFormatError`` naming the line for a line longer than ``MAX_LINE_BYTES``."""
    first, rest = 1, b""
    with path.open("rb") as file:
        while True:
            data = file.read(_BLOCK_BYTES)
            text = rest + data
            cut = text.rfind(b"\n") + 1 if data else len(text)  # at the end of the file, its last line too
            block, rest = text[:cut], text[cut:]
            if len(rest) > MAX_LINE_BYTES:
                raise _too_long(path, first + block.count(b"\n"))
            breaks = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n"))  # [line]
            lengths = np.diff(np.append(breaks, len(block)), prepend=-1) - 1  # [line (+ a last one unended)]
            if lengths.size and lengths.max() > MAX_LINE_BYTES:
                raise _too_long(path, first + int(np.argmax(lengths > MAX_LINE_BYTES)))
            if block:
                yield first, block
            first += len(breaks)
            if not data:
                return


def _too_long(path: Path, line: int) -> ImportFormatError:
    return ImportFormatError(f"{path}:{line}: a line of more than {MAX_LINE_BYTES:,} bytes, which no statistics "
                             "line is; pass the nvdlfw_inspect_statistics_logs files, not another file")


def _line_of(path: Path, found: Callable[[re.Match[bytes]], bool]) -> int:
    """The number of the first statistics line of ``path`` for which ``found`` holds (0 if none)."""
    for first, block in _blocks(path):
        for match in _LINE.finditer(block):
            if found(match):
                return first + block.count(b"\n", 0, match.start())
    return 0


def _refuse_line(path: Path, first: int, block: bytes, found: Callable[[re.Match[bytes]], bool], what: str) -> None:
    """``ImportFormatError`` naming the first line of ``block`` (whose first line is ``first``) for which ``found``
    holds, saying ``what`` is wrong with it; nothing when none does."""
    for match in _LINE.finditer(block):
        if found(match):
            line = first + block.count(b"\n", 0, match.start())
            raise ImportFormatError(f"{path}:{line}: {what}; correct or remove that line")


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

