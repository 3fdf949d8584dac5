"""results/index.html tells the findings (from results/findings.json: a sentence with its number,
its figure, links to the figure, the judging cell and the paper page), the claims grouped by finding
with a filter, the files on their own page, one title; the README's generated numbers come from
provenance and claims."""

import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from conftest import ROOT
from keybias.pipeline import index, readme

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "",
                             shutil.which("chromium-browser") or "") if p and shutil.which(p)), None)


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.scripts, self.rows = [], [], 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("href", "src"):
            if key in attrs:
                self.links.append(attrs[key])
        if tag == "script" and attrs.get("src") or (tag == "link" and not (attrs.get("href") or "").startswith("data:")):
            self.scripts.append(attrs)
        if tag == "li" and (attrs.get("id") or "").startswith("claim-"):
            self.rows += 1


FINDINGS = [
    {"id": "map-finding", "title": "The map", "statement": "The map shows 2,290 configurations with b_k and 10^-12.",
     "section": "sec:map", "figure": "invariance_map", "notebook": "01_x", "basis": "test",
     "decided_by": ["a-claim"], "rests_on": []},
    {"id": "proof-finding", "title": "The proof", "statement": "It cancels exactly.", "section": "sec:none",
     "figure": None, "notebook": "01_x", "basis": "proof", "decided_by": [], "rests_on": ["b-claim"]},
]


def fake_results(tmp_path):
    results = tmp_path / "results"
    for rel in ("notebooks/01_x.html", "notebooks/01_x.ipynb", "figures/invariance_map.png", "figures/invariance_map.pdf",
                "tables/t.tex", "data/d.csv", "claims.json", "provenance.json"):
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        (results / rel).write_text("x")
    (results / "findings.json").write_text(json.dumps(FINDINGS))
    steps = [{"notebook": "01_x", "claims": [{"id": "a"}], "figures_alt": {"invariance_map": "A line going up."},
              "outputs": ["figures/invariance_map.pdf", "figures/invariance_map.png", "tables/t.tex", "data/d.csv"]}]
    claims = [
        {"id": "a-claim", "kind": "test", "value": 1e-15, "bound": 1e-12, "comparison": "<=", "holds": True,
         "notebook": "01_x", "statement": "It <holds> & is escaped.", "finding": "map-finding"},
        {"id": "b-claim", "kind": "consistency", "value": 3, "bound": 2, "comparison": "<=", "holds": False,
         "notebook": "01_x", "statement": "Fails."},
        {"id": "c-claim", "kind": "control", "value": 5, "bound": 1, "comparison": ">=", "holds": True,
         "notebook": "01_x", "statement": "A control no finding names."},
    ]
    provenance = {"commit": "abcdef1234567", "head_commit": "abcdef1234567", "dirty": False, "profile": "smoke"}
    return results, steps, claims, provenance


def test_entry_page_tells_each_finding_with_its_figure_and_links(tmp_path):
    """From results/findings.json: one sentence per finding with its number, its figure, links to
    the figure in its notebook, to the cell that judges it and to the paper."""
    results, steps, claims, provenance = fake_results(tmp_path)
    text = index.render_index(results, steps, claims, provenance, root=tmp_path)
    found = text[text.index('id="found"'):text.index('id="findings"')]
    assert "2,290 configurations" in found and "10\u207b\u00b9\u00b2" in found and "<sub>k</sub>" in found
    assert found.index("The map") < found.index("The proof")  # the registry's order
    card = text[text.index('id="finding-map-finding"'):]
    card = card[:card.index("</article>")]
    for href in ('notebooks/01_x.html#fig-invariance-map', 'notebooks/01_x.html#claim-a-claim',
                 'figures/invariance_map.png', 'figures/invariance_map.pdf', '../paper/main.pdf'):
        assert f'href="{href}"' in card, href
    assert 'alt="A line going up."' in card
    proof = text[text.index('id="finding-proof-finding"'):]
    assert 'notebooks/01_x.html#claim-b-claim' in proof[:proof.index("</article>")]  # what it rests on


