"""Rendered notebooks (issue 14): offline math, clean outputs, alt text, navigation, size."""

import hashlib
import json
import re
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup

from keybias.pipeline import render
from keybias.studies.tables import KEYWORDS

ROOT = Path(__file__).resolve().parents[2]
MB = 1_000_000


def _notebook(cells, metadata=None) -> dict:
    nb = nbformat.v4.new_notebook(metadata=metadata or {})
    nb.cells = cells
    return nb


def _png_output(metadata=None):
    # a 1x1 PNG; the renderer never decodes it
    data = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="
    return nbformat.v4.new_output("display_data", data={"image/png": data, "text/plain": "<Figure>"},
                                  metadata=metadata or {})


def _stream(name, text):
    return nbformat.v4.new_output("stream", name=name, text=text)


TQDM_CHUNK = "\rinvariance sweep:  42%|████▏     | 1209/2894 [00:17<00:31, 53.0it/s]"
TQDM_WARNING = (".venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found. "
                "Please update jupyter and ipywidgets.\n  from .autonotebook import tqdm as notebook_tqdm\n")


def _sample() -> dict:
    code_fig = nbformat.v4.new_code_cell(
        'fig = make()\n_ = rec.figure(fig, "demo_map", alt="literal alt")\nplt.show()',
        outputs=[_png_output()],
    )
    code_fig2 = nbformat.v4.new_code_cell(
        'rec.figure(fig2, "second", alt=ALT)\ndisplay(fig2)', outputs=[_png_output()]
    )
    code_noisy = nbformat.v4.new_code_cell(
        "from keybias import verdict\nfrom keybias.studies.invariance import measure\nimport keybias.studies.cost.config\nfrom keybias.studies.precision.measure import x\n"
        "import keybias.not_a_module\nframe = sweep.run(progress=True)",
        outputs=[_stream("stderr", TQDM_WARNING), _stream("stderr", TQDM_CHUNK),
                 _stream("stdout", "2894 configurations\n")],
    )
    return _notebook(
        [
            nbformat.v4.new_markdown_cell("# 02 · The map\n\nThe shift is $q_i\\cdot b_k$ for every key."),
            nbformat.v4.new_code_cell("profile = 'smoke'", metadata={"tags": ["parameters"]}),
            nbformat.v4.new_markdown_cell("## The sweep\n\nThe map below shows each verdict."),
            code_noisy,
            code_fig,
            nbformat.v4.new_markdown_cell("### A second figure\n\nNorms of $b_k$ per layer, log scale."),
            code_fig2,
        ],
        metadata={"keybias": {"paper_section": "Custom section"}},
    )


@pytest.fixture(scope="module")
def sample_page():
    text = nbformat.writes(_sample())
    return render.render_notebook_html(text, name="02_invariance", profile="smoke", device="cpu",
                                       figures_alt={"demo_map": "Verdict of every configuration."},
                                       commit="a" * 40, dirty=False)


def test_page_loads_mathjax_from_the_shared_local_copy_only(sample_page):
    scripts = [s.get("src") for s in BeautifulSoup(sample_page, "html.parser").find_all("script") if s.get("src")]
    assert scripts == ["_static/mathjax/tex-chtml-full.js"]
    assert render.external_references(sample_page) == []
    assert "cdnjs" not in sample_page and "require.js" not in sample_page and "mermaid.esm" not in sample_page


def test_page_links_the_shared_lab_stylesheet_instead_of_inlining_it(sample_page):
    soup = BeautifulSoup(sample_page, "html.parser")
    sheets = [link["href"] for link in soup.find_all("link", rel="stylesheet")]
    assert sheets == [render.NOTEBOOK_CSS]
    inline = "".join(style.get_text() for style in soup.find_all("style"))
    assert len(inline) < 20_000, "nbconvert's 256 kB lab stylesheet is inlined again"
    assert render.notebook_css()[:2000] not in sample_page
    assert len(render.notebook_css()) > 100_000  # the bulk each page no longer carries


def test_external_references_catches_cdn_fonts_and_imports():
    page = """<html><head><script src="https://cdn.x/mathjax.js"></script>
    <link rel="stylesheet" href="//fonts.example/css"><style>@import url("https://x/y.css");
    @font-face { src: url(https://f/z.woff) }</style></head>
    <body><img src="http://i/x.png"><a href="https://example.org">a link is fine</a>
    <script>const m = await import("https://cdn/mermaid.mjs");</script></body></html>"""
    found = render.external_references(page)
    assert len(found) == 6, found
    assert not any("example.org" in f for f in found)


