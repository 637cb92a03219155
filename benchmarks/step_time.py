"""Seconds per training step of the CPU runner for one model under several layouts.

    python benchmarks/step_time.py [--steps 20] [--layouts 1x1x1 2x2x1] [--out DIR]

Trains a 4-layer, hidden-256 GPT (seq 128, global batch 16, micro-batch 4) for each
layout (TPxPPxDP) in turn on this machine, once with recording off and once with every
site recorded at every step, and prints the median step time over the steps after the
first two (warm-up), with the interquartile range.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from workbench.config import RunConfig
from workbench.runner.launch import launch
from workbench.store.reader import open_run

MODEL = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 256, "seq_length": 128}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layouts", nargs="+", default=["1x1x1", "2x2x1"])
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="step-time-"))
    print(f"{'layout':>8} {'recording':>10} {'median s/step':>14} {'IQR':>16} {'tokens/s':>10}")
    for spec in args.layouts:
        tp, pp, dp = (int(x) for x in spec.split("x"))
        for record in (False, True):
            cfg = RunConfig.from_dict({"name": f"bench-{spec}-{'rec' if record else 'off'}", "steps": args.steps,
                                       "global_batch_size": 16, "micro_batch_size": 4, "model": MODEL,
                                       "layout": {"tp": tp, "pp": pp, "dp": dp}, "record": {"enabled": record}})
            run = open_run(launch(cfg, out / cfg.name, overwrite=True))
            times = run.scalars.step_time.to_numpy()[2:]
            q1, median, q3 = np.percentile(times, [25, 50, 75])
            print(f"{spec:>8} {'on' if record else 'off':>10} {median:14.3f} {q1:7.3f}-{q3:<8.3f} "
                  f"{cfg.tokens_per_step / median:10.0f}")


if __name__ == "__main__":
    main()
