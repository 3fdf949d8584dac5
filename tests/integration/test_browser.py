"""The rendered results in a real headless browser with the network blocked, as a reader sees them.

Every notebook page: typeset math, nothing fetched outside its folder, alt text, navigation,
no visible code cell that only records, no raw scalar output ('1.00', 2900), no cell cut with
"..." or "…", every figure captioned. The entry page: loads nothing from elsewhere, and every
link into a notebook (claims, figures) lands on an existing anchor. Every page of the site at
1280 and 390 px (inside an iframe of that width: headless windows are at least 500 px wide): no
sideways scroll, no cell cut off, no "#" in place of a number, no config repr, no "uncommitted";
and every local link of every page resolves. Screenshots of the entry
page and of every notebook at 1280 px go to KEYBIAS_SCREENSHOTS, else results/.build/screenshots/.
Skipped, with the reason, when no Chromium is installed (Debian: `apt-get install chromium`,
or `make browser`; or point KEYBIAS_CHROMIUM at a binary).
"""

import os
import shutil
import time
from pathlib import Path

import pytest

from keybias.pipeline import browser, index, render

ROOT = Path(__file__).resolve().parents[2]

CHROMIUM = browser.find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless Chromium found (apt-get install chromium, or set KEYBIAS_CHROMIUM)"
)


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = Path(os.environ.get("KEYBIAS_SCREENSHOTS") or ROOT / "results" / ".build" / "screenshots")
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
    assert (shots / "02_invariance.png").is_file()


def test_entry_page_links_land_on_anchors(tmp_path, smoke_results, shots):
    """The entry page, built from the smoke run, loads offline; each claim and figure link
    goes to an anchor that exists in its notebook page."""
    results = tmp_path / "results"
    for part in ("notebooks", "steps", "figures"):
        if (smoke_results / part).is_dir():
            shutil.copytree(smoke_results / part, results / part)
    index.write_index(results)
    problems = browser.check_entry_page(results, shots / "index.png", CHROMIUM)
    assert not problems, "\n".join(problems)
    text = (results / "index.html").read_text()
    assert text.count('href="notebooks/') > text.count("<tr id=\"claim-"), "claims must link into the notebooks"


def test_reader_check_flags_plumbing_raw_outputs_cuts_and_bare_figures():
    """Negative control for the reader's checks, without a browser."""
    dom = """<main>
    <div class="jp-Cell jp-CodeCell"><div class="jp-InputArea-editor">rec.macro("X", 1)
step = rec.finish()</div>
    <div class="jp-OutputArea"><div class="jp-OutputArea-output jp-OutputArea-executeResult"><pre>'1.00'</pre></div>
    <div class="jp-OutputArea-output"><table><tr><td>every key slot of a softmax row goes through t...</td></tr></table></div>
    <div class="jp-OutputArea-output"><table class="dataframe"><tr><td>0</td><td>raw</td></tr></table></div>
    <div class="jp-OutputArea-output"><img src="x.png" alt="a plot"></div></div></div>
    <div class="jp-Cell jp-CodeCell"><div class="jp-InputArea-editor">x = compute()</div>
    <div class="jp-OutputArea"><figure><img src="y.png" alt="y"><figcaption>Figure 1. Y.</figcaption></figure></div></div>
    </main>"""
    problems = " | ".join(browser.reader_problems(dom))
    for expected in ("visible code cell that only records", "raw output \"'1.00'\"", "truncated cell",
                     "a pandas table not shown through keybias.studies.tables", "figure without a caption: 'a plot'"):
        assert expected in problems, (expected, problems)
    assert "x = compute()" not in problems and "'y'" not in problems


