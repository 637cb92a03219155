"""Every notebook executes top to bottom, headless, against runs the tests train (``mini_demo``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
CHROMIUM = os.environ.get("BROWSER_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
"""Where the browser test can run (it looks for Chromium the same way)."""


def _text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def test_there_are_seven_notebooks_without_committed_outputs() -> None:
    assert len(NOTEBOOKS) >= 7
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert nb.cells[0].cell_type == "markdown" and "**Question:**" in nb.cells[0].source, path.name
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name} has outputs"
        assert all(len(c.source.splitlines()) <= 15 for c in nb.cells if c.cell_type == "code"), path.name
        raw = json.loads(path.read_text())  # nbformat.read fills in missing cell ids, with a warning
        assert all("id" in c for c in raw["cells"]), f"{path.name}: a cell without an id (nbformat 4.5)"


def _client(nb: nbformat.NotebookNode, cwd: Path, **options: object) -> NotebookClient:
    """A client whose kernel talks over Unix sockets in ``cwd`` (a test's own folder): with TCP, two suites side by
    side can pick the same free port between its choice and the kernel's bind (``ZMQError: Address already in
    use``). The sockets' path is absolute, as the kernel runs in ``cwd`` and its client does not. The kernel is
    shut down after the run (kernels left running held the memory of every notebook of the session)."""
    kernel = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=str(cwd / "kernel"))
    client = NotebookClient(nb, km=kernel, timeout=300, resources={"metadata": {"path": str(cwd)}}, **options)
    client.owns_km = True  # shut the kernel down after the run, as for a manager of its own (given one, it would not)
    return client


def _say_slow_cells(nb: nbformat.NotebookNode, name: str, limit_s: float = 30.0) -> None:
    """Warn of each cell that took longer than ``limit_s`` (nbclient's timing), so that a slow run says where (in
    pytest's warnings summary, which pytest-xdist's workers report)."""
    import warnings
    from datetime import datetime

    for i, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if start and end:
            seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
            if seconds > limit_s:
                warnings.warn(f"{name}: cell {i} took {seconds:.0f} s: {cell.source.splitlines()[-1][:80]}",
                              stacklevel=1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path, mini_demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if path.stem == "07-replay-and-bisect" and CHROMIUM is not None:
        pytest.skip("executed top to bottom in JupyterLab, with the same assertions, by tests/browser "
                    "(its replays and bisect take a minute and a half)")
    monkeypatch.setenv("WORKBENCH_RUNS", str(mini_demo))
    nb = nbformat.read(path, as_version=4)
    client = _client(nb, tmp_path, store_widget_state=True)
    client.execute(env={**os.environ, "WORKBENCH_RUNS": str(mini_demo)})
    _say_slow_cells(nb, path.name)
    text = _text(nb)
    expected = {
        "01-quick-start": ["det-r0 vs det-r1: bitwise identical", "det-r0 vs nondet-r0: first differ at step"],
        "02-divergence-explorer": ["first divergent step 0, site grad:embedding.word_embeddings.weight"],
        "03-precision-study": ["bf16", "seed spread"],
        "04-parallelism-layouts": ["tp2"],
        "05-resume-and-golden-checks": ["resumed at step 4", "bitwise identical", "PASSED", "FAILED"],
        "06-cost-of-determinism": ["tax_percent"],
        "07-replay-and-bisect": ["reproduces the original", "workbench/runner/faults.py", "randperm"],
    }.get(path.stem, [])
    for snippet in expected:
        assert snippet in text, f"{path.name}: {snippet!r} not in its outputs"
    shown = {kind for c in nb.cells for o in c.get("outputs", []) for kind in o.get("data", {})}
    assert shown & {"application/vnd.plotly.v1+json", "application/vnd.jupyter.widget-view+json"}, \
        f"{path.name} showed no figure"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_on_a_folder_of_user_runs(path: Path, user_runs: Path, tmp_path: Path) -> None:
    """Roles come from manifests: every notebook runs on runs a user's own loop recorded (no demo names,
    no runner config); a question the folder cannot answer is one printed line, not an error."""
    nb = nbformat.read(path, as_version=4)
    client = _client(nb, tmp_path)
    client.execute(env={**os.environ, "WORKBENCH_RUNS": str(user_runs)})  # raises on any cell's error
    _say_slow_cells(nb, path.name)
    text = _text(nb)
    assert "det-r0" not in text and "nondet-r" not in text
    expected = {
        "01-quick-start": ["first differ at step"],
        "02-divergence-explorer": ["first divergent step"],
        "05-resume-and-golden-checks": ["no resumed run here", "PASSED"],
        "07-replay-and-bisect": ["no run here that the workbench trained"],
    }.get(path.stem, [])
    for snippet in expected:
        assert snippet in text, f"{path.name}: {snippet!r} not in its outputs"


@pytest.fixture(scope="module")
def sources_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An attribution study in miniature: a deterministic run, every source off, and two sources alone."""
    from tests.helpers.training import TINY
    from workbench.config import RunConfig
    from workbench.studies.study import expand_study, run_study

    out = tmp_path_factory.mktemp("study") / "sources"  # the folder notebook 06 looks for beside runs_dir()
    off = {name: False for name in ("embedding_atomics", "attention_backward", "splitk_gemm", "dp_allreduce")}
    base = RunConfig.from_dict({**TINY, "deterministic": False, "nondeterminism": off})
    study = expand_study({"name": "sources", "runs": [
        {"name": "det", "deterministic": True}, {"name": "all-off"},
        {"name": "splitk_gemm", "nondeterminism": {"splitk_gemm": True}},
        {"name": "attention_backward", "nondeterminism": {"attention_backward": True}}]}, base)
    run_study(study, out, lambda *args: None)
    return out


def test_the_cost_notebook_says_which_source_matters(sources_study: Path, tmp_path: Path) -> None:
    path = next(p for p in NOTEBOOKS if p.stem == "06-cost-of-determinism")
    nb = nbformat.read(path, as_version=4)
    client = _client(nb, tmp_path)
    client.execute(env={**os.environ, "WORKBENCH_RUNS": str(sources_study)})
    _say_slow_cells(nb, path.name)
    text = _text(nb)
    for snippet in ("attention_backward", "act_grad:layers.1.input_layernorm", "splitk_gemm", "act:layers.0.mlp",
                    "tax_percent"):
        assert snippet in text, f"{snippet!r} not in notebook 06's outputs"
    last = nb.cells[-1].outputs
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in last), "no sources figure"
