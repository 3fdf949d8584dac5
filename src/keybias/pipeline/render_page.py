"""Page assembly for a rendered notebook: everything nbconvert does not do.

What a notebook is about (the paper section it supports, the keybias modules it calls, their
links at the run's commit, its title, the paper's figure numbers), the header with the
"Run with" box (profile, device, commit, parameters) and the table of contents, the
previous/next navigation, readable heading anchors, numbered figure captions, trimmed tables
with links to their CSV, the claim boxes under the cells that judge them, and the closing
"What we found". `finish_page` applies all of it to nbconvert's HTML.
"""

from __future__ import annotations

import ast
import base64
import html
import re
import struct
from pathlib import Path

import yaml
from bs4 import BeautifulSoup, NavigableString

from keybias.core.provenance import commit_info
from keybias.core.text import SUPERSCRIPT
from keybias.pipeline.render_clean import PACKAGE_DIR, cell_source, code_cells, parse_code
from keybias.studies.params import ParameterError, spec_for
from keybias.studies.tables import tidy_table_html

ROOT = Path(__file__).resolve().parents[3]
INDEX_HREF = "../index.html"
PAPER_HREF = "../../paper/main.pdf"
SOURCE_PREFIX = "../../src/keybias"  # from results/notebooks/ to the package in the bundle

# Fallback when a notebook's metadata does not say (`metadata.keybias.paper_section`).
PAPER_SECTIONS = {
    "01_symbolic": "Theorem and proof",
    "02_invariance": "Where the invariance holds and where it breaks",
    "03_precision": "Key bias in floating point",
    "04_training": "Key bias under training",
    "05_pretrained": "A pretrained model",
    "06_cost": "What the key bias costs",
    "07_conditions": "Exact conditions",
    "08_longrun": "Drift at length",
    "09_gpu": "On a GPU",
}
HIDDEN_PARAMETERS = ("output_dir", "results_dir", "profile", "device")
TABLE_ROWS_SHOWN = 25  # a longer table is trimmed to this many rows, with a link to its CSV
TABLE_ROWS_MAX = 40
CLAIMS_SHOWN = 8  # a cell judging more claims shows them folded under their count

# The reader's words for the kinds of claim (design notes, "Claims"), the same on every page: the
# name (one, many) and what it means. Only a test could have failed on plausible data.
KIND_ORDER = ("test", "proof", "control", "consistency", "implied")
KIND_WORDS = {"test": ("test", "tests"), "proof": ("proof check", "proof checks"),
              "control": ("positive control", "positive controls"),
              "consistency": ("consistency check", "consistency checks"),
              "implied": ("implied claim", "implied claims"), "claim": ("claim", "claims")}
KIND_MEANING = {
    "test": "a measurement that plausible data could have contradicted",
    "proof": "an exact identity, checked symbolically or on the project's own code, not measured",
    "control": "a positive control: shows that the test it protects can see an effect",
    "consistency": "a check of the code's own guarantees or bookkeeping, which no plausible data could fail",
    "implied": "follows from another claim, which it names",
}


def kind_name(kind: str | None, n: int = 1) -> str:
    one, many = KIND_WORDS.get(kind or "claim", (str(kind), str(kind)))
    return one if n == 1 else many


def kind_counts(claims: list[dict]) -> str:
    """"3 tests, 17 proof checks and 8 consistency checks": a group of claims by kind, tests first."""
    kinds = sorted({c.get("kind") or "claim" for c in claims},
                   key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else 9)
    parts = [f"{n} {kind_name(k, n)}" for k in kinds for n in [sum((c.get("kind") or "claim") == k for c in claims)]]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
COMPARISON_SIGNS = {"<=": "\u2264", ">=": "\u2265", "==": "=", "<": "<", ">": ">", "!=": "\u2260"}
_INT = re.compile(r"^[-+]?\d+$")
# symbols with subscripts in plain prose (b_k, q_i, g_b_q): the nested form first
_NESTED_SUB = re.compile(r"(?<![\w\\])([A-Za-z])_([A-Za-z])_([A-Za-z0-9]{1,3})(?![\w])")
_SUB = re.compile(r"(?<![\w\\])([A-Za-z\u03b1-\u03c9])_([A-Za-z0-9]{1,3})(?![\w])")  # sigma_t once it is σ_t
# ASCII math in plain prose, as a reader writes it: ||b_k|| as a norm, eps as epsilon, 1e-12 as a
# power of ten, >= and <= as signs (the text is already escaped, so > is &gt;)
_NORM = re.compile(r"\|\|([^|<>]{1,24}?)\|\|")
_EPS = re.compile(r"(?<![\w\\])eps(?![\w])")
_SCI = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)e([-+]?)0*(\d+)(?![\w]|\.\d)")  # 1e-12 ends a sentence too
_SIGNS = (("&gt;=", "\u2265"), ("&lt;=", "\u2264"), ("!=", "\u2260"))
_DOT = re.compile(r"(?<![\w.])([qk](?:_i)?)\.(b_[kqv])(?![\w])")  # q.b_k, a dot product
_GREEK = {"sigma": "\u03c3", "mu": "\u03bc", "lambda": "\u03bb", "alpha": "\u03b1", "tau": "\u03c4",
          "rho": "\u03c1", "kappa": "\u03ba", "eta": "\u03b7"}
