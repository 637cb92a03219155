"""Writing plotly figures to files: PNG, SVG and PDF through one headless Chromium, HTML with none.

    paths = export_figures({"divergence": fig, "amplification": fig2}, "out/figures",
                           formats=("png", "pdf", "html"), progress=print)
    pdf = figure_to_bytes(fig, "pdf")
    if static_export_available() is None: ...   # no browser: only "html" will work

HTML is written by plotly itself, self-contained (plotly.js inline, no CDN: the machines are offline), and
needs no browser. Static formats are rendered by kaleido >= 1, which drives a Chrome or Chromium. Starting
one costs ~2 s and each image ~0.1-0.3 s after that, so every static file of one call is rendered in ONE
browser, opened in a private thread with its own event loop (this works inside Jupyter, whose loop is already
running) and closed when the call ends, also when a render or a file write fails or the caller interrupts.

The browser is ``BROWSER_PATH`` if set, else ``/usr/bin/chromium`` or the first of ``chromium``,
``chromium-browser``, ``google-chrome`` on PATH. Without one, HTML files are still written and then an
``ExportError`` says what to install. MathJax is off unless a local copy is passed: kaleido would otherwise
fetch it from a CDN, which offline at best fails and at worst waits; LaTeX labels then show as raw text.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import shutil
import struct
import threading
import zlib
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from workbench import disk
from workbench.errors import ArgumentError, ExportError
from workbench.figures.style import PX_PER_IN

FORMATS: tuple[str, ...] = ("png", "svg", "pdf", "html")
"""Formats ``export_figures`` writes; all but "html" need a browser."""
STATIC_FORMATS = frozenset({"png", "svg", "pdf"})
BROWSER_CANDIDATES: tuple[str, ...] = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
"""Looked for in this order when ``BROWSER_PATH`` is unset; bare names are searched on PATH."""
RENDER_TIMEOUT_S = 90.0
"""Longest one image may take before kaleido gives up on it."""
PAGE_NOT_READY_RETRIES = 2
"""Times an export starts a fresh browser page when kaleido's own page was not ready for a render."""
_INSTALL_HINT = (
    "Install Chromium (`apt-get install chromium` on Debian/Ubuntu) or set BROWSER_PATH to a Chrome/Chromium "
    "binary. HTML export works without a browser."
)


def static_export_available() -> str | None:
    """The browser static export would use, or None when there is none (then only "html" can be exported)."""
    explicit = os.environ.get("BROWSER_PATH")
    if explicit:
        # An explicit choice wins even when it is wrong: falling back would hide a typo in the variable.
        return explicit if _is_executable(explicit) else None
    for candidate in BROWSER_CANDIDATES:
        found = candidate if os.sep in candidate else shutil.which(candidate)
        if found and _is_executable(found):
            return found
    return None


