"""The documentation site as a reader meets it: built with ``mkdocs build --strict`` (as ``make docs`` builds it)
and served over HTTP.

Every page of its navigation has its title and links only to pages, anchors and images the site has (read from
the built files). The pages that draw images, the front page and the reference pages are opened in Chromium: each
loads without a script error and without a request outside the site (the docs read offline), shows the site's
navigation and draws every image it holds. The Python API page must show ``record``'s keywords and the
CLI reference every verb. A screenshot of the front page and the API page is kept under ``build/docs-screenshots``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("BROWSER_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium, or BROWSER_PATH)")
SCREENSHOTS = ROOT / "build" / "docs-screenshots"


def _nav_pages(nav: list[Any]) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f",
                            str(ROOT / "mkdocs.yml"), "-d", str(out)], cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", out
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


def _url_of(page: str) -> str:
    return "" if page == "index.md" else page.removesuffix(".md") + "/"


def _target_exists(out: Path, base: str, href: str, page_url: str) -> str | None:
    """None if the link's page (and anchor, when it names one) is in the built site, else what is missing."""
    parts = urlsplit(href)
    if not parts.path.startswith("/") and not parts.scheme:  # relative to the page it is on
        parts = urlsplit(page_url.rsplit("/", 1)[0] + "/" + href)
    if not (parts.scheme + "://" + parts.netloc + "/").startswith(base):
        return None  # another site
    path = out / unquote(parts.path).lstrip("/")
    path = path / "index.html" if path.is_dir() or not path.suffix else path
    path = Path(os.path.normpath(path))
    if not path.is_file():
        return f"{href}: no {path.relative_to(out) if path.is_relative_to(out) else path}"
    if parts.fragment and path.suffix == ".html":
        html = path.read_text(encoding="utf-8")
        if f'id="{unquote(parts.fragment)}"' not in html:
            return f"{href}: {path.relative_to(out)} has no anchor #{parts.fragment}"
    return None


def _pages() -> list[str]:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return _nav_pages(nav)


class _Page(HTMLParser):
    """What a built page holds: its article's first heading, its links and its images."""

    def __init__(self) -> None:
        super().__init__()
        self.title, self.links, self.images, self._in_h1 = "", [], [], False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "h1" and not self.title:
            self._in_h1 = True
        elif tag == "a" and values.get("href"):
            self.links.append(str(values["href"]))
        elif tag == "img" and values.get("src"):
            self.images.append(str(values["src"]))

    def handle_endtag(self, tag: str) -> None:
        self._in_h1 = self._in_h1 and tag != "h1"

    def handle_data(self, data: str) -> None:
        if self._in_h1:
            self.title += data


def test_every_page_of_the_site_has_its_title_its_images_and_only_links_it_can_follow(
        site: tuple[str, Path]) -> None:
    # every page of the navigation, read from the built files: what the browser test below renders only for the
    # pages that draw something (images) and the reference pages
    base, out = site
    pages = _pages()
    assert len(pages) >= 30, pages
    faults = []
    for page in pages:
        built = out / _url_of(page) / "index.html"
        parsed = _Page()
        parsed.feed(built.read_text(encoding="utf-8"))
        if not parsed.title.strip():
            faults.append(f"{page}: no title")
        for href in [*parsed.links, *parsed.images]:
            missing = _target_exists(out, base, urljoin(base + _url_of(page), href), base + _url_of(page))
            if missing:
                faults.append(f"{page}: {missing}")
    assert not faults, "\n".join(faults)


def test_the_pages_that_draw_render_whole_in_chromium(site: tuple[str, Path], browser: Any) -> None:
    base, out = site
    drawn = [page for page in _pages() if "<img" in (out / _url_of(page) / "index.html").read_text(encoding="utf-8")]
    pages = ["index.md", "api.md", "cli-reference.md", *drawn]
    assert len(drawn) >= 3, drawn
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    view = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    view.on("pageerror", lambda error: errors.append(str(error)))
    outside: list[str] = []
    view.on("request", lambda request: None if request.url.startswith((base, "data:", "blob:"))
            else outside.append(request.url))
    faults: list[str] = []
    for page in pages:
        response = view.goto(base + _url_of(page), wait_until="load")
        if response is None or response.status != 200:
            faults.append(f"{page}: HTTP {None if response is None else response.status}")
            continue
        if not view.locator("article h1").first.inner_text().strip():
            faults.append(f"{page}: no title")
        if view.locator("nav.md-nav--primary").count() == 0:
            faults.append(f"{page}: no navigation")
        broken = view.evaluate("Array.from(document.querySelectorAll('article img'))"
                               ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'))")
        faults += [f"{page}: image {src} not drawn" for src in broken]
        if page in ("index.md", "api.md"):
            view.screenshot(path=str(SCREENSHOTS / page.replace(".md", ".png")), full_page=False)
    assert not errors, errors
    assert not outside, f"requests outside the site: {sorted(set(outside))[:5]}"
    assert not faults, "\n".join(faults)


def test_the_api_page_shows_records_keywords_and_the_reference_every_verb(site: tuple[str, Path],
                                                                           browser: Any) -> None:
    from workbench.cli import build_parser

    base, _ = site
    view = browser.new_page(viewport={"width": 1280, "height": 900})
    view.goto(base + "api/", wait_until="load")
    record = view.locator("[id='workbench.recorder.record']").locator("xpath=..").inner_text()
    for keyword in ("steps", "global_batch_size", "seed", "against", "flush_every"):
        assert keyword in record, f"record's {keyword} is not on the API page"
    view.goto(base + "cli-reference/", wait_until="load")
    headings = view.locator("article h2").all_inner_texts()
    verbs = next(a for a in build_parser()._actions if a.choices)  # noqa: SLF001
    for verb in verbs.choices:
        if verb != "study":  # summary's former name, an alias
            assert any(h.strip().removesuffix("¶").strip() == f"workbench {verb}" for h in headings), verb
