"""Output classes and the comparison of `make verify`, on doctored results folders."""

import json
import math
import shutil

import pytest

from conftest import ROOT
from keybias.pipeline import macro_classes, outputs
from keybias.pipeline.findings_out import macro_definitions
from keybias.pipeline.outputs import TOLERANCES, Tolerance, compare_folders
from keybias.studies.precision import judge as precision_judge


def make_results(root, *, value="0.5", err="3.3e-15", count="12", holds=True, claim_value=1e-15,
                 macro=r"3.30\times10^{-3}"):
    (root / "data").mkdir(parents=True)
    (root / "macros").mkdir()
    (root / "machine").mkdir()
    (root / "data" / "precision_errors.csv").write_text(
        "device,dtype,path,ratio,head_dim,num_heads,seq_len,batch,seed,status,reason,"
        "unit_roundoff,finite,bias_norm,delta_rms\n"
        f"cpu,float64,explicit,1,32,{count},4,4,0,ok,,1.1e-16,True,{value},{err}\n"
    )
    (root / "macros" / "03_precision.tex").write_text(f"\\newcommand{{\\PrecGradTolMax}}{{{macro}}}\n")
    (root / "machine" / "timing.csv").write_text(f"seconds\n{hash(str(root)) % 97}\n")
    (root / "provenance.json").write_text(json.dumps({"cpu": str(root)}))
    (root / "claims.json").write_text(json.dumps([
        {"id": precision_judge.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id, "statement": "s", "value": claim_value, "bound": 1e-12, "comparison": "<=",
         "holds": holds, "notebook": "03_precision", "device": "cpu", "profile": "smoke", "kind": "test"}
    ]))
    return root


def test_identical_folders_pass_and_machine_files_are_not_compared(tmp_path):
    a = make_results(tmp_path / "a")
    b = make_results(tmp_path / "b")
    report = compare_folders(a, b)
    assert report.ok, report.failures
    assert report.machine == 2  # machine/timing.csv and provenance.json differ and are skipped
    assert report.exact > 0 and report.rounding > 0
    assert "exact and equal" in report.summary() and "machine-specific, not compared" in report.summary()


def test_rounding_within_tolerance_passes_and_reports_its_ratio(tmp_path):
    a = make_results(tmp_path / "a", value="0.5", err="3.3e-15")
    b = make_results(tmp_path / "b", value="0.5000005", err="3.6e-15")
    report = compare_folders(a, b)
    assert report.ok, report.failures
    assert 0 < report.worst_ratio <= 1


def test_rounding_beyond_tolerance_names_file_column_row_and_values(tmp_path):
    a = make_results(tmp_path / "a", value="0.5")
    b = make_results(tmp_path / "b", value="0.51")
    report = compare_folders(a, b)
    assert report.failures == [
        "data/precision_errors.csv: column bias_norm, row 0: 0.5 vs 0.51 beyond tolerance 'f32' (ratio 1.31e+04)"
    ]


def test_exact_column_differing_fails(tmp_path):
    report = compare_folders(make_results(tmp_path / "a"), make_results(tmp_path / "b", count="13"))
    assert report.failures == ["data/precision_errors.csv: column num_heads, row 0: '12' != '13' (exact)"]


def test_claim_outcome_differing_fails_naming_the_claim(tmp_path):
    report = compare_folders(make_results(tmp_path / "a"), make_results(tmp_path / "b", holds=False))
    assert any("claim precision-output-change-within-tolerance, field holds" in f for f in report.failures)


def test_claim_value_compared_within_noise(tmp_path):
    ok = compare_folders(make_results(tmp_path / "a"), make_results(tmp_path / "b", claim_value=3e-15))
    assert ok.ok, ok.failures
    bad = compare_folders(make_results(tmp_path / "c"), make_results(tmp_path / "d", claim_value=1e-13))
    assert any("claim precision-output-change-within-tolerance, field value" in f for f in bad.failures)


def test_macro_numbers_compared_by_tolerance_and_text_exactly(tmp_path):
    ok = compare_folders(make_results(tmp_path / "a"), make_results(tmp_path / "b", macro=r"9.10\times10^{-3}"))
    assert ok.ok, ok.failures
    far = compare_folders(make_results(tmp_path / "c"), make_results(tmp_path / "d", macro=r"3.30\times10^{-6}"))
    assert any("macros/03_precision.tex: \\PrecGradTolMax" in f for f in far.failures)
    text = compare_folders(make_results(tmp_path / "e"), make_results(tmp_path / "f", macro="about zero"))
    assert text.failures == ["macros/03_precision.tex: \\PrecGradTolMax: text outside numbers differs"]


