"""The claim contract: finite reductions, kinds, manifest, mutation register, headline counts."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from keybias.pipeline import claim_contract
from keybias.pipeline import claims as C
from keybias.pipeline import steps as pipeline


@pytest.fixture(autouse=True)
def synthetic_claims(request, monkeypatch):
    """These tests judge synthetic runs, whose claims no judge declares: the registry check of the
    contract (keybias.core.claimspec.spec_errors, tested in tests/core/test_claimspec.py) is left
    out, except in the tests that ask for `real_registry`."""
    if "real_registry" not in request.fixturenames:
        monkeypatch.setattr(claim_contract, "spec_errors", lambda record: [])


@pytest.fixture
def real_registry():
    """The contract's registry check as the pipeline runs it."""


def claim(cid, notebook="01_x", kind="test", holds=True, **extra):
    return {"id": cid, "statement": f"{cid} holds", "value": 0.5, "bound": 1.0, "comparison": "<=",
            "holds": holds, "notebook": notebook, "device": "cpu", "profile": "smoke", "kind": kind,
            "bound_origin": "theory", **extra}


def make_build(root, results):
    """A real Build for the smoke profile over `root` (the constructor only finds the notebooks)."""
    return pipeline.Build("smoke", "cpu", results, root=root)


def write_manifest(root, profile, claims):
    for nb, entries in C.manifest_from_claims(claims).items():
        path = C.manifest_path(profile, nb, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(C.manifest_text(profile, nb, entries))


# -- finite reductions ------------------------------------------------------------------------
def test_finite_max_fails_on_nan_and_empty_input_instead_of_skipping():
    assert C.finite_max([1.0, 3.0, 2.0], "x") == 3.0
    with pytest.raises(C.NonFiniteValues):  # a NaN entry is never skipped
        C.finite_max([1.0, float("nan"), 2.0], "x")
    with pytest.raises(C.NonFiniteValues):
        C.finite_max(pd.Series([1.0, np.inf]), "x")
    assert math.isnan(C.finite_max([], "x")), "an empty selection gave a number"
    assert math.isnan(C.finite_max(pd.Series([], dtype=float), "x"))
    excluded = []
    assert C.finite_max([1.0, float("nan"), 2.0], "x", exclude_nonfinite="masked rows", excluded=excluded) == 2.0
    assert [str(e) for e in excluded] == ["x: 1 of 3 entries left out (masked rows)"]
    assert math.isnan(C.finite_max([float("nan")], "x", exclude_nonfinite="masked rows", excluded=[]))
    assert C.finite_median([3.0, 1.0, 2.0], "x") == 2.0
    assert C.finite_min([3.0, 1.0], "x") == 1.0 and C.finite_mean([1.0, 3.0], "x") == 2.0


def test_finite_values_names_what_is_wrong():
    with pytest.raises(C.NonFiniteValues, match=r"noise floor: 1 of 3 entries are not finite"):
        C.finite_values([1.0, float("nan"), 2.0], "noise floor")
    with pytest.raises(C.EmptySelection, match="noise floor: the selection is empty"):
        C.finite_values([], "noise floor")
    with pytest.raises(C.EmptySelection):
        C.finite_max([], "x", strict=True)


def test_an_exclusion_must_be_named_and_recorded():
    """Dropping NaN silently is impossible: the reason and the list that records it are required."""
    with pytest.raises(ValueError, match="must be recorded"):
        C.finite_max([1.0, float("nan")], "x", exclude_nonfinite="masked rows")
    with pytest.raises(ValueError, match="name the reason"):
        C.finite_max([1.0, float("nan")], "x", exclude_nonfinite=" ", excluded=[])
    excluded = []
    value = C.finite_max([1.0, float("nan")], "noise", exclude_nonfinite="masked rows", excluded=excluded)
    record = C.evaluate([C.Claim("c", "s", value, 2.0, kind="test", bound_origin="theory", exclusions=excluded)])["c"]
    assert record["holds"] and record["exclusions"] == ["noise: 1 of 2 entries left out (masked rows)"]
    assert C.finite_count(pd.Series([True, False, True]), "x") == 2 and math.isnan(C.finite_count([], "x"))


# -- the Claim type ---------------------------------------------------------------------------
def test_claim_computes_holds_and_refuses_bad_fields():
    c = C.Claim("a", "s", 0.5, 1.0, "<=", kind="test", bound_origin="theory")
    assert c.holds and c.margin == 2.0
    assert not C.Claim("a", "s", float("nan"), 1.0, "<=").holds, "NaN never holds"
    assert not C.Claim("a", "s", float("inf"), 1.0, ">=").holds
    with pytest.raises(ValueError, match="comparison"):
        C.Claim("a", "s", 0.5, 1.0, "~")
    with pytest.raises(ValueError, match="kind"):
        C.Claim("a", "s", 0.5, 1.0, kind="guess")
    with pytest.raises(ValueError, match="names no identity"):
        C.Claim("a", "s", 0, 0, "==", kind="proof")
    with pytest.raises(ValueError, match="implied"):
        C.Claim("a", "s", 0, 0, "==", kind="implied")


def test_recorder_writes_claims_and_dicts_alike(tmp_path):
    """Judges may return a Claim or (until converted) a dict keyed claim_id or id: one record."""
    from keybias.core.recorder import Recorder

    rec = Recorder("99_x", tmp_path, profile="smoke", device="cpu")
    fields = dict(statement="s", value=0.5, bound=1.0, comparison="<=", kind="test", bound_origin="theory")
    records = rec.claims_from([C.Claim("a", **fields), {"claim_id": "b", **fields}, {"id": "c", **fields}])
    assert [{k: v for k, v in r.items() if k != "id"} for r in records] == [
        {**fields, "holds": True, "notebook": "99_x", "device": "cpu", "profile": "smoke"}] * 3
    with pytest.raises(ValueError, match="recorded twice"):
        rec.claim(C.Claim("a", **fields))
    with pytest.raises(ValueError, match="both id and claim_id"):
        C.Claim.from_any({"id": "x", "claim_id": "y", **fields})


def test_nan_from_an_empty_selection_fails_the_claim(tmp_path):
    from keybias.core.recorder import Recorder

    rec = Recorder("99_test", tmp_path, profile="smoke", device="cpu")
    empty = pd.Series([], dtype=float)
    record = rec.claim("empty-max", "max below one", C.finite_max(empty, "nothing"), 1.0, "<=",
                       kind="test", bound_origin="theory")
    assert record["holds"] is False and math.isnan(record["value"])


# -- contract ---------------------------------------------------------------------------------
def test_contract_accepts_a_clean_run(tmp_path):
    run = [claim("a"), claim("b", kind="consistency"), claim("c", kind="implied", implied_by=["a"]),
           claim("p", kind="proof", identity="softmax(s + c) = softmax(s)")]
    write_manifest(tmp_path, "smoke", run)
    assert C.contract_errors(run, "smoke", tmp_path) == []


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (claim("a", kind=None), "claim 'a' has no kind"),
        (claim("a", kind="guess"), "claim 'a' has kind 'guess'"),
        (claim("a", kind="implied"), "claim 'a' is implied but names no claim"),
        (claim("a", kind="implied", implied_by=["ghost"]), "implied by 'ghost', which the run did not produce"),
        (claim("a", kind="test", implied_by=["b"]), "has implied_by but kind 'test'"),
        (claim("a", bound_origin=""), "claim 'a' does not state its bound's origin"),
        (claim("a", kind="proof"), "claim 'a' is a proof check but does not name the identity"),
        (claim("a", identity="x = x"), "claim 'a' names an identity but has kind 'test'"),
    ],
)
def test_contract_names_each_broken_claim(tmp_path, broken, message):
    run = [broken, claim("b")]
    write_manifest(tmp_path, "smoke", [claim("a"), claim("b")])
    errors = C.contract_errors(run, "smoke", tmp_path)
    assert any(message in e for e in errors), errors


