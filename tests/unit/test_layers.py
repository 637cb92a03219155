"""The package's layers import downward only (docs/architecture.md), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.layers import ALLOWED, LAZY_ONLY, PACKAGE, file_io, import_cycles, imports, layer_of


def test_every_layer_imports_only_the_layers_below_it() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        source = layer_of(module)
        if source is None:
            continue
        assert source in ALLOWED, f"{module}: a layer the architecture does not name ({source})"
        for imported, inside in imports(path):
            target = layer_of(imported)
            if target is None or target == source:
                continue
            if target not in ALLOWED[source] or ((source, target) in LAZY_ONLY and not inside):
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from workbench.figures.style import footer\n\ndef f():\n    import workbench.runner.launch\n")
    assert imports(bad) == [("workbench.figures.style", False), ("workbench.runner.launch", True)]
    assert "figures" not in ALLOWED["analysis"] and layer_of("workbench.figures.style") == "figures"


def test_analysis_reads_and_writes_no_file() -> None:
    # analysis computes on what it is handed: the records of runs, tables, golden values; opening runs, reading
    # store blocks and reading or writing files belong to store/ and to the callers (studies, the command line)
    found = {path.name: file_io(path) for path in sorted((PACKAGE / "analysis").glob("*.py"))}
    assert not {name: what for name, what in found.items() if what}


def test_the_file_check_sees_reads_writes_and_readers(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import json\nfrom pathlib import Path\nfrom workbench.store.reader import open_run\n"
                   "from workbench.store.records import RunRecords\n"
                   "def f(p):\n    json.load(open(p))\n    p.write_text('x')\n    return json.dumps({})\n")
    assert sorted(file_io(bad)) == ["2: from pathlib import ...", "6: load(...)", "6: open(...)",
                                    "7: write_text(...)", "imports workbench.store.reader"]


def test_widgets_start_no_thread_of_their_own() -> None:
    # what a widget draws is held and read ahead by the workspace (studies.holding, studies.reading_ahead): a
    # widget wires controls to views, and starts no thread, lock or pool of its own
    threads = {"threading", "concurrent", "multiprocessing", "asyncio"}
    found = {}
    for path in sorted((PACKAGE / "widgets").glob("*.py")):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        found[path.name] = sorted(name for name in names if name.split(".")[0] in threads)
    assert not {name: modules for name, modules in found.items() if modules}


def test_no_modules_import_one_another_in_a_circle() -> None:
    # at run time, inside functions too: a circle makes the order of imports matter and the modules one
    assert import_cycles() == []


def test_the_cycle_check_counts_imports_in_functions_and_not_those_for_types(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from workbench.analysis import compare\ndef f():\n    from workbench.runner import zygote\n")
    assert imports(source, typing=False) == [("workbench.runner.zygote", True)]  # the module, not its package
    assert ("workbench.analysis.compare", False) in imports(source)


def test_tests_share_helpers_only_through_tests_helpers() -> None:
    # a test module imported by another runs its collection-time code twice and ties the two together (the test of
    # the conftest's own hooks imports it)
    tests = Path(__file__).resolve().parents[1]
    wrong = [f"{path.relative_to(tests)}: {line.strip()}" for path in sorted(tests.rglob("*.py"))
             for line in path.read_text().splitlines()
             if line.startswith(("from tests.", "import tests."))
             and not line.startswith(("from tests.helpers", "import tests.helpers", "from tests.conftest"))]
    assert not wrong, "\n".join(wrong)