def safe_file_name(name: str) -> str:
    """``name`` as a file name stem: letters, digits, ``.``, ``-`` and ``_`` only, at most 100 characters."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:100]
    return stem or "figure"


def export_figures(
    figures: Mapping[str, go.Figure],
    folder: str | Path,
    formats: Iterable[str] = FORMATS,
    *,
    scale: float = 2.0,
    width: int | None = None,
    height: int | None = None,
    progress: Callable[[str], None] | None = None,
    mathjax: str | Path | None = None,
) -> list[Path]:
    """Write ``folder/<name>.<fmt>`` for every figure and format; return the paths, HTML first.

    ``width``/``height`` are layout pixels (default: the figure's own layout size, else 700x500); PNGs are
    ``scale`` times larger in physical pixels. ``progress`` gets one line per file written, e.g.
    ``"[3/8] out/loss.png"``. ``mathjax`` is the path of a local MathJax 3 ``tex-svg.js`` for LaTeX labels.
    Raises ``ArgumentError`` for bad arguments and ``ExportError`` when static formats were requested but no
    browser is found or it fails; HTML files requested in the same call are written before that.
    """
    wanted = parse_formats(formats)
    _check_size(scale, width, height)
    stems = _file_stems(figures)
    mathjax_path = _parse_mathjax(mathjax)
    out = Path(folder)  # made by the first file written (``disk.written``): a failure before it makes none
    total = len(figures) * len(wanted)
    written: list[Path] = []

    def record(path: Path) -> None:
        written.append(path)
        if progress is not None:
            progress(f"[{len(written)}/{total}] {path}")

    if "html" in wanted:
        for name, fig in figures.items():
            path = out / f"{stems[name]}.html"
            html = fig.to_html(include_plotlyjs=True, full_html=True, include_mathjax=False,
                               default_width=width or "100%", default_height=height or "100%").encode("utf-8")
            with disk.written(path, needed=len(html)) as partial:
                partial.write_bytes(html)
            record(path)

    static = [fmt for fmt in wanted if fmt in STATIC_FORMATS]
    if not static:
        return written
    browser = static_export_available()
    if browser is None:
        raise ExportError(_no_browser_message(static, written))
    as_dicts = {name: fig.to_dict() for name, fig in figures.items()}  # once per figure, not per format
    jobs = [
        _Job(name, fmt, out / f"{stems[name]}.{fmt}", as_dicts[name], _layout_opts(fmt, scale, width, height))
        for name in figures
        for fmt in static
    ]
    # closing(): a failed write or progress call must stop the browser now, not when the generator is collected.
    with closing(_render(jobs, browser, mathjax_path)) as images:
        for job, data in images:
            assert job.path is not None  # every job built above has a path
            if job.fmt == "png":
                data = png_with_dpi(data, PX_PER_IN * job.opts["scale"])
            with disk.written(job.path, needed=len(data)) as partial:
                partial.write_bytes(data)
            record(job.path)
    return written


def figure_to_bytes(fig: go.Figure, fmt: str, *, scale: float = 2.0, width: int | None = None,
                    height: int | None = None, mathjax: str | Path | None = None) -> bytes:
    """One figure as PNG, SVG or PDF bytes (starts a browser: ~2 s), or as self-contained HTML (UTF-8)."""
    (fmt,) = parse_formats([fmt])
    _check_size(scale, width, height)
    if fmt == "html":
        html = fig.to_html(include_plotlyjs=True, full_html=True, include_mathjax=False,
                           default_width=width or "100%", default_height=height or "100%")
        return html.encode("utf-8")
    browser = static_export_available()
    if browser is None:
        raise ExportError(_no_browser_message([fmt], []))
    job = _Job("figure", fmt, None, fig.to_dict(), _layout_opts(fmt, scale, width, height))
    ((_, data),) = list(_render([job], browser, _parse_mathjax(mathjax)))
    return data


def parse_formats(formats: Iterable[str]) -> list[str]:
    """Formats lower-cased, without a leading dot or duplicates, in the order given; unknown ones rejected."""
    if isinstance(formats, str):  # "png" alone would otherwise iterate as "p", "n", "g"
        formats = (formats,)
    parsed: list[str] = []
    for fmt in formats:
        clean = str(fmt).lower().lstrip(".")
        if clean not in FORMATS:
            raise ArgumentError(f"Unknown export format {fmt!r}: use one or more of {', '.join(FORMATS)}.")
        if clean not in parsed:
            parsed.append(clean)
    if not parsed:
        raise ArgumentError(f"No export format given: pass one or more of {', '.join(FORMATS)}.")
    return parsed


@dataclass(frozen=True)
class _Job:
    name: str
    fmt: str
    path: Path | None
    """Where the bytes go; None when the caller keeps them in memory."""
    figure: dict[str, Any]
    opts: dict[str, Any]
    """kaleido's layout options: format, width, height, scale."""


@dataclass(frozen=True)
class _Failed:
    error: BaseException
    job: _Job | None
    """The figure being rendered, or None when the browser itself did not start."""


_DONE = object()


def _render(jobs: Sequence[_Job], browser: str, mathjax: Path | None) -> Generator[tuple[_Job, bytes], None, None]:
    """Render ``jobs`` in order in one browser, yielding each image as soon as it is ready.

    File writes and progress calls stay in the caller's thread; the browser lives in a worker thread. Closing
    the generator early (an error or Ctrl-C in the caller) stops the worker after its current image, and the
    worker's ``async with`` closes the browser on every way out.
    """
    results: queue.Queue[object] = queue.Queue()
    stop = threading.Event()
    worker = threading.Thread(target=_render_worker, args=(jobs, browser, mathjax, results, stop),
                              name="workbench-figure-export", daemon=True)
    worker.start()
    try:
        while True:
            item = results.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise _export_error(item, browser) from item.error
            assert isinstance(item, tuple)
            yield item
    finally:
        stop.set()
        worker.join()


def _render_worker(jobs: Sequence[_Job], browser: str, mathjax: Path | None, results: queue.Queue[object],
                   stop: threading.Event) -> None:
    try:
        asyncio.run(_render_all(jobs, browser, mathjax, results, stop))
    except BaseException as error:  # anything, so the consumer never waits forever
        results.put(_Failed(error, None))
    else:
        results.put(_DONE)


async def _render_all(jobs: Sequence[_Job], browser: str, mathjax: Path | None, results: queue.Queue[object],
                      stop: threading.Event) -> None:
    import kaleido  # imported here: a missing kaleido should only fail static export, not HTML or the import

    pending, retries = list(jobs), PAGE_NOT_READY_RETRIES
    while pending:
        # kaleido's mathjax=False leaves MathJax out of its page; None would mean "fetch it from a CDN".
        async with kaleido.Kaleido(n=1, timeout=RENDER_TIMEOUT_S, path=browser,
                                   mathjax=mathjax if mathjax else False) as k:
            while pending:
                job = pending[0]
                if stop.is_set():
                    return
                try:
                    data = await k.calc_fig(job.figure, opts=job.opts)
                except Exception as error:
                    if retries > 0 and _page_not_ready(error):
                        retries -= 1
                        break  # a fresh browser page for this job and the rest
                    results.put(_Failed(error, job))
                    return
                pending.pop(0)
                results.put((job, data))


def _page_not_ready(error: BaseException) -> bool:
    """kaleido ran its render call before its page's script had defined it (seen on a loaded machine)."""
    return type(error).__name__ == "JavascriptError" and "kaleido_scopes is not defined" in str(error)


def _export_error(failed: _Failed, browser: str) -> ExportError:
    error = failed.error
    if isinstance(error, ModuleNotFoundError) and error.name == "kaleido":
        return ExportError("PNG, SVG and PDF export needs the kaleido package (>= 1): `pip install 'kaleido>=1'`. "
                           "HTML export works without it.")
    kind = type(error).__name__
    if kind == "ChromeNotFoundError" or (isinstance(error, RuntimeError) and "plotly_get_chrome" in str(error)):
        return ExportError(f"kaleido found no browser at {browser}. {_INSTALL_HINT}")
    if failed.job is None:
        return ExportError(f"The browser at {browser} did not start for static export ({kind}: {_first_arg(error)}). "
                           f"Check that `{browser} --headless --version` runs, or point BROWSER_PATH at a working "
                           "Chrome/Chromium. HTML export works without a browser.")
    job = failed.job
    target = job.path if job.path is not None else f"{job.fmt} bytes"
    if isinstance(error, TimeoutError):
        return ExportError(f"Rendering figure {job.name!r} to {target} took longer than {RENDER_TIMEOUT_S:.0f} s. "
                           "Reduce the figure's size (fewer points, a binned heatmap) and export again.")
    return ExportError(f"Rendering figure {job.name!r} to {target} failed in the browser "
                       f"({kind}: {_first_arg(error)}). "
                       "Check that the figure displays in a notebook; an invalid trace property is the usual cause.")


def _no_browser_message(static: Sequence[str], written: Sequence[Path]) -> str:
    explicit = os.environ.get("BROWSER_PATH")
    if explicit:
        where = f"BROWSER_PATH={explicit!r} is not an executable file"
    else:
        where = "no Chrome or Chromium was found (looked for " + ", ".join(BROWSER_CANDIDATES) + ")"
    done = f" Already written: {', '.join(str(p) for p in written)}." if written else ""
    return f"{', '.join(fmt.upper() for fmt in static)} export needs a browser, but {where}. {_INSTALL_HINT}{done}"


def _layout_opts(fmt: str, scale: float, width: int | None, height: int | None) -> dict[str, Any]:
    # kaleido fills a None width/height as plotly's to_image does: the figure's layout, its template, 700x500.
    # A PDF is drawn in points: its page is the layout at 96 px per inch, and a scale would only enlarge the page
    # (a paper column's figure, 3.5 in, came out 7 in wide).
    return {"format": fmt, "width": width, "height": height, "scale": 1.0 if fmt == "pdf" else scale}


def png_with_dpi(data: bytes, dpi: float) -> bytes:
    """PNG ``data`` with its physical resolution said (a ``pHYs`` chunk after ``IHDR``): a figure exported at
    ``scale`` holds 96 x ``scale`` pixels per inch, so a paper's tools place it at its layout's size in inches.
    ``data`` that already says one is returned as it is."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or b"pHYs" in data[:64]:
        return data
    per_metre = round(dpi / 0.0254)
    body = b"pHYs" + struct.pack(">IIB", per_metre, per_metre, 1)  # unit 1: the metre
    chunk = struct.pack(">I", 9) + body + struct.pack(">I", zlib.crc32(body))
    end_of_header = 8 + 8 + 13 + 4  # the signature, IHDR's length and type, its 13 bytes, its CRC
    return data[:end_of_header] + chunk + data[end_of_header:]


def _file_stems(figures: Mapping[str, go.Figure]) -> dict[str, str]:
    stems: dict[str, str] = {}
    owner: dict[str, str] = {}
    for name, fig in figures.items():
        if not isinstance(fig, go.Figure):
            raise ArgumentError(f"Figure {name!r} is a {type(fig).__name__}, not a plotly.graph_objects.Figure: "
                              "pass the figure itself (go.Figure(fig_dict) converts a dict).")
        stem = safe_file_name(str(name))
        if stem in owner:
            raise ArgumentError(f"Figures {owner[stem]!r} and {name!r} would both be written as {stem!r}: "
                              "rename one of them.")
        owner[stem] = str(name)
        stems[name] = stem
    return stems


def _check_size(scale: float, width: int | None, height: int | None) -> None:
    if not scale > 0:
        raise ArgumentError(f"scale must be a positive number, got {scale!r}.")
    for field, value in (("width", width), ("height", height)):
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ArgumentError(f"{field} must be a positive number of layout pixels or None, got {value!r}.")


def _parse_mathjax(mathjax: str | Path | None) -> Path | None:
    if mathjax is None:
        return None
    path = Path(mathjax)
    if not path.is_file():
        raise ArgumentError(f"mathjax={str(mathjax)!r} is not a file: pass the path of a local MathJax 3 "
                          "tex-svg.js (npm package mathjax@3, es5/tex-svg.js) or None to leave LaTeX as text.")
    return path.resolve()


def _first_arg(error: BaseException) -> str:
    # choreographer packs several sentences into args; the first says what happened.
    return str(error.args[0]) if error.args else type(error).__name__


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)