def test_paper_links_open_the_page_of_the_section(tmp_path):
    results, steps, claims, provenance = fake_results(tmp_path)
    (tmp_path / "paper" / "build").mkdir(parents=True)
    (tmp_path / "paper" / "build" / "main.aux").write_text(
        "\\newlabel{sec:map}{{3}{5}{Where it holds}{section.3}{}}\n")
    text = index.render_index(results, steps, claims, provenance, root=tmp_path)
    assert 'href="../paper/main.pdf#page=5" title="Section 3 of the paper">Paper, p.\u00a05' in text
    assert index.paper_pages(tmp_path / "nowhere") == {}


def test_claims_are_grouped_by_finding_with_a_filter(tmp_path):
    results, steps, claims, provenance = fake_results(tmp_path)
    text = index.render_index(results, steps, claims, provenance, root=tmp_path)
    parser = Links()
    parser.feed(text)
    assert parser.rows == 3
    group = text[text.index('id="group-map-finding"'):]
    group = group[:group.index("</details>")]
    assert 'id="claim-a-claim"' in group and "It &lt;holds&gt; &amp; is escaped." in group
    assert "1\u00d710\u207b\u00b9\u2075 \u2264 1\u00d710\u207b\u00b9\u00b2" in group
    proof = text[text.index('id="group-proof-finding"'):]
    assert 'id="claim-b-claim"' in proof[:proof.index("</details>")]
    assert '<details class="group" id="group-proof-finding" open>' in text  # a failing claim is shown
    assert 'id="group-other-01_x"' in text and "A control no finding names." in text
    assert 'id="claim-filter"' in text and 'id="claim-kind"' in text and "<option value=\"control\">" in text
    assert "1 of 3 claims FAIL" in text and "uncommitted" not in text
    assert not parser.scripts, "the page loads scripts or stylesheets"
    assert all(not link.startswith(("http:", "https:", "//")) for link in parser.links), "network link"


def test_the_file_list_is_its_own_page(tmp_path):
    results, steps, claims, provenance = fake_results(tmp_path)
    text = index.render_index(results, steps, claims, provenance, root=tmp_path)
    assert 'href="files.html"' in text and 'href="tables/t.tex"' not in text
    files = (results / "files.html").read_text()
    for rel in ("figures/invariance_map.png", "tables/t.tex", "data/d.csv", "claims.json", "findings.json"):
        assert f'href="{rel}"' in files, rel
        assert (results / rel).exists()
    assert 'href="index.html"' in files


def test_one_title_on_the_page_the_bibtex_and_citation_cff():
    import yaml

    title = index.plain_title(index.paper_front(ROOT, ROOT / "results")["title"])
    assert title, "paper/main.tex has a \\title"
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["title"] == title and cff["preferred-citation"]["title"] == title
    citation = index._citation(ROOT, title)
    assert f"title  = {{{title}}}" in citation.replace("&#x27;", "'")


