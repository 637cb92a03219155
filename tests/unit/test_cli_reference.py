"""The command-line reference the documentation site shows is generated from the parsers (``workbench.cli
.reference``): every verb, with its own usage, in ``--help``'s order, and no usage kept by hand beside it."""

from __future__ import annotations

import argparse
import re

import workbench.cli
from workbench.cli import build_parser, reference


def test_the_reference_lists_every_verb_with_its_usage() -> None:
    verbs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    names = [verb.dest for verb in verbs._choices_actions]
    text = reference()
    assert re.findall(r"^## workbench (\S+)$", text, re.M) == names
    assert "import-megatron-dumps" in names and "upgrade" in names
    for name in names:
        section = text.split(f"## workbench {name}\n", 1)[1]
        assert section.split("```text\n", 1)[1].startswith(f"usage: workbench {name}"), name
    blocks = re.findall(r"```text\n(.*?)```", text, re.S)
    assert len(blocks) == len(names) + 1
    assert max(len(line) for block in blocks for line in block.splitlines()) <= 80  # the same on every terminal


def test_the_command_keeps_no_usage_by_hand() -> None:
    assert "workbench run CONFIG.toml" not in (workbench.cli.__doc__ or "")
