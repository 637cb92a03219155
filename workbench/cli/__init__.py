"""The ``workbench`` command: thin verbs over the library, each verb's parser beside its handler.

``workbench --help`` lists the verbs and ``workbench VERB --help`` gives each one's usage; the documentation's
command-line reference (docs/cli-reference.md) is generated from these same parsers (``reference``), so it
cannot drift from them.

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

import argparse
import contextlib
import errno
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator

from workbench.cli import figures, importing, investigating, reading, stores, training
from workbench.cli._common import Parser, ProgressPrinter, terminal_safe
from workbench.disk import is_no_room, no_room
from workbench.errors import NOT_YET, LaunchError, NotRecordedYetError, WorkbenchError

__all__ = ["ProgressPrinter", "build_parser", "main", "reference", "terminal_safe"]


def build_parser() -> Parser:
    parser = Parser(prog="workbench", description="Divergence workbench for Megatron Core.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for group in (training, reading, figures, importing, investigating, stores):
        group.register(verbs)
    return parser


def reference() -> str:
    """The command-line reference in Markdown: for every verb, in ``workbench --help``'s order, its one-line help
    and its full ``--help`` text (what the documentation site shows; generated, so it lists every verb)."""
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001

    def text(command: argparse.ArgumentParser) -> str:  # 80 columns, whatever the terminal's width
        command.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=80)
        return command.format_help().rstrip()

    verbs.metavar = "VERB"  # the verbs are listed below it, one per line
    parts = ["```text", text(parser), "```"]
    for verb in verbs._choices_actions:  # noqa: SLF001 - one per verb, its aliases in its metavar
        parts += ["", f"## workbench {verb.dest}", "", verb.help or "", "", "```text",
                  text(verbs.choices[verb.dest]), "```"]
    return "\n".join(parts) + "\n"


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption, ``kill``): raised where the command waits, as Ctrl-C is, so that a
    launcher stops every rank on its way out."""


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """While a verb runs: SIGTERM ends it as Ctrl-C does, but said as such; a second Ctrl-C or SIGTERM, while
    the first is being handled (ranks stopping, the process exiting), ends the process at once, without a
    traceback (each rank ends with its launcher). Without a signal the previous handlers come back afterwards
    (``main`` may run inside a test)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def handle(signum: int, frame: object) -> None:
        if seen:
            os.write(2, b"workbench: stopped at once\n")
            os._exit(130 if signum == signal.SIGINT else 128 + signum)
        seen.append(signum)
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if not seen:  # after a first signal, a second one during the exit (a zygote closing) ends it at once
            for number, handler in previous.items():
                signal.signal(number, handler)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help (0), or a bad argument already printed on one line (2)
        return int(done.code or 0)
    try:
        with _signals():
            return int(args.func(args))
    except LaunchError as err:
        lines = str(err).splitlines() or [""]  # the failed rank's log excerpt follows on lines of its own
        print("\n".join(terminal_safe(line) for line in [f"workbench: run failed: {lines[0]}", *lines[1:]]),
              file=sys.stderr)
        return 1
    except NotRecordedYetError as err:  # a healthy run, early: not bad input
        if getattr(args, "json", False):  # a script reading standard output gets the answer there too
            print(json.dumps({"status": "not yet", "exit_code": NOT_YET, "message": str(err)}))
        print(f"workbench: not yet: {terminal_safe(str(err))}", file=sys.stderr)
        return NOT_YET
    except WorkbenchError as err:
        print(f"workbench: error: {terminal_safe(str(err))}", file=sys.stderr)
        return 2
    except Terminated:
        again = " (the same command with --resume continues from its latest checkpoint)" \
            if hasattr(args, "resume") else ""
        print(f"workbench: stopped by SIGTERM; every rank was stopped{again}", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("workbench: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:
        if not is_no_room(err) and err.errno not in (errno.EACCES, errno.EPERM):
            raise  # a bug, not the disk: its traceback is what to report
        # a full disk, a quota, a read-only or forbidden folder met outside the writers that say it themselves
        message = str(no_room(err, removed=False)) if is_no_room(err) else \
            f"{err.filename}: {(err.strerror or str(err)).lower()}; choose a folder you can write, or change its " \
            "permissions"
        print(f"workbench: error: {terminal_safe(message)}", file=sys.stderr)
        return 2