def test_contract_refuses_a_claim_that_no_judge_declares(tmp_path, real_registry):
    run = [claim("undeclared-claim")]
    write_manifest(tmp_path, "smoke", run)
    assert C.contract_errors(run, "smoke", tmp_path) == [
        "claim 'undeclared-claim' has no ClaimSpec: declare it with register_claim in its judge"]


def test_contract_enforces_the_manifest(tmp_path):
    manifest = [claim("a"), claim("b", notebook="02_y"), claim("c", kind="consistency")]
    write_manifest(tmp_path, "smoke", manifest)
    missing = C.contract_errors([claim("a"), claim("c", kind="consistency")], "smoke", tmp_path)
    assert missing == [
        "claim 'b' (02_y, test) is in params/claims/smoke/02_y.json but the run did not produce it"
    ]
    extra = C.contract_errors([*manifest, claim("new-one")], "smoke", tmp_path)
    assert len(extra) == 1 and "claim 'new-one' (01_x) is not in params/claims/smoke/01_x.json" in extra[0]
    kind_changed = C.contract_errors([claim("a"), claim("b", notebook="02_y"), claim("c")], "smoke", tmp_path)
    assert len(kind_changed) == 1 and "claim 'c' has kind 'test' but" in kind_changed[0]
    assert "no claim manifest" in C.contract_errors(manifest, "paper", tmp_path)[0]


