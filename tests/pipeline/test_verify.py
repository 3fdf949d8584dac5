"""`make verify` catches a wrong result: plausible wrong values planted in a copy of the
committed results, one or more per output class, each must fail the comparison; and a real
second machine's results pass except for the differences listed (and explained) below."""

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from keybias.pipeline import outputs
from keybias.pipeline.outputs import EXACT, MACHINE, TOLERANCES, compare_folders
from keybias.studies.cost import judge as cost_judge
from keybias.studies.precision import judge as precision_judge
from keybias.studies.symbolic import judge as symbolic_judge
from keybias.studies.training import judge as training_judge

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"

pytestmark = pytest.mark.skipif(not (RESULTS / "claims.json").exists(), reason="no committed results")


def _csv(rel, column, row, change):
    """Plant change(old value) at `row` (an index, or a function of the table) of `column`."""

    def plant(folder):
        path = folder / rel
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        i = row(table) if callable(row) else row
        table.loc[i, column] = str(change(float(table.loc[i, column])))
        table.to_csv(path, index=False)

    return rel, plant


def _macro(rel, name, value):
    def plant(folder):
        path = folder / rel
        text, n = re.subn(rf"(\\newcommand{{\\{name}}}{{)[^}}\n]*(}})", rf"\g<1>{value}\g<2>", path.read_text())
        assert n == 1, name
        path.write_text(text)

    return rel, plant


def _claim(cid, key, change):
    def plant(folder):
        path = folder / "claims.json"
        claims = json.loads(path.read_text())
        (claim,) = [c for c in claims if c["id"] == cid]
        claim[key] = change(claim[key])
        path.write_text(json.dumps(claims, indent=2))

    return "claims.json", plant


def _first(mask):
    return lambda t: mask(t).idxmax() if mask(t).any() else pytest.fail("no row for the plant")


def _num(t, col):
    return pd.to_numeric(t[col], errors="coerce")


def _config_dtype():
    table = pd.read_csv(RESULTS / "data" / "invariance.csv", dtype=str, keep_default_na=False)
    return dict(zip(table["config_id"], table["dtype"], strict=True))


def _five_times_control(rel, column, control):
    def plant(folder):
        path = folder / rel
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        i = pd.to_numeric(table[control]).idxmax()
        table.loc[i, column] = str(5 * float(table.loc[i, control]))
        table.to_csv(path, index=False)

    return rel, plant


def _flip_fraction(rel, column, fraction, other):
    def plant(folder):
        path = folder / rel
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        rows = table.index[table[column] != other][: int(fraction * len(table)) + 1]
        table.loc[rows, column] = other
        table.to_csv(path, index=False)

    return rel, plant


def _column(rel, column, change, where=None):
    """Plant change(old value) in every entry of `column` (where `where(table)` holds): a wrong
    value of a rounding-dominated column is a systematic one, since single entries are draws."""

    def plant(folder):
        path = folder / rel
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        rows = table.index if where is None else table.index[where(table)]
        values = pd.to_numeric(table.loc[rows, column], errors="coerce")
        table.loc[rows, column] = [str(change(v)) if v == v else old for v, old in zip(values, table.loc[rows, column], strict=True)]
        table.to_csv(path, index=False)

    return rel, plant


def _headline(name, change):
    """Move a finding's headline macro, wherever it is defined, by change(old value)."""

    def plant(folder):
        for path in sorted((folder / "macros").glob("*.tex")):
            text = path.read_text()
            m = re.search(rf"\\newcommand{{\\{name}}}{{(.*)}}$", text, re.MULTILINE)
            if m:
                old = float(outputs._normalise_numbers(m.group(1)).replace(",", ""))
                path.write_text(text.replace(m.group(0), rf"\newcommand{{\{name}}}{{{change(old)}}}"))
                return
        pytest.fail(f"no macro {name}")

    return "macros/", plant