def test_missing_and_undeclared_files_fail(tmp_path):
    a = make_results(tmp_path / "a")
    b = make_results(tmp_path / "b")
    (b / "macros" / "03_precision.tex").unlink()
    (b / "mystery.txt").write_text("x")
    failures = compare_folders(a, b).failures
    assert "macros/03_precision.tex: not regenerated" in failures
    assert "mystery.txt: undeclared file; add a pattern to keybias.pipeline.outputs.FILES" in failures


def test_row_count_change_fails(tmp_path):
    a = make_results(tmp_path / "a")
    b = make_results(tmp_path / "b")
    path = b / "data" / "precision_errors.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[-1]]) + "\n")
    assert compare_folders(a, b).failures == ["data/precision_errors.csv: 1 rows in the reference, 2 regenerated"]


def test_undeclared_column_message_says_what_to_add(tmp_path):
    a = make_results(tmp_path / "a")
    path = a / "data" / "precision_errors.csv"
    lines = path.read_text().splitlines()
    path.write_text(f"{lines[0]},brand_new\n{lines[1]},1\n")
    (a / "data" / "brand_new_file.csv").write_text("x\n1\n")
    missing = outputs.undeclared(a)
    assert any("column 'brand_new' undeclared" in m and "DATA_COLUMNS['data/precision_errors.csv']" in m for m in missing)
    assert any(m.startswith("data/brand_new_file.csv: add DATA_COLUMNS") for m in missing)


@pytest.mark.parametrize("name", sorted(TOLERANCES))
def test_every_tolerance_says_why_and_rejects_nan_against_a_number(name):
    tol = TOLERANCES[name]
    assert len(tol.why) > 20
    assert tol.ratio(float("nan"), 1.0) == math.inf
    assert tol.ratio(float("nan"), float("nan")) == 0.0


def test_noise_tolerance_floor_and_decades():
    noise = Tolerance(why="test", spread="none", decades=1.0, floor_u=2.0)
    assert noise.ratio(1e-17, 0.0, "float64") == 0.0  # both below u64: zero
    assert noise.ratio(1e-12, 0.0, "float64") == math.inf
    assert noise.ratio(1e-3, 1e-2, "float32") == pytest.approx(1.0)
    assert noise.ratio(1e-3, -1e-3, "float32") == math.inf


def test_smoke_run_declares_every_file_and_column(smoke_results):
    missing = outputs.undeclared(smoke_results)
    assert not missing, "declare each column in its study's src/keybias/studies/<topic>/schema.py (whole files in build/outputs.py FILES):\n" + "\n".join(missing)


def test_committed_results_fail_verify_when_one_exact_entry_moves(tmp_path):
    """The committed results folder against a copy with one exact entry changed (the width of one
    configuration): verify must fail and name that entry, and nothing else. (Comparing a folder with an
    unchanged copy of itself could not fail, so it is no test.)"""
    import csv
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "results"
    copy = tmp_path / "copy"
    shutil.copytree(results, copy)
    path = copy / "data" / "invariance.csv"
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    col = rows[0].index("embed_dim")
    rows[1][col] = str(int(rows[1][col]) + 1)
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    report = compare_folders(results, copy)
    assert not report.ok
    assert [str(f) for f in report.failures] == [
        f"data/invariance.csv: column embed_dim, row 0: '{int(rows[1][col]) - 1}' != '{rows[1][col]}' (exact)"]


def test_tolerances_on_differences_seen_between_emulated_avx512_and_avx2_runs():
    """Pairs observed between a native run and one capped at AVX2 (keybias.studies.bitwise) pass;
    the same columns with a changed order of magnitude or sign fail."""
    noise, noise32, stat = (TOLERANCES[k] for k in ("noise", "noise32", "noise_stat"))
    assert noise.ratio(2.70573557e-07, 1.02310081e-07, "float32") <= 1  # invariance tolerance_rel
    assert noise.ratio(2.7e-07, 2.7e-09, "float32") > 1
    assert noise32.ratio(1.04872601e-07, 0.0) <= 1  # training max_loss_rel_diff: one ulp vs none
    assert noise32.ratio(1e-5, 0.0) > 1
    assert stat.ratio(-0.0193196767, 0.0464275317) <= 1  # bk_mean_cos of rounding noise
    assert stat.ratio(0.05, 0.9) > 1


def test_control_scaled_tolerance_uses_the_reference_rows_control(tmp_path):
    """A kept-vs-removed divergence may move by up to twice its own noise-level control."""
    for name, kept in (("a", "1e-5"), ("b", "5e-5"), ("c", "5e-2")):
        (tmp_path / name / "data").mkdir(parents=True)
        (tmp_path / name / "data" / "training_pairs.csv").write_text(
            "optimizer,seed,steps,final_divergence_kept,final_divergence_control\n"
            f"sgd,0,150,{kept},3.5e-5\n"
        )
    assert compare_folders(tmp_path / "a", tmp_path / "b").ok
    far = compare_folders(tmp_path / "a", tmp_path / "c")
    assert any("final_divergence_kept" in f for f in far.failures)


