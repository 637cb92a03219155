"""The verbs that retrain part of a run to explain it: ``replay``, ``bisect``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.cli._common import ProgressPrinter, prefixed, whole, writable_dir


def register(verbs: argparse._SubParsersAction) -> None:
    for add in (_add_replay, _add_bisect):
        add(verbs)


def _add_replay(verbs: argparse._SubParsersAction) -> None:
    rep = verbs.add_parser("replay", help="rerun a run from its nearest checkpoint before step K with full "
                           "recording; exit 1 unless it reproduces the original bitwise")
    rep.add_argument("run", type=Path)
    rep.add_argument("--step", type=whole(0), required=True, metavar="K", help="replay through step K")
    rep.add_argument("--out", type=writable_dir, default=None, help="the replay's run folder "
                     "(default RUN/replays/step_K)")
    rep.add_argument("--trace", action="store_true", help="trace every operation of step K (for bisect)")
    rep.add_argument("--overwrite", action="store_true", help="replace an existing replay folder")
    rep.add_argument("--json", action="store_true", help="print the result as JSON")
    rep.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    from workbench.investigate.replay import replay

    result = replay(args.run, args.step, out=args.out, trace=args.trace, overwrite=args.overwrite,
                    progress=prefixed(ProgressPrinter(), "replay: "))
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.summary())
    return 0 if result.check.reproduced else 1


def _add_bisect(verbs: argparse._SubParsersAction) -> None:
    bis = verbs.add_parser("bisect", help="where two runs first differ: step, site, then operation (replays "
                           "the step with operation tracing; writes bisect.md and bisect.json)")
    bis.add_argument("a", type=Path)
    bis.add_argument("b", type=Path)
    bis.add_argument("--step", type=whole(0), default=None, metavar="K",
                     help="bisect this step (default: the first divergent one)")
    bis.add_argument("--out", type=writable_dir, default=None, help="folder for the replays and the report "
                     "(default: bisect/A-vs-B inside A's run folder)")
    bis.add_argument("--overwrite", action="store_true", help="replace earlier replays in --out")
    bis.add_argument("--json", action="store_true", help="print the result as JSON")
    bis.set_defaults(func=_bisect)


def _bisect(args: argparse.Namespace) -> int:
    from workbench.investigate.bisect import bisect

    result = bisect(args.a, args.b, step=args.step, out=args.out, overwrite=args.overwrite,
                    progress=prefixed(ProgressPrinter(), "bisect: "))
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.summary())
    if not args.json:
        print(f"report: {result.out / 'bisect.md'}")
    return 0