def test_header_names_section_profile_device_commit_and_links(sample_page):
    soup = BeautifulSoup(sample_page, "html.parser")
    header = soup.find("header", class_="kb-header")
    text = " ".join(header.get_text(" ").split())
    assert "Custom section" in text  # from metadata.keybias.paper_section
    assert "smoke" in text and "a CPU" in text and "a" * 12 in text
    nav = header.find("nav")
    assert nav.find("a", rel="prev") and "_" not in nav.get_text(), "the neighbours are named by title, not file name"
    hrefs = [a["href"] for a in header.find_all("a")]
    assert "../index.html" in hrefs
    assert [h for h in hrefs if "src/keybias" in h] == [
        "../../src/keybias/studies/cost/config.py", "../../src/keybias/studies/invariance/measure.py",
        "../../src/keybias/studies/precision/measure.py", "../../src/keybias/verdict.py",
    ]
    assert header.parent.name == "main" and header is header.parent.find(True)


def test_toc_lists_every_markdown_heading_with_working_anchors(sample_page):
    soup = BeautifulSoup(sample_page, "html.parser")
    toc = soup.find("nav", class_="kb-toc")
    links = toc.find_all("a")
    # the notebook's title heads the page; the contents start below it and end on the findings
    assert [a.get_text() for a in links] == ["The sweep", "A second figure", "What we found"]
    assert [a["href"] for a in links] == ["#the-sweep", "#a-second-figure", "#what-we-found"]
    for a in links:
        assert soup.find(id=a["href"][1:]) is not None, a["href"]


READER_CLAIMS = [
    {"id": "demo-holds", "statement": "The demo holds.", "value": 1e-17, "bound": 1e-12, "comparison": "<=",
     "holds": True, "kind": "test"},
    {"id": "demo-count", "statement": "Counts agree.", "value": 3, "bound": 3, "comparison": "==",
     "holds": True, "kind": "consistency"},
]


READER_FINDINGS = [
    {"id": "demo-finding", "title": "The demo", "statement": "The demo holds to 1\u00d710\u207b\u00b9\u2077.",
     "notebook": "09_demo", "figure": None, "decided_by": ["demo-holds"], "rests_on": []},
]


