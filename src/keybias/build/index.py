"""results/index.html: the reader's entry page, generated from the step records and the paper.

In reading order: the title and abstract (the paper's, with its macros filled in from
results/macros); three to five headline results, each a figure with a one-sentence takeaway
(the statement of the claim that figure supports, so no number on the page is typed) and
links to the figure in its notebook (`notebooks/NN.html#fig-<name>`) and to the paper; the
notebooks; the claims grouped by notebook, collapsed (`<details>`), each row showing its
statement, value, bound, kind and a link down to the cell that judges it
(`notebooks/NN.html#claim-<id>`); the files; how to cite and the bundle. Plain HTML with an
inline stylesheet and an inline icon: it loads nothing, so it reads the same offline.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from keybias.build.render_page import number_text

ROOT = Path(__file__).resolve().parents[3]

# (figure, claim whose statement is the takeaway): the paper's main results, in its order.
HEADLINES = (
    ("invariance_map", "invariance-matches-theory"),
    ("precision_error_vs_bias", "precision-output-change-within-tolerance"),
    ("training_curves", "train-accuracy-agrees-kept-removed"),
    ("pretrained_bias_norms", "pretrained-strip-and-fold-within-rounding-float64"),
    ("cost_time_saving", "cost-saving-within-removed-work"),
)
KIND_WORDS = {"test": ("test", "tests"), "consistency": ("cross-check", "cross-checks"),
              "implied": ("implied claim", "implied claims"), "proof": ("proof check", "proof checks")}

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:62rem;margin:2rem auto;padding:0 1.2rem;
color:#222;line-height:1.55}
h1{font-size:1.9rem;line-height:1.25;margin-bottom:.3rem}h2{margin-top:2.4rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.meta{color:#555;font-size:.92rem}.abstract{font-size:1.02rem;background:#f7f7f5;padding:.8rem 1.1rem;border-radius:4px}
nav.top a{margin-right:.9rem}
.headlines{display:grid;grid-template-columns:repeat(auto-fill,minmax(27rem,1fr));gap:1.4rem}
.headline{margin:0;border:1px solid #e3e3e3;border-radius:5px;padding:.7rem;background:#fff}
.headline img{width:100%;height:auto;display:block}.headline figcaption{font-size:.95rem;margin-top:.5rem}
.headline .takeaway{font-weight:600}.headline .links{font-size:.88rem;color:#555}
ol.notebooks li{margin:.35rem 0}
details.claims{margin:.4rem 0;border:1px solid #e3e3e3;border-radius:4px;padding:.3rem .7rem}
details.claims summary{cursor:pointer;font-weight:600}
table{border-collapse:collapse;font-size:.9rem;width:100%;margin:.4rem 0}
td,th{border-bottom:1px solid #e6e6e6;padding:.3rem .45rem;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.kind{white-space:nowrap;color:#555}.fails{color:#b00;font-weight:bold}.holds{color:#1d5a37}
code{font-size:.85rem}pre{background:#f7f7f5;padding:.6rem;overflow-x:auto;font-size:.85rem}
tr:target{outline:2px solid #e9a23b}
"""
FAVICON = ("data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E"
           "%3Crect width='16' height='16' rx='3' fill='%23264653'/%3E%3Ctext x='8' y='12.5' font-size='11' "
           "font-family='sans-serif' text-anchor='middle' fill='white'%3Eb%3C/text%3E%3C/svg%3E")
SIGNS = {"<=": "\u2264", ">=": "\u2265", "==": "=", "<": "<", ">": ">", "!=": "\u2260"}


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _number(value) -> str:
    """A claim's value or bound as HTML: numbers as the notebook pages print them, the rest escaped."""
    if isinstance(value, bool) or value is None:
        return _esc(value)
    try:
        float(value)
    except (TypeError, ValueError):
        return _esc(value)
    return number_text(value)


def _count(n: int, kind: str) -> str:
    one, many = KIND_WORDS.get(kind, (kind, kind))
    return f"{n} {one if n == 1 else many}"


# -- the paper's words, with its macros filled in -----------------------------------------------
def tex_macros(*files: Path) -> dict[str, str]:
    """`\\newcommand{\\Name}{value}` definitions (no arguments), one per line, from the files."""
    found = {}
    pattern = re.compile(r"^\s*\\(?:re)?newcommand\{\\([A-Za-z]+)\}\{(.*)\}\s*(?:%.*)?$")
    for path in files:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = pattern.match(line)
            if match:
                found[match.group(1)] = match.group(2)
    return found


