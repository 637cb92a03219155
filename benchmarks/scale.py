"""Analysis at scale: a pair of 10,000-step x 1,000-site run stores, opened and compared.

    python benchmarks/scale.py [--dir /tmp/workbench-scale] [--steps 10000] [--sites 1000] [--no-lazy]
                               [--blocks-cap-gib 1.0]

Writes (once) two synthetic stores that diverge at a known step and site
(``workbench.store.synthetic``), then measures in this process, median of ``--repeats``:
opening both runs and reading their fingerprints, finding the first divergence (step,
then site) and the frontier, and the peak resident memory. Then, in a child process whose
address space is capped below the size of the two runs' statistics, it shows that
loading those statistics fails while the lazy (xarray + Dask) reduction of their relative
differences over all steps succeeds. Timings are with the stores in the page cache.

Side by side, in child processes of their own: the first divergence and the frontier found in memory
(``analysis.compare`` over both runs' fingerprints) and block by block (``store.blocks.block_frontier``:
the folds of 64 steps, then the rows of the blocks where sites first differ), the latter with its address
space capped at ``--blocks-cap-gib``; each prints its time, its answer and its peak resident memory.
Writing the pair the first time prints its time and the disk it takes.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

DIVERGE_AT = (4_000, 317)


def _peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pair_parser(description: str, *, repeats: int = 5, repeats_help: str | None = None) -> argparse.ArgumentParser:
    """The arguments every benchmark of the synthetic pair takes: where it lies, its size, the repeats."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/workbench-scale"))
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--sites", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    return parser