def test_deleting_a_claim_from_a_step_record_fails_the_pipeline_check_naming_it(tmp_path, capsys):
    """The committed smoke manifest, replayed as a run, passes; without one claim it fails by name."""
    manifest = C.load_manifest("smoke", ROOT)
    assert manifest, "params/claims/smoke/ holds no manifest"
    tests = [i for entries in manifest.values() for i, k in entries.items() if k == "test"]
    run = [
        claim(cid, notebook=nb, kind=kind, **({"implied_by": [i for i in ids if i != cid][:1]} if kind == "implied" else {}),
              **({"identity": "x = x"} if kind == "proof" else {}),
              **({"protects": tests[:1]} if kind == "control" else {}))
        for nb, ids in manifest.items() for cid, kind in ids.items()
    ]
    build = make_build(ROOT, tmp_path)
    build.check_claims(run)
    assert (tmp_path / "macros" / "claims.tex").exists()
    victim = next(c for c in run if c["kind"] == "test")
    with pytest.raises(pipeline.BuildError, match="contract"):
        build.check_claims([c for c in run if c is not victim])
    assert f"claim {victim['id']!r}" in capsys.readouterr().err


def _step_records_from_the_manifest(tmp_path):
    """A project with notebooks 01 and 03 whose step records hold exactly the smoke manifest."""
    import shutil

    root, results = tmp_path / "proj", tmp_path / "results"
    (root / "notebooks").mkdir(parents=True)
    shutil.copytree(ROOT / "params", root / "params")
    for other in (root / "params" / "claims" / "smoke").glob("*.json"):
        if other.stem not in ("01_symbolic", "03_precision"):
            other.unlink()  # this project has only notebooks 01 and 03
    manifest = C.load_manifest("smoke", ROOT)
    provenance = {"started_utc": "2026-01-01T00:00:00+00:00", "commit": "0" * 40, "dirty": False,
                  "versions": {"torch": "x", "python": "x"}, "wall_seconds": 1.0,
                  "machine": {"cpu": "x", "torch_threads": 1, "devices_present": ["cpu"]}}
    for nb in ("01_symbolic", "03_precision"):
        shutil.copy(ROOT / "notebooks" / f"{nb}.ipynb", root / "notebooks")
        tests = [i for i, k in manifest[nb].items() if k == "test"]
        records = [claim(cid, notebook=nb, kind=kind, **({"identity": "x = x"} if kind == "proof" else {}),
                         **({"protects": tests[:1]} if kind == "control" else {}))
                   for cid, kind in manifest[nb].items()]
        step = {"notebook": nb, "profile": "smoke", "device": "cpu", "claims": records, "outputs": [],
                "provenance": provenance}
        (results / "steps").mkdir(parents=True, exist_ok=True)
        (results / "steps" / f"{nb}.json").write_text(json.dumps(step))
    return pipeline.Build("smoke", "cpu", results, root=root), results


def test_deleting_a_claim_from_a_step_record_fails_gather_and_check(tmp_path, capsys):
    build, results = _step_records_from_the_manifest(tmp_path)
    build.check_claims(build.gather())
    step_path = results / "steps" / "03_precision.json"
    step = json.loads(step_path.read_text())
    victim = step["claims"].pop(0)["id"]
    step_path.write_text(json.dumps(step))
    with pytest.raises(pipeline.BuildError, match=victim):
        build.check_claims(build.gather())
    assert f"claim {victim!r} (03_precision, test) is in params/claims/smoke/03_precision.json" in capsys.readouterr().err


def test_pipeline_check_names_a_claim_that_fails_on_nan(tmp_path, capsys):
    run = [claim("fine"), claim("nan-claim", holds=False, value=float("nan"))]
    write_manifest(tmp_path, "smoke", run)
    build = make_build(tmp_path, tmp_path / "results")
    with pytest.raises(pipeline.BuildError, match="nan-claim"):
        build.check_claims(run)
    assert "empty selection or non-finite data" in capsys.readouterr().err


def test_pipeline_check_stops_on_a_verdict_table_it_cannot_count(tmp_path):
    run = [claim("fine")]
    write_manifest(tmp_path, "smoke", run)
    (tmp_path / "results" / "data").mkdir(parents=True)
    (tmp_path / "results" / "data" / "invariance.csv").write_text("dtype,verdict\nfloat32,redundant\n")
    build = make_build(tmp_path, tmp_path / "results")
    with pytest.raises(pipeline.BuildError, match="expected"):
        build.check_claims(run)


