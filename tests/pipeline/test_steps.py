"""Content-hash rebuilds, atomic publishing and the claim gate."""

import json
import shutil
import subprocess

import nbformat
import pytest

from conftest import ROOT
from keybias.pipeline import kernel, paper
from keybias.pipeline import steps as pipeline


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
    src = ROOT / "src"
    files = {str(p.relative_to(src)) for p in pipeline.module_closure(ROOT / "notebooks" / "01_symbolic.ipynb")}
    assert {"keybias/__init__.py", "keybias/studies/symbolic/derive.py", "keybias/core/recorder.py",
            "keybias/studies/params.py"} <= files
    assert "keybias/pipeline/steps.py" not in files


def test_step_key_tracks_inputs(tmp_path):
    root = make_root(tmp_path)
    build = pipeline.Build("smoke", "cpu", tmp_path / "results", root=root)
    build.check()
    key = build.step_key("01_symbolic")
    (root / "src" / "keybias" / "pipeline" / "steps.py").write_text("# unrelated change\n")
    assert build.step_key("01_symbolic") == key, "a module the notebook does not import changed the key"
    symbolic = root / "src" / "keybias" / "studies" / "symbolic" / "derive.py"
    symbolic.write_text(symbolic.read_text() + "\n# changed\n")
    assert build.step_key("01_symbolic") != key
    build.params["01_symbolic"]["grid_n"] = [1]
    key2 = build.step_key("01_symbolic")
    build.profile = "paper"
    assert build.step_key("01_symbolic") != key2


def test_failed_notebook_publishes_nothing_and_rerun_completes(tmp_path, capfd):
    results = tmp_path / "results"
    root = make_root(tmp_path, failing=True)
    build = pipeline.Build("smoke", "cpu", results, root=root)
    build.check()
    with pytest.raises(pipeline.BuildError, match="interrupted on purpose") as failure:
        build.run_notebooks()
    message = str(failure.value)
    assert "failing cell" in message and "raise RuntimeError('interrupted on purpose')" in message
    assert "error: RuntimeError: interrupted on purpose" in message
    log_path = results / ".build" / "logs" / "01_symbolic.log"
    assert "full log:" in message and log_path.name in message and log_path.exists()
    published = [
        p for p in results.rglob("*") if p.is_file() and ".staging" not in p.parts and ".build" not in p.parts
    ]
    assert published == [], f"a failed run left {published}"
    capfd.readouterr()

    root_ok = make_root(tmp_path / "again")
    build = pipeline.Build("smoke", "cpu", results, root=root_ok)
    build.check()
    build.run_notebooks()
    assert build.ran == ["01_symbolic"]
    step = json.loads((results / "steps" / "01_symbolic.json").read_text())
    assert all((results / rel).exists() for rel in step["outputs"])
    assert not (results / ".staging" / "01_symbolic").exists()
    # quiet: the terminal gets status lines only; the cell log goes to the log file
    shown = capfd.readouterr()
    lines = [line for line in (shown.out + shown.err).splitlines() if line.strip()]
    assert len(lines) <= 2 and lines[-1].startswith("[keybias] 01_symbolic: done in"), lines
    assert f"with {len(step['claims'])} claims" in lines[-1]
    assert "Executing" in log_path.read_text() or log_path.stat().st_size > 0
    # the kernel ran with the declared threads and a fixed hash seed, and says so
    env = step["provenance"]["kernel_env"]
    assert env["OMP_NUM_THREADS"] == str(kernel.KERNEL_THREADS) and env["PYTHONHASHSEED"] == "0"
    again = pipeline.Build("smoke", "cpu", results, root=root_ok)
    again.check()
    again.run_notebooks()
    assert again.ran == [], "an unchanged rerun ran a notebook again"


