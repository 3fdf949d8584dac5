"""The findings registry: every finding well formed, every test claim of the paper profile decides
exactly one finding, and the pipeline's stamping, checks and plain statements behave."""

import json
from pathlib import Path

import pytest

from keybias.pipeline import findings_out as FO
from keybias.studies import findings as F
from keybias.studies.conditions import judge as conditions_judge

ROOT = Path(__file__).resolve().parents[2]


def _manifest(profile="paper"):
    kinds = {}
    for path in sorted((ROOT / "params" / "claims" / profile).glob("*.json")):
        kinds.update(json.loads(path.read_text())["claims"])
    return kinds


@pytest.mark.parametrize("finding", F.list_findings(), ids=lambda f: f.id)
def test_finding_names_claims_of_the_right_kinds(finding):
    kinds = _manifest()
    for cid in finding.decided_by:
        assert kinds.get(cid) == "test", f"{finding.id}: {cid} is {kinds.get(cid)!r} in the paper manifest"
    for cid in finding.rests_on:
        assert cid in kinds and kinds[cid] != "test", f"{finding.id}: rests on {cid} ({kinds.get(cid)!r})"
    assert finding.notebook in {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}


@pytest.mark.parametrize("finding", F.list_findings(), ids=lambda f: f.id)
def test_finding_text_reads_on_the_site_as_in_the_paper(finding):
    # the site typesets math and macros but cannot resolve a LaTeX cross-reference
    for text in (finding.title, finding.statement):
        assert "\\ref{" not in text and "\\cite" not in text, f"{finding.id}: {text[:80]}"


def test_every_test_claim_of_the_paper_profile_decides_one_finding():
    owner = F.finding_of_claims()
    tests = sorted(cid for cid, kind in _manifest().items() if kind == "test")
    assert [cid for cid in tests if cid not in owner] == []
    assert 8 <= len(F.list_findings()) <= 12


def test_stamp_and_errors_name_the_claim():
    quirk_test = conditions_judge.COND_QUIRK_NEED_WEIGHTS_CHANGES_OUTPUT.id_for(option="add-bias-kv")
    claims = [{"id": quirk_test, "kind": "test"}, {"id": "loose-test", "kind": "test"},
              {"id": "cond-fold-plain", "kind": "proof"}]
    stamped = FO.stamp_findings(claims)
    assert stamped[0]["finding"] == "need-weights-quirk" and "finding" not in stamped[1]
    errors = FO.findings_errors(claims, {}, strict_macros=False)
    assert any("loose-test" in e and "decides no finding" in e for e in errors)
    wrong = FO.findings_errors([{"id": quirk_test, "kind": "consistency"}], {}, False)
    assert any("not a test" in e for e in wrong)
    missing = FO.findings_errors([], {}, strict_macros=True)
    assert any("CondQuirkZeroAttnDiff" in e for e in missing)


def test_plain_statement_fills_numbers_and_drops_markup():
    text = F.plain_statement(r"$\bk$ moves by \X{} of \texttt{need\_weights}, \Y{} in all (\Z{}\%)",
                             {"X": r"1.2\times10^{-3}", "Y": "2{,}290", "Z": "5"})
    assert text == "b_k moves by 1.2×10⁻³ of need_weights, 2,290 in all (5%)"
    with pytest.raises(KeyError):
        F.plain_statement(r"\Undefined{}", {})


def test_a_finding_must_be_decided_or_say_what_it_rests_on():
    with pytest.raises(ValueError, match="decide"):
        F.Finding("x-y", "t", "u", "s", "sec:x", None, "01_symbolic", "test")
    with pytest.raises(ValueError, match="only a tested"):
        F.Finding("x-y", "t", "u", "s", "sec:x", None, "01_symbolic", "proof", decided_by=("a",))
    with pytest.raises(ValueError, match="tolerance"):
        F.Headline("X", "rel")


def test_a_summary_prints_at_most_two_numbers():
    with pytest.raises(ValueError, match="at most 2 numbers"):
        F.Finding("x-y", "t", r"\A{} \B{} \C{}", "s", "sec:x", None, "01_symbolic", "proof")


@pytest.mark.parametrize("finding", F.list_findings(), ids=lambda f: f.id)
def test_a_summary_uses_only_numbers_its_statement_states(finding):
    """The introduction's short form may leave numbers out, never add one the finding does not state."""
    summary = set(F._MACRO_USE.findall(finding.summary))
    stated = set(F._MACRO_USE.findall(finding.statement))
    assert summary <= stated, f"{finding.id}: the summary prints {sorted(summary - stated)}, the statement does not"