def tex_to_html(tex: str, macros: dict[str, str]) -> str:
    """Prose TeX as HTML: macros expanded, markup to tags, math to plain symbols with subscripts."""
    text = re.sub(r"(?<!\\)%.*", "", tex)
    for _ in range(3):  # macros may use macros
        text = re.sub(r"\\([A-Za-z]+)(?:\{\})?", lambda m: macros.get(m.group(1), m.group(0)), text)
    text = re.sub(r"~?\\cite[pt]?\{[^}]*\}", "", text)
    text = text.replace("~", " ").replace("---", "\u2014").replace("--", "\u2013").replace("``", "\u201c").replace("''", "\u201d")
    text = html.escape(text, quote=False)
    text = re.sub(r"\\texttt\{([^{}]*)\}", r"<code>\1</code>", text)
    text = re.sub(r"\\emph\{([^{}]*)\}|\\textit\{([^{}]*)\}", lambda m: f"<em>{m.group(1) or m.group(2)}</em>", text)

    def math(match):
        body = match.group(1)
        body = body.replace(r"\times", "\u00d7").replace(r"\%", "%")
        body = re.sub(r"10\^\{([^}]*)\}", r"10<sup>\1</sup>", body)
        body = re.sub(r"([A-Za-z])_\{?([A-Za-z0-9]+)\}?", r"\1<sub>\2</sub>", body)
        body = re.sub(r"\\[A-Za-z]+", "", body).replace("{", "").replace("}", "")
        return f"<i>{body}</i>" if re.fullmatch(r"[A-Za-z]<sub>\w+</sub>", body) else body

    text = re.sub(r"\$([^$]+)\$", math, text)
    text = text.replace(r"\%", "%").replace("\\_", "_").replace(r"\&", "&amp;")
    text = re.sub(r"\\[A-Za-z]+\*?", "", text).replace("{", "").replace("}", "")
    return " ".join(text.split())


def paper_front(root: Path, results: Path) -> dict:
    """The paper's title and abstract as HTML; empty strings when the paper is absent."""
    main = root / "paper" / "main.tex"
    if not main.is_file():
        return {"title": "", "abstract": ""}
    macros = tex_macros(main, *sorted((results / "macros").glob("*.tex")))
    source = main.read_text(errors="replace")
    title = re.search(r"\\title\{((?:[^{}]|\{[^{}]*\})*)\}", source)
    title_html = tex_to_html(title.group(1).replace("\\\\", " "), macros) if title else ""
    abstract_path = root / "paper" / "sections" / "abstract.tex"
    abstract = tex_to_html(abstract_path.read_text(errors="replace"), macros) if abstract_path.is_file() else ""
    return {"title": title_html, "abstract": abstract}


def _notebook_title(results: Path, name: str) -> str:
    path = results / "notebooks" / f"{name}.ipynb"
    if not path.is_file():
        return name
    from keybias.build.render_page import notebook_title

    try:
        return notebook_title(json.loads(path.read_text()), name)
    except (json.JSONDecodeError, OSError):
        return name


def _citation(root: Path) -> str:
    path = root / "CITATION.cff"
    if not path.is_file():
        return "<p>See <code>CITATION.cff</code> in the repository.</p>"
    import yaml

    try:
        cff = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return "<p>See <code>CITATION.cff</code> in the repository.</p>"
    pref = cff.get("preferred-citation") or cff
    authors = " and ".join(a.get("name") or f"{a.get('given-names', '')} {a.get('family-names', '')}".strip()
                           for a in pref.get("authors", cff.get("authors", [])))
    year = str(pref.get("year") or cff.get("date-released", ""))[:4]
    fields = [f"  title  = {{{pref.get('title', cff.get('title', ''))}}}", f"  author = {{{authors}}}"]
    if year:
        fields.append(f"  year   = {{{year}}}")
    if cff.get("repository-code"):
        fields.append(f"  url    = {{{cff['repository-code']}}}")
    if cff.get("version"):
        fields.append(f"  note   = {{version {cff['version']}}}")
    bib = "@misc{keybias,\n" + ",\n".join(fields) + "\n}"
    return (f"<p>{_esc(authors)}. <em>{_esc(pref.get('title', ''))}</em>"
            f"{'. ' + _esc(year) if year else ''}. The machine-readable record is <code>CITATION.cff</code>.</p>"
            f"<pre>{_esc(bib)}</pre>")


