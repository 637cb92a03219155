"""The package's import layers (docs/architecture.md) and what reads them off the source."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "workbench"

FOUNDATION = {"config", "determinism", "environment", "errors", "sites", "statistics", "data", "untrusted", "versions",
              "words", "names", "disk", "_exports"}
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
    "testing": {"foundation", "store", "analysis", "studies"},
}
"""The layers each layer may import (its own always); the command line and the package's
``__init__`` may import any. ``testing`` (the run-store contract and the damage the tests draw from) is for the
tests: no layer imports it."""
LAZY_ONLY = {("studies", "runner")}
"""Imports made inside functions only: running a study launches runs, reading one needs no torch."""
TORCH_FREE = ["foundation", "store", "analysis", "importers", "figures", "studies", "widgets", "investigate",
              "testing"]


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


def _is_module(dotted: str) -> bool:
    """Whether a dotted name of the package is one of its modules (``from workbench.runner import zygote``)."""
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path, *, typing: bool = True) -> list[tuple[str, bool]]:
    """(imported workbench module, whether the import sits inside a function) of a source file; without
    ``typing``, those under ``if TYPE_CHECKING:`` left out (they are never run)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if not typing and isinstance(child, ast.If) and isinstance(child.test, ast.Name) and \
                    child.test.id == "TYPE_CHECKING":
                continue
            nested = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("workbench"):
                # ``from package import module`` imports that module; any other name comes from the module named
                modules = [f"{child.module}.{a.name}" for a in child.names if _is_module(f"{child.module}.{a.name}")]
                names = modules if len(modules) == len(child.names) else [child.module, *modules]
                found.extend((name, inside) for name in names)
            elif isinstance(child, ast.Import):
                found.extend((a.name, inside) for a in child.names if a.name.startswith("workbench"))
            visit(child, nested)

    visit(ast.parse(path.read_text()), False)
    return found


def module_name(path: Path) -> str:
    """The dotted name of a source file of the package (a package's ``__init__`` is the package)."""
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def import_cycles() -> list[list[str]]:
    """Every set of the package's modules that import one another in a circle, at run time (inside functions
    too; not under ``TYPE_CHECKING``): the strongly connected components of more than one module."""
    files = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}

    def target(name: str) -> str | None:
        return name if name in files else None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        found = set()
        for imported, _ in imports(path, typing=False):
            resolved = target(imported)
            if resolved and resolved != module:
                found.add(resolved)
        graph[module] = found
    cycles, index, low, stack, on = [], {}, {}, [], set()

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            strong(v)
    return cycles


PURE_STORE_MODULES = {"workbench.store.records"}
"""What ``analysis`` may import from ``store`` at run time: the records a reader hands it, no reader."""
FILE_MODULES = {"os", "io", "shutil", "pathlib", "tempfile", "glob", "zarr", "fsspec", "h5py", "sqlite3",
                "workbench.untrusted"}
"""Modules whose import means reading or writing files."""
FILE_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "rmdir", "touch",
              "iterdir", "rglob", "is_file", "is_dir", "to_csv", "to_parquet", "to_zarr", "open_zarr",
              "open_dataset", "read_csv", "to_netcdf", "savez"}
"""Functions and methods that read or write files (``Path.read_text``, ``DataFrame.to_csv`` ...): a call of any of
these names is taken as file I/O."""
FILE_FUNCTIONS = {("json", "load"), ("json", "dump"), ("pickle", "load"), ("pickle", "dump"), ("np", "load"),
                  ("np", "save"), ("numpy", "load"), ("numpy", "save")}
"""Module functions that read or write files (``json.load``; ``json.loads`` reads a string)."""


def file_io(path: Path) -> list[str]:
    """What in a source file reads or writes files, or imports a reader (at run time), as 'line: what'."""
    tree = ast.parse(path.read_text())
    found = []
    for imported, _ in imports(path, typing=False):
        if imported.startswith("workbench.store") and imported not in PURE_STORE_MODULES:
            found.append(f"imports {imported}")
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped |= {id(child) for child in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in FILE_MODULES
                      or a.name in FILE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and (node.module.split(".")[0] in FILE_MODULES
                                                                    or node.module in FILE_MODULES):
            found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else (func.attr if isinstance(func, ast.Attribute) else None)
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
            if name in FILE_CALLS or (owner, name) in FILE_FUNCTIONS:
                found.append(f"{node.lineno}: {name}(...)")
    return found
