"""The ``workbench`` command: thin verbs over the library.

    workbench run CONFIG.toml [--out DIR] [--resume | --start-from CHECKPOINT] [--stop-after K] [--overwrite]
    workbench sweep STUDY.toml [--out DIR]
    workbench demo [--out DIR]
    workbench ls DIR
    workbench study DIR
    workbench compare A B [--json]
    workbench check RUN --golden REF|FILE.json [--steps N] [--rtol X]
    workbench golden RUN --out FILE.json [--megatron] [--steps N] [--interval K]
    workbench figure heatmap|sweep|trajectories|sources RUNS... -o FILE.pdf [--size column|page] [--data FILE.csv]
    workbench resume-check RESUMED REFERENCE [--from-step K] [--floor RUN]
    workbench report RUNS... -o report.html [--format html|pdf]
    workbench import-te LOG... --out DIR [--name NAME]
    workbench import-megatron LOGDIR --out DIR [--name NAME] [--tokens-per-step T]
    workbench anomalies RUN [--spike-factor F] [--window N] [--follow]
    workbench replay RUN --step K [--out DIR] [--trace] [--overwrite] [--json]
    workbench bisect A B [--step K] [--out DIR] [--overwrite] [--json]

Every verb builds config objects and calls library functions. A ``WorkbenchError`` is
printed as one line (``workbench: error: ...``) with exit code 2; a failed run exits 1. So is a
bad argument: numbers outside their range and output paths that cannot be written are refused
while parsing, before any work starts. Names from run stores are printed with their control
characters escaped (``terminal_safe``).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import NoReturn

from workbench.config import load_run_config
from workbench.errors import ArgumentError, LaunchError, WorkbenchError

DEFAULT_RUNS_DIR = Path("data/runs")

_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))} | {
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def terminal_safe(text: str) -> str:
    """``text`` with its control characters (C0, DEL, C1) escaped as ``\\x1b``, ``\\n`` ...: a run name
    or a site name from a store cannot move the cursor, recolour the terminal or start a new line."""
    return text.translate(_ESCAPES)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other error of the command (``--help`` as usual)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"workbench: error: {terminal_safe(message)} (see `{self.prog} --help`)\n")


def _whole(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum`` (argparse names the option in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a whole number >= {minimum}")
        return value
    return parse


def _finite(minimum: float, *, inclusive: bool) -> Callable[[str], float]:
    """An argparse ``type``: a finite number >= ``minimum`` (``inclusive``) or > it."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value >= minimum if inclusive else value > minimum)):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a finite number "
                                             f"{'>=' if inclusive else '>'} {minimum:g}")
        return value
    return parse


def _output_problem(path: Path, *, folder: bool) -> str | None:
    """Why ``path`` cannot be written (as a folder with ``folder``, else as a file); None when it can.
    The nearest existing ancestor must be a writable folder; nothing is created to find out."""
    if folder and os.path.lexists(path) and not path.is_dir():
        return f"{path} is a file, not a folder; name a folder, or move the file away"
    if not folder and path.is_dir():
        return f"{path} is a folder, not a file; name a file (in it, for instance)"
    start = path if folder else path.parent
    ancestor = next((p for p in (start, *start.parents) if os.path.lexists(p)), Path.cwd())
    if not ancestor.is_dir():
        return f"{path} lies under {ancestor}, which is a file, not a folder; choose a path outside it"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{path} cannot be written: {ancestor} is not writable by this user; choose a writable folder"
    return None


def _writable_dir(text: str) -> Path:
    """An argparse ``type``: an output folder that can be created (or exists)."""
    if problem := _output_problem(Path(text), folder=True):
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


def _writable_file(text: str) -> Path:
    """An argparse ``type``: an output file that can be written (created or replaced)."""
    if problem := _output_problem(Path(text), folder=False):
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


