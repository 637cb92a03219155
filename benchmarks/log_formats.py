"""Loading per-site statistics from Transformer Engine text logs and TensorBoard files vs run stores.

    python benchmarks/log_formats.py [--steps 1000] [--sites 100] [--stats min max absmax l2] [--repeats 3]

Writes a synthetic pair of run stores (``workbench.store.synthetic``; the second diverges
half-way, a third of the way down the execution order), writes the same statistics of both
as TE debug logs (``nvdlfw_inspect`` format) and as TensorBoard event files, then measures in
this one process, as the median of ``--repeats`` interleaved repeats: loading both runs into
``RunRecords`` and ``compare`` to the first divergence, for each format. Prints a table with
seconds, the ratio to the Zarr stores, file sizes and the first divergence each format finds.
The stores hold all 12 statistics and tensor fingerprints; the logs only ``--stats``, and
their fingerprints are hashes of those. ``Run.records()`` is lazy: a store's statistics stay
on disk (Dask) until used. The default run takes about 100 s on an idle 2-core machine,
most of it TensorBoard's pure-Python record reading and writing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from workbench.analysis import RunRecords, compare
from workbench.importers import import_te_log, read_te_log, read_tensorboard, records_from_table, te_log_path
from workbench.importers.te_log import DEFAULT_STATS, write_te_log
from workbench.importers.tensorboard import write_tensorboard
from workbench.statistics import STAT_NAMES
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run


def progress(message: str, started: float) -> None:
    print(f"[{time.perf_counter() - started:6.1f} s] {message}", flush=True)


def size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def timed(fn: Callable[[], RunRecords]) -> tuple[RunRecords, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--sites", type=int, default=100)
    parser.add_argument("--stats", nargs="+", default=list(DEFAULT_STATS), choices=STAT_NAMES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the files here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="log_formats-") as scratch:
        run(args, args.out or Path(scratch))


def run(args: argparse.Namespace, root: Path) -> None:
    started = time.perf_counter()
    diverge_at = (args.steps // 2, args.sites // 3)
    print(f"{args.steps} steps x {args.sites} sites, statistics {' '.join(args.stats)}, divergence at step "
          f"{diverge_at[0]}, site index {diverge_at[1]}; {args.repeats} repeats; files under {root}", flush=True)
    stores = {name: write_synthetic_run(root / "zarr" / name, steps=args.steps, sites=args.sites, seed=0,
                                        diverge_at=diverge_at if name == "b" else None) for name in ("a", "b")}
    progress("wrote the Zarr stores", started)
    records = {name: open_run(path).records() for name, path in stores.items()}
    te_logs = {name: write_te_log(te_log_path(root / "te" / name), r, args.stats) for name, r in records.items()}
    progress(f"wrote the TE logs ({len(args.stats) * args.steps * args.sites:,} statistics lines each)", started)
    tb_dirs = {name: write_tensorboard(root / "tensorboard" / name, r, args.stats) for name, r in records.items()}
    progress("wrote the TensorBoard files", started)

    loaders: dict[str, Callable[[str], RunRecords]] = {
        "zarr": lambda name: open_run(stores[name]).records(),
        "te_log": lambda name: records_from_table(read_te_log(te_logs[name]), name),
        "tensorboard": lambda name: records_from_table(read_tensorboard(tb_dirs[name]), name),
    }
    load_times: dict[str, list[float]] = {fmt: [] for fmt in loaders}
    compare_times: dict[str, list[float]] = {fmt: [] for fmt in loaders}
    found: dict[str, str] = {}
    for repeat in range(args.repeats):
        for fmt, load in loaders.items():  # interleaved, so drift on the machine hits every format alike
            a, seconds_a = timed(lambda load=load: load("a"))
            b, seconds_b = timed(lambda load=load: load("b"))
            start = time.perf_counter()
            result = compare(a, b)
            compare_times[fmt].append(time.perf_counter() - start)
            load_times[fmt].append(seconds_a + seconds_b)
            found[fmt] = "none" if result.identical else f"step {result.first_step}, {result.first_site}"
            progress(f"repeat {repeat + 1}/{args.repeats}: {fmt} loaded in {seconds_a + seconds_b:.2f} s", started)

    start = time.perf_counter()
    imported = import_te_log(te_logs["a"], root / "imported" / "a")
    import_seconds = time.perf_counter() - start
    progress(f"import_te_log of run a into a run store: {import_seconds:.2f} s", started)

    sizes = {"zarr": {n: size_mb(p) for n, p in stores.items()}, "te_log": {n: size_mb(p) for n, p in te_logs.items()},
             "tensorboard": {n: size_mb(p) for n, p in tb_dirs.items()}}
    print()
    print(f"{'format':<12} {'load s':>8} {'compare s':>10} {'total s':>8} {'/ zarr':>7} {'MB per run':>11}  "
          "first divergence found")
    zarr_total = statistics.median(a + b for a, b in zip(load_times["zarr"], compare_times["zarr"]))
    for fmt in loaders:
        load = statistics.median(load_times[fmt])
        comparing = statistics.median(compare_times[fmt])
        total = statistics.median(a + b for a, b in zip(load_times[fmt], compare_times[fmt]))
        print(f"{fmt:<12} {load:>8.2f} {comparing:>10.2f} {total:>8.2f} {total / zarr_total:>7.1f} "
              f"{statistics.mean(sizes[fmt].values()):>11.1f}  {found[fmt]}")
    print(f"(two runs loaded per row; medians of {args.repeats}; the Zarr stores hold {len(STAT_NAMES)} statistics "
          f"and tensor fingerprints, the logs {len(args.stats)}; imported store: {size_mb(imported):.1f} MB)")


if __name__ == "__main__":
    main()
