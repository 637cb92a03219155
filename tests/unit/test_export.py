"""Figure export: valid PNG/SVG/PDF/HTML files, one browser per call, and a clear error without a browser.

Static-export tests need a Chrome/Chromium and are skipped (with the reason) where there is none; all static
files are written by one module-scoped ``export_figures`` call so the file starts a browser only twice.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import plotly.graph_objects as go
import pytest

from workbench.errors import ArgumentError, ExportError, WorkbenchError
from workbench.figures import export
from workbench.figures.export import export_figures, figure_to_bytes, safe_file_name, static_export_available

WIDTH, HEIGHT, SCALE = 320, 240, 2.0

needs_browser = pytest.mark.skipif(
    static_export_available() is None,
    reason="static export needs Chrome/Chromium: `apt-get install chromium` or set BROWSER_PATH",
)


def small_figures() -> dict[str, go.Figure]:
    loss = go.Figure(go.Scatter(y=[3.0, 2.5, 2.2, 2.1], name="loss"), layout={"title": "Loss of run A"})
    heat = go.Figure(go.Heatmap(z=[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]), layout={"title": "Divergence map"})
    return {"loss (rank 0)": loss, "divergence": heat}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], list[str]]:
    if static_export_available() is None:
        pytest.skip("static export needs Chrome/Chromium: `apt-get install chromium` or set BROWSER_PATH")
    folder = tmp_path_factory.mktemp("export") / "figures"  # does not exist yet: export creates it
    lines: list[str] = []
    paths = export_figures(small_figures(), folder, scale=SCALE, width=WIDTH, height=HEIGHT, progress=lines.append)
    return folder, paths, lines


def without_browser(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No browser anywhere: BROWSER_PATH names a missing file and PATH holds no Chromium."""
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chromium"))
    monkeypatch.setenv("PATH", str(tmp_path))


@needs_browser
def test_every_figure_and_format_is_written_html_first(exported: tuple[Path, list[Path], list[str]]) -> None:
    folder, paths, lines = exported
    stems = ("loss_rank_0", "divergence")
    assert {p.name for p in paths} == {f"{s}.{fmt}" for s in stems for fmt in ("png", "svg", "pdf", "html")}
    assert [p.suffix for p in paths[:2]] == [".html", ".html"]
    assert all(p.parent == folder and p.stat().st_size > 0 for p in paths)
    assert len(lines) == 8 and lines[0].startswith("[1/8] ") and lines[-1].startswith("[8/8] ")


@needs_browser
def test_png_has_magic_bytes_and_scaled_size(exported: tuple[Path, list[Path], list[str]]) -> None:
    for path in (p for p in exported[1] if p.suffix == ".png"):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", path
        assert data[12:16] == b"IHDR", path
        width, height = struct.unpack(">II", data[16:24])  # IHDR: width, height as big-endian uint32
        assert (width, height) == (WIDTH * SCALE, HEIGHT * SCALE), path
        assert data[37:41] == b"pHYs", path  # its physical size said: the layout's inches at 96 px per inch
        per_metre, _, unit = struct.unpack(">IIB", data[41:50])
        assert unit == 1 and abs(per_metre * 0.0254 - 96 * SCALE) < 0.5, path


@needs_browser
def test_svg_parses_with_svg_root_and_size(exported: tuple[Path, list[Path], list[str]]) -> None:
    for path in (p for p in exported[1] if p.suffix == ".svg"):
        root = ET.parse(path).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
        # plotly writes the scaled size as width/height and the layout size as the viewBox.
        assert (float(root.attrib["width"]), float(root.attrib["height"])) == (WIDTH * SCALE, HEIGHT * SCALE)
        assert root.attrib["viewBox"] == f"0 0 {WIDTH} {HEIGHT}"


@needs_browser
def test_pdf_is_complete(exported: tuple[Path, list[Path], list[str]]) -> None:
    for path in (p for p in exported[1] if p.suffix == ".pdf"):
        data = path.read_bytes()
        assert data.startswith(b"%PDF-"), path
        assert data.rstrip().endswith(b"%%EOF"), path
        box = re.search(rb"/MediaBox\s*\[\s*0\s+0\s+([\d.]+)\s+([\d.]+)", data)
        assert box is not None, path  # the page is the layout's size in points (72 per 96 px), whatever the scale
        assert abs(float(box[1]) - WIDTH * 0.75) < 1 and abs(float(box[2]) - HEIGHT * 0.75) < 1, (path, box[0])