def _reader_notebook() -> dict:
    def result(text):
        return nbformat.v4.new_output("execute_result", data={"text/plain": text}, execution_count=1)

    return _notebook([
        nbformat.v4.new_markdown_cell("# 09 · Demo\n\nIntro."),
        nbformat.v4.new_code_cell("profile = 'smoke'", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell('profile = "paper"\noutput_dir = "../results/.staging/09"',
                                  metadata={"tags": ["injected-parameters"]}),
        nbformat.v4.new_code_cell('rec = recorder.Recorder("09", output_dir, profile=profile, device=device)'),
        nbformat.v4.new_code_cell('import os\nimport warnings\n\nfrom keybias.core import recorder\n\n'
                                  'os.environ["HF_HUB_OFFLINE"] = "1"\nwarnings.filterwarnings("ignore")\n'
                                  "cfg = measure.DemoConfig(size=2)\ncfg",
                                  outputs=[result("DemoConfig(size=2, seeds=[0, 1])")]),
        nbformat.v4.new_markdown_cell("## When does $\\|b_k\\|$ matter?"),
        nbformat.v4.new_code_cell('rec.equation(r"\\tau = 2u", "tol")\nrec.macro("Lam", 2)',
                                  outputs=[result("'1.00\\\\times10^{-6}'")]),
        nbformat.v4.new_code_cell("configs = build(cfg)\nlen(configs)", outputs=[result("2900")]),
        nbformat.v4.new_code_cell("df.status.value_counts()",
                                  outputs=[result("status\nmeasured    2290\nrejected     352\nName: count, dtype: int64")]),
        nbformat.v4.new_code_cell('out = judge.claims(df)\nfor name, value in out["macros"].items():\n'
                                  '    rec.macro(name, value)\nrec.claims_from(out["claims"])\n'
                                  '[(c["claim_id"], c["value"]) for c in out["claims"]]',
                                  outputs=[result("[('demo-holds', 1e-17), ('demo-count', 3)]")]),
        nbformat.v4.new_code_cell("hidden_by_tag = 1", metadata={"tags": ["kb-hide"]}),
        nbformat.v4.new_code_cell("step = rec.finish()"),
    ])


@pytest.fixture(scope="module")
def reader_page():
    return render.render_notebook_html(nbformat.writes(_reader_notebook()), name="09_demo", profile="paper",
                                       device="cpu", commit="b" * 40, dirty=False, claims=READER_CLAIMS,
                                       notebooks=["08_x", "09_demo", "10_y"], paper_figure_numbers={},
                                       findings=READER_FINDINGS)


def test_reader_sees_no_plumbing(reader_page):
    soup = BeautifulSoup(reader_page, "html.parser")
    code = [" ".join(c.get_text().split()) for c in soup.select(".jp-InputArea-editor")]
    assert code == ["cfg = measure.DemoConfig(size=2)", "configs = build(cfg) len(configs)",
                    "df.status.value_counts()", 'out = judge.claims(df)'], code
    outputs = " | ".join(" ".join(o.get_text(" ").split()) for o in soup.select(".jp-OutputArea-output"))
    assert "DemoConfig(" not in outputs, "a config repr is plumbing"
    # code is folded: each code cell's input sits in a closed "Code" toggle
    folds = soup.select("details.kb-code")
    assert len(folds) == len(code) and not any(f.has_attr("open") for f in folds)
    assert all(f.summary.get_text() == "Code" for f in folds)
    assert "1.00" not in outputs and "2900" not in outputs and "[(" not in outputs, outputs
    assert "measured 2,290" in outputs  # the value_counts printout, as a table, in the one formatter
    runwith = soup.find(class_="kb-runwith")
    assert "profile" not in runwith.get_text() and "b" * 12 in runwith.get_text() and ".staging" not in reader_page
    # the recorded equation is typeset, not shown as a code string
    assert "$$\\tau = 2u$$" in soup.find(class_="kb-equation").get_text()


def test_claims_get_anchors_under_the_judging_cell_and_a_findings_section(reader_page):
    soup = BeautifulSoup(reader_page, "html.parser")
    for claim in READER_CLAIMS:
        item = soup.find(id=f"claim-{claim['id']}")
        assert item is not None and claim["statement"] in item.get_text()
        cell = item.find_parent("aside").find_previous_sibling("div", class_="jp-CodeCell")
        assert "judge.claims" in cell.get_text()
    found = soup.find(id="what-we-found")
    # the finding as prose, with its number, from the registry; the claims are not replayed
    assert "The demo holds to 1\u00d710\u207b\u00b9\u2077." in found.get_text()
    assert "Counts agree." not in found.get_text()
    assert found.find("a", href="../index.html#finding-demo-finding") is not None
    assert found.find("a", href="#claim-demo-holds") is not None
    # each claim links back to its finding on the entry page
    item = soup.find(id="claim-demo-holds")
    assert item.find("a", href="../index.html#finding-demo-finding") is not None


def test_anchors_are_readable_and_pages_link_to_neighbours(reader_page):
    soup = BeautifulSoup(reader_page, "html.parser")
    assert soup.find(id="when-does-b-k-matter") is not None
    assert not [t["id"] for t in soup.find_all(id=True) if "$" in t["id"] or "%" in t["id"]]
    assert soup.find("a", rel="prev")["href"] == "08_x.html" and soup.find("a", rel="next")["href"] == "10_y.html"
    assert soup.find("link", rel="icon")["href"].startswith("data:image/svg+xml")


def test_figures_get_numbered_captions_with_anchors(sample_page):
    soup = BeautifulSoup(sample_page, "html.parser")
    figures = soup.select("figure.kb-figure")
    assert [f["id"] for f in figures] == ["fig-demo-map", "fig-second"]
    assert figures[0].figcaption.get_text().startswith("Figure 1. Verdict of every configuration.")
    assert figures[1].figcaption.get_text().startswith("Figure 2.")


def test_a_findings_figure_is_captioned_by_its_finding_and_described_by_its_alt():
    """The caption says what to see (the finding's sentence, numbers from the code); the alt text
    describes the picture and is not repeated in the caption."""
    page = render.render_notebook_html(
        nbformat.writes(_sample()), name="02_invariance", profile="smoke", device="cpu",
        figures_alt={"demo_map": "A grid of coloured squares, one per configuration."}, commit="a" * 40,
        dirty=False, findings=[{"id": "map", "title": "The map", "statement": "All 2,290 agree.",
                                "notebook": "02_invariance", "figure": "demo_map", "decided_by": []}])
    figure = BeautifulSoup(page, "html.parser").select_one("figure#fig-demo-map")
    caption = figure.figcaption.get_text()
    assert caption.startswith("Figure 1. All 2,290 agree.") and "coloured squares" not in caption
    assert figure.img["alt"] == "A grid of coloured squares, one per configuration."
    assert figure.figcaption.find("a", href="../index.html#finding-map") is not None


def test_paper_figure_numbers_follow_the_tex(tmp_path):
    (tmp_path / "sections").mkdir()
    (tmp_path / "main.tex").write_text("\\input{sections/a}\n\\input{sections/b.tex}\n")
    (tmp_path / "sections" / "a.tex").write_text(
        "\\section{First}\\label{sec:a}\n\\begin{figure}\\includegraphics{one.pdf}\\label{fig:one}\\end{figure}\n")
    (tmp_path / "sections" / "b.tex").write_text(
        "\\section{Second}\n%\\begin{figure}\\includegraphics{commented.pdf}\n"
        "\\begin{figure}\\includegraphics[width=1cm]{two}\\label{fig:two}\\end{figure}\n")
    found = render.paper_figures(tmp_path)
    assert {k: (v["number"], v["label"], v["section"]["title"]) for k, v in found.items()} == {
        "one": (1, "fig:one", "First"), "two": (2, "fig:two", "Second")}


def test_section_falls_back_to_the_project_table_and_repository_links():
    nb = _notebook([nbformat.v4.new_code_cell("from keybias import symbolic")])
    assert render.paper_section(nb, "01_symbolic") == "Theorem and proof"
    assert render.paper_section(nb, "08_longrun") == "Drift at length"
    assert render.paper_section(nb, "99_new") is None
    sha = "0123456789abcdef" * 2 + "01234567"
    assert render.module_href("studies.invariance.measure", sha, "https://github.com/o/keybias") == (
        f"https://github.com/o/keybias/blob/{sha}/src/keybias/studies/invariance/measure.py")
    assert render.module_href("studies.invariance.measure", "unknown", "https://github.com/o/keybias") == "../../src/keybias/studies/invariance/measure.py"


def test_repository_url_read_from_citation(tmp_path):
    assert render.repository_url(tmp_path) is None
    (tmp_path / "CITATION.cff").write_text("cff-version: 1.2.0\nrepository-code: https://github.com/o/kb/\n")
    assert render.repository_url(tmp_path) == "https://github.com/o/kb"


def test_every_figure_gets_alt_text_best_source_first(sample_page):
    nb = _sample()
    nb.cells[4].outputs.append(_png_output({"image/png": {"alt": "own metadata wins"}}))
    report = render.add_alt_text(nb, {"demo_map": "from the step record"})
    assert [(r["alt"], r["source"]) for r in report] == [
        ("from the step record", "rec.figure 'demo_map'"),
        ("own metadata wins", "output metadata"),
        ("Figure: Norms of b_k per layer, log scale.", "preceding markdown"),
    ]
    alts = [img.get("alt") for img in BeautifulSoup(sample_page, "html.parser").find_all("img")]
    assert alts == ["Verdict of every configuration.", "Figure: Norms of b_k per layer, log scale."]


def test_literal_alt_in_source_used_without_a_step_record():
    report = render.add_alt_text(_sample(), None)
    assert report[0]["alt"] == "literal alt"


def test_html_leaves_out_stderr_and_progress_but_keeps_stdout(sample_page):
    assert "TqdmWarning" not in sample_page and "it/s" not in sample_page
    assert "2894 configurations" in sample_page


@pytest.mark.parametrize("text", [TQDM_CHUNK, "\r" + " " * 59 + "\x1b[A", "\n\x1b[A\r",
                                  "\rLoading weights: 100%|██████████| 103/103 [00:00<00:00, 764.38it/s]\n"])
def test_progress_fragments_recognised(text):
    assert render.is_progress(text)


@pytest.mark.parametrize("text", ["2894 configurations, 2284 measured, in 45.3 s\n", "42%\n",
                                  "status\nmeasured 2284\n", ""])
def test_ordinary_output_is_not_progress(text):
    assert not render.is_progress(text)


def test_output_problems_names_each_kind_and_passes_a_clean_notebook():
    doc = "The verdict rule: is a measured change rounding noise, or a real change. " * 4
    nb = _sample()
    nb.cells[3].outputs += [
        _stream("stdout", doc.replace(". ", ".\n")),
        nbformat.v4.new_output("execute_result", data={"text/plain": "(PosixPath('a.pdf'), PosixPath('a.png'))"}),
        nbformat.v4.new_output("execute_result", data={"text/plain": "{'x': 1}\n" * 400}),
        nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[]),
        _stream("stdout", "/x.py:3: UserWarning: careful\n"),
    ]
    found = render.output_problems(nb, docstrings=[" ".join(doc.split())])
    kinds = [(p["cell"], p["kind"]) for p in found]
    assert kinds == [(3, "stderr"), (3, "progress"), (3, "warning"), (3, "docstring"),
                     (3, "path_repr"), (3, "huge"), (3, "error"), (3, "warning")]
    nb.cells[6].outputs = []  # saved with rec.figure, never displayed
    assert render.output_problems(nb, docstrings=[])[-1] == {
        "cell": 6, "output": None, "kind": "figure_not_shown",
        "excerpt": "rec.figure ['second'] saved but not displayed in the notebook"}
    clean = _sample()
    clean.cells[3].outputs = [_stream("stdout", "2894 configurations\n")]
    assert render.output_problems(clean, docstrings=[" ".join(doc.split())]) == []


