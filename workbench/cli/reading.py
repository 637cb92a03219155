"""The verbs that read run stores and say what they hold: ``ls``, ``summary``, ``compare``, ``verdict``, ``check``,
``golden``, ``resume-check``, ``anomalies``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workbench import environment
from workbench.cli._common import (
    SkippedRuns,
    finite,
    print_safe,
    run_location,
    terminal_safe,
    whole,
    writable_file,
)
from workbench.errors import ArgumentError


def register(verbs: argparse._SubParsersAction) -> None:
    for add in (_add_ls, _add_summary, _add_compare, _add_verdict, _add_check, _add_golden, _add_resume_check,
                _add_anomalies):
        add(verbs)


def _add_ls(verbs: argparse._SubParsersAction) -> None:
    ls = verbs.add_parser("ls", help="list the runs under a folder")
    ls.add_argument("directory", type=Path)
    ls.set_defaults(func=_ls)


def _ls(args: argparse.Namespace) -> int:
    import pandas as pd

    from workbench.store.reader import list_runs

    skipped = SkippedRuns()  # said after the table
    table = list_runs(args.directory, on_skip=skipped)
    if table.empty:
        print(terminal_safe(f"no runs under {args.directory}"))
        skipped.say()
        return 0
    rows = []  # each run, then the runs derived from it (replays, bisections), indented under it
    for _, row in table.iterrows():
        rows.append(row)
        derived = list_runs(row["path"], on_skip=skipped, derived=True)
        for _, child in derived[derived["path"] != row["path"]].iterrows():
            child["name"] = f"  └ {child['name']} ({Path(child['path']).relative_to(row['path']).as_posix()})"
            rows.append(child)
    shown = pd.DataFrame(rows, columns=table.columns).drop(columns=["path"])
    shown = shown.map(lambda cell: terminal_safe(cell) if isinstance(cell, str) else cell)
    for column in shown.columns:  # text left-aligned: a derived run's └ then stands under its parent
        if all(isinstance(value, str) for value in shown[column]):
            width = max(len(value) for value in shown[column])
            shown[column] = [value.ljust(width) for value in shown[column]]
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.4f}", justify="left"))
    sys.stdout.flush()
    skipped.say()
    return 0


def _add_summary(verbs: argparse._SubParsersAction) -> None:
    summary = verbs.add_parser("summary", aliases=["study"],  # `study`: its former name, still accepted
                               help="summarise a folder of runs: findings, noise floor, determinism cost")
    summary.add_argument("directory", type=Path)
    summary.set_defaults(func=_summary)


def _summary(args: argparse.Namespace) -> int:
    from workbench.studies.summary import summarise_study

    skipped = SkippedRuns()
    print_safe(summarise_study(args.directory, on_skip=skipped).text())
    sys.stdout.flush()
    skipped.say()
    return 0


def _add_compare(verbs: argparse._SubParsersAction) -> None:
    cmp = verbs.add_parser("compare", help="where two runs first differ (step, then site); with band runs beside A, "
                           "whether B differs from A by more than rounding")
    cmp.add_argument("a", type=run_location, help="a run folder, or a URL fsspec reads (s3://bucket/runs/a)")
    cmp.add_argument("b", type=run_location)
    cmp.add_argument("--json", action="store_true", help="print the result as JSON")
    cmp.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    from workbench.store.reader import open_recorded
    from workbench.studies.comparing import compare_stores
    from workbench.studies.verdicts import verdict_or_reason

    a, b = open_recorded(args.a), open_recorded(args.b)
    result = compare_stores(a, b, cells=True)  # every cell read: a damaged chunk of either run is found
    facts = environment.difference(a.manifest.runtime, b.manifest.runtime)
    rounding = None if result.identical else verdict_or_reason(b, a)  # a is the reference; its band beside it
    if args.json:
        print(json.dumps({**result.to_dict(growth=True), "environment": facts.to_dict(),
                          "rounding": rounding if isinstance(rounding, str | None) else rounding.to_dict()},
                         indent=1, default=str))
    else:
        print(result.summary(escape=terminal_safe))
        print(terminal_safe(facts.summary(runs_differ=not result.identical)))
        if rounding is not None:
            print(terminal_safe(f"bug or rounding: {rounding}" if isinstance(rounding, str) else rounding.summary()))
    return 0


def _add_verdict(verbs: argparse._SubParsersAction) -> None:
    verdict = verbs.add_parser("verdict", help="bug or rounding: a layout or precision change held to its "
                               "reference's rounding band (exit 1 if beyond it, or unresolved)")
    verdict.add_argument("run", type=run_location)
    verdict.add_argument("reference", type=run_location)
    verdict.add_argument("--band", type=run_location, nargs="+", default=None, metavar="RUN",
                         help="the band runs (default: the runs beside the reference recorded with "
                              "record(..., perturb=PRECISION) of the lower of the two runs' precisions, and its "
                              "nondeterministic repeats)")
    verdict.add_argument("--json", action="store_true", help="print the verdict as JSON")
    verdict.set_defaults(func=_verdict)


def _verdict(args: argparse.Namespace) -> int:
    from workbench.store.reader import open_recorded
    from workbench.studies.verdicts import rounding_verdict

    band = [open_recorded(path) for path in args.band] if args.band else None
    verdict = rounding_verdict(open_recorded(args.run), open_recorded(args.reference), band=band)
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=1))
    else:
        print(terminal_safe(verdict.summary()))
    return 0 if verdict.within and verdict.resolved else 1


def _add_check(verbs: argparse._SubParsersAction) -> None:
    check = verbs.add_parser("check", help="check a run against a golden reference (exit 1 if it differs)")
    check.add_argument("run", type=run_location)
    check.add_argument("--golden", type=run_location, required=True, help="the reference: a run (a folder or a "
                       "URL), or a local golden-values JSON file (Megatron-LM's format or the workbench's, from "
                       "`workbench golden`)")
    check.add_argument("--steps", type=whole(1), default=None, help="check the reference's steps below N")
    check.add_argument("--rtol", type=finite(0, inclusive=True), default=None,
                       help="compare statistics within this relative tolerance instead of fingerprints bitwise")
    check.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    from workbench.analysis import golden_check
    from workbench.store.reader import open_recorded

    run = open_recorded(args.run)
    if isinstance(args.golden, Path) and (args.golden.suffix == ".json" or args.golden.is_file()):  # a file
        from workbench.analysis.golden_values import golden_values_check, parse_golden_values, weights_fingerprints
        from workbench.store.golden_file import read_golden_document

        golden = parse_golden_values(read_golden_document(args.golden), str(args.golden))
        weights = weights_fingerprints(run.fingerprints()) if golden.weights is not None and run.has_sites else None
        check = golden_values_check(run.scalars, weights, golden, run=run.name, rtol=args.rtol, steps=args.steps)
        theirs = golden.environment
    else:
        reference = open_recorded(args.golden)
        check = golden_check(run.records(), reference.records(), steps=args.steps, rtol=args.rtol)
        theirs = reference.manifest.runtime
    print(check.summary(escape=terminal_safe))
    if theirs is not None:  # Megatron-LM's files say nothing of where they were made
        facts = environment.difference(run.manifest.runtime, theirs)
        print(terminal_safe(facts.summary(bitwise_check=args.rtol is None and not check.passed,
                                          runs_differ=not check.passed)))
    return 0 if check.passed else 1


def _add_golden(verbs: argparse._SubParsersAction) -> None:
    golden = verbs.add_parser("golden", help="write a run's golden-values file for CI (a few KiB)")
    golden.add_argument("run", type=run_location)
    golden.add_argument("--out", type=writable_file, required=True, help="the JSON file to write")
    golden.add_argument("--megatron", action="store_true", help="Megatron-LM's functional-test format (1-based "
                        "iterations, 5 decimals, no fingerprints) instead of the workbench's (full precision, "
                        "weight fingerprints)")
    golden.add_argument("--steps", type=whole(1), default=None, help="the first N steps only")
    golden.add_argument("--interval", type=whole(1), default=1, help="with --megatron: every K-th iteration")
    golden.set_defaults(func=_golden)


def _golden(args: argparse.Namespace) -> int:
    from workbench.analysis.golden_values import (
        megatron_golden_values,
        weights_fingerprints,
        workbench_golden_values,
    )
    from workbench.store.golden_file import write_golden_document
    from workbench.store.reader import open_recorded

    run = open_recorded(args.run)
    if run.scalars.empty:  # a golden file of no step would pass every check
        raise ArgumentError(f"{args.run}: run {run.name!r} has no recorded step ({run.status}); a golden file "
                            "needs at least one")
    if args.megatron:
        data = megatron_golden_values(run.scalars, steps=args.steps, interval=args.interval)
    else:
        weights = weights_fingerprints(run.fingerprints()) if run.has_sites else None
        data = workbench_golden_values(run.scalars, weights, run=run.name, steps=args.steps,
                                       environment=run.manifest.runtime)
    path = write_golden_document(data, args.out)
    print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB, "
          f"{'Megatron-LM format' if args.megatron else 'workbench format, bitwise'})")
    return 0


def _add_resume_check(verbs: argparse._SubParsersAction) -> None:
    resume = verbs.add_parser("resume-check", help="check a resumed run against the uninterrupted one from the "
                              "resume step on (exit 1 if it differs, or, started at another layout, if it leaves "
                              "the noise floor)")
    resume.add_argument("resumed", type=run_location)
    resume.add_argument("reference", type=run_location, help="the uninterrupted run")
    resume.add_argument("--from-step", type=whole(0), default=None, metavar="K",
                        help="check from step K (default: the step the run was resumed from)")
    resume.add_argument("--floor", type=run_location, default=None, metavar="RUN",
                        help="the noise floor's run: a run started at another layout is held to this run's distance "
                             "to the reference (default: the run whose checkpoint it started from); with a floor "
                             "the exit code is 1 only above it")
    resume.set_defaults(func=_resume_check)


def _resume_check(args: argparse.Namespace) -> int:
    from workbench.store.reader import open_recorded
    from workbench.studies.comparing import check_resumed_run

    check = check_resumed_run(open_recorded(args.resumed), open_recorded(args.reference), from_step=args.from_step,
                              floor=open_recorded(args.floor) if args.floor is not None else None)
    print(check.summary(escape=terminal_safe))
    return 0 if check.passed else 1


def _add_anomalies(verbs: argparse._SubParsersAction) -> None:
    anomalies = verbs.add_parser("anomalies", help="first NaN/Inf, loss spikes, gradient norms, update ratios "
                                 "(exit 1 if any)")
    anomalies.add_argument("run", type=run_location)
    anomalies.add_argument("--window", type=whole(2), default=20, help="steps in the rolling baseline")
    anomalies.add_argument("--spike-factor", type=finite(0, inclusive=False), default=6.0,
                           help="a loss spike lies this many MADs above the rolling median")
    anomalies.add_argument("--follow", action="store_true",
                           help="follow a run being written: print anomalies as they appear, until it ends")
    anomalies.add_argument("--interval", type=finite(0, inclusive=False), default=5.0,
                           help="--follow: seconds between looks")
    anomalies.set_defaults(func=_anomalies)


def _anomalies(args: argparse.Namespace) -> int:
    from workbench.analysis.anomalies import AnomalyRules, find_anomalies
    from workbench.store.reader import open_recorded

    rules = AnomalyRules(window=args.window, spike_factor=args.spike_factor)
    run = open_recorded(args.run)
    if args.follow:
        from workbench.investigate.watch import watch_anomalies

        name = terminal_safe(run.name)
        print(f"{name}: following the run ({run.status}); new anomalies appear as its steps are written")
        found = watch_anomalies(args.run, rules=rules, interval_s=args.interval, on_new=lambda row: print(
            terminal_safe(f"step {row['step']}: {row['rule']} at {row['site'] or '-'}: {row['detail']}"), flush=True))
        print(f"{name}: {_count(len(found))}; the run is {open_recorded(args.run).status}")
        return 1 if len(found) else 0
    # from the scalars alone without site records; from the records alone where nothing logged the scalars
    found = find_anomalies(run.scalars, run.records_or_none(), rules, scalars_logged=run.logs_scalars)
    if found.empty:
        print(f"{terminal_safe(run.name)}: no anomalies in {len(run.scalars)} steps")
        return 0
    print(f"{terminal_safe(run.name)}: {_count(len(found))}")
    # names from the store (run, site, detail): no control character reaches the terminal
    shown = found.map(lambda v: terminal_safe(v) if isinstance(v, str) else v)
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 1


def _count(count: int) -> str:
    return f"{count} anomal{'y' if count == 1 else 'ies'}"