def test_scrubbing_does_not_depend_on_set_order(tmp_path):
    """The venv lies inside the root: the longer prefix must be replaced first, every time."""
    import sys

    build = pipeline.Build.__new__(pipeline.Build)
    build.root = pipeline.Path(sys.prefix).parent
    build.profile, build.device = "smoke", "cpu"
    executed = tmp_path / "x.ipynb"
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("x", outputs=[nbformat.v4.new_output(
        "stream", name="stdout", text=f"{sys.prefix}/lib/site.py and {build.root}/src/a.py\n")]))
    nbformat.write(nb, executed)
    build._scrub_and_render(executed)
    text = executed.read_text()
    venv = pipeline.Path(sys.prefix).name
    assert "lib/site.py and src/a.py" in text and f"{venv}/lib/site.py" not in text
    assert str(build.root) not in text


def test_provenance_flags_a_build_that_mixes_commits():
    def step(name, commit, started):
        return {"notebook": name, "device": "cpu", "provenance": {
            "commit": commit, "dirty": False, "started_utc": started, "wall_seconds": 1.0,
            "versions": {}, "machine": {}, "threads": 2}}

    same = paper.merge_provenance([step("a", "c1", "1"), step("b", "c1", "2")], "smoke")
    assert same["mixed_commits"] is False and same["commits"] == ["c1"]
    mixed = paper.merge_provenance([step("a", "c1", "1"), step("b", "c2", "2")], "smoke")
    assert mixed["mixed_commits"] is True and mixed["commits"] == ["c1", "c2"] and mixed["commit"] == "c2"


def test_provenance_names_head_when_every_step_ran_heads_code():
    """A step run at an older commit stands for HEAD when its inputs' key equals HEAD's; the
    paper then names HEAD. One step whose code changed makes it name the run's own commit."""
    def step(name, commit, started):
        return {"notebook": name, "device": "cpu", "provenance": {
            "commit": commit, "dirty": False, "started_utc": started + "T00:00:00", "wall_seconds": 1.0,
            "versions": {"torch": "t", "python": "p"}, "threads": 2,
            "machine": {"cpu": "c", "torch_threads": 2, "devices_present": ["cpu"]}}}

    steps = [step("a", "c1", "1"), step("b", "c2", "2")]
    head = {"commit": "h" * 40, "dirty": False}
    same = paper.merge_provenance(steps, "smoke", head=head, matches={"a": True, "b": True})
    assert same["code_matches_head"] is True and same["steps"]["a"]["code_matches_head"] is True
    assert r"\newcommand{\ProvCommit}{hhhhhhhhhh}" in paper.provenance_macros(same)
    stale = paper.merge_provenance(steps, "smoke", head=head, matches={"a": True, "b": False})
    assert stale["code_matches_head"] is False
    assert r"\newcommand{\ProvCommit}{c2}" in paper.provenance_macros(stale)


def test_claim_gate_names_the_failing_claim():
    claims = [
        {"id": "fine", "holds": True, "notebook": "x", "statement": "s", "value": 0, "bound": 1, "kind": "test"},
        {"id": "broken-claim", "holds": False, "notebook": "x", "statement": "s", "value": 2, "bound": 1,
         "kind": "test"},
    ]
    build = pipeline.Build.__new__(pipeline.Build)
    build.profile, build.root = "smoke", ROOT
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
    assert paper.latex_escape("a_b & 50% #1 {x} \\") == r"a\_b \& 50\% \#1 \{x\} \textbackslash{}"


# Files that carry wall times or this run's paths, so differ between two runs by design.
RUN_SPECIFIC = ("machine/*", "provenance.json", "steps/*", "notebooks/*", ".build/*", "index.html")


def without_machine_columns(rel: str, data: bytes) -> bytes:
    """A data CSV's bytes minus the columns declared machine-specific (still inside some tables)."""
    import csv
    import io

    from keybias.pipeline.outputs import DATA_COLUMNS

    machine = {c for c, cls in DATA_COLUMNS.get(rel, {}).items() if cls == "machine"}
    if not machine:
        return data
    rows = list(csv.reader(io.StringIO(data.decode())))
    keep = [i for i, name in enumerate(rows[0]) if name not in machine]
    return "\n".join(",".join(row[i] for i in keep) for row in rows).encode()