class ProgressPrinter:
    """Progress on one line on a terminal; a line every few seconds in a log."""

    def __init__(self, stream=None, interval_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
        self._stream, self._interval = stream or sys.stderr, interval_s  # sys.stderr now, not at import
        self._tty = self._stream.isatty()
        self._last = 0.0

    def __call__(self, message: str, *, final: bool = False) -> None:
        now = time.monotonic()
        if self._tty:
            end = "\n" if final else ""
            self._stream.write(f"\r\033[K{terminal_safe(message)}{end}")  # our own control of the line only
            self._stream.flush()
        elif final or now - self._last >= self._interval:
            self._stream.write(terminal_safe(message) + "\n")
            self._stream.flush()
            self._last = now


def _cmd_run(args: argparse.Namespace) -> int:
    from workbench.runner.launch import launch
    from workbench.versions import check_megatron_core

    cfg = load_run_config(args.config)
    check_megatron_core()  # before the first line of progress
    run_dir = args.out / cfg.name
    printer = ProgressPrinter()
    start = time.monotonic()
    printer(f"{cfg.name}: {cfg.summary()} -> {run_dir}", final=True)
    launch(cfg, run_dir, resume=args.resume, stop_after=args.stop_after, overwrite=args.overwrite,
           progress=lambda line: printer(f"{cfg.name}: {line}"), start_from=args.start_from)
    printer(f"{cfg.name}: done in {time.monotonic() - start:.1f} s; open it with "
            f"workbench.open_run({str(run_dir)!r})", final=True)
    return 0


def _run_study_file(path: Path, out: Path) -> list[Path]:
    from workbench.studies.study import load_study, run_study

    study = load_study(path)
    printer = ProgressPrinter()
    printer(f"study {study.name}: {len(study.runs)} runs -> {out}", final=True)
    start = time.monotonic()

    def report(index: int, total: int, planned, message: str) -> None:  # type: ignore[no-untyped-def]
        final = not message.startswith("step=")
        printer(f"[{index}/{total}] {planned.name} ({planned.config.summary()}): {message}", final=final)

    folders = run_study(study, out, report)
    printer(f"study {study.name}: {len(folders)} runs in {time.monotonic() - start:.1f} s", final=True)
    return list(folders)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from workbench.config import read_toml

    out = args.out or DEFAULT_RUNS_DIR / str(read_toml(args.study).get("name", args.study.stem))
    if problem := _output_problem(out, folder=True):
        raise ArgumentError(f"the study's folder: {problem} (or pass --out)")
    _run_study_file(args.study, out)
    return 0


def moe_demo_dir(out: Path) -> Path:
    """Where the demo's MoE study goes: beside the dense one (``data/runs/demo`` -> ``data/runs/demo-moe``)."""
    return out.with_name(out.name + "-moe")


def _cmd_demo(args: argparse.Namespace) -> int:
    import pandas as pd

    from workbench.studies.workspace import Workspace

    moe_out = moe_demo_dir(args.out)
    if problem := _output_problem(moe_out, folder=True):
        raise ArgumentError(f"the MoE study's folder, beside --out: {problem}")
    for study, out in (("demo.toml", args.out), ("demo_moe.toml", moe_out)):
        with resources.as_file(resources.files("workbench") / "examples" / study) as study_file:
            _run_study_file(study_file, out)
    for out in (args.out, moe_out):
        print(f"\n== {out} ==")
        _cmd_study(argparse.Namespace(directory=out))
    cost = pd.concat([Workspace.open(out).cost() for out in (args.out, moe_out)], ignore_index=True)
    print("\ncost of deterministic mode per configuration, both studies (tokens/s; 95% bootstrap interval; on "
          "this CPU the nondeterministic side differs only by the emulated atomics):")
    print(cost[["config", "deterministic_tokens_per_s", "default_tokens_per_s", "tax_percent", "ci_low", "ci_high"]]
          .to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    nondet = Workspace.open(moe_out).roles.floor_runs[-2:]
    if len(nondet) == 2:
        print(f"\nto find the MoE operation: workbench bisect {moe_out / nondet[0]} {moe_out / nondet[1]}")
    _investigate_faults(args.out)
    return 0


def _prefixed(printer: ProgressPrinter, prefix: str, message: str) -> None:
    printer(prefix + message)


def _investigate_faults(directory: Path) -> None:
    """The demo's last act: each run with an injected fault, from anomaly to replay to operation."""
    from workbench.investigate.investigation import investigate
    from workbench.studies.workspace import Workspace

    ws = Workspace.open(directory)
    printer = ProgressPrinter()
    for name in ws.roles.faulted:
        start = time.monotonic()
        found = investigate(ws.runs[name].path, reference=ws.runs[ws.roles.reference].path, overwrite=True,
                            progress=functools.partial(_prefixed, printer, f"investigate {name}: "))
        printer(f"investigate {name}: done in {time.monotonic() - start:.1f} s", final=True)
        print(f"\nanomaly, replay and bisect of {name} ({ws.runs[name].info.fault}):")
        print(found.summary())


def _cmd_study(args: argparse.Namespace) -> int:
    from workbench.studies.summary import summarise_study

    print(summarise_study(args.directory).text())
    return 0


def _cmd_ls(args: argparse.Namespace) -> int:
    from workbench.store.reader import list_runs

    table = list_runs(args.directory, on_skip=lambda path, err: print(
        terminal_safe(f"workbench: skipped {path}: {err}"), file=sys.stderr))
    if table.empty:
        print(terminal_safe(f"no runs under {args.directory}"))
        return 0
    table = table.drop(columns=["path"]).map(lambda cell: terminal_safe(cell) if isinstance(cell, str) else cell)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    import json

    from workbench.analysis import compare
    from workbench.analysis.growth import amplification
    from workbench.store.reader import open_run

    result = compare(open_run(args.a).records(), open_run(args.b).records())
    if args.json:
        growth = amplification(result)
        print(json.dumps({**result.to_dict(), "growth_log10_per_step": _finite_or_none(growth.rate),
                          "saturation_step": growth.saturation_step, "plateau": _finite_or_none(growth.plateau)},
                         indent=1))
        return 0
    safe = terminal_safe
    for warning in result.warnings:
        print(f"warning: {safe(warning)}")
    a, b = safe(result.a), safe(result.b)
    print(f"{a} vs {b}: {len(result.common_steps)} common recorded steps, {len(result.common_sites)} common sites")
    for label, only in (("only in " + a, result.only_in_a), ("only in " + b, result.only_in_b)):
        if only["steps"] or only["sites"]:
            print(f"  {label}: {len(only['steps'])} steps, {len(only['sites'])} sites (not compared)")
    if result.identical:
        print("bitwise identical at every common step and site")
        return 0
    print(f"first divergent step: {result.first_step}")
    print(f"first divergent site: {safe(str(result.first_site))}")
    print(f"origin sites at that step: {safe(', '.join(result.origin_sites))}")
    print(f"sites that ever differ: {len(result.frontier)} of {len(result.common_sites)}")
    growth = amplification(result)
    if growth.rate == growth.rate:  # not NaN: at least two steps with a difference
        print(f"growth of the relative L2 difference after step {result.first_step}: {growth.rate:+.3f} decades "
              f"per step (median over sites: {growth.overall.loc[result.first_step]:.2e} at step "
              f"{result.first_step}, {growth.overall.iloc[-1]:.2e} at step {result.common_steps[-1]})")
        if growth.saturation_step is not None:
            print(f"saturates at step {growth.saturation_step}, at {growth.plateau:.2e}")
    print("largest relative differences of the L2 norm at the last common step:")
    for site, value in result.largest_differences().items():
        print(f"  {value:10.3e}  {safe(site)}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from workbench.analysis import golden_check
    from workbench.store.reader import open_run

    run = open_run(args.run)
    if args.golden.suffix == ".json" or args.golden.is_file():  # a golden-values file, either format
        from workbench.analysis.golden_values import golden_values_check, read_golden_values, weights_fingerprints

        golden = read_golden_values(args.golden)
        weights = weights_fingerprints(run.fingerprints()) if golden.weights is not None and run.has_sites else None
        check = golden_values_check(run.scalars, weights, golden, run=run.name, rtol=args.rtol, steps=args.steps)
    else:
        check = golden_check(run.records(), open_run(args.golden).records(), steps=args.steps, rtol=args.rtol)
    print(check.summary())
    return 0 if check.passed else 1


def _cmd_golden(args: argparse.Namespace) -> int:
    from workbench.analysis.golden_values import (
        megatron_golden_values,
        weights_fingerprints,
        workbench_golden_values,
        write_golden_values,
    )
    from workbench.store.reader import open_run

    run = open_run(args.run)
    if args.megatron:
        data = megatron_golden_values(run.scalars, steps=args.steps, interval=args.interval)
    else:
        weights = weights_fingerprints(run.fingerprints()) if run.has_sites else None
        data = workbench_golden_values(run.scalars, weights, run=run.name, steps=args.steps)
    path = write_golden_values(data, args.out)
    print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB, "
          f"{'Megatron-LM format' if args.megatron else 'workbench format, bitwise'})")
    return 0


def _cmd_figure(args: argparse.Namespace) -> int:
    import pandas as pd

    from workbench.figures.export import FORMATS, export_figures
    from workbench.figures.style import for_paper
    from workbench.statistics import STAT_NAMES
    from workbench.store.layout import SCALAR_FIELDS
    from workbench.studies.workspace import Workspace

    fmt = args.out.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ArgumentError(f"-o {args.out}: the file's extension says the format, one of {', '.join(FORMATS)}")
    if args.stat not in STAT_NAMES:
        raise ArgumentError(f"--stat {args.stat!r}: no such statistic; one of {', '.join(STAT_NAMES)}")
    if args.quantity not in SCALAR_FIELDS:
        raise ArgumentError(f"--quantity {args.quantity!r}: no such per-step scalar; one of {', '.join(SCALAR_FIELDS)}")
    ws = Workspace.open(*args.runs)
    names = [p.resolve().name for p in args.runs]
    if args.kind == "heatmap":
        from workbench.figures.divergence import divergence_heatmap, heatmap_matrix

        if len(names) != 2:
            raise ArgumentError(f"figure heatmap takes two runs (A B), not {len(names)}")
        result = ws.comparison(names[0], names[1])
        figure = divergence_heatmap(result, args.stat, provenance=ws.provenance(names))
        data = heatmap_matrix(result, args.stat, relative=ws.relative_difference(names[0], names[1], args.stat))
    elif args.kind == "sweep":
        from workbench.figures.sweep import sweep_figure

        matrix = ws.sweep_matrix()
        figure, data = sweep_figure(matrix, provenance=ws.provenance(matrix.names)), matrix.table()
    elif args.kind == "sources":
        from workbench.figures.studies import sources_figure

        data = ws.attribution(stat=args.stat)
        if data.empty:
            raise ArgumentError(f"{', '.join(map(str, args.runs))}: no run here has a nondeterminism source on alone "
                                "(an attribution study: `workbench sweep workbench/examples/sources.toml`)")
        figure = sources_figure(data, on_cpu=ws.on_cpu, provenance=ws.provenance())
    else:  # trajectories of a scalar
        from workbench.figures.trajectories import trajectory_figure

        # named runs: the first is the reference; a folder: every run against the workspace's reference
        chosen = names if all(n in ws.runs for n in names) else \
            [ws.roles.reference, *(n for n in ws.names if n != ws.roles.reference)]
        series = ws.scalar(args.quantity, chosen)
        figure = trajectory_figure(series, reference=chosen[0], quantity=args.quantity,
                                   floor=ws.scalar_floor(args.quantity),
                                   seed_spread=ws.scalar_seed_spread(args.quantity), provenance=ws.provenance(chosen))
        data = pd.DataFrame(series)
    if args.size != "screen":
        figure = for_paper(figure, args.size)
    (path,) = export_figures({args.out.stem: figure}, args.out.parent, [fmt])
    print(f"wrote {path}")
    if args.data is not None:
        args.data.parent.mkdir(parents=True, exist_ok=True)
        data.to_csv(args.data, index=args.kind not in ("sweep", "sources"))
        print(f"wrote {args.data} (the plotted data)")
    return 0


def _cmd_import_megatron(args: argparse.Namespace) -> int:
    from workbench.importers.megatron_tb import import_megatron_tensorboard

    run_dir = import_megatron_tensorboard(args.logdir, args.out, name=args.name, tokens_per_step=args.tokens_per_step)
    print(f"imported {args.logdir} into {run_dir}")
    return 0


def _finite_or_none(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None


def _cmd_resume_check(args: argparse.Namespace) -> int:
    from workbench.analysis.resume import resume_check
    from workbench.store.reader import open_run

    resumed = open_run(args.resumed)
    floor = args.floor
    started = resumed.info.started_from
    if floor is None and started is not None and Path(str(started.get("run"))).is_dir():
        floor = Path(str(started["run"]))  # the run that wrote the checkpoint, at the other layout
        if floor.resolve() == open_run(args.reference).path.resolve():
            floor = None  # checked against the run it started from: no distance to measure a floor by
    check = resume_check(resumed.records(), open_run(args.reference).records(), from_step=args.from_step,
                         floor=open_run(floor).records() if floor is not None else None)
    print(check.summary())
    return 0 if (check.within_floor if check.floor is not None else check.identical) else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from workbench.studies.report import write_report
    from workbench.studies.workspace import Workspace

    fmt = args.format or ("pdf" if args.output.suffix.lower() == ".pdf" else "html")
    printer = ProgressPrinter()
    start = time.monotonic()
    path = write_report(Workspace.open(*args.runs), args.output, fmt=fmt, progress=lambda m: printer(f"report: {m}"))
    printer(f"report: wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in {time.monotonic() - start:.1f} s",
            final=True)
    return 0


def _cmd_import_te(args: argparse.Namespace) -> int:
    from workbench.importers import import_te_log

    start = time.monotonic()
    run_dir = import_te_log(args.logs, args.out, name=args.name)
    print(f"imported {len(args.logs)} path(s) into {run_dir} in {time.monotonic() - start:.1f} s; "
          f"compare it with another import: workbench compare {run_dir} OTHER")
    return 0


def _cmd_anomalies(args: argparse.Namespace) -> int:
    from workbench.analysis.anomalies import AnomalyRules, find_anomalies
    from workbench.store.reader import open_run

    rules = AnomalyRules(window=args.window, spike_factor=args.spike_factor)
    run = open_run(args.run)
    if args.follow:
        from workbench.investigate.watch import watch_anomalies

        print(f"{run.name}: following the run ({run.status}); new anomalies appear as its steps are written")
        found = watch_anomalies(args.run, rules=rules, interval_s=args.interval, on_new=lambda row: print(
            f"step {row['step']}: {row['rule']} at {row['site'] or '-'}: {row['detail']}", flush=True))
        print(f"{run.name}: {_anomalies(len(found))}; the run is {open_run(args.run).status}")
        return 1 if len(found) else 0
    found = find_anomalies(run.scalars, run.records_or_none(), rules)  # scalars alone without site records
    if found.empty:
        print(f"{run.name}: no anomalies in {len(run.scalars)} steps")
        return 0
    print(f"{run.name}: {_anomalies(len(found))}")
    print(found.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 1


def _anomalies(count: int) -> str:
    return f"{count} anomal{'y' if count == 1 else 'ies'}"


def _cmd_replay(args: argparse.Namespace) -> int:
    import json

    from workbench.investigate.replay import replay

    printer = ProgressPrinter()
    result = replay(args.run, args.step, out=args.out, trace=args.trace, overwrite=args.overwrite,
                    progress=lambda m: printer(f"replay: {m}"))
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.summary())
    return 0 if result.check.reproduced else 1


def _cmd_bisect(args: argparse.Namespace) -> int:
    import json

    from workbench.investigate.bisect import bisect

    printer = ProgressPrinter()
    result = bisect(args.a, args.b, step=args.step, out=args.out, overwrite=args.overwrite,
                    progress=lambda m: printer(f"bisect: {m}"))
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.summary())
    if not args.json:
        print(f"report: {result.out / 'bisect.md'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbench", description="Divergence workbench for Megatron Core.")
    verbs = parser.add_subparsers(dest="verb", required=True)

    run = verbs.add_parser("run", help="train one run config into a run store")
    run.add_argument("config", type=Path, help="run config (TOML)")
    run.add_argument("--out", type=_writable_dir, default=str(DEFAULT_RUNS_DIR),
                     help="folder for run folders (default %(default)s)")
    run.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    run.add_argument("--stop-after", type=_whole(1), default=None, metavar="K",
                     help="stop after K steps (to resume later)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run of the same name")
    run.add_argument("--start-from", type=Path, default=None, metavar="CHECKPOINT",
                     help="start at another layout's checkpoint (RUN/checkpoints/step_K, or a run folder: its "
                          "latest) of the same config, resharded to this run's layout")
    run.set_defaults(func=_cmd_run)

    sweep = verbs.add_parser("sweep", help="run every config of a study (skips complete runs)")
    sweep.add_argument("study", type=Path, help="study file (TOML)")
    sweep.add_argument("--out", type=_writable_dir, default=None,
                       help="folder for the runs (default data/runs/<study>)")
    sweep.set_defaults(func=_cmd_sweep)

    demo = verbs.add_parser("demo", help="run the demo study on CPU (and its MoE study, into OUT-moe)")
    demo.add_argument("--out", type=_writable_dir, default=str(DEFAULT_RUNS_DIR / "demo"),
                      help="default %(default)s; the MoE study goes beside it (data/runs/demo-moe)")
    demo.set_defaults(func=_cmd_demo)

    ls = verbs.add_parser("ls", help="list the runs under a folder")
    ls.add_argument("directory", type=Path)
    ls.set_defaults(func=_cmd_ls)

    study = verbs.add_parser("study", help="summarise a folder of runs: findings, noise floor, determinism cost")
    study.add_argument("directory", type=Path)
    study.set_defaults(func=_cmd_study)

    cmp = verbs.add_parser("compare", help="where two runs first differ (step, then site)")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    cmp.add_argument("--json", action="store_true", help="print the result as JSON")
    cmp.set_defaults(func=_cmd_compare)

    check = verbs.add_parser("check", help="check a run against a golden reference (exit 1 if it differs)")
    check.add_argument("run", type=Path)
    check.add_argument("--golden", type=Path, required=True, help="the reference: a run, or a golden-values JSON "
                       "file (Megatron-LM's format or the workbench's, from `workbench golden`)")
    check.add_argument("--steps", type=_whole(1), default=None, help="check the reference's steps below N")
    check.add_argument("--rtol", type=_finite(0, inclusive=True), default=None,
                       help="compare statistics within this relative tolerance instead of fingerprints bitwise")
    check.set_defaults(func=_cmd_check)

    golden = verbs.add_parser("golden", help="write a run's golden-values file for CI (a few KiB)")
    golden.add_argument("run", type=Path)
    golden.add_argument("--out", type=_writable_file, required=True, help="the JSON file to write")
    golden.add_argument("--megatron", action="store_true", help="Megatron-LM's functional-test format (1-based "
                        "iterations, 5 decimals, no fingerprints) instead of the workbench's (full precision, "
                        "weight fingerprints)")
    golden.add_argument("--steps", type=_whole(1), default=None, help="the first N steps only")
    golden.add_argument("--interval", type=_whole(1), default=1, help="with --megatron: every K-th iteration")
    golden.set_defaults(func=_cmd_golden)

    figure = verbs.add_parser("figure", help="one figure without a notebook, sized for a screen or a paper")
    figure.add_argument("kind", choices=("heatmap", "sweep", "trajectories", "sources"),
                        help="heatmap A B: where two runs diverge; sweep DIR: every pair of a folder; "
                        "trajectories RUN... or DIR: a scalar of each run; sources DIR: which nondeterminism "
                        "source matters (an attribution study)")
    figure.add_argument("runs", type=Path, nargs="+", help="run folders, or a folder of runs")
    figure.add_argument("-o", "--out", type=_writable_file, required=True, help="the file: .png, .svg, .pdf or .html")
    figure.add_argument("--size", choices=("screen", "column", "page"), default="screen",
                        help="column: ~3.5 in wide, page: ~7 in (fonts 7-8 pt); screen: as in the notebooks")
    figure.add_argument("--data", type=_writable_file, default=None, help="also write the plotted data as CSV")
    figure.add_argument("--stat", default="l2", help="heatmap, sources: the statistic (default l2)")
    figure.add_argument("--quantity", default="loss", help="trajectories: the scalar (default loss)")
    figure.set_defaults(func=_cmd_figure)

    resume = verbs.add_parser("resume-check", help="check a resumed run against the uninterrupted one from the "
                              "resume step on (exit 1 if it differs, or, started at another layout, if it leaves "
                              "the noise floor)")
    resume.add_argument("resumed", type=Path)
    resume.add_argument("reference", type=Path, help="the uninterrupted run")
    resume.add_argument("--from-step", type=_whole(0), default=None, metavar="K",
                        help="check from step K (default: the step the run was resumed from)")
    resume.add_argument("--floor", type=Path, default=None, metavar="RUN",
                        help="the noise floor's run: a run started at another layout is held to this run's distance "
                             "to the reference (default: the run whose checkpoint it started from); with a floor "
                             "the exit code is 1 only above it")
    resume.set_defaults(func=_cmd_resume_check)

    report = verbs.add_parser("report", help="write a self-contained report (figures, findings, manifests)")
    report.add_argument("runs", type=Path, nargs="+", help="run folders, or folders of runs")
    report.add_argument("-o", "--output", type=_writable_file, required=True, help="report file (.html or .pdf)")
    report.add_argument("--format", choices=["html", "pdf"], default=None,
                        help="default: from the output file's suffix")
    report.set_defaults(func=_cmd_report)

    te = verbs.add_parser("import-te", help="import Transformer Engine debug statistics logs into a run store")
    te.add_argument("logs", type=Path, nargs="+", help="log files, or their nvdlfw_inspect_statistics_logs folder")
    te.add_argument("--out", type=_writable_dir, required=True, help="the run folder to create")
    te.add_argument("--name", default=None, help="run name (default: the folder's name)")
    te.set_defaults(func=_cmd_import_te)

    mtb = verbs.add_parser("import-megatron", help="import Megatron-LM's TensorBoard scalars (lm loss, grad-norm, "
                           "...) as a run")
    mtb.add_argument("logdir", type=Path, help="the folder of events.out.tfevents.* files (--tensorboard-dir)")
    mtb.add_argument("--out", type=_writable_dir, required=True, help="the run folder to create")
    mtb.add_argument("--name", default=None, help="run name (default: the folder's name)")
    mtb.add_argument("--tokens-per-step", type=_whole(1), default=None,
                     help="global batch x sequence length, for tokens/s")
    mtb.set_defaults(func=_cmd_import_megatron)

    anomalies = verbs.add_parser("anomalies", help="first NaN/Inf, loss spikes, gradient norms, update ratios "
                                 "(exit 1 if any)")
    anomalies.add_argument("run", type=Path)
    anomalies.add_argument("--window", type=_whole(2), default=20, help="steps in the rolling baseline")
    anomalies.add_argument("--spike-factor", type=_finite(0, inclusive=False), default=6.0,
                           help="a loss spike lies this many MADs above the rolling median")
    anomalies.add_argument("--follow", action="store_true",
                           help="follow a run being written: print anomalies as they appear, until it ends")
    anomalies.add_argument("--interval", type=_finite(0, inclusive=False), default=5.0,
                           help="--follow: seconds between looks")
    anomalies.set_defaults(func=_cmd_anomalies)

    rep = verbs.add_parser("replay", help="rerun a run from its nearest checkpoint before step K with full "
                           "recording; exit 1 unless it reproduces the original bitwise")
    rep.add_argument("run", type=Path)
    rep.add_argument("--step", type=_whole(0), required=True, metavar="K", help="replay through step K")
    rep.add_argument("--out", type=_writable_dir, default=None, help="the replay's run folder "
                     "(default RUN/replays/step_K)")
    rep.add_argument("--trace", action="store_true", help="trace every operation of step K (for bisect)")
    rep.add_argument("--overwrite", action="store_true", help="replace an existing replay folder")
    rep.add_argument("--json", action="store_true", help="print the result as JSON")
    rep.set_defaults(func=_cmd_replay)

    bis = verbs.add_parser("bisect", help="where two runs first differ: step, site, then operation (replays "
                           "the step with operation tracing; writes bisect.md and bisect.json)")
    bis.add_argument("a", type=Path)
    bis.add_argument("b", type=Path)
    bis.add_argument("--step", type=_whole(0), default=None, metavar="K",
                     help="bisect this step (default: the first divergent one)")
    bis.add_argument("--out", type=_writable_dir, default=None, help="folder for the replays and the report "
                     "(default: A's folder's bisect/A-vs-B)")
    bis.add_argument("--overwrite", action="store_true", help="replace earlier replays in --out")
    bis.add_argument("--json", action="store_true", help="print the result as JSON")
    bis.set_defaults(func=_cmd_bisect)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help (0), or a bad argument already printed on one line (2)
        return int(done.code or 0)
    try:
        return int(args.func(args))
    except LaunchError as err:
        lines = str(err).splitlines() or [""]  # the failed rank's log excerpt follows on lines of its own
        print("\n".join(terminal_safe(line) for line in [f"workbench: run failed: {lines[0]}", *lines[1:]]),
              file=sys.stderr)
        return 1
    except WorkbenchError as err:
        print(f"workbench: error: {terminal_safe(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workbench: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