def test_package_docstrings_are_collected():
    docs = render.keybias_docstrings()
    assert docs and all(len(d) >= render.DOCSTRING_MIN_CHARS for d in docs)
    assert any(d.startswith("Rendered notebooks a reader can read offline") for d in docs)


def test_vendored_mathjax_matches_its_recorded_version_and_checksums():
    source = render.MATHJAX_SOURCE
    record = (source / "SOURCE.md").read_text()
    assert f"`mathjax` {render.MATHJAX_VERSION}" in record
    assert "Apache License" in (source / "LICENSE").read_text()
    sums = dict((path, digest) for digest, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", record, re.M))
    files = [p for p in render.asset_files() if p.suffix in (".js", ".woff")]
    assert sorted(str(p) for p in files) == sorted(sums)
    for rel in files:
        assert hashlib.sha256((source / rel).read_bytes()).hexdigest() == sums[str(rel)], rel
    assert f'e.VERSION="{render.MATHJAX_VERSION}"' in (source / "tex-chtml-full.js").read_text()


def test_publish_assets_is_idempotent_and_exact(tmp_path):
    changed = render.publish_assets(tmp_path)
    target = tmp_path / "notebooks" / "_static" / "mathjax"
    assert (target / "tex-chtml-full.js").is_file()
    assert len(list((target / "output/chtml/fonts/woff-v2").glob("*.woff"))) == len(
        list((render.MATHJAX_SOURCE / "output/chtml/fonts/woff-v2").glob("*.woff")))
    assert len(changed) == len(render.asset_files()) + 1  # and the shared lab stylesheet
    css = tmp_path / "notebooks" / render.NOTEBOOK_CSS
    assert css.read_text() == render.notebook_css()
    stray = target / "old.js"
    stray.write_text("x")
    assert render.publish_assets(tmp_path) == []
    assert not stray.exists()


def test_shared_renderer_is_small():
    size = sum((render.MATHJAX_SOURCE / p).stat().st_size for p in render.asset_files())
    assert size < 2.5 * MB


def test_committed_notebooks_render_offline_with_alt_text(tmp_path):
    """The executed notebooks in results/ re-render with no network reference and no alt gap."""
    source = ROOT / "results"
    if not list((source / "notebooks").glob("*.ipynb")):
        pytest.skip("no executed notebooks in results/notebooks")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "steps").mkdir()
    for path in (source / "notebooks").glob("*.ipynb"):
        (tmp_path / "notebooks" / path.name).write_bytes(path.read_bytes())
    for path in (source / "steps").glob("*.json"):
        (tmp_path / "steps" / path.name).write_bytes(path.read_bytes())
    pages = render.render_results(tmp_path)
    assert pages
    for page in pages:
        text = page.read_text()
        assert render.external_references(text) == [], page.name
        soup = BeautifulSoup(text, "html.parser")
        assert all(img.get("alt") and "No description" not in img["alt"] for img in soup.find_all("img"))
        assert soup.find("header", class_="kb-header") and soup.find("nav", class_="kb-toc").find("a")
        assert not soup.select('[data-mime-type="application/vnd.jupyter.stderr"]'), page.name
    assert render.rendered_size(tmp_path) < 15 * MB


