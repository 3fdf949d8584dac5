import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The tests run torch on one intra-op thread (set before torch is first imported; the processes they
# start inherit it). Their tensors are small, and the notebook kernels of the smoke run, which keep
# the paper's two threads (keybias.pipeline.kernel sets their count itself), run beside them: with
# two threads here as well, four busy threads on a 2-core machine left the smoke run 313 s behind
# the rest of the suite. A count set by whoever runs the tests is kept.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "claim_mutation(*claim_ids): the test feeds the named test claims' own code data or a model "
        "that violates the claimed property and asserts the claim then fails",
    )
    config.addinivalue_line(
        "markers",
        "integration: runs the notebooks, a browser, make or an installed wheel (tests/integration/); "
        "`pytest -m 'not integration'` leaves them out while developing",
    )


# What this session's own collection saw of the `claim_mutation` markers, and which test modules it
# collected: a full `make test` collects every module anyway, so the register of mutation tests is
# read from it instead of from a second collection in another interpreter (about 10 s each time).
_COLLECTED = {"modules": set(), "mutations": {}}


def pytest_collectreport(report):
    if report.nodeid.endswith(".py"):
        _COLLECTED["modules"].add(report.nodeid)


# tryfirst: the register must see every collected item, before -m, -k or --deselect drop some
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    integration = ROOT / "tests" / "integration"
    for item in items:
        if integration in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)
        for mark in item.iter_markers("claim_mutation"):
            for cid in mark.args:
                _COLLECTED["mutations"].setdefault(cid, set()).add(item.nodeid)


# The tests that read the smoke run go last, so that the other tests run while the notebooks do
# instead of waiting for them (the smoke run starts at the end of collection, in a process of its own).
# A stable sort: within each part, the order of collection.
@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_smoke_readers_last(config, items):
    items.sort(key=lambda item: "smoke_results" in getattr(item, "fixturenames", ()))


# Work that test modules hand to a process of its own while the session runs the other tests:
# name -> (the process, the file it writes). See tests/studies/test_nan_policy.py.
BACKGROUND: dict = {}
NAN_POLICY = ROOT / "tests" / "studies" / "test_nan_policy.py"


