"""GPU check: a deterministic and a nondeterministic pair with NCCL on whatever GPUs are present.

    python benchmarks/gpu_check.py [--steps 30] [--out DIR]

Skipped (exit 0, one line) where no GPU exists; the project never depends on it. On a
machine with N GPUs it trains a bf16 GPT (8 layers, hidden 1024, seq 512) with DP=N twice
in deterministic mode and twice in Megatron's default (fast, nondeterministic) mode, all
sites recorded on every second step, and prints:

* whether the deterministic pair is bitwise identical (fingerprints at every recorded step)
  and where the nondeterministic pair first differs (step, then site in execution order);
* the recorder overhead: median step time of recorded over unrecorded steps;
* the cost of deterministic mode: median step time, deterministic over default (unrecorded
  steps only, so the recorder is excluded);
* the statistics + fingerprint pass on the device (``torch.compile``, Triton) over 64 M-element
  fp32 and bf16 tensors: its read rate as a fraction of the device's read bandwidth, taken as
  that of a plain ``torch.sum`` of the same tensor in the same loop;
* per nondeterminism source (``workbench.determinism.SOURCES``), one knob at a time: a run with
  that source alone on against one with every source off, as a table (first divergent step and
  site, final relative difference, and the tokens/s that making the source deterministic costs,
  with its bootstrap interval). A source the machine cannot switch (Transformer Engine absent;
  the all-reduce's association on fewer than three GPUs) is listed with the reason;
* Megatron-LM's own ``pretrain()`` (megatron-core 0.19+) recorded twice by the launcher
  (``torchrun -m workbench.megatron_lm tests/integration/pretrain_gpt.py ... --workbench-run DIR``, NCCL,
  DP=N, ``--deterministic-mode``): whether the two are bitwise identical, and the step time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

MODEL = {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 32768, "seq_length": 512,
         "micro_batch_size": 4}
TINY = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128, "seq_length": 32,
        "micro_batch_size": 2}
# pretrain() on the CPU: gloo, fp32 and no gradient clipping (Megatron's mixed-precision optimizer and its clipping
# take CUDA tensors only), none of the fused kernels (as tests/integration/test_megatron_pretrain.py)
CPU_ARGUMENTS = ("--distributed-backend gloo --use-cpu-initialization --no-bias-gelu-fusion --no-bias-dropout-fusion "
                 "--no-masked-softmax-fusion --no-persist-layer-norm --no-rope-fusion --clip-grad 0.0").split()


def medians(run) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(recorded, unrecorded) median step times after the first four steps."""
    scalars = run.scalars.iloc[4:]
    recorded = scalars.index % 2 == 0
    return float(np.median(scalars.step_time[recorded])), float(np.median(scalars.step_time[~recorded]))


def first_difference(a, b) -> str:  # type: ignore[no-untyped-def]
    fa, fb = a.fingerprints(), b.fingerprints()
    for step in fa.index:
        differing = [site for site in fa.columns if fa.loc[step, site] != fb.loc[step, site]]
        if differing:
            return f"step {step}, site {differing[0]} ({len(differing)} of {len(fa.columns)} sites differ)"
    return "none: bitwise identical at every recorded step"


