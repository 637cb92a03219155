"""Recorder overhead, measured side by side in one run, and the store's size per site and step.

    python benchmarks/recorder_overhead.py [--steps 40] [--compile/--no-compile]

Trains a 4-layer, hidden-256 GPT (seq 128, global batch 16, micro-batch 4, TP=1) on the CPU
runner with every kind of site recorded on every second step: recorded and unrecorded steps
alternate within the same run, on the same machine state. Prints the median step time of
each, their ratio (the overhead of recording every step), the overhead of recording every
10th step implied by those medians, ((t_on + 9 t_off) / (10 t_off)), and the bytes the
``sites`` group takes per site per recorded step (compressed, on disk).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from workbench.config import RunConfig
from workbench.runner.launch import launch
from workbench.store import layout
from workbench.store.reader import open_run

MODEL = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 256, "seq_length": 128}


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="recorder-overhead-"))
    cfg = RunConfig.from_dict({"name": "overhead", "steps": args.steps, "global_batch_size": 16,
                               "micro_batch_size": 4, "model": MODEL,
                               "record": {"every": 2, "compile": args.compile}})
    run = open_run(launch(cfg, out / cfg.name, overwrite=True))
    scalars = run.scalars.iloc[4:]  # skip warm-up (first calls compile the kernel)
    recorded = scalars.index % 2 == 0
    t_on = float(np.median(scalars.step_time[recorded]))
    t_off = float(np.median(scalars.step_time[~recorded]))
    share = float(np.median(scalars.recorder_time[recorded]))
    sites = run.site_table()
    group = run.paths.store / layout.SITES_GROUP
    data_bytes = directory_bytes(group / layout.STATS_ARRAY) + directory_bytes(group / layout.FINGERPRINT_ARRAY)
    n_recorded = run.recorded_steps_completed
    print(f"model L4 H256 seq128 batch16 TP1, {len(sites)} sites, compile={args.compile}, "
          f"{len(scalars)} steps measured")
    print(f"median step time, recorded:   {t_on:.4f} s  (recorder's own time {share:.4f} s)")
    print(f"median step time, unrecorded: {t_off:.4f} s")
    print(f"overhead, every step:         {t_on / t_off:.3f}x")
    print(f"overhead, every 10th step:    {(t_on + 9 * t_off) / (10 * t_off):.3f}x")
    print(f"store: {data_bytes / (len(sites) * n_recorded):.1f} bytes per site per recorded step "
          f"(stats + fingerprint, compressed)")


if __name__ == "__main__":
    main()
