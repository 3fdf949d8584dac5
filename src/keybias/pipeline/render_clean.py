"""Notebook cleaning for the rendered pages: what an executed notebook's outputs should not
show, and what a figure is called.

Shared readers of nbformat JSON (`code_cells`, `cell_source`, `parse_code`, `stream_text`,
`plain_text`, `figure_calls`) for the other render modules. `clean_outputs` drops stderr
streams and progress-bar fragments from the copy that becomes HTML (the .ipynb keeps them) and
logs what it dropped; `add_alt_text` gives every image an alt text (output metadata, then the
`alt` given to `rec.figure`, then the first sentence of the markdown that introduces it);
`output_problems` lists, per cell, what an executed notebook should not contain at all, so
each notebook's owner can fix the source (`python -m keybias.pipeline.render check`).
"""

from __future__ import annotations

import ast
import json
import logging
import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
# A tqdm bar: "desc:  42%|████▏     | 42/100 [00:01<00:02, 31.2it/s]" and its pieces.
_PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+/\d+|\d+(?:\.\d+)?(?:it/s|s/it)\]|\[\d\d:\d\d<")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_WARNING = re.compile(r"\b\w*(?:Warning|Error)\b:|^warning:", re.MULTILINE | re.IGNORECASE)
_PATH_REPR = re.compile(r"\b(?:Posix|Windows)?Path\('|<[\w.]+ object at 0x[0-9a-f]+>")
HUGE_TEXT_CHARS = 2500  # a plain-text output longer than this is a dump, not a result
DOCSTRING_MIN_CHARS = 200  # shorter docstrings are one-liners a notebook may legitimately print

log = logging.getLogger("keybias.pipeline.render")


# -- reading a notebook ---------------------------------------------------------------------
def code_cells(nb: dict):
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "code":
            yield index, cell


def cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def parse_code(source: str) -> ast.Module | None:
    # IPython magics and shell escapes are not Python; blank them so the rest still parses.
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def stream_text(output: dict) -> str:
    text = output.get("text", "")
    return "".join(text) if isinstance(text, list) else text


def plain_text(output: dict) -> str:
    data = output.get("data", {}).get("text/plain", "")
    return "".join(data) if isinstance(data, list) else data


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
            name, text = output.get("name"), stream_text(output)
            if boxes and boxes[-1][1] == "stream" and boxes[-1][2] == name:
                boxes[-1][3] += text
            else:
                boxes.append([number, kind, name, text])
        elif kind == "error":
            boxes.append([number, kind, None, f"{output.get('ename')}: {output.get('evalue')}"])
        else:
            plain_only = set(output.get("data", {})) <= {"text/plain"}
            boxes.append([number, kind, None, plain_text(output) if plain_only else ""])
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
    for index, cell in code_cells(nb):
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
        calls = figure_calls(cell_source(cell))
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
def figure_calls(source: str) -> list[tuple[str | None, str | None]]:
    """(name, literal alt) of each `<recorder>.figure(fig, name, alt=...)` call, in order."""
    tree = parse_code(source)
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
            last_markdown = cell_source(cell)
            continue
        if cell.get("cell_type") != "code":
            continue
        calls = figure_calls(cell_source(cell))
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
    for index, cell in code_cells(nb):
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                text = stream_text(output)
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
                    ".ipynb; `python -m keybias.pipeline.render check` lists them), first: %s",
                    name, len(dropped), cells, first)
    return dropped