def test_verify_prints_a_line_per_class_with_counts_and_largest_ratio(tmp_path, capsys):
    from keybias.pipeline.steps import verify

    a = make_results(tmp_path / "a", err="3.3e-15")
    b = make_results(tmp_path / "b", err="3.6e-15")
    assert verify(a, b, seconds=12.0) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("verify: rms_error ")]
    assert len(lines) == 1 and lines[0].split()[2:5] == ["1", "0", "0"], out  # compared, identical, failed
    assert "data/precision_errors.csv:delta_rms row 0" in lines[0]
    assert "verify: PASSED after regenerating for 12 s" in out


def test_printed_numbers_get_the_rounding_of_their_printing():
    from keybias.pipeline.outputs import printed_ratio

    assert printed_ratio("slope", "0.9704", "0.970") == 0  # the same slope printed to fewer digits
    assert printed_ratio("slope", "0.9704", "0.8704") > 1
    assert printed_ratio("effect32", "0.506", "0.406") > 1
    assert printed_ratio("images", "0", "1") == TOLERANCES["images"].ratio(0, 1)


# -- macro declarations: each study's schema.MACROS, expanded and looked up exactly -------------


def committed_macros() -> dict[str, list[str]]:
    """{macros file compared macro by macro: the names the committed results define there}."""
    out = {}
    for path in sorted((ROOT / "results" / "macros").glob("*.tex")):
        rel = f"macros/{path.name}"
        if outputs.file_class(rel).cls == "macros":
            out[rel] = list(macro_definitions(path.read_text()))
    return out


def test_every_committed_macro_is_declared_exactly_once():
    """Each name one template of one declaration produces (two fail when the declarations load,
    see the doctored case below); none left to a default."""
    declared = macro_classes.declared_macros()
    undeclared = [f"{rel}: \\{name}" for rel, names in committed_macros().items() for name in names
                  if name not in declared.get(rel, {})]
    assert not undeclared, f"macros the committed results write but no schema.py declares: {undeclared}"


def test_every_declared_macro_is_written_by_the_committed_results_or_says_why_not():
    written = committed_macros()
    stale = [f"{rel}: \\{name} (template {d.template!r}, {d.owner})"
             for rel, names in macro_classes.declared_macros().items() for name, d in names.items()
             if name not in written.get(rel, ()) and not d.conditional]
    assert not stale, f"declared macros the committed results do not write (stale, or conditional?): {stale}"


def test_declared_classes_are_known_and_templates_expand_exactly():
    classes = {d.cls for names in macro_classes.declared_macros().values() for d in names.values()}
    assert classes <= set(TOLERANCES) | {outputs.EXACT, outputs.MACHINE}, classes - set(TOLERANCES)
    assert outputs.macro_class("macros/03_precision.tex", "PrecSlopeFloatSixteen") == "slope"
    assert macro_classes.expand("PrecSlope{dtype}", macro_classes.AXES) == [
        "PrecSlopeFloatSixtyFour", "PrecSlopeFloatThirtyTwo", "PrecSlopeFloatSixteen", "PrecSlopeBfloatSixteen"]
    with pytest.raises(ValueError, match=r"axis 'nosuch'"):
        macro_classes.expand("PrecSlope{nosuch}", macro_classes.AXES)


def test_an_undeclared_macro_raises_naming_it_and_fails_verify(tmp_path):
    with pytest.raises(macro_classes.UndeclaredMacro, match=r"\\PrecSlopeFloatEight is not declared.*precision"):
        outputs.macro_class("macros/03_precision.tex", "PrecSlopeFloatEight")
    with pytest.raises(macro_classes.UndeclaredMacro, match=r"\\PrecSlopeFloatSixteen is not declared"):
        outputs.macro_class("macros/04_training.tex", "PrecSlopeFloatSixteen")  # declared for another file
    make_results(tmp_path / "ref")
    make_results(tmp_path / "new")
    for side in ("ref", "new"):
        with (tmp_path / side / "macros" / "03_precision.tex").open("a") as f:
            f.write("\\newcommand{\\PrecSlopeFloatEight}{1.00}\n")
    failures = compare_folders(tmp_path / "ref", tmp_path / "new").failures
    assert any("\\PrecSlopeFloatEight is not declared" in f for f in failures), failures


def test_a_name_two_declarations_produce_fails_naming_it():
    table = {}
    macro_classes._declare(table, "macros/03_precision.tex", "a", {"PrecSlope{dtype}": "slope"}, macro_classes.AXES)
    with pytest.raises(ValueError, match=r"\\PrecSlopeFloatSixteen declared twice: by 'PrecSlope\{dtype\}' \(a\) "
                                         r"and by 'PrecSlopeFloatSixteen' \(b\)"):
        macro_classes._declare(table, "macros/03_precision.tex", "b", {"PrecSlopeFloatSixteen": "f32"},
                               macro_classes.AXES)
