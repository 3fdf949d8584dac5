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
executed notebook in DIR/notebooks (no kernel needed), or list their output problems.
"""

from __future__ import annotations

import argparse
import ast
import html
import json
import logging
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


# -- the page ------------------------------------------------------------------------------
def _header_html(*, name, section, profile, device, commit, dirty, modules, repo) -> str:
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
    return (
        f'<header class="kb-header">'
        f'<p><a href="{INDEX_HREF}">&larr; All results</a> &middot; '
        f'<a href="{PAPER_HREF}">the paper (PDF)</a></p>'
        f"<p>Notebook <code>notebooks/{e(name)}.ipynb</code> supports {section_html}.</p>"
        f"<p>Run with profile <code>{e(profile)}</code> on device <code>{e(device)}</code>, "
        f"commit {commit_html}.</p>"
        f"<p>Code it calls: {links}.</p>"
        f'<nav class="kb-toc" aria-label="Contents"></nav>'
        f"</header>"
    )


def _insert_navigation(page: str, header: str) -> str:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page, features="html.parser")
    main = soup.find("main") or soup.body
    header_node = BeautifulSoup(header, features="html.parser").header
    main.insert(0, header_node)
    toc = header_node.find("nav", class_="kb-toc")
    title = soup.new_tag("h2")
    title.string = "Contents"
    toc.append(title)
    listing = soup.new_tag("ol")
    for heading in soup.select(".jp-MarkdownCell h1, .jp-MarkdownCell h2, .jp-MarkdownCell h3, "
                               ".jp-MarkdownCell h4"):
        if not heading.get("id"):
            continue
        item = soup.new_tag("li", attrs={"class": f"kb-toc-level-{heading.name[1]}"})
        link = soup.new_tag("a", href=f"#{heading['id']}")
        # the heading's text without nbconvert's pilcrow anchor link
        link.string = "".join(
            s for s in heading.find_all(string=True) if not (s.parent.name == "a" and "anchor-link" in (s.parent.get("class") or []))
        ).strip()
        item.append(link)
        listing.append(item)
    toc.append(listing)
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
) -> str:
    """The offline HTML page of one executed notebook, given as nbformat JSON text.

    `figures_alt` is the step record's map from figure name to alt text; `commit`/`dirty`
    default to the working tree's (the pipeline renders right after running the notebook).
    The page expects the shared MathJax copy that `publish_assets` writes next to it.
    """
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.reads(text, as_version=4)
    raw = json.loads(text)
    if commit is None:
        info = current_commit()
        commit, dirty = info["commit"], info["dirty"] if dirty is None else dirty
    clean_outputs(nb, name)
    add_alt_text(nb, figures_alt)
    exporter = HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATES)])
    resources = {"keybias": {"mathjax_src": MATHJAX_SRC, "mathjax_fonts": MATHJAX_FONTS}}
    page, _ = exporter.from_notebook_node(nb, resources=resources)
    header = _header_html(
        name=name,
        section=paper_section(raw, name),
        profile=profile,
        device=device,
        commit=commit,
        dirty=bool(dirty),
        modules=called_modules(raw),
        repo=repository_url(),
    )
    return _insert_navigation(page, header)


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
        print(f"rendered {len(pages)} notebooks; pages + shared MathJax: "
              f"{rendered_size(args.results) / 1e6:.2f} MB")
        return 0
    found = check_results(args.results)
    report = format_problems(found)
    print(report or "no stderr, warning, progress, error, docstring or repr outputs")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
