"""Recorder overhead as a function of model size, measured side by side in one run per model.

    python benchmarks/recorder_overhead.py [--steps 40] [--models L4H128 L4H256 L4H512 L4H1024 L8H512]
                                           [--compile/--no-compile]

For each model (4 layers at hidden 128 / 256 / 512 / 1024 and 8 layers at hidden 512; seq
128, global batch 16, micro-batch 4, TP=1 on the CPU runner) one run records every kind of
site on every second step, so recorded and unrecorded steps alternate within the same run,
on the same machine state; an unrecorded step runs without the recorder's module hooks. Prints
per model: the median step time of each, the median ratio of a recorded step to the mean of
the unrecorded steps either side of it (the overhead of recording every step; robust to a
machine whose speed drifts during the run), the overhead of recording every 10th step implied
by it ((ratio + 9) / 10), the recorder's own time, and beside it the
bound set by the bytes the recorder reads per recorded step (every site's tensor once)
divided by the statistics pass's read rate on a 16 M-element fp32 tensor measured in the
same process. Also the bytes the ``sites`` group takes per site per recorded step.

Then the store writes of a flush (``--flush-sites``, ``--flush-every``: the recorder's default, 10 steps), on
the recorder's writer thread: as the recorder wrote them before schema 3 (schema 2, every statistic of 64
steps in one chunk, the group opened at each flush), schema 2 through ``SiteWriter``, and schema 3, taking
turns flush by flush over 640 recorded steps: the median time of a flush in each and the ratios.
"""

from __future__ import annotations

import argparse
import functools
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from workbench.config import RunConfig
from workbench.recorder import kernels
from workbench.runner.launch import launch
from workbench.store import layout
from workbench.store.reader import open_run
from workbench.store.synthetic import synthetic_sites
from workbench.store.writer import SiteWriter, create_sites_group, create_store, write_site_rows

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def read_rate() -> float:
    """Bytes per second of the native statistics pass over a 16 M-element fp32 tensor (median of 7)."""
    x = torch.randn(16 * 2**20)
    coords = kernels.identity_coords(x.shape)
    times = []
    for _ in range(8):
        acc, lanes = kernels.new_accumulators(x.device)
        start = time.perf_counter()
        kernels.accumulate(x, coords, 1e-38, 1e38, acc, lanes)
        times.append(time.perf_counter() - start)
    return x.nbytes / statistics.median(times[1:])


def measure(model: str, steps: int, compile_: bool, out: Path, rate: float) -> str:
    layers, hidden = (int(v) for v in re.fullmatch(r"L(\d+)H(\d+)", model).groups())  # type: ignore[union-attr]
    spec = {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": 4, "vocab_size": 256,
            "seq_length": 128}
    cfg = RunConfig.from_dict({"name": f"overhead-{model}", "steps": steps, "global_batch_size": 16,
                               "micro_batch_size": 4, "model": spec, "record": {"every": 2, "compile": compile_}})
    run = open_run(launch(cfg, out / cfg.name, overwrite=True))
    scalars = run.scalars.iloc[4:]  # skip warm-up (the first calls build the kernel)
    times = scalars.step_time.to_numpy(dtype=float)
    recorded = (scalars.index % 2 == 0)
    t_on = float(np.median(times[recorded]))
    t_off = float(np.median(times[~recorded]))
    # each recorded step against the mean of the unrecorded steps either side of it: a machine whose
    # speed drifts during the run (other work on the host) moves both alike
    inner = np.flatnonzero(recorded[1:-1]) + 1
    ratio = float(np.median(times[inner] / ((times[inner - 1] + times[inner + 1]) / 2)))
    own = float(np.median(scalars.recorder_time[recorded]))
    sites = run.site_table()
    read = float(sum(int(n) * _BYTES.get(str(d), 4) for n, d in zip(sites.numel, sites.dtype)))
    bound = read / rate
    group = run.paths.store / layout.SITES_GROUP
    data_bytes = directory_bytes(group / layout.STATS_ARRAY) + directory_bytes(group / layout.FINGERPRINT_ARRAY)
    per_site = data_bytes / (len(sites) * run.recorded_steps_completed)
    return (f"{model:>8} {len(sites):>6} {t_off:9.4f} {t_on:9.4f} {ratio:8.3f}x "
            f"{(ratio + 9) / 10:9.3f}x {own:9.4f} {read / 2**20:9.1f} {bound:9.4f} "
            f"{(t_off + bound) / t_off:8.3f}x {per_site:7.1f}")


def flush_cost(sites: int, flush_every: int, out: Path) -> str:
    """Median seconds of one flush's store writes: the recorder before this schema (schema 2, the sites group
    opened at every flush), schema 2 through ``SiteWriter``, and schema 3, taking turns flush by flush."""
    steps = 640
    rng = np.random.default_rng(0)
    writers: dict[str, Callable[[int, np.ndarray, np.ndarray], None]] = {}
    for label, version in (("before", 2), ("2", 2), ("3", 3)):
        run_dir = out / f"flush-{sites}-{label}"
        create_store(run_dir, {"run_id": "flush", "name": "flush", "producer": "benchmark"}, steps,
                     schema_version=version)
        create_sites_group(run_dir, list(range(steps)), synthetic_sites(sites))
        writers[label] = functools.partial(write_site_rows, run_dir) if label == "before" else SiteWriter(run_dir).write
    times: dict[str, list[float]] = {label: [] for label in writers}
    order = list(writers)
    for i, first in enumerate(range(0, steps, flush_every)):
        stats = rng.standard_normal((flush_every, sites, 12))
        fingerprints = rng.integers(0, 2**63, size=(flush_every, sites), dtype=np.int64).astype(np.uint64)
        for label in order[i % 3:] + order[:i % 3]:
            start = time.perf_counter()
            writers[label](first, stats, fingerprints)
            times[label].append(time.perf_counter() - start)
    before, old, new = (statistics.median(times[label]) for label in order)
    return (f"{sites:>8} {flush_every:>6} {1000 * before:12.2f} {1000 * old:12.2f} {1000 * new:12.2f} "
            f"{new / before:10.2f}x {new / old:8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--models", nargs="*", default=["L4H128", "L4H256", "L4H512", "L4H1024", "L8H512"])
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--flush-sites", type=int, nargs="*", default=[100, 300, 1000, 3000])
    parser.add_argument("--flush-every", type=int, default=10)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="recorder-overhead-"))
    if args.flush_sites:
        print(f"store writes of one flush (median over {640 // args.flush_every} flushes, alternating):")
        print(f"{'sites':>8} {'steps':>6} {'before ms':>12} {'schema 2 ms':>12} {'schema 3 ms':>12} "
              f"{'3 / before':>11} {'3 / 2':>9}")
        for sites in args.flush_sites:
            print(flush_cost(sites, args.flush_every, out), flush=True)
    if not args.models:
        return
    rate = read_rate()
    print(f"seq 128, batch 16, TP1, compile={args.compile}, {args.steps} steps each (4 skipped); "
          f"statistics pass reads {rate / 1e9:.2f} GB/s (fp32, 16 M elements, {torch.get_num_threads()} threads)")
    print(f"{'model':>8} {'sites':>6} {'t_off s':>9} {'t_on s':>9} {'every':>9} {'every 10th':>10} "
          f"{'own s':>9} {'read MiB':>9} {'bound s':>9} {'bound':>9} {'B/site':>7}")
    for model in args.models:
        print(measure(model, args.steps, args.compile, out, rate), flush=True)


if __name__ == "__main__":
    main()