def _child_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            "JUPYTER_PATH": str(Path(sys.prefix) / "share" / "jupyter")}


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    import subprocess
    import tempfile

    if any("smoke_results" in getattr(item, "fixturenames", ()) for item in session.items):
        # the smoke run of the notebooks (kernels of their own, a minute and more) starts now and runs
        # beside the tests before the first that needs it
        folder = Path(tempfile.mkdtemp(prefix="keybias-smoke-"))
        log = (folder / "run.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "keybias.pipeline.steps", "--profile", "smoke", "--device",
                                 "cpu", "--results", str(folder / "results"), "notebooks"],
                                cwd=ROOT, env=_child_env(), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        BACKGROUND["smoke"] = (proc, folder)
    mine = [item for item in session.items if Path(item.path) == NAN_POLICY]
    if not mine or len(mine) == len(session.items):
        return  # alone it would only wait for its own process

    out = Path(tempfile.mkdtemp(prefix="keybias-nan-policy-")) / "outcomes.json"
    wanted = out.with_name("selected.json")  # only the cases this session runs
    wanted.write_text(json.dumps(sorted({f"{item.originalname}[{item.callspec.id}]" for item in mine
                                         if hasattr(item, "callspec")})))
    proc = subprocess.Popen([sys.executable, str(NAN_POLICY), str(out), str(wanted)], cwd=ROOT, env=_child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    BACKGROUND["nan_policy"] = (proc, out)


def pytest_sessionfinish(session):
    import shutil

    for name, (proc, out) in BACKGROUND.items():
        if proc.poll() is None:  # an interrupted session: what it makes is of no use
            proc.kill()
        ok = proc.wait() == 0
        if name == "smoke":
            if ok:  # a failed run's folder stays, for its log
                shutil.rmtree(out, ignore_errors=True)
            continue
        for path in (out, out.with_suffix(".partial"), out.with_name("selected.json")):
            path.unlink(missing_ok=True)
        out.parent.rmdir()


@pytest.fixture
def record_mutation(request):
    """`record_mutation(*claims)`: assert that each judged claim of a mutation fails, and log how
    far its value lies beyond the bound.

    Each argument is a `Claim`, a claim dict or a record from `keybias.pipeline.claims.evaluate`
    (a Recorder record). The claim's id must be one the test's `claim_mutation` marker names.
    When `python -m keybias.pipeline.claims mutations` runs the marked tests it names a file in
    `KEYBIAS_MUTATION_LOG`; each call appends one JSON line per claim there, and the command
    prints the distance from the bound per test claim. Without that variable nothing is written.
    """
    from keybias.core.recorder import Claim
    from keybias.pipeline.claims import MUTATION_LOG_ENV

    marked = {cid for mark in request.node.iter_markers("claim_mutation") for cid in mark.args}

    def record(*claims):
        for given in claims:
            claim = Claim.from_any(given)
            assert claim.id in marked, f"{claim.id!r} is not named by the test's claim_mutation marker {sorted(marked)}"
            assert not claim.holds, (
                f"mutation of {claim.id!r} still holds: {claim.value!r} {claim.comparison} {claim.bound!r}")
            path = os.environ.get(MUTATION_LOG_ENV)
            if path:
                entry = {"node": request.node.nodeid, "id": claim.id, "value": claim.value,
                         "bound": claim.bound, "comparison": claim.comparison, "holds": claim.holds}
                with open(path, "a", encoding="utf-8") as log:
                    log.write(json.dumps(entry) + "\n")

    return record


@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory):
    """Every notebook run once with the smoke profile into a scratch results folder (started at the
    end of collection, see pytest_collection_finish; here when the session did not start it)."""
    from keybias.pipeline import steps as pipeline

    os.environ["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
    if "smoke" in BACKGROUND:
        proc, folder = BACKGROUND["smoke"]
        code = proc.wait()
        log = (folder / "run.log").read_text()
        assert code == 0, f"the smoke run of the notebooks failed (exit {code}; log {folder / 'run.log'}):\n{log[-4000:]}"
        return folder / "results"
    results = tmp_path_factory.mktemp("smoke") / "results"
    code = pipeline.main(["--profile", "smoke", "--device", "cpu", "--results", str(results), "notebooks"])
    assert code == 0, "the smoke run of the notebooks failed (see the log above)"
    return results


def _session_collected_every_module(config) -> bool:
    """Whether this session collected every test module under tests/ (then its markers are the
    whole register); --last-failed skips modules while still reporting them collected."""
    if config.getoption("lf", False) or any("::" in str(arg) for arg in config.args):
        return False
    root = config.rootpath
    collected = {(root / nodeid).resolve() for nodeid in _COLLECTED["modules"]}
    on_disk = {p.resolve() for pattern in ("test_*.py", "*_test.py") for p in (ROOT / "tests").rglob(pattern)}
    return bool(on_disk) and on_disk <= collected


@pytest.fixture(scope="session")
def mutation_register(request) -> dict[str, list[str]]:
    """{claim id: [node ids]} of every test under tests/ marked `claim_mutation`: what
    `keybias.pipeline.claims.collect_mutations` returns. Read from this session's collection when that
    covered every test module (a whole `make test`), else by one collection in a fresh interpreter
    (collecting twice in one interpreter would import the test modules twice)."""
    if _session_collected_every_module(request.config):
        return {cid: sorted(nodes) for cid, nodes in sorted(_COLLECTED["mutations"].items())}
    import subprocess

    code = ("import json, sys; from pathlib import Path; from keybias.pipeline import claims as C; "
            "print(json.dumps(C.collect_mutations(Path(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
