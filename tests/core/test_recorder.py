import json

import pandas as pd
import pytest

from keybias.core import recorder as export


def test_claim_holds_is_computed_not_given(tmp_path):
    rec = export.Recorder("99_test", tmp_path, profile="smoke", device="cpu")
    assert rec.claim("small", "x is small", 0.5, 1.0, "<=")["holds"] is True
    assert rec.claim("big", "x is big", 0.5, 1.0, ">")["holds"] is False
    assert rec.claim("nan", "nan never holds", float("nan"), 1.0, "<=")["holds"] is False
    with pytest.raises(ValueError, match="twice"):
        rec.claim("small", "again", 0, 1)
    with pytest.raises(ValueError, match="comparison"):
        rec.claim("other", "bad op", 0, 1, "=<")


def test_macro_names_and_formatting(tmp_path):
    rec = export.Recorder("99_test", tmp_path, profile="smoke", device="cpu")
    assert rec.macro("CountOfThings", 2048) == "2{,}048"
    assert rec.macro("Tiny", 1.5e-9) == r"1.5\times10^{-9}"
    assert rec.macro("Plain", 0.25) == "0.25"
    with pytest.raises(ValueError, match="letters only"):
        rec.macro("Bad1", 1)
    step = rec.finish()
    text = (tmp_path / "macros" / "99_test.tex").read_text()
    assert r"\newcommand{\CountOfThings}{2{,}048}" in text
    assert json.loads((tmp_path / "steps" / "99_test.json").read_text()) == step
    assert "macros/99_test.tex" in step["outputs"]


def test_outputs_are_written_atomically(tmp_path):
    rec = export.Recorder("99_test", tmp_path, profile="smoke", device="cpu")
    rec.csv(pd.DataFrame({"a": [1, 2]}), "numbers")
    assert (tmp_path / "data" / "numbers.csv").read_text() == "a\n1\n2\n"
    assert not list(tmp_path.rglob("*.tmp"))
    with pytest.raises(ValueError, match="letters, digits"):
        rec.csv(pd.DataFrame(), "../escape")


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "file.txt"
    export.atomic_write_text(target, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(export.os, "replace", broken_replace)
    with pytest.raises(OSError):
        export.atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]


def test_claim_records_kind_origin_and_detectable_effect(tmp_path):
    rec = export.Recorder("99_test", tmp_path, profile="smoke", device="cpu")
    record = rec.claim("t", "x is small", 0.5, 1.0, kind="test", bound_origin="theory", min_detectable=0.25)
    assert (record["kind"], record["bound_origin"], record["min_detectable"]) == ("test", "theory", 0.25)
    implied = rec.claim("i", "follows", 0.5, 1.0, kind="implied", implied_by="t", bound_origin="theory")
    assert implied["implied_by"] == ["t"]
    with pytest.raises(ValueError, match="kind"):
        rec.claim("k", "bad kind", 0, 1, kind="guess")
    with pytest.raises(ValueError, match="implied_by"):
        rec.claim("j", "implied by nothing", 0, 1, kind="implied")
    from_dicts = rec.claims_from([dict(claim_id="d", statement="s", value=2.0, bound=1.0, comparison=">",
                                       kind="consistency", bound_origin="count")])
    assert from_dicts[0]["holds"] is True and from_dicts[0]["kind"] == "consistency"