# name -> (the class or tier that must catch it, plant)
PLANTS = {
    # the findings tier: each headline moved by its smallest meaningful amount
    "finding precision-law: slope 1.00 -> 0.95": ("headline", _headline("PrecSlopeFloatThirtyTwo", lambda v: v - 0.05)),
    "finding long-run-drift: exponent + 0.2": ("headline", _headline(
        "LongFullExponentMedianSmall", lambda v: round(v + 0.2, 3))),
    "finding long-run-drift: exponent - 0.2": ("headline", _headline(
        "LongFullExponentMedianSmall", lambda v: round(v - 0.2, 3))),
    "finding adam-drift-regimes: float32 default-eps largest step rate doubled": ("headline", _headline(
        "LongFullRunRateFloatEpsEightMax", lambda v: round(2 * v, 4))),
    "finding invariance-map: measured configurations + 1": ("headline", _headline("InvMeasured", lambda v: int(v) + 1)),
    "finding invariance-map: one more float32 contradiction": ("headline", _headline(
        "InvContradictionsFloatThirtyTwo", lambda v: int(v) + 1)),
    "half-precision joint verdicts: ten fewer redundant": ("half_verdicts", _headline(
        "InvJointRedundantHalf", lambda v: int(v) - 10)),
    "finding training-unchanged: test accuracy - 0.03": ("headline", _headline(
        "TrainAccKeptAdam", lambda v: round(v - 0.03, 3))),
    "finding pretrained-strip-exact: one family more handled": ("headline", _headline(
        "PretFamiliesHandled", lambda v: int(v) + 1)),
    "finding need-weights-quirk: the quirk's effect 10% smaller": ("headline", _headline(
        "CondQuirkZeroAttnDiff", lambda v: round(v * 0.9, 3))),
    "claim outcome flipped (a cost claim: its outcome is never a machine value)": ("claim outcome", _claim(
        cost_judge.COST_SAVING_WITHIN_BYTE_PREDICTION.id, "holds", lambda v: not v)),
    "claim kind changed (a test reported as a proof)": ("claim outcome", _claim(
        training_judge.TRAIN_ACCURACY_AGREES_KEPT_REMOVED.id, "kind", lambda v: "proof")),
    # the exact and stable tier: one entry suffices
    "test accuracy - 0.03 (training_pairs)": ("accuracy", _csv(
        "data/training_pairs.csv", "test_acc_removed", 0, lambda v: round(v - 0.03, 9))),
    "SymPy value of symbolic-query-bias-matters x1.5": ("f64", _claim(
        symbolic_judge.SYMBOLIC_QUERY_BIAS_MATTERS.id, "value", lambda v: v * 1.5)),
    "precision-law-slope-one value x1.5": ("fit", _claim(precision_judge.PRECISION_LAW_SLOPE_ONE.id, "value", lambda v: v * 1.5)),
    "printed slope PrecSlopeBfloatSixteen 0.97 -> 0.87 (a headline)": ("headline", _macro(
        "macros/03_precision.tex", "PrecSlopeBfloatSixteen", "0.8704")),
    "printed InvBiasKvMaxRel 0.506 -> 0.406": ("effect32", _macro("macros/02_invariance.tex", "InvBiasKvMaxRel", "0.406")),
    "accuracy 0.894 -> 0.10 (a model that learnt nothing)": ("accuracy", _csv(
        "data/training_pairs.csv", "test_acc_kept", 0, lambda v: 0.10)),
    "rounding-model constant (kappa) x1.5": ("fit", _csv(
        "data/precision_law.csv", "model_constant", 0, lambda v: v * 1.5)),
    "slope 1.00 -> 0.90": ("slope", _csv(
        "data/precision_law.csv", "slope", _first(lambda t: (_num(t, "slope") - 1).abs() < 0.01), lambda v: v - 0.1)),
    "count of grid derivatives +1": (EXACT, _csv("data/symbolic_grid.csv", "derivatives", 0, lambda v: int(v) + 1)),
    "powered_steps 150 -> 149": (EXACT, _csv(
        "data/training_bias_summary.csv", "powered_steps", 0, lambda v: int(v) - 1)),
    "printed count TrainSteps +1": (EXACT, _macro("macros/04_training.tex", "TrainSteps", "151")),
    "pretrained bound x1.01": ("f64", _csv("data/pretrained_families.csv", "bound", _first(
        lambda t: _num(t, "bound") > 0), lambda v: v * 1.01)),
    "b_k norm of a pretrained layer x1.01": ("f32", _csv(
        "data/pretrained_bias_norms.csv", "bk_norm", 0, lambda v: v * 1.01)),
    "rms rounding error x1.5": ("rms_error", _csv(
        "data/precision_errors.csv", "delta_rms", _first(lambda t: _num(t, "delta_rms") > 1e-10), lambda v: v * 1.5)),
    "null factor kappa x1.5 (float32)": ("statistic", _macro(
        "macros/02_invariance.tex", "InvNullFactorFloatThirtyTwo", "3.44")),
    "long-run drift exponent - 0.32 (a walk read as undecided)": ("exponent", _csv(
        "data/longrun_exponent.csv", "exponent", 0, lambda v: v - 0.32)),
    "paired accuracy difference of 5 images": ("acc_diff", _csv(
        "data/training_pairs.csv", "acc_diff", 0, lambda v: v + 5 / 359)),
    "4 discordant images where rounding flips one": ("images", _csv(
        "data/training_pairs.csv", "removed_only_correct", 0, lambda v: int(v) + 4)),
    "b_v norm x1.5": ("trained", _csv("data/training_bias_summary.csv", "norm_b_v", 0, lambda v: v * 1.5)),
    "short-run loss 5% off": ("curve", _csv("data/training_curves.csv", "loss_kept", 10, lambda v: v * 1.05)),
    "a real condition effect 1% off": ("effect", _csv(
        "data/conditions.csv", "effect", _first(lambda t: _num(t, "effect") > 1e-3), lambda v: v * 1.01)),
    "output change of b_k at a set magnitude 1% off": ("effect_mag", _csv(
        "data/invariance_magnitudes.csv", "bk_rel", _first(
            lambda t: (_num(t, "bk_rel") > 1e-2) & t["config_id"].map(_config_dtype()).eq("float32")),
        lambda v: v * 1.01)),
    "output change of b_k 0.506 -> 0.406 (data)": ("effect32", _csv(
        "data/invariance.csv", "max_rel_bk", _first(
            lambda t: (_num(t, "max_rel_bk") > 0.1) & t["dtype"].isin(["float32", "float64"])),
        lambda v: v * 0.8)),
    "long-run loss 5% off": ("loss", _csv("data/longrun_grid.csv", "loss", 0, lambda v: v * 1.05)),
    "discordant images 1 -> 5 (a claim value past the spread)": ("images", _claim(
        training_judge.TRAIN_ACCURACY_AGREES_KEPT_REMOVED.id, "value", lambda v: v + 5)),
    # the rounding-statistics tier: a systematic change of the column, beyond its class
    "float32 rounding errors 100x larger (a float32 path where float64 ran)": ("noise", _column(
        "data/precision_gradients.csv", "g_bk_norm", lambda v: v * 100)),
    "control divergences 20x larger": ("noise32", _column(
        "data/training_pairs.csv", "final_divergence_control", lambda v: v * 20)),
    "measured tolerances 100x larger": ("noise", _column(
        "data/invariance_magnitudes.csv", "tolerance_rel", lambda v: v * 100)),
    "null calibration ratios 20x larger (the null bound broken)": ("null_ratio", _column(
        "data/invariance_null_calibration.csv", "ratio", lambda v: v * 20)),
    "slope standard errors x5": ("fit_scatter", _column("data/precision_law.csv", "slope_se", lambda v: v * 5)),
    "b_k gradient directions systematic (mean cosine 0.5)": ("noise_stat", _column(
        "data/precision_gradient_summary.csv", "bk_mean_cos", lambda v: 0.5)),
    "detectable eps two grid steps off everywhere": ("decade_grid", _column(
        "data/invariance.csv", "min_detectable_eps", lambda v: v * 100)),
    "runs never diverge (identical for all 150 steps)": ("diverge_steps", _column(
        "data/training_pairs.csv", "identical_steps", lambda v: 150)),
    "b_k norms under Adam x10": ("chaotic", _column("data/training_bias_summary.csv", "norm_b_k", lambda v: v * 10)),
    "kept-vs-removed loss differences 10x their control": ("vs_loss_control", _column(
        "data/training_pairs.csv", "max_loss_rel_diff", lambda v: v * 10)),
    "kept-vs-removed divergences 5x": ("vs_divergence_control", _column(
        "data/training_pairs.csv", "final_divergence_kept", lambda v: v * 5)),
    "per-step divergences 5x": ("vs_param_control", _column(
        "data/training_curves.csv", "param_divergence_kept", lambda v: v * 5)),
    "grid drifts x20 (eps effect wrong)": ("walk", _column("data/longrun_grid.csv", "norm_b_k", lambda v: v * 20)),
    "long-run drifts x5": ("walk_long", _column("data/longrun_trajectory.csv", "norm_b_k", lambda v: v * 5)),
    "5% of low-precision magnitudes flipped to invalid": ("threshold", _flip_fraction(
        "data/invariance_magnitudes.csv", "verdict", 0.05, "invalid")),
}


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A copy of the committed data, macros, tables and claims (the compared files)."""
    copy = tmp_path_factory.mktemp("committed")
    for part in ("data", "macros", "tables"):
        shutil.copytree(RESULTS / part, copy / part)
    shutil.copy(RESULTS / "claims.json", copy / "claims.json")
    return copy


@pytest.fixture(scope="module")
def unplanted(committed, tmp_path_factory):
    """`unplanted(rel)`: a folder holding the copy of `rel` (a file, or "macros/") that a plant starts
    from, and the compared paths. Each is made, and checked to pass verify, once per file: several
    plants share a file, and comparing a large table costs seconds."""
    made = {}

    def get(rel):
        if rel not in made:
            clean = tmp_path_factory.mktemp("unplanted")
            if rel.endswith("/"):  # a headline: the whole macros folder
                shutil.copytree(committed / rel, clean / rel)
                only = {f"macros/{p.name}" for p in (clean / rel).glob("*.tex")}
            else:
                (clean / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(committed / rel, clean / rel)
                only = {rel}
            if rel.startswith("data/"):  # a rewritten table is byte-different but equal in value
                table = pd.read_csv(clean / rel, dtype=str, keep_default_na=False)
                table.to_csv(clean / rel, index=False)
            assert compare_folders(committed, clean, only=only).ok, f"{rel}: the unplanted copy must pass"
            made[rel] = clean, only
        return made[rel]

    return get


def test_every_tolerance_class_has_a_plant():
    used = {cls for table in outputs.DATA_COLUMNS.values() for cls in table.values()} | {"threshold", "headline"}
    used |= {d.cls for names in outputs.declared_macros().values() for d in names.values()}
    used |= {c for s in outputs.claim_specs() for c in (s.value_class, s.bound_class)}
    used |= {f.tolerance for _, f in outputs.FILES if f.tolerance}
    planted = {cls for cls, _ in PLANTS.values()}
    assert set(TOLERANCES) <= used, f"declared but unused: {set(TOLERANCES) - used}"
    assert used - {MACHINE} <= planted, f"classes without a plant: {used - {MACHINE} - planted}"


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_planted_wrong_value_fails_verify(name, committed, unplanted, tmp_path):
    cls, (rel, plant) = PLANTS[name]
    clean, only = unplanted(rel)
    candidate = tmp_path / "candidate"
    shutil.copytree(clean, candidate)
    plant(candidate)
    report = compare_folders(committed, candidate, only=only)
    assert not report.ok, f"{name}: the planted value passed verify"
    tally = report.by_class.get(cls)
    assert tally is not None and tally.failed, f"{name}: not caught by {cls!r}: {report.failures}"


def test_machine_speed_free_no_claim_outcome_is_a_machine_value():
    """A claim's outcome is compared exactly, whatever it measures; a timing may be a machine
    value, its verdict never."""
    claims = json.loads((RESULTS / "claims.json").read_text())
    for claim in claims:
        for key in ("holds", "id", "kind", "comparison"):
            assert outputs.claim_class(claim["id"], key) == EXACT, (claim["id"], key)
        if claim["id"].startswith("symbolic-"):  # SymPy's results are exact arithmetic
            assert outputs.claim_class(claim["id"], "value") in (EXACT, "f64"), claim["id"]


# One commit, run on two CPUs (tests/data/xmachine/README.md): every claim held on both, so the
# comparison must pass them, whatever the per-entry rounding and chaotic walks did.
XMACHINE = ROOT / "tests" / "data" / "xmachine"


def _still_declared(folder):
    """The files of an older results folder whose every column today's code still declares (tables
    a study has since dropped or reshaped are not comparable)."""
    keep = set()
    for rel in outputs.result_files(folder):
        cls = outputs.file_class(rel)
        if cls is None:
            continue
        if cls.cls == "columns":
            declared = outputs.DATA_COLUMNS.get(rel)
            columns = list(pd.read_csv(folder / rel, nrows=0).columns)
            if declared is None or not set(columns) <= set(declared):
                continue
        keep.add(rel)
    return keep


def test_a_second_cpu_whose_findings_agree_passes_all_three_tiers():
    report = compare_folders(XMACHINE / "intel-xeon-avx512-ea77fed", XMACHINE / "amd-epyc-zen5-ea77fed",
                             only=_still_declared(XMACHINE / "intel-xeon-avx512-ea77fed"))
    assert report.ok, "\n".join(report.failures[:20])
    tiers = report.tier_table()
    assert [t.split(":")[0] for t in tiers] == [outputs.TIER_FINDINGS, outputs.TIER_EXACT, outputs.TIER_STATS]
    assert report.by_class["claim outcome"].compared >= 200 and report.by_class["exact"].compared > 10_000
    # the per-entry comparison of a chaotic walk would have failed: its entries change sign
    a = pd.read_csv(XMACHINE / "intel-xeon-avx512-ea77fed" / "data" / "longrun_entries.csv")
    b = pd.read_csv(XMACHINE / "amd-epyc-zen5-ea77fed" / "data" / "longrun_entries.csv")
    assert ((a["displacement"] > 0) != (b["displacement"] > 0)).any()


def test_the_second_cpu_with_a_finding_moved_fails(tmp_path):
    amd = tmp_path / "amd"
    shutil.copytree(XMACHINE / "amd-epyc-zen5-ea77fed", amd)
    path = amd / "macros" / "03_precision.tex"
    path.write_text(re.sub(r"(\\newcommand\{\\PrecSlopeFloatThirtyTwo\}\{)[^}]*", r"\g<1>0.9500", path.read_text()))
    # only the macros: the data of the pair pass (the test above), and comparing them again costs seconds
    macros = {rel for rel in _still_declared(XMACHINE / "intel-xeon-avx512-ea77fed") if rel.startswith("macros/")}
    report = compare_folders(XMACHINE / "intel-xeon-avx512-ea77fed", amd, only=macros)
    assert not report.ok and report.by_class["headline"].failed == 1, report.failures
    assert len(report.failures) == 1, report.failures
