"""mkdocs hook: the command-line reference page is generated from the parsers (``workbench.cli.reference``)."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- generated: workbench.cli.reference() -->"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from workbench.cli import reference

    return markdown.replace(MARKER, reference())
