"""Bad arguments to the CLI, driven in-process: one line, exit 2, refused before any work, nothing created;
and names from run stores printed with their control characters escaped."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from workbench.cli import ProgressPrinter, build_parser, main, terminal_safe
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import update_manifest

TINY = Path(__file__).parents[2] / "workbench" / "examples" / "tiny.toml"
EVIL = "evil\x1b[31m\nred"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    a = write_synthetic_run(root / "a", steps=8, sites=12, seed=1)
    b = write_synthetic_run(root / "b", steps=8, sites=12, seed=1, diverge_at=(3, 5))
    return a, b


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("workbench: error:") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "usage:" not in err, err
    return err


@pytest.mark.parametrize("argv", [
    ["no-such-verb"],
    [],
    ["golden", "RUN"],  # --out is required
    ["figure", "bogus", "RUN", "-o", "f.html"],
    ["ls", "DIR", "--no-such-option"],
    ["check", "RUN", "--golden", "REF", "--steps", "three"],
])
def test_argparse_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(argv) == 2
    _one_line_error(capsys)


def test_help_still_prints_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: workbench run")


@pytest.mark.parametrize("argv, option, allowed", [
    (["run", str(TINY), "--stop-after", "-3"], "--stop-after", ">= 1"),
    (["run", str(TINY), "--stop-after", "0"], "--stop-after", ">= 1"),
    (["check", "{a}", "--golden", "{a}", "--steps", "0"], "--steps", ">= 1"),
    (["check", "{a}", "--golden", "{a}", "--rtol", "-1"], "--rtol", ">= 0"),
    (["check", "{a}", "--golden", "{a}", "--rtol", "nan"], "--rtol", ">= 0"),
    (["check", "{a}", "--golden", "{a}", "--rtol", "inf"], "--rtol", ">= 0"),
    (["golden", "{a}", "--out", "{out}/g.json", "--steps", "0"], "--steps", ">= 1"),
    (["golden", "{a}", "--out", "{out}/g.json", "--megatron", "--interval", "0"], "--interval", ">= 1"),
    (["anomalies", "{a}", "--window", "1"], "--window", ">= 2"),
    (["anomalies", "{a}", "--spike-factor", "0"], "--spike-factor", "> 0"),
    (["anomalies", "{a}", "--spike-factor", "inf"], "--spike-factor", "> 0"),
    (["anomalies", "{a}", "--follow", "--interval", "-1"], "--interval", "> 0"),
    (["replay", "{a}", "--step", "-1", "--out", "{out}"], "--step", ">= 0"),
    (["bisect", "{a}", "{a}", "--step", "-1", "--out", "{out}"], "--step", ">= 0"),
    (["resume-check", "{a}", "{a}", "--from-step", "-2"], "--from-step", ">= 0"),
    (["import-megatron", "{a}", "--out", "{out}", "--tokens-per-step", "0"], "--tokens-per-step", ">= 1"),
    (["import-megatron-dumps", "{a}", "--out", "{out}", "--ep", "0"], "--ep", ">= 1"),
])
def test_numbers_out_of_range_are_refused_before_any_work(runs, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          capsys: pytest.CaptureFixture[str], argv: list[str],
                                                          option: str, allowed: str) -> None:
    out = tmp_path / "out"
    args = [x.format(a=runs[0], out=out) for x in argv]
    if args[0] == "run":
        args += ["--out", str(out)]
    assert main(args) == 2
    err = _one_line_error(capsys)
    assert f"argument {option}:" in err and allowed in err, err
    assert not out.exists()


def test_numbers_at_their_bounds_are_accepted() -> None:
    parser = build_parser()
    assert parser.parse_args(["replay", "R", "--step", "0"]).step == 0
    assert parser.parse_args(["bisect", "A", "B", "--step", "0"]).step == 0
    assert parser.parse_args(["resume-check", "A", "B", "--from-step", "0"]).from_step == 0
    assert parser.parse_args(["anomalies", "R", "--window", "2"]).window == 2
    assert parser.parse_args(["check", "R", "--golden", "G", "--rtol", "0"]).rtol == 0.0
    assert parser.parse_args(["run", "C", "--stop-after", "1"]).stop_after == 1


@pytest.mark.parametrize("argv", [
    ["run", str(TINY), "--out", "{bad}"],
    ["sweep", "study.toml", "--out", "{bad}"],
    ["demo", "--out", "{bad}"],
    ["report", "{a}", "-o", "{bad}/report.html"],
    ["figure", "pairs", "{a}", "-o", "{bad}/pairs.html"],
    ["figure", "pairs", "{a}", "-o", "{tmp}/pairs.html", "--data", "{bad}/pairs.csv"],
    ["import-te", "{tmp}/log.txt", "--out", "{bad}"],
    ["import-megatron", "{tmp}/tb", "--out", "{bad}"],
    ["import-megatron-dumps", "{tmp}/save", "--out", "{bad}"],
    ["replay", "{a}", "--step", "1", "--out", "{bad}"],
    ["bisect", "{a}", "{a}", "--out", "{bad}"],
    ["golden", "{a}", "--out", "{bad}/g.json"],
])
def test_an_output_under_a_file_is_refused(runs, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
                                           argv: list[str]) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, where a folder would have to be")
    bad = blocker / "sub"
    assert main([x.format(a=runs[0], bad=bad, tmp=tmp_path) for x in argv]) == 2
    err = _one_line_error(capsys)
    assert str(bad) in err and f"lies under {blocker}, which is a file" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]  # nothing created, not even pairs.html


def test_an_output_folder_where_a_file_is_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "taken"
    taken.write_text("a file")
    assert main(["import-te", str(tmp_path / "log.txt"), "--out", str(taken)]) == 2
    assert f"{taken} is a file, not a folder" in _one_line_error(capsys)
    assert taken.read_text() == "a file"


def test_golden_out_naming_a_folder_is_refused_and_leaves_nothing(runs, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "golden"
    folder.mkdir()
    assert main(["golden", str(runs[0]), "--out", str(folder)]) == 2
    assert f"{folder} is a folder, not a file" in _one_line_error(capsys)
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["golden"]


def test_an_unwritable_folder_is_refused(runs, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a user without write permission (root has it)
    assert main(["golden", str(runs[0]), "--out", str(tmp_path / "new" / "g.json")]) == 2
    assert f"{tmp_path} is not writable" in _one_line_error(capsys)
    assert not (tmp_path / "new").exists()


def test_demo_refuses_a_file_where_its_moe_study_goes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "demo-moe").write_text("a file")
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 2
    assert "MoE study" in _one_line_error(capsys)
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("argv, allowed", [
    (["figure", "heatmap", "{a}", "{b}", "-o", "{out}", "--stat", "no_such_stat"], "absmax"),
    (["figure", "sources", "{a}", "-o", "{out}", "--stat", "L2"], "underflow"),
    (["figure", "trajectories", "{a}", "{b}", "-o", "{out}", "--quantity", "no_such_scalar"], "grad_norm"),
])
def test_figure_refuses_an_unknown_statistic_or_scalar(runs, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                       capsys: pytest.CaptureFixture[str], argv: list[str],
                                                       allowed: str) -> None:
    out = tmp_path / "figure.html"
    assert main([x.format(a=runs[0], b=runs[1], out=out) for x in argv]) == 2
    err = _one_line_error(capsys)
    assert "no such" in err and allowed in err and argv[-1] in err, err
    assert not out.exists()


def test_terminal_safe_escapes_control_characters() -> None:
    assert terminal_safe("a\x1b[31mb\nc\rd\te\x00f\x7fg\x85h\x9fi") == \
        "a\\x1b[31mb\\nc\\rd\\te\\x00f\\x7fg\\x85h\\x9fi"
    assert terminal_safe("décodeur.layers.0 → fine ü") == "décodeur.layers.0 → fine ü"  # printable text is kept


def test_ls_and_compare_escape_run_names(runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    evil = write_synthetic_run(tmp_path / "evil", steps=8, sites=12, seed=1, diverge_at=(3, 5))
    update_manifest(evil, name=EVIL)
    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "evil\\x1b[31m\\nred" in out, out
    assert main(["compare", str(runs[0]), str(evil)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\nred" not in out and "a vs evil\\x1b[31m\\nred" in out, out


def test_check_and_anomalies_escape_run_and_site_names(runs, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    evil = write_synthetic_run(tmp_path / "evil", steps=8, sites=12, seed=1, diverge_at=(3, 5))
    update_manifest(evil, name=EVIL)
    assert main(["check", str(evil), "--golden", str(runs[0])]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "\x1b" not in out and "evil\\x1b[31m\\nred" in out, out
    starts = ("golden check", "  ", "identical", "the runs", "environments")
    assert all(line.startswith(starts) for line in out.splitlines()), out  # no name started a line
    main(["anomalies", str(evil)])
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.startswith("evil\\x1b[31m\\nred: "), out


def test_progress_lines_escape_the_message_but_keep_their_own_control() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, log = Terminal(), io.StringIO()
    ProgressPrinter(tty)(f"{EVIL}: step=1", final=True)
    ProgressPrinter(log)(f"{EVIL}: step=1", final=True)
    assert tty.getvalue() == "\r\x1b[Kevil\\x1b[31m\\nred: step=1\n"  # one ESC: the printer's own \033[K
    assert log.getvalue() == "evil\\x1b[31m\\nred: step=1\n"


def test_the_error_line_escapes_control_characters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / EVIL
    assert main(["compare", str(missing), str(missing)]) == 2
    err = _one_line_error(capsys)
    assert "\x1b" not in err and "evil\\x1b[31m\\nred" in err, err
    assert main(["anomalies", "RUN", "--window", "\x1b[2J"]) == 2
    err = _one_line_error(capsys)
    assert "\x1b" not in err and "\\x1b[2J" in err, err


@pytest.mark.parametrize("name, extra", [("r.docx", []), ("r.html", ["--format", "pdf"])])
def test_a_report_is_written_only_as_what_its_name_says(runs, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                       capsys: pytest.CaptureFixture[str], name: str,
                                                       extra: list[str]) -> None:
    assert main(["report", str(runs[0]), "-o", str(tmp_path / name), *extra]) == 2
    assert "report" in _one_line_error(capsys) and not (tmp_path / name).exists()


def test_a_run_that_has_not_recorded_yet_is_not_bad_input(runs, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import socket
    import subprocess
    import sys

    from workbench.errors import NOT_YET
    from workbench.store.writer import create_store

    starting = tmp_path / "starting"  # created by a launcher that is alive (this process), no step written
    create_store(starting, {"run_id": "s", "name": "starting", "producer": "test",
                            "launcher": {"host": socket.gethostname(), "pid": os.getpid()}}, 40)
    assert main(["compare", str(starting), str(runs[0])]) == NOT_YET
    err = capsys.readouterr().err
    assert err.startswith("workbench: not yet: ") and "has not written its first recorded step yet (0/40" in err
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stopped = tmp_path / "stopped"  # its launcher is gone: interrupted before recording, which is bad input
    create_store(stopped, {"run_id": "t", "name": "stopped", "producer": "test",
                           "launcher": {"host": socket.gethostname(), "pid": int(gone.stdout)}}, 40)
    assert main(["compare", str(stopped), str(runs[0])]) == 2
    assert "has no per-site records" in _one_line_error(capsys)
