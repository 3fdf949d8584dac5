"""results/index.html links every output and carries the claims table; the README's generated
numbers come from provenance and claims."""

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
        if tag in ("script", "link"):
            self.scripts.append(attrs)
        if tag == "tr" and (attrs.get("id") or "").startswith("claim-"):
            self.rows += 1


def fake_results(tmp_path):
    results = tmp_path / "results"
    for rel in ("notebooks/01_x.html", "notebooks/01_x.ipynb", "figures/f.png", "figures/f.pdf",
                "tables/t.tex", "data/d.csv", "claims.json", "provenance.json"):
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        (results / rel).write_text("x")
    steps = [{"notebook": "01_x", "claims": [{"id": "a"}], "figures_alt": {"f": "A line going up."},
              "outputs": ["figures/f.pdf", "figures/f.png", "tables/t.tex", "data/d.csv"]}]
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
    for rel in ("notebooks/01_x.html", "figures/f.png", "figures/f.pdf", "tables/t.tex", "data/d.csv", "claims.json"):
        assert rel in local, rel
    assert all(not link.startswith(("http:", "https:", "//")) for link in local), "network link"
    assert not parser.scripts, "the page loads scripts or stylesheets"
    for link in local:
        if not link.startswith("../"):
            assert (results / link).exists(), f"dangling link {link}"
    assert "It &lt;holds&gt; &amp; is escaped." in text and 'alt="A line going up."' in text
    assert "The one test claim holds. Not counted as evidence: one consistency check; it fails." in text
    assert 'class="fails">NO' in text


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
    assert "The one test claim holds." in dom


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
