"""The claim registry: specs, families, and claims built from them."""

import math

import pytest

from keybias.core import claimspec as S


@pytest.fixture
def registry(monkeypatch):
    """An empty registry for the test, so the studies' own declarations stay untouched."""
    fresh: dict = {}
    monkeypatch.setattr(S, "_REGISTRY", fresh)
    return fresh


def _spec(**kw):
    base = dict(id="demo-{dtype}-small", notebook="01_demo", kind="test", comparison="<=", bound=1.0,
                origin="theory: a fixed bound", finding="demo-finding", params={"dtype": ("float32", "float64")})
    return S.ClaimSpec(**{**base, **kw})


def test_a_family_enumerates_its_ids_and_narrows_by_profile():
    spec = _spec(profile_params={"smoke": {"dtype": ("float32",)}})
    assert spec.ids() == ["demo-float32-small", "demo-float64-small"]
    assert spec.ids("smoke") == ["demo-float32-small"]
    assert spec.params_of("demo-float64-small") == {"dtype": "float64"}
    assert _spec(profiles=("paper",)).ids("smoke") == []


def test_a_claim_built_from_its_spec_carries_the_spec_fields():
    claim = _spec().claim("statement", 0.5, params={"dtype": "float64"})
    assert (claim.id, claim.kind, claim.comparison, claim.bound, claim.bound_origin) == (
        "demo-float64-small", "test", "<=", 1.0, "theory: a fixed bound")
    assert claim.holds


@pytest.mark.parametrize("bad, message", [
    (dict(bound=2.0), "disagrees with its spec"),
    (dict(bound_origin="the issue"), "does not begin with"),
    (dict(params={"dtype": "float16"}), "not one of"),
    (dict(kind="consistency"), "comes from its spec"),
])
def test_a_claim_that_disagrees_with_its_spec_cannot_be_built(bad, message):
    kw = {"params": {"dtype": "float32"}, **bad}
    with pytest.raises(ValueError, match=message):
        _spec().claim("statement", 0.5, **kw)


def test_a_spec_that_leaves_the_bound_to_the_run_needs_one():
    spec = _spec(bound=None)
    with pytest.raises(ValueError, match="leaves the bound"):
        spec.claim("s", 0.5, params={"dtype": "float32"})
    assert spec.claim("s", 0.5, 0.25, params={"dtype": "float32"}).holds is False


@pytest.mark.parametrize("bad, message", [
    (dict(kind="guess"), "kind"),
    (dict(comparison="~"), "comparison"),
    (dict(origin=" "), "origin"),
    (dict(finding=None), "finding"),
    (dict(kind="consistency"), "finding"),
    (dict(params={}), "template fields"),
    (dict(id="Demo_{dtype}"), "lower-case"),
])
def test_a_malformed_spec_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        _spec(**bad)


def test_the_registry_refuses_an_id_declared_twice_and_resolves_family_members(registry):
    S.register_claim(_spec())
    with pytest.raises(ValueError, match="declared twice"):
        S.register_claim(_spec(id="demo-float32-small", params={}))
    assert S.spec_of("demo-float32-small").id == "demo-{dtype}-small"
    assert S.list_claims("*64*") == ["demo-float64-small"]
    with pytest.raises(KeyError, match="no ClaimSpec"):
        S.spec_of("undeclared")


def test_build_claim_by_id_checks_the_judge_against_the_spec(registry):
    S.register_claim(_spec())
    claim = S.build_claim("demo-float32-small", "s", 0.5, kind="test", comparison="<=")
    assert claim.bound == 1.0
    with pytest.raises(ValueError, match="comparison"):
        S.build_claim("demo-float32-small", "s", 0.5, comparison=">=")
    with pytest.raises(KeyError, match="no ClaimSpec"):
        S.build_claim("demo-float16-small", "s", 0.5)


def test_spec_errors_name_every_disagreement_of_a_record(registry):
    S.register_claim(_spec())
    good = S.build_claim("demo-float32-small", "s", 0.5).record("01_demo", "cpu", "smoke")
    assert S.spec_errors(good) == []
    bad = {**good, "kind": "consistency", "bound": 3.0, "notebook": "02_other", "bound_origin": "guess"}
    errors = S.spec_errors(bad)
    assert len(errors) == 4 and all("demo-float32-small" in e for e in errors)
    assert S.spec_errors({**good, "id": "undeclared"}) == [
        "claim 'undeclared' has no ClaimSpec: declare it with register_claim in its judge"]
    assert math.isfinite(good["value"])