def pass_bandwidth() -> None:
    """The recorder's statistics pass on the GPU against a plain reduction of the same tensor."""
    import time

    import torch

    from workbench.recorder import kernels

    compiled = kernels.compiled()
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(64 * 2**20, device="cuda").to(dtype)
        coords = kernels.identity_coords(x.shape, x.device)

        def timed(fn) -> float:  # type: ignore[no-untyped-def]
            fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(7):
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            return float(np.median(times))

        pass_s = timed(lambda x=x, c=coords: kernels.partial_stats(x, c, 1e-38, 1e38, fn=compiled))
        sum_s = timed(lambda x=x: x.sum())
        name = str(dtype).removeprefix("torch.")
        print(f"statistics pass, {name} 64 M elements: {x.nbytes / pass_s / 1e9:.0f} GB/s, "
              f"{sum_s / pass_s:.2f} of the read bandwidth of torch.sum ({x.nbytes / sum_s / 1e9:.0f} GB/s)")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            kernels.partial_stats(x, coords, 1e-38, 1e38, fn=compiled)
            torch.cuda.synchronize()
        launched = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        print(f"  its kernels ({len(launched)}, {sum(e.device_time for e in launched) / 1e3:.3f} ms on the device "
              f"of {pass_s * 1e3:.3f} ms): " + ", ".join(f"{e.name[:40]} {e.device_time:.0f} us" for e in launched))


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: a part that would start after this is skipped and says so")
    parser.add_argument("--cpu", action="store_true",
                        help="without a GPU: every part but the GPU pass, on a tiny model (checks this script)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu:
        print("gpu_check: no GPU on this machine; skipped (--cpu runs its parts on a tiny model)")
        return
    from workbench.config import RunConfig
    from workbench.runner.launch import launch
    from workbench.store.reader import open_run

    gpus = 1 if args.cpu else torch.cuda.device_count()
    model = TINY if args.cpu else MODEL
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    base = RunConfig.from_dict({
        "name": "gpu", "steps": args.steps, "precision": "bf16",
        "global_batch_size": 4 * model["micro_batch_size"] * gpus,
        "micro_batch_size": model["micro_batch_size"], "layout": {"dp": gpus}, "record": {"every": 2},
        "model": {k: v for k, v in model.items() if k != "micro_batch_size"},
    })
    device = ("CPU (--cpu)" if args.cpu else f"{torch.cuda.get_device_name(0)}, "
              f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    print(f"{gpus} x {device}, torch {torch.__version__}; {base.summary()}")
    start = time.monotonic()

    def part(name: str, fn: Callable[[], None]) -> None:
        """Each part on its own: one that fails prints its traceback and the next still runs."""
        elapsed = time.monotonic() - start
        if args.budget is not None and elapsed > args.budget:
            print(f"[{name}] skipped: {elapsed:.0f} s spent of a {args.budget:.0f} s budget", flush=True)
            return
        print(f"[{name}] at {elapsed:.0f} s", flush=True)
        try:
            fn()
        except Exception:
            print(f"[{name}] failed:\n{traceback.format_exc()}", flush=True)

    def pair() -> None:
        runs = {}
        for name, deterministic in (("det-a", True), ("det-b", True), ("nondet-a", False), ("nondet-b", False)):
            cfg = base.with_overrides({"name": name, "deterministic": deterministic})
            runs[name] = open_run(launch(cfg, out / name, overwrite=True))
            on, off = medians(runs[name])
            print(f"{name:>9}: median step {off:.4f} s unrecorded, {on:.4f} s recorded "
                  f"(recorder overhead {on / off:.3f}x), final loss {runs[name].final_loss:.4f}", flush=True)
        print("deterministic pair, first difference:   ", first_difference(runs["det-a"], runs["det-b"]))
        print("nondeterministic pair, first difference:", first_difference(runs["nondet-a"], runs["nondet-b"]))
        det = np.median([medians(runs[n])[1] for n in ("det-a", "det-b")])
        default = np.median([medians(runs[n])[1] for n in ("nondet-a", "nondet-b")])
        print(f"deterministic / default step time: {det / default:.3f} (recorder excluded)", flush=True)

    part("pair", pair)
    if not args.cpu:
        part("statistics pass", pass_bandwidth)
    part("pretrain()", lambda: megatron_pretrain(out / "pretrain", gpus, args.steps, model, on_cpu=args.cpu))
    part("per source", lambda: per_source(base, out / "sources", None if args.budget is None else
                                          start + args.budget))
    print(f"done in {time.monotonic() - start:.0f} s; runs in {out}")


def megatron_pretrain(out: Path, gpus: int, steps: int, model: dict[str, int], on_cpu: bool) -> None:
    """Megatron-LM's pretrain() under the workbench's launcher, twice, deterministic: the first difference."""
    import os
    import subprocess
    import sys

    from workbench.store.reader import open_run

    try:
        import megatron.training.determinism  # noqa: F401  (the entry script is 0.19's pretrain_gpt.py)
    except ImportError:
        print("pretrain(): skipped (megatron-core before 0.19)")
        return
    entry = Path(__file__).resolve().parents[1] / "tests" / "integration" / "pretrain_gpt.py"
    arguments = (f"--tensor-model-parallel-size 1 --num-layers {model['num_layers']} "
                 f"--hidden-size {model['hidden_size']} --num-attention-heads {model['num_attention_heads']} "
                 f"--seq-length {model['seq_length']} --max-position-embeddings {model['seq_length']} "
                 f"--tokenizer-type NullTokenizer --vocab-size {model['vocab_size']} --mock-data --split 99,1,0 "
                 f"--micro-batch-size {model['micro_batch_size']} "
                 f"--global-batch-size {4 * model['micro_batch_size'] * gpus} "
                 f"--train-iters {steps} --lr 1e-4 --lr-decay-style constant --eval-iters 0 "
                 f"--eval-interval 100000 --log-interval 10 --seed 1234 --deterministic-mode "
                 "--transformer-impl local --no-gradient-accumulation-fusion --attention-dropout 0.0 "
                 "--hidden-dropout 0.0").split() + (CPU_ARGUMENTS if on_cpu else ["--bf16"])
    runs = []
    for name in ("det-a", "det-b"):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus),
                   "-m", "workbench.megatron_lm", str(entry), *arguments, "--data-cache-path", str(out / "cache"),
                   "--workbench-run", str(out / name)]
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ,
                                                                             "CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            lines = [line for line in result.stderr.splitlines() if line.strip() and "Warning" not in line]
            print(f"pretrain() {name}: failed (exit {result.returncode}; the whole log: {out / name}.log):\n"
                  + "\n".join(lines[-12:]))
            return
        runs.append(open_run(out / name))
        step = float(runs[-1].scalars["step_time"].iloc[2:].median())
        print(f"pretrain() {name}: {runs[-1].steps_completed} steps, median step {step:.4f} s (recorded)")
    print("pretrain() deterministic pair, first difference:", first_difference(*runs))


