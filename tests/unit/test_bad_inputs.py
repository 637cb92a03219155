"""Every verb, driven in-process, on every kind of bad input: one line, exit 2, nothing written or lost.

Exit 1 is kept for "checked and differs"; a damaged store is never an answer. The bad stores
are copies of a good synthetic run with one thing broken, the way disks, editors and
half-finished producers break them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import zarr

from workbench.cli import main
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


BREAKS: dict[str, Callable[[Path], None]] = {
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
    ["study", "{bad}"],
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


def test_ls_lists_the_readable_runs_and_names_each_unreadable_one(stores: dict[str, Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ls", str(stores["good"].parent)])
    captured = capsys.readouterr()
    assert code == 0 and "good" in captured.out
    skipped = {line.split(":")[1].strip() for line in captured.err.splitlines()
               if line.startswith("workbench: skipped")}
    not_runs = ("missing path", "plain file", "empty folder")
    site_damage = ("truncated fingerprint chunk", "corrupt fingerprint chunk", "site arrays missing")  # ls reads none
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