def test_two_forced_rebuilds_are_byte_identical(tmp_path):
    import fnmatch

    from keybias.pipeline.outputs import file_class_is_machine

    root = make_root(tmp_path)
    digests = []
    for run in ("one", "two"):
        results = tmp_path / run
        build = pipeline.Build("smoke", "cpu", results, root=root, force=True)
        build.check()
        build.run_notebooks()
        files = {}
        for path in sorted(p for p in results.rglob("*") if p.is_file()):
            rel = str(path.relative_to(results))
            if not any(fnmatch.fnmatch(rel, pat) for pat in RUN_SPECIFIC):
                files[rel] = without_machine_columns(rel, path.read_bytes())
        digests.append(files)
    assert digests[0].keys() == digests[1].keys() and digests[0]
    differ = [rel for rel in digests[0] if digests[0][rel] != digests[1][rel]]
    assert not differ, f"a forced rebuild changed {differ}"
    # everything excluded above is declared machine-specific, so verify does not compare it
    for rel in ("machine/x.csv", "provenance.json", "steps/01_symbolic.json", "notebooks/01_symbolic.html"):
        assert file_class_is_machine(rel), rel


def test_kernel_environment_pins_threads_hash_seed_and_instruction_set(monkeypatch):
    monkeypatch.delenv("KEYBIAS_ISA_PIN", raising=False)
    for var in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(kernel, "cpu_has_avx2", lambda: True)
    env = kernel.kernel_environment("02_invariance")
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == str(kernel.KERNEL_THREADS)
    assert env["PYTHONHASHSEED"] == "0" and env["TQDM_DISABLE"] == "1"
    assert {k: env[k] for k in kernel.ISA_PINS} == kernel.ISA_PINS
    assert not set(kernel.ISA_PINS) & set(kernel.kernel_environment("06_cost")), "timing notebook pinned"
    monkeypatch.setattr(kernel, "cpu_has_avx2", lambda: False)
    assert not set(kernel.ISA_PINS) & set(kernel.kernel_environment("02_invariance"))
    monkeypatch.setattr(kernel, "cpu_has_avx2", lambda: True)
    monkeypatch.setenv("KEYBIAS_ISA_PIN", "none")
    assert not set(kernel.ISA_PINS) & set(kernel.kernel_environment("02_invariance"))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert kernel.kernel_environment("02_invariance")["ATEN_CPU_CAPABILITY"] == "default"


def test_a_paper_put_back_by_hand_is_rebuilt_and_an_unchanged_one_is_not(tmp_path, monkeypatch):
    """The paper's stamp covers its inputs and the PDF itself: after `git checkout paper/main.pdf`
    the inputs still match, and the old PDF must not pass for the new one."""
    root = tmp_path
    (root / "paper").mkdir()
    (root / "paper" / "main.tex").write_text("\\documentclass{article}\\begin{document}x\\end{document}\n")
    (root / "notebooks").mkdir()
    (root / "results" / ".build" / "logs").mkdir(parents=True)
    runs = []

    def fake_latexmk(cmd, cwd, **kw):
        runs.append(cmd)
        out = root / "paper" / "build"
        out.mkdir(exist_ok=True)
        (out / "main.pdf").write_bytes(b"%PDF built " + str(len(runs)).encode())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(paper.subprocess, "run", fake_latexmk)
    monkeypatch.setattr(paper.PaperSteps, "reindex", lambda self: None)
    monkeypatch.setattr(paper.PaperSteps, "_source_date", lambda self: "0")
    build = pipeline.Build("smoke", "cpu", root / "results", root=root)
    build.build_paper()
    build.build_paper()
    assert len(runs) == 1  # nothing changed: not rebuilt
    (root / "paper" / "main.pdf").write_bytes(b"%PDF an older one, checked out")
    build.build_paper()
    assert len(runs) == 2 and (root / "paper" / "main.pdf").read_bytes() == b"%PDF built 2"
