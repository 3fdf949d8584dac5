"""Rendered notebooks a reader can read offline: local math, clean outputs, navigation.

`render_notebook_html` turns one executed notebook into a page that fetches nothing from the
network: nbconvert's lab template minus its CDN scripts (require.js, widgets, mermaid), and
MathJax 3 from ONE shared copy, `<results>/notebooks/_static/mathjax/`, that
`publish_assets` copies there from the vendored package in `keybias/build/assets/mathjax`
(version and checksums in its SOURCE.md). Pages refer to it by a relative path, so the results
folder can be moved, archived or opened from file:// and still typeset its math.

Each page opens with a header: the paper section the notebook supports, profile, device and
commit, links to the keybias modules its code imports (at that commit when CITATION.cff names
the repository, else relative paths into the bundle) and back to `../index.html`, and a
table of contents from the markdown headings.

Outputs are cleaned for the reader, never silently: progress-bar fragments and stderr streams
are left out of the HTML (the executed .ipynb keeps them and the build log has them) and
logged; figures get alt text from, in order, the output's own metadata, the `alt` given to
`rec.figure` (the step record's `figures_alt`, or a literal `alt=` in the cell), and else the
first sentence of the markdown cell that introduces them. `output_problems` lists, per cell,
what an executed notebook should not contain at all (stderr, warnings, progress bars, errors,
dumped docstrings, huge or path reprs, figures saved but not shown), so each notebook's owner
can fix the source.

Command line: `python -m keybias.build.render [--results DIR] {render,check}`: re-render every
executed notebook in DIR/notebooks and DIR/index.html (no kernel needed), or list their output
problems.
"""

from __future__ import annotations

import argparse
import ast
import html
import json
import logging
import os
import re
import sys
from pathlib import Path

from keybias.build.recorder import atomic_write_bytes, atomic_write_text

ROOT = Path(__file__).resolve().parents[3]
PACKAGE_DIR = Path(__file__).resolve().parent
MATHJAX_VERSION = "3.2.2"
MATHJAX_SOURCE = PACKAGE_DIR / "assets" / "mathjax"
TEMPLATES = PACKAGE_DIR / "assets" / "nbconvert"
TEMPLATE_NAME = "keybias"
KERNEL_STARTUP = TEMPLATES / "startup.py"  # pandas display options for every notebook kernel
STATIC_DIR = "_static"
# Relative to the page (results/notebooks/NN_x.html); MathJax finds its fonts relative to itself.
MATHJAX_SRC = f"{STATIC_DIR}/mathjax/tex-chtml-full.js"
MATHJAX_FONTS = f"{STATIC_DIR}/mathjax/output/chtml/fonts/woff-v2"
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
}

IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
# A tqdm bar: "desc:  42%|████▏     | 42/100 [00:01<00:02, 31.2it/s]" and its pieces.
_PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+/\d+|\d+(?:\.\d+)?(?:it/s|s/it)\]|\[\d\d:\d\d<")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_WARNING = re.compile(r"\b\w*(?:Warning|Error)\b:|^warning:", re.MULTILINE | re.IGNORECASE)
_PATH_REPR = re.compile(r"\b(?:Posix|Windows)?Path\('|<[\w.]+ object at 0x[0-9a-f]+>")
HUGE_TEXT_CHARS = 2500  # a plain-text output longer than this is a dump, not a result
DOCSTRING_MIN_CHARS = 200  # shorter docstrings are one-liners a notebook may legitimately print

log = logging.getLogger("keybias.build.render")


# -- what a notebook is about ---------------------------------------------------------------
def paper_section(nb: dict, name: str) -> str | None:
    """The paper section a notebook supports: its metadata first, else the project's table."""
    section = (nb.get("metadata", {}).get("keybias") or {}).get("paper_section")
    return section or PAPER_SECTIONS.get(name)


def _code_cells(nb: dict):
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "code":
            yield index, cell


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _parse(source: str) -> ast.Module | None:
    # IPython magics and shell escapes are not Python; blank them so the rest still parses.
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def called_modules(nb: dict, package_dir: Path = PACKAGE_DIR.parent) -> list[str]:
    """keybias modules the notebook's code imports, as dotted names below `keybias` that exist
    as files (`studies.invariance.measure`, `verdict`)."""
    found: set[str] = set()
    for _, cell in _code_cells(nb):
        tree = _parse(_source(cell))
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
    return sorted(m for m in found if (package_dir / Path(*m.split("."))).with_suffix(".py").is_file())


def repository_url(root: Path = ROOT) -> str | None:
    """`repository-code` of CITATION.cff, when the project has published one."""
    path = root / "CITATION.cff"
    if not path.is_file():
        return None
    import yaml

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
    from keybias.build.provenance import commit_info

    return commit_info(root)


# -- cleaning outputs -----------------------------------------------------------------------
def terminal_text(text: str) -> str:
    """What a terminal would show: ANSI codes dropped, each line cut to its last carriage return."""
    text = _ANSI.sub("", text)
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def is_progress(text: str) -> bool:
    """True for a stream chunk that is only progress-bar output (tqdm and the like)."""
    raw = _ANSI.sub("", text)
    if "\r" in raw and not terminal_text(raw).strip():
        return True  # a bar cleared by spaces and cursor moves
    lines = [line for line in terminal_text(raw).splitlines() if line.strip()]
    return bool(lines) and all(_PROGRESS.search(line) for line in lines)


def _stream_text(output: dict) -> str:
    text = output.get("text", "")
    return "".join(text) if isinstance(text, list) else text


def _plain_text(output: dict) -> str:
    data = output.get("data", {}).get("text/plain", "")
    return "".join(data) if isinstance(data, list) else data


def keybias_docstrings(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Module, class and function docstrings of the package, whitespace-normalised."""
    found = []
    for path in sorted(package_dir.glob("*.py")):
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = " ".join((ast.get_docstring(node) or "").split())
                if len(doc) >= DOCSTRING_MIN_CHARS:
                    found.append(doc)
    return found


def has_progress(text: str) -> bool:
    """True when any line of the text, read as a terminal would, is a progress bar."""
    pieces = re.split(r"[\r\n]", _ANSI.sub("", text))
    return any(_PROGRESS.search(piece) for piece in pieces)


def _output_boxes(cell: dict):
    """(first output number, output_type, stream name, text) as a reader sees the outputs:
    consecutive stream outputs of one name form one box, as Jupyter displays them."""
    boxes: list[list] = []
    for number, output in enumerate(cell.get("outputs", [])):
        kind = output.get("output_type")
        if kind == "stream":
            name, text = output.get("name"), _stream_text(output)
            if boxes and boxes[-1][1] == "stream" and boxes[-1][2] == name:
                boxes[-1][3] += text
            else:
                boxes.append([number, kind, name, text])
        elif kind == "error":
            boxes.append([number, kind, None, f"{output.get('ename')}: {output.get('evalue')}"])
        else:
            plain_only = set(output.get("data", {})) <= {"text/plain"}
            boxes.append([number, kind, None, _plain_text(output) if plain_only else ""])
    return boxes


def output_problems(nb: dict, docstrings: list[str] | None = None) -> list[dict]:
    """Every output box an executed notebook should not contain, one dict per (cell, kind).

    Kinds: `stderr` (any stderr stream), `progress` (progress-bar fragments), `warning`
    (a Python warning printed anywhere), `error` (an error output), `docstring` (a keybias
    docstring printed as text), `huge` (a plain-text output over HUGE_TEXT_CHARS characters),
    `path_repr` (a repr of paths or objects, e.g. the tuple `rec.figure` returns),
    `figure_not_shown` (a cell saves a figure with `rec.figure` but displays no image, so the
    reader never sees it next to the code that made it).
    """
    docstrings = keybias_docstrings() if docstrings is None else docstrings
    problems = []
    for index, cell in _code_cells(nb):
        for number, kind, name, text in _output_boxes(cell):
            kinds: list[str] = []
            shown = terminal_text(text)
            if kind == "error":
                kinds.append("error")
            if name == "stderr":
                kinds.append("stderr")
            if kind == "stream" and has_progress(text):
                kinds.append("progress")
            warning = _WARNING.search(shown) if kind != "error" else None
            if warning:
                kinds.append("warning")
            flat = " ".join(text.split())
            if flat and any(doc in flat for doc in docstrings):
                kinds.append("docstring")
            elif len(text) > HUGE_TEXT_CHARS and not {"stderr", "progress"} & set(kinds):
                kinds.append("huge")
            if kind not in ("stream", "error") and _PATH_REPR.search(text):
                kinds.append("path_repr")
            # show the warning's own line when there is one: it names the culprit
            line_start = shown.rfind("\n", 0, warning.start()) + 1 if warning else 0
            excerpt = " ".join(shown[line_start:].split())[:160]
            problems += [{"cell": index, "output": number, "kind": k, "excerpt": excerpt} for k in kinds]
        calls = _figure_calls(_source(cell))
        images = sum(1 for o in cell.get("outputs", []) if set(o.get("data", {})) & set(IMAGE_MIMES))
        if len(calls) > images:
            missing = [name for name, _ in calls[images:]]
            problems.append({"cell": index, "output": None, "kind": "figure_not_shown",
                             "excerpt": f"rec.figure {missing} saved but not displayed in the notebook"})
    return problems


def check_results(results: Path) -> dict[str, list[dict]]:
    """`output_problems` of every executed notebook under `<results>/notebooks`."""
    docstrings = keybias_docstrings()
    return {
        path.stem: output_problems(json.loads(path.read_text()), docstrings)
        for path in sorted((Path(results) / "notebooks").glob("*.ipynb"))
    }


def format_problems(found: dict[str, list[dict]]) -> str:
    lines = []
    for name, problems in found.items():
        for p in problems:
            where = f"cell {p['cell']}" + ("" if p["output"] is None else f" output {p['output']}")
            lines.append(f"{name}: {where}: {p['kind']}: {p['excerpt']}")
    return "\n".join(lines)


# -- alt text -------------------------------------------------------------------------------
def _figure_calls(source: str) -> list[tuple[str | None, str | None]]:
    """(name, literal alt) of each `<recorder>.figure(fig, name, alt=...)` call, in order."""
    tree = _parse(source)
    if tree is None:
        return []
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "figure":
            args = list(node.args)
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            name_node = args[1] if len(args) > 1 else keywords.get("name")
            alt_node = args[2] if len(args) > 2 else keywords.get("alt")

            def literal(n):
                return n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None

            calls.append((literal(name_node), literal(alt_node), getattr(node, "lineno", 0), node.col_offset))
    calls.sort(key=lambda c: (c[2], c[3]))
    return [(name, alt) for name, alt, _, _ in calls]


def _first_sentence(markdown: str) -> str:
    prose = [line for line in markdown.splitlines() if not line.lstrip().startswith("#")]
    text = re.sub(r"\*\*|`", "", "\n".join(prose) or markdown.lstrip("# "))
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = " ".join(text.split())
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    sentence = (match.group(1) if match else text)[:300]
    # alt text is read aloud, not typeset: TeX becomes its words
    sentence = re.sub(r"\\([A-Za-z]+)", r"\1", sentence.replace("$", ""))
    return re.sub(r"[{}]|\\[,;! ]", "", sentence)


def _existing_alt(output: dict, mime: str) -> str | None:
    meta = output.get("metadata") or {}
    alt = (meta.get(mime) or {}).get("alt") if isinstance(meta.get(mime), dict) else None
    return alt or meta.get("alt")


def add_alt_text(nb: dict, figures_alt: dict[str, str] | None = None) -> list[dict]:
    """Give every image output an alt text, in place; return where each one came from.

    Sources, best first: the output's own metadata (`Image(..., alt=...)`), the alt given to
    the `rec.figure(fig, name, alt=...)` call in the same cell (the step record's
    `figures_alt`, or a literal in the source), the first sentence of the markdown cell that
    introduces the figure. The n-th image of a cell is matched to its n-th `figure` call.
    """
    figures_alt = figures_alt or {}
    report = []
    last_markdown = ""
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "markdown":
            last_markdown = _source(cell)
            continue
        if cell.get("cell_type") != "code":
            continue
        calls = _figure_calls(_source(cell))
        image_number = 0
        for output in cell.get("outputs", []):
            mimes = [m for m in IMAGE_MIMES if m in output.get("data", {})]
            if not mimes:
                continue
            call = calls[image_number] if image_number < len(calls) else (None, None)
            image_number += 1
            alt, source = _existing_alt(output, mimes[0]), "output metadata"
            if not alt and call[0] in figures_alt:
                alt, source = figures_alt[call[0]], f"rec.figure {call[0]!r}"
            if not alt and call[1]:
                alt, source = call[1], f"rec.figure {call[0]!r} (source)"
            if not alt and last_markdown.strip():
                alt, source = "Figure: " + _first_sentence(last_markdown), "preceding markdown"
            if not alt:
                alt, source = f"Figure in cell {index}", "none"
            metadata = output.setdefault("metadata", {})
            for mime in mimes:
                entry = metadata.get(mime) if isinstance(metadata.get(mime), dict) else {}
                metadata[mime] = {**entry, "alt": alt}
            if call[0]:
                metadata["kb_figure"] = call[0]
            report.append({"cell": index, "figure": call[0], "alt": alt, "source": source})
    return report


def clean_outputs(nb: dict, name: str = "") -> list[dict]:
    """Drop stderr streams and progress-bar fragments, in place; return what was dropped.

    Called on a copy for the HTML only: the executed .ipynb keeps every output, and the
    build log has the kernel's stream output, so nothing is lost, and `output_problems`
    still reports each one to the notebook's owner.
    """
    dropped = []
    for index, cell in _code_cells(nb):
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                text = _stream_text(output)
                if output.get("name") == "stderr" or is_progress(text):
                    dropped.append({"cell": index, "stream": output.get("name"),
                                    "excerpt": " ".join(terminal_text(text).split())[:120]})
                    continue
                if "\r" in text or "\x1b" in text:
                    output = {**output, "text": terminal_text(text)}
            kept.append(output)
        cell["outputs"] = kept
    if dropped:
        cells = sorted({item["cell"] for item in dropped})
        first = next((i["excerpt"] for i in dropped if i["excerpt"]), "")
        log.warning("%s: %d stderr/progress outputs of cells %s left out of the HTML (kept in the "
                    ".ipynb; `python -m keybias.build.render check` lists them), first: %s",
                    name, len(dropped), cells, first)
    return dropped


# -- the reader's view: plumbing hidden, outputs for reading, anchors, findings --------------
PLUMBING_TAGS = ("parameters", "injected-parameters", "kb-hide")
HIDDEN_PARAMETERS = ("output_dir", "results_dir", "profile", "device")
TABLE_ROWS_SHOWN = 25  # a longer table is trimmed to this many rows, with a link to its CSV
TABLE_ROWS_MAX = 40
COMPARISON_SIGNS = {"<=": "\u2264", ">=": "\u2265", "==": "=", "<": "<", ">": ">", "!=": "\u2260"}
_SERIES_FOOTER = re.compile(r"^(?:Name: .*, )?(?:Length: \d+, )?dtype: \w+$")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?$")
_INT = re.compile(r"^[-+]?\d+$")
# an SVG key, inline: a page loads nothing for its icon
FAVICON = ("data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E"
           "%3Crect width='16' height='16' rx='3' fill='%23264653'/%3E%3Ctext x='8' y='12.5' font-size='11' "
           "font-family='sans-serif' text-anchor='middle' fill='white'%3Eb%3C/text%3E%3C/svg%3E")


def slugify(text: str) -> str:
    """A readable anchor: TeX commands and markup dropped, words joined by hyphens."""
    text = re.sub(r"\\([A-Za-z]+)", " ", text)  # \|b_k\| -> b_k ; \mathrm{x} -> x
    text = re.sub(r"[^0-9A-Za-z]+", "-", text.replace("_", "-")).strip("-").lower()
    return re.sub(r"-{2,}", "-", text) or "section"


def _recorder_names(nb: dict) -> set[str]:
    names = {"rec"}
    for _, cell in _code_cells(nb):
        tree = _parse(_source(cell))
        for node in ast.walk(tree) if tree else []:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == "Recorder":
                    names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _calls_recorder(node: ast.AST, names: set[str], helpers: set[str]) -> bool:
    """`rec.anything(...)` (possibly chained), or a call of a helper that only records."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in helpers
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id in names and isinstance(node.func, ast.Attribute)


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _bound(node: ast.AST) -> set[str]:
    """Names a statement binds for the code after it (a loop's own variable does not count)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.For):
        return set().union(*(_bound(s) for s in node.body)) if node.body else set()
    return set()


def _mentions_claims(node: ast.AST, recorded: set[str], names: set[str]) -> bool:
    """True when an expression shows the claims bookkeeping (rec.claims, step['claims'], x_claims)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and ("claim" in n.id.lower() or n.id in recorded or n.id in names):
            return True
        if isinstance(n, ast.Attribute) and "claim" in n.attr.lower():
            return True
        if isinstance(n, ast.Constant) and n.value in ("claims", "claim_id"):
            return True
    return False


def _records(stmt: ast.stmt, names: set[str], helpers: set[str], recorded: set[str]) -> bool:
    """True for a statement that only records (or shows what was recorded), computing nothing."""
    if isinstance(stmt, ast.Expr):
        value = stmt.value
        if _calls_recorder(value, names, helpers):
            return True
        if isinstance(value, ast.Constant):
            return False
        # a display of the claims just recorded: the page's claim boxes say it for the reader
        return _mentions_claims(value, recorded, names)
    if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
        return _calls_recorder(stmt.value, names, helpers)
    if isinstance(stmt, ast.For) and not stmt.orelse:
        return all(_records(s, names, helpers, recorded) for s in stmt.body)
    if isinstance(stmt, ast.FunctionDef):
        body = [s for s in stmt.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if body and all(_records(s, names, helpers, recorded) for s in body):
            helpers.add(stmt.name)
            return True
    return False


def _saves_figure(stmt: ast.AST) -> bool:
    """The code that makes a figure or judges a claim stays visible even though only
    `rec.figure` / `rec.claims_from` reads what it computed."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in ("figure", "claim", "claims_from") for n in ast.walk(stmt))


def _equation_tex(call: ast.Call, literals: dict[str, str]) -> str | None:
    if not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        return literals.get(arg.id)
    return None


def reader_cells(nb: dict) -> list[dict]:
    """How each cell is shown to a reader, one dict per cell (None for markdown).

    `hide`: the whole cell goes (a parameter cell, a cell tagged `kb-hide`, or code whose
    every statement records: `rec.*` calls, `x = rec.finish()`, loops over `rec.macro`, helpers
    that only record, displays of the claims just recorded). `source`: the code shown, with
    the recording statements of a mixed cell left out (unless a statement kept uses a name they
    bind). `drop_result`: the cell's execute_result is a recording call's return value or a
    claims display. `equations`: TeX of `rec.equation` calls, typeset under the cell when the
    cell does not show the math itself.
    """
    names = _recorder_names(nb)
    helpers: set[str] = set()
    cells = nb.get("cells", [])
    plan: list[dict | None] = []
    parsed = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            parsed.append(None)
            continue
        source = _source(cell)
        parsed.append((source, _parse(source)))
    # names loaded by any cell: a recording statement binding one of them stays
    for index, cell in enumerate(cells):
        if parsed[index] is None:
            plan.append(None)
            continue
        source, tree = parsed[index]
        tags = set(cell.get("metadata", {}).get("tags", []))
        entry = {"hide": False, "source": source, "drop_result": False, "drop_displays": False, "equations": []}
        plan.append(entry)
        if tags & set(PLUMBING_TAGS):
            entry["hide"] = True
            continue
        if tree is None or not tree.body:
            continue
        recorded: set[str] = set()
        removed = []
        for stmt in tree.body:
            if _records(stmt, names, helpers, recorded):
                removed.append(stmt)
                # a name bound to what was recorded (`step = rec.finish()`) shows bookkeeping
                value = getattr(stmt, "value", None)
                if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                        and value.func.attr in ("finish", "claims_from", "claim", "claims")):
                    recorded |= _bound(stmt)
        if not removed:
            continue
        kept = [s for s in tree.body if s not in removed]
        used_later = set().union(*(_loaded(s) for s in kept)) if kept else set()
        for later in parsed[index + 1:]:
            if later and later[1] is not None:
                used_later |= _loaded(later[1])
        removed = [s for s in removed if not (_bound(s) - {"_"}) & used_later]
        # a TeX string only handed to rec.equation goes with it
        literals = {t.id: s.value.value for s in tree.body if isinstance(s, ast.Assign)
                    and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                    for t in s.targets if isinstance(t, ast.Name)}
        for stmt in removed:
            for node in ast.walk(stmt):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "equation" and _calls_recorder(node, names, helpers)):
                    tex = _equation_tex(node, literals)
                    if tex:
                        entry["equations"].append(tex)
        # an assignment whose names only the removed statements read (a TeX string for
        # rec.equation, a count for a macro) goes with them; later cells may not read it either
        later_loads = set()
        for later in parsed[index + 1:]:
            if later and later[1] is not None:
                later_loads |= _loaded(later[1])
        changed = True
        while changed:
            changed = False
            kept = [s for s in tree.body if s not in removed]
            for stmt in kept:
                others = set().union(*(_loaded(s) for s in kept if s is not stmt)) | later_loads
                names_bound = _bound(stmt) - {"_"}
                if (isinstance(stmt, ast.Assign) and names_bound and not names_bound & others
                        and any(names_bound & _loaded(r) for r in removed)
                        and not any(names_bound & _loaded(r) for r in removed if _saves_figure(r))):
                    removed.append(stmt)
                    changed = True
        kept = [s for s in tree.body if s not in removed]

        def shows(stmt):
            return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("display", "print")
                       for n in ast.walk(stmt))

        if any(shows(s) for s in removed) and not any(shows(s) for s in kept):
            entry["drop_displays"] = True
        if removed and tree.body[-1] in removed:
            entry["drop_result"] = True
        if not kept:
            entry["hide"] = True
            continue
        lines = source.splitlines()
        drop = set()
        for stmt in removed:
            start = stmt.lineno - 1
            # comment lines right above a removed statement belong to it
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            drop |= set(range(start, stmt.end_lineno))
        shown = [line for number, line in enumerate(lines) if number not in drop]
        entry["source"] = re.sub(r"\n{3,}", "\n\n", "\n".join(shown)).strip("\n")
    return plan


def _literal(text: str):
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return _MISSING


_MISSING = object()


def _html_table(header: list[str] | None, rows: list[list]) -> str:
    e = html.escape
    head = "<thead><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in header) + "</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{e(_format_cell(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table class="dataframe">{head}<tbody>{body}</tbody></table>'


def _format_cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _series_table(text: str) -> str | None:
    """A pandas Series printout (`value_counts` and the like) as a two-column table."""
    lines = [line for line in text.rstrip().splitlines() if line.strip()]
    if len(lines) < 2 or not _SERIES_FOOTER.match(lines[-1].strip()):
        return None
    footer = lines[-1]
    name = re.match(r"Name: (.*?), ", footer)
    body = lines[:-1]
    index_name = None
    if body and len(body[0].split()) == 1 and not _NUMBER.match(body[0].strip()):
        index_name, body = body[0].strip(), body[1:]
    rows = []
    for line in body:
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            return None
        rows.append([parts[0].strip(), parts[1]])
    return _html_table([index_name or "", name.group(1) if name else "value"], rows)


def reader_output(output: dict) -> dict | None:
    """An output as a reader should see it: None to leave it out, else the output (maybe
    rewritten). Raw scalar reprs (`'1.00'`, `2900`) and empty DataFrames go; a Series printout
    or a list of tuples becomes a table."""
    if output.get("output_type") != "execute_result":
        return output
    data = output.get("data", {})
    if set(data) - {"text/plain"}:
        plain = _plain_text(output)
        if plain.startswith("Empty DataFrame"):
            return None
        return output
    text = _plain_text(output)
    if text.startswith("Empty DataFrame"):
        return None
    table = _series_table(text)
    if table is None:
        value = _literal(text)
        if value is _MISSING:
            return output
        if isinstance(value, str | int | float | bool | bytes) or value is None:
            return None
        if isinstance(value, list | tuple) and value and all(isinstance(v, tuple) for v in value):
            width = len(value[0])
            if all(len(v) == width for v in value):
                table = _html_table(None, [list(v) for v in value])
        if table is None:
            return output
    return {**output, "data": {"text/html": table, "text/plain": text}}


def claim_cells(nb: dict, claims: list[dict]) -> dict[str, int]:
    """The cell that judges each claim: the first cell at or after the previous claim's that
    records claims (`.claim(`/`.claims_from(`) and names the id in its code or outputs;
    a claim named nowhere goes with the one recorded before it. Claims come in recording order."""
    recording, texts = [], {}
    for index, cell in _code_cells(nb):
        source = _source(cell)
        if re.search(r"\.claims?(?:_from)?\(", source):
            recording.append(index)
            outputs = [_stream_text(o) if o.get("output_type") == "stream"
                       else "".join(str(v) if isinstance(v, str) else "".join(v) for k, v in o.get("data", {}).items()
                                    if k.startswith("text/")) for o in cell.get("outputs", [])]
            texts[index] = source + "\n".join(outputs)
    if not recording:
        last = [i for i, _ in _code_cells(nb)]
        return {c["id"]: last[-1] for c in claims} if last else {}
    found, current = {}, recording[0]
    for claim in claims:
        hit = next((i for i in recording if i >= current and claim["id"] in texts[i]), None)
        current = hit if hit is not None else current
        found[claim["id"]] = current
    return found


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


def _table_csv(source: str) -> str | None:
    """The CSV of the table a cell displays: its last expression is (a selection of) a frame
    the cell also wrote with `rec.csv(frame, name)`."""
    tree = _parse(source)
    if tree is None or not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return None
    written = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "csv"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            written[node.args[0].id] = node.args[1].value
    node = tree.body[-1].value
    while isinstance(node, ast.Subscript | ast.Attribute | ast.Call):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return written.get(node.id) if isinstance(node, ast.Name) else None


def injected_parameters(nb: dict) -> dict[str, str]:
    """The parameters papermill injected (name -> source text of the value), in order."""
    for cell in nb.get("cells", []):
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            source = _source(cell)
            tree = _parse(source)
            if tree is None:
                return {}
            return {t.id: ast.get_source_segment(source, s.value) or "" for s in tree.body
                    if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
    return {}


def number_text(value) -> str:
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
    text = f"{number:.3g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        return f"{mantissa}\u00d710<sup>{int(exponent)}</sup>"
    return text


def claim_line(claim: dict) -> str:
    """`value ≤ bound` for a claim, numbers formatted for reading (HTML)."""
    sign = COMPARISON_SIGNS.get(claim.get("comparison", "<="), html.escape(str(claim.get("comparison"))))
    return f"{number_text(claim.get('value'))} {sign} {number_text(claim.get('bound'))}"


def claims_box(claims: list[dict]) -> str:
    """The claims a cell judges, each with its anchor, statement, value, bound and kind."""
    e = html.escape
    items = []
    for c in claims:
        verdict = "holds" if c.get("holds") else "FAILS"
        items.append(
            f'<li id="claim-{e(c["id"])}" class="kb-claim kb-{"holds" if c.get("holds") else "fails"}">'
            f'<span class="kb-claim-statement">{e(c.get("statement", ""))}</span> '
            f'<span class="kb-claim-check">{claim_line(c)}: {verdict}</span> '
            f'<span class="kb-claim-kind">{e(c.get("kind") or "")}</span> '
            f'<a class="kb-claim-id" href="#claim-{e(c["id"])}"><code>{e(c["id"])}</code></a></li>')
    noun = "claim" if len(claims) == 1 else "claims"
    return (f'<aside class="kb-claims" aria-label="Claims judged here"><p class="kb-claims-title">'
            f"Judged here ({len(claims)} {noun})</p><ul>{''.join(items)}</ul></aside>")


def findings_html(claims: list[dict]) -> str:
    """The closing section: what this notebook found, in its claims' own sentences."""
    e = html.escape
    if not claims:
        return ('<section class="kb-findings" id="what-we-found"><h2>What we found</h2>'
                "<p>This notebook records no claims; its numbers feed the paper through macros.</p></section>")
    tests = [c for c in claims if c.get("kind") == "test"]
    others = [c for c in claims if c.get("kind") != "test"]
    failing = [c for c in claims if not c.get("holds")]

    def item(c):
        return (f'<li><span class="kb-claim-statement">{e(c.get("statement", ""))}</span> '
                f'<span class="kb-claim-check">({claim_line(c)}{"" if c.get("holds") else ": FAILS"})</span> '
                f'<a href="#claim-{e(c["id"])}">where it is judged</a></li>')

    parts = ['<section class="kb-findings" id="what-we-found"><h2>What we found</h2>']
    if tests:
        lead = ("Every test below could have failed on plausible data; each holds."
                if not failing else f"{len(failing)} of the claims below FAIL.")
        parts.append(f"<p>{lead}</p><ul>{''.join(item(c) for c in tests)}</ul>")
    if others:
        words = {"consistency": "cross-checks of the bookkeeping", "implied": "consequences of the tests above",
                 "proof": "exact symbolic identities"}
        kinds = sorted({c.get("kind") or "other" for c in others})
        label = "; ".join(words.get(k, k) for k in kinds)
        parts.append(f"<details><summary>{len(others)} more: {e(label)}</summary>"
                     f"<ul>{''.join(item(c) for c in others)}</ul></details>")
    parts.append("</section>")
    return "".join(parts)


def _neighbours(name: str, names: list[str]) -> tuple[str | None, str | None]:
    if name not in names:
        return None, None
    i = names.index(name)
    return (names[i - 1] if i > 0 else None), (names[i + 1] if i + 1 < len(names) else None)


def notebook_title(nb: dict, name: str) -> str:
    """The first markdown heading, without its number prefix and TeX; else the name."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            match = re.search(r"^#\s+(.+)$", _source(cell), re.MULTILINE)
            if match:
                title = re.sub(r"^\d+\s*[·.:-]\s*", "", match.group(1)).strip()
                return re.sub(r"\$([^$]*)\$", lambda m: re.sub(r"\\([A-Za-z]+)|[{}\\]", r"\1", m.group(1)), title)
    return name


# -- the page ------------------------------------------------------------------------------
def _header_html(*, name, title, section, profile, device, commit, dirty, modules, repo, parameters,
                 previous, following) -> str:
    e = html.escape
    short = (commit or "unknown")[:12]
    if repo and commit and re.fullmatch(r"[0-9a-f]{40}", commit):
        commit_html = f'<a href="{e(repo)}/tree/{e(commit)}"><code>{e(short)}</code></a>'
    else:
        commit_html = f"<code>{e(short)}</code>"
    if dirty:
        commit_html += " (with uncommitted changes)"
    section_html = (f"the paper section <em>{e(section)}</em>" if section
                    else "no section of the paper named in its metadata")
    links = ", ".join(
        f'<a href="{e(module_href(m, commit, repo))}"><code>keybias.{e(m)}</code></a>' for m in modules
    ) or "none"
    shown = {k: v for k, v in parameters.items() if k not in HIDDEN_PARAMETERS}
    params_html = ""
    if shown:
        rows = "".join(f"<tr><th><code>{e(k)}</code></th><td><code>{e(v)}</code></td></tr>" for k, v in shown.items())
        params_html = (f"<details><summary>{len(shown)} parameters of profile <code>{e(profile)}</code></summary>"
                       f'<table class="kb-params">{rows}</table></details>')
    return (
        f'<header class="kb-header">'
        f'{_pager_html(previous, following, "kb-pager-top")}'
        f'<h1 class="kb-title">{e(title)}</h1>'
        f"<p>Notebook <code>notebooks/{e(name)}.ipynb</code> supports {section_html}.</p>"
        f'<div class="kb-runwith"><strong>Run with</strong> profile <code>{e(profile)}</code> '
        f"&middot; device <code>{e(device)}</code> &middot; commit {commit_html}{params_html}</div>"
        f"<p>Code it calls: {links}.</p>"
        f'<nav class="kb-toc" aria-label="Contents"></nav>'
        f"</header>"
    )


def _pager_html(previous: str | None, following: str | None, css: str) -> str:
    e = html.escape
    parts = [f'<a href="{INDEX_HREF}">&uarr; All results</a>', f'<a href="{PAPER_HREF}">The paper (PDF)</a>']
    if previous:
        parts.insert(0, f'<a rel="prev" href="{e(previous)}.html">&larr; {e(previous)}</a>')
    if following:
        parts.append(f'<a rel="next" href="{e(following)}.html">{e(following)} &rarr;</a>')
    return f'<nav class="kb-pager {css}" aria-label="Notebooks">{" &middot; ".join(parts)}</nav>'


def _display_math(tex: str) -> str:
    return tex if tex.lstrip().startswith("\\begin") else f"$${tex}$$"


def _heading_text(heading) -> str:
    return "".join(s for s in heading.find_all(string=True)
                   if not (s.parent.name == "a" and "anchor-link" in (s.parent.get("class") or []))).strip()


def _finish_page(page: str, *, header: str, name: str, claims: list[dict], judged: dict[str, int],
                 equations: dict[int, list[str]], kept: list[int], table_csv: dict[int, str],
                 figures: dict[str, dict], previous: str | None, following: str | None) -> str:
    """Everything nbconvert does not do: header, anchors, captions, claim boxes, tables, findings."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page, features="html.parser")
    main = soup.find("main") or soup.body

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
        after_cell(index, claims_box(by_cell[index]))

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
            extra.append(f"Figure {paper['number']} in the paper")
        if stem:
            extra.append(f'<a href="../figures/{e(stem)}.png">PNG</a>')
            extra.append(f'<a href="../figures/{e(stem)}.pdf">PDF</a>')
        caption = (f'<figcaption><a class="kb-fig-number" href="#{anchor}">Figure {number}.</a> '
                   f"{e(img.get('alt', '').removeprefix('Figure: '))}"
                   + (f' <span class="kb-fig-links">({" &middot; ".join(extra)})</span>' if extra else "")
                   + "</figcaption>")
        figure = soup.new_tag("figure", attrs={"class": "kb-figure", "id": anchor})
        img.wrap(figure)
        figure.append(fragment(caption))

    # tables: wrap, numbers formatted, long ones trimmed with a link to the CSV
    for table in soup.select(".jp-RenderedHTML table"):
        for cell in table.select("td, th"):
            text = cell.get_text().strip()
            if cell.name == "td" and _NUMBER.match(text):
                cell["class"] = [*(cell.get("class") or []), "kb-num"]
                if not _INT.match(text):
                    cell.string = f"{float(text):.4g}"
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
                    f'<a href="../data/{html.escape(csv)}.csv">data/{html.escape(csv)}.csv</a>.</p>')
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
    main.append(fragment(findings_html(claims)))
    main.append(fragment(_pager_html(previous, following, "kb-pager-bottom")))
    return str(soup)


def render_notebook_html(
    text: str,
    *,
    name: str,
    profile: str,
    device: str,
    figures_alt: dict[str, str] | None = None,
    commit: str | None = None,
    dirty: bool | None = None,
    claims: list[dict] | None = None,
    notebooks: list[str] | None = None,
    paper_figure_numbers: dict[str, dict] | None = None,
) -> str:
    """The offline HTML page of one executed notebook, given as nbformat JSON text.

    `figures_alt` is the step record's map from figure name to alt text; `claims` its claims
    (each gets an anchor `#claim-<id>` under the cell that judges it, and the page ends with
    them as "What we found"); `notebooks` the names in reading order, for previous/next links
    (default: notebooks/*.ipynb of the project); `commit`/`dirty` default to the working
    tree's (the pipeline renders right after running the notebook). The page expects the
    shared MathJax copy that `publish_assets` writes next to it.
    """
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.reads(text, as_version=4)
    raw = json.loads(text)
    if commit is None:
        info = current_commit()
        commit, dirty = info["commit"], info["dirty"] if dirty is None else dirty
    if notebooks is None:
        notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    figures = paper_figures() if paper_figure_numbers is None else paper_figure_numbers
    claims = list(claims or [])
    clean_outputs(nb, name)
    add_alt_text(nb, figures_alt)
    plan = reader_cells(raw)
    judged = claim_cells(raw, claims)
    equations, kept, table_csv, cells = {}, [], {}, []
    for index, (cell, entry) in enumerate(zip(nb.cells, plan, strict=True)):
        cell.id = f"kb-{index}"
        if entry is None:
            kept.append(index)
            cells.append(cell)
            continue
        if entry["equations"] and not any("text/latex" in o.get("data", {}) for o in cell.get("outputs", [])):
            equations[index] = entry["equations"]
        csv = _table_csv(_source(raw["cells"][index]))
        if csv:
            table_csv[index] = csv
        outputs = []
        for output in cell.get("outputs", []):
            if entry["drop_result"] and output.get("output_type") == "execute_result":
                continue
            if (entry["drop_displays"] and output.get("output_type") in ("display_data", "stream")
                    and not set(output.get("data", {})) & set(IMAGE_MIMES)):
                continue
            shown = reader_output(output)
            if shown is not None:
                outputs.append(nbformat.from_dict(shown))
        has_image = any(set(o.get("data", {})) & set(IMAGE_MIMES) for o in outputs)
        if entry["hide"]:
            if not has_image or {"parameters", "injected-parameters"} & set(cell.metadata.get("tags", [])):
                continue
            cell.metadata["kb_hide_input"] = True
        cell.source = entry["source"]
        cell.outputs = outputs
        kept.append(index)
        cells.append(cell)
    nb.cells = cells
    exporter = HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATES)])
    title = notebook_title(raw, name)
    resources = {"keybias": {"mathjax_src": MATHJAX_SRC, "mathjax_fonts": MATHJAX_FONTS, "favicon": FAVICON},
                 "metadata": {"name": f"{name}: {title}"}}
    page, _ = exporter.from_notebook_node(nb, resources=resources)
    previous, following = _neighbours(name, notebooks)
    header = _header_html(
        name=name,
        title=title,
        section=paper_section(raw, name),
        profile=profile,
        device=device,
        commit=commit,
        dirty=bool(dirty),
        modules=called_modules(raw),
        repo=repository_url(),
        parameters=injected_parameters(raw),
        previous=previous,
        following=following,
    )
    return _finish_page(page, header=header, name=name, claims=claims, judged=judged, equations=equations,
                        kept=kept, table_csv=table_csv, figures=figures, previous=previous, following=following)


