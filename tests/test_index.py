"""results/index.html tells the story (abstract, headline figures with takeaways from claims,
notebooks, claims by notebook with a link to the judging cell, files, citation); the README's
generated numbers come from provenance and claims."""

import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from conftest import ROOT
from keybias.build import index, readme

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
        if tag == "script" or (tag == "link" and not (attrs.get("href") or "").startswith("data:")):
            self.scripts.append(attrs)
        if tag == "tr" and (attrs.get("id") or "").startswith("claim-"):
            self.rows += 1


def fake_results(tmp_path):
    results = tmp_path / "results"
    for rel in ("notebooks/01_x.html", "notebooks/01_x.ipynb", "figures/invariance_map.png", "figures/invariance_map.pdf",
                "tables/t.tex", "data/d.csv", "claims.json", "provenance.json"):
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        (results / rel).write_text("x")
    steps = [{"notebook": "01_x", "claims": [{"id": "a"}], "figures_alt": {"invariance_map": "A line going up."},
              "outputs": ["figures/invariance_map.pdf", "figures/invariance_map.png", "tables/t.tex", "data/d.csv"]}]
    claims = [
        {"id": "a-claim", "kind": "test", "value": 1e-15, "bound": 1e-12, "comparison": "<=", "holds": True,
         "notebook": "01_x", "statement": "It <holds> & is escaped."},
        {"id": "b-claim", "kind": "consistency", "value": 3, "bound": 2, "comparison": "<=", "holds": False,
         "notebook": "01_x", "statement": "Fails."},
    ]
    provenance = {"commit": "abcdef1234567", "dirty": False, "profile": "smoke"}
    return results, steps, claims, provenance


def test_index_links_every_output_and_lists_every_claim(tmp_path):
    results, steps, claims, provenance = fake_results(tmp_path)
    text = index.render_index(results, steps, claims, provenance)
    parser = Links()
    parser.feed(text)
    assert parser.rows == 2
    local = [link for link in parser.links if not link.startswith("#")]
    for rel in ("notebooks/01_x.html", "figures/invariance_map.png", "figures/invariance_map.pdf", "tables/t.tex",
                "data/d.csv", "claims.json", "notebooks/01_x.html#claim-a-claim", "notebooks/01_x.html#fig-invariance-map"):
        assert rel in local, rel
    assert all(not link.startswith(("http:", "https:", "//")) for link in local), "network link"
    assert not parser.scripts, "the page loads scripts or stylesheets"
    for link in local:
        if not link.startswith(("../", "data:")):
            assert (results / link.split("#")[0]).exists(), f"dangling link {link}"
    assert "It &lt;holds&gt; &amp; is escaped." in text and 'alt="A line going up."' in text
    assert "1 of 2 hold" in text and 'class="fails">NO' in text


def test_index_reads_in_story_order_with_claims_collapsed_and_visible(tmp_path):
    """Abstract, headline results, notebooks, claims, files, cite: in that order; the claims
    sit in <details> (closed) and each row shows statement, value, bound and kind as text."""
    results, steps, claims, provenance = fake_results(tmp_path)
    text = index.render_index(results, steps, claims, provenance)
    order = [text.index(f'id="{section}"') for section in ("results", "notebooks", "claims", "files", "cite", "bundle")]
    assert order == sorted(order)
    assert text.index('id="abstract"') < order[0]
    assert "<details" in text and "<details open" not in text
    row = text[text.index('<tr id="claim-a-claim"'):]
    row = row[:row.index("</tr>")]
    for shown in ("It &lt;holds&gt;", "1\u00d710<sup>-15</sup>",
                  "\u2264 1\u00d710<sup>-12</sup>", ">test<"):
        assert shown in row, (shown, row)
    assert 'title="' not in row, "statements belong in the row, not in a tooltip"
    # the headline's takeaway is the claim's own sentence, not typed text
    headline = text[text.index('class="headline"'):]
    assert "It &lt;holds&gt; &amp; is escaped." in headline[:headline.index("</figure>")]


def test_abstract_macros_are_filled_in():
    macros = {"Count": "23", "bk": "b_k"}
    out = index.tex_to_html(r"We check \Count{} conditions on $\bk$ (\texttt{need\_weights})~\citep{x}.", macros)
    assert out == "We check 23 conditions on <i>b<sub>k</sub></i> (<code>need_weights</code>).", out


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium installed (`apt-get install chromium`)")
def test_index_renders_in_headless_chromium(tmp_path):
    results, steps, claims, provenance = fake_results(tmp_path)
    page = results / "index.html"
    page.write_text(index.render_index(results, steps, claims, provenance))
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert 'id="claim-a-claim"' in dom and 'id="claim-b-claim"' in dom
    assert "Claims (1 of 2 hold" in dom


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
    assert "| `01_a` | 12 s | 1 | 0 | 0 | 0 |" in new and "| `02_b` | 50 s | 0 | 0 | 1 | 1 |" in new
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
