"""results/index.html: the reader's entry page, built from the findings registry.

In reading order: the paper's title; what the project found, one sentence with its number per
finding (results/findings.json, written by the pipeline from keybias.studies.findings; when it is
absent the registry is read with the macros here), each linking down to its card; the cards, each
with the figure that shows the finding, links to that figure in its notebook, to the notebook cell
that judges it and to its page of the paper (`../paper/main.pdf#page=N`, N read from the LaTeX
labels in paper/build/main.aux or paper/main.aux, left out when neither exists); the notebooks;
every claim grouped by the finding it decides or supports, with a filter; how to cite. The list of
files is its own page, results/files.html. Plain HTML with an inline stylesheet, icon and a few
lines of script for the filter: it loads nothing, so it reads the same offline.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd
import yaml

from keybias.core.recorder import atomic_write_text
from keybias.core.text import SUPERSCRIPT
from keybias.pipeline.findings_out import findings_records, read_macros
from keybias.pipeline.render_page import (
    KIND_MEANING,
    KIND_ORDER,
    KIND_WORDS,
    kind_name,
    notebook_title,
    paper_pages,
    png_css_width,
    subscript_html,
)
from keybias.studies.invariance import judge as inv_judge
from keybias.studies.tables import PATH_WORDS, format_number

ROOT = Path(__file__).resolve().parents[3]


# Colours meet WCAG AA on white (text >= 4.5:1): #1f2328 15.8, #4a5058 7.6, link #0b57a4 7.1,
# visited #6a2c91 8.6, fails #a4161a 7.5, holds #1d5a37 7.8.
_STYLE = """
:root{--ink:#1f2328;--muted:#4a5058;--link:#0b57a4;--rule:#d5d8dc;--soft:#f5f6f7}
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:76rem;margin:0 auto;padding:1rem 1.2rem 3rem;
color:var(--ink);line-height:1.5;font-size:16px;overflow-wrap:break-word}
a{color:var(--link);text-decoration:underline;text-underline-offset:2px}a:visited{color:#6a2c91}
a:focus-visible{outline:2px solid #e9a23b;outline-offset:2px}
h1{font-size:1.65rem;line-height:1.2;margin:.2rem 0 .3rem;max-width:48rem}
h2{font-size:1.3rem;margin-top:2.2rem;border-bottom:1px solid var(--rule);padding-bottom:.2rem}
h3{font-size:1.08rem;margin:.2rem 0 .4rem}
p,li,figcaption,.prose{max-width:min(40rem,64ch)}
.meta{color:var(--muted);font-size:.9rem;margin:.2rem 0}
nav.top{font-size:.92rem;margin:.3rem 0 .2rem}nav.top a{margin-right:.9rem;white-space:nowrap}
ol.found{list-style:none;padding:0;margin:.6rem 0;display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,22rem),1fr));
gap:.35rem 1.6rem;max-width:none}
ol.found li{max-width:38rem;font-size:.93rem;line-height:1.4;padding:.35rem 0;border-top:1px solid var(--rule)}
ol.found li strong{display:block;font-size:.97rem}
ol.found .basis{color:var(--muted);font-size:.85rem}
article.finding{border-top:1px solid var(--rule);padding:1rem 0;display:grid;gap:0 2rem;
grid-template-columns:minmax(0,1fr)}
@media (min-width:64rem){article.finding.with-figure{grid-template-columns:minmax(0,26rem) minmax(0,1fr)}}
article.finding figure{margin:0}article.finding img{max-width:100%;height:auto;display:block;border:1px solid var(--rule)}
article.finding figcaption{font-size:.88rem;color:var(--muted);margin-top:.3rem}
.statement{font-size:1rem}.links{font-size:.9rem}.links a{margin-right:.2rem}
.lead{margin:.4rem 0 .2rem}
@media (max-width:30rem){h1{font-size:1.3rem}}
.abstract{background:var(--soft);padding:.8rem 1rem;border-radius:4px}
ol.notebooks li{margin:.3rem 0}
.filter{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:center;font-size:.92rem;margin:.6rem 0}
.filter input[type=search]{font:inherit;padding:.25rem .4rem;min-width:0;width:16rem;max-width:100%}
.filter select{font:inherit}
details.group{margin:.35rem 0;border:1px solid var(--rule);border-radius:4px;padding:.3rem .7rem}
details.group summary{cursor:pointer;font-weight:600}
ul.claims{list-style:none;padding:0;margin:.3rem 0}
ul.claims li{max-width:none;border-top:1px solid #e6e8ea;padding:.4rem 0;display:grid;gap:.1rem 1rem;
grid-template-columns:minmax(0,1fr)}
@media (min-width:48rem){ul.claims li{grid-template-columns:minmax(0,40rem) 12rem 7rem}}
ul.claims li[hidden]{display:none}
ul.claims .check{font-variant-numeric:tabular-nums;white-space:nowrap}
ul.claims .kind{color:var(--muted);font-size:.88rem}
ul.claims code{font-size:.8rem;overflow-wrap:anywhere}
.fails{color:#a4161a;font-weight:bold}.gpu-note{font-size:.92rem;color:#a4161a}.holds{color:#1d5a37}
code{font-size:.88rem}pre{background:var(--soft);padding:.6rem;font-size:.82rem;white-space:pre-wrap;overflow-wrap:anywhere;max-width:48rem}
li:target,article:target{outline:2px solid #e9a23b;outline-offset:3px}
ul.files li{max-width:min(48rem,64ch);margin:.3rem 0}
dl.kinds{display:grid;grid-template-columns:minmax(0,max-content) minmax(0,1fr);gap:.15rem 1rem;font-size:.9rem;
max-width:48rem;margin:.4rem 0}dl.kinds dt{font-weight:600}dl.kinds dd{margin:0;color:var(--muted)}
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
        return str(value)
    try:
        float(value)
    except (TypeError, ValueError):
        return str(value)
    return format_number(value)


def _count(n: int, kind: str) -> str:
    one, many = KIND_WORDS.get(kind, (kind, kind))
    return f"{n} {one if n == 1 else many}"


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def group_counts(claims: list[dict], *, by_kind: bool = True) -> str:
    """What a group of claims holds, in words: "4 tests and 1 positive control; all hold",
    "1 proof check; it holds", "2 tests; 1 fails"; without `by_kind`, "5 claims; all hold" (HTML)."""
    kinds = sorted({c.get("kind") or "claim" for c in claims},
                   key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else 9)
    counts = (_and([_count(sum((c.get("kind") or "claim") == k for c in claims), k) for k in kinds]) if by_kind
              else _count(len(claims), "claim"))
    bad = sum(not c.get("holds") for c in claims)
    if bad:
        state = f'<span class="fails">{bad} {"fails" if bad == 1 else "fail"}</span>'
    else:
        state = "it holds" if len(claims) == 1 else ("both hold" if len(claims) == 2 else "all hold")
    return f"{counts}; {state}"


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

    try:
        return notebook_title(json.loads(path.read_text()), name)
    except (json.JSONDecodeError, OSError):
        return name


def plain_title(title_html: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", title_html)).strip()


def _citation(root: Path, title_html: str = "") -> str:
    """The citation: the paper's title (the one CITATION.cff carries too), authors and year."""
    path = root / "CITATION.cff"
    if not path.is_file():
        return "<p>See <code>CITATION.cff</code> in the repository.</p>"

    try:
        cff = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return "<p>See <code>CITATION.cff</code> in the repository.</p>"
    pref = cff.get("preferred-citation") or cff
    authors = " and ".join(a.get("name") or f"{a.get('given-names', '')} {a.get('family-names', '')}".strip()
                           for a in pref.get("authors", cff.get("authors", [])))
    year = str(pref.get("year") or cff.get("date-released", ""))[:4]
    title = plain_title(title_html) or pref.get("title", cff.get("title", ""))
    fields = [f"  title  = {{{title}}}", f"  author = {{{authors}}}"]
    if year:
        fields.append(f"  year   = {{{year}}}")
    if cff.get("repository-code"):
        fields.append(f"  url    = {{{cff['repository-code']}}}")
    if cff.get("version"):
        fields.append(f"  note   = {{version {cff['version']}}}")
    bib = "@misc{keybias,\n" + ",\n".join(fields) + "\n}"
    return (f"<p>{_esc(authors)}. <em>{_esc(title)}</em>"
            f"{'. ' + _esc(year) if year else ''}. The machine-readable record is <code>CITATION.cff</code>.</p>"
            f"<pre>{_esc(bib)}</pre>")


# -- where things are ---------------------------------------------------------------------------
def load_findings(results: Path) -> list[dict]:
    """results/findings.json; without it, the registry with the run's macros filled in."""
    path = Path(results) / "findings.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            pass

    return findings_records(read_macros(results))


def claims_by_finding(findings: list[dict], claims: list[dict]) -> tuple[dict[str, list[dict]], list[dict]]:
    """Each finding's claims (the tests that decide it, then the checks it rests on, then the checks
    of its notebook that no finding names, where the notebook has one finding for them), and the
    claims that belong to no finding."""
    owner: dict[str, str] = {}
    for f in findings:
        for cid in f.get("decided_by", []):
            owner.setdefault(cid, f["id"])
    for f in findings:
        for cid in f.get("rests_on", []):
            owner.setdefault(cid, f["id"])
    for c in claims:
        if c.get("finding"):
            owner[c["id"]] = c["finding"]
    # A claim no finding names belongs to its notebook's finding when there is one to choose: the
    # notebook's only finding (01's proof checks to "the key bias cancels exactly"), else its one
    # finding that names no claims (07's cases to the conditions, not to the quirk); otherwise it
    # stays among the other checks of its notebook.
    named = set(owner.values())
    per_notebook: dict[str, list[str]] = {}
    for f in findings:
        per_notebook.setdefault(f.get("notebook", ""), []).append(f["id"])
    for c in claims:
        if c["id"] in owner:
            continue
        mine = per_notebook.get(c.get("notebook", ""), [])
        unnamed = [fid for fid in mine if fid not in named]
        chosen = mine if len(mine) == 1 else unnamed
        if len(chosen) == 1:
            owner[c["id"]] = chosen[0]
    grouped: dict[str, list[dict]] = {f["id"]: [] for f in findings}
    rest = []
    for c in claims:
        fid = owner.get(c["id"])
        (grouped[fid] if fid in grouped else rest).append(c)
    for fid in grouped:
        grouped[fid].sort(key=lambda c: KIND_ORDER.index(c.get("kind")) if c.get("kind") in KIND_ORDER else 9)
    return grouped, rest




# What a newcomer needs before the findings: what b_k is, why it should do nothing, what was asked.
LEAD = ("PyTorch's <code>nn.MultiheadAttention</code> adds a learned bias <i>b<sub>k</sub></i> to every key. "
        "It moves every score of a query by the same amount, which softmax ignores, so in exact arithmetic it "
        "changes nothing and its gradient is zero. The findings below say where that reasoning holds and where "
        "it breaks, what rounding and the Adam optimizer do with a bias that should not move, and what removing "
        "it from trained models changes and costs.")


def statement_html(text: str) -> str:
    """A finding's plain statement as HTML: `10^-12` as a power, `b_k` and `q_i` with subscripts."""

    text = _esc(text)
    text = re.sub(r"\^\{?(-?\d+)\}?", lambda m: m.group(1).translate(SUPERSCRIPT), text)
    text = re.sub(r"\^\{?([\w\u0370-\u03ff])\}?", r"<sup>\1</sup>", text)
    return subscript_html(text)


def card_figure(finding: dict, findings: list[dict], steps: list[dict]) -> str | None:
    """The figure a finding's card shows: the registry's, or else the one figure of its notebook
    that no other finding shows (01 draws its grid of derivatives for the exact cancellation)."""
    if finding.get("figure"):
        return finding["figure"]
    shown = {f.get("figure") for f in findings}
    mine = sorted({Path(p).stem for s in steps if s.get("notebook") == finding.get("notebook")
                   for p in s.get("outputs", []) if p.startswith("figures/") and p.endswith(".png")} - shown)
    return mine[0] if len(mine) == 1 else None


def _judging_claim(finding: dict, claims_here: list[dict]) -> dict | None:
    for c in claims_here:
        if c["id"] in finding.get("decided_by", []):
            return c
    return claims_here[0] if claims_here else None


def _paper_link(label: str | None, pages: dict[str, dict]) -> str:
    where = pages.get(label or "")
    if where:
        return (f'<a href="../paper/main.pdf#page={where["page"]}" title="Section {_esc(where["number"])} of the '
                f'paper">Paper, p.\u00a0{where["page"]}</a>')
    return '<a href="../paper/main.pdf">Paper</a>'


def _claim_numbers(c: dict, sign: str) -> str:
    """`value sign bound` with as many digits as it takes to tell a value from its bound."""
    value, bound = c.get("value"), c.get("bound")
    digits = 3
    try:
        while (digits < 12 and float(value) != float(bound)
               and format_number(value, digits) == format_number(bound, digits)):
            digits += 1
        return f"{_esc(format_number(value, digits))} {sign} {_esc(format_number(bound, digits))}"
    except (TypeError, ValueError):
        return f"{_esc(_number(value))} {sign} {_esc(_number(bound))}"


def search_words(*texts: str) -> str:
    """What the claim filter matches: the words of `texts`, lower case, `b_k` as `bk`, TeX and
    punctuation as spaces (the filter normalises what a reader types the same way)."""
    text = " ".join(t for t in texts if t).lower()
    text = re.sub(r"\\[a-z]+", " ", text).replace("_", "").replace("ₖ", "k")
    return " ".join(re.findall(r"[a-z0-9À-ɏͰ-Ͽ]+", text))


def _claim_item(c: dict, finding: dict | None, group_title: str) -> str:
    holds = bool(c.get("holds"))
    sign = SIGNS.get(c.get("comparison", "<="), _esc(c.get("comparison", "")))
    words = search_words(c.get("statement", ""), group_title, (finding or {}).get("statement", ""),
                         kind_name(c.get("kind")), "holds" if holds else "fails")
    return (f'<li id="claim-{_esc(c["id"])}" data-kind="{_esc(c.get("kind") or "")}" '
            f'data-holds="{"yes" if holds else "no"}" data-text="{_esc(words)}">'
            f'<span>{statement_html(c.get("statement", ""))} <a href="notebooks/{_esc(c.get("notebook", ""))}.html#claim-'
            f'{_esc(c["id"])}">where it is judged</a></span> '  # spaces: the row reads as words when copied
            f'<span class="check">{_claim_numbers(c, sign)}'
            + (' <span class="holds">holds</span>' if holds else ' <span class="fails">FAILS</span>') + "</span> "
            f'<span class="kind" title="{_esc(KIND_MEANING.get(c.get("kind") or "", ""))}">'
            f'{_esc(kind_name(c.get("kind")))}</span></li>')


_FILTER_SCRIPT = """
(function(){var q=document.getElementById('claim-filter'),k=document.getElementById('claim-kind'),
f=document.getElementById('claim-failing'),n=document.getElementById('claim-count');
function norm(t){return t.toLowerCase().replace(/\\\\[a-z]+/g,' ').replace(/_/g,'').replace(/\u2096/g,'k')
.match(/[a-z0-9\u00c0-\u024f\u0370-\u03ff]+/g)||[];}
function run(){var words=norm(q.value),kind=k.value,only=f.checked,shown=0,typed=words.length>0;
document.querySelectorAll('details.group').forEach(function(g){var any=0;
g.querySelectorAll('ul.claims li').forEach(function(li){var text=' '+li.dataset.text;
var ok=(!kind||li.dataset.kind===kind)&&(!only||li.dataset.holds==='no')&&
words.every(function(w){return text.indexOf(' '+w)>=0;});li.hidden=!ok;if(ok){any++;shown++;}});
g.hidden=!any;if(typed||only||kind){g.open=any>0;}});n.textContent=shown+(shown===1?' claim':' claims')+' shown';}
[q,k,f].forEach(function(el){el.addEventListener('input',run);el.addEventListener('change',run);});
document.getElementById('claim-tools').hidden=false;})();
"""


NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def retired_predictions(results: Path, root: Path = ROOT) -> list[dict]:
    """The predictions registered before the data that the data contradicted, judged again from the
    results as they were registered (`invariance.judge.retired_predictions`,
    `longrun.judge_full.failed_predictions`): one dict each with the notebook, id, statement, value,
    bound and outcome. A study whose data are absent here (a partial or smoke build) adds none."""

    out = []
    data = Path(results) / "data"
    try:
        if (data / "invariance.csv").is_file() and (data / "invariance_magnitudes.csv").is_file():
            df = pd.read_csv(data / "invariance.csv", low_memory=False)
            cells = inv_judge.magnitude_cells(df, pd.read_csv(data / "invariance_magnitudes.csv"))
            out += [{**p, "notebook": "02_invariance"} for p in inv_judge.retired_predictions(cells)]
    except (ValueError, KeyError, IndexError, TypeError, OSError):
        pass  # not judged here: the page says nothing rather than something wrong
    try:
        from keybias.studies.longrun import judge_full, record  # deferred: they load torch

        folder = Path(root) / "recorded" / "longrun-cpu"
        if folder.is_dir():
            full = record.load_recorded(folder)
            units = judge_full.units(full["trajectory"], full["probes"], full["entries"])
            out += [{**p, "notebook": "08_longrun"} for p in judge_full.failed_predictions(units)]
    except (ValueError, KeyError, IndexError, TypeError, OSError):
        pass  # not judged here: the page says nothing rather than something wrong
    return out


# The failed predictions in a reader's words: the numbers come from the judged record, the
# sentence says what was predicted and what came out (the registry's statement otherwise).
PREDICTION_WORDS = {
    "invariance-missed-breaks-bfloat16": (
        "We predicted that bfloat16, judging each module alone, would miss the break in at most {bound:pct} "
        "of the modules where its float64 twin finds one. At its worst magnitude it missed {value:pct}."),
    "longrun-gradient-biased-along-drift": (
        "We predicted that in every small float32 run the mean gradient of b_k over the last decade of steps "
        "keeps pushing b_k the way it has already moved, by more than {bound:num} standard errors. The "
        "weakest run shows {value:num}."),
}


def _plain_number(value, digits: int = 3) -> str:
    """A number as a person writes it in a sentence: 3 significant figures, no trailing zeros."""
    text = format_number(value, digits)
    return text.rstrip("0").rstrip(".") if "." in text and "\u00d7" not in text else text


def _prediction_number(value, how: str) -> str:
    if how == "pct":
        return f"{_plain_number(100 * float(value), 2)}%"
    return _plain_number(value)


def prediction_sentence(p: dict) -> str:
    """What a failed prediction said and what the data gave, as HTML."""
    words = PREDICTION_WORDS.get(p.get("id", ""))
    if words is None:
        return (f"{statement_html(p['statement'])} Measured: {_esc(_plain_number(p['value']))}, against the bound "
                f"{_esc(_plain_number(p['bound']))}.")
    filled = re.sub(r"\{(value|bound):(pct|num)\}", lambda m: _prediction_number(p[m.group(1)], m.group(2)), words)
    return statement_html(filled)


def retired_html(predictions: list[dict]) -> str:
    """The failed predictions in words, for the entry page (empty when none failed)."""
    failed = [p for p in predictions if not p.get("holds")]
    if not failed:
        return ""
    count = NUMBER_WORDS[len(failed)] if len(failed) < len(NUMBER_WORDS) else str(len(failed))
    one = len(failed) == 1
    head = (f"{count.capitalize()} prediction{'' if one else 's'} made before the data came out wrong. "
            f"{'It was' if one else 'They were'} withdrawn as {'a finding' if one else 'findings'}, and "
            f"{'it is' if one else 'they are'} still tested as first stated, with the result reported here.")
    items = "".join(
        f'<li>{prediction_sentence(p)} <a href="notebooks/{_esc(p["notebook"])}.html">'
        f'{_esc(_notebook_title(p.get("results"), p["notebook"]) if p.get("results") else "Its notebook")}</a>.</li>'
        for p in failed)
    return (f'<section id="retired" aria-labelledby="retired-h"><h2 id="retired-h">What failed</h2>'
            f"<p>{head}</p><ul>{items}</ul></section>")


# What a CPU check that fails on the GPU's data means there, in the paper's words, with the
# numbers notebook 09 computed; a check not named here is said with its statement and numbers.
GPU_SHORT = {
    "precision-accuracy-crossing-law": "on one path the rounding model misplaces where the error doubles",
    "precision-bk-gradient-no-direction": "on one path the gradient of b_k is not pure noise",
}
GPU_WORDS = {
    "precision-accuracy-crossing-law": (
        "The rounding model does not say where the error doubles: on one path ({GpuCrossingWorstCase}) "
        "the error against float64 already doubles at the smallest ratio ‖b_k‖/‖k‖ measured, "
        "{GpuCrossingWorstMeasured}, where the model with the CPU's constant predicts {GpuCrossingWorstPredicted}."),
    "precision-bk-gradient-no-direction": (
        "The gradient of b_k is not pure noise everywhere: on one path ({GpuCosWorstCase}) the gradients "
        "of independent batches share a direction slightly more than isotropic noise allows (a mean "
        "cosine of {GpuCosWorst}, where such noise stays below {GpuCosWorstBound}); its size stays at rounding."),
}
GPU_NOTEBOOK, GPU_TABLE_ANCHOR = "09_gpu", "every-cpu-check-applied-to-the-gpu-s-data"


def gpu_failures(results: Path, claims: list[dict]) -> list[dict]:
    """The CPU checks that fail on the GPU's recorded data (results/data/gpu_transfer.csv, written
    by notebook 09), each with its CPU statement; none when the GPU's table is absent."""
    path = Path(results) / "data" / "gpu_transfer.csv"
    if not path.is_file():
        return []
    table = pd.read_csv(path)
    statements = {c["id"]: c.get("statement", "") for c in claims}
    failed = table[~table["holds"].astype(str).str.lower().isin(["true", "1"])]
    return [{"id": r["claim"], "value": r["value"], "bound": r["bound"], "comparison": r["comparison"],
             "statement": statements.get(r["claim"], "")} for _, r in failed.iterrows()]


def _gpu_checks(results: Path) -> int:
    path = Path(results) / "data" / "gpu_transfer.csv"
    return len(pd.read_csv(path)) if path.is_file() else 0


def _case_words(text: str) -> str:
    """"float32, sdpa efficient" as "float32, memory-efficient kernel": code paths in words."""
    spoken = {k.replace("_", " "): v for k, v in PATH_WORDS.items()}
    return ", ".join(spoken.get(part, part) for part in text.split(", "))


def gpu_failure_sentence(f: dict, macros: dict[str, str]) -> str:
    """One failure on the GPU in words (HTML): its meaning where the notebook computed the
    numbers that say it, else the CPU statement with the GPU's value and bound."""
    words = GPU_WORDS.get(f["id"])
    names = re.findall(r"\{(\w+)\}", words or "")
    if words and all(n in macros for n in names):
        return statement_html(re.sub(r"\{(\w+)\}", lambda m: _case_words(plain_title(tex_to_html(macros[m.group(1)], {}))),
                                     words))
    sign = SIGNS.get(f.get("comparison", "<="), f.get("comparison", ""))
    return (f"{statement_html(f['statement'] or 'A check of the CPU notebooks.')} On the GPU: "
            f"{_esc(_plain_number(f['value']))} {_esc(sign)} {_esc(_plain_number(f['bound']))} does not hold.")


def gpu_html(failures: list[dict], total: int, macros: dict[str, str]) -> str:
    """The entry page's words on the CPU checks that do not carry over to the GPU (empty when all do)."""
    if not failures:
        return ""
    n = len(failures)
    count = NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else str(n)
    items = "".join(f"<li>{gpu_failure_sentence(f, macros)}</li>" for f in failures)
    return (f'<section id="gpu-fails" aria-labelledby="gpu-fails-h"><h2 id="gpu-fails-h">What does not carry '
            f"over to a GPU</h2><p>{count.capitalize()} of the {total} CPU checks that the GPU's recorded data "
            f"let us apply fail{'s' if n == 1 else ''} there. These are findings about the GPU, reported "
            f"rather than asserted: the GPU was measured once, after the checks were written.</p>"
            f'<ul>{items}</ul><p><a href="notebooks/{GPU_NOTEBOOK}.html#{GPU_TABLE_ANCHOR}">Every check on the '
            "GPU's data</a>, in its notebook.</p></section>")


def _profile_note(profile: str) -> str:
    """Nothing for the paper's sizes; otherwise that these are not the paper's numbers."""
    if not profile or profile == "paper":
        return ""
    return f", at the small sizes of the <code>{_esc(profile)}</code> profile, not the paper's"


def site_commit(provenance: dict, steps: list[dict] | None = None) -> str:
    """The one commit every page names: the results' (provenance.json), else the first step's."""
    commit = provenance.get("head_commit") or provenance.get("commit")
    if not commit and steps:
        commit = (steps[0].get("provenance") or {}).get("commit")
    return str(commit or "unknown")


def _page_head(title: str, heading_note: str = "") -> list[str]:
    plain = re.sub(r"<[^>]+>", "", title)
    return ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_esc(heading_note + plain) if heading_note else plain}</title>",
            f'<link rel="icon" href="{FAVICON}">', f"<style>{_STYLE}</style></head><body>"]


def render_index(results: Path, steps: list[dict], claims: list[dict], provenance: dict,
                 *, root: Path = ROOT, findings: list[dict] | None = None) -> str:
    """The HTML text of results/index.html; every link is relative to `results`."""
    results = Path(results)
    if results.is_dir():  # the page links to files.html: written beside it, whoever renders the index
        files_page = render_files(results, steps, provenance, root=root)
        path = results / "files.html"
        if not path.is_file() or path.read_text() != files_page:
            atomic_write_text(path, files_page)
    front = paper_front(root, results)
    findings = load_findings(results) if findings is None else findings
    pages = paper_pages(root)
    commit = site_commit(provenance, steps)
    title = front["title"] or "keybias: results"
    grouped, rest = claims_by_finding(findings, claims)
    alts = {stem: alt for s in steps for stem, alt in (s.get("figures_alt") or {}).items()}
    failing = [c for c in claims if not c.get("holds")]
    tests = [c for c in claims if c.get("kind") == "test"]
    retired = retired_html([{**p, "results": results} for p in retired_predictions(results, root)])
    on_gpu = gpu_failures(results, claims)
    gpu = gpu_html(on_gpu, _gpu_checks(results), read_macros(results)) if on_gpu else ""
    out = _page_head(title)
    out += [
        f'<header><h1 id="top">{title}</h1>',
        f'<p class="meta">Every number on this page was computed by the notebooks at commit '
        f'<code>{_esc(commit[:12])}</code>{_profile_note(provenance.get("profile", ""))}. '
        f'<a href="../paper/main.pdf">The paper (PDF)</a>.</p>',
        '<nav class="top" aria-label="On this page"><a href="#found">What we found</a><a href="#findings">'
        'The findings</a><a href="#notebooks">Notebooks</a><a href="#claims">Claims</a>'
        '<a href="files.html">All files</a><a href="#cite">Cite</a></nav></header>'.replace(
            '<a href="#findings">', '<a href="#retired">What failed</a><a href="#findings">' if retired else
            '<a href="#findings">').replace(
            '<a href="#findings">', '<a href="#gpu-fails">On a GPU</a><a href="#findings">' if gpu else '<a href="#findings">'),
    ]
    if failing:
        out.append(f'<p class="fails">{len(failing)} of {len(claims)} claims FAIL: '
                   + ", ".join(f'<a href="#claim-{_esc(c["id"])}">{_esc(c["id"])}</a>' for c in failing) + ".</p>")

    # what we found: one sentence with its number per finding
    found_lead = ""
    if retired:
        n_failed = retired.count("<li>")
        word = NUMBER_WORDS[n_failed] if n_failed < len(NUMBER_WORDS) else str(n_failed)
        found_lead = (f'<p class="lead">{"Every claim holds" if not failing else f"{len(failing)} claims FAIL"}. '
                      f'{word.capitalize()} prediction{"s" if n_failed > 1 else ""} made before the data '
                      f'failed; <a href="#retired">what failed</a> reports {"them" if n_failed > 1 else "it"}.</p>')
    if gpu:
        n_gpu = len(on_gpu)
        word = NUMBER_WORDS[n_gpu] if n_gpu < len(NUMBER_WORDS) else str(n_gpu)
        shorts = [GPU_SHORT[f["id"]] for f in on_gpu if f["id"] in GPU_SHORT]
        what = (": " + statement_html(_and(shorts)) if len(shorts) == n_gpu else "")
        gpu_lead = (f"On a GPU's recorded data, {word} check{'s' if n_gpu > 1 else ''} that hold{'' if n_gpu > 1 else 's'} "
                    f'on the CPU fail{"" if n_gpu > 1 else "s"}{what} (<a href="#gpu-fails">what does not carry '
                    "over</a>).")
        # "every claim holds" is the CPU's verdict: said so, next to what the GPU's data say
        found_lead = ((found_lead[:-len("</p>")].replace("Every claim holds.", "Every claim holds on the CPU.")
                       + " " + gpu_lead + "</p>") if found_lead else f'<p class="lead">{gpu_lead}</p>')
    # the findings come first, so the first screen says what was found; how the checks came out follows
    out.append('<section id="found" aria-labelledby="found-h"><h2 id="found-h">What we found</h2>'
               f'<p class="brief">{LEAD}</p><ol class="found">')
    for f in findings:
        # the short form first, so the first screen can be read at a glance; the card gives every number
        short = f.get("summary") or f.get("statement") or ""
        out.append(f'<li><strong><a href="#finding-{_esc(f["id"])}">{statement_html(f.get("title", f["id"]))}</a></strong>'
                   f"{statement_html(short)}</li>")
    out.append("</ol>" + found_lead + "</section>")
    if retired:
        out.append(retired)
    if gpu:
        out.append(gpu)

    # each finding: its figure, its links, its claims
    out.append('<section id="findings"><h2>The findings</h2>')
    for f in findings:
        name = f.get("notebook", "")
        mine = grouped.get(f["id"], [])
        judge = _judging_claim(f, mine)
        stem = card_figure(f, findings, steps)
        has_figure = bool(stem) and (results / "figures" / f"{stem}.png").is_file()
        links = []
        if has_figure:
            links.append(f'<a href="notebooks/{_esc(name)}.html#fig-{_esc(stem.replace("_", "-"))}" '
                         f'title="The figure in its notebook">Figure</a>')
        if judge is not None:
            links.append(f'<a href="notebooks/{_esc(name)}.html#claim-{_esc(judge["id"])}" '
                         f'title="The notebook cell whose checks could refute this finding">Where it is tested</a>')
        else:
            links.append(f'<a href="notebooks/{_esc(name)}.html">Its notebook</a>')
        links.append(_paper_link(f.get("section"), pages))
        if mine:
            links.append(f'<a href="#group-{_esc(f["id"])}">{group_counts(mine, by_kind=False)}</a>')
        verdict = ""
        if any(not c.get("holds") for c in mine):
            verdict = ' <span class="fails">(a claim FAILS)</span>'
        off_gpu = [g for g in on_gpu if g["id"] in {c["id"] for c in mine}]
        gpu_note = (f'<p class="gpu-note">On a GPU, {len(off_gpu)} of its checks '
                    f'{"fails" if len(off_gpu) == 1 else "fail"}: <a href="#gpu-fails">what does not carry over</a>.</p>'
                    if off_gpu else "")
        # "What we found" gives the short form; the card states the finding with all its numbers
        full = f.get("statement") or ""
        text = [f'<div><h3>{statement_html(f.get("title", f["id"]))}{verdict}</h3>',
                f'<p class="statement">{statement_html(full)}</p>' if full else "", gpu_note,
                f'<p class="links">{" &middot; ".join(links)}</p></div>']
        figure = ""
        if has_figure:
            alt = alts.get(stem, f"The figure {stem}.")
            with open(results / "figures" / f"{stem}.png", "rb") as handle:
                width = png_css_width(handle.read(4096))
            size = f' width="{width}"' if width else ""
            figure = (f'<figure><a href="figures/{_esc(stem)}.png"><img src="figures/{_esc(stem)}.png"{size} '
                      f'alt="{_esc(alt)}" loading="lazy"></a><figcaption><a href="figures/{_esc(stem)}.pdf">'
                      f"As PDF</a></figcaption></figure>")
        out.append(f'<article class="finding{" with-figure" if figure else ""}" id="finding-{_esc(f["id"])}">'
                   + "".join(text) + figure + "</article>")
    out.append("</section>")

    # notebooks
    out.append('<section id="notebooks"><h2>Notebooks</h2><p>Each reads as a section of the paper; '
               "its code is folded under each result.</p><ol class=\"notebooks\">")
    for step in steps:
        name = step["notebook"]
        out.append(f'<li><a href="notebooks/{_esc(name)}.html">{_esc(_notebook_title(results, name))}</a> '
                   f'(<a href="notebooks/{_esc(name)}.ipynb">the executed notebook</a>)</li>')
    out.append("</ol></section>")

    # claims, grouped by finding, with a filter
    kinds = sorted({c.get("kind") or "" for c in claims}, key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else 9)
    lead = (f"All {len(claims)} claims hold" if not failing else f"{len(failing)} of {len(claims)} claims FAIL")
    out.append(
        f'<section id="claims"><h2>Claims, by finding</h2><p>{lead}. Only {_count(len(tests), "test")} could '
        "have come out against a finding on plausible data; the others check what the code or the mathematics "
        "guarantees. Each bound was fixed before the data; each claim links to the cell that judges it.</p>"
        '<dl class="kinds">' + "".join(f"<dt>{_esc(kind_name(k))}</dt><dd>{_esc(KIND_MEANING[k])}</dd>"
                                       for k in kinds if k in KIND_MEANING) + "</dl>"
        '<div class="filter" id="claim-tools" hidden><label>Filter <input type="search" id="claim-filter" '
        'placeholder="words of a finding or claim"></label><label>Kind <select id="claim-kind"><option value="">any</option>'
        + "".join(f'<option value="{_esc(k)}">{_esc(kind_name(k))}</option>' for k in kinds)
        + '</select></label><label><input type="checkbox" id="claim-failing"> failing only</label>'
        '<span id="claim-count" class="meta" aria-live="polite"></span></div>')
    titles = {f["id"]: f.get("title", f["id"]) for f in findings}
    by_id = {f["id"]: f for f in findings}
    groups = [(fid, titles[fid], grouped[fid]) for fid in titles if grouped[fid]]
    by_notebook: dict[str, list[dict]] = {}
    for c in rest:
        by_notebook.setdefault(c.get("notebook", ""), []).append(c)
    groups += [(f"other-{nb}", f"Other checks in {_notebook_title(results, nb)}", cs) for nb, cs in by_notebook.items()]
    for gid, gtitle, cs in groups:
        bad = any(not c.get("holds") for c in cs)
        out.append(f'<details class="group" id="group-{_esc(gid)}"{" open" if bad else ""}><summary>'
                   f'{statement_html(gtitle)} <span class="meta">({group_counts(cs)})</span></summary><ul class="claims">'
                   + "".join(_claim_item(c, by_id.get(gid), gtitle) for c in cs) + "</ul></details>")
    out.append(f"<script>{_FILTER_SCRIPT}</script></section>")

    # cite and bundle
    out.append(f'<section id="cite"><h2>How to cite</h2>{_citation(root, title)}</section>')
    out.append(
        '<section id="bundle"><h2>Reproduce it</h2><p>One archive, named after the commit above, holds the '
        "code, the notebooks, their parameters, these results and the paper at that commit, byte for byte "
        "reproducible. Rebuilding inside it regenerates every number, figure and page; a rerun is compared "
        "with these results finding by finding. The repository's README gives the commands. Every figure, "
        'table and data file is listed on <a href="files.html">its own page</a>.</p></section>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


FILE_KINDS = (("figures/", "Figures"), ("tables/", "LaTeX tables"), ("data/", "Data (CSV)"),
              ("macros/", "Numbers the paper prints (LaTeX macros)"), ("equations/", "Equations"),
              ("machine/", "Machine-specific measurements"))


def render_files(results: Path, steps: list[dict], provenance: dict, *, root: Path = ROOT) -> str:
    """results/files.html: every output, by notebook and kind."""
    front = paper_front(root, results)
    title = front["title"] or "keybias: results"
    commit = site_commit(provenance, steps)
    out = _page_head(title, "Files: ")
    out.append(f'<header><p class="meta"><a href="index.html">&uarr; {title}</a></p><h1 id="top">Every file '
               f'the notebooks wrote</h1><p class="meta">At commit <code>{_esc(commit[:12])}</code>. '
               "Each notebook writes only its own files.</p></header>")
    for step in steps:
        name = step["notebook"]
        files = step.get("outputs", [])
        out.append(f'<section id="files-{_esc(name)}"><h2><a href="notebooks/{_esc(name)}.html">'
                   f"{_esc(_notebook_title(results, name))}</a></h2><ul class=\"files\">")
        for prefix, words in FILE_KINDS:
            mine = sorted(p for p in files if p.startswith(prefix))
            if mine:
                links = ", ".join(f'<a href="{_esc(p)}">{_esc(p.removeprefix(prefix))}</a>' for p in mine)
                out.append(f"<li>{_esc(words)}: {links}</li>")
        out.append("</ul></section>")
    extra = [p for p in ("findings.json", "claims.json", "provenance.json", "tables/claims.tex")
             if (Path(results) / p).exists()]
    if extra:
        out.append('<section id="files-build"><h2>The build</h2><ul class="files"><li>'
                   + ", ".join(f'<a href="{p}">{p}</a>' for p in extra) + "</li></ul></section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"



def load_steps(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((Path(results) / "steps").glob("*.json"))]


def write_index(results: Path, root: Path = ROOT) -> Path:
    """Write `<results>/index.html` from the step records there (for re-renders and tests)."""

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
