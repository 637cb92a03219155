"""A name is a name, never a path; a full disk is one line and leaves nothing behind; a read-only home is no
obstacle. Driven in-process through the CLI, with the bytes of the files around the output checked after."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench import disk
from workbench.cli import main
from workbench.config import RunConfig
from workbench.errors import ArgumentError, ConfigError, DamagedStoreError, DiskFullError
from workbench.names import MAX_NAME_BYTES, check_name, inside, name_problem
from workbench.store import layout
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import update_manifest
from workbench.studies.study import expand_study

TINY = Path(__file__).parents[2] / "workbench" / "examples" / "tiny.toml"
BAD_NAMES = ["..", ".", "", "a/b", "../x", "a\\b", "a\x00b", "x" * (MAX_NAME_BYTES + 1),
             "é" * (MAX_NAME_BYTES // 2 + 1)]


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by path, with its bytes' hash: what must not change."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("workbench:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def neighbourhood(tmp_path: Path) -> tuple[Path, Path]:
    """``tmp_path/work/out`` to write into, beside another run's notes and a source folder that must survive."""
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "model.py").write_text("print('mine')\n")
    (work / "precious.txt").write_text("not the workbench's\n")
    (work / "out").mkdir()
    (work / "out" / "notes.md").write_text("another run's notes\n")
    return work, work / "out"


# --- names ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_name_that_is_not_one_folder_name_is_refused(name: str) -> None:
    assert name_problem(name) is not None
    with pytest.raises(ConfigError, match="not allowed"):
        check_name(name, "name", "cfg.toml")
    with pytest.raises(ConfigError, match="name"):
        RunConfig(name=name)


@pytest.mark.parametrize("name", ["tiny", "run.v2", "a" * MAX_NAME_BYTES, "Zürich-é", "x y $(z)"])
def test_ordinary_names_pass(name: str) -> None:
    assert check_name(name, "name") == name


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("name", ["..", "."])
def test_a_config_named_dot_dot_writes_and_deletes_nothing(capsys: pytest.CaptureFixture[str],
                                                           neighbourhood: tuple[Path, Path], name: str,
                                                           overwrite: bool) -> None:
    work, out = neighbourhood
    config = work / "evil.toml"
    config.write_text(TINY.read_text().replace('name = "tiny"', f'name = "{name}"'))
    before = _snapshot(work)
    assert main(["run", str(config), "--out", str(out), *(["--overwrite"] if overwrite else [])]) == 2
    assert "not allowed" in _one_line(capsys)
    assert _snapshot(work) == before


def test_a_study_named_dot_dot_is_refused() -> None:
    with pytest.raises(ConfigError, match="name = '..' is not allowed"):
        expand_study({"name": "..", "runs": [{"name": "a"}]}, RunConfig(name="base"), source="study.toml")
    with pytest.raises(ConfigError, match="not allowed"):
        expand_study({"runs": [{"name": "../a"}]}, RunConfig(name="base"), source="study.toml")


def test_a_manifest_whose_name_is_a_path_is_refused_when_the_store_opens(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = write_synthetic_run(tmp_path / "a", steps=4)
    update_manifest(run, name="../../elsewhere")
    with pytest.raises(DamagedStoreError, match="manifest.*not allowed"):
        open_run(run)
    assert main(["bisect", str(run), str(run), "--out", str(tmp_path / "b")]) == 2
    _one_line(capsys)
    assert not (tmp_path / "b").exists() and not (tmp_path.parent / "elsewhere").exists()


@pytest.mark.parametrize("flag", [["--name", ".."], ["--name", "a/b"], []])
def test_an_import_name_is_checked_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             flag: list[str]) -> None:
    from workbench.importers.te_log import te_log_path, write_te_log

    write_te_log(te_log_path(tmp_path / "logs"), open_run(write_synthetic_run(tmp_path / "r", steps=3, sites=2))
                 .records())
    out = tmp_path / "logs" / ".." if not flag else tmp_path / "imported"  # no flag: the folder's own name
    code = main(["import-te", str(tmp_path / "logs"), "--out", str(out), *flag])
    if flag:
        assert code == 2 and "not allowed" in _one_line(capsys)
        assert not (tmp_path / "imported").exists()
    else:  # `--out logs/..` names the folder tmp_path, whose name is a name
        assert code == 0 and open_run(tmp_path).name == tmp_path.name


