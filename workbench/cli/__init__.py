"""The ``workbench`` command: thin verbs over the library, each verb's parser beside its handler.

    workbench run CONFIG.toml [--out DIR] [--resume | --start-from CHECKPOINT] [--stop-after K] [--overwrite]
                              [--against REF [--rtol X] [--keep-going]]
    workbench sweep STUDY.toml [--out DIR]
    workbench demo [--out DIR]
    workbench ls DIR
    workbench summary DIR
    workbench compare A B [--json]
    workbench check RUN --golden REF|FILE.json [--steps N] [--rtol X]
    workbench golden RUN --out FILE.json [--megatron] [--steps N] [--interval K]
    workbench figure heatmap|pairs|trajectories|ladder|sources|cost RUNS... -o FILE.pdf [--size column|page]
                     [--data FILE.csv]
    workbench resume-check RESUMED REFERENCE [--from-step K] [--floor RUN]
    workbench report RUNS... -o report.html [--format html|pdf]
    workbench import-te LOG... --out DIR [--name NAME]
    workbench import-megatron LOGDIR --out DIR [--name NAME] [--tokens-per-step T]
    workbench anomalies RUN [--spike-factor F] [--window N] [--follow]
    workbench replay RUN --step K [--out DIR] [--trace] [--overwrite] [--json]
    workbench bisect A B [--step K] [--out DIR] [--overwrite] [--json]
    workbench upgrade RUN... [--dry-run]

The verbs live by what they do: ``training`` (run, sweep, demo), ``reading`` (ls, summary, compare, check,
golden, resume-check, anomalies), ``figures`` (figure, report), ``importing`` (import-te, import-megatron),
``investigating`` (replay, bisect), ``stores`` (upgrade); what they share is in ``_common``. A verb builds
config objects, calls library functions and prints the result's own ``summary()``. A ``WorkbenchError`` is
printed as one line (``workbench: error: ...``) with exit code 2; a failed run exits 1. So is a
bad argument: numbers outside their range and output paths that cannot be written are refused
while parsing, before any work starts. Names from run stores are printed with their control
characters escaped (``terminal_safe``).
"""

from __future__ import annotations

import os
import sys

from workbench.cli import figures, importing, investigating, reading, stores, training
from workbench.cli._common import Parser, ProgressPrinter, terminal_safe
from workbench.errors import NOT_YET, LaunchError, NotRecordedYetError, WorkbenchError

__all__ = ["ProgressPrinter", "build_parser", "main", "terminal_safe"]


def build_parser() -> Parser:
    parser = Parser(prog="workbench", description="Divergence workbench for Megatron Core.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for group in (training, reading, figures, importing, investigating, stores):
        group.register(verbs)
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
    except NotRecordedYetError as err:  # a healthy run, early: not bad input
        print(f"workbench: not yet: {terminal_safe(str(err))}", file=sys.stderr)
        return NOT_YET
    except WorkbenchError as err:
        print(f"workbench: error: {terminal_safe(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workbench: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