def test_smoke_run_pages_are_offline_and_navigable(smoke_results):
    pages = sorted((smoke_results / "notebooks").glob("*.html"))
    assert pages, "the smoke run rendered no notebook"
    for page in pages:
        text = page.read_text()
        assert render.external_references(text) == [], page.name
        assert 'src="_static/mathjax/tex-chtml-full.js"' in text, page.name
        assert 'class="kb-header"' in text and 'href="../index.html"' in text, page.name


def test_smoke_run_publishes_the_shared_renderer(smoke_results):
    """The pipeline calls render.publish_assets (see src/keybias/pipeline/render.py) after rendering."""
    js = smoke_results / "notebooks" / render.MATHJAX_SRC
    assert js.is_file(), (
        f"{js} missing: pipeline.Build.run_notebooks must call "
        "keybias.pipeline.render.publish_assets(self.results)")
    assert render.rendered_size(smoke_results) < 15 * MB


def test_smoke_run_outputs_are_clean(smoke_results):
    """No stderr, warning, progress bar, error, dumped docstring or huge repr in any output."""
    found = render.check_results(smoke_results)
    assert found, "no executed notebooks in the smoke run"
    report = render.format_problems(found)
    assert not report, "outputs a notebook owner must fix:\n" + report


def test_smoke_run_figures_all_have_alt_text_from_the_code(smoke_results):
    """Every figure's alt text comes from rec.figure(alt=...) or the output itself, not prose."""
    gaps = []
    for path in sorted((smoke_results / "notebooks").glob("*.ipynb")):
        step = json.loads((smoke_results / "steps" / f"{path.stem}.json").read_text())
        report = render.add_alt_text(json.loads(path.read_text()), step.get("figures_alt"))
        gaps += [f"{path.stem}: cell {r['cell']} ({r['figure']}): {r['source']}" for r in report
                 if r["source"] in ("preceding markdown", "none")]
    assert not gaps, "figures without an alt from rec.figure(..., alt=...):\n" + "\n".join(gaps)


def test_render_inputs_cover_code_templates_and_mathjax_record():
    names = {p.name for p in render.render_inputs()}
    assert {"render.py", "render_clean.py", "render_cells.py", "render_page.py",
            "index.html.j2", "conf.json", "SOURCE.md"} <= names
    assert all(p.is_file() for p in render.render_inputs())


