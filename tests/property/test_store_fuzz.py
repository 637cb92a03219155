"""Damaged run stores and importer files: every verb ends with a result or one line, under a memory limit.

hypothesis damages one file of a small real store (``tests/helpers/fuzz.py``: a value of a ``zarr.json``
replaced or removed, huge and negative numbers among them; a file cut, bytes flipped, garbage, the file
removed, or replaced by a link to another store's file), and ``ls``, ``compare``, ``anomalies`` and ``check``
run on it in a process limited to 4 GiB of address space. It damages the example files of the importers'
formats too (a line replaced, removed or repeated, a number made extreme, the file cut, flipped or garbage):
``import-te``, ``import-megatron`` and ``import-megatron-dumps`` (one file of a TP=2 dump folder) read them, and
``anomalies`` reads what they wrote. Each verb must print
a result (exit 0 or 1), or say in one line what is wrong (exit 2, or ``NOT_YET`` for a run that has not recorded yet):
never a traceback, a hang, or memory the files' claims asked for. The examples are derandomized, the same ones
in every run (``WORKBENCH_FUZZ_EXAMPLES`` sets how many, 40 by default; ``WORKBENCH_FUZZ_RANDOM=1`` draws new
ones).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.dumps import full_tensors, write_dumps
from tests.helpers.fuzz import Outcome, VerbWorker
from workbench.cli import main
from workbench.store.synthetic import write_synthetic_run
from workbench.testing.damage import damage, damage_file, file_mutations, mutations

ROOT = Path(__file__).resolve().parents[2]
IMPORTS = {"import-te": ROOT / "data" / "examples" / "te_debug" / "nvdlfw_inspect_statistics_logs"
                        / "nvdlfw_inspect_globalrank-0.log",
           "import-megatron": ROOT / "data" / "examples" / "megatron_tb",
           "import-megatron-dumps": None}
"""An importer and the example of its format it is given: a TE debug log, a folder holding a TensorBoard event
file, a folder of Megatron-LM's tensor dumps (None: written by the ``stores`` fixture)."""
EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "40"))
RANDOM = os.environ.get("WORKBENCH_FUZZ_RANDOM") == "1"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A pristine run, its golden file, and another copy of it (what a link out of a store points into)."""
    root = tmp_path_factory.mktemp("fuzz")
    pristine = write_synthetic_run(root / "pristine" / "run", steps=8, sites=24, seed=1, name="run")
    elsewhere = root / "elsewhere" / "run"
    shutil.copytree(pristine, elsewhere)
    golden = root / "golden.json"
    assert main(["golden", str(pristine), "--out", str(golden)]) == 0
    dumps = write_dumps(root / "dumps", 2, full_tensors())
    return {"root": root, "pristine": pristine, "elsewhere": elsewhere, "golden": golden, "dumps": dumps}


@pytest.fixture(scope="module")
def worker() -> Iterator[VerbWorker]:
    verbs = VerbWorker(memory_bytes=4 << 30)
    yield verbs
    verbs.close()


def _verbs(run: Path, stores: dict[str, Path]) -> list[list[str]]:
    return [["ls", str(run.parent)], ["compare", str(run), str(stores["pristine"])], ["anomalies", str(run)],
            ["check", str(run), "--golden", str(stores["golden"])]]


def test_the_verbs_answer_on_the_pristine_store_and_the_worker_reports_what_it_cannot(
        stores: dict[str, Path], worker: VerbWorker) -> None:
    for argv in _verbs(stores["elsewhere"], stores):
        outcome = worker.run(argv)
        assert outcome.answered and outcome.rc == 0, outcome
    # the judge itself: a traceback, and a verb's death under the memory limit, are not answers
    assert not Outcome(["x"], 2, err="workbench: error: a\nTraceback").answered
    assert Outcome(["x"], 2, err="iter_0000001 (1/2): 4 files\nworkbench: error: a").answered  # progress, then it
    assert not Outcome(["x"], 2, err="workbench: error: a\nworkbench: error: b").answered
    assert not Outcome(["x"], 2, err="workbench: error: a\n  more of it").answered
    small = VerbWorker(memory_bytes=64 << 20)  # too little to import the workbench: the process dies
    try:
        died = small.run(["ls", str(stores["root"])])
    finally:
        small.close()
    assert died.rc is None and not died.answered and "died" in died.raised


def test_an_empty_zarr_json_of_a_scalar_is_named_not_a_traceback(stores: dict[str, Path], worker: VerbWorker) -> None:
    # the fuzzer's first find: zarr's ``in`` parses the child's metadata and raised JSONDecodeError
    run = stores["root"] / "empty-metadata" / "run"
    shutil.copytree(stores["pristine"], run)
    (run / "run.zarr" / "scalars" / "grad_norm" / "zarr.json").write_bytes(b"")
    for argv in _verbs(run, stores)[1:]:
        outcome = worker.run(argv)
        assert outcome.rc == 2 and outcome.answered and "scalars/grad_norm" in outcome.err, outcome


@settings(max_examples=EXAMPLES, derandomize=not RANDOM, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mutation=mutations())
def test_every_reading_verb_answers_a_damaged_store(mutation: dict[str, Any], stores: dict[str, Path],
                                                    worker: VerbWorker) -> None:
    case = stores["root"] / "case"
    shutil.rmtree(case, ignore_errors=True)
    run = case / "run"
    shutil.copytree(stores["pristine"], run)
    what = damage(run / "run.zarr", mutation, stores["elsewhere"] / "run.zarr")
    failed = [outcome for outcome in (worker.run(argv) for argv in _verbs(run, stores)) if not outcome.answered]
    assert not failed, f"damage: {what}\n" + "\n".join(
        f"{' '.join(o.argv[:1])}: exit {o.rc} {o.raised}\n  stderr: {o.err.strip()[-600:]}\n"
        f"  {o.traceback.strip()[-1200:]}" for o in failed)


@settings(max_examples=EXAMPLES, derandomize=not RANDOM, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(verb=st.sampled_from(sorted(IMPORTS)), which=st.integers(0, 10_000), mutation=file_mutations())
def test_every_importer_answers_a_damaged_file_and_what_it_writes_is_read(
        verb: str, which: int, mutation: dict[str, Any], stores: dict[str, Path], worker: VerbWorker) -> None:
    case = stores["root"] / "import-case"
    shutil.rmtree(case, ignore_errors=True)
    example = IMPORTS[verb] or stores["dumps"]
    source = case / "in" / example.name
    if example.is_dir():
        shutil.copytree(example, source)
    else:
        source.parent.mkdir(parents=True)
        shutil.copy(example, source)
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    damaged = files[which % len(files)]
    what = f"{damaged.parent.relative_to(case)}/{damage_file(damaged, mutation)}"
    argv = [verb, str(source), "--out", str(case / "out")]
    outcomes = [worker.run(argv)]
    if outcomes[0].rc == 0:  # what it wrote is a store the reading verbs answer on
        outcomes.append(worker.run(["anomalies", str(case / "out")]))
    failed = [o for o in outcomes if not o.answered]
    assert not failed, f"damage: {what}\n" + "\n".join(
        f"{' '.join(o.argv[:1])}: exit {o.rc} {o.raised}\n  stderr: {o.err.strip()[-600:]}\n"
        f"  {o.traceback.strip()[-1200:]}" for o in failed)
