"""GPU check: one script of at most five minutes (``--budget``), its parts in priority order.

    python benchmarks/gpu_check.py [--budget 300] [--steps 30] [--out DIR]
    python benchmarks/gpu_check.py --cpu      # a dry run on the CPU: every part on a tiny model

Skipped (exit 0, one line) where no GPU exists; the project never depends on it. It prints the device, driver,
torch and Triton, then, each part skipped with a line once the budget is spent:

1. **correctness**: the Triton statistics kernel on the device against the numpy reference (fingerprints,
   counts and extremes bitwise, sums to rounding) for every element type, NaN, +-Inf, +-0, subnormals, values
   past 2^60, wrapped indices, tensor-parallel shards that merge, an activation placement, a copy and an
   update's difference; every case twice, the two compared bitwise;
2. **statistics pass**: its read rate against ``torch.sum`` and a copy of the same tensor at 1, 16 and 64 M
   elements, fp32 and bf16 (CUDA events, medians of 20), and the compiled pass (the fallback) at 64 M;
3. **recorded step** (one process, the model below, Megatron's distributed optimizer): the step time recorded
   every step and every 10th step against unrecorded steps; kernel launches a recorded step adds; the syncs the
   recorder makes on the training stream (``torch.cuda.set_sync_debug_mode``), on a step without a flush and
   on a flush; the device memory a recorded step adds beyond the start-of-step copy of the parameters;
4. **pair**: on every GPU (DP=N, NCCL) a deterministic and a nondeterministic pair, recorded every second step:
   whether the deterministic pair is bitwise identical, where the other first differs, and the deterministic /
   default step time;
5. **pretrain()**: Megatron-LM's own loop (megatron-core 0.19+) recorded twice by the launcher
   (``torchrun -m workbench.megatron_lm tests/integration/pretrain_gpt.py ... --workbench-run DIR``): whether
   the two are bitwise identical;
6. **per source**: each nondeterminism source alone against every source off (first divergence, final
   difference, the tokens/s that making it deterministic costs). A source the machine cannot switch is listed
   with the reason.

The model: a bf16 GPT of 8 layers, hidden 1024, sequence 512, vocabulary 32,768, 4 micro-batches of 4
(168 M parameters). ``--cpu`` runs the Triton kernel under Triton's interpreter on small tensors and the rest
on a tiny model with gloo: it checks this script, and measures nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

if "--cpu" in sys.argv[1:]:  # the kernel under Triton's interpreter: set before triton is first imported
    os.environ["TRITON_INTERPRET"] = "1"

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


def correctness(device: str) -> None:
    """The Triton kernel on ``device`` (the interpreter's on "cpu") against the numpy reference, every case twice."""
    import torch

    from workbench.recorder import kernels, triton_pass
    from workbench.statistics import (
        PRECISION_LIMITS,
        STAT_NAMES,
        assemble,
        fingerprint_reference,
        pack_fingerprint,
        stats_reference,
    )

    n = 5000 if device == "cpu" else 1 << 20
    exact = [i for i, name in enumerate(STAT_NAMES) if name not in ("sum", "sum_sq", "l2")]
    special = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, 1.01e-39, 6e-8, 2.0**-9, 2.0**61, 448.0]
    words = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def run(x, rows, precision, **how):  # type: ignore[no-untyped-def]
        acc, lanes = kernels.new_accumulators(x.device)
        assert triton_pass.accumulate(x, rows, *PRECISION_LIMITS[precision], acc, lanes, **how), "not taken"
        return acc.cpu(), lanes.cpu()

    cases = []
    generator = torch.Generator().manual_seed(0)
    for dtype, precision in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16"),
                             (torch.float64, "fp32"), (torch.float8_e4m3fn, "fp8"), (torch.float8_e5m2, "fp8")):
        values = torch.randn(n, generator=generator, dtype=torch.float64) * 3
        values[: len(special) * 3: 3] = torch.tensor(special, dtype=torch.float64)
        cases.append((str(dtype).removeprefix("torch."), values.to(dtype), kernels.identity_coords((n,)), None,
                      precision, {}))
    x = torch.randn(2, n // 2, generator=generator)
    cases.append(("indices past 2^32", x, kernels.coords_tensor([[0, n], [2**32 - 700, 1]]),
                  (np.arange(2)[:, None] * n + 2**32 - 700 + np.arange(n // 2)[None, :]).astype(np.uint64), "fp32", {}))
    full = torch.randn(4, 8, n // 32, generator=generator).to(torch.bfloat16)  # [samples, seq, hidden]
    local = full[2:].transpose(0, 1).contiguous()  # the second micro-batch, as Megatron holds it
    from workbench.recorder.placement import activation_placement

    placement = activation_placement(tuple(local.shape), sample_offset=2, global_batch=4, feature_shard=None,
                                     tp_rank=0)
    index = (np.arange(4 * 8 * (n // 32)).reshape(4, 8, -1)[2:].transpose(1, 0, 2)).astype(np.uint64)
    cases.append(("activation placement", local, placement.coords(torch.device("cpu")), index, "bf16", {}))
    weight = torch.randn(64, n // 64, generator=generator).to(torch.bfloat16)
    shard = weight[:, n // 128:].contiguous()  # a row-parallel shard: the second half of every row
    index = (np.arange(64)[:, None] * (n // 64) + n // 128 + np.arange(n // 128)[None, :]).astype(np.uint64)
    cases.append(("TP shard", shard, kernels.coords_tensor([[0, n // 64], [n // 128, 1]]), index, "bf16", {}))
    before = torch.randn(n, generator=generator).to(torch.bfloat16)
    cases.append(("update difference", (before.float() + 1e-3).to(torch.bfloat16), kernels.identity_coords((n,)),
                  None, "fp32", {"before": before}))
    cases.append(("copy", before, kernels.identity_coords((n,)), None, "bf16", {"copy": True}))
    failures = 0
    for name, x, coords, index, precision, how in cases:
        rows = kernels.host_rows(coords)
        on = x.to(device)
        if "before" in how:
            how = {"before": how["before"].to(device)}
            reference = (x.float() - how["before"].cpu().float())
        else:
            reference = x
        results, copies = [], []
        for _ in range(2):
            copy = torch.empty_like(on) if "copy" in how else None
            results.append(run(on, rows, precision, **({"copy": copy} if copy is not None else how)))
            copies.append(copy)
        acc, lanes = results[0]
        fingerprint = pack_fingerprint(*lanes.tolist())
        expected = fingerprint_reference(reference.view(words[reference.element_size()]).numpy(), index)
        stats = assemble(acc[:8].numpy(), acc[8:].numpy())
        want = stats_reference(reference.double().numpy(), precision)
        problems = []
        if fingerprint != expected:
            problems.append(f"fingerprint {fingerprint:016x} != reference {expected:016x}")
        if not np.array_equal(stats[exact], want[exact], equal_nan=True):
            problems.append(f"counts or extremes {stats[exact]} != {want[exact]}")
        if not np.allclose(stats, want, rtol=2e-6, equal_nan=True):
            problems.append(f"sums {stats[1:3]} != {want[1:3]}")
        if not (torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])):
            problems.append("the two runs differ")
        if copies[0] is not None and not torch.equal(copies[0].cpu().view(torch.uint8), x.view(torch.uint8)):
            problems.append("the copy differs")
        failures += bool(problems)
        print(f"  {name:>22}: {'ok' if not problems else 'WRONG: ' + '; '.join(problems)}", flush=True)
    # the parameter side's table kernel: many tensors in one launch, each as the reference
    tensors = [torch.randn(size, generator=generator).to(torch.bfloat16) for size in (n, 3, n // 7, 0, 40)]
    problems = []
    for _ in range(2):
        entries = [(x.to(device), kernels.host_rows(kernels.identity_coords(x.shape)),
                    *kernels.new_accumulators(torch.device(device)), None, None) for x in tensors]
        read, failed = triton_pass.accumulate_table(entries, *PRECISION_LIMITS["bf16"])
        if failed or not all(read):
            problems.append(f"not read: {read} {failed}")
        for x, entry in zip(tensors, entries):
            if pack_fingerprint(*entry[3].cpu().tolist()) != fingerprint_reference(x.view(torch.int16).numpy()):
                problems.append(f"{x.numel()} elements: fingerprint differs")
    failures += bool(problems)
    print(f"  {'table of tensors':>22}: {'ok' if not problems else 'WRONG: ' + '; '.join(problems)}", flush=True)
    print(f"correctness: {len(cases) + 1 - failures} of {len(cases) + 1} cases bitwise as the reference, each twice "
          "alike")


def _cuda_timed(fn, repeats: int = 20) -> float:  # type: ignore[no-untyped-def]
    """Median seconds of ``fn`` over ``repeats`` runs, timed with CUDA events (after one warm-up)."""
    import torch

    fn()
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return float(np.median(times))


def pass_bandwidth() -> None:
    """The recorder's statistics pass on the GPU against a plain reduction and a copy of the same tensor."""
    import torch

    from workbench.recorder import kernels, triton_pass

    print(f"{'dtype':>8} {'elements':>9} {'pass GB/s':>10} {'sum GB/s':>9} {'copy GB/s':>10} {'pass/sum':>9} "
          f"{'pass/copy':>10} {'launches':>9}")
    for dtype in (torch.float32, torch.bfloat16):
        for millions in (1, 16, 64):
            x = torch.randn(millions << 20, device="cuda").to(dtype)
            rows = kernels.host_rows(kernels.identity_coords(x.shape, x.device))
            acc, lanes = kernels.new_accumulators(x.device)
            target = torch.empty_like(x)
            pass_s = _cuda_timed(lambda x=x, rows=rows, acc=acc, lanes=lanes:
                                 triton_pass.accumulate(x, rows, 1e-38, 1e38, acc, lanes))
            sum_s = _cuda_timed(lambda x=x: x.sum())
            copy_s = _cuda_timed(lambda x=x, target=target: target.copy_(x))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
                triton_pass.accumulate(x, rows, 1e-38, 1e38, acc, lanes)
                torch.cuda.synchronize()
            launched = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            name = str(dtype).removeprefix("torch.")
            print(f"{name:>8} {millions:>7} M {x.nbytes / pass_s / 1e9:>10.0f} {x.nbytes / sum_s / 1e9:>9.0f} "
                  f"{2 * x.nbytes / copy_s / 1e9:>10.0f} {sum_s / pass_s:>9.2f} {copy_s / 2 / pass_s:>10.2f} "
                  f"{len(launched):>9}", flush=True)
        coords = kernels.identity_coords(x.shape, x.device)
        compiled_s = _cuda_timed(lambda x=x, c=coords: kernels.partial_stats(x, c, 1e-38, 1e38,
                                                                             fn=kernels.compiled()), 7)
        print(f"{name:>8}    64 M compiled pass (the fallback): {x.nbytes / compiled_s / 1e9:.0f} GB/s, "
              f"{sum_s / compiled_s:.2f} of torch.sum", flush=True)


def step_probe(base, out: Path, on_cpu: bool) -> None:  # type: ignore[no-untyped-def]
    """One process, one device: a Trainer recorded every 10th step, then one recorded every step."""
    import gc
    import warnings

    import torch
    import torch.distributed as dist

    from workbench.runner import cpu_compat

    device = torch.device("cpu") if on_cpu else torch.device("cuda", 0)
    if on_cpu:
        cpu_compat.install()  # before Megatron is imported
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from workbench.runner.trainer import Trainer
    from workbench.store.manifest import runner_manifest
    from workbench.store.writer import create_store
    if not dist.is_initialized():
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(29500 + os.getpid() % 1000)})
        dist.init_process_group("gloo" if on_cpu else "nccl", rank=0, world_size=1)
        ps.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    steps = 24
    large = {"optim.use_distributed_optimizer": True, "optim.overlap_grad_reduce": True,
             "optim.overlap_param_gather": True}
    cfg_of = {every: base.with_overrides({"name": f"every-{every}", "steps": steps, "layout": {"dp": 1},
                                          "global_batch_size": 4 * base.micro_batch_size, "record.every": max(every, 1),
                                          "record.enabled": every > 0, **large})
              for every in (0, 10, 1)}

    def synchronizing(fn):  # type: ignore[no-untyped-def]
        """The synchronizing CUDA calls ``fn`` makes from the workbench's code: file:line -> count."""
        if on_cpu:
            fn()
            return None
        found: dict[str, int] = {}
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        for w in caught:
            if "synchroniz" in str(w.message) and "workbench/recorder" in w.filename:
                where = f"{w.filename.split('workbench/')[-1]}:{w.lineno}"
                found[where] = found.get(where, 0) + 1
        return found

    baseline, baseline_peak, unrecorded_launches = float("nan"), 0, 0
    for every, cfg in cfg_of.items():
        run_dir = out / cfg.name
        create_store(run_dir, runner_manifest(cfg), cfg.steps)
        if not on_cpu:
            torch.cuda.reset_peak_memory_stats()
            floor = torch.cuda.memory_allocated()
        trainer = Trainer(cfg, device, run_dir)
        copy_bytes = sum(p.numel() * p.element_size() for chunk in trainer.model.chunks for p in chunk.parameters())
        times: dict[bool, list[float]] = {True: [], False: []}
        recorded_steps = set(cfg.record.recorded_steps(cfg.steps)) if every else set()
        for step in range(steps):
            recorded = step in recorded_steps
            if every == 1 and step in (12, 19):  # a recorded step without a flush; the flush (every 10 steps)
                syncs = synchronizing(lambda s=step, t=trainer, log=times[True]:
                                      log.append(t.train_step(s)["step_time"]))
                print(f"  syncs the recorder makes on {'a recorded step without a flush' if step == 12 else 'a flush'}"
                      f": {'n/a on the CPU' if syncs is None else sum(syncs.values())} {syncs or ''}", flush=True)
            elif step == 14 and every in (0, 1):
                activities = [torch.profiler.ProfilerActivity.CPU if on_cpu else torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=activities) as profile:
                    times[recorded].append(trainer.train_step(step)["step_time"])
                kind = torch.autograd.DeviceType.CPU if on_cpu else torch.autograd.DeviceType.CUDA
                launches = len([e for e in profile.events() if e.device_type == kind])
                what = "operations (CPU)" if on_cpu else "kernel launches"
                if every == 0:
                    unrecorded_launches = launches
                    print(f"  {what} in an unrecorded step: {launches}", flush=True)
                else:
                    print(f"  {what} in a recorded step: {launches}, {launches - unrecorded_launches} of them the "
                          "recorder's", flush=True)
            else:
                times[recorded].append(trainer.train_step(step)["step_time"])
        if trainer.recorder is not None:
            trainer.recorder.close()
        peak = 0 if on_cpu else torch.cuda.max_memory_allocated() - floor
        if every == 0:
            baseline, baseline_peak = float(np.median(times[False][4:])), peak
            print(f"  unrecorded: median step {baseline * 1e3:.1f} ms", flush=True)
        else:
            on = float(np.median(times[True][1:]))
            print(f"  recorded every {every:>2} step(s): median recorded step {on * 1e3:.1f} ms, "
                  f"{on / baseline:.3f}x an unrecorded one; the whole run "
                  f"{(on + (every - 1) * baseline) / every / baseline:.3f}x", flush=True)
            if not on_cpu:
                print(f"  device memory at the peak: {(peak - baseline_peak) / 2**20:.1f} MiB more than unrecorded; "
                      f"the start-of-step copy of the parameters is {copy_bytes / 2**20:.1f} MiB, so "
                      f"{(peak - baseline_peak - copy_bytes) / 2**20:.1f} MiB beyond it", flush=True)
            print(f"  statistics paths: {trainer.recorder.statistics_paths()}", flush=True)
        del trainer
        gc.collect()
        if not on_cpu:
            torch.cuda.empty_cache()


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget", type=float, default=300.0,
                        help="seconds (default 300): a part that would start after this is skipped and says so")
    parser.add_argument("--cpu", action="store_true",
                        help="without a GPU: every part on a tiny model, the kernel under Triton's interpreter (checks "
                             "this script, measures nothing)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu:
        print("gpu_check: no GPU on this machine; skipped (--cpu runs its parts on a tiny model)")
        return
    try:
        import triton

        from workbench.recorder import triton_pass  # noqa: F401  (under --cpu: made for the interpreter, here)
        triton_line = f"Triton {triton.__version__}"
    except ImportError:
        triton_line = "no Triton"
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
    if args.cpu:
        device = "CPU (--cpu: a dry run, no figure below is a measurement)"
    else:
        import subprocess

        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip().splitlines()
        device = (f"{torch.cuda.get_device_name(0)}, driver {driver[0] if driver else '?'}, CUDA {torch.version.cuda}, "
                  f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    print(f"{gpus} x {device}; torch {torch.__version__}, {triton_line}; {base.summary()}", flush=True)
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

    if triton_line != "no Triton":
        part("correctness", lambda: correctness("cpu" if args.cpu else "cuda"))
    os.environ.pop("TRITON_INTERPRET", None)  # the runs this script launches record as they would anywhere
    if not args.cpu:
        part("statistics pass", pass_bandwidth)
    part("recorded step", lambda: step_probe(base, out / "probe", on_cpu=args.cpu))
    part("pair", pair)
    part("pretrain()", lambda: megatron_pretrain(out / "pretrain", gpus, args.steps, model, on_cpu=args.cpu))
    part("per source", lambda: per_source(base, out / "sources", start + args.budget))
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
