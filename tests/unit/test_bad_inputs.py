"""Every verb, driven in-process, on every kind of bad input: one line, exit 2, nothing written or lost.

Exit 1 is kept for "checked and differs"; a damaged store is never an answer. The bad stores
are copies of a good synthetic run with one thing broken, the way disks, editors and
half-finished producers break them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import zarr
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from workbench.cli import main
from workbench.config import Precision, RunConfig
from workbench.store.layout import Status
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import update_manifest


def _chunk(store: Path, array: str) -> Path:
    return next(p for p in sorted((store / array / "c").rglob("*")) if p.is_file())


def _edit_manifest(store: Path, edit: Callable[[dict], None]) -> None:
    meta = json.loads((store / "zarr.json").read_text())
    edit(meta["attributes"])
    (store / "zarr.json").write_text(json.dumps(meta))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:10])


def _scramble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2:] = bytes(255 - b for b in data[len(data) // 2:])  # same length, other bytes
    path.write_bytes(bytes(data))


def _declare_shape(array: Path, shape: list[int]) -> None:
    meta = json.loads((array / "zarr.json").read_text())
    meta["shape"] = shape
    (array / "zarr.json").write_text(json.dumps(meta))


def _declare_inner_chunks(array: Path, inner: list[int]) -> None:
    """The sharding codec's own chunk shape (nested in ``codecs``): one value per chunk makes a reader walk an
    index entry per value (an 18 MB store of this took 31 s and 2.1 GB before ``compare`` refused it)."""
    meta = json.loads((array / "zarr.json").read_text())
    meta["codecs"][0]["configuration"]["chunk_shape"] = inner
    (array / "zarr.json").write_text(json.dumps(meta))


def _declare_steps(store: Path, group: str, arrays: tuple[str, ...], steps: int) -> None:
    for name in arrays:
        meta = json.loads((store / group / name / "zarr.json").read_text())
        _declare_shape(store / group / name, [steps, *meta["shape"][1:]])


SITE_ROWS = ("done", "step", "stats", "fingerprint")
SCALARS = ("done", "step", "loss", "grad_norm", "lr", "loss_scale", "step_time", "tokens_per_s", "recorder_time",
           "val_loss", "skipped")

BREAKS: dict[str, Callable[[Path], None]] = {
    "missing stats chunk": lambda s: _chunk(s, "sites/stats").unlink(),
    "missing fingerprint chunk": lambda s: _chunk(s, "sites/fingerprint").unlink(),
    "missing val_loss chunk (all NaN)": lambda s: _chunk(s, "scalars/val_loss").unlink(),
    "stats declaring 4e9 steps": lambda s: _declare_shape(s / "sites" / "stats", [4 * 10**9, 12, 12]),
    "site records declaring 4e9 steps": lambda s: _declare_steps(s, "sites", SITE_ROWS, 4 * 10**9),
    "scalars declaring 4e9 steps": lambda s: _declare_steps(s, "scalars", SCALARS, 4 * 10**9),
    "stats declaring 10**12 sites": lambda s: _declare_shape(s / "sites" / "stats", [8, 10**12, 12]),
    "stats declaring one value per inner chunk": lambda s: _declare_inner_chunks(s / "sites" / "stats", [1, 1, 1]),
    "manifest resumes of the wrong type": lambda s: _edit_manifest(s, lambda m: m.update(resumes="x")),
    "manifest resumes a number": lambda s: _edit_manifest(s, lambda m: m.update(resumes=5)),
    "manifest launcher pid past the OS's range": lambda s: _edit_manifest(
        s, lambda m: m.update(status="running", launcher={"pid": 10**40, "host": m["host"]})),
    "manifest status unknown": lambda s: _edit_manifest(s, lambda m: m.update(status="sleeping")),
    "manifest model size out of range": lambda s: _edit_manifest(s, lambda m: m["model"].update(num_layers=-3)),
    "manifest config out of range": lambda s: _edit_manifest(s, lambda m: m["config"].update(steps=-1)),
    "truncated fingerprint chunk": lambda s: _truncate(_chunk(s, "sites/fingerprint")),
    "corrupt fingerprint chunk": lambda s: _scramble(_chunk(s, "sites/fingerprint")),
    "corrupt loss chunk": lambda s: _scramble(_chunk(s, "scalars/loss")),
    "manifest without a name": lambda s: _edit_manifest(s, lambda m: m.pop("name")),
    "manifest config of the wrong type": lambda s: _edit_manifest(s, lambda m: m.update(config="fp32")),
    "manifest layout of the wrong type": lambda s: _edit_manifest(s, lambda m: m.update(layout=[1, 2])),
    "manifest model field of the wrong type": lambda s: _edit_manifest(
        s, lambda m: m["model"].update(num_layers="two")),
    "manifest of schema v1 without its config": lambda s: _edit_manifest(
        s, lambda m: [m.pop(k) for k in ("config", "producer")]),
    "newer schema": lambda s: _edit_manifest(s, lambda m: m.update(schema_version=99)),
    "unreadable zarr.json": lambda s: (s / "zarr.json").write_text("{not json"),
    "store still being created": lambda s: shutil.rmtree(s / "scalars"),
    "site arrays missing": lambda s: shutil.rmtree(s / "sites" / "fingerprint"),
}
"""Broken copies of a good run store (``s`` is its ``run.zarr``)."""

VERBS: list[list[str]] = [
    ["summary", "{bad}"],
    ["compare", "{bad}", "{good}"],
    ["compare", "{good}", "{bad}", "--json"],
    ["check", "{bad}", "--golden", "{good}"],
    ["check", "{good}", "--golden", "{bad}", "--rtol", "1e-3"],
    ["resume-check", "{bad}", "{good}", "--from-step", "1"],
    ["report", "{bad}", "{good}", "-o", "{out}/report.html"],
    ["anomalies", "{bad}"],
    ["replay", "{bad}", "--step", "1", "--out", "{out}/replay"],
    ["bisect", "{bad}", "{good}", "--out", "{out}/bisect"],
]
"""Verbs that read a run, with ``{bad}`` where the broken input goes."""


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stores")
    good = write_synthetic_run(root / "good", steps=8, sites=12, seed=1)
    made = {"good": good, "missing path": root / "missing", "plain file": root / "file", "empty folder": root / "empty"}
    made["plain file"].write_text("not a run\n")
    made["empty folder"].mkdir()
    other = zarr.open_group(root / "other" / "run.zarr", mode="w")
    other.attrs["kind"] = "someone.elses"
    made["zarr group of another kind"] = root / "other"
    for name, breaks in BREAKS.items():
        copy = root / name.replace(" ", "-")
        shutil.copytree(good, copy)
        breaks(copy / "run.zarr")
        made[name] = copy
    return made


def _state(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


BAD = ["missing path", "plain file", "empty folder", "zarr group of another kind", *BREAKS]


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: " ".join(v[:1] + [a for a in v[1:] if a.startswith("-")]))
@pytest.mark.parametrize("bad", BAD)
def test_a_bad_input_is_one_line_and_exit_2_and_nothing_changes(stores: dict[str, Path], bad: str, verb: list[str],
                                                                 tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    root = stores["good"].parent
    before = _state(root)
    args = [a.format(bad=stores[bad], good=stores["good"], out=tmp_path) for a in verb]
    code = main(args)
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("workbench: error:")]
    assert code == 2 and len(errors) == 1, (code, captured.err[-2000:])
    assert "Traceback" not in captured.err
    assert _state(root) == before
    assert list(tmp_path.iterdir()) == []  # no report, replay or bisect folder left behind


@pytest.mark.parametrize("verb", [["compare", "{bad}", "{good}"], ["anomalies", "{bad}"]], ids=lambda v: v[0])
def test_inner_chunks_are_checked_where_the_array_is_opened(stores: dict[str, Path], verb: list[str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = stores["stats declaring one value per inner chunk"]
    code = main([a.format(bad=bad, good=stores["good"]) for a in verb])  # the check is where the array is opened
    error = capsys.readouterr().err
    assert code == 2 and "declares inner chunks (1, 1, 1) in shards (8, 12, 12): 1152 chunks per shard file, at " \
        "most 1024" in error, error


def test_ls_lists_the_readable_runs_and_names_each_unreadable_one(stores: dict[str, Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ls", str(stores["good"].parent)])
    captured = capsys.readouterr()
    assert code == 0 and "good" in captured.out
    skipped = {line.split(":")[1].strip() for line in captured.err.splitlines()
               if line.startswith("workbench: skipped")}
    not_runs = ("missing path", "plain file", "empty folder")
    site_damage = ("truncated fingerprint chunk", "corrupt fingerprint chunk", "site arrays missing",  # ls reads none
                   "missing stats chunk", "missing fingerprint chunk", "stats declaring 4e9 steps",
                   "site records declaring 4e9 steps", "stats declaring 10**12 sites",
                   "stats declaring one value per inner chunk",
                   "missing val_loss chunk (all NaN)")  # ls reads the loss of the scalars only
    expected = {str(stores[name]).removeprefix("workbench: skipped ") for name in BAD
                if name not in not_runs + site_damage}
    assert {p.removeprefix("skipped ") for p in skipped} == expected, captured.err
    # listed (their copied manifests say "good"): the damage is found by the verbs that read sites
    assert len(captured.out.splitlines()) == 1 + 1 + len(site_damage)


@pytest.mark.parametrize("argv, message", [
    (["run", "{tmp}/absent.toml"], "no such config file"),
    (["run", "{file}"], "not valid TOML"),
    (["sweep", "{tmp}/absent.toml"], "absent.toml"),
    (["import-te", "{tmp}/absent.log", "--out", "{tmp}/imported"], "absent.log"),
    (["import-megatron-dumps", "{tmp}/absent", "--out", "{tmp}/imported"], "absent: not a folder"),
    (["ls", "{tmp}/absent"], "no such directory"),
    (["compare", "{good}", "{good}", "--json"], None),
])
def test_verbs_that_read_no_store_reject_bad_paths(stores: dict[str, Path], tmp_path: Path, argv: list[str],
                                                   message: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.toml").write_text("this is [not toml\n")
    args = [a.format(tmp=tmp_path, file=tmp_path / "bad.toml", good=stores["good"]) for a in argv]
    code = main(args)
    err = capsys.readouterr().err
    if message is None:  # the control: a good pair is not an error
        assert code == 0 and err == ""
        return
    lines = [line for line in err.splitlines() if line.startswith("workbench: error:")]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "imported").exists()


def test_a_run_still_being_written_is_read_up_to_its_last_written_step(stores: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    live = tmp_path / "live"
    shutil.copytree(stores["good"], live)
    update_manifest(live, status="running", launcher={"host": "another-host", "pid": 1})
    for group in ("scalars", "sites"):
        done = zarr.open_array(live / "run.zarr" / group / "done", mode="r+")
        done[5:] = 0
    run = open_run(live)
    assert run.status == "running" and run.steps_completed == 5 and run.recorded_steps_completed == 5
    assert main(["check", str(live), "--golden", str(stores["good"])]) == 1  # it recorded less: differs
    assert main(["compare", str(live), str(stores["good"])]) == 0


# -- the property: every manifest field replaced by a value of another type or out of range --------------------

_DELETE = object()
"""The field removed (for the fields a reader requires)."""
_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
_JSON = {  # JSON values by type, with the extremes that break readers (NaN and Infinity: zarr reads them back)
    "null": st.none(),
    "bool": st.booleans(),
    "int": st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**40]) | st.integers(),
    "float": st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e308, -1e308, math.nan, math.inf, -math.inf]) | st.floats(),
    "str": st.sampled_from(["", "1", "true", "null", "NaN", "x" * 300, "a\nb"]) | st.text(max_size=12),
    "list": st.lists(_LEAF, max_size=3),
    "dict": st.dictionaries(st.text(max_size=6), _LEAF, max_size=3),
}


def _other_than(*valid: str) -> st.SearchStrategy[Any]:
    """Values of every JSON type but ``valid`` ("null" among them where None means absent)."""
    return st.one_of([values for kind, values in _JSON.items() if kind not in valid])


def _ints_outside(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(max_value=low - 1) | st.integers(min_value=high + 1) | \
        st.sampled_from([v for v in (-1, 0, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 10**40, -(10**40))
                         if not low <= v <= high])


def _whole_number(low: int, high: int, *, optional: bool) -> st.SearchStrategy[Any]:
    """Not a whole number in [low, high] (bools and floats such as 1.0 are not whole numbers)."""
    bad = _other_than("int", "null") if optional else _other_than("int") | st.just(_DELETE)
    return bad | _ints_outside(low, high)


def _text(*, optional: bool = True, but: tuple[str, ...] = ()) -> st.SearchStrategy[Any]:
    """Not a string (or one of the strings ``but`` lists as valid, when a string must be one of them)."""
    bad = _other_than("str", "null") if optional else _other_than("str")
    return (bad | st.text(max_size=12).filter(lambda s: s not in but)) if but else bad


_SIZE, _COUNT = 2**31 - 1, 2**63 - 1
_BAD_STEP = _whole_number(0, _COUNT, optional=False).filter(lambda v: v is not _DELETE) | st.none()
_RUN_CONFIG_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}
_NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])

FIELDS: dict[tuple[str | int, ...], st.SearchStrategy[Any]] = {
    ("kind",): _other_than("str") | st.text(max_size=14).filter(lambda s: s != "workbench.run") | st.just(_DELETE),
    ("schema_version",): _whole_number(1, 3, optional=False),  # 1, 2 and 3 are the schemas this workbench reads
    ("run_id",): _text(optional=False) | st.just(_DELETE),
    ("name",): _text(optional=False) | st.just(_DELETE),
    ("producer",): _text(optional=False),  # absent is valid (a schema v1 store); None is not
    ("precision",): _text(),
    ("deterministic",): _other_than("bool", "null"),
    ("seed",): _whole_number(0, _COUNT, optional=True),
    ("determinism",): _other_than("dict", "null"),
    ("user_config",): _other_than("dict", "null"),
    ("config",): _other_than("dict", "null") | st.dictionaries(  # {} lacks the name; any other key is unknown
        st.text(max_size=8).filter(lambda k: k not in _RUN_CONFIG_FIELDS), _LEAF, max_size=3),
    ("status",): _text(but=tuple(Status)),
    ("resumes",): _other_than("list", "null") | st.tuples(st.lists(st.integers(0, 7), max_size=2), _BAD_STEP).map(
        lambda t: [*t[0], t[1]]),
    ("resumes", 0): _BAD_STEP,
    ("config_hash",): _text(),
    ("fault",): _text(),  # any string is a description of the fault
    ("versions",): _other_than("dict", "null"),
    ("git_revision",): _text(),
    ("host",): _text(),
    ("platform",): _text(),
    ("started_at",): _text(),
    ("ended_at",): _text(),
    ("launcher",): _other_than("dict", "null"),
    ("launcher", "pid"): _whole_number(1, _SIZE, optional=True),
    ("launcher", "host"): _text(),
    ("heartbeat",): _other_than("dict", "null"),
    ("heartbeat", "at"): _other_than("int", "float", "null") | _NOT_FINITE | st.integers(max_value=-1) |
    st.floats(max_value=-5e-324),  # -0.0 is 0
    ("heartbeat", "every_s"): _other_than("int", "float", "null") | _NOT_FINITE | st.integers(max_value=0) |
    st.floats(max_value=0.0),
    ("started_from",): _other_than("dict", "null"),
    ("started_from", "step"): _whole_number(0, _COUNT, optional=True),
    ("started_from", "run"): _text(),
    ("replay",): _other_than("dict", "null"),
    ("replay", "step"): _whole_number(0, _COUNT, optional=True),
    ("replay", "from_step"): _whole_number(0, _COUNT, optional=True),
    ("diverged",): _other_than("dict", "null"),
    ("diverged", "step"): _whole_number(0, _COUNT, optional=True),
    ("diverged", "site"): _other_than("str", "null"),
    ("diverged", "reference"): _other_than("str", "null"),
    ("steps_planned",): _whole_number(0, _COUNT, optional=True) | st.integers(0, 7),  # fewer than the scalars' 8
    ("model",): _other_than("dict", "null") | st.dictionaries(  # a mapping without the model's sizes
        st.text(max_size=8).filter(lambda k: not k.endswith(("layers", "size", "heads", "length"))), _LEAF,
        max_size=3),
    **{("model", n): _whole_number(1, _SIZE, optional=False)
       for n in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")},
    **{("model", n): _whole_number(0, _COUNT, optional=True) for n in ("num_experts", "moe_topk", "parameters")},
    ("layout",): _other_than("dict", "null"),
    **{("layout", n): _whole_number(1, _SIZE, optional=True) for n in ("tp", "pp", "dp", "vp", "ep", "cp")},
    ("layout", "sp"): _other_than("bool", "null"),
    ("config", "name"): _other_than("str") | st.just(_DELETE) | st.text(min_size=1, max_size=8).filter(
        lambda s: not all(c.isalnum() or c in "-_." for c in s)) | st.just(""),
    ("config", "steps"): _other_than("int") | st.integers(max_value=0),
    ("config", "seed"): _other_than("int") | st.integers(max_value=-1),  # absent: the default seed
    ("config", "precision"): _other_than("str") | st.text(max_size=6).filter(lambda s: s not in set(Precision)),
    ("config", "deterministic"): _other_than("bool"),
    ("config", "model", "num_layers"): _other_than("int") | st.integers(max_value=0),
    ("config", "layout", "tp"): _other_than("int") | st.integers().filter(lambda v: v not in (1, 2, 4)),  # 4 heads
}
"""Each field a reader checks, with values that are invalid for it."""

_PARENTS: dict[str, dict[str, Any]] = {"started_from": {"run": "elsewhere", "run_id": "elsewhere-0", "step": 0},
                                       "replay": {"step": 1, "from_step": 0},
                                       "diverged": {"step": 1, "site": "loss", "reference": "elsewhere-0"}}
"""Valid mappings to put a nested field in, where the good store has none."""


def _put(attrs: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = attrs
    for key in path[:-1]:
        if isinstance(key, str) and key not in node:
            node[key] = dict(_PARENTS[key])
        node = node[key]
    leaf = path[-1]
    if value is _DELETE:
        del node[leaf]
    elif isinstance(leaf, int):
        node[leaf:leaf + 1] = [value]
    else:
        node[leaf] = value


PROPERTY_VERBS: list[list[str]] = [
    ["summary", "{bad}"],
    ["compare", "{bad}", "{good}"],
    ["compare", "{good}", "{bad}", "--json"],
    ["check", "{bad}", "--golden", "{good}"],
    ["anomalies", "{bad}"],
    ["resume-check", "{bad}", "{good}", "--from-step", "1"],
    ["golden", "{bad}", "--out", "{out}/g.json"],
    ["figure", "trajectories", "{bad}", "{good}", "-o", "{out}/f.html"],
    ["report", "{bad}", "{good}", "-o", "{out}/r.html"],
    ["replay", "{bad}", "--step", "1", "--out", "{out}/replay"],
    ["ls", "{runs}"],
]
"""The reading verbs that take a run (``ls`` a folder holding the bad run and a good one)."""


class _Launched(Exception):
    """Raised in place of launching training: a replay that got this far launched."""


@pytest.fixture(scope="module")
def heartbeat_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good synthetic run whose manifest has a heartbeat too."""
    good = write_synthetic_run(tmp_path_factory.mktemp("heartbeat") / "good", steps=8, sites=12, seed=1)
    _edit_manifest(good / "run.zarr", lambda m: m.update(heartbeat={"at": time.time(), "every_s": 10.0}))
    return good