# -- the one table formatter --------------------------------------------------------------------
def test_table_formatter_numbers_headers_missing_and_no_index():
    import pandas as pd

    from keybias.studies import tables

    assert [tables.format_number(v) for v in (1234567, 0.5, 12.3456, 0.000123, -0.00337, 2.5e7, float("nan"), None)] == [
        "1,234,567", "0.500", "12.3", "1.23\u00d710\u207b\u2074", "\u22120.00337", "2.5\u00d710\u2077", "\u2014", "\u2014"]
    assert tables.header_text("norm_b_k") == "Norm b_k" and tables.header_text("embed_dim") == "Width E"
    frame = pd.DataFrame({"n_keys": [1, 20000], "max_err": [1e-16, None], "verdict": ["not_redundant", "--"]})
    page = tables.show_table(frame, csv="demo")._repr_html_()
    soup = BeautifulSoup(page, "html.parser")
    assert [th.get_text() for th in soup.find_all("th")] == ["Number of keys", "Largest error", "Verdict"]
    assert [td.get_text() for td in soup.find_all("td")] == ["1", "1\u00d710\u207b\u00b9\u2076", "not redundant",
                                                             "20,000", "\u2014", "\u2014"]
    assert soup.find("td")["class"] == ["kb-num"] and tables.breakable("sdpa_math") == "sdpa_<wbr>math"
    assert soup.find("a", href="../data/demo.csv") is not None
    long = tables.show_table(pd.DataFrame({"x": range(60)}), csv="long", max_rows=25)._repr_html_()
    assert long.count("<tr>") == 26 and "The first 25 of 60 rows" in long and "../data/long.csv" in long


def test_table_cells_with_tex_stay_whole_for_mathjax_and_identifiers_still_wrap():
    import pandas as pd

    from keybias.studies import tables

    page = tables.show_table(pd.DataFrame({"case": ["$b_q$ tied to $b_k$", "add_bias_kv"]}))._repr_html_()
    cells = BeautifulSoup(page, "html.parser").find_all("td")
    assert cells[0].find("wbr") is None and cells[0].get_text() == "$b_q$ tied to $b_k$"
    assert cells[1].find("wbr") is not None


def test_pandas_tables_on_a_page_go_through_the_same_formatter():
    import pandas as pd

    from keybias.studies import tables

    soup = BeautifulSoup(pd.DataFrame({"max_abs_diff": [0.123456, float("nan")], "ok": [True, False]}).to_html(),
                         "html.parser")
    tables.tidy_table_html(soup.find("table"), soup)
    assert [th.get_text() for th in soup.find_all("th")] == ["Largest absolute difference", "Ok"]  # no index column
    assert [td.get_text() for td in soup.find_all("td")] == ["0.123", "yes", "\u2014", "no"]


def test_headers_write_symbols_as_the_paper_does_and_wide_tables_show_chosen_columns():
    """b_k in a header is b with subscript k (HTML), on a phone b\u2096 (the cell's label); a table
    shown with some of its columns says so and links the CSV that holds them all."""
    import pandas as pd

    from keybias.studies import tables

    assert tables.header_html("norm_b_k") == "Norm <i>b</i><sub>k</sub>"
    assert tables.header_html("resid_log10") == "Residual log<sub>10</sub>"
    assert tables.header_html("embed_dim") == "Width E" and tables.header_html("num_heads") == "Heads"
    assert tables.header_html("add_bias_kv") == "<code>add_bias_kv</code>"  # the option under study stays code
    assert tables.header_label("norm_b_k") == "Norm b\u2096"
    frame = pd.DataFrame({"grad_rms_b_k": [0.5], "extra_one": [1], "extra_two": [2]})
    page = tables.show_table(frame, csv="wide", columns=["grad_rms_b_k"], headers={"grad_rms_b_k": "RMS of b_k"})
    soup = BeautifulSoup(page._repr_html_(), "html.parser")
    assert str(soup.find("th").decode_contents()) == "RMS of <i>b</i><sub>k</sub>"
    assert soup.find("td")["data-label"] == "RMS of b\u2096" and len(soup.find_all("th")) == 1
    assert "1 of 3 columns; every column is in" in str(soup) and soup.find("a", href="../data/wide.csv")
    with pytest.raises(KeyError, match="no column nowhere"):
        tables.show_table(frame, csv="wide", columns=["nowhere"])
    with pytest.raises(ValueError, match="needs the csv"):
        tables.show_table(frame, columns=["extra_one"])
    pandas_table = BeautifulSoup(pd.DataFrame({"b_k_norm": [1.5]}).to_html(), "html.parser")
    tables.tidy_table_html(pandas_table.find("table"), pandas_table)
    assert "<i>b</i><sub>k</sub> norm" in str(pandas_table.find("th"))


def test_prose_writes_b_k_with_a_subscript_but_leaves_code_tex_and_file_names():
    from keybias.pipeline.render_page import prose_html, subscript_prose

    assert prose_html("the gradient of b_k and g_b_q <x>") == (
        "the gradient of <i>b</i><sub>k</sub> and <i>g</i><sub><i>b</i><sub>q</sub></sub> &lt;x&gt;")
    assert prose_html("add_bias_kv and sdpa_math") == "add_bias_kv and sdpa_math"
    soup = BeautifulSoup('<p>On $b_k$ and b_k</p><code>x_y</code><p>b_k in data/precision_law.csv</p>'
                         '<div class="kb-equation">$$b_k$$</div>', "html.parser")
    assert subscript_prose(soup) == 1
    assert str(soup) == ('<p>On $b_k$ and <i>b</i><sub>k</sub></p><code>x_y</code><p>b_k in data/precision_law.csv</p>'
                         '<div class="kb-equation">$$b_k$$</div>')


