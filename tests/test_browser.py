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

from keybias.build import browser, render

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


def test_every_rendered_notebook_reads_offline(tmp_path, smoke_results, shots):
    """Typeset math, no raw TeX, nothing fetched outside the folder, alt text, navigation."""
    shutil.copytree(smoke_results / "notebooks", tmp_path / "notebooks")
    render.publish_assets(tmp_path)  # a no-op where the pipeline already published it
    t0 = time.perf_counter()
    results = browser.check_folder(tmp_path / "notebooks", shots, CHROMIUM)
    print(f"\nbrowser check of {len(results)} notebooks took {time.perf_counter() - t0:.1f} s")
    assert results, "the smoke run rendered no notebook"
    failures = [f"{name}: {'; '.join(problems)}" for name, problems in results.items() if problems]
    assert not failures, "\n".join(failures)


def test_the_check_fails_a_page_that_breaks_every_rule(tmp_path):
    """Negative control: a CDN script, a file outside the folder, raw TeX, no alt, no header."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (tmp_path / "outside.js").write_text("")
    (folder / "bad.html").write_text(
        '<html><head><script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"></script>'
        '<script src="../outside.js"></script></head><body><main>'
        '<div class="jp-MarkdownCell"><div class="jp-RenderedMarkdown"><p>The shift $q_i\\cdot b_k$.</p>'
        '</div></div><img src="x.png"></main></body></html>'
    )
    problems = " | ".join(browser.check_folder(folder, None, CHROMIUM, budget_ms=3000)["bad.html"])
    for expected in ("requested other hosts: ['https://cdn.jsdelivr.net", "/outside.js (outside /notebooks/)",
                     "/notebooks/x.png (HTTP 404)", "never loaded the shared local MathJax",
                     "no typeset math", "raw TeX left in prose: ['$q_i\\\\cdot b_k$']",
                     "1 images without alt text", "no navigation header", "no table of contents"):
        assert expected in problems, (expected, problems)
