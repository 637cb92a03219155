"""The package's layers import downward only (README, "Architecture"), checked on the source."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.layers import ALLOWED, LAZY_ONLY, PACKAGE, imports, layer_of


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
