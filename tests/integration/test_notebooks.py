"""Every notebook, run through papermill with the smoke profile, produces its outputs and claims."""

import json

import nbformat
import pytest

from conftest import ROOT
from keybias.pipeline import steps as pipeline

NOTEBOOKS = pipeline.discover_notebooks()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_source_notebook_is_clean_and_parameterised(name):
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs committed"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    assert nb.metadata["kernelspec"]["name"] == "keybias"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_smoke_run_outputs(smoke_results, name):
    step = json.loads((smoke_results / "steps" / f"{name}.json").read_text())
    assert step["profile"] == "smoke" and step["notebook"] == name
    for rel in step["outputs"]:
        assert (smoke_results / rel).stat().st_size > 0, rel
    assert f"notebooks/{name}.html" in step["outputs"]
    figures = {p.rsplit(".", 1)[0] for p in step["outputs"] if p.startswith("figures/")}
    for fig in figures:
        assert f"{fig}.pdf" in step["outputs"] and f"{fig}.png" in step["outputs"]
    assert step["claims"], f"{name} records no claims"
    failed = [c["id"] for c in step["claims"] if not c["holds"]]
    assert not failed, f"claims fail in the smoke run: {failed}"
    assert step["provenance"]["wall_seconds"] > 0
    executed = (smoke_results / "notebooks" / f"{name}.ipynb").read_text()
    assert str(ROOT) not in executed, "the executed notebook names this machine's paths"


def test_gather_writes_contract_files(smoke_results):
    build = pipeline.Build("smoke", "cpu", smoke_results)
    claims = build.gather()
    build.check_claims(claims)
    records = json.loads((smoke_results / "claims.json").read_text())
    fields = {"id", "statement", "value", "bound", "holds", "notebook", "device", "profile"}
    assert records and all(fields <= set(r) for r in records)
    assert len({r["id"] for r in records}) == len(records), "claim ids must be unique"
    prov = json.loads((smoke_results / "provenance.json").read_text())
    assert {"commit", "dirty", "versions", "machine", "steps", "profile"} <= set(prov)
    assert {"python", "torch", "numpy", "sympy", "pandas", "papermill"} <= set(prov["versions"])
    assert set(prov["steps"]) == set(NOTEBOOKS)
    macros = (smoke_results / "macros" / "all.tex").read_text()
    for name in NOTEBOOKS:
        assert f"macros/{name}.tex" in macros


def test_paper_macros_exist_in_the_smoke_run(smoke_results):
    """`make all PROFILE=smoke` must typeset: every macro the paper uses is defined by the smoke run."""
    import re

    used = set()
    for tex in [*ROOT.glob("paper/*.tex"), *ROOT.glob("paper/sections/*.tex")]:
        used |= set(re.findall(r"\\([A-Z][A-Za-z]+)", tex.read_text()))
    build = pipeline.Build("smoke", "cpu", smoke_results)
    build.check_claims(build.gather())  # writes the headline counts (macros/claims.tex)
    defined = set()
    for tex in (smoke_results / "macros").glob("*.tex"):
        defined |= set(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}", tex.read_text()))
    prefixes = ("Sym", "Inv", "Prec", "Train", "Pret", "Cost", "Cond", "Long", "Prov", "Claims", "Indep", "Implied")
    missing = sorted(m for m in used - defined - {"ClaimCount", "ProvRepository"} if m.startswith(prefixes))
    assert not missing, f"macros used by the paper but not written by the smoke profile: {missing}"
