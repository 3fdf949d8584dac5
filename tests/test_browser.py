"""The rendered notebooks in a real headless browser with the network blocked (issue 14).

Skipped, with the reason, when no Chromium is installed (Debian: `apt-get install chromium`;
or point KEYBIAS_CHROMIUM at a binary). Screenshots go to KEYBIAS_SCREENSHOTS, else a
scratch folder printed at the end.
"""

import os
import shutil
import time
from pathlib import Path

import pytest

from keybias import browser, render

CHROMIUM = browser.find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless Chromium found (apt-get install chromium, or set KEYBIAS_CHROMIUM)"
)


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = Path(os.environ.get("KEYBIAS_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    print(f"\nscreenshots of the rendered notebooks: {folder}")


@pytest.fixture(scope="module")
def served(tmp_path_factory, smoke_results):
    """A copy of the smoke run's notebooks folder, with the shared MathJax, on a logging server."""
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(smoke_results / "notebooks", root / "notebooks")
    render.publish_assets(root)  # a no-op when the pipeline already published it
    with browser.LoggingServer(root) as server:
        yield root, server


def _html_pages(root: Path) -> list[Path]:
    return sorted((root / "notebooks").glob("*.html"))


def test_every_rendered_notebook_typesets_offline(served, shots):
    root, server = served
    pages = _html_pages(root)
    assert pages, "the smoke run rendered no notebook"
    failures, t0 = [], time.perf_counter()
    for page in pages:
        report = browser.load_page(CHROMIUM, server, f"notebooks/{page.name}", shots / f"{page.stem}.png")
        found = browser.inspect_dom(report.dom)
        has_tex = "$" in page.read_text() or "\\(" in page.read_text()
        problems = []
        if report.external_requests:
            problems.append(f"requested other hosts: {report.external_requests}")
        bad_local = browser.outside_folder(report.local_requests, "/notebooks/")
        if bad_local:
            problems.append(f"requests outside its folder or failing: {bad_local}")
        if not any(path == f"/notebooks/{render.MATHJAX_SRC}" for path, _ in report.local_requests):
            problems.append("never loaded the shared MathJax")
        if has_tex and found.math_elements == 0:
            problems.append("no typeset math (mjx-container) although the page has TeX")
        if found.math_errors:
            problems.append(f"{found.math_errors} MathJax errors")
        if found.raw_math:
            problems.append(f"raw TeX left in prose: {found.raw_math[:5]}")
        if found.images_without_alt:
            problems.append(f"{found.images_without_alt} images without alt text")
        if not (found.has_header and found.toc_entries and found.index_link):
            problems.append(f"navigation missing: {found}")
        if not (report.screenshot and report.screenshot.is_file() and report.screenshot.stat().st_size > 1000):
            problems.append("no screenshot written")
        if problems:
            failures.append(f"{page.name}: " + "; ".join(problems))
    print(f"\nbrowser check of {len(pages)} notebooks took {time.perf_counter() - t0:.1f} s")
    assert not failures, "\n".join(failures)


def test_the_check_sees_a_cdn_script_raw_tex_and_a_request_outside_the_folder(served):
    """Negative control: a page built to break every rule must fail every check."""
    root, server = served
    bad = root / "notebooks" / "zz_bad_control.html"
    bad.write_text(
        '<html><head><script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"></script>'
        '<script src="../outside.js"></script></head><body><main>'
        '<div class="jp-MarkdownCell"><div class="jp-RenderedMarkdown"><p>The shift $q_i\\cdot b_k$.</p>'
        '</div></div><img src="x.png"></main></body></html>'
    )
    try:
        report = browser.load_page(CHROMIUM, server, "notebooks/zz_bad_control.html", None, budget_ms=3000)
    finally:
        bad.unlink()
    found = browser.inspect_dom(report.dom)
    assert any("cdn.jsdelivr.net" in r for r in report.external_requests), report.external_requests
    assert any("/outside.js" in r for r in browser.outside_folder(report.local_requests, "/notebooks/"))
    assert any("/x.png" in r and "404" in r for r in browser.outside_folder(report.local_requests, "/notebooks/"))
    assert found.math_elements == 0 and found.raw_math == ["$q_i\\cdot b_k$"]
    assert found.images_without_alt == 1 and not found.has_header