_REMOTE = re.compile(r"^\s*(?:(?:https?|wss?|ftp):)?//", re.IGNORECASE)
_CSS_URL = re.compile(r"""@import\s+(?:url\()?\s*["']?([^"')\s;]+)|url\(\s*["']?([^"')\s]+)""", re.IGNORECASE)
_JS_REMOTE = re.compile(r"""\b(?:import|fetch|importScripts)\s*\(\s*["'`]((?:https?:)?//[^"'`]+)""")
_FETCHING = {"script": "src", "img": "src", "iframe": "src", "audio": "src", "video": "src",
             "source": "src", "track": "src", "embed": "src", "object": "data", "input": "src"}


def external_references(page: str) -> list[str]:
    """Everything in an HTML page that a browser would fetch from another host.

    Scripts, stylesheets, icons, preloads, images, frames and media with a remote URL, CSS
    `@import`/`url()` and JavaScript `import()`/`fetch()` of a remote URL. Links a reader
    may follow (`<a href>`) are not fetches and are not listed.
    """
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page, features="html.parser")
    found = []
    for tag, attribute in _FETCHING.items():
        for node in soup.find_all(tag):
            for value in [node.get(attribute), *(node.get("srcset") or "").split(",")]:
                if value and _REMOTE.match(value.strip().split(" ")[0]):
                    found.append(f"<{tag} {attribute}={value.strip()}>")
    for node in soup.find_all("link"):
        if node.get("href") and _REMOTE.match(node["href"]):
            found.append(f"<link rel={' '.join(node.get('rel') or [])} href={node['href']}>")
    css = [n.get_text() for n in soup.find_all("style")] + [n["style"] for n in soup.find_all(style=True)]
    for block in css:
        block = re.sub(r"/\*.*?\*/", "", block, flags=re.DOTALL)  # licence comments name URLs
        for match in _CSS_URL.finditer(block):
            url = match.group(1) or match.group(2)
            if _REMOTE.match(url):
                found.append(f"css {url}")
    for node in soup.find_all("script"):
        found += [f"js {url}" for url in _JS_REMOTE.findall(node.get_text())]
    return found


