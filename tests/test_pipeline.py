"""Content-hash rebuilds, atomic publishing and the claim gate."""

import json
import shutil

import nbformat
import pytest

from conftest import ROOT
from keybias import pipeline


def make_root(tmp_path, failing=False):
    """A copy of the project with just notebook 01 (optionally made to fail mid-way)."""
    root = tmp_path / "proj"
    for sub in ("src", "params"):
        shutil.copytree(ROOT / sub, root / sub, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "requirements.lock", root)
    (root / "notebooks").mkdir()
    nb = nbformat.read(ROOT / "notebooks" / "01_symbolic.ipynb", as_version=4)
    if failing:
        nb.cells.insert(-1, nbformat.v4.new_code_cell("raise RuntimeError('interrupted on purpose')"))
    nbformat.write(nb, root / "notebooks" / "01_symbolic.ipynb")
    return root


def test_module_closure_follows_imports():
    files = {p.name for p in pipeline.module_closure(ROOT / "notebooks" / "01_symbolic.ipynb")}
    assert {"__init__.py", "symbolic.py", "export.py", "params.py"} <= files
    assert "pipeline.py" not in files


def test_step_key_tracks_inputs(tmp_path):
    root = make_root(tmp_path)
    build = pipeline.Build("smoke", "cpu", tmp_path / "results", root=root)
    build.check()
    key = build.step_key("01_symbolic")
    (root / "src" / "keybias" / "pipeline.py").write_text("# unrelated change\n")
    assert build.step_key("01_symbolic") == key, "a module the notebook does not import changed the key"
    symbolic = root / "src" / "keybias" / "symbolic.py"
    symbolic.write_text(symbolic.read_text() + "\n# changed\n")
    assert build.step_key("01_symbolic") != key
    build.params["01_symbolic"]["grid_n"] = [1]
    key2 = build.step_key("01_symbolic")
    build.profile = "paper"
    assert build.step_key("01_symbolic") != key2


def test_failed_notebook_publishes_nothing_and_rerun_completes(tmp_path):
    results = tmp_path / "results"
    root = make_root(tmp_path, failing=True)
    build = pipeline.Build("smoke", "cpu", results, root=root)
    build.check()
    with pytest.raises(pipeline.BuildError, match="interrupted on purpose"):
        build.run_notebooks()
    published = [p for p in results.rglob("*") if p.is_file() and ".staging" not in p.parts]
    assert published == [], f"a failed run left {published}"

    root_ok = make_root(tmp_path / "again")
    build = pipeline.Build("smoke", "cpu", results, root=root_ok)
    build.check()
    build.run_notebooks()
    assert build.ran == ["01_symbolic"]
    step = json.loads((results / "steps" / "01_symbolic.json").read_text())
    assert all((results / rel).exists() for rel in step["outputs"])
    assert not (results / ".staging" / "01_symbolic").exists()
    again = pipeline.Build("smoke", "cpu", results, root=root_ok)
    again.check()
    again.run_notebooks()
    assert again.ran == [], "an unchanged rerun ran a notebook again"


def test_claim_gate_names_the_failing_claim():
    claims = [
        {"id": "fine", "holds": True, "notebook": "x", "statement": "s", "value": 0, "bound": 1},
        {"id": "broken-claim", "holds": False, "notebook": "x", "statement": "s", "value": 2, "bound": 1},
    ]
    build = pipeline.Build.__new__(pipeline.Build)
    with pytest.raises(pipeline.BuildError, match="broken-claim"):
        build.check_claims(claims)


def test_fingerprint_changes_with_inputs(tmp_path):
    root = make_root(tmp_path)
    a = pipeline.input_fingerprint(root, "smoke", "cpu")
    assert a == pipeline.input_fingerprint(root, "smoke", "cpu")
    assert a != pipeline.input_fingerprint(root, "paper", "cpu")
    (root / "params" / "smoke.yaml").write_text((root / "params" / "smoke.yaml").read_text() + "\n")
    assert a != pipeline.input_fingerprint(root, "smoke", "cpu")


def test_latex_escape():
    assert pipeline.latex_escape("a_b & 50% #1 {x} \\") == r"a\_b \& 50\% \#1 \{x\} \textbackslash{}"


def test_compare_results_ignores_timings(tmp_path):
    for name in ("a", "b"):
        d = tmp_path / name / "data"
        d.mkdir(parents=True)
        (d / "x.csv").write_text(f"v,seconds,ok\n1.0,{1 if name == 'a' else 3},True\n")
        (d / "cost_timing_cpu.csv").write_text(f"t\n{1 if name == 'a' else 2}\n")
        (tmp_path / name / "claims.json").write_text(json.dumps([{"id": "c", "holds": True}]))
    assert pipeline.compare_results(tmp_path / "a", tmp_path / "b") == []
    (tmp_path / "b" / "data" / "x.csv").write_text("v,seconds,ok\n1.5,3,True\n")
    assert pipeline.compare_results(tmp_path / "a", tmp_path / "b") == ["data/x.csv: column v differs in 1 rows"]