def test_html_is_self_contained_and_needs_no_browser(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    without_browser(monkeypatch, tmp_path)
    (path,) = export_figures({"loss": small_figures()["loss (rank 0)"]}, tmp_path / "html", ["html"])
    html = path.read_text(encoding="utf-8")
    # The bundle itself mentions cdn.plot.ly (its topojson default); what must not exist is a script loaded by URL.
    assert re.search(r"<script[^>]*\bsrc=", html) is None
    assert "plotly.js v" in html and len(html) > 1_000_000  # the bundle's banner; the bundle is ~4.8 MB
    assert "Loss of run A" in html


def test_static_without_browser_raises_after_writing_html(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    without_browser(monkeypatch, tmp_path)
    assert static_export_available() is None
    with pytest.raises(ExportError) as caught:
        export_figures(small_figures(), tmp_path / "out", ["html", "png", "pdf"])
    message = str(caught.value)
    assert "apt-get install chromium" in message and "BROWSER_PATH" in message
    assert "loss_rank_0.html" in message  # says which files were written
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["divergence.html", "loss_rank_0.html"]
    assert isinstance(caught.value, WorkbenchError) and isinstance(caught.value, RuntimeError)


def test_no_candidate_found_without_browser_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(export, "BROWSER_CANDIDATES", (str(tmp_path / "chromium"), "chromium", "google-chrome"))
    assert static_export_available() is None
    with pytest.raises(ExportError, match="apt-get install chromium"):
        figure_to_bytes(go.Figure(), "svg")


def test_browser_is_found_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "chromium-browser"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(export, "BROWSER_CANDIDATES", (str(tmp_path / "nothing"), "chromium", "chromium-browser"))
    assert static_export_available() == str(fake)


def live_children() -> list[str]:
    """Command names of this process's child processes that are still running (not zombies)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while we looked
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if int(rest[1]) == os.getpid() and rest[0] != "Z":  # fields after the name: state, ppid, ...
            children.append(name)
    return children


@needs_browser
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="counts child processes through /proc (Linux)")
def test_browser_is_stopped_when_a_write_fails(tmp_path: Path) -> None:
    before = live_children()

    def fail(line: str) -> None:
        raise OSError(f"disk full while writing {line}")

    with pytest.raises(OSError, match="disk full"):
        export_figures(small_figures(), tmp_path / "out", ["png", "svg"], progress=fail)
    assert not any(t.name == "workbench-figure-export" for t in threading.enumerate())
    assert live_children() == before


def test_browser_that_does_not_start_is_an_export_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(fake))
    with pytest.raises(ExportError, match="did not start"):
        export_figures(small_figures(), tmp_path / "out", ["png"])


@pytest.mark.parametrize("formats", [["png", "gif"], [], ["jpeg"]])
def test_unknown_or_no_format_is_a_config_error_naming_the_allowed(formats: list[str], tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="png, svg, pdf, html"):
        export_figures(small_figures(), tmp_path / "out", formats)
    assert not (tmp_path / "out").exists()  # validated before anything is written


def test_bad_arguments_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="both be written as 'a_b'"):
        export_figures({"a/b": go.Figure(), "a b": go.Figure()}, tmp_path, ["html"])
    with pytest.raises(ArgumentError, match="not a plotly"):
        export_figures({"a": {"data": []}}, tmp_path, ["html"])  # type: ignore[dict-item]
    with pytest.raises(ArgumentError, match="scale"):
        export_figures({"a": go.Figure()}, tmp_path, ["html"], scale=0)
    with pytest.raises(ArgumentError, match="mathjax"):
        export_figures({"a": go.Figure()}, tmp_path, ["png"], mathjax=tmp_path / "missing.js")


def test_formats_accept_one_string_dots_and_case() -> None:
    assert export.parse_formats("PNG") == ["png"]
    assert export.parse_formats([".svg", "html", "svg"]) == ["svg", "html"]


@pytest.mark.parametrize(("name", "stem"), [
    ("loss (rank 0)", "loss_rank_0"), ("../../etc/passwd", "etc_passwd"), ("layer.3/attn", "layer.3_attn"),
    ("ünï", "n"), ("", "figure"), ("...", "figure"),
])
def test_safe_file_name(name: str, stem: str) -> None:
    assert safe_file_name(name) == stem


@needs_browser
def test_figure_to_bytes_uses_the_figure_layout_size() -> None:
    fig = go.Figure(go.Bar(y=[1, 2]), layout={"width": 200, "height": 100})
    png = figure_to_bytes(fig, "png", scale=1.0)
    assert struct.unpack(">II", png[16:24]) == (200, 100)
    assert figure_to_bytes(fig, "html").lower().startswith(b"<!doctype html>")


def test_a_kaleido_page_that_was_not_ready_is_rendered_again_on_a_fresh_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded machine kaleido may call its render function before its page defined it; the export starts
    a fresh page for that figure (twice at most) instead of failing the whole export."""
    import types

    class JavascriptError(Exception):
        pass

    opened: list[int] = []
    failures = iter([True, False, False])  # the first page is not ready, the second one is

    class FakeKaleido:
        def __init__(self, **_: object) -> None:
            opened.append(1)

        async def __aenter__(self) -> FakeKaleido:
            return self

        async def __aexit__(self, *_: object) -> None:
            return None

        async def calc_fig(self, figure: dict, opts: dict) -> bytes:  # type: ignore[type-arg]
            if next(failures):
                raise JavascriptError("{'description': 'ReferenceError: kaleido_scopes is not defined'}")
            return str(figure["name"]).encode()

    monkeypatch.setitem(sys.modules, "kaleido", types.SimpleNamespace(Kaleido=FakeKaleido))
    jobs = [export._Job(name=n, fmt="svg", path=None, figure={"name": n}, opts={}) for n in ("a", "b")]
    rendered = list(export._render(jobs, "chromium", None))
    assert [(job.name, data) for job, data in rendered] == [("a", b"a"), ("b", b"b")] and len(opened) == 2
