"""The arXiv source: one tarball that plain `pdflatex` compiles, with nothing else.

arXiv runs (pdf)latex on the top-level file without bibtex and without our `../results`
folder. So the paper's `\\input`s are inlined (recursively) into one `main.tex`, the `.bbl`
made by the last paper build goes next to it, and every figure the paper includes is copied
as PDF into `figures/`. `check_compiles` proves the tarball self-contained by unpacking it in
a scratch folder and running pdflatex alone, twice (references).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from keybias.core.recorder import atomic_write_bytes
from keybias.pipeline.bundle import deterministic_tar_gz

_INPUT = re.compile(r"\\(?:input|include)\{([^}]+)\}")
_GRAPHICS = re.compile(r"(\\includegraphics(?:\[[^\]]*\])?)\{([^}]+)\}")
_GRAPHICSPATH = re.compile(r"\\graphicspath\{(\{[^}]*\})+\}")


class ArxivError(RuntimeError):
    """The arXiv source cannot be made or does not compile; the message says why."""


def _code_part(line: str) -> str:
    """The part of a TeX line before an unescaped %."""
    match = re.search(r"(?<!\\)%", line)
    return line[: match.start()] if match else line


def inline_inputs(path: Path, base: Path, depth: int = 0) -> str:
    """The text of `path` with every `\\input{...}` replaced by the file's text (relative to `base`)."""
    if depth > 20:
        raise ArxivError(f"\\input nesting deeper than 20 at {path}")
    out = []
    for line in path.read_text().splitlines(keepends=True):
        code = _code_part(line)
        if not _INPUT.search(code):
            out.append(line)
            continue

        def replace(match: re.Match) -> str:
            target = (base / match.group(1)).resolve()
            if target.suffix != ".tex":
                target = target.with_name(target.name + ".tex")
            if not target.is_file():
                raise ArxivError(f"{path}: \\input{{{match.group(1)}}} not found at {target}")
            return f"%% inlined from {match.group(1).replace('../', '')}\n" + inline_inputs(target, base, depth + 1).rstrip("\n")

        out.append(_INPUT.sub(replace, code) + line[len(code):])
    return "".join(out)


def _graphics_dirs(text: str, base: Path) -> list[Path]:
    match = _GRAPHICSPATH.search(text)
    dirs = re.findall(r"\{([^{}]*)\}", match.group(0)[len("\\graphicspath"):]) if match else []
    return [(base / d).resolve() for d in dirs] + [base.resolve()]


def source_files(paper: Path) -> dict[str, tuple[bytes, bool]]:
    """{name: (bytes, executable)} of the arXiv source made from `paper/main.tex` and its build."""
    paper = Path(paper)
    text = inline_inputs(paper / "main.tex", paper)
    dirs = _graphics_dirs(text, paper)
    files: dict[str, tuple[bytes, bool]] = {}

    def figure(match: re.Match) -> str:
        name = match.group(2)
        stem = Path(name).stem if Path(name).suffix in {".pdf", ".png"} else Path(name).name
        for folder in dirs:
            candidate = folder / (Path(name).parent / f"{stem}.pdf")
            if candidate.is_file():
                files[f"figures/{stem}.pdf"] = (candidate.read_bytes(), False)
                return f"{match.group(1)}{{figures/{stem}.pdf}}"
        raise ArxivError(f"figure {name!r} has no PDF in {[str(d) for d in dirs]}")

    text = _GRAPHICS.sub(figure, text)
    text = _GRAPHICSPATH.sub(lambda m: "\\graphicspath{{figures/}}", text)
    bbl = paper / "build" / "main.bbl"
    if "\\bibliography{" in text:
        if not bbl.is_file():
            raise ArxivError(f"{bbl} missing: build the paper first (`make paper`)")
        files["main.bbl"] = (bbl.read_bytes(), False)
    # Listings the paper prints from the repository travel with the source.
    def listing(match: re.Match) -> str:
        target = (paper / match.group(2)).resolve()
        if not target.is_file():
            raise ArxivError(f"\\verbatiminput{{{match.group(2)}}} not found at {target}")
        files[f"listings/{target.name}"] = (target.read_bytes(), False)
        return f"{match.group(1)}{{listings/{target.name}}}"

    text = re.sub(r"(\\verbatiminput)\{([^{}]*)\}", listing, text)
    # Links into the artifact bundle (../results/notebooks/...) mean nothing on arXiv: keep the
    # link text, drop the link.
    if re.search(r"\\href\{\.\./[^{}]*\}", text):
        text = re.sub(r"\\href\{\.\./[^{}]*\}", lambda m: "\\keybiasbundlelink", text)
        text = text.replace("\\begin{document}", "\\newcommand{\\keybiasbundlelink}[1]{#1}\n\\begin{document}", 1)
    leftovers = [p for p in re.findall(r"\{([^{}]*)\}", text) if p.startswith(("/", "../"))]
    if leftovers:
        raise ArxivError(f"absolute or ../ paths remain in the source: {sorted(set(leftovers))[:5]}")
    files["main.tex"] = (text.encode(), False)
    return files


def make_arxiv(paper: Path, out: Path, mtime: int) -> Path:
    atomic_write_bytes(out, deterministic_tar_gz(source_files(paper), mtime))
    return out


def check_compiles(tarball: Path) -> Path:
    """Unpack `tarball` in a scratch folder and run pdflatex alone on main.tex; return the PDF."""
    if not shutil.which("pdflatex"):
        raise ArxivError("pdflatex not found: `make tex` installs it")
    scratch = Path(tempfile.mkdtemp(prefix="keybias-arxiv-"))
    with tarfile.open(tarball) as tar:
        tar.extractall(scratch, filter="data")
    for run in (1, 2):
        result = subprocess.run(
            ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", "main.tex"],
            cwd=scratch, capture_output=True, text=True,
        )
        if result.returncode:
            tail = "\n".join(result.stdout.splitlines()[-25:])
            raise ArxivError(f"pdflatex run {run} failed in {scratch} (log: {scratch / 'main.log'}):\n{tail}")
    log = (scratch / "main.log").read_text(errors="replace")
    undefined = re.findall(r"(?:Reference|Citation) `([^']+)' .*undefined", log)
    if undefined:
        raise ArxivError(f"undefined references/citations after two pdflatex runs: {sorted(set(undefined))[:10]}")
    return scratch / "main.pdf"