def test_cut_text_is_shown_back_to_its_last_whole_clause():
    from keybias.studies.tables import whole_clauses

    cut = "the output depends on b_k: a change beyond the bound; rotary embeddings rotate each key, so t"
    assert whole_clauses(cut, cut_at=60) == "the output depends on b_k: a change beyond the bound; rotary embeddings rotate each key."
    assert whole_clauses("short, whole", cut_at=60) == "short, whole"


def test_every_cell_that_records_claims_shows_them():
    """A cell that records claims gets the box of the claims it judges: none of them is shown at an
    earlier cell, before its data exist (the executed notebooks in results/)."""
    import json
    import re

    from keybias.pipeline.render_clean import cell_source, code_cells

    source = ROOT / "results"
    pages = sorted((source / "notebooks").glob("*.ipynb"))
    if not pages:
        pytest.skip("no executed notebooks in results/notebooks")
    empty = []
    for page in pages:
        step = source / "steps" / f"{page.stem}.json"
        if not step.is_file():
            continue
        nb = json.loads(page.read_text())
        claims = json.loads(step.read_text())["claims"]
        boxed = set(render.claim_cells(nb, claims).values())
        recording = [i for i, c in code_cells(nb) if re.search(r"\.claims?(?:_from)?\(", cell_source(c))]
        empty += [f"{page.stem}: cell {i}" for i in recording if i not in boxed]
    assert not empty, "cells that record claims but show none (end the cell with rec.claims_from(...)): " + ", ".join(empty)


def test_paper_links_open_the_notebooks_section_and_each_figure_at_its_page(tmp_path, monkeypatch):
    """Once the paper is built (its .aux), a notebook's links to the paper open it at the page of
    its finding's section, and "Figure N in the paper" at the figure's page; before, at its start."""
    from keybias.pipeline import render_page

    (tmp_path / "paper" / "build").mkdir(parents=True)
    (tmp_path / "paper" / "build" / "main.aux").write_text(
        "\\newlabel{sec:map}{{4}{6}{The map}{section.4}{}}\n\\newlabel{fig:map}{{2}{7}{}{figure.2}{}}\n")
    findings = [{"id": "map", "title": "The map", "statement": "It holds.", "section": "sec:map",
                 "figure": "demo_map", "notebook": "02_invariance", "decided_by": []}]
    text = nbformat.writes(_sample())
    options = {"name": "02_invariance", "profile": "smoke", "device": "cpu", "commit": "a" * 40, "dirty": False,
               "figures_alt": {"demo_map": "Verdict of every configuration."}, "findings": findings,
               "paper_figure_numbers": {"demo_map": {"number": 2, "label": "fig:map", "section": None}}}
    monkeypatch.setattr(render_page, "ROOT", tmp_path / "unbuilt")
    before = BeautifulSoup(render.render_notebook_html(text, **options), "html.parser")
    assert {a["href"] for a in before.find_all("a") if "main.pdf" in a["href"]} == {render_page.PAPER_HREF}
    monkeypatch.setattr(render_page, "ROOT", tmp_path)
    page = BeautifulSoup(render.render_notebook_html(text, **options), "html.parser")
    pdf = [a for a in page.find_all("a") if "main.pdf" in a["href"]]
    assert {a["href"] for a in pdf} == {f"{render_page.PAPER_HREF}#page=6", f"{render_page.PAPER_HREF}#page=7"}
    assert any(a.get_text() == "The paper, section 4 (page 6)" for a in pdf)
    assert any(a.get_text() == "Figure 2 in the paper" and a["href"].endswith("#page=7") for a in pdf)


def test_a_long_list_of_claims_is_folded_under_its_count_and_opens_where_one_fails():
    from keybias.pipeline.render_page import CLAIMS_SHOWN, claims_box

    claim = {"id": "c", "statement": "It holds.", "value": 0.0, "bound": 1.0, "comparison": "<=", "holds": True,
             "kind": "test"}
    short = BeautifulSoup(claims_box([claim, {**claim, "id": "d"}]), "html.parser")
    assert short.find("details") is None and short.find("p").get_text() == "Judged here (2 claims; all hold)"
    many = [{**claim, "id": f"c{i}"} for i in range(CLAIMS_SHOWN + 1)]
    folded = BeautifulSoup(claims_box(many), "html.parser").find("details")
    assert folded is not None and not folded.has_attr("open") and len(folded.find_all("li")) == CLAIMS_SHOWN + 1
    assert folded.summary.get_text() == f"Judged here: {CLAIMS_SHOWN + 1} claims, all hold"
    failing = BeautifulSoup(claims_box([*many, {**claim, "id": "x", "holds": False}]), "html.parser").find("details")
    assert failing.has_attr("open") and failing.summary.get_text().endswith("1 FAILS")