_GREEK_WORD = re.compile(r"(?<![\w\\])(" + "|".join(_GREEK) + r")(?![A-Za-z0-9(])")
_SQRT = re.compile(r"(?<![\w\\])sqrt\(([\w.]{1,8})\)")  # sqrt(d) as √d; a longer radicand stays
_SUM = re.compile(r"(?<![\w\\])sum_([a-z])(?![\w])")  # sum_j as Σ_j
_BARE_BIAS = re.compile(r"(?<![\w\\/.-])b([kqv])(?![\w./-])")  # bk, as a claim's text writes b_k
_GRAD = re.compile(r"(?<![\w\\])grad (?=b_[kqv]|b[kqv]\b)")
_ASCII_MATH = re.compile("|".join(r.pattern for r in (_NORM, _EPS, _SCI, _DOT, _GREEK_WORD, _SQRT, _SUM,
                                                      _BARE_BIAS)) + "|>=|<=|!=")


def _power_of_ten(m: re.Match) -> str:
    power = ("-" if m.group(2) == "-" else "") + m.group(3)
    ten = "10" + power.translate(SUPERSCRIPT)
    return ten if m.group(1) in ("1", "1.0") else f"{m.group(1)}\u00d7{ten}"


def math_html(escaped: str) -> str:
    """Escaped prose with its ASCII math (eps = 1e-12, ||b_k||, r >= 0.5, sigma, sqrt(d), sum_j,
    grad bk) in a reader's signs."""
    escaped = _BARE_BIAS.sub(r"b_\1", escaped)
    escaped = _GRAD.sub("\u2207", escaped)
    escaped = _NORM.sub("\u2016\\1\u2016", escaped)
    escaped = _EPS.sub("\u03b5", escaped)
    escaped = _GREEK_WORD.sub(lambda m: _GREEK[m.group(1)], escaped)
    escaped = _SQRT.sub("\u221a\\1", escaped)
    escaped = _SUM.sub("\u03a3<sub>\\1</sub>", escaped)
    escaped = _DOT.sub("\\1\u00b7\\2", escaped)
    escaped = re.sub(r"(?<![\w.])q\.\(", "q\u00b7(", escaped)  # q.(k_j + b_k), a dot product
    escaped = re.sub(r"(?<=[\w)])\^\{?(-?\d+)\}?", lambda m: m.group(1).translate(SUPERSCRIPT), escaped)
    escaped = _SCI.sub(_power_of_ten, escaped)
    for ascii_sign, sign in _SIGNS:
        escaped = escaped.replace(ascii_sign, sign)
    return escaped


# TeX a page typesets itself, left as it is
_TEX = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$|\\\(.*?\\\)|\\\[.*?\\\]", re.DOTALL)
# a file or module name (data/precision_law.csv, keybias.studies.x_y), left as it is written
_PATH_LIKE = re.compile(r"[\w-]\.(?:csv|json|tex|pdf|png|svg|py|ipynb|html|yaml|txt)\b|^\(?keybias\.")
_NOT_PROSE = ("script", "style", "code", "pre", "kbd", "samp", "textarea", "title", "head")


def paper_pages(root: Path = ROOT) -> dict[str, dict]:
    """{LaTeX label: {"number", "page"}} from the paper's .aux (paper/build/main.aux, then
    paper/main.aux); empty when the paper has not been built: links then open the PDF's start.
    `\\newlabel{sec:x}{{3}{5}...}` is section 3 on page 5."""
    for aux in (root / "paper" / "build" / "main.aux", root / "paper" / "main.aux"):
        if aux.is_file():
            found = {}
            pattern = re.compile(r"\\newlabel\{([^}]+)\}\{\{([^}]*)\}\{(\d+)\}")
            for match in pattern.finditer(aux.read_text(errors="replace")):
                found[match.group(1)] = {"number": match.group(2), "page": int(match.group(3))}
            return found
    return {}


