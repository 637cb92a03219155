"""What a live reference (``workbench run --against REF``) saves, and what it costs when nothing departs.

    python benchmarks/live_reference.py [--steps 40] [--fault-step 5] [--flush-every 5] [--repeats 3]

On the CPU runner's tiny config (2 layers, hidden 64; every site recorded every step), one reference run,
then, interleaved ``--repeats`` times in one process: a run with a one-bit fault at step k trained without a
reference (all N steps) and with ``--against`` the reference (it stops at the flush after k); and a bitwise
twin trained without and with ``--against`` (it never departs: the difference is the comparison's cost).
Prints the median steps trained and seconds of each, and the twin's median step time with and without the
reference (from the runs' own ``step_time``, so process start-up is left out); then what the comparison costs
when nothing departs: the twins' wall seconds, with less without (median of the side-by-side pairs), loading the
reference timed alone (once per run, before the first step), and the comparison itself timed alone
(``LiveReference.sites`` over each flush of the twin's own records, bitwise and with ``rtol``; the broadcast of
the verdict is left out: one process).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config import RunConfig
from workbench.recorder.reference import load_reference
from workbench.runner.launch import launch
from workbench.statistics import STAT_NAMES
from workbench.store.reader import open_run

TINY: dict[str, Any] = {
    "name": "bench", "steps": 40, "global_batch_size": 16, "micro_batch_size": 4, "checkpoint_every": 0,
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128, "seq_length": 32},
    "optim": {"lr": 0.01, "min_lr": 0.001, "warmup_steps": 4},
}


def _train(cfg: RunConfig, run_dir: Path, against: Path | None) -> tuple[int, float, float]:
    """(steps trained, wall seconds, median step time) of one run."""
    start = time.perf_counter()
    launch(cfg, run_dir, against=against, overwrite=True)
    seconds = time.perf_counter() - start
    run = open_run(run_dir)
    return run.steps_completed, seconds, float(run.scalars["step_time"].iloc[2:].median())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fault-step", type=int, default=5)
    parser.add_argument("--flush-every", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = RunConfig.from_dict({**TINY, "steps": args.steps, "flush_every": args.flush_every})
    fault = base.with_overrides({"fault": {"kind": "bitflip", "site": "act:layers.1.mlp", "step": args.fault_step,
                                           "bit": 30}})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        reference = launch(base.with_overrides({"name": "reference"}), root / "reference")
        results: dict[str, list[tuple[int, float, float]]] = {k: [] for k in
                                                               ("fault", "fault --against", "twin", "twin --against")}
        for repeat in range(args.repeats):
            for name, cfg, against in (("fault", fault, None), ("fault --against", fault, reference),
                                       ("twin", base, None), ("twin --against", base, reference)):
                results[name].append(_train(cfg, root / name.replace(" ", ""), against))
            print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)
        _report(results, args, root)


def _report(results: dict[str, list[tuple[int, float, float]]], args: argparse.Namespace, root: Path) -> None:
    """The table of the runs, the twins' wall difference per step, the comparison timed alone."""
    print(f"\nthe fault at step {args.fault_step} of {args.steps}, flush every {args.flush_every} steps "
          f"(medians of {args.repeats}):")
    print(f"{'run':<18}{'steps trained':>15}{'seconds':>10}{'step time, ms':>15}")
    for name, rows in results.items():
        steps, seconds, step_time = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"{name:<18}{steps:>15.0f}{seconds:>10.1f}{1000 * step_time:>15.1f}")
        if name.startswith("twin"):
            print(f"  {name}: seconds of the {args.repeats} repeats "
                  + ", ".join(f"{row[1]:.2f}" for row in rows))
    extra = [b[1] - a[1] for a, b in zip(results["twin"], results["twin --against"], strict=True)]
    begin = time.perf_counter()
    load_reference(root / "reference")
    loading = time.perf_counter() - begin
    print(f"\nnothing departing, the twin's run with --against less without: {statistics.median(extra):+.2f} s of "
          f"wall time (median of {args.repeats} side-by-side pairs; {args.steps} steps of "
          f"{1000 * statistics.median(r[2] for r in results['twin']):.1f} ms); loading the reference alone "
          f"{loading:.2f} s")
    for rtol in (None, 1e-6):
        per_flush = _comparison_seconds(root / "reference", root / "twin--against", args.flush_every, rtol)
        label = "bitwise" if rtol is None else f"rtol {rtol:g}"
        print(f"the comparison alone, {label}: {1000 * per_flush:.2f} ms per flush of {args.flush_every} "
              f"steps ({1000 * per_flush / args.flush_every:.3f} ms per step; median over the twin's flushes)")


def _comparison_seconds(reference_dir: Path, twin_dir: Path, flush_every: int, rtol: float | None) -> float:
    """Median seconds of ``LiveReference.sites`` over each flush of the twin's records (what rank 0 adds to a
    flush when nothing departs)."""
    reference = load_reference(reference_dir, rtol=rtol)
    records = open_run(twin_dir).records()
    sites, steps = list(records.sites), list(records.steps)
    seconds = []
    for start in range(0, len(steps), flush_every):
        chunk = steps[start:start + flush_every]
        fingerprints = records.fingerprints.loc[chunk, sites].to_numpy(dtype=np.uint64)
        stats = np.asarray(records.stats.sel(step=chunk, site=sites, stat=list(STAT_NAMES))
                           .transpose("step", "site", "stat").to_numpy(), dtype=float)
        begin = time.perf_counter()
        found = reference.sites(chunk, sites, fingerprints, stats)
        seconds.append(time.perf_counter() - begin)
        assert found is None, found
    return statistics.median(seconds)


if __name__ == "__main__":
    main()
