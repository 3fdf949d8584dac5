"""Everything that names claims agrees with the registry (keybias.core.claimspec).

The manifests, the findings' deciding claims, verify's tolerance classes and the rules table are
checked against the specs the judges declare; no claim id is typed here."""

import re
from pathlib import Path

import pytest

from keybias.core import claimspec as S
from keybias.pipeline import claims as C
from keybias.pipeline import outputs as O
from keybias.studies import claims as study_claims
from keybias.studies import findings as F

ROOT = Path(__file__).resolve().parents[2]
SPECS = study_claims.load()
PROFILES = sorted(p.name for p in (ROOT / C.MANIFEST_DIR).iterdir() if p.is_dir())
FINDINGS = {f.id: f for f in F.list_findings()}


def _recorded(spec):
    """The ids of `spec` that some profile's notebooks record."""
    return sorted({cid for profile in spec.profiles for cid in spec.ids(profile)})


def test_every_judge_declares_claims():
    assert {s.notebook for s in SPECS} == {p.stem for p in (ROOT / "notebooks").glob("[0-9]*.ipynb")}


@pytest.mark.parametrize("profile", PROFILES)
def test_the_manifest_is_the_registry_of_its_profile(profile):
    manifest = C.load_manifest(profile, ROOT)
    listed = {cid: (nb, kind) for nb, entries in manifest.items() for cid, kind in entries.items()}
    declared = {cid: (s.notebook, s.kind) for s in SPECS for cid in s.ids(profile)}
    assert listed == declared


@pytest.mark.parametrize("spec", [s for s in SPECS if s.kind == "test"], ids=lambda s: s.id)
def test_every_test_claim_is_judged_by_some_profile(spec):
    """A test claim no profile's notebooks record decides nothing: it is declared only where it runs."""
    assert set(spec.profiles) <= set(PROFILES) and _recorded(spec) == sorted(spec.ids())


@pytest.mark.parametrize("spec", [s for s in SPECS if s.kind == "test"], ids=lambda s: s.id)
def test_a_test_claim_decides_a_tested_finding(spec):
    finding = FINDINGS[spec.finding]
    assert finding.basis == "test"
    assert set(_recorded(spec)) <= set(finding.decided_by)


@pytest.mark.parametrize("finding", [f for f in FINDINGS.values() if f.basis == "test"], ids=lambda f: f.id)
def test_a_finding_is_decided_by_exactly_the_test_claims_that_name_it(finding):
    declared = {cid for s in SPECS if s.finding == finding.id for cid in _recorded(s)}
    assert set(finding.decided_by) == declared
    for cid in finding.rests_on:
        assert S.spec_of(cid).kind != "test", f"{cid} is a test claim: it decides the finding"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_verify_knows_the_tolerance_classes_of_every_claim(spec):
    assert {spec.value_class, spec.bound_class} <= set(O.TOLERANCES) | {O.EXACT, O.MACHINE}
    for cid in spec.ids():
        assert O.claim_class(cid, "value") == spec.value_class
        assert O.claim_class(cid, "bound") == spec.bound_class
        assert O.claim_class(cid, "holds") == O.EXACT


# an entry names its claim in a heading or at the head of a bullet: "### `id`", "- `id` (test)"
RULES_TEXT = (ROOT / C.MANIFEST_DIR / "rules.md").read_text()
RULES = {cid for line in RULES_TEXT.splitlines() if line.startswith(("#", "- `"))
         for cid in re.findall(r"`([a-z0-9-]+)`", line.split(":")[0] if line.startswith("- ") else line)}


@pytest.mark.parametrize("cid", S.list_claims(kind="test"))
def test_the_rules_table_has_an_entry_for_every_test_claim(cid):
    assert cid in RULES, f"params/claims/rules.md has no entry for the test claim {cid}"


def test_every_declared_test_claim_has_a_mutation_test(mutation_register):
    """Every test claim of the registry, those no profile's notebooks record included, has a pytest
    marked `claim_mutation` with its id, and every marker names a declared claim."""
    assert [cid for cid in S.list_claims(kind="test") if not mutation_register.get(cid)] == []
    assert sorted(set(mutation_register) - set(S.list_claims())) == []
