"""The package's import layers (README, "Architecture") and what reads them off the source."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "workbench"

FOUNDATION = {"config", "determinism", "environment", "errors", "sites", "statistics", "data", "untrusted", "versions",
              "words"}
"""Modules of the package's root that everything may use: they import no other layer."""

ALLOWED: dict[str, set[str]] = {
    "foundation": set(),
    "store": {"foundation"},
    "analysis": {"foundation", "store"},
    "importers": {"foundation", "store", "analysis"},
    "figures": {"foundation", "store", "analysis"},
    "studies": {"foundation", "store", "analysis", "figures", "runner"},
    "widgets": {"foundation", "store", "analysis", "figures", "studies"},
    "recorder": {"foundation", "store", "analysis"},
    "runner": {"foundation", "store", "analysis", "recorder"},
    "investigate": {"foundation", "store", "analysis", "figures", "runner"},
    "megatron_lm": {"foundation", "store", "analysis", "importers", "recorder", "runner"},
}
"""The layers each layer may import (its own always); the command line and the package's
``__init__`` may import any."""
LAZY_ONLY = {("studies", "runner")}
"""Imports made inside functions only: running a study launches runs, reading one needs no torch."""
TORCH_FREE = ["foundation", "store", "analysis", "importers", "figures", "studies", "widgets", "investigate"]


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name inside the package (None: the command line, __init__, __main__)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] in {"cli", "__main__", "__init__"}:
        return None
    return "foundation" if parts[1] in FOUNDATION else parts[1]


def layer_modules(layer: str) -> list[str]:
    """Every module of ``layer``, dotted."""
    files = ([PACKAGE / f"{name}.py" for name in sorted(FOUNDATION)] if layer == "foundation"
             else sorted((PACKAGE / layer).rglob("*.py")))
    return [".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__") for f in files]


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported workbench module, whether the import sits inside a function) of a source file."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("workbench"):
                names = [child.module] if child.module != "workbench" else [f"workbench.{a.name}" for a in child.names]
                found.extend((name, inside) for name in names)
            elif isinstance(child, ast.Import):
                found.extend((a.name, inside) for a in child.names if a.name.startswith("workbench"))
            visit(child, nested)

    visit(ast.parse(path.read_text()), False)
    return found
