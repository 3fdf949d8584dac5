"""Rendered notebooks a reader can read offline: the nbconvert and asset glue, and the entry points.

`render_notebook_html` turns one executed notebook into a page that fetches nothing from the
network: nbconvert's lab template minus its CDN scripts (require.js, widgets, mermaid), and
MathJax 3 from ONE shared copy, `<results>/notebooks/_static/mathjax/`, that
`publish_assets` copies there from the vendored package in `keybias/pipeline/assets/mathjax`
(version and checksums in its SOURCE.md). nbconvert's lab stylesheet (its index.css and light
theme, 256 kB) is likewise ONE shared file, `<results>/notebooks/_static/nbconvert/lab-light.css`,
that every page links to instead of inlining it. Pages refer to both by relative paths, so the
results folder can be moved, archived or opened from file:// and still typeset its math.

The layers it joins live beside it: `render_clean` (outputs a reader should not see: stderr,
progress bars; alt text; the per-cell problem list), `render_cells` (which code cells and
statements are plumbing to hide, outputs rewritten for reading, the cell judging each claim)
and `render_page` (header with the "Run with" box, navigation, contents, anchors, figure
captions, claim boxes, "What we found"). Their public names are importable from here too.

Command line: `python -m keybias.pipeline.render [--results DIR] {render,check}`: re-render every
executed notebook in DIR/notebooks and DIR/index.html (no kernel needed), or list their output
problems.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from pathlib import Path

import nbformat
from bs4 import BeautifulSoup

from keybias.core.recorder import atomic_write_bytes, atomic_write_text
from keybias.pipeline.index import load_findings, site_commit, write_index
from keybias.pipeline.render_cells import (
    claim_cells,
    displayed_csv,
    injected_parameters,
    reader_cells,
    reader_output,
)
from keybias.pipeline.render_clean import (
    DOCSTRING_MIN_CHARS,
    IMAGE_MIMES,
    PACKAGE_DIR,
    add_alt_text,
    cell_source,
    check_results,
    clean_outputs,
    format_problems,
    has_progress,
    is_progress,
    keybias_docstrings,
    output_problems,
    terminal_text,
)
from keybias.pipeline.render_page import (
    ROOT,
    called_modules,
    claim_line,
    claims_box,
    current_commit,
    findings_html,
    finish_page,
    header_html,
    module_href,
    neighbours,
    notebook_title,
    number_text,
    paper_figures,
    paper_section,
    repository_url,
    slugify,
)

__all__ = [
    "DOCSTRING_MIN_CHARS", "IMAGE_MIMES", "MATHJAX_FONTS", "MATHJAX_SOURCE", "MATHJAX_SRC", "MATHJAX_VERSION",
    "NOTEBOOK_CSS", "STATIC_DIR", "add_alt_text", "asset_files", "called_modules", "check_results", "claim_cells", "claim_line",
    "claims_box", "clean_outputs", "external_references", "findings_html", "format_problems", "has_progress",
    "injected_parameters", "is_progress", "kernel_startup", "keybias_docstrings", "main", "module_href",
    "notebook_css", "notebook_title", "number_text", "output_problems", "paper_figures", "paper_section", "publish_assets",
    "reader_cells", "reader_output", "render_inputs", "render_notebook_html", "render_results", "rendered_size",
    "repository_url", "slugify", "terminal_text",
]

MATHJAX_VERSION = "3.2.2"
MATHJAX_SOURCE = PACKAGE_DIR / "assets" / "mathjax"
TEMPLATES = PACKAGE_DIR / "assets" / "nbconvert"
TEMPLATE_NAME = "keybias"
# the code that shapes a page, for the build key of the rendered pages
RENDER_MODULES = ("render.py", "render_clean.py", "render_cells.py", "render_page.py")
KERNEL_STARTUP = TEMPLATES / "startup.py"  # pandas display options for every notebook kernel
STATIC_DIR = "_static"
# Relative to the page (results/notebooks/NN_x.html); MathJax finds its fonts relative to itself.
MATHJAX_SRC = f"{STATIC_DIR}/mathjax/tex-chtml-full.js"
MATHJAX_FONTS = f"{STATIC_DIR}/mathjax/output/chtml/fonts/woff-v2"
# nbconvert's lab stylesheet, as its template would inline it in every page, once for all pages
NOTEBOOK_CSS = f"{STATIC_DIR}/nbconvert/lab-light.css"
NOTEBOOK_CSS_PARTS = ("static/index.css", "static/theme-light.css")
# an SVG key, inline: a page loads nothing for its icon
FAVICON = ("data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E"
           "%3Crect width='16' height='16' rx='3' fill='%23264653'/%3E%3Ctext x='8' y='12.5' font-size='11' "
           "font-family='sans-serif' text-anchor='middle' fill='white'%3Eb%3C/text%3E%3C/svg%3E")


def _exporter():
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATES)])


def notebook_css() -> str:
    """nbconvert's lab stylesheet, the text its template would inline in every page (static
    index.css, then the light theme), from the installed nbconvert."""
    env = _exporter().environment
    return "\n".join(env.loader.get_source(env, name)[0] for name in NOTEBOOK_CSS_PARTS)


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
    findings: list[dict] | None = None,
) -> str:
    """The offline HTML page of one executed notebook, given as nbformat JSON text.

    `figures_alt` is the step record's map from figure name to alt text; `claims` its claims
    (each gets an anchor `#claim-<id>` under the cell that judges it, and the page ends with
    them as "What we found"); `notebooks` the names in reading order, for previous/next links
    (default: notebooks/*.ipynb of the project); `findings` the records of results/findings.json
    (the closing "What we found" states this notebook's findings, figure captions theirs);
    `commit`/`dirty` default to the working
    tree's (the pipeline renders right after running the notebook). The page expects the
    shared MathJax copy and stylesheet that `publish_assets` writes next to it.
    """
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
        csv = displayed_csv(cell_source(raw["cells"][index]))
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
    exporter = _exporter()
    title = notebook_title(raw, name)
    resources = {"keybias": {"mathjax_src": MATHJAX_SRC, "mathjax_fonts": MATHJAX_FONTS, "favicon": FAVICON,
                             "notebook_css": NOTEBOOK_CSS},
                 "metadata": {"name": f"{name}: {title}"}}
    page, _ = exporter.from_notebook_node(nb, resources=resources)
    previous, following = neighbours(name, notebooks)
    titles = neighbour_titles([n for n in (previous, following) if n])
    header = header_html(
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
        titles=titles,
        findings=findings,
    )
    return finish_page(page, header=header, name=name, claims=claims, judged=judged, equations=equations,
                        kept=kept, table_csv=table_csv, figures=figures, previous=previous, following=following,
                        findings=findings, titles=titles)


def neighbour_titles(names: list[str], folder: Path = ROOT / "notebooks") -> dict[str, str]:
    """Each named notebook's title, from its source (a missing or unreadable one keeps its name)."""
    titles = {}
    for name in names:
        try:
            titles[name] = notebook_title(json.loads((folder / f"{name}.ipynb").read_text()), name)
        except (OSError, json.JSONDecodeError):
            titles[name] = name
    return titles


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
    return [*(PACKAGE_DIR / name for name in RENDER_MODULES), *templates, MATHJAX_SOURCE / "SOURCE.md"]


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
    """Copy the shared MathJax into `<results>/notebooks/_static/mathjax/` and write the shared
    stylesheet `NOTEBOOK_CSS`; return what changed.

    Idempotent and atomic per file: an unchanged file is not rewritten, and files that are
    not part of the vendored copy are removed, so the mathjax folder is exactly the vendored one.
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
    css, css_path = notebook_css().encode(), Path(results) / "notebooks" / NOTEBOOK_CSS
    if not (css_path.is_file() and css_path.read_bytes() == css):
        atomic_write_bytes(css_path, css)
        changed.append(css_path)
    return changed


def render_results(results: Path) -> list[Path]:
    """Re-render every executed notebook in `<results>/notebooks` and publish the assets.

    Profile, device and figure alt texts come from each notebook's step record, so a re-render
    describes the run that produced the outputs, not the current checkout. Every page names one
    commit, the results' own (provenance.json, as the entry page does); a notebook whose inputs did
    not change since an earlier commit was not rerun, and its outputs are those of this commit.
    """

    results = Path(results)
    publish_assets(results)
    provenance = {}
    if (results / "provenance.json").is_file():
        provenance = json.loads((results / "provenance.json").read_text())
    findings = load_findings(results)
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
            commit=site_commit(provenance) if provenance else prov.get("commit", "unknown"),
            dirty=provenance.get("dirty", prov.get("dirty", False)),
            claims=step.get("claims"),
            notebooks=names,
            paper_figure_numbers=figures,
            findings=findings,
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
    parser = argparse.ArgumentParser(prog="python -m keybias.pipeline.render", description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("command", choices=["render", "check"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[keybias.pipeline.render] %(message)s")
    if args.command == "render":
        pages = render_results(args.results)
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
