"""The verb that keeps run stores current: ``upgrade``."""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench.cli._common import ProgressPrinter, print_safe


def register(verbs: argparse._SubParsersAction) -> None:
    upgrade = verbs.add_parser("upgrade", help="rewrite run stores of an older schema in place, so that they read "
                                               "fast (one statistic per chunk)")
    upgrade.add_argument("runs", type=Path, nargs="+", metavar="RUN")
    upgrade.add_argument("--dry-run", action="store_true", help="say what it would rewrite and the room it needs")
    upgrade.set_defaults(func=_upgrade)


def _upgrade(args: argparse.Namespace) -> int:
    from workbench.store.reader import open_run
    from workbench.store.upgrade import upgrade_plan, upgrade_store

    plans = [upgrade_plan(open_run(path)) for path in args.runs]  # every run checked before any is rewritten
    for plan in plans:
        print_safe(plan.summary())
    if args.dry_run:
        return 0
    printer = ProgressPrinter()
    for plan in plans:
        if plan.needed:
            upgrade_store(plan.run_dir, progress=printer)
            printer(f"{plan.run_dir}: upgraded to the current schema", final=True)
    return 0
