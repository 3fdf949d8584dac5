"""Tests of keybias.studies.precision.measure: the rounding model, the law fit, the crossing, the gradient
noise statistics, validation, and the notebook/profile parameter contract."""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from keybias import verdict
from keybias.pipeline import claims as C
from keybias.studies.precision import judge as nj
from keybias.studies.precision import measure as nm
from keybias.studies.precision import show as ns

ROOT = Path(__file__).resolve().parents[3]
SMALL = dict(head_dim=16, num_heads=1, seq_len=16, batch=2, seed=0)


# ----------------------------------------------------------------------------- rounding model
def _forming_only_change(dtype: str, ratio: float):
    """Measured RMS change when only k + b_k is rounded to `dtype` (all else float64)."""
    q, k, v = nm.random_qkv(4, 1, 32, 32, seed=3)
    b = nm._direction(1, 32, 3) * ratio * float(k.norm(dim=-1).mean())
    tdt = getattr(torch, dtype)
    k_d, b_d = k.to(tdt).double(), b.to(tdt).double()
    exact = k_d + b_d  # exact in float64 for these magnitudes
    formed = (k.to(tdt) + b.to(tdt)).double()
    y1 = nm.attention(q, formed, v, "explicit")
    y0 = nm.attention(q, exact, v, "explicit")
    return float((y1 - y0).pow(2).mean().sqrt()), q, k_d, v, b_d


def _forming_prediction(q, k, v, b, dtype):
    """The forming term of the model alone (score-storage term removed)."""
    u = verdict.unit_roundoff(dtype)
    kb = k + b
    d = q.shape[-1]
    s = q @ kb.transpose(-2, -1) / math.sqrt(d)
    p = torch.softmax(s, -1)
    y = p @ v
    a = p**2 * (nm.RHO * u) ** 2 * ((q**2) @ (kb**2).transpose(-2, -1) / d)
    return float((a @ v**2 - 2 * y * (a @ v) + y**2 * a.sum(-1, keepdim=True)).mean().sqrt())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_forming_term_predicts_measured_change(dtype):
    measured, q, k, v, b = _forming_only_change(dtype, 100.0)
    predicted = _forming_prediction(q, k, v, b, dtype)
    assert 0.8 < measured / predicted < 1.25  # rho = sqrt(1/(8 ln 2)) is the right constant


def test_forming_term_with_wrong_rho_is_detected():
    measured, q, k, v, b = _forming_only_change("float16", 100.0)
    wrong = _forming_prediction(q, k, v, b, "float16") * math.sqrt(3.0)  # the rho of sqrt(3/(8 ln 2))
    assert not 0.8 < measured / wrong < 1.25


def test_rounding_model_scales_with_u_squared_and_bias():
    q, k, v = nm.random_qkv(2, 1, 16, 16, seed=1)
    b = nm._direction(1, 16, 1) * 50.0
    m32 = nm.rounding_model(q, k, v, b, "float32")
    m16 = nm.rounding_model(q, k, v, b, "float16")
    ratio = (verdict.unit_roundoff("float16") / verdict.unit_roundoff("float32")) ** 2
    assert m16["score"] / m32["score"] == pytest.approx(ratio, rel=1e-9)
    # the b-dependent part grows like |b|^2 (std like |b|): slope 1 in log-log
    big = nm.predicted_change(q, k, v, 10 * b, "float32")
    small = nm.predicted_change(q, k, v, b, "float32")
    assert big["pred_bias_rms"] / small["pred_bias_rms"] == pytest.approx(10.0, rel=0.05)
    # without a bias there is no forming error and nothing grows
    zero = nm.predicted_change(q, k, v, torch.zeros_like(b), "float32")
    assert zero["pred_bias_rms"] == 0.0


def test_rounding_model_rejects_unknown_dtype():
    q, k, v = nm.random_qkv(1, 1, 4, 4, seed=0)
    with pytest.raises(ValueError, match="allowed"):
        nm.rounding_model(q, k, v, torch.zeros(4, dtype=torch.float64), "float8")


# ----------------------------------------------------------------------------- sweep and law
def test_error_sweep_change_grows_and_stays_within_tolerance():
    df = nm.error_sweep(["float16"], ["explicit", "mha"], ratios=[0.01, 1000.0], progress=False, **SMALL)
    assert set(df["status"]) == {"ok"}
    assert (df["delta_max"] <= df["tolerance"]).all()
    for _, g in df.groupby("path"):
        small, large = g.sort_values("ratio")["delta_rms"].to_numpy()
        assert large > 20 * small  # a large key bias is not free in float16


def test_error_sweep_unavailable_backend_is_not_run_with_reason():
    df = nm.error_sweep(["float32"], ["sdpa_efficient"], ratios=[1.0], progress=False, **SMALL)
    assert df["status"].eq("not run").all() and df["reason"].str.contains("no cpu kernel").all()