# -- manifest command -------------------------------------------------------------------------
def test_manifest_command_writes_only_the_notebooks_of_the_run(tmp_path):
    write_manifest(tmp_path, "smoke", [claim("kept", notebook="02_other"), claim("old", notebook="01_x")])
    steps = tmp_path / "results" / "steps"
    steps.mkdir(parents=True)
    step = {"notebook": "01_x", "profile": "smoke", "claims": [claim("new"), claim("n2", kind="consistency")]}
    (steps / "01_x.json").write_text(json.dumps(step))
    args = ["--root", str(tmp_path), "manifest", "--profile", "smoke", "--results", str(tmp_path / "results")]
    assert C.main(args) == 1, "a changed manifest must be reported without --write"
    assert C.main([*args, "--write"]) == 0
    assert C.load_manifest("smoke", tmp_path) == {
        "01_x": {"n2": "consistency", "new": "test"},
        "02_other": {"kept": "test"},
    }
    assert C.main(args) == 0, "the manifest now matches the run"


# -- mutation register ------------------------------------------------------------------------
def test_mutation_register_collects_markers_without_running_tests(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_fake.py").write_text(
        "import pytest\n"
        "def pytest_configure(config):\n    pass\n"
        "@pytest.mark.claim_mutation('covered-claim', 'other')\n"
        "def test_breaks_it():\n    raise SystemExit('a mutation register must not run tests')\n"
    )
    (tests / "conftest.py").write_text(
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'claim_mutation(*ids): mutation')\n"
    )
    found = C.collect_mutations(tmp_path)
    assert found == {"covered-claim": ["tests/test_fake.py::test_breaks_it"],
                     "other": ["tests/test_fake.py::test_breaks_it"]}
    report = C.mutation_report({"01_x": {"covered-claim": "test", "bare": "test", "other": "consistency"}}, found)
    assert report["missing"] == ["bare"] and report["score"] == 0.5
    assert report["not_test_markers"] == ["other"]


def test_every_test_claim_of_the_manifest_has_a_mutation_test(mutation_register, monkeypatch, capsys):
    """The register over the committed paper manifest, through the command (`make mutations
    --collect-only`); the register is the session's (conftest.mutation_register), which is what
    `collect_mutations` finds (test_mutation_register_collects_markers_without_running_tests)."""
    monkeypatch.setattr(C, "collect_mutations", lambda root, tests="tests": mutation_register)
    code = C.main(["--root", str(ROOT), "mutations", "--profile", "paper", "--collect-only"])
    out = capsys.readouterr()
    assert "mutation score:" in out.out, out.out + out.err
    assert code == 0, out.out[-3000:] + out.err[-2000:]


# -- headline counts --------------------------------------------------------------------------
def test_headline_counts_count_only_independent_tests():
    claims = [claim("a"), claim("b", holds=False), claim("c", kind="consistency"),
              claim("d", kind="implied", implied_by=["a"])]
    verdicts = pd.DataFrame({
        "dtype": ["float64", "float64", "float32", "float32", "float32", "bfloat16"],
        "verdict": ["redundant", "not_redundant", "redundant", "redundant", "skipped", "not_redundant"],
        "expected": ["redundant", "not_redundant", "redundant", "not_redundant", "redundant", "redundant"],
        "independent": [True, True, True, False, True, True],
    })
    counts = C.headline_counts(claims, verdicts)
    assert "ClaimsTotal" not in counts, "no count sums test claims with the other kinds"
    assert counts["ClaimsTest"] == 2 and counts["ClaimsTestHolding"] == 1
    assert counts["ClaimsConsistency"] == 1 and counts["ClaimsImplied"] == 1 and counts["ClaimsProof"] == 0
    assert (counts["IndepTestsFloatSixtyFour"], counts["IndepContradictionsFloatSixtyFour"]) == (2, 0)
    # the contradicting float32 row is implied, so it is not a test (and not a contradiction)
    assert (counts["IndepTestsFloatThirtyTwo"], counts["IndepContradictionsFloatThirtyTwo"]) == (1, 0)
    assert counts["ImpliedVerdictsFloatThirtyTwo"] == 1
    assert (counts["IndepTestsBfloatSixteen"], counts["IndepContradictionsBfloatSixteen"]) == (1, 1)
    assert counts["IndepTestsTotal"] == 4 and counts["IndepContradictionsTotal"] == 1
    text = C.headline_macros(counts)
    assert r"\newcommand{\IndepTestsFloatThirtyTwo}{1}" in text and r"\newcommand{\ClaimsTest}{2}" in text
    every = C.headline_counts(claims, verdicts.drop(columns="independent").assign(status="measured"))
    assert every["IndepTestsFloatThirtyTwo"] == 2 and every["IndepContradictionsFloatThirtyTwo"] == 1
    skipped = C.headline_counts(claims, verdicts.assign(status=["measured"] * 5 + ["skipped"]))
    assert skipped["IndepTestsBfloatSixteen"] == 0
    with pytest.raises(ValueError, match="expected"):
        C.headline_counts(claims, verdicts.drop(columns="expected"))