def subscript_html(escaped: str) -> str:
    """Escaped prose with b_k, q_i and g_b_q as a reader writes them (italic, subscripted)."""
    escaped = math_html(escaped)
    escaped = escaped.replace("‖_typ", "‖<sub>typ</sub>")  # the typical key norm, ‖k‖_typ
    escaped = _NESTED_SUB.sub(r"<i>\1</i><sub><i>\2</i><sub>\3</sub></sub>", escaped)
    return _SUB.sub(r"<i>\1</i><sub>\2</sub>", escaped)


def prose_html(text: str) -> str:
    """Plain prose (a claim's or a finding's statement) as HTML: escaped, with its subscripts."""
    return subscript_html(html.escape(str(text), quote=False))


def subscript_prose(soup) -> int:
    """Every text node of prose on the page (not code, not TeX the page typesets, not a path)
    with b_k written as b with subscript k; the number of text nodes changed."""

    changed = 0
    for node in list(soup.find_all(string=lambda t: bool(t and (_SUB.search(t) or _ASCII_MATH.search(t))))):
        if type(node) is not NavigableString or any(
                p.name in _NOT_PROSE or "kb-equation" in (p.get("class") or []) for p in node.parents):
            continue
        text = str(node)
        pieces, at = [], 0
        for math in _TEX.finditer(text):
            pieces.append(subscript_html(html.escape(text[at:math.start()], quote=False)))
            pieces.append(html.escape(math.group(0), quote=False))
            at = math.end()
        pieces.append(subscript_html(html.escape(text[at:], quote=False)))
        new = "".join(pieces)
        if new == html.escape(text, quote=False) or any(_PATH_LIKE.search(w) for w in text.split() if "_" in w):
            continue
        node.replace_with(BeautifulSoup(new, features="html.parser"))
        changed += 1
    return changed


def slugify(text: str) -> str:
    """A readable anchor: TeX commands and markup dropped, words joined by hyphens."""
    text = re.sub(r"\\([A-Za-z]+)", " ", text)  # \|b_k\| -> b_k ; \mathrm{x} -> x
    text = re.sub(r"[^0-9A-Za-z]+", "-", text.replace("_", "-")).strip("-").lower()
    return re.sub(r"-{2,}", "-", text) or "section"



# -- what a notebook is about ---------------------------------------------------------------
def paper_section(nb: dict, name: str) -> str | None:
    """The paper section a notebook supports: its metadata first, else the project's table."""
    section = (nb.get("metadata", {}).get("keybias") or {}).get("paper_section")
    return section or PAPER_SECTIONS.get(name)


def called_modules(nb: dict, package_dir: Path = PACKAGE_DIR.parent) -> list[str]:
    """keybias modules the notebook's code imports, as dotted names below `keybias` that exist
    as files (`studies.invariance.measure`, `verdict`)."""
    found: set[str] = set()
    for _, cell in code_cells(nb):
        tree = parse_code(cell_source(cell))
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for full in names:
                parts = full.split(".")
                if parts[0] == "keybias" and len(parts) >= 2:
                    found.add(".".join(parts[1:]))
    found -= {"core.recorder", "core"}  # the recorder is plumbing: the page shows what it records
    return sorted(m for m in found if (package_dir / Path(*m.split("."))).with_suffix(".py").is_file())


def repository_url(root: Path = ROOT) -> str | None:
    """`repository-code` of CITATION.cff, when the project has published one."""
    path = root / "CITATION.cff"
    if not path.is_file():
        return None

    try:
        url = (yaml.safe_load(path.read_text()) or {}).get("repository-code")
    except yaml.YAMLError:
        return None
    return str(url).rstrip("/") if url else None


def module_href(module: str, commit: str | None, repo: str | None) -> str:
    if repo and commit and re.fullmatch(r"[0-9a-f]{40}", commit):
        return f"{repo}/blob/{commit}/src/keybias/{module.replace('.', '/')}.py"
    return f"{SOURCE_PREFIX}/{module.replace('.', '/')}.py"


def current_commit(root: Path = ROOT) -> dict:
    return commit_info(root)