def test_claim_link_check_names_a_dangling_anchor(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_x.html").write_text('<div id="claim-a"></div>')
    page = '<a href="notebooks/01_x.html#claim-a">a</a><a href="notebooks/01_x.html#claim-b">b</a>'
    assert browser.claim_link_problems(page, tmp_path) == ["notebooks/01_x.html#claim-b does not resolve"]


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


# -- the site at 1280 and 390 px: sideways scroll, links, cells, plumbing ----------------------------
def test_the_layout_check_catches_every_fault_it_exists_for(tmp_path):
    """Negative control: a page too wide for a phone, a cut cell, "#" for a number, a config
    repr, "uncommitted", two titles, two commits, a sha256 digest, inline code wider than the
    viewport and clipped by its box, a dangling link and anchor; and a clean page (one title, one
    commit named twice, short and long, a code block that scrolls in its own box) that passes."""
    site = tmp_path / "results"
    (site / "notebooks").mkdir(parents=True)
    (site / "index.html").write_text(
        '<html><body><h1>Site</h1><p>Fine, at commit 4444404f7245; bundle keybias-4444404.tar.gz.</p>'
        '<a href="notebooks/good.html#here">ok</a> <a href="notebooks/good.html#gone">x</a>'
        ' <a href="figures/missing.png">y</a> <a href="../paper/main.pdf#page=3">paper</a></body></html>')
    (site / "notebooks" / "good.html").write_text(
        '<html><body><h1>Good</h1><p id="here">A short page.</p><pre style="overflow-x:auto;white-space:pre">'
        + "a long line of code " * 40 + '</pre></body></html>')
    (site / "notebooks" / "bad.html").write_text(
        '<html><body><h1>Bad</h1><h1>Bad again</h1><div style="width:900px">wide</div><p>(with uncommitted changes)</p>'
        '<p>Built at commit 4444404f7245, recorded at commit 24b10b8; sha256 '
        + "ab12" * 16 + '.</p>'
        '<table><tr><td style="max-width:40px;overflow:hidden;white-space:nowrap">a very long reason cut</td>'
        '<td>a change of # against the bound #</td></tr></table>'
        '<div class="jp-OutputArea-output"><pre>DemoConfig(size=2, seeds=[0])</pre></div>'
        '<div style="overflow:hidden;width:200px"><p><code style="white-space:nowrap">'
        + "keybias.studies." * 30 + '</code></p></div></body></html>')
    narrow = browser.layout_problems(site, 390, CHROMIUM)
    bad = " | ".join(narrow["notebooks/bad.html"])
    for expected in ("scrolls sideways", "cell cut off: a very long reason cut", '"#" in place of a number',
                     "config repr: DemoConfig(", 'says "uncommitted"', "2 titles (h1) instead of one",
                     "names 2 commits: 24b10b8, 4444404f7245", "a sha256 digest in view",
                     "px): code keybias.studies.keybias", "clipped inside its box (", "): div keybias.studies."):
        assert expected in bad, (expected, bad)
    assert narrow["index.html"] == [] and narrow["notebooks/good.html"] == []
    assert browser.layout_problems(site, 1280, CHROMIUM)["notebooks/good.html"] == []
    (site / "notebooks" / "wide.html").write_text(
        '<html><body><h1>Wide</h1><div class="kb-table" style="overflow-x:auto;max-width:300px"><table><tr>'
        + "<td>12345678</td>" * 40 + "</tr></table></div></body></html>")
    wide = browser.layout_problems(site, 1280, CHROMIUM)["notebooks/wide.html"]
    assert wide and all(p.startswith("table wider than its box at 1280 px") for p in wide), wide
    assert browser.layout_faults({"w": wide}) == {"w": wide}
    assert browser.layout_faults({"w": ["note: seen", "fault"]}) == {"w": ["fault"]}
    (tmp_path / "paper").mkdir()
    links = browser.local_link_problems(site, tmp_path)
    assert links == ["index.html: notebooks/good.html#gone (no element #gone)",
                     "index.html: figures/missing.png (no such file)",
                     "index.html: ../paper/main.pdf#page=3 (no such file)"], links
    (tmp_path / "paper" / "main.pdf").write_text("%PDF")
    assert len(browser.local_link_problems(site, tmp_path)) == 2


def test_the_reading_check_catches_long_lines_1x_figures_repeated_alt_text_and_low_contrast(tmp_path):
    """Negative control at 1280 px: a paragraph of about 150 characters a line, a figure drawn at
    its shown size, alt text that the caption repeats, grey text on white (2.8:1); and a page that
    does all of it right (a 2x figure, alt text that describes it, prose at 30rem, dark text)."""
    from PIL import Image

    site = tmp_path / "results"
    (site / "notebooks").mkdir(parents=True)
    Image.new("RGB", (300, 150), "white").save(site / "notebooks" / "one.png")
    Image.new("RGB", (600, 300), "white").save(site / "notebooks" / "two.png")
    prose = "A sentence of prose that goes on. " * 20
    alt = "Two lines rise from left to right and cross near the middle of the panel"
    (site / "notebooks" / "bad.html").write_text(
        f'<html><body><h1>Bad</h1><p style="width:1200px">{prose}</p><figure><img src="one.png" width="300" '
        f'alt="{alt}"><figcaption>Figure 1. {alt}.</figcaption></figure>'
        '<p style="color:#999">Grey words.</p></body></html>')
    (site / "notebooks" / "good.html").write_text(
        f'<html><body style="font-family:sans-serif"><h1>Good</h1><p style="max-width:30rem">{prose}</p><figure><img src="two.png" width="300" '
        f'alt="{alt}"><figcaption>Figure 1. The two runs agree.</figcaption></figure>'
        '<p style="color:#4a5058">Dark grey words.</p></body></html>')
    found = browser.layout_problems(site, 1280, CHROMIUM)
    bad = " | ".join(found["notebooks/bad.html"])
    for expected in ("lines of 1", "figure at 1.0x: one.png", "alt text repeats the caption: Two lines rise",
                     "contrast 2.85:1 (rgb(153, 153, 153) on rgb(255, 255, 255)): Grey words."):
        assert expected in bad, (expected, bad)
    assert found["notebooks/good.html"] == []


@pytest.mark.parametrize("width", browser.LAYOUT_WIDTHS)
def test_no_page_of_the_site_scrolls_sideways_cuts_a_cell_or_shows_plumbing(tmp_path, smoke_results, width):
    """Every page of a fresh (smoke) site, the entry page and the file list included, measured in
    an iframe `width` px wide: no sideways scroll, no cut cell, no "#" for a number, no config
    repr, no "uncommitted"; at 1280 px also no table wider than its box, no line of prose over
    about 85 characters, every figure at 2x, alt text that is not the caption, AA contrast."""
    results = tmp_path / "results"
    for part in ("notebooks", "steps", "figures", "data", "tables", "macros"):
        if (smoke_results / part).is_dir():
            shutil.copytree(smoke_results / part, results / part)
    for name in ("findings.json", "claims.json", "provenance.json"):
        if (smoke_results / name).is_file():
            shutil.copy(smoke_results / name, results / name)
    render.publish_assets(results)
    index.write_index(results)
    measured = browser.layout_problems(results, width, CHROMIUM)
    notes = [f"{page}: {p}" for page, problems in measured.items() for p in problems if p.startswith("note:")]
    if notes:
        print("\n" + "\n".join(notes))
    found = browser.layout_faults(measured)
    assert "index.html" in found and "files.html" in found and len(found) >= 3
    failures = [f"{page}: {'; '.join(problems)}" for page, problems in found.items() if problems]
    assert not failures, "\n".join(failures)


def test_every_local_link_of_the_site_resolves(tmp_path, smoke_results):
    results = tmp_path / "results"
    shutil.copytree(smoke_results, results, ignore=shutil.ignore_patterns(".build", ".staging"))
    index.write_index(results)
    problems = browser.local_link_problems(results, root=None)  # links out of results/ are the repo's
    assert not problems, "\n".join(problems[:30])
