"""Make the example inputs in data/examples/ from one real training run of this project's runner.

    python data/examples/make_examples.py      # under half a minute on 2 CPU cores, no GPU

Trains ``data/examples/example.toml`` (a 2-layer, hidden-32 GPT, 8 steps, fp32, deterministic,
every site recorded at every step) with the workbench's runner into a temporary folder, then
writes from that run, replacing what is there:

    golden.json                  ``workbench golden RUN --out golden.json``: the workbench's golden file
    megatron_tb/events.out.tfevents.*
                                 the run's per-step scalars under Megatron-LM's TensorBoard tags, event
                                 by event as Megatron-LM's ``training_log`` writes them with
                                 ``--log-interval 1 --log-timers-to-tensorboard
                                 --log-validation-ppl-to-tensorboard --eval-interval 4``
    golden_values_cpu.json       ``workbench golden MLM --megatron`` of ``workbench import-megatron
                                 megatron_tb``: Megatron-LM's golden values made, as its pipeline makes
                                 them, from the TensorBoard log (float32, 5 decimals)
    te_debug/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-0.log
                                 the weight and wgrad statistics (min, max, cur_amax, l2_norm) of the
                                 run's eight linear layers in Transformer Engine's debug-log format,
                                 four decimals as nvdlfw_inspect prints them; the numbers are this
                                 project's statistics (TE needs a GPU)

and checks each with the command data/README.md shows. The files' numbers depend only on the run;
what changes from one regeneration to the next is the time: the TE log's line stamps, the event
file's name and wall times (the run's start plus its measured step times) and the step times
themselves (``iteration-time``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from workbench.cli import main as workbench
from workbench.config import load_run_config
from workbench.importers import write_te_log
from workbench.importers.te_log import DEFAULT_STATS, te_log_path
from workbench.runner.launch import launch
from workbench.store.reader import Run, open_run

EXAMPLES = Path(__file__).resolve().parent
REPO = EXAMPLES.parents[1]
CONFIG = EXAMPLES / "example.toml"
GOLDEN = EXAMPLES / "golden.json"
MEGATRON_GOLDEN = EXAMPLES / "golden_values_cpu.json"
MEGATRON_TB = EXAMPLES / "megatron_tb"
TE_DEBUG = EXAMPLES / "te_debug"
TE_LAYERS = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")
"""The layers Megatron's Transformer Engine layer spec builds from TE modules; TE logs only those."""


def te_sites(run: Run) -> list[str]:
    """The run's sites that a TE debug log has: each TE layer's weight (``weight``) and its gradient (``wgrad``)."""
    wanted = re.compile(rf"(param|grad):layers\.\d+\.({'|'.join(map(re.escape, TE_LAYERS))})\.weight")
    return [s for s in run.records().sites if wanted.fullmatch(s)]  # in the run's execution order


def write_te_example(run: Run) -> Path:
    records = run.records(lazy=False)
    sites = te_sites(run)
    chosen = dataclasses.replace(records, fingerprints=records.fingerprints[sites],
                                 stats=records.stats.sel(site=sites))
    shutil.rmtree(TE_DEBUG, ignore_errors=True)
    # relative to the repository: write_te_log writes the log's folder into its first line
    return write_te_log(te_log_path(TE_DEBUG.relative_to(REPO)), chosen, stats=DEFAULT_STATS, decimals=4)


def megatron_events(run: Run, global_batch_size: int) -> list[tuple[float, int, str, float]]:
    """(wall time, step, tag, value) in the order Megatron-LM's ``training_log`` and
    ``evaluate_and_print_results`` add them; iteration ``k`` is the store's step ``k - 1``; the validation loss
    where the run evaluated (example.toml's ``eval.every``, Megatron-LM's ``--eval-interval``)."""
    scalars = run.scalars
    start = dt.datetime.fromisoformat(str(run.attrs["started_at"])).timestamp()
    wall = start + np.cumsum(scalars["step_time"].to_numpy())  # [step] the end of each step
    events = []
    for step, row in scalars.iterrows():
        k, t = int(step) + 1, float(wall[int(step)])
        samples = k * global_batch_size  # args.consumed_train_samples
        for tag, name in (("learning-rate", "lr"), ("lm loss", "loss"), ("loss-scale", "loss_scale"),
                          ("grad-norm", "grad_norm")):
            events += [(t, k, tag, float(row[name])), (t, samples, f"{tag} vs samples", float(row[name]))]
        events.append((t, k, "iteration-time", float(row["step_time"])))
        loss = float(row["val_loss"])
        if math.isfinite(loss):
            events += [(t, k, "lm loss validation", loss), (t, samples, "lm loss validation vs samples", loss),
                       (t, k, "lm loss validation ppl", math.exp(min(20.0, loss))),
                       (t, samples, "lm loss validation ppl vs samples", math.exp(min(20.0, loss)))]
    return events


def write_megatron_example(run: Run, global_batch_size: int) -> Path:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    events = megatron_events(run, global_batch_size)
    shutil.rmtree(MEGATRON_TB, ignore_errors=True)
    MEGATRON_TB.mkdir(parents=True)
    start = dt.datetime.fromisoformat(str(run.attrs["started_at"])).timestamp()
    # torch's SummaryWriter names it events.out.tfevents.<time>.<host>.<pid>.<n>; no host or pid here
    path = MEGATRON_TB / f"events.out.tfevents.{int(start)}.workbench-example.0.0"
    with path.open("wb") as out:
        writer = RecordWriter(out)
        writer.write(Event(wall_time=start, file_version="brain.Event:2").SerializeToString())
        for wall_time, step, tag, value in events:  # SummaryWriter.add_scalar: one simple_value per event
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            writer.write(Event(wall_time=wall_time, step=step, summary=summary).SerializeToString())
    return path


def must(argv: list[str], expected: int = 0) -> None:
    print("$ workbench " + " ".join(argv), flush=True)
    code = workbench(argv)
    if code != expected:
        sys.exit(f"make_examples: `workbench {' '.join(argv)}` exited {code}, expected {expected}")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def main() -> None:
    os.chdir(REPO)  # every path written into a file is relative to the repository
    cfg = load_run_config(CONFIG)
    with tempfile.TemporaryDirectory(prefix="workbench-examples-") as tmp:
        run_dir = launch(cfg, Path(tmp) / cfg.name, progress=lambda line: print(f"{cfg.name}: {line}", flush=True))
        run = open_run(run_dir)
        must(["golden", str(run_dir), "--out", rel(GOLDEN)])
        print(f"wrote {write_megatron_example(run, cfg.global_batch_size).relative_to(REPO)}")
        imported = Path(tmp) / "mlm"
        must(["import-megatron", rel(MEGATRON_TB), "--out", str(imported)])
        must(["golden", str(imported), "--megatron", "--out", rel(MEGATRON_GOLDEN)])
        print(f"wrote {write_te_example(run)}")
        must(["import-te", rel(TE_DEBUG), "--out", str(Path(tmp) / "te")])
        must(["check", str(run_dir), "--golden", rel(GOLDEN)])
        must(["check", str(imported), "--golden", rel(MEGATRON_GOLDEN)])
        must(["check", str(imported), "--golden", rel(GOLDEN)], expected=1)  # float32 is not the run's float64
        must(["check", str(imported), "--golden", rel(GOLDEN), "--rtol", "1e-6"])


if __name__ == "__main__":
    main()