def ensure_pair(directory: Path, steps: int, sites: int,
                schema_version: int | None = None) -> tuple[Path, Path, tuple[int, int]]:
    """The synthetic pair of ``steps`` x ``sites`` in the layout of ``schema_version`` (default: the current one),
    written under ``directory`` the first time, each in its own folder of runs."""
    from workbench.store import layout
    from workbench.store.synthetic import write_synthetic_run

    version = schema_version or layout.SCHEMA_VERSION
    diverge_at = (min(DIVERGE_AT[0], steps // 2), min(DIVERGE_AT[1], sites // 2))
    folder = directory / f"{steps}x{sites}-v{version}"
    a, b = folder / "a", folder / "b"
    for path, kwargs in ((a, {}), (b, {"diverge_at": diverge_at})):
        if not (path / "run.zarr" / "zarr.json").is_file():
            start = time.perf_counter()
            write_synthetic_run(path, steps=steps, sites=sites, seed=0, schema_version=version,
                                **kwargs)  # type: ignore[arg-type]
            print(f"wrote {path} (schema {version}) in {time.perf_counter() - start:.1f} s, "
                  f"{_disk_gib(path):.2f} GiB on disk", flush=True)
    return a, b, diverge_at


def measure(a: Path, b: Path, diverge_at: tuple[int, int], repeats: int) -> None:
    from workbench.analysis import compare
    from workbench.store.reader import open_run

    opened, compared = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        ra, rb = open_run(a).records(), open_run(b).records()
        mid = time.perf_counter()
        result = compare(ra, rb)
        end = time.perf_counter()
        opened.append(mid - start)
        compared.append(end - mid)
        expected_site = ra.sites[diverge_at[1]]
        if (result.first_step, result.first_site) != (diverge_at[0], expected_site):
            raise SystemExit(f"wrong answer: {result.first_step}, {result.first_site}; expected {diverge_at[0]}, "
                             f"{expected_site}")
    steps, sites = ra.fingerprints.shape
    size = sum(f.stat().st_size for p in (a, b) for f in (p / "run.zarr").rglob("*") if f.is_file())
    print(f"\n{steps} steps x {sites} sites per run, {size / 2**20:.0f} MiB on disk for the pair "
          f"(statistics {2 * ra.stats.nbytes / 2**30:.2f} GiB uncompressed)")
    print(f"open both runs + read fingerprints (median of {repeats}): {statistics.median(opened):.3f} s")
    print(f"first divergence + frontier + origins  (median of {repeats}): {statistics.median(compared):.3f} s "
          f"-> step {result.first_step}, site {result.first_site}, {len(result.frontier)} sites in the frontier")
    print(f"peak resident memory: {_peak_rss_mb():.0f} MiB")


def compare_child(a: Path, b: Path, how: str, cap_gib: float | None) -> None:
    """Runs in a child process: the first divergence and frontier, in memory or block by block."""
    if cap_gib:
        cap = int(cap_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    from workbench.analysis import compare
    from workbench.store.blocks import block_frontier
    from workbench.store.reader import open_run

    start = time.perf_counter()
    if how == "blocks":
        found = block_frontier(open_run(a), open_run(b))
        assert found is not None
        answer = (found.first_step, found.first_site, len(found.frontier), f"{found.blocks_read} blocks read")
    else:
        result = compare(open_run(a).records(), open_run(b).records())
        answer = (result.first_step, result.first_site, len(result.frontier), "every row read")
    seconds = time.perf_counter() - start
    capped = f", address space capped at {cap_gib} GiB" if cap_gib else ""
    print(f"{how:>9}: {seconds:6.2f} s, peak resident {_peak_rss_mb():6.0f} MiB{capped} -> step {answer[0]}, "
          f"site {answer[1]}, {answer[2]} sites in the frontier, {answer[3]}", flush=True)


def lazy_child(a: Path, b: Path, cap_gib: float) -> None:
    """Runs in a child process: the lazy reduction under an address-space cap, then an eager load."""
    cap = int(cap_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    from workbench.analysis import compare
    from workbench.store.reader import open_run

    ra, rb = open_run(a).records(), open_run(b).records()
    start = time.perf_counter()
    peak = compare(ra, rb).relative_difference.max("step").compute()  # [site, stat]; reads every chunk
    print(f"lazy: largest relative difference per site and statistic over all steps {peak.shape} in "
          f"{time.perf_counter() - start:.1f} s, peak resident memory {_peak_rss_mb():.0f} MiB")
    try:
        ra.stats.load()
        rb.stats.load()
        print("eager: loading both runs' statistics worked (raise the store size or lower the cap)")
    except MemoryError:
        print("eager: loading both runs' statistics into memory fails with MemoryError under this cap")


def main() -> None:
    parser = pair_parser(__doc__.splitlines()[0], repeats=3)
    parser.add_argument("--memory-cap-gib", type=float, default=1.5,
                        help="address-space cap of the lazy-analysis child process")
    parser.add_argument("--blocks-cap-gib", type=float, default=1.0,
                        help="address-space cap of the block-by-block child process")
    parser.add_argument("--no-lazy", action="store_true", help="leave out the in-process measures and the lazy child "
                                                               "(they read every statistic)")
    parser.add_argument("--lazy-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--compare-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lazy_child:
        lazy_child(*args.lazy_child, args.memory_cap_gib)
        return
    if args.compare_child:
        a, b, how = args.compare_child
        compare_child(Path(a), Path(b), how, args.blocks_cap_gib if how == "blocks" else None)
        return
    a, b, diverge_at = ensure_pair(args.dir, args.steps, args.sites)
    print(f"the pair: {_disk_gib(a.parent):.2f} GiB on disk, statistics "
          f"{2 * args.steps * args.sites * 12 * 8 / 2**30:.2f} GiB uncompressed", flush=True)
    print("\nfirst divergence and frontier, each in a child process (median of 1):", flush=True)
    for how in ("memory", "blocks"):
        subprocess.run([sys.executable, __file__, "--compare-child", str(a), str(b), how,
                        "--blocks-cap-gib", str(args.blocks_cap_gib)], check=True)
    if args.no_lazy:
        return
    measure(a, b, diverge_at, args.repeats)
    print(f"\nchild process with its address space capped at {args.memory_cap_gib} GiB:", flush=True)
    subprocess.run([sys.executable, __file__, "--lazy-child", str(a), str(b),
                    "--memory-cap-gib", str(args.memory_cap_gib)], check=True)


def _disk_gib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**30


if __name__ == "__main__":
    main()