def test_abstract_macros_are_filled_in():
    macros = {"Count": "23", "bk": "b_k"}
    out = index.tex_to_html(r"We check \Count{} conditions on $\bk$ (\texttt{need\_weights})~\citep{x}.", macros)
    assert out == "We check 23 conditions on <i>b<sub>k</sub></i> (<code>need_weights</code>).", out


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium installed (`apt-get install chromium`)")
def test_index_renders_in_headless_chromium(tmp_path):
    results, steps, claims, provenance = fake_results(tmp_path)
    page = results / "index.html"
    page.write_text(index.render_index(results, steps, claims, provenance, root=tmp_path))
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert 'id="claim-a-claim"' in dom and 'id="claim-b-claim"' in dom
    assert '<div class="filter" id="claim-tools">' in dom, "the filter script did not run"
    # a reader types words: only the claims whose statement, finding or kind hold them stay in view,
    # with their count; the words of a finding's title or sentence find its claims, an id finds none
    queries = {"escaped": ["a-claim"], "the MAP": ["a-claim"], "cancels exact": ["b-claim"],
               "b_k configurations": ["a-claim"], "positive control": ["c-claim"], "b-claim": [], "esc": ["a-claim"],
               "fails": ["b-claim"], "": ["a-claim", "b-claim", "c-claim"]}
    probe = ("<script>var q=document.getElementById('claim-filter'),out={};" + json.dumps(list(queries))
             + ".forEach(function(w){q.value=w;q.dispatchEvent(new Event('input'));out[w]=[].slice.call("
             "document.querySelectorAll('ul.claims li')).filter(function(li){return getComputedStyle(li).display!=='none';}).map("
             "function(li){return li.id.slice(6);});out[w+'#']=document.getElementById('claim-count').textContent;});"
             "var p=document.createElement('pre');p.id='probe';p.textContent=JSON.stringify(out);"
             "document.body.appendChild(p);</script>")
    typed = results / "typed.html"
    typed.write_text(page.read_text().replace("</body>", probe + "</body>"))
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--virtual-time-budget=5000", "--dump-dom", typed.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    import html as html_module

    shown = json.loads(html_module.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))
    for words, expected in queries.items():
        assert sorted(shown[words]) == expected, (words, shown[words])
    assert shown["escaped#"] == "1 claim shown" and shown["#"] == "3 claims shown"


def test_readme_blocks_are_generated_from_provenance_and_claims():
    provenance = {
        "commit": "0123456789abcdef", "profile": "paper", "total_wall_seconds": 201.4, "threads": 2,
        "machine": {"cpu_count": 2, "cpu": "Some CPU", "torch_threads": 2},
        "steps": {"01_a": {"wall_seconds": 12.4}, "02_b": {"wall_seconds": 50.0}},
    }
    claims = [
        {"id": "x", "notebook": "01_a", "kind": "test", "holds": True},
        {"id": "y", "notebook": "02_b", "kind": "implied", "holds": True},
        {"id": "z", "notebook": "02_b", "kind": "consistency", "holds": False},
    ]
    text = "intro\n<!-- generated:times -->\nold numbers 99\n<!-- /generated -->\nrest\n"
    new = readme.render(text, readme.blocks(provenance, claims))
    assert "old numbers" not in new and new.startswith("intro\n") and new.endswith("<!-- /generated -->\nrest\n")
    assert "took 201 s in all" in new and (
        "The one test claim holds. Not counted as evidence: one consistency check and one implied claim; "
        "one of them fails.") in new
    assert "| `01_a` | 12 s | 1 | 0 | 0 | 0 | 0 |" in new and "| `02_b` | 50 s | 0 | 0 | 0 | 1 | 1 |" in new
    assert readme.render(new, readme.blocks(provenance, claims)) == new


def test_readme_has_generated_blocks_and_no_typed_times():
    import re

    text = (ROOT / "README.md").read_text()
    assert "<!-- generated:times -->" in text
    outside = re.sub(r"<!-- generated:[a-z_]+ -->.*?<!-- /generated -->", "", text, flags=re.S)
    typed = re.findall(r"\b\d+(?:\.\d+)?\s*(?:s|min|seconds|minutes)\b", outside)
    assert not typed, f"times typed into README outside the generated blocks: {typed}"