def _synthetic(alpha: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    r = np.logspace(-2, 3, 21)
    floor = 1e-7
    bias = 1e-7 * r**alpha
    delta = np.sqrt(floor**2 + bias**2) * (1 + 0.01 * rng.standard_normal(r.size))
    return pd.DataFrame({"dtype": "float32", "path": "explicit", "ratio": r, "status": "ok",
                         "delta_rms": delta, "pred_rms": np.sqrt(floor**2 + bias**2) / 2.0, "pred_bias_rms": bias / 2.0,
                         "score_std_rms": 1e-3,
                         "err_rms": np.sqrt(1 + (r**alpha) ** 2) * 1e-7, "err0_rms": 1e-7,
                         "ref_rms": 1.0})


def test_fit_law_recovers_slope_one_and_rejects_half():
    one = nj.fit_law(nj.add_floor(_synthetic(1.0))).iloc[0]
    assert abs(one["slope"] - 1) <= nj.normal_quantile() * one["slope_se"]
    assert one["model_constant"] == pytest.approx(2.0, rel=0.02)
    half = nj.fit_law(nj.add_floor(_synthetic(0.5))).iloc[0]
    assert abs(half["slope"] - 1) > nj.normal_quantile() * half["slope_se"]
    assert half["slope"] == pytest.approx(0.5, abs=0.05)


def test_accuracy_crossing_matches_law():
    df = nj.add_floor(_synthetic(1.0))
    law = nj.fit_law(df)
    cross = nj.accuracy_crossing(df, law).iloc[0]
    # err = e0 sqrt(1 + r^2) doubles at r = sqrt(3)
    assert cross["crossing"] == pytest.approx(math.sqrt(3), rel=0.15)
    assert cross["crossing_pred"] == pytest.approx(math.sqrt(3), rel=0.15)


# ----------------------------------------------------------------------------- gradient noise
def test_consistency_separates_noise_from_signal():
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((16, 64))
    signal = rng.standard_normal(64) + 0.3 * rng.standard_normal((16, 64))
    bound = nm.noise_consistency_bound(64, 16)
    assert abs(nm.consistency(noise)["mean_cos"]) <= bound
    assert nm.consistency(signal)["mean_cos"] > bound
    with pytest.raises(ValueError):
        nm.consistency(noise[:1])


def test_bk_gradient_is_rounding_noise_and_bq_is_not():
    g = nm.gradient_sweep(["float32", "float16"], ["explicit", "mha"], batches=4, progress=False,
                          head_dim=16, num_heads=1, seq_len=16, batch=4, seed=0)
    ok = g[g["status"].eq("ok")]
    assert (ok["g_bk_max"] <= ok["tolerance"]).all()
    # positive control in float32: the b_q gradient exceeds the tolerance, so the rule has power
    f32 = ok[ok["dtype"] == "float32"]
    assert (f32["g_bq_max"] > f32["tolerance"]).all() and f32["verdict"].eq("redundant").all()
    # in float16 the tolerance (a worst-case bound) swallows the control: the rule says invalid
    assert ok[ok["dtype"] == "float16"]["verdict"].eq("invalid").any()
    summary = nm.gradient_summary(g)
    assert (summary["ratio_over_u"] < 10).all() and (summary["ratio_over_u"] > 1e-3).all()


def test_query_effective_dim_between_one_and_embed_dim():
    mha = nm.make_mha(32, 2, seed=0)
    eff = nm.query_effective_dim(mha)
    assert 1 <= eff <= 32


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dtypes=["float8"]), "dtypes"),
        (dict(paths=["flashier"]), "paths"),
        (dict(head_dim=0), "head_dim"),
        (dict(seq_len=1), "seq_len"),
        (dict(device="tpu"), "device"),
    ],
)
def test_bad_input_raises_before_work(kwargs, match):
    args = dict(dtypes=["float32"], paths=["explicit"], **SMALL)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        nm.error_sweep(ratios=[1.0], progress=False, **args)
    with pytest.raises(ValueError, match=match):
        nm.gradient_sweep(batches=3, progress=False, **args)


def test_bad_ratios_raise():
    with pytest.raises(ValueError, match="ratio"):
        nm.bias_ratios(2.0, 1.0, 5)
    with pytest.raises(ValueError, match="ratios"):
        nm.error_sweep(["float32"], ["explicit"], ratios=[-1.0], progress=False, **SMALL)


def test_other_devices_rows_are_not_run():
    rows = nm.other_devices("cpu", present={"cpu": True, "cuda": False, "mps": False})
    assert list(rows["device"]) == ["cuda", "mps"]
    assert rows["status"].eq("not run").all() and rows["reason"].str.contains("not present").all()