# -- the paper's figures ------------------------------------------------------------------
def paper_figures(paper: Path = ROOT / "paper") -> dict[str, dict]:
    """Each figure the paper includes, by file stem: its number (order of appearance, as
    LaTeX numbers them), label and section; read from main.tex and the files it inputs."""
    main = Path(paper) / "main.tex"
    if not main.is_file():
        return {}
    token = re.compile(r"\\input\{([^}]+)\}|\\section\*?\{((?:[^{}]|\{[^{}]*\})*)\}|\\begin\{figure\*?\}"
                       r"|\\includegraphics(?:\[[^\]]*\])?\{([^}]+)\}|\\label\{([^}]+)\}")
    found: dict[str, dict] = {}
    state = {"number": 0, "section": None, "pending": []}

    def walk(path: Path, depth: int = 0):
        if depth > 5 or not path.is_file():
            return
        text = re.sub(r"(?<!\\)%.*", "", path.read_text(errors="replace"))
        for match in token.finditer(text):
            included, section, graphic, label = match.group(1), match.group(2), match.group(3), match.group(4)
            if included is not None:
                if included.startswith("sections/") or not included.startswith(".."):
                    target = paper / (included if included.endswith(".tex") else included + ".tex")
                    walk(target, depth + 1)
            elif section is not None:
                state["section"] = {"title": re.sub(r"\\[A-Za-z]+\{([^}]*)\}", r"\1", section).replace("\\", ""),
                                    "label": None}
            elif match.group(0).startswith("\\begin{figure"):
                state["number"] += 1
                state["pending"] = []
            elif graphic is not None and state["number"]:
                stem = Path(graphic).stem
                if stem not in found:
                    found[stem] = {"number": state["number"], "label": None, "section": state["section"]}
                    state["pending"].append(stem)
            elif label is not None:
                if label.startswith("fig:"):
                    for stem in state["pending"]:
                        found[stem]["label"] = label
                elif state["section"] is not None and state["section"]["label"] is None:
                    state["section"]["label"] = label

    walk(main)
    return found