def test_readme_bitwise_block_from_the_measurement():
    result = {
        "threads": 2,
        "differ_between_1_and_declared_threads": [],
        "pin_sets": {
            "none": {"pins": {}, "outputs": 30, "seconds": {"avx512": 2.0, "avx2": 3.0},
                     "differ_by_pair": {"avx512_vs_avx2": ["a", "b"], "avx2_vs_default": ["a"]}},
            "aten_avx2": {"pins": {"ATEN_CPU_CAPABILITY": "avx2"}, "outputs": 30, "seconds": {"avx512": 2.5},
                          "differ_by_pair": {"avx512_vs_avx2": []}},
        },
    }
    text = readme.bitwise_block(result)
    assert "| none | 2 of 30 differ | 1 of 30 differ | avx512 2000 ms, avx2 3000 ms |" in text
    assert "| `ATEN_CPU_CAPABILITY=avx2` | identical | not run | avx512 2500 ms |" in text
    assert "One thread against 2: identical" in text


def test_readme_block_prints_the_budgets_and_the_last_verify_run():
    provenance = {"commit": "0123456789abcdef", "profile": "paper", "threads": 2, "total_wall_seconds": 201.0,
                  "machine": {"cpu_count": 2, "cpu": "Some CPU", "torch_threads": 2, "isa_flags": ["avx2", "fma"]},
                  "steps": {"01_a": {"wall_seconds": 12.0}, "02_b": {"wall_seconds": 50.0}}}
    claims = [{"id": "a", "notebook": "01_a", "kind": "test", "holds": True}]
    verified = {"cpu": "Other CPU", "isa_flags": ["avx2"], "isa_env": {"ATEN_CPU_CAPABILITY": "avx2"},
                "wall_seconds": {"01_a": 14.0}, "total_wall_seconds": 14.0, "ok": True, "failures": 0}
    text = readme.blocks(provenance, claims, None, verified)["times"]
    assert "instruction-set flags avx2, fma" in text
    assert "12 min on this machine kind and 15 min on a 2-core AVX2-only machine" in text
    assert "`ATEN_CPU_CAPABILITY=avx2`" in text and "took 14 s" in text and "passed" in text
    assert "| `01_a` | 12 s | 14 s |" in text and "| `02_b` | 50 s | not run |" in text


def test_failed_predictions_are_told_on_the_entry_page():
    """A registered prediction that the data contradicted is named, with its value and bound, in a
    section of its own that the top of the page links to; none failed, no section."""
    from keybias.pipeline import index as idx

    failed = [{"notebook": "02_invariance", "statement": "At most 5% missed.", "value": 0.0833, "bound": 0.05,
               "holds": False},
              {"notebook": "08_longrun", "statement": "More than 3 standard errors.", "value": 2.51, "bound": 3.0,
               "holds": False}]
    text = idx.retired_html(failed)
    assert 'id="retired"' in text and text.startswith("<section") and "Two predictions made before the data" in text
    assert "Measured: 0.0833, against the bound 0.05." in text and 'href="notebooks/08_longrun.html"' in text
    one = idx.retired_html(failed[:1])
    assert "One prediction made before the data came out wrong" in one and "It was withdrawn as a finding" in one
    assert idx.retired_html([{**failed[0], "holds": True}]) == ""


def test_a_failed_prediction_reads_as_a_sentence_with_its_numbers():
    """A prediction the page knows is told in words (what was predicted, what came out) with the
    judged numbers filled in, never as the registry's form ("a share 0.05")."""
    from keybias.pipeline import index as idx

    p = {"id": "invariance-missed-breaks-bfloat16", "notebook": "02_invariance", "value": 0.08333, "bound": 0.05,
         "holds": False, "statement": "misses the break of at most a share 0.05 of the modules"}
    text = idx.prediction_sentence(p)
    assert "at most 5% of the modules" in text and "it missed 8.3%." in text and "a share" not in text
    q = {"id": "longrun-gradient-biased-along-drift", "value": 2.5107, "bound": 3.0, "statement": "x"}
    assert "more than 3 standard errors. The weakest run shows 2.51." in idx.prediction_sentence(q)
    assert "<sub>k</sub>" in idx.prediction_sentence(q)