def render_inputs() -> list[Path]:
    """Files whose change changes a rendered page (for a build key): code, templates, MathJax."""
    templates = sorted(p for p in TEMPLATES.rglob("*") if p.is_file())
    return [Path(__file__).resolve(), *templates, MATHJAX_SOURCE / "SOURCE.md"]


def kernel_startup(cwd: Path = ROOT / "notebooks") -> str:
    """PYTHONSTARTUP for the notebook kernels, relative to their working folder when it can be
    (the step records keep it, and an absolute path would name this machine)."""
    try:
        return os.path.relpath(KERNEL_STARTUP, cwd)
    except ValueError:
        return str(KERNEL_STARTUP)


# -- the shared renderer --------------------------------------------------------------------
def asset_files(source: Path = MATHJAX_SOURCE) -> list[Path]:
    """The vendored MathJax files a page may load, relative to the mathjax folder."""
    keep = [Path("tex-chtml-full.js"), Path("LICENSE"), Path("SOURCE.md")]
    keep += sorted(p.relative_to(source) for p in (source / "output").rglob("*.woff"))
    missing = [str(p) for p in keep if not (source / p).is_file()]
    if missing:
        raise FileNotFoundError(f"vendored MathJax incomplete under {source}: missing {missing}")
    return keep


def publish_assets(results: Path, source: Path = MATHJAX_SOURCE) -> list[Path]:
    """Copy the shared MathJax into `<results>/notebooks/_static/mathjax/`; return what changed.

    Idempotent and atomic per file: an unchanged file is not rewritten, and files that are
    not part of the vendored copy are removed, so the folder is exactly the vendored one.
    """
    target = Path(results) / "notebooks" / STATIC_DIR / "mathjax"
    wanted = asset_files(source)
    changed = []
    for rel in wanted:
        data = (source / rel).read_bytes()
        path = target / rel
        if path.is_file() and path.read_bytes() == data:
            continue
        atomic_write_bytes(path, data)
        changed.append(path)
    keep = {target / rel for rel in wanted}
    for path in sorted(target.rglob("*"), reverse=True):
        if path.is_file() and path not in keep:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    return changed