def test_parameters_match_notebook_and_profiles():
    nb = nbformat.read(ROOT / "notebooks" / "03_precision.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    names = {line.split("=")[0].strip() for line in cell.source.splitlines() if "=" in line}
    assert set(nm.PARAMETERS) | {"profile", "device", "output_dir", "results_dir"} == names
    for profile in ("paper", "smoke"):
        section = yaml.safe_load((ROOT / "params" / f"{profile}.yaml").read_text())["03_precision"]
        assert set(section) == set(nm.PARAMETERS)
        for name, spec in nm.PARAMETERS.items():
            spec.check(name, section[name])
        assert section["calibration_seed"] != section["seed"], "the crossing calibration must be held out"


# ----------------------------------------------------------------------------- constants, claims, macros, figures
def test_fit_mask_uses_dominance_constant():
    df = nj.add_floor(_synthetic(1.0))
    ratio = df["delta_rms"] / df["floor_rms"]
    mask = nj.fit_mask(df)
    assert (ratio[mask] >= nj.DOMINANCE).all()
    # rows between twice and DOMINANCE times the floor exist and are excluded
    between = (ratio >= 2.0) & (ratio < nj.DOMINANCE)
    assert between.any() and not mask[between].any()
    assert nj.fit_mask(df, dominance=2.0)[between].all()


def test_unit_roundoff_span_and_failure_probability_tex():
    assert nj.unit_roundoff_span_log2(["float64", "float32", "bfloat16", "float16"]) == 45
    assert nj.unit_roundoff_span_log2(["float32", "float16"]) == 13
    assert math.isnan(nj.unit_roundoff_span_log2([]))
    assert nj.failure_probability_tex(1e-6) == "10^{-6}"
    assert nj.failure_probability_tex(2e-6) != "10^{-6}"


def test_crossing_check_flags_one_sided_crossing():
    law = pd.DataFrame({"dtype": ["float32"] * 3, "path": ["a", "b", "c"], "model_scatter_log10": 0.01})
    crossing = pd.DataFrame({"dtype": ["float32"] * 3, "path": ["a", "b", "c"], "err0_rms": [1e-7, 1e-7, 0.0],
                             "crossing": [2.0, 3.0, math.nan], "crossing_pred": [2.1, math.nan, math.nan]})
    checks = nj.crossing_check(crossing, law, 0.25)
    m = checks.set_index("path")
    assert list(m.index) == ["a", "b"]  # "c": neither crosses, nothing to compare, and that is recorded
    assert [str(e) for e in checks.attrs["exclusions"]] == [
        "accuracy crossings: 1 of 3 entries left out (no error without b_k to double: err0 = 0)"]
    assert m.loc["a", "deviation_log10"] < m.loc["a", "allowance_log10"]
    assert m.loc["b", "deviation_log10"] == math.inf


# the held-out calibration of the consistent inputs: the same law on another seed's noise
LAW_CAL = nj.fit_law(nj.add_floor(_synthetic(1.0, seed=1)))
# a tolerance of 1% of the RMS output (1.0): inside the 5% rule, so every row is judged
TOL = 0.01


def _claim_inputs():
    df = nj.add_floor(_synthetic(1.0))
    law = nj.fit_law(df)
    pooled = nj.pooled_slope(df)
    df["delta_max"], df["tolerance"] = df["delta_rms"], TOL
    checks = nj.crossing_check(nj.accuracy_crossing(df, law), law, 0.25)
    gsum = pd.DataFrame({"dtype": ["float32", "float16"], "path": "explicit", "status": "ok",
                         "grad_over_tol_max": 1e-3, "control_over_tol_min": [100.0, 0.01],
                         "verdict": ["redundant", "invalid"], "unit_roundoff": [2.0**-24, 2.0**-11],
                         "ratio_over_u": [0.5, 0.2], "bk_mean_cos": [0.01, -0.02],
                         "bq_mean_cos": [0.8, 0.7], "cos_bound": 0.2, "eff_dim": 32.0, "bk_nonzero": 12})
    grads = pd.DataFrame({"dtype": ["float32", "float16"], "path": "explicit", "status": "ok",
                          "unit_roundoff": [2.0**-24, 2.0**-11], "ratio": [0.5 * 2.0**-24, 0.2 * 2.0**-11]})
    return law, pooled, df, checks, gsum, grads


def _holds(claims) -> dict[str, bool]:
    return {cid: r["holds"] for cid, r in C.evaluate(claims).items()}


def test_precision_claims_hold_on_consistent_data():
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    claims = nj.precision_claims(law, pooled, df, checks, gsum, grads, 16, law_calibration=LAW_CAL)
    assert all(_holds(claims).values()), _holds(claims)
    by_id = {c.id: c for c in claims}
    assert "2^13" in by_id[nj.PRECISION_BK_GRADIENT_SCALES_WITH_U.id].statement
    assert all(c.bound_origin for c in claims)
    assert {c.id for c in claims if c.kind != "test"} == {nj.PRECISION_BQ_GRADIENT_CONSISTENT.id,
                                                          nj.PRECISION_ROUNDING_MODEL_CONSTANT.id}
    control = by_id[nj.PRECISION_BQ_GRADIENT_CONSISTENT.id]
    assert control.kind == "control" and control.protects == (nj.PRECISION_BK_GRADIENT_NO_DIRECTION.id,)
    # the tolerance claim judges only the powered row (float32), and says what it could have seen
    assert by_id[nj.PRECISION_BK_GRADIENT_WITHIN_TOLERANCE.id].min_detectable == pytest.approx(0.01)


def test_gradient_tolerance_claim_ignores_unpowered_rows_and_fails_without_any():
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    # an unpowered float16 row far outside the tolerance is not judged by the tolerance claim
    loud = gsum.assign(grad_over_tol_max=[1e-3, 50.0])
    assert _holds(nj.precision_claims(law, pooled, df, checks, loud, grads, 16, law_calibration=LAW_CAL))[nj.PRECISION_BK_GRADIENT_WITHIN_TOLERANCE.id]
    # with no powered row at all the claim has no data and fails
    weak = gsum.assign(control_over_tol_min=0.5)
    assert not _holds(nj.precision_claims(law, pooled, df, checks, weak, grads, 16, law_calibration=LAW_CAL))[nj.PRECISION_BK_GRADIENT_WITHIN_TOLERANCE.id]


def test_output_claim_judges_only_magnitudes_whose_tolerance_is_within_five_percent_of_the_output():
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    # rows whose tolerance is 90% of the output (the audit's case) are left out, even with a change
    # far above that tolerance, and each left-out (dtype, path) is recorded with its reason
    vacuous = df.assign(tolerance=np.where(df["ratio"] > 100, 0.9, 0.02), delta_max=np.where(df["ratio"] > 100, 5.0, 1e-6))
    claim = next(c for c in nj.precision_claims(law, pooled, vacuous, checks, gsum, grads, 16, law_calibration=LAW_CAL)
                 if c.id == nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id)
    assert claim.value < 1 and claim.min_detectable == pytest.approx(0.02)
    assert len(claim.exclusions) == 1 and "exceeds 5% of the RMS output" in claim.exclusions[0]
    assert "up to 90%" in claim.exclusions[0]
    # exactly 5% is judged, just above it is not
    edge = df.assign(tolerance=np.where(df["ratio"] > 100, nj.OUTPUT_TOLERANCE_FRACTION * 1.0001, nj.OUTPUT_TOLERANCE_FRACTION))
    judged = nj.powered_outputs(edge)
    assert len(judged) == int((df["ratio"] <= 100).sum()) and len(nj.output_exclusions(edge)) == 1
    nothing_judged = df.assign(tolerance=0.06)
    assert not _holds(nj.precision_claims(law, pooled, nothing_judged, checks, gsum, grads, 16, law_calibration=LAW_CAL))[
        nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id]


def test_model_constant_claim_needs_a_calibration_of_every_path():
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    for cal in (None, LAW_CAL.iloc[0:0], LAW_CAL.assign(path="other")):
        c = _by_id(nj.precision_claims(law, pooled, df, checks, gsum, grads, 16, law_calibration=cal))
        assert math.isnan(c[nj.PRECISION_ROUNDING_MODEL_CONSTANT.id].value)
        assert not c[nj.PRECISION_ROUNDING_MODEL_CONSTANT.id].holds
    m = nj.model_constant_check(law, LAW_CAL).iloc[0]
    s = LAW_CAL["model_scatter_log10"].iloc[0]  # one fit: the pooled scatter is its own
    assert m["allowance_log10"] == pytest.approx(nj.normal_quantile() * math.sqrt(2) * s)
    assert m["deviation_log10"] < m["allowance_log10"]
    # pooling weights each fit's scatter by its degrees of freedom; a one-point fit (NaN) adds nothing
    two = pd.concat([LAW_CAL.assign(points=11, model_scatter_log10=0.01),
                     LAW_CAL.assign(path="b", points=3, model_scatter_log10=0.04),
                     LAW_CAL.assign(path="c", points=1, model_scatter_log10=math.nan)])
    assert nj.calibration_scatter(two) == pytest.approx(math.sqrt((10 * 0.01**2 + 2 * 0.04**2) / 12))


@pytest.mark.claim_mutation(nj.PRECISION_ROUNDING_MODEL_CONSTANT.id)
def test_model_constant_claim_fails_when_one_path_drifts_from_its_calibration(record_mutation):
    """Two paths; one reproduces its calibration, the other's constant sits just past z times the
    calibration's scatter: the claim is a maximum over paths, so one drifting path fails it."""
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    two = pd.concat([df, df.assign(path="sdpa_math")], ignore_index=True)
    cal = pd.concat([LAW_CAL, LAW_CAL.assign(path="sdpa_math")], ignore_index=True)
    held = _by_id(nj.precision_claims(nj.fit_law(two), pooled, two, checks, gsum, grads, 16, law_calibration=cal))
    assert held[nj.PRECISION_ROUNDING_MODEL_CONSTANT.id].holds
    allowance = float(nj.model_constant_check(law, cal)["allowance_log10"].iloc[0])
    c_main = float(nj.fit_law(df)["model_constant"].iloc[0])
    target = float(LAW_CAL["model_constant"].iloc[0]) * 10 ** (-1.02 * allowance)
    drift = two.assign(pred_rms=np.where(two["path"] == "sdpa_math", two["pred_rms"] * c_main / target, two["pred_rms"]))
    c = _by_id(nj.precision_claims(nj.fit_law(drift), pooled, drift, checks, gsum, grads, 16, law_calibration=cal))
    assert 1 < c[nj.PRECISION_ROUNDING_MODEL_CONSTANT.id].value <= 1.03
    record_mutation(c[nj.PRECISION_ROUNDING_MODEL_CONSTANT.id])


@pytest.mark.claim_mutation(nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id)
def test_output_claim_fails_on_a_change_just_past_a_tolerance_at_the_five_percent_edge(record_mutation):
    """The smallest violation the 5% rule keeps in view: a magnitude whose tolerance is exactly 5% of
    the output, its change 1% above that tolerance."""
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    top = df["ratio"] == df["ratio"].max()
    edge = df.assign(tolerance=np.where(top, nj.OUTPUT_TOLERANCE_FRACTION * df["ref_rms"], df["tolerance"]))
    edge = edge.assign(delta_max=np.where(top, 1.01 * edge["tolerance"], edge["delta_max"]))
    c = _by_id(nj.precision_claims(law, pooled, edge, checks, gsum, grads, 16, law_calibration=LAW_CAL))
    assert c[nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id].value == pytest.approx(1.01)
    record_mutation(c[nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id])


def test_precision_claims_fail_when_a_dtype_has_no_fit():
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    extra = pd.concat([df, df.assign(dtype="float16")], ignore_index=True)
    c = {c.id: c for c in nj.precision_claims(law, pooled, extra, checks, gsum, grads, 16, law_calibration=LAW_CAL)}
    assert math.isnan(c[nj.PRECISION_LAW_SLOPE_ONE.id].value)
    assert math.isnan(c[nj.PRECISION_ROUNDING_MODEL_CONSTANT.id].value)


def test_precision_claims_with_no_data_fail_or_are_left_out():
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    claims = {c.id: c for c in nj.precision_claims(
        law.iloc[0:0], pooled.iloc[0:0], df.iloc[0:0], checks.iloc[0:0], gsum.iloc[0:0], grads.iloc[0:0], 16, law_calibration=LAW_CAL)}
    assert nj.PRECISION_BK_GRADIENT_SCALES_WITH_U.id not in claims
    assert all(math.isnan(c.value) for c in claims.values())
    one = {c.id for c in nj.precision_claims(law, pooled, df, checks, gsum.iloc[:1], grads, 16, law_calibration=LAW_CAL)}
    assert nj.PRECISION_BK_GRADIENT_SCALES_WITH_U.id not in one  # one dtype: no scaling to test


# ----------------------------------------------------------------------------- mutation tests
@pytest.mark.claim_mutation(nj.PRECISION_LAW_SLOPE_ONE.id)
@pytest.mark.parametrize("alpha", [1 - 1.1 * nj.SLOPE_MARGIN, 1 + 1.1 * nj.SLOPE_MARGIN])
def test_slope_claim_fails_on_a_law_just_past_the_margin(alpha, record_mutation):
    """A law whose true slope lies 10% of the margin beyond it, on either side."""
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    bent = nj.add_floor(_synthetic(alpha))
    bent["delta_max"], bent["tolerance"] = bent["delta_rms"], TOL
    claims = nj.precision_claims(nj.fit_law(bent), nj.pooled_slope(bent), bent, checks, gsum, grads, 16, law_calibration=LAW_CAL)
    record_mutation(_by_id(claims)[nj.PRECISION_LAW_SLOPE_ONE.id])


def test_slope_claim_states_the_smallest_deviation_it_detects():
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    vague = pooled.assign(slope_se=0.05, detectable_dev=nj.SLOPE_MARGIN + nj.normal_quantile() * 0.05)
    claim = next(c for c in nj.precision_claims(law, vague, df, checks, gsum, grads, 16, law_calibration=LAW_CAL)
                 if c.id == nj.PRECISION_LAW_SLOPE_ONE.id)
    assert claim.min_detectable == pytest.approx(nj.SLOPE_MARGIN + nj.normal_quantile() * 0.05)


# The smallest realistic violation of each claim: the judged quantity 5% beyond its bound (EDGE),
# made in the data the judge reads, on the consistent inputs of `_claim_inputs`.
EDGE = 1.05
LAM_SQRT_16 = verdict.LAMBDA * 4.0  # lambda sqrt(n) for the n = 16 the claims below are judged with


def _edge_model_constant(law, pooled, df, checks, gsum, grads):
    """The main run's model constant lies 5% beyond z times the calibration's scatter from the
    constant calibrated on the held-out seed (the measured change is unchanged; the model's
    prediction is scaled, so only C moves)."""
    c0 = float(nj.fit_law(df)["model_constant"].iloc[0])
    allowance = float(nj.model_constant_check(law, LAW_CAL)["allowance_log10"].iloc[0])
    target = float(LAW_CAL["model_constant"].iloc[0]) * 10 ** (EDGE * allowance)
    off = df.assign(pred_rms=df["pred_rms"] * c0 / target)
    return nj.fit_law(off), pooled, off, checks, gsum, grads


def _edge_crossing(law, pooled, df, checks, gsum, grads):
    """The predicted crossing misses the measured one by 5% more than the allowance."""
    crossing = nj.accuracy_crossing(df, law)
    allowance = float(nj.crossing_check(crossing, law, 0.25)["allowance_log10"].iloc[0])
    moved = crossing.assign(crossing_pred=crossing["crossing"] * 10 ** (EDGE * allowance))
    return law, pooled, df, nj.crossing_check(moved, law, 0.25), gsum, grads


def _edge_output(law, pooled, df, checks, gsum, grads):
    """One judged magnitude's output change lies 5% above its tolerance."""
    worst = df.index[df["ratio"] == df["ratio"].max()]
    return law, pooled, df.assign(delta_max=df["delta_max"].where(~df.index.isin(worst), EDGE * df["tolerance"])), \
        checks, gsum, grads


EDGE_MUTATIONS = {
    nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id: _edge_output,
    nj.PRECISION_ROUNDING_MODEL_CONSTANT.id: _edge_model_constant,
    nj.PRECISION_ACCURACY_CROSSING_LAW.id: _edge_crossing,
    # the powered (float32) row's largest b_k gradient entry 5% above its tolerance
    nj.PRECISION_BK_GRADIENT_WITHIN_TOLERANCE.id:
        lambda law, pooled, df, checks, gsum, grads: (law, pooled, df, checks,
                                                      gsum.assign(grad_over_tol_max=[EDGE, 1e-3]), grads),
    # one batch's |g_bk|/|g_bq| 5% above lambda sqrt(n) u
    nj.PRECISION_BK_GRADIENT_NOISE_SCALE.id:
        lambda law, pooled, df, checks, gsum, grads: (law, pooled, df, checks, gsum, grads.assign(
            ratio=[EDGE * LAM_SQRT_16 * 2.0**-24, 0.2 * 2.0**-11])),
    # the spread of ratio/u across dtypes 5% above lambda sqrt(n)
    nj.PRECISION_BK_GRADIENT_SCALES_WITH_U.id:
        lambda law, pooled, df, checks, gsum, grads: (law, pooled, df, checks, gsum.assign(
            ratio_over_u=[0.5, 0.5 / (EDGE * LAM_SQRT_16)]), grads),
    # one b_k mean cosine 5% beyond the isotropic-noise bound (0.2)
    nj.PRECISION_BK_GRADIENT_NO_DIRECTION.id:
        lambda law, pooled, df, checks, gsum, grads: (law, pooled, df, checks,
                                                      gsum.assign(bk_mean_cos=[0.01, -EDGE * 0.2]), grads),
    # one b_q mean cosine 5% below the bound: the positive control just misses
    nj.PRECISION_BQ_GRADIENT_CONSISTENT.id:
        lambda law, pooled, df, checks, gsum, grads: (law, pooled, df, checks,
                                                      gsum.assign(bq_mean_cos=[0.8, 0.2 / EDGE]), grads),
}


def _by_id(claims):
    return {c.id: c for c in claims}


@pytest.mark.claim_mutation(*EDGE_MUTATIONS)
@pytest.mark.parametrize("claim_id", list(EDGE_MUTATIONS))
def test_each_claim_fails_just_past_its_bound(claim_id, record_mutation):
    inputs = _claim_inputs()
    claims = _by_id(nj.precision_claims(*EDGE_MUTATIONS[claim_id](*inputs), 16, law_calibration=LAW_CAL))
    c = claims[claim_id]
    distance = C.mutation_distance({"value": c.value, "bound": c.bound, "comparison": c.comparison})
    assert 1 < distance <= 1.06, f"the mutation must sit just past the bound, not far beyond it ({distance})"
    record_mutation(claims[claim_id])
    # and only that claim fails: the mutation is of the one quantity the claim judges
    untouched = _by_id(nj.precision_claims(*inputs, 16, law_calibration=LAW_CAL))
    assert all(c.holds for cid, c in untouched.items())


_ATTENTION = nm.attention


def _attention_with_zero_slot(q, k, v, path):
    """add_zero_attn: one more key/value slot of zeros, after the key bias (breaks A1)."""
    zero = torch.zeros_like(k[..., :1, :])
    return _ATTENTION(q, torch.cat([k, zero], -2), torch.cat([v, zero], -2), path)


def _attention_keys_as_values(q, k, v, path):
    """A shared key/value projection: the biased keys are also the values (breaks A7)."""
    return _ATTENTION(q, k, k, path)


def _measured_claims(monkeypatch, mutant=None):
    if mutant is not None:
        monkeypatch.setattr(nm, "attention", mutant)
    sizes = dict(head_dim=16, num_heads=1, seq_len=8, batch=4, seed=0, progress=False)
    dtypes, paths = ["float64", "float32"], ["explicit"]
    errors = nj.add_floor(nm.error_sweep(dtypes, paths, ratios=np.logspace(-1.5, 3, 7), **sizes))
    # the held-out calibration: the same sweep of the same (possibly mutated) code on another seed
    calibration = nj.add_floor(nm.error_sweep(dtypes, paths, ratios=np.logspace(-1.5, 3, 7), **{**sizes, "seed": 1}))
    grads = nm.gradient_sweep(dtypes, paths, batches=12, **sizes)
    _, pooled, _, checks, _, _ = _claim_inputs()
    law = nj.fit_law(errors)
    return _by_id(nj.precision_claims(law, pooled, errors, checks, nm.gradient_summary(grads), grads, 8,
                                      law_calibration=nj.fit_law(calibration)))


MEASURED = [nj.PRECISION_ROUNDING_MODEL_CONSTANT.id, nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id,
            nj.PRECISION_BK_GRADIENT_WITHIN_TOLERANCE.id,
            nj.PRECISION_BK_GRADIENT_NOISE_SCALE.id, nj.PRECISION_BK_GRADIENT_SCALES_WITH_U.id,
            nj.PRECISION_BK_GRADIENT_NO_DIRECTION.id, nj.PRECISION_BQ_GRADIENT_CONSISTENT.id]
# The claims a broken invariance must fail. The model-constant claim is not among them: it asks that
# C reproduce across seeds, and a mutated model, calibrated on its own held-out seed, reproduces its
# (wrong) C too; its smallest violation is fed to it directly (`_edge_model_constant`, and
# `test_model_constant_claim_fails_when_one_path_drifts_from_its_calibration`).
BREAKS = MEASURED[1:6]


def test_measured_claims_hold_for_nn_attention(monkeypatch):
    claims = _measured_claims(monkeypatch)
    assert all(claims[c].holds for c in MEASURED), claims


@pytest.mark.claim_mutation(*BREAKS)
def test_measured_claims_fail_when_keys_are_reused_as_values(monkeypatch, record_mutation):
    """b_k then reaches the output through the values: a real, directed gradient."""
    claims = _measured_claims(monkeypatch, _attention_keys_as_values)
    record_mutation(*[claims[c] for c in BREAKS])


@pytest.mark.claim_mutation(*BREAKS[:4])
def test_measured_claims_fail_with_an_extra_key_slot(monkeypatch, record_mutation):
    """A zero key slot after the bias (add_zero_attn) makes b_k change outputs and gradients.

    Its b_k gradient sum_i q_i c_i has no direction across batches (the queries have zero
    mean), so the direction claim does not see this break; the size claims do.
    """
    claims = _measured_claims(monkeypatch, _attention_with_zero_slot)
    record_mutation(*[claims[c] for c in BREAKS[:4]])
    assert claims[nj.PRECISION_BK_GRADIENT_NO_DIRECTION.id].holds


def test_macros_and_figures_from_summaries():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keybias.studies import style

    style.apply()
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    m = nj.law_macros(df, law, pooled)
    assert float(m["PrecSlopeFloatThirtyTwo"][0]) == pytest.approx(1.0, abs=0.05)
    assert m["PrecModelConstWide"][0] == pytest.approx(2.0, rel=0.02) and "PrecModelConstSdpaHalf" not in m
    g = nj.gradient_macros(gsum.assign(bk_consistency=0.3, bq_consistency=0.9), grads, 16)
    assert g["PrecUnitRoundoffSpanLog"][0] == 13 and g["PrecGradRedundantCount"][0] == 1
    assert g["PrecGradPoweredCount"][0] == 1 and g["PrecGradPoweredDtypes"][0] == "float32"
    r = nj.run_macros(nm.PrecisionConfig(head_dim=16, num_heads=2, seq_len=8, batch=2, grad_batches=4,
                                         ratio_points=5, ratio_log10_min=-1, ratio_log10_max=2))
    assert r["PrecDominance"][0] == nj.DOMINANCE and r["PrecFailureProbability"][0] == "10^{-6}"
    crossing = nj.accuracy_crossing(df, law)
    fig = ns.plot_error_vs_bias(df, law, ["float32"])
    assert len(fig.axes[0].lines) >= 3
    fig2 = ns.plot_accuracy(df, crossing, ["float32"])
    assert len(fig2.axes) == 1 and ns.plot_accuracy(df, crossing, ["float64"]) is None
    fig3 = ns.plot_gradient(gsum.assign(ratio_median=[1e-7, 1e-4]))
    assert len(fig3.axes) == 2
    for f in (fig, fig2, fig3):
        assert f.get_figwidth() == pytest.approx(style.FULL_WIDTH)
        assert style.smallest_font_pt(f) >= style.MIN_FONT_PT
        assert all(ax.get_legend() is None for ax in f.axes), "legends go outside the axes"
        plt.close(f)


@pytest.mark.claim_mutation(nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id)
def test_output_claim_fails_when_a_dtype_in_its_scope_has_no_judged_row(record_mutation):
    """A selection with zero judged rows never passes: float32 rows whose tolerance all lie above
    the output leave the claim without float32 evidence, and it fails even though float64 holds."""
    law, pooled, df, checks, gsum, grads = _claim_inputs()
    both = pd.concat([df, df.assign(dtype="float32")], ignore_index=True)
    assert _holds(nj.precision_claims(law, pooled, both, checks, gsum, grads, 16, law_calibration=LAW_CAL))[
        nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id]
    blind = both.assign(tolerance=np.where(both["dtype"] == "float32", 10 * both["ref_rms"], both["tolerance"]))
    claim = _by_id(nj.precision_claims(law, pooled, blind, checks, gsum, grads, 16, law_calibration=LAW_CAL))[
        nj.PRECISION_OUTPUT_CHANGE_WITHIN_TOLERANCE.id]
    assert math.isnan(claim.value)
    record_mutation(claim)


def test_delta_bias_rms_is_exactly_zero_below_the_floor_multiple():
    df = nj.add_floor(_synthetic(1.0))
    below = df["delta_rms"] < nj.FLOOR_RESOLUTION * df["floor_rms"]
    assert below.any() and (df.loc[below, "delta_bias_rms"] == 0.0).all()
    assert (df.loc[~below, "delta_bias_rms"] > 0).all() and df["delta_bias_rms"].notna().all()


# ----------------------------------------------------------------------------- config
def test_config_defaults_are_the_smoke_profile_and_fields_are_the_parameters():
    import dataclasses

    from keybias.studies import params

    assert {f.name for f in dataclasses.fields(nm.PrecisionConfig)} == set(nm.PARAMETERS)
    smoke = params.load_profile("smoke", ROOT / "params", ["03_precision"])["03_precision"]
    assert nm.PrecisionConfig().as_dict() == smoke
    paper = params.load_profile("paper", ROOT / "params", ["03_precision"])["03_precision"]
    assert nm.PrecisionConfig.from_mapping(paper).as_dict() == paper


def test_config_rejects_misspelled_and_bad_values_naming_them():
    from keybias.studies.params import ParameterError

    with pytest.raises(ParameterError, match="did you mean 'grad_batches'"):
        nm.PrecisionConfig.from_mapping({"grad_batch": 4})
    with pytest.raises(ParameterError, match="did you mean 'calibration_seed'"):
        nm.PrecisionConfig().replace(calibration_seeds=2)
    with pytest.raises(ParameterError, match="calibration_seed must differ"):
        nm.PrecisionConfig(seed=1, calibration_seed=1)
    with pytest.raises(ParameterError, match="ratio_log10_min"):
        nm.PrecisionConfig(ratio_log10_min=2.0, ratio_log10_max=1.0)
    with pytest.raises(ParameterError, match="paths"):
        nm.PrecisionConfig(paths=["sdpa_cudnn"])
    cfg = nm.PrecisionConfig(ratio_points=4, ratio_log10_min=-1.0, ratio_log10_max=2.0)
    assert cfg.grid_step_log10 == 1.0 and list(cfg.ratios) == pytest.approx([0.1, 1.0, 10.0, 100.0])


def test_per_dtype_macro_names_spell_the_dtype_with_the_one_dtype_map():
    from keybias.studies.params import DTYPE_MACRO

    prefixes = ("PrecSlope", "PrecFitPoints", "PrecSlopeSe", "PrecSlopeDetectable", "PrecSecondOrder")
    for dtype, names in nj.SLOPE_MACROS.items():
        assert names == tuple(p + DTYPE_MACRO[dtype] for p in prefixes)
    for dtype, names in nj.CROSSING_MACROS.items():
        assert names == ("PrecCrossMin" + DTYPE_MACRO[dtype], "PrecCrossMax" + DTYPE_MACRO[dtype])
    for dtype, name in nj.ERROR_MACROS.items():
        assert name == "PrecErrMax" + DTYPE_MACRO[dtype]
    assert set(nj.SLOPE_MACROS) == set(nj.CROSSING_MACROS) == set(DTYPE_MACRO)