def per_source(base, out: Path, deadline: float | None) -> None:  # type: ignore[no-untyped-def]
    """Each source alone against every source off (recorded every second step, as above); the sources not
    started by ``deadline`` (``time.monotonic()``) are listed as not run."""
    import pandas as pd

    from workbench.determinism import SOURCES, SourceState
    from workbench.errors import ConfigError
    from workbench.runner.launch import launch
    from workbench.studies.workspace import Workspace

    off = {f"nondeterminism.{name}": False for name in SOURCES}
    launch(base.with_overrides({"name": "det", "deterministic": True}), out / "det", overwrite=True)
    launch(base.with_overrides({"name": "all-off", "deterministic": False, **off}), out / "all-off", overwrite=True)
    skipped = []
    for name in SOURCES:
        try:
            cfg = base.with_overrides({"name": name, "deterministic": False, **off, f"nondeterminism.{name}": True})
        except ConfigError as err:
            skipped.append(f"{name}: {err}")
            continue
        if cfg.source_states(on_gpu=True)[name] is not SourceState.ON:
            skipped.append(f"{name}: unavailable here (needs {SOURCES[name].needs})")
            continue
        if deadline is not None and time.monotonic() > deadline:
            skipped.append(f"{name}: out of time (--budget)")
            continue
        launch(cfg, out / name, overwrite=True)
    table = Workspace.open(out).attribution()
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print("per source, alone against every source off (cost: tokens/s lost making it deterministic, 95% "
              "bootstrap interval):")
        print(table[["source", "first_step", "first_site", "final_error", "cost_percent", "cost_low",
                     "cost_high"]].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    for line in skipped:
        print(f"  not run: {line}")


if __name__ == "__main__":
    main()