def test_claim_counts_are_sentences_with_singular_and_plural_by_count():
    from keybias.pipeline.index import group_counts

    test, proof = {"kind": "test", "holds": True}, {"kind": "proof", "holds": True}
    assert group_counts([proof]) == "1 proof check; it holds"
    assert group_counts([test, test]) == "2 tests; both hold"
    assert group_counts([test] * 4 + [{"kind": "control", "holds": True}]) == "4 tests and 1 positive control; all hold"
    assert group_counts([test, {**test, "holds": False}]).endswith('<span class="fails">1 fails</span>')
    assert group_counts([test, proof, proof], by_kind=False) == "3 claims; all hold"


def test_the_entry_page_names_its_commit_once_and_a_card_stays_short(tmp_path):
    """One commit on the page (the bundle is named after it, not by it again); a finding's card
    says its sentence and adds at most a dozen words of links, and a failing one its three-word verdict."""
    import re

    results, steps, claims, provenance = fake_results(tmp_path)
    text = index.render_index(results, steps, claims, provenance, root=tmp_path)
    body = re.sub(r"<[^>]+>", " ", text[text.index("<body>"):])
    assert body.count("abcdef123456") == 1
    for finding in FINDINGS:
        card = text[text.index(f'id="finding-{finding["id"]}"'):]
        card = re.sub(r"<figure>.*?</figure>", "", card[:card.index("</article>")], flags=re.DOTALL)
        card = re.sub(r"</?(?:i|sub|sup|a|span|strong|em|code)\b[^>]*>", "", card).replace("&middot;", " ")
        words = len(re.sub(r"<[^>]+>", " ", card).split())
        overhead = words - len(finding["statement"].split()) - len(finding["title"].split())
        assert overhead <= 12 + 3 * ("FAILS" in card), (finding["id"], words)
    assert "(1 checks" not in text and "checks; all hold" not in text


def test_claims_no_finding_names_join_their_notebooks_one_unnamed_finding():
    """07's case claims are named by no finding: they belong to the conditions finding (the one
    finding of 07 that names none), not to "other checks"; 01's to its only finding, though that
    names one claim; with two candidates they stay apart."""
    findings = [{"id": "quirk", "notebook": "07", "decided_by": ["q"], "rests_on": []},
                {"id": "conditions", "notebook": "07", "decided_by": [], "rests_on": []},
                {"id": "exact", "notebook": "01", "decided_by": [], "rests_on": ["split"]},
                {"id": "x", "notebook": "08", "decided_by": [], "rests_on": []},
                {"id": "y", "notebook": "08", "decided_by": [], "rests_on": []}]
    claims = [{"id": "q", "notebook": "07"}, {"id": "case-1", "notebook": "07"}, {"id": "case-2", "notebook": "07"},
              {"id": "split", "notebook": "01"}, {"id": "grid", "notebook": "01"}, {"id": "lone", "notebook": "08"},
              {"id": "gpu", "notebook": "09"}]
    grouped, rest = index.claims_by_finding(findings, claims)
    assert [c["id"] for c in grouped["quirk"]] == ["q"]
    assert [c["id"] for c in grouped["conditions"]] == ["case-1", "case-2"]
    assert [c["id"] for c in grouped["exact"]] == ["split", "grid"]
    assert [c["id"] for c in rest] == ["lone", "gpu"]


def test_a_finding_without_a_registry_figure_shows_its_notebooks_one_other_figure():
    findings = [{"id": "exact", "notebook": "01", "figure": None}, {"id": "map", "notebook": "02", "figure": "m"}]
    steps = [{"notebook": "01", "outputs": ["figures/grid.png", "figures/grid.pdf", "data/g.csv"]},
             {"notebook": "02", "outputs": ["figures/m.png", "figures/other.png"]}]
    assert index.card_figure(findings[0], findings, steps) == "grid"
    assert index.card_figure(findings[1], findings, steps) == "m"
    steps[0]["outputs"].append("figures/second.png")
    assert index.card_figure(findings[0], findings, steps) is None  # two candidates: none chosen