def number_text(value, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if number == int(number) and abs(number) < 1e15:
        return f"{int(number):,}"
    text = f"{number:.{digits}g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        return f"{mantissa}\u00d710<sup>{int(exponent)}</sup>"
    return text


def claim_line(claim: dict) -> str:
    """`value ≤ bound` for a claim, numbers formatted for reading (HTML)."""
    sign = COMPARISON_SIGNS.get(claim.get("comparison", "<="), html.escape(str(claim.get("comparison"))))
    value, bound = claim.get("value"), claim.get("bound")
    digits = 3
    # a value that differs from its bound is printed with the digits that show the difference
    # (0.5004 > 0.5, not "0.5 > 0.5")
    try:
        while digits < 12 and float(value) != float(bound) and number_text(value, digits) == number_text(bound, digits):
            digits += 1
    except (TypeError, ValueError):
        digits = 3
    return f"{number_text(value, digits)} {sign} {number_text(bound, digits)}"


def claims_box(claims: list[dict], findings: dict[str, dict] | None = None) -> str:
    """The claims a cell judges, each with its anchor, statement, value, bound and kind, and
    the finding it decides, linked to its card on the entry page."""
    e = html.escape
    items = []
    findings = findings or {}
    for c in claims:
        verdict = "holds" if c.get("holds") else "FAILS"
        finding = findings.get(c.get("finding") or "")
        decides = (f' <a class="kb-claim-finding" href="{INDEX_HREF}#finding-{e(finding["id"])}">decides: '
                   f'{e(finding.get("title", finding["id"]))}</a>' if finding else "")
        items.append(
            f'<li id="claim-{e(c["id"])}" class="kb-claim kb-{"holds" if c.get("holds") else "fails"}">'
            f'<span class="kb-claim-statement">{e(c.get("statement", ""))}</span> '
            f'<span class="kb-claim-check">{claim_line(c)}: {verdict}</span> '
            f'<span class="kb-claim-kind" title="{e(KIND_MEANING.get(c.get("kind") or "", ""))}">'
            f'{e(kind_name(c.get("kind")))}</span> '
            f'<a class="kb-claim-id" href="#claim-{e(c["id"])}" aria-label="Link to this claim">\u00b6</a>{decides}</li>')
    noun = "claim" if len(claims) == 1 else "claims"
    bad = sum(not c.get("holds") for c in claims)
    state = ("it holds" if len(claims) == 1 else "all hold") if not bad else f"{bad} {'FAILS' if bad == 1 else 'FAIL'}"
    if len(claims) > CLAIMS_SHOWN:  # a long list is folded under its count, open where one fails
        return (f'<aside class="kb-claims" aria-label="Claims judged here"><details{" open" if bad else ""}>'
                f'<summary class="kb-claims-title">Judged here: {len(claims)} {noun}, {state}</summary>'
                f"<ul>{''.join(items)}</ul></details></aside>")
    return (f'<aside class="kb-claims" aria-label="Claims judged here"><p class="kb-claims-title">'
            f"Judged here ({len(claims)} {noun}; {state})</p><ul>{''.join(items)}</ul></aside>")


def findings_html(claims: list[dict], findings: list[dict] | None = None, name: str = "") -> str:
    """The closing section: the findings this notebook measures, as the paper states them (with
    their numbers, from the findings registry), and where its claims are judged; the claims
    themselves stand at their cells, not repeated here."""
    e = html.escape
    mine = [f for f in (findings or []) if f.get("notebook") == name]
    parts = ['<section class="kb-findings" id="what-we-found"><h2>What we found</h2>']
    for f in mine:
        parts.append(f'<p><strong>{e(f.get("title", f["id"]))}.</strong> {e(f.get("statement") or "")} '
                     f'<a href="{INDEX_HREF}#finding-{e(f["id"])}">This finding on the entry page</a>.</p>')
    failing = [c for c in claims if not c.get("holds")]
    if claims:
        first = claims[0]["id"]
        counts = kind_counts(claims)
        if failing:
            state = (f'<strong class="kb-fails">{len(failing)} FAIL</strong>: '
                     + ", ".join(f'<a href="#claim-{e(c["id"])}">{e(c["id"])}</a>' for c in failing))
        else:
            state = "it holds" if len(claims) == 1 else ("both hold" if len(claims) == 2 else "every one holds")
        parts.append(f'<p>This page judges {counts}, each at the cell that computes it '
                     f'(<a href="#claim-{e(first)}">the first</a>); {state}. '
                     f'<a href="{INDEX_HREF}#claims">All claims, by finding</a>.</p>')
    elif not mine:
        parts.append("<p>This notebook tests no claim; the paper prints the numbers it computes.</p>")
    parts.append("</section>")
    return "".join(parts)


def neighbours(name: str, names: list[str]) -> tuple[str | None, str | None]:
    if name not in names:
        return None, None
    i = names.index(name)
    return (names[i - 1] if i > 0 else None), (names[i + 1] if i + 1 < len(names) else None)


def notebook_title(nb: dict, name: str) -> str:
    """The first markdown heading, without its number prefix and TeX; else the name."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            match = re.search(r"^#\s+(.+)$", cell_source(cell), re.MULTILINE)
            if match:
                title = re.sub(r"^\d+\s*[·.:-]\s*", "", match.group(1)).strip()
                return re.sub(r"\$([^$]*)\$", lambda m: re.sub(r"\\([A-Za-z]+)|[{}\\]", r"\1", m.group(1)), title)
    return name


# -- the page ------------------------------------------------------------------------------
DEVICE_WORDS = {"cpu": "a CPU", "cuda": "a GPU", "mps": "an Apple GPU"}


def parameter_label(notebook: str, name: str) -> str:
    """What a parameter is, in words: the help text its study declares for it, else its name
    with spaces (a reader of the page does not pass it to papermill, so `adam_eps` tells little)."""

    try:
        text = spec_for(notebook).get(name).help
    except (ParameterError, ImportError, AttributeError):
        text = ""
    # the label is the help text's lead; its bracketed or after-semicolon detail is for the CLI
    text = re.split(r" \(|;", (text or name.replace("_", " ")).strip())[0]
    return text[:1].upper() + text[1:]


def parameter_value(source: str) -> str:
    """A parameter's value as a person writes it: lists as "0, 1", strings without quotes."""
    try:
        value = ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return source
    if isinstance(value, (list, tuple)):
        return ", ".join(parameter_value(repr(v)) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def header_html(*, name, title, section, profile, device, commit, dirty, modules, repo, parameters,
                 previous, following, titles: dict[str, str] | None = None,
                 findings: list[dict] | None = None) -> str:
    """The page's head: title, what it is, and, before any code or provenance, what this section
    finds (`findings`: the records of results/findings.json whose notebook is this one)."""
    e = html.escape
    found = [f for f in (findings or []) if f.get("notebook") == name and f.get("statement")]
    # the first screen says what the section finds, phone included; the code and settings follow
    lead = ("" if not found else '<div class="kb-lead"><p><strong>What this section finds.</strong></p><ul>'
            + "".join(f'<li><strong>{prose_html(f.get("title", ""))}.</strong> {prose_html(f["statement"])}</li>'
                      for f in found) + "</ul></div>")
    short = (commit or "unknown")[:12]
    if repo and commit and re.fullmatch(r"[0-9a-f]{40}", commit):
        commit_html = f'<a href="{e(repo)}/tree/{e(commit)}"><code>{e(short)}</code></a>'
    else:
        commit_html = f"<code>{e(short)}</code>"
    if dirty:
        commit_html += " plus local changes"
    section_html = (f"It is a section of the paper, <em>{e(section)}</em>, with its code." if section
                    else "It holds the code behind the paper's numbers.")
    links = ", ".join(
        f'<a href="{e(module_href(m, commit, repo))}"><code>keybias.{e(m)}</code></a>' for m in modules
    ) or "none"
    shown = {k: v for k, v in parameters.items() if k not in HIDDEN_PARAMETERS}
    params_html = ""
    if shown:
        # the code name stays, small, for whoever reruns the notebook with papermill -p
        rows = "".join(f'<tr><th scope="row">{e(parameter_label(name, k))} <code class="kb-param-name">{e(k)}</code></th>'
                       f"<td>{e(parameter_value(v))}</td></tr>" for k, v in shown.items())
        what = "The parameter" if len(shown) == 1 else f"The {len(shown)} parameters"
        params_html = (f"<details><summary>{what} it ran with</summary>"
                       f'<table class="kb-params">{rows}</table></details>')
    where = DEVICE_WORDS.get(str(device).lower(), str(device))
    # the modules are for a reader who wants the code: folded, like the code cells
    calls = (f'<details class="kb-calls"><summary>The library code it calls</summary><p>{links}.</p></details>'
             if modules else "")
    return (
        f'<header class="kb-header">'
        f'{_pager_html(previous, following, "kb-pager-top", titles)}'
        f'<h1 class="kb-title">{e(title)}</h1>'
        f"{lead}"
        f'<p>{section_html} <a href="{e(name)}.ipynb">The executed notebook</a>.</p>'
        f'<div class="kb-runwith">Computed at commit {commit_html} on {e(where)}'
        + ("" if profile in ("paper", "", None) else
           f", at the small sizes of the <code>{e(profile)}</code> profile, not the paper's")
        + f".{params_html}</div>"
        f"{calls}"
        f'<nav class="kb-toc" aria-label="Contents"></nav>'
        f"</header>"
    )


def _pager_html(previous: str | None, following: str | None, css: str,
                titles: dict[str, str] | None = None) -> str:
    """Links to the entry page, the paper and the notebooks on either side, each named by its
    title (a reader does not know what "08_longrun" holds)."""
    e = html.escape
    titles = titles or {}
    parts = [f'<a href="{INDEX_HREF}">&uarr; All results</a>', f'<a href="{PAPER_HREF}">The paper (PDF)</a>']
    if previous:
        parts.insert(0, f'<a rel="prev" href="{e(previous)}.html">&larr; {e(titles.get(previous, previous))}</a>')
    if following:
        parts.append(f'<a rel="next" href="{e(following)}.html">{e(titles.get(following, following))} &rarr;</a>')
    return f'<nav class="kb-pager {css}" aria-label="Notebooks">{" &middot; ".join(parts)}</nav>'


def _png_css_width(src: str) -> int | None:
    """The CSS width at which an embedded PNG prints at its drawn size: its pixel width times
    96 / its dpi (a 150-dpi figure of 6.3 in shows 605 px wide, 1.56 pixels per CSS pixel)."""

    if not src.startswith("data:image/png;base64,"):
        return None
    try:
        data = base64.b64decode(src.split(",", 1)[1][:4096])
    except ValueError:
        return None
    return png_css_width(data)


def png_css_width(data: bytes) -> int | None:
    """`_png_css_width` of a PNG's first bytes."""

    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    width = struct.unpack(">I", data[16:20])[0]
    at = data.find(b"pHYs")
    if at < 0:
        return None
    per_metre, _, unit = struct.unpack(">IIB", data[at + 4:at + 13])
    if unit != 1 or per_metre <= 0:
        return None
    dpi = per_metre * 0.0254
    return round(width * 96 / dpi) if dpi > 96 else None


def _display_math(tex: str) -> str:
    return tex if tex.lstrip().startswith("\\begin") else f"$${tex}$$"


def _heading_text(heading) -> str:
    return "".join(s for s in heading.find_all(string=True)
                   if not (s.parent.name == "a" and "anchor-link" in (s.parent.get("class") or []))).strip()


def _code_caption(holder):
    """The caption a figure's code displayed right after it: the next output of the same cell when it
    is one paragraph in italics. Returns (that output's node, the <em>), or None."""
    child = holder.find_parent(class_="jp-OutputArea-child")
    following = child.find_next_sibling(class_="jp-OutputArea-child") if child is not None else None
    markdown = following.find(class_="jp-RenderedMarkdown") if following is not None else None
    if markdown is None:
        return None
    blocks = [c for c in markdown.children if getattr(c, "name", None)]
    if len(blocks) != 1 or blocks[0].name != "p":
        return None
    inner = [c for c in blocks[0].contents if not (isinstance(c, str) and not c.strip())]
    if len(inner) == 1 and getattr(inner[0], "name", None) == "em":
        return following, inner[0]
    return None


def finish_page(page: str, *, header: str, name: str, claims: list[dict], judged: dict[str, int],
                 equations: dict[int, list[str]], kept: list[int], table_csv: dict[int, str],
                 figures: dict[str, dict], previous: str | None, following: str | None,
                 findings: list[dict] | None = None, titles: dict[str, str] | None = None) -> str:
    """Everything nbconvert does not do: header, anchors, captions, claim boxes, tables, findings,
    code folded under a "Code" toggle."""


    findings = list(findings or [])
    finding_by_id = {f["id"]: f for f in findings}
    finding_by_figure = {f["figure"]: f for f in findings if f.get("figure")}
    owner = {cid: f["id"] for f in findings for cid in f.get("decided_by", [])}
    claims = [c if c.get("finding") or c["id"] not in owner else {**c, "finding": owner[c["id"]]} for c in claims]

    soup = BeautifulSoup(page, features="html.parser")
    main = soup.find("main") or soup.body

    pages = paper_pages(ROOT)  # LaTeX labels and their pages, once the paper has been built

    def fragment(markup: str):
        return BeautifulSoup(markup, features="html.parser")

    # cells: readable ids (cell-<index in the notebook>)
    cell_nodes = {}
    for node in soup.select("div.jp-Cell"):
        ident = node.get("id", "")
        match = re.fullmatch(r"cell-id=kb-(\d+)", ident)
        if match:
            node["id"] = f"cell-{match.group(1)}"
            cell_nodes[int(match.group(1))] = node

    def after_cell(index: int, markup: str):
        before = [i for i in kept if i <= index and i in cell_nodes]
        if before:
            cell_nodes[before[-1]].insert_after(fragment(markup))
        else:
            main.insert(0, fragment(markup))

    for index in sorted(equations, reverse=True):
        blocks = "".join(f'<div class="kb-equation">{html.escape(_display_math(tex))}</div>' for tex in equations[index])
        after_cell(index, blocks)
    by_cell: dict[int, list[dict]] = {}
    for claim in claims:
        if claim["id"] in judged:
            by_cell.setdefault(judged[claim["id"]], []).append(claim)
    for index in sorted(by_cell, reverse=True):
        after_cell(index, claims_box(by_cell[index], finding_by_id))

    # headings: slugs without TeX, unique on the page
    used = {"what-we-found"}
    for heading in soup.select(".jp-MarkdownCell h1, .jp-MarkdownCell h2, .jp-MarkdownCell h3, .jp-MarkdownCell h4"):
        base = slugify(_heading_text(heading))
        slug, n = base, 2
        while slug in used:
            slug, n = f"{base}-{n}", n + 1
        used.add(slug)
        heading["id"] = slug
        for link in heading.find_all("a", class_="anchor-link"):
            link["href"] = f"#{slug}"

    # figures: numbered captions with anchors
    number = 0
    for holder in soup.select(".jp-RenderedImage, .jp-RenderedSVG"):
        img = holder.find("img")
        if img is None:
            continue
        number += 1
        stem = holder.get("data-kb-figure") or ""
        anchor = f"fig-{slugify(stem)}" if stem else f"fig-{number}"
        paper = figures.get(stem) if stem else None
        e = html.escape
        extra = []
        if paper:
            where = pages.get(paper.get("label") or "")
            extra.append(f'<a href="{PAPER_HREF}#page={where["page"]}">Figure {paper["number"]} in the paper</a>' if where
                         else f"Figure {paper['number']} in the paper")
        if stem:
            extra.append(f'<a href="../figures/{e(stem)}.png">PNG</a>')
            extra.append(f'<a href="../figures/{e(stem)}.pdf">PDF</a>')
        finding = finding_by_figure.get(stem)
        # the caption says what to see: a caption the figure's own code wrote (an italic paragraph
        # displayed right after the image, moved into the caption), else the finding's sentence, with
        # the numbers the code computed; the alt text describes the picture and is not repeated
        written = _code_caption(holder)
        if written is not None:
            output, em = written
            said = em.decode_contents()
            if finding:
                said += (f' This figure shows the finding <a href="{INDEX_HREF}#finding-{e(finding["id"])}">'
                         f'{e(finding.get("title") or finding["id"])}</a>.')
            output.decompose()
        elif finding and finding.get("statement"):
            said = (f'{e(finding.get("statement") or "")} <a href="{INDEX_HREF}#finding-{e(finding["id"])}">'
                    f"The finding</a>.")
        else:  # no finding shows this figure: the sentence its code wrote
            said = e(img.get("alt", "").removeprefix("Figure: "))
        caption = (f'<figcaption><a class="kb-fig-number" href="#{anchor}">Figure {number}.</a> {said}'
                   + (f' <span class="kb-fig-links">({" &middot; ".join(extra)})</span>' if extra else "")
                   + "</figcaption>")
        width = _png_css_width(img.get("src", ""))
        if width and not img.get("width"):
            img["width"] = str(width)
        figure = soup.new_tag("figure", attrs={"class": "kb-figure", "id": anchor})
        img.wrap(figure)
        figure.append(fragment(caption))

    # tables: wrap, numbers formatted, long ones trimmed with a link to the CSV
    for table in soup.select(".jp-RenderedHTML table"):
        tidy_table_html(table, soup)  # a show_table table is only labelled for phones
        holder = table.find_parent(class_="jp-OutputArea-output")
        index = None
        cell_div = table.find_parent("div", class_="jp-Cell")
        if cell_div is not None and re.fullmatch(r"cell-\d+", cell_div.get("id", "")):
            index = int(cell_div["id"].split("-")[1])
        csv = table_csv.get(index) if index is not None else None
        body = table.find("tbody")
        rows = body.find_all("tr", recursive=False) if body else []
        elided = [r for r in rows if all(c.get_text().strip() in ("...", "\u2026") for c in r.find_all(["td", "th"]))]
        note = None
        if csv and (elided or len(rows) > TABLE_ROWS_MAX):
            for row in elided:
                row.decompose()
            rows = [r for r in rows if r not in elided]
            for row in rows[TABLE_ROWS_SHOWN:]:
                row.decompose()
            note = (f'<p class="kb-trimmed">The first {min(len(rows), TABLE_ROWS_SHOWN)} rows; every row is in '
                    f'<a href="../data/{html.escape(csv)}.csv">the CSV file</a>.</p>')
        elif elided:
            for row in elided:
                row.decompose()
            note = '<p class="kb-trimmed">Rows in the middle of this table are left out.</p>'
        wrapper = soup.new_tag("div", attrs={"class": "kb-table"})
        table.wrap(wrapper)
        if note:
            wrapper.insert_after(fragment(note))
        if holder is not None:
            holder["class"] = [*(holder.get("class") or []), "kb-has-table"]

    # header, contents, findings, pager
    header_node = fragment(header).header
    main.insert(0, header_node)
    toc = header_node.find("nav", class_="kb-toc")
    toc.append(fragment("<h2>Contents</h2>"))
    listing = soup.new_tag("ol")
    for heading in soup.select(".jp-MarkdownCell h1, .jp-MarkdownCell h2, .jp-MarkdownCell h3, .jp-MarkdownCell h4"):
        if heading.name == "h1" and heading.find_parent("div", class_="jp-Cell") is not None and not listing.contents:
            continue  # the notebook's title is the page's title
        item = soup.new_tag("li", attrs={"class": f"kb-toc-level-{heading.name[1]}"})
        link = soup.new_tag("a", href=f"#{heading['id']}")
        link.string = _heading_text(heading)
        item.append(link)
        listing.append(item)
    item = soup.new_tag("li", attrs={"class": "kb-toc-level-2"})
    link = soup.new_tag("a", href="#what-we-found")
    link.string = "What we found"
    item.append(link)
    listing.append(item)
    toc.append(listing)
    # the notebook's own first h1 repeats the header's title
    first = soup.select_one(".jp-MarkdownCell h1")
    if first is not None and slugify(_heading_text(first)).endswith(slugify(header_node.h1.get_text())):
        first.decompose()
    # code folded: each code cell's input under a "Code" toggle, its outputs in view
    for cell in soup.select("div.jp-CodeCell"):
        wrapper = cell.find("div", class_="jp-Cell-inputWrapper")
        if wrapper is None:
            continue
        fold = soup.new_tag("details", attrs={"class": "kb-code"})
        summary = soup.new_tag("summary")
        summary.string = "Code"
        wrapper.wrap(fold)
        fold.insert(0, summary)
    main.append(fragment(findings_html(claims, findings, name)))
    main.append(fragment(_pager_html(previous, following, "kb-pager-bottom", titles)))
    # links to the paper open it at this notebook's section (its first finding's), once it is built
    section = next((pages.get(f.get("section") or "") for f in findings if f.get("notebook") == name
                    and pages.get(f.get("section") or "")), None)
    if section:
        for link in soup.find_all("a", href=PAPER_HREF):
            link["href"] = f"{PAPER_HREF}#page={section['page']}"
            link.string = f"The paper, section {section['number']} (page {section['page']})"
    subscript_prose(soup)
    return str(soup)