def _run_verb(verb: list[str], good: Path, root: Path, edit: Callable[[dict], None] | None) -> tuple[int, Path]:
    """``verb`` on a copy of ``good`` under ``root`` (edited by ``edit``), with launching replaced by ``_Launched``:
    its exit code and the copy."""
    bad, out = root / "runs" / "bad", root / "out"
    shutil.copytree(good, bad)
    out.mkdir()
    if verb[0] == "ls":
        shutil.copytree(good, root / "runs" / "good")
    if verb[0] == "replay":  # a synthetic run is never replayed: make the manifest the only thing that can refuse
        _edit_manifest(bad / "run.zarr", lambda m: m.pop("synthetic"))
    if edit is not None:
        _edit_manifest(bad / "run.zarr", edit)
    args = [a.format(bad=bad, good=good, out=out, runs=root / "runs") for a in verb]
    with mock.patch("workbench.investigate.replay.launch", side_effect=_Launched):
        return main(args), bad


@pytest.mark.parametrize("verb", PROPERTY_VERBS, ids=lambda v: " ".join(a for a in v if "{" not in a))
def test_the_good_store_of_the_property_is_read_by_every_verb(heartbeat_store: Path, verb: list[str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The control: unedited, the store passes every verb (a replay launches), so exit 2 below is the edit's."""
    with tempfile.TemporaryDirectory() as tmp:
        if verb[0] == "replay":
            with pytest.raises(_Launched):
                _run_verb(verb, heartbeat_store, Path(tmp), None)
            return
        code, _ = _run_verb(verb, heartbeat_store, Path(tmp), None)
        written = list((Path(tmp) / "out").iterdir())
    err = capsys.readouterr().err
    assert code in (0, 1) and "workbench: error" not in err and "workbench: skipped" not in err, (code, err)
    assert bool(written) == any("{out}" in a for a in verb)  # what the property finds no trace of


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(case=(("status",), ["complete"]), verb=PROPERTY_VERBS[0])  # was a TypeError (a list is unhashable)
@given(case=st.one_of([st.tuples(st.just(path), values) for path, values in FIELDS.items()]),
       verb=st.sampled_from(PROPERTY_VERBS))
def test_a_manifest_field_of_another_type_or_out_of_range_is_one_line_and_exit_2(
        heartbeat_store: Path, case: tuple[tuple[str | int, ...], Any], verb: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    path, value = case
    good_before = _state(heartbeat_store)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        capsys.readouterr()
        code, bad = _run_verb(verb, heartbeat_store, root, lambda m: _put(m, path, value))
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        errors = [line for line in captured.err.splitlines() if line.startswith("workbench: error:")]
        if verb[0] == "ls":  # the good run listed, the bad one skipped on one line
            skipped = [line for line in captured.err.splitlines() if line.startswith("workbench: skipped")]
            assert code == 0 and errors == [] and len(captured.out.splitlines()) == 2, (code, captured)
            assert len(skipped) == 1 and skipped[0].startswith(f"workbench: skipped {bad}:"), captured.err
        else:
            assert code == 2 and len(errors) == 1 and str(bad) in errors[0], (code, captured.err[-2000:])
            assert any(w in errors[0] for w in ("manifest", "not a workbench run", "schema version")), errors[0]
        assert list((root / "out").iterdir()) == []  # no golden file, figure, report or replay left behind
        assert not (bad / "replays").exists()
    assert _state(heartbeat_store) == good_before