def render_index(results: Path, steps: list[dict], claims: list[dict], provenance: dict,
                 *, root: Path = ROOT) -> str:
    """The HTML text of results/index.html; every link is relative to `results`."""
    from keybias.build.render_page import paper_figures

    results = Path(results)
    front = paper_front(root, results)
    figures_in_paper = paper_figures(root / "paper")
    by_id = {c["id"]: c for c in claims}
    commit = str(provenance.get("commit", "unknown"))
    title = front["title"] or "keybias: results"
    held = sum(bool(c.get("holds")) for c in claims)
    tests = [c for c in claims if c.get("kind") == "test"]
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{re.sub(r'<[^>]+>', '', title)}</title>",
        f'<link rel="icon" href="{FAVICON}">',
        f"<style>{_STYLE}</style></head><body>",
        f'<header><h1 id="top">{title}</h1>',
        f'<p class="meta">Results generated from commit <code>{_esc(commit[:12])}</code>'
        f"{' (with uncommitted changes)' if provenance.get('dirty') else ''}, profile "
        f"<code>{_esc(provenance.get('profile', ''))}</code>. "
        '<a href="../paper/main.pdf">The paper (PDF)</a>.</p>',
        '<nav class="top"><a href="#results">Headline results</a><a href="#notebooks">Notebooks</a>'
        '<a href="#claims">Claims</a><a href="#files">Files</a><a href="#cite">Cite</a></nav></header>',
    ]
    if front["abstract"]:
        out.append(f'<section id="abstract"><h2>Abstract</h2><p class="abstract">{front["abstract"]}</p></section>')

    # headline results
    out.append('<section id="results"><h2>Headline results</h2><div class="headlines">')
    shown = 0
    for stem, claim_id in HEADLINES:
        step = next((s for s in steps if f"figures/{stem}.png" in s.get("outputs", [])), None)
        if step is None:
            continue
        name = step["notebook"]
        claim = by_id.get(claim_id) or next(
            (c for c in claims if c.get("notebook") == name and c.get("kind") == "test"), None)
        if claim is None:
            continue
        shown += 1
        alt = step.get("figures_alt", {}).get(stem, f"figure {stem}")
        paper = figures_in_paper.get(stem)
        paper_link = ""
        if paper:
            section = (paper.get("section") or {}).get("title")
            paper_link = (f' &middot; <a href="../paper/main.pdf">Figure {paper["number"]} of the paper'
                          f'{", section " + _esc(section) if section else ""}</a>')
        verdict = "" if claim.get("holds") else ' <span class="fails">(FAILS)</span>'
        out.append(
            f'<figure class="headline" id="headline-{_esc(stem)}">'
            f'<a href="notebooks/{_esc(name)}.html#fig-{_esc(stem.replace("_", "-"))}">'
            f'<img src="figures/{_esc(stem)}.png" alt="{_esc(alt)}"></a>'
            f'<figcaption><span class="takeaway">{_esc(claim.get("statement", ""))}</span>{verdict} '
            f'<span class="links">(<a href="notebooks/{_esc(name)}.html#claim-{_esc(claim["id"])}">judged in '
            f'{_esc(name)}</a> &middot; <a href="notebooks/{_esc(name)}.html#fig-{_esc(stem.replace("_", "-"))}">'
            f'the figure in its notebook</a>{paper_link})</span></figcaption></figure>')
    out.append("</div>")
    if not shown:
        out.append("<p>No headline figure was produced in this run.</p>")
    out.append("</section>")

    # notebooks
    out.append('<section id="notebooks"><h2>Notebooks</h2><ol class="notebooks">')
    for step in steps:
        name = step["notebook"]
        mine = [c for c in claims if c.get("notebook") == name]
        kinds = {}
        for c in mine:
            kinds[c.get("kind") or "other"] = kinds.get(c.get("kind") or "other", 0) + 1
        counts = ", ".join(_count(n, k) for k, n in sorted(kinds.items(), key=lambda kv: kv[0] != "test"))
        out.append(
            f'<li><a href="notebooks/{_esc(name)}.html">{_esc(name)}: {_esc(_notebook_title(results, name))}</a> '
            f'(<a href="notebooks/{_esc(name)}.ipynb">ipynb</a>)'
            + (f"; {_esc(counts)}" if counts else "") + "</li>")
    out.append("</ol></section>")

    # claims, by notebook, collapsed
    verdict_line = (f"all {len(claims)} hold" if held == len(claims) else f"{held} of {len(claims)} hold")
    out.append(f'<section id="claims"><h2>Claims ({verdict_line}; {_count(len(tests), "test")} among them)</h2>'
               "<p>Each claim is computed by a notebook, with a bound fixed before the data; the link under each "
               "goes to the cell that judges it.</p>")
    for step in steps:
        name = step["notebook"]
        mine = [c for c in claims if c.get("notebook") == name]
        if not mine:
            continue
        failing = [c for c in mine if not c.get("holds")]
        state = "all hold" if not failing else f'<span class="fails">{len(failing)} FAIL</span>'
        out.append(f'<details class="claims" id="claims-{_esc(name)}"><summary>{_esc(name)}: '
                   f"{_esc(_notebook_title(results, name))} ({len(mine)}, {state})</summary>"
                   "<table><thead><tr><th>statement</th><th>value</th><th>bound</th><th>kind</th>"
                   "<th>holds</th></tr></thead><tbody>")
        for c in mine:
            holds = bool(c.get("holds"))
            sign = SIGNS.get(c.get("comparison", "<="), _esc(c.get("comparison", "")))
            out.append(
                f'<tr id="claim-{_esc(c["id"])}"><td>{_esc(c.get("statement", ""))} '
                f'<a href="notebooks/{_esc(name)}.html#claim-{_esc(c["id"])}"><code>{_esc(c["id"])}</code></a></td>'
                f'<td class="num">{_number(c.get("value"))}</td>'
                f'<td class="num">{sign} {_number(c.get("bound"))}</td><td class="kind">{_esc(c.get("kind") or "")}</td>'
                + ('<td class="holds">yes</td>' if holds else '<td class="fails">NO</td>') + "</tr>")
        out.append("</tbody></table></details>")
    out.append("</section>")

    # files
    out.append('<section id="files"><h2>Figures, tables and data</h2><ul>')
    for step in steps:
        files = sorted(p for p in step.get("outputs", [])
                       if p.startswith(("figures/", "tables/", "data/", "machine/", "equations/", "macros/")))
        if files:
            links = ", ".join(f'<a href="{_esc(p)}">{_esc(p)}</a>' for p in files)
            out.append(f"<li>{_esc(step['notebook'])}: {links}</li>")
    extra = [p for p in ("claims.json", "provenance.json", "tables/claims.tex") if (results / p).exists()]
    if extra:
        out.append("<li>build: " + ", ".join(f'<a href="{p}">{p}</a>' for p in extra) + "</li>")
    out.append("</ul></section>")

    # cite and bundle
    out.append(f'<section id="cite"><h2>How to cite</h2>{_citation(root)}</section>')
    out.append(
        '<section id="bundle"><h2>The bundle</h2><p><code>make bundle</code> writes '
        f"<code>dist/keybias-artifact-{_esc(commit[:12])}.tar.gz</code>: the code, notebooks, parameters, these "
        "results and the paper at this commit, byte for byte reproducible. <code>make all</code> inside it "
        "regenerates everything; <code>make verify</code> compares a rerun with these results by output class.</p>"
        "</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def load_steps(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((Path(results) / "steps").glob("*.json"))]


def write_index(results: Path, root: Path = ROOT) -> Path:
    """Write `<results>/index.html` from the step records there (for re-renders and tests)."""
    from keybias.build.recorder import atomic_write_text

    results = Path(results)
    steps = load_steps(results)
    claims = [c for s in steps for c in s.get("claims", [])]
    provenance = {}
    if (results / "provenance.json").is_file():
        provenance = json.loads((results / "provenance.json").read_text())
    elif steps:
        provenance = {**steps[0].get("provenance", {}), "profile": steps[0].get("profile", "")}
    path = results / "index.html"
    atomic_write_text(path, render_index(results, steps, claims, provenance, root=root))
    return path