def test_what_we_found_counts_its_claims_in_sentences():
    from keybias.pipeline.render_page import findings_html

    test = {"id": "t", "kind": "test", "holds": True}
    text = BeautifulSoup(findings_html([test, {**test, "id": "u"}]), "html.parser").get_text(" ")
    assert "judges 2 tests, each at the cell that computes it" in " ".join(text.split())
    assert "0 other" not in text and "both hold" in text
    mixed = findings_html([test, {"id": "p", "kind": "proof", "holds": True}, {"id": "q", "kind": "proof", "holds": True}])
    assert "1 test and 2 proof checks" in mixed and "every one holds" in mixed
    assert "macros" not in findings_html([])


# PyTorch's own keyword arguments, which a reader looks up by that name (declared once, in tables)
PYTORCH_KEYWORDS = KEYWORDS


def test_header_parameter_table_labels_each_parameter_in_words_and_keeps_its_code_name_small():
    from keybias.pipeline.render_page import header_html
    from keybias.studies.params import NOTEBOOK_SPECS, spec_for

    for notebook in NOTEBOOK_SPECS:
        parameters = {name: "1" for name in spec_for(notebook)}
        page = header_html(name=notebook, title="T", section="", profile="paper", device="cpu", commit="",
                           dirty=False, modules=[], repo="", parameters=parameters, previous=None,
                           following=None)
        table = BeautifulSoup(page, "html.parser").find("table", class_="kb-params")
        if table is None:
            continue
        for row in table.find_all("tr"):
            head = row.find("th")
            name = head.find("code", class_="kb-param-name")
            assert name is not None, f"{notebook}: a parameter row has no code name"
            name.extract()
            label = head.get_text(" ", strip=True)
            code_names = [word for word in re.findall(r"\b[A-Za-z]\w*_\w+\b", label)
                          if not re.fullmatch(r"[A-Za-z]_[A-Za-z]", word) and word not in PYTORCH_KEYWORDS]
            assert label and not code_names, (
                f"{notebook}: the parameter label {label!r} is a code name, not words")
    page = header_html(name="07_conditions", title="T", section="", profile="paper", device="cpu", commit="",
                       dirty=False, modules=[], repo="", parameters={"seeds": "[0, 1]", "dtype": "'float64'"},
                       previous=None, following=None)
    cells = [td.get_text() for td in BeautifulSoup(page, "html.parser").find_all("td")]
    assert cells == ["0, 1", "float64"]


@pytest.mark.parametrize("ascii_math, reader", [
    ("eps = 1e-12", "\u03b5 = 10\u207b\u00b9\u00b2"),
    ("drift with eps = 1e-12. The", "drift with \u03b5 = 10\u207b\u00b9\u00b2. The"),
    ("||b_k|| >= 0.5", "\u2016<i>b</i><sub>k</sub>\u2016 \u2265 0.5"),
    ("q.(kj + bk)/sqrt(d)", "q\u00b7(kj + <i>b</i><sub>k</sub>)/\u221ad"),
    ("lambda sqrt(n) u", "\u03bb \u221an u"),
    ("|grad bk|", "|\u2207<i>b</i><sub>k</sub>|"),
    ("(sigma / (s + eps))^2", "(\u03c3 / (s + \u03b5))\u00b2"),
    ("sum_j p_j", "\u03a3<sub>j</sub> <i>p</i><sub>j</sub>"),
    ("sigma_t", "<i>\u03c3</i><sub>t</sub>"),
    # names a reader types or opens stay as written: a column, a file, a word that contains one
    ("bk_norm in data/bk.csv", "bk_norm in data/bk.csv"),
    ("the sigmoid and a mutation", "the sigmoid and a mutation"),
])
def test_prose_writes_ascii_math_in_a_readers_signs(ascii_math, reader):
    from keybias.pipeline.render_page import prose_html

    assert prose_html(ascii_math) == reader


def test_a_notebook_page_opens_with_what_its_section_finds():
    from keybias.pipeline.render_page import header_html

    findings = [{"notebook": "02_x", "title": "b_k is redundant", "statement": "No verdict contradicts it."},
                {"notebook": "03_y", "title": "Another section's", "statement": "Not on this page."}]
    kw = dict(name="02_x", title="The map", section="Where", profile="paper", device="cpu", commit="abc",
              dirty=False, modules=[], repo=None, parameters={}, previous=None, following=None)
    head = header_html(**kw, findings=findings)
    # right under the title, before the provenance line, and only this section's findings
    assert head.index("kb-title") < head.index("What this section finds") < head.index("kb-runwith")
    assert "No verdict contradicts it." in head and "<i>b</i><sub>k</sub>" in head
    assert "Not on this page." not in head
    assert "What this section finds" not in header_html(**kw, findings=[])
