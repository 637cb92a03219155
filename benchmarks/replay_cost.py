"""What replay and bisect cost: a replay from the checkpoint to step K, and one step under the operation tracer.

    python benchmarks/replay_cost.py [RUN] [--step K] [--repeats 3]

RUN defaults to the demo's fault run (``data/runs/demo/fault``, made by ``make demo``) and K to
its first anomaly. Each repeat replays RUN through K twice, side by side: once with full
recording (every site every step, snapshots of every site at K: what ``workbench replay``
does) and once with the operation tracer on step K as well (what ``workbench bisect`` does
per run). Printed, as medians over the repeats:

* wall time of each replay (launch, checkpoint load, steps from the checkpoint through K);
* the ``step_time`` of step K in each (the scalar the worker records; recorder included in both),
  and their ratio: the operation tracer's overhead for one step; for scale, the original run's
  median step time over the replayed steps (its own, lighter recording);
* the trace's size: operations and megabytes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from workbench.analysis.anomalies import find_anomalies
from workbench.investigate.replay import replay
from workbench.store.reader import open_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, nargs="?", default=Path("data/runs/demo/fault"))
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    run = open_run(args.run)
    step = args.step
    if step is None:
        found = find_anomalies(run.scalars, run.records())
        step = int(found["step"].iloc[0]) if not found.empty else run.config.steps - 1
    print(f"{run.name} ({run.config.summary()}), replay through step {step}, {args.repeats} repeats")
    wall: dict[str, list[float]] = {"recorded": [], "traced": []}
    step_time: dict[str, list[float]] = {"recorded": [], "traced": []}
    ops = megabytes = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in ("recorded", "traced"):
                out = Path(tmp) / f"{mode}-{repeat}"
                result = replay(run.path, step, out=out, trace=mode == "traced")
                replayed = open_run(out)
                wall[mode].append(result.seconds)
                step_time[mode].append(float(replayed.scalars.loc[step, "step_time"]))
                if mode == "traced":
                    files = replayed.paths.op_trace_ranks(step)
                    ops = sum(sum(1 for _ in f.open()) for f in files)
                    megabytes = sum(f.stat().st_size for f in files) / 1e6
                print(f"  repeat {repeat} {mode}: replay {result.seconds:.1f} s, step {step} "
                      f"{step_time[mode][-1]:.3f} s, reproduced={result.check.reproduced}", flush=True)
        first = result.from_step
    med = {mode: (statistics.median(wall[mode]), statistics.median(step_time[mode])) for mode in wall}
    print(f"\nreplay from step {first} through {step} ({step - first + 1} steps), medians of {args.repeats}:")
    print(f"  full recording:           {med['recorded'][0]:6.1f} s wall, step {step}: {med['recorded'][1]:.3f} s")
    print(f"  + operation trace of {step}: {med['traced'][0]:6.1f} s wall, step {step}: {med['traced'][1]:.3f} s")
    print(f"  tracer overhead on one step: {med['traced'][1] / med['recorded'][1]:.1f}x "
          f"({ops:.0f} operations over all ranks, {megabytes:.1f} MB of trace)")
    plain = float(run.scalars.loc[first:step, "step_time"].median())
    print(f"  the original's own steps {first}..{step}: {plain:.3f} s median (traced step: "
          f"{med['traced'][1] / plain:.0f}x that)")


if __name__ == "__main__":
    main()
