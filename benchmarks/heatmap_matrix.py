"""The divergence heatmap's matrix of a statistic, two ways side by side, on a 10,000-step x 1,000-site pair.

    python benchmarks/heatmap_matrix.py [--dir /tmp/workbench-scale] [--steps 10000] [--sites 1000]
                                        [--repeats 5]

Uses (and, the first time, writes) the synthetic pair of ``benchmarks/scale.py``. For each statistic, with
both runs' values already read (``Workspace.stat_values``), in this one process, alternating: the relative
difference computed whole and then the matrix from it (``heatmap_matrix(relative=...)``), against the matrix
computed from the two runs' values block by block (``heatmap_matrix(values=...)``, what the explorer and
``views.heatmap`` use for a range of steps). Then what a view of every step draws: the step bins made from that
matrix (``StepBins.of``) against the step bins made from the two runs' values without it
(``StepBins.of_values``, what the explorer uses). Checks that each two ways give the same result and prints the
median time of each, their ratio, and the bytes the first keeps beyond the matrix (the relative difference).
"""

from __future__ import annotations

import statistics
import time

from scale import ensure_pair, pair_parser  # type: ignore[import-not-found]


def main() -> None:
    parser = pair_parser(__doc__.splitlines()[0], repeats_help="statistics measured (one pass each)")
    args = parser.parse_args()
    a, _, _ = ensure_pair(args.dir, args.steps, args.sites)

    from workbench.figures.divergence import StepBins, heatmap_matrix
    from workbench.studies.workspace import Workspace

    ws = Workspace.open(a.parent)
    result = ws.comparison("a", "b")
    whole, blocks, binned, direct, kept = [], [], [], [], 0
    for stat in ["l2", "min", "max", "sum", "absmax", "sum_sq", "count"][:args.repeats]:
        values = (ws.stat_values("a", stat), ws.stat_values("b", stat))
        start = time.perf_counter()
        relative = result.relative(stat, values)
        first = heatmap_matrix(result, stat, relative=relative)
        middle = time.perf_counter()
        second = heatmap_matrix(result, stat, values=values)
        end = time.perf_counter()
        bins = StepBins.of(second)
        after = time.perf_counter()
        from_values = StepBins.of_values(result, values)
        last = time.perf_counter()
        if not first.equals(second) or not bins.matrix.equals(from_values.matrix):
            raise SystemExit(f"the two ways disagree on {stat}")
        whole.append(middle - start)
        blocks.append(end - middle)
        binned.append(after - middle)  # the matrix and its bins
        direct.append(last - after)
        kept = int(relative.nbytes)
        result.forget(stat)
    print(f"heatmap matrix of one statistic, {args.steps} steps x {args.sites} sites, median of {len(whole)}:")
    print(f"  relative difference whole, then the matrix: {statistics.median(whole):.3f} s "
          f"(and {kept / 2**20:.0f} MiB of relative difference kept per statistic)")
    print(f"  from the two runs' values block by block:  {statistics.median(blocks):.3f} s (nothing kept)")
    print(f"  ratio: {statistics.median(blocks) / statistics.median(whole):.2f}")
    print("step bins of a view of every step (at most 400 columns):")
    print(f"  from the matrix above (its time included):  {statistics.median(binned):.3f} s")
    print(f"  from the two runs' values, no matrix:       {statistics.median(direct):.3f} s")
    print(f"  ratio: {statistics.median(direct) / statistics.median(binned):.2f}")


if __name__ == "__main__":
    main()
