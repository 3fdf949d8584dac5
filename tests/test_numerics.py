"""Tests of keybias.numerics: the rounding model, the law fit, the crossing, the gradient
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

from keybias import numerics as nm
from keybias import verdict

ROOT = Path(__file__).resolve().parents[1]
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
                         "delta_rms": delta, "pred_rms": delta / 2.0, "pred_bias_rms": bias / 2.0,
                         "score_std_rms": 1e-3,
                         "err_rms": np.sqrt(1 + (r**alpha) ** 2) * 1e-7, "err0_rms": 1e-7,
                         "ref_rms": 1.0})


def test_fit_law_recovers_slope_one_and_rejects_half():
    one = nm.fit_law(nm.add_floor(_synthetic(1.0))).iloc[0]
    assert abs(one["slope"] - 1) <= nm.normal_quantile() * one["slope_se"]
    assert one["model_constant"] == pytest.approx(2.0, rel=0.02)
    half = nm.fit_law(nm.add_floor(_synthetic(0.5))).iloc[0]
    assert abs(half["slope"] - 1) > nm.normal_quantile() * half["slope_se"]
    assert half["slope"] == pytest.approx(0.5, abs=0.05)


def test_accuracy_crossing_matches_law():
    df = nm.add_floor(_synthetic(1.0))
    law = nm.fit_law(df)
    cross = nm.accuracy_crossing(df, law).iloc[0]
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


# ----------------------------------------------------------------------------- constants, claims, macros, figures
def test_fit_mask_uses_dominance_constant():
    df = nm.add_floor(_synthetic(1.0))
    ratio = df["delta_rms"] / df["floor_rms"]
    mask = nm.fit_mask(df)
    assert (ratio[mask] >= nm.DOMINANCE).all()
    # rows between twice and DOMINANCE times the floor exist and are excluded
    between = (ratio >= 2.0) & (ratio < nm.DOMINANCE)
    assert between.any() and not mask[between].any()
    assert nm.fit_mask(df, dominance=2.0)[between].all()


def test_unit_roundoff_span_and_failure_probability_tex():
    assert nm.unit_roundoff_span_log2(["float64", "float32", "bfloat16", "float16"]) == 45
    assert nm.unit_roundoff_span_log2(["float32", "float16"]) == 13
    assert math.isnan(nm.unit_roundoff_span_log2([]))
    assert nm.failure_probability_tex(1e-6) == "10^{-6}"
    assert nm.failure_probability_tex(2e-6) != "10^{-6}"


def test_crossing_check_flags_one_sided_crossing():
    law = pd.DataFrame({"dtype": ["float32"] * 3, "path": ["a", "b", "c"], "model_scatter_log10": 0.01})
    crossing = pd.DataFrame({"dtype": ["float32"] * 3, "path": ["a", "b", "c"],
                             "crossing": [2.0, 3.0, math.nan], "crossing_pred": [2.1, math.nan, math.nan]})
    m = nm.crossing_check(crossing, law, 0.25).set_index("path")
    assert list(m.index) == ["a", "b"]  # "c": neither crosses, nothing to compare
    assert m.loc["a", "deviation_log10"] < m.loc["a", "allowance_log10"]
    assert m.loc["b", "deviation_log10"] == math.inf


def _claim_inputs():
    df = nm.add_floor(_synthetic(1.0))
    law = nm.fit_law(df)
    pooled = nm.pooled_slope(df)
    df["delta_max"], df["tolerance"] = df["delta_rms"], 1.0
    checks = nm.crossing_check(nm.accuracy_crossing(df, law), law, 0.25)
    gsum = pd.DataFrame({"dtype": ["float32", "float16"], "path": "explicit", "status": "ok",
                         "grad_over_tol_max": 1e-3, "verdict": ["redundant", "invalid"],
                         "ratio_over_u": [0.5, 0.2], "bk_mean_cos": [0.01, -0.02],
                         "bq_mean_cos": [0.8, 0.7], "cos_bound": 0.2})
    return law, pooled, df, checks, gsum


def test_precision_claims_hold_on_consistent_data_and_fail_on_bad():
    law, pooled, df, checks, gsum = _claim_inputs()
    claims = {c["claim_id"]: c for c in nm.precision_claims(law, pooled, df, checks, gsum, 16)}
    ops = {"<=": lambda v, b: v <= b, "==": lambda v, b: v == b, ">": lambda v, b: v > b}
    assert all(ops[c["comparison"]](c["value"], c["bound"]) for c in claims.values())
    assert "2^13" in claims["precision-bk-gradient-scales-with-u"]["statement"]
    assert claims["precision-bk-gradient-verdict-float32"]["statement"].startswith("In float32,")
    # a float32 gradient verdict that is not redundant fails the verdict claim
    bad = gsum.assign(verdict=["invalid", "invalid"])
    c = {c["claim_id"]: c for c in nm.precision_claims(law, pooled, df, checks, bad, 16)}
    assert c["precision-bk-gradient-verdict-float32"]["value"] == 1.0
    # a dtype that ran without a law fit makes the slope and model-constant claims NaN (fail)
    extra = pd.concat([df, df.assign(dtype="float16")], ignore_index=True)
    c = {c["claim_id"]: c for c in nm.precision_claims(law, pooled, extra, checks, gsum, 16)}
    assert math.isnan(c["precision-law-slope-one"]["value"])
    assert math.isnan(c["precision-rounding-model-constant"]["value"])


def test_precision_claims_with_no_data_fail_or_are_left_out():
    law, pooled, df, checks, gsum = _claim_inputs()
    empty_g = gsum.iloc[0:0]
    claims = {c["claim_id"]: c for c in nm.precision_claims(law.iloc[0:0], pooled.iloc[0:0], df.iloc[0:0],
                                                             checks.iloc[0:0], empty_g, 16)}
    assert "precision-bk-gradient-verdict-float32" not in claims
    assert "precision-bk-gradient-scales-with-u" not in claims
    assert all(math.isnan(c["value"]) for c in claims.values())
    one = {c["claim_id"] for c in nm.precision_claims(law, pooled, df, checks, gsum.iloc[:1], 16)}
    assert "precision-bk-gradient-scales-with-u" not in one  # one dtype: no scaling to test


def test_macros_and_figures_from_summaries():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    law, pooled, df, checks, gsum = _claim_inputs()
    m = nm.law_macros(df, law, pooled)
    assert m["PrecSlopeFloatThirtyTwo"][0] == pytest.approx(1.0, abs=0.05)
    assert m["PrecModelConstWide"][0] == pytest.approx(2.0, rel=0.02) and "PrecModelConstSdpaHalf" not in m
    g = nm.gradient_macros(gsum.assign(bk_consistency=0.3, bq_consistency=0.9))
    assert g["PrecUnitRoundoffSpanLog"][0] == 13 and g["PrecGradRedundantCount"][0] == 1
    r = nm.run_macros(head_dim=16, num_heads=2, seq_len=8, batch=2, grad_batches=4, ratio_points=5,
                      ratio_log10_min=-1, ratio_log10_max=2)
    assert r["PrecDominance"][0] == nm.DOMINANCE and r["PrecFailureProbability"][0] == "10^{-6}"
    crossing = nm.accuracy_crossing(df, law)
    fig = nm.plot_error_vs_bias(df, law, ["float32"])
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) >= 3
    fig2 = nm.plot_accuracy(df, crossing, ["float32"])
    assert len(fig2.axes) == 1 and nm.plot_accuracy(df, crossing, ["float64"]) is None
    fig3 = nm.plot_gradient(gsum.assign(unit_roundoff=[2.0**-24, 2.0**-11], ratio_median=[1e-7, 1e-4]))
    assert len(fig3.axes) == 2
    for f in (fig, fig2, fig3):
        plt.close(f)