def render_results(results: Path) -> list[Path]:
    """Re-render every executed notebook in `<results>/notebooks` and publish the assets.

    Profile, device, commit and figure alt texts come from each notebook's step record, so a
    re-render describes the run that produced the outputs, not the current checkout.
    """
    results = Path(results)
    publish_assets(results)
    written = []
    names = sorted(p.stem for p in (results / "notebooks").glob("*.ipynb"))
    figures = paper_figures()
    for path in sorted((results / "notebooks").glob("*.ipynb")):
        step_path = results / "steps" / f"{path.stem}.json"
        step = json.loads(step_path.read_text()) if step_path.is_file() else {}
        prov = step.get("provenance", {})
        page = render_notebook_html(
            path.read_text(),
            name=path.stem,
            profile=step.get("profile", "unknown"),
            device=step.get("device", "unknown"),
            figures_alt=step.get("figures_alt"),
            commit=prov.get("commit", "unknown"),
            dirty=prov.get("dirty", False),
            claims=step.get("claims"),
            notebooks=names,
            paper_figure_numbers=figures,
        )
        atomic_write_text(path.with_suffix(".html"), page)
        written.append(path.with_suffix(".html"))
    return written


def rendered_size(results: Path) -> int:
    """Bytes of the rendered pages plus the shared renderer (issue 14 keeps this < 15 MB)."""
    folder = Path(results) / "notebooks"
    pages = sum(p.stat().st_size for p in folder.glob("*.html"))
    return pages + sum(p.stat().st_size for p in (folder / STATIC_DIR).rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keybias.build.render", description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("command", choices=["render", "check"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[keybias.build.render] %(message)s")
    if args.command == "render":
        pages = render_results(args.results)
        from keybias.build.index import write_index

        write_index(args.results)
        print(f"rendered {len(pages)} notebooks; pages + shared MathJax: "
              f"{rendered_size(args.results) / 1e6:.2f} MB")
        return 0
    found = check_results(args.results)
    report = format_problems(found)
    print(report or "no stderr, warning, progress, error, docstring or repr outputs")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
