"""Every macro the paper uses can be found: the current results define it, and the macro index
names the notebook (or build function) that writes it."""

import json
import re

import pytest

from conftest import ROOT
from keybias.pipeline import claims as C

# Commands of LaTeX and its packages that start with a capital letter (results macros are
# capitalised words, so only these need telling apart).
LATEX_CAPITALISED = {
    "LaTeX", "TeX", "AtBeginDocument", "Big", "Bigg", "Bigl", "Bigr", "Biggl", "Biggr", "Huge", "LARGE", "Large",
    "Delta", "Gamma", "Lambda", "Omega", "Phi", "Pi", "Psi", "Sigma", "Theta", "Upsilon", "Xi",
    "Pr", "Re", "Im", "Rightarrow", "Leftarrow", "Leftrightarrow", "Longrightarrow", "Vert",
    "DeclareRobustCommand", "DeclareMathOperator", "DeclareGraphicsExtensions",
    "AtBeginEnvironment", "ExplSyntaxOn", "ExplSyntaxOff", "NewDocumentCommand",
}
PAPER_DEFINES = re.compile(r"\\(?:newcommand|renewcommand|providecommand|DeclareRobustCommand|DeclareMathOperator"
                           r"|NewDocumentCommand|edef|def)"
                           r"\*?\{?\\([A-Za-z]+)")


def paper_sources():
    return sorted(ROOT.glob("paper/**/*.tex"))


def used_macros(sources, root=ROOT) -> dict[str, str]:
    """{capitalised command used in the paper: first file using it}, less the paper's own."""
    used, own = {}, set()
    for tex in sources:
        text = re.sub(r"(?<!\\)%.*", "", tex.read_text())  # comments are not typeset
        own |= set(PAPER_DEFINES.findall(text))
        for name in re.findall(r"\\([A-Z][A-Za-z]*)", text):
            used.setdefault(name, str(tex.relative_to(root)))
    return {name: where for name, where in used.items() if name not in own | LATEX_CAPITALISED}


def missing_macros(sources, index, root=ROOT) -> dict[str, str]:
    """{macro the sources use that the results' macro index lacks: first file using it}."""
    return {name: where for name, where in used_macros(sources, root).items() if name not in index}


def test_every_macro_the_paper_uses_is_defined_by_the_current_results():
    missing = missing_macros(paper_sources(), C.macro_index(ROOT / "results"))
    assert not missing, f"macros the paper uses that results/macros does not define: {missing}"


def test_a_renamed_macro_is_caught(tmp_path):
    """The check the paper test runs (`missing_macros`) fails on a name no results file defines (a
    rename, a typo), and passes over the paper's own commands, LaTeX's and comments."""
    (tmp_path / "paper").mkdir()
    tex = tmp_path / "paper" / "x.tex"
    tex.write_text("\\newcommand{\\Own}{1}\\Own{} \\textbf{a} \\LaTeX{} \\SymGridSizes{} \\SymGridSize{} % \\Hidden\n")
    missing = missing_macros([tex], C.macro_index(ROOT / "results"), root=tmp_path)
    assert missing == {"SymGridSize": "paper/x.tex"}


def test_macro_index_names_the_notebook_and_refuses_duplicates(tmp_path):
    macros = tmp_path / "macros"
    macros.mkdir()
    (macros / "01_symbolic.tex").write_text("% x\n\\newcommand{\\SymA}{1}\n\\newcommand{\\SymB}{2}\n")
    (macros / "claims.tex").write_text("\\newcommand{\\ClaimsTest}{3}\n")
    (macros / "all.tex").write_text("\\input{../results/macros/01_symbolic.tex}\n")
    path = C.write_macro_index(tmp_path)
    index = json.loads(path.read_text())
    assert index["SymA"] == {"file": "macros/01_symbolic.tex", "source": "notebooks/01_symbolic.ipynb"}
    assert index["ClaimsTest"]["source"] == "keybias.pipeline.claims.headline_macros"
    (macros / "02_other.tex").write_text("\\newcommand{\\SymA}{4}\n")
    with pytest.raises(ValueError, match=r"SymA is defined in macros/01_symbolic.tex and in macros/02_other.tex"):
        C.macro_index(tmp_path)


def test_committed_macro_index_matches_the_macro_files():
    committed = ROOT / "results" / "macros" / "index.json"
    assert committed.exists(), "results/macros/index.json is missing: the build writes it (check_claims)"
    assert json.loads(committed.read_text()) == C.macro_index(ROOT / "results")