def test_claim_kinds_read_the_same_on_the_entry_page_and_the_notebook_pages(tmp_path):
    from keybias.pipeline import render_page

    results, steps, claims, provenance = fake_results(tmp_path)
    text = index.render_index(results, steps, claims, provenance, root=tmp_path)
    box = render_page.claims_box(claims)
    for kind in ("test", "consistency", "control"):
        word = render_page.kind_name(kind)
        assert f">{word}</span>" in box and f">{word}</span>" in text, word
        assert f"<dt>{word}</dt><dd>{html.escape(render_page.KIND_MEANING[kind])}</dd>" in text
    assert "cross-check" not in text and ">consistency</span>" not in box
    assert render_page.kind_counts(claims) == "1 test, 1 positive control and 1 consistency check"


def test_checks_that_fail_on_the_gpu_are_told_where_a_reader_looks(tmp_path):
    """A CPU check that fails on the GPU's recorded data is said on the first screen and in its own
    section, in words with the numbers the notebook computed (no claim id), and its finding's card
    points to it; a check that holds there is not listed, and without the GPU's table nothing is said."""
    results, steps, claims, provenance = fake_results(tmp_path)
    plain = index.render_index(results, steps, claims, provenance, root=tmp_path)
    assert 'id="gpu-fails"' not in plain and "On a GPU" not in plain
    (results / "data" / "gpu_transfer.csv").write_text(
        "study,claim,kind,value,comparison,bound,holds\n"
        "x (01),a-claim,test,9.37,<=,1,False\n"
        "x (01),precision-bk-gradient-no-direction,test,1.04,<=,1,False\n"
        "x (01),c-claim,control,6.4,>,1,True\n")
    (results / "macros").mkdir()
    (results / "macros" / "09_gpu.tex").write_text(
        "\\newcommand{\\GpuCosWorstCase}{float32, sdpa efficient}\n\\newcommand{\\GpuCosWorst}{0.102}\n"
        "\\newcommand{\\GpuCosWorstBound}{0.0977}\n")
    text = index.render_index(results, steps, claims, provenance, root=tmp_path)
    lead = text[text.index('<p class="lead">'):]
    lead = lead[:lead.index("</p>")]
    assert "two checks that hold on the CPU fail" in lead and 'href="#gpu-fails"' in lead
    section = text[text.index('id="gpu-fails"'):]
    section = section[:section.index("</section>")]
    body = html.unescape(re.sub(r"<[^>]+>", "", section))
    assert "Two of the 3 CPU checks" in body
    # the statement and the GPU's numbers for a check without words of its own; words for one with them
    assert "It <holds> & is escaped. On the GPU: 9.37 \u2264 1 does not hold." in body
    assert "(float32, memory-efficient kernel)" in body and "a mean cosine of 0.102" in body and "0.0977" in body
    assert "A control no finding names" not in body  # it holds on the GPU
    assert "a-claim" not in body and "precision-bk" not in body
    assert 'href="notebooks/09_gpu.html#every-cpu-check-applied-to-the-gpu-s-data"' in section
    card = text[text.index('id="finding-map-finding"'):]
    assert 'class="gpu-note"' in card[:card.index("</article>")]


def test_the_entry_page_names_no_make_target_and_no_file_as_link_text(tmp_path):
    results, steps, claims, provenance = fake_results(tmp_path)
    (results / "notebooks" / "01_x.ipynb").write_text(json.dumps(
        {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# 01 · The first section"]}]}))
    text = index.render_index(results, steps, claims, provenance, root=tmp_path)
    body = re.sub(r"<[^>]+>", " ", text[text.index("<body>"):text.index('id="cite"')])
    assert "make " not in body and "dist/" not in body
    links = re.findall(r'<a href="notebooks/[^"]*">([^<]*)</a>', text)
    assert links and not [t for t in links if re.search(r"\d\d_\w", t)], links