def test_a_run_folder_that_links_outside_out_is_refused(capsys: pytest.CaptureFixture[str],
                                                       neighbourhood: tuple[Path, Path], tmp_path: Path) -> None:
    work, out = neighbourhood
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("mine\n")
    (out / "tiny").symlink_to(elsewhere)
    before = _snapshot(tmp_path)
    assert main(["run", str(TINY), "--out", str(out), "--overwrite"]) == 2
    assert "lies outside" in _one_line(capsys)
    assert _snapshot(tmp_path) == before


def test_inside_resolves_links_and_dot_dot(tmp_path: Path) -> None:
    assert inside(tmp_path, tmp_path / "a" / ".." / "b") == tmp_path / "a" / ".." / "b"
    for escaping in (tmp_path / "..", tmp_path, tmp_path / "a" / ".." / ".." / "x"):
        with pytest.raises(ArgumentError, match="lies outside"):
            inside(tmp_path, escaping)


def test_overwrite_removes_only_the_workbenchs_entries(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path / "r", steps=3)
    (run / "notes.md").write_text("mine\n")
    (run / "logs").mkdir()
    assert layout.clear_run_folder(run) == ["notes.md"]
    assert sorted(p.name for p in run.iterdir()) == ["notes.md"]


def test_overwrite_refuses_a_folder_of_other_files(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    (folder / "logs").mkdir(parents=True)
    (folder / "thesis.tex").write_text("x\n")
    before = _snapshot(tmp_path)
    with pytest.raises(ArgumentError, match="thesis.tex but no run store"):
        layout.clear_run_folder(folder)
    assert _snapshot(tmp_path) == before


# --- full disks -------------------------------------------------------------------------------------------

def test_written_leaves_nothing_when_the_write_fails(tmp_path: Path) -> None:
    target = tmp_path / "new" / "deeper" / "r.html"
    with pytest.raises(DiskFullError, match=r"r.html: no space left on device \(it needed 5 bytes"):
        with disk.written(target, needed=5) as partial:
            partial.write_bytes(b"hal")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert not (tmp_path / "new").exists()
    with disk.written(target) as partial:
        partial.write_bytes(b"whole")
    assert target.read_bytes() == b"whole" and [p.name for p in target.parent.iterdir()] == ["r.html"]


def test_an_error_that_is_not_the_disk_passes_through(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        with disk.written(tmp_path / "f") as partial:
            partial.write_bytes(b"x")
            raise KeyError("mine")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(params=[0, 12], ids=["full", "12 kB left"])
def full(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A 1 MB tmpfs holding an old-schema run (for ``upgrade``), then filled to the last block, or to the last
    12 kB (room for the writer's lock and part of a store) (root only: elsewhere the injected errors above stand
    in)."""
    where = tmp_path / "full"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip("mounting a tmpfs is not allowed here (not root); the injected full disks above stand in")
    try:
        write_synthetic_run(where / "old", steps=6, sites=4, schema_version=layout.SCHEMA_VERSION - 1)
        with (where / "filler").open("wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 512)
            except OSError:
                pass
            filler.truncate(filler.tell() - request.param * 1024)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Runs, a TE log and a TensorBoard folder to write from."""
    from workbench.importers.te_log import te_log_path, write_te_log

    root = tmp_path_factory.mktemp("sources")
    a = write_synthetic_run(root / "a", steps=6, sites=4, seed=1)
    b = write_synthetic_run(root / "b", steps=6, sites=4, seed=1, diverge_at=(3, 1))
    write_te_log(te_log_path(root / "te"), open_run(a).records())
    tb = root / "tb"
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tb))
    for step in range(1, 6):
        writer.add_event(Event(step=step, summary=Summary(value=[Summary.Value(tag="lm loss", simple_value=5.0)])))
    writer.close()
    study = root / "study.toml"
    study.write_text(f'name = "s"\nbase = "{TINY}"\n[[runs]]\nname = "one"\n')
    return {"a": a, "b": b, "te": root / "te", "tb": tb, "study": study}


@pytest.mark.parametrize("verb", ["report", "figure", "golden", "import-te", "import-megatron", "run", "sweep",
                                  "upgrade", "report-pdf"])
def test_a_full_disk_is_one_line_and_leaves_nothing(full: Path, sources: dict[str, Path], verb: str,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = str(sources["a"]), str(sources["b"])
    argv = {
        "report": ["report", a, b, "-o", f"{full}/reports/r.html"],
        "report-pdf": ["report", a, b, "-o", f"{full}/reports/r.pdf"],
        "figure": ["figure", "heatmap", a, b, "-o", f"{full}/figures/h.html"],
        "golden": ["golden", a, "--out", f"{full}/golden/g.json"],
        "import-te": ["import-te", str(sources["te"]), "--out", f"{full}/te-run"],
        "import-megatron": ["import-megatron", str(sources["tb"]), "--out", f"{full}/tb-run"],
        "run": ["run", str(TINY), "--out", f"{full}/runs"],
        "sweep": ["sweep", str(sources["study"]), "--out", f"{full}/study"],
        "upgrade": ["upgrade", f"{full}/old"],
    }[verb]
    if verb == "golden" and (full / "filler").stat().st_size < 1000 * 1024:
        pytest.skip("a golden file of 6 steps fits in 12 kB")
    if verb == "report-pdf":
        monkeypatch.setenv("BROWSER_PATH", "/no/such/chromium")  # no browser: a refusal, and no folder made
    before = _snapshot(full)
    assert main(argv) == 2
    line = _one_line(capsys)
    said = {"report-pdf": "Chromium", "upgrade": "free"}.get(verb, "no space left on device")
    assert said in line, line
    after = _snapshot(full)
    after.pop("old/writer.lock", None)  # a run folder keeps its lock file, holding its last writer's description
    assert after == before, "left behind"


def test_a_sweep_whose_study_names_a_path_writes_nothing(capsys: pytest.CaptureFixture[str],
                                                        neighbourhood: tuple[Path, Path]) -> None:
    work, out = neighbourhood
    for study in ('name = ".."\nbase = "{tiny}"\n[[runs]]\nname = "a"\n',
                  'name = "s"\nbase = "{tiny}"\n[[runs]]\nname = ".."\n'):
        (work / "study.toml").write_text(study.format(tiny=TINY))
        before = _snapshot(work)
        assert main(["sweep", str(work / "study.toml"), "--out", str(out)]) == 2
        assert "not allowed" in _one_line(capsys)
        assert _snapshot(work) == before


# --- homes, caches and temporary folders ----------------------------------------------------------------

def test_a_home_that_cannot_be_written_moves_the_kernel_caches_to_the_temporary_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "home").write_text("a file: nothing can be made under it, by root either\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for variable in ("XDG_CACHE_HOME", "TRITON_HOME", *disk.CACHES):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    said: list[str] = []
    moved = disk.writable_caches(say=said.append)
    assert set(moved) == set(disk.CACHES) and len(said) == 2
    assert all(Path(folder).is_dir() and Path(folder).is_relative_to(tmp_path / "tmp") for folder in moved.values())
    assert disk.writable_caches() == {}  # set now: left alone


def test_no_writable_home_and_no_temporary_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "home").write_text("a file\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for variable in ("XDG_CACHE_HOME", "TRITON_HOME", *disk.CACHES):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "home" / "tmp"))  # TMPDIR under a file: missing
    with pytest.raises(DiskFullError, match="cannot be written, and neither can .*set TORCH_EXTENSIONS_DIR"):
        disk.writable_caches()
