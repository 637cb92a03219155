"""The verbs that train: ``run`` (one config), ``sweep`` (every config of a study file), ``demo``."""

from __future__ import annotations

import argparse
import time
from importlib import resources
from pathlib import Path

from workbench.cli._common import (
    DEFAULT_RUNS_DIR,
    ProgressPrinter,
    finite,
    output_problem,
    prefixed,
    print_safe,
    whole,
    writable_dir,
)
from workbench.config import load_run_config
from workbench.errors import ArgumentError
from workbench.names import inside
from workbench.words import counted


def register(verbs: argparse._SubParsersAction) -> None:
    for add in (_add_run, _add_sweep, _add_demo):
        add(verbs)


def _add_run(verbs: argparse._SubParsersAction) -> None:
    run = verbs.add_parser("run", help="train one run config into a run store")
    run.add_argument("config", type=Path, help="run config (TOML)")
    run.add_argument("--out", type=writable_dir, default=str(DEFAULT_RUNS_DIR),
                     help="folder for run folders (default %(default)s)")
    run.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    run.add_argument("--stop-after", type=whole(1), default=None, metavar="K",
                     help="stop after K steps (to resume later)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run of the same name")
    run.add_argument("--start-from", type=Path, default=None, metavar="CHECKPOINT",
                     help="start at another layout's checkpoint (RUN/checkpoints/step_K, or a run folder: its "
                          "latest) of the same config, resharded to this run's layout")
    run.add_argument("--against", type=Path, default=None, metavar="REF",
                     help="compare with REF (a run folder or a golden-values file) as it trains; stop at the "
                          "first flush that departs from it (exit 1)")
    run.add_argument("--rtol", type=finite(0, inclusive=True), default=None,
                     help="with --against: depart only beyond this tolerance (as `workbench check --rtol`)")
    run.add_argument("--keep-going", action="store_true", help="with --against: record the verdict, train on")
    run.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from workbench.runner.launch import launch
    from workbench.versions import check_megatron_core

    cfg = load_run_config(args.config)
    check_megatron_core()  # before the first line of progress
    run_dir = inside(args.out, args.out / cfg.name, "run folder")
    printer = ProgressPrinter()
    start = time.monotonic()
    printer(f"{cfg.name}: {cfg.summary()} -> {run_dir}", final=True)
    if (args.rtol is not None or args.keep_going) and args.against is None:
        raise ArgumentError("--rtol and --keep-going go with --against REF")
    launch(cfg, run_dir, resume=args.resume, stop_after=args.stop_after, overwrite=args.overwrite,
           progress=prefixed(printer, f"{cfg.name}: "), start_from=args.start_from, against=args.against,
           rtol=args.rtol, keep_going=args.keep_going)
    printer(f"{cfg.name}: done in {time.monotonic() - start:.1f} s; open it with "
            f"workbench.open_run({str(run_dir)!r})", final=True)
    if args.against is not None:
        from workbench.analysis.live import Departure
        from workbench.store.reader import open_run

        diverged = open_run(run_dir).attrs.get("diverged")
        if diverged is not None:
            print_safe(Departure.from_dict(diverged).verdict(str(run_dir), str(args.against),
                                                             stopped_after=diverged.get("stopped_after"),
                                                             against_a_run=Path(args.against).is_dir()))
            return 1
        print_safe(f"{cfg.name}: followed {args.against} at every compared step")
    return 0


def _add_sweep(verbs: argparse._SubParsersAction) -> None:
    sweep = verbs.add_parser("sweep", help="run every config of a study (skips complete runs)")
    sweep.add_argument("study", type=Path, help="study file (TOML)")
    sweep.add_argument("--out", type=writable_dir, default=None,
                       help="folder for the runs (default data/runs/<study>)")
    sweep.set_defaults(func=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    from workbench.config import read_toml

    out = args.out or DEFAULT_RUNS_DIR / str(read_toml(args.study).get("name", args.study.stem))
    if problem := output_problem(out, folder=True):
        raise ArgumentError(f"the study's folder: {problem} (or pass --out)")
    _run_study_file(args.study, out)
    return 0


def _run_study_file(path: Path, out: Path) -> list[Path]:
    from workbench.studies.study import load_study, run_study

    study = load_study(path)
    printer = ProgressPrinter()
    printer(f"study {study.name}: {counted(len(study.runs), 'run')} -> {out}", final=True)
    start = time.monotonic()

    def report(index: int, total: int, planned, message: str) -> None:  # type: ignore[no-untyped-def]
        final = not message.startswith("step=")
        printer(f"[{index}/{total}] {planned.name} ({planned.config.summary()}): {message}", final=final)

    folders = run_study(study, out, report)
    printer(f"study {study.name}: {counted(len(folders), 'run')} in {time.monotonic() - start:.1f} s", final=True)
    return list(folders)


def moe_demo_dir(out: Path) -> Path:
    """Where the demo's MoE study goes: beside the dense one (``data/runs/demo`` -> ``data/runs/demo-moe``)."""
    return out.with_name(out.name + "-moe")


def _add_demo(verbs: argparse._SubParsersAction) -> None:
    demo = verbs.add_parser("demo", help="run the demo study on CPU (and its MoE study, into OUT-moe)")
    demo.add_argument("--out", type=writable_dir, default=str(DEFAULT_RUNS_DIR / "demo"),
                      help="default %(default)s; the MoE study goes beside it (data/runs/demo-moe)")
    demo.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    """Both demo studies trained, each summarised, the determinism tax of both, then each injected fault
    investigated from anomaly to replay to operation."""
    from workbench.studies.summary import cost_summary, summarise_study
    from workbench.studies.workspace import Workspace

    moe_out = moe_demo_dir(args.out)
    if problem := output_problem(moe_out, folder=True):
        raise ArgumentError(f"the MoE study's folder, beside --out: {problem}")
    for study, out in (("demo.toml", args.out), ("demo_moe.toml", moe_out)):
        with resources.as_file(resources.files("workbench") / "examples" / study) as study_file:
            _run_study_file(study_file, out)
    for out in (args.out, moe_out):
        print(f"\n== {out} ==")
        print_safe(summarise_study(out).text())
    print_safe("\n" + cost_summary([Workspace.open(out) for out in (args.out, moe_out)]))
    nondet = Workspace.open(moe_out).roles.floor_runs[-2:]
    if len(nondet) == 2:
        print(f"\nto find the MoE operation: workbench bisect {moe_out / nondet[0]} {moe_out / nondet[1]}")
    _investigate_faults(args.out)
    return 0


def _investigate_faults(directory: Path) -> None:
    """The demo's last act: each run with an injected fault, from anomaly to replay to operation."""
    from workbench.investigate.investigation import investigate
    from workbench.studies.workspace import Workspace

    ws = Workspace.open(directory)
    printer = ProgressPrinter()
    for name in ws.roles.faulted:
        start = time.monotonic()
        found = investigate(ws.runs[name].path, reference=ws.runs[ws.roles.reference].path, overwrite=True,
                            progress=prefixed(printer, f"investigate {name}: "))
        printer(f"investigate {name}: done in {time.monotonic() - start:.1f} s", final=True)
        print_safe(f"\nanomaly, replay and bisect of {name} ({ws.runs[name].manifest.fault}):\n{found.summary()}")