def test_claims_table_groups_by_kind_with_bound_origin():
    table = C.claims_table([claim("t1", bound_origin="float64 rounding theory"),
                            claim("c1", kind="consistency"), claim("i1", kind="implied", implied_by=["t1"]),
                            claim("p1", kind="proof", identity="softmax(s + c) = softmax(s)"),
                            claim("k1", kind="control", protects=["t1"]),
                            claim("t2", holds=False, min_detectable=1e-3)])
    tests_at, proof_at, control_at, cons_at, implied_at = (
        table.index(C.latex_escape(C.KIND_TITLES[k])) for k in C.CLAIM_KINDS)
    assert tests_at < table.index("t2") < proof_at < table.index("p1") < control_at < table.index("k1") < cons_at
    assert cons_at < table.index("c1")
    assert cons_at < implied_at < table.index("i1")
    assert "Identity: softmax(s + c) = softmax(s)." in table
    assert "Bound: float64 rounding theory." in table and "FAILS" in table
    assert r"Implied by} \texttt{\footnotesize t1}" in table
    assert table.rstrip().endswith(r"\bottomrule" + "\n" + r"\end{longtable}")


def test_kind_summary_keeps_tests_apart_and_has_no_degenerate_counts():
    one = C.kind_summary([claim("a")])
    assert one == "The one test claim holds."
    mixed = C.kind_summary([claim("a"), claim("b", holds=False), claim("c", kind="consistency"),
                            claim("p", kind="proof", identity="x"), claim("q", kind="proof", identity="y")])
    assert mixed == ("1 of 2 test claims hold; 1 fail. Not counted as evidence: "
                     "2 proof checks and one consistency check; all of them hold.")
    assert C.kind_summary([claim("a"), claim("b")]).startswith("All 2 test claims hold.")
    assert " of 1 " not in C.kind_summary([claim("a", holds=False), claim("c", kind="consistency")])


def test_mutation_distances_are_recorded_and_printed(tmp_path, capsys):
    """`mutations` runs the marked tests; record_mutation logs each judged mutation's distance."""
    import shutil

    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "test_fake_distances.py").write_text(
        "import pytest\n"
        "from keybias.core.recorder import Claim\n"
        "@pytest.mark.claim_mutation('upper')\n"
        "def test_edge(record_mutation):\n"
        "    record_mutation(Claim('upper', 's', 1.05, 1.0, '<=', kind='test', bound_origin='t'))\n"
        "@pytest.mark.claim_mutation('lower')\n"
        "def test_lower(record_mutation):\n"
        "    record_mutation({'claim_id': 'lower', 'statement': 's', 'value': 0.5, 'bound': 1.0, 'comparison': '>=',\n"
        "                     'kind': 'test', 'bound_origin': 't'})\n"
        "@pytest.mark.claim_mutation('lower')\n"
        "def test_unrecorded():\n"
        "    pass\n"
    )
    logged = C.run_mutations(tmp_path)
    assert sorted((e["id"], e["value"]) for e in logged) == [("lower", 0.5), ("upper", 1.05)]
    assert [round(C.mutation_distance(e), 6) for e in sorted(logged, key=lambda e: e["id"])] == [2.0, 1.05]
    write_manifest(tmp_path, "smoke", [claim("upper"), claim("lower")])
    assert C.main(["--root", str(tmp_path), "mutations", "--profile", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "value 1.05 <= bound 1 is false: 1.05x the bound" in out
    assert "value 0.5 >= bound 1 is false: the bound is 2x the value" in out
    assert "distance not recorded" in out and "mutation distances: recorded for 2 of 2 test claims" in out


def test_record_mutation_refuses_a_mutation_that_still_holds(tmp_path):
    import shutil

    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "test_fake_weak.py").write_text(
        "import pytest\n"
        "from keybias.core.recorder import Claim\n"
        "@pytest.mark.claim_mutation('upper')\n"
        "def test_weak(record_mutation):\n"
        "    record_mutation(Claim('upper', 's', 0.5, 1.0, '<=', kind='test', bound_origin='t'))\n"
    )
    with pytest.raises(RuntimeError, match="still holds"):
        C.run_mutations(tmp_path)
