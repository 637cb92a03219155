"""Reading a long run's arrays: Zarr's read against the chunk files read directly, side by side.

    python benchmarks/chunk_reads.py [--dir /tmp/workbench-scale] [--steps 10000] [--sites 1000] [--repeats 5]

Uses (and, the first time, writes) run ``a`` of the synthetic pair of ``benchmarks/scale.py`` in the current
schema. In this one process, alternating, for each of: one statistic of every recorded step, the fingerprints of
every recorded step, every statistic of 64 recorded steps, the ``loss`` scalar: zarr-python's read of the
selection (``array[selection]``) against ``store.chunk_files.read_selection``, which ``layout.read`` uses for
the store's own arrays. Checks that both give the same bytes; prints the median time of each and their ratio.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from scale import ensure_pair, pair_parser  # type: ignore[import-not-found]


def main() -> None:
    parser = pair_parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    a, _, _ = ensure_pair(args.dir, args.steps, args.sites)

    import zarr

    from workbench.store import chunk_files, layout

    root = zarr.open_group(a / layout.STORE_DIR, mode="r")
    sites, scalars = root[layout.SITES_GROUP], root[layout.SCALARS_GROUP]
    stats, fingerprints, loss = sites[layout.STATS_ARRAY], sites[layout.FINGERPRINT_ARRAY], scalars["loss"]
    n = args.steps
    cases = [("one statistic, every step", stats, (slice(0, n), slice(None), 3)),
             ("fingerprints, every step", fingerprints, slice(0, n)),
             ("every statistic of 64 steps", stats, slice(n // 2, n // 2 + 64)),
             ("the loss, every step", loss, slice(0, n))]
    print(f"{args.steps} steps x {args.sites} sites, median of {args.repeats}, alternating:")
    print(f"{'':<30}{'zarr':>10}{'direct':>10}{'ratio':>8}")
    for label, node, selection in cases:
        through_zarr, direct = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            expected = np.asarray(node[selection])
            middle = time.perf_counter()
            got = chunk_files.read_selection(node, selection)
            direct.append(time.perf_counter() - middle)
            through_zarr.append(middle - start)
            if got is None or got.tobytes() != expected.tobytes():
                raise SystemExit(f"{label}: the direct read differs from Zarr's")
        z, d = statistics.median(through_zarr), statistics.median(direct)
        print(f"{label:<30}{1000 * z:>8.0f}ms{1000 * d:>8.0f}ms{d / z:>8.2f}")


if __name__ == "__main__":
    main()
